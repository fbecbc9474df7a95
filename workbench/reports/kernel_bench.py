"""What a ``python -m bench.kernel_bench`` record says: the tail at Bonsai-27B's shape,
every path in every weight format, beside its floor (the weight and scale bytes over the
copy bandwidth measured in the same run): :func:`floor_table` and :func:`floor_figures`.

Each refuses a dict that is not such a record with a ``ValueError``
(``records.RecordError`` where it is not a record of that kind at all).
"""

from __future__ import annotations

from typing import Any

from workbench import validate
from workbench.reports.records import check as check_record


def _bench_payload(record: dict[str, Any]) -> dict[str, Any]:
    """A kernel_bench record's measurements (its ``bench`` dict: the record names its kind by
    its command, and keeps what it measured under that key); ``ValueError`` otherwise."""
    payload = check_record(record, "kernel_bench")["bench"]
    if not isinstance(payload, dict) or not isinstance(payload.get("cases"), list) or not payload["cases"]:
        raise ValueError(
            f"record must be a bench.kernel_bench record (its measurements under 'bench', with their "
            f"cases); got {validate.describe(record)}"
        )
    return payload


def floor_table(record: dict[str, Any]) -> Any:
    """Ms a tail of a ``bench.kernel_bench`` record, one column a weight format (pandas):
    the floor first, then each path's one evaluation with its wait (``"<path>, one wait"``,
    medians, inputs already on the device) and its device time a tail (``"<path>,
    device"``: ten tails in one evaluation, over ten); NaN where the run did not time that
    path in that format (PyTorch ran bf16 only). Raises ``ValueError`` for a dict that is
    not such a record."""
    import pandas as pd

    cols: dict[str, dict[str, float]] = {}
    for c in _bench_payload(record)["cases"]:
        col = {"floor": c["floor_ms"]}
        col.update({f"{k}, one wait": v["median_ms"] for k, v in c["resident_ms"].items()})
        col.update({f"{k}, device": ms for k, ms in c["device_ms_per_tail"].items()})
        cols[c["weights"]] = col
    return pd.DataFrame(cols)


def floor_figures(record: dict[str, Any]) -> dict[str, Any]:
    """The figures a notebook states from a ``bench.kernel_bench`` record, by name:
    ``copy_TBps`` (the copy bandwidth the floor divides by), ``bf16_device_x`` and
    ``bf16_torch_graph_x`` (bf16's device time a tail over its floor: the kernels', and
    PyTorch's CUDA-graph replay), ``bf16_wait_extra_ms`` (the compiled kernels' one wait
    minus their device time, bf16), ``quant_device_x`` (format -> the kernels' device time
    over the floor, the quantized formats), ``graph_over_kernels`` (format -> one wait of
    the MLX graph over the compiled kernels'), and ``seed_size_ms`` (the three launches'
    one evaluation at the test case's size, and one tiny evaluation). Raises ``ValueError``
    for a record that is not such a record or whose first case is not bf16."""
    bench = _bench_payload(record)
    bf16 = bench["cases"][0]
    if bf16.get("weights") != "bfloat16":
        raise ValueError(
            f"record: its first case must be bf16 (the benchmark's order); got {validate.describe(bf16.get('weights'))}"
        )
    dev = bf16["device_ms_per_tail"]
    return {
        "copy_TBps": bench["copy_bandwidth_Bps"]["used_for_floor"] / 1e12,
        "bf16_device_x": dev["kernels"] / bf16["floor_ms"],
        "bf16_torch_graph_x": dev["torch_cuda_graph"] / bf16["floor_ms"],
        "bf16_wait_extra_ms": bf16["resident_ms"]["kernels_compiled"]["median_ms"] - dev["kernels"],
        "quant_device_x": {
            c["weights"]: c["device_ms_per_tail"]["kernels"] / c["floor_ms"] for c in bench["cases"][1:]
        },
        "graph_over_kernels": {
            c["weights"]: c["resident_ms"]["mlx_graph"]["median_ms"] / c["resident_ms"]["kernels_compiled"]["median_ms"]
            for c in bench["cases"]
        },
        "seed_size_ms": {
            "three launches": bench["seed_size_resident_ms"]["kernels"],
            "one tiny evaluation": bench["seed_size_resident_ms"]["one_tiny_eval"],
        },
    }
