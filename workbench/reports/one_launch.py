"""What a ``python -m bench.one_launch`` record says: its checks, its timings, its shape
sweep, and where the one launch's wait goes.

The bench runs the tail as ONE CUDA launch (``workbench.kernels.one_launch``) beside its
three launches, checks both against the float64 oracle first, then times them in every
weight format. These functions turn its records into the notebooks' tables; each refuses
a dict that is not such a record with a ``ValueError`` (``records.RecordError`` where it is
not a one_launch record at all).
"""

from __future__ import annotations

from typing import Any

from workbench import validate
from workbench.reports.records import check as check_record


def record_tables(record: dict[str, Any]) -> tuple[Any, Any]:
    """``(checks, timing)`` tables (pandas) of a ``python -m bench.one_launch`` record.

    ``checks``: one row a check (case; worst scaled error against the float64 oracle and
    its tolerance, where checked; against the three launches; how many outputs have their
    bits; the same bits twice; pass). ``timing``: one column a weight format, rows of ms a
    tail: the floor, one evaluation with its wait (three launches and one, each compiled;
    PyTorch's CUDA-graph replay where the record has it), device time a tail (three and
    one), and the ratios the kernel issue's targets are about. Raises ``ValueError`` for a
    dict that is not such a record.
    """
    import pandas as pd

    check_record(record, "one_launch")  # its checks are a key every such record has
    checks = pd.DataFrame(
        [
            {
                "case": c["case"],
                "vs float64": f"{c['worst']:.1e}" if "worst" in c else "-",
                "tol": f"{c['tolerance']:.0e}" if "worst" in c else "-",
                "vs 3 launches": f"{c['vs_three_launches_worst_scaled']:.1e}",
                "bits = 3 launches": f"{c['bits_equal_three_launches']}/{c['outputs']}",
                "same bits twice": c["deterministic"],
                "pass": c["passed"],
            }
            for c in record["checks"]
        ]
    )
    rows: dict[str, dict[str, float]] = {}
    for c in record.get("cases", []):
        res = {k: v["median_ms"] for k, v in c["resident_ms"].items()}
        col = {
            "floor": c["floor_ms"],
            "one wait: three launches compiled": res["three_launches_compiled"],
            "one wait: one launch compiled": res["one_launch_compiled"],
            "device: three launches": c["device_ms_per_tail"]["three_launches"],
            "device: one launch": c["device_ms_per_tail"]["one_launch"],
            "one launch / three (one wait)": res["one_launch_compiled"] / res["three_launches_compiled"],
            "one launch device / floor": c["device_ms_per_tail"]["one_launch"] / c["floor_ms"],
        }
        if "torch_cuda_graph" in res:
            col["one wait: PyTorch CUDA graph"] = res["torch_cuda_graph"]
            col["one launch / PyTorch graph (one wait)"] = res["one_launch_compiled"] / res["torch_cuda_graph"]
        rows[c["case"].replace("bonsai27b-", "")] = col
    return checks, pd.DataFrame(rows)


def sweep_table(record: dict[str, Any]) -> Any:
    """The shape sweep of a ``python -m bench.one_launch`` record (pandas): one row a variant,
    one column a swept weight format, device ms a tail (NaN where the variant did not launch
    or disagreed with the default, both recorded as failed), and a last row ``chosen``: the
    variant each format was timed with (the bench's rule, ``workbench.kernels.one_launch.CHOICE_MARGIN``). Raises
    ``ValueError`` for a record that is not such a record or has no sweep."""
    import pandas as pd

    if not check_record(record, "one_launch").get("sweeps"):
        raise ValueError(f"record must be a bench.one_launch record with its sweeps; got {validate.describe(record)}")
    chosen = record.get("variant_chosen", {})
    return pd.DataFrame(
        {
            fmt: {**{v: r.get("device_ms", float("nan")) for v, r in results.items()}, "chosen": chosen.get(fmt, "-")}
            for fmt, results in record["sweeps"].items()
        }
    )


def wait_breakdown(record: dict[str, Any], profile: dict[str, Any]) -> Any:
    """Where the one launch's wait goes, one column a weight format in both records (pandas).

    ``record``: a ``python -m bench.one_launch`` record; ``profile``: a ``python -m
    bench.launch_profile --one-launch`` record (Nsight Compute: each kernel run once,
    caches flushed). Rows, ms: the kernel run once (ncu) and its device time chained (ten
    tails in one evaluation, over ten); the one launch's evaluation and wait with the graph
    already built; what MLX adds around the kernel (the evaluation minus the kernel run
    once) beside one tiny evaluation (MLX's least); and, where the record has PyTorch's
    CUDA-graph replay, what it adds (its one wait minus its device time) and the kernel
    time the one launch would need to wait no longer than it (its wait minus MLX's
    addition), beside the floor. Why both: a single-shot kernel slower than its chained
    time would mean the wait pays a ramp; the rest of the wait is the framework's.
    Raises ``ValueError`` for records that are not these, or that share no format.
    """
    import pandas as pd

    if "cases" not in check_record(record, "one_launch"):
        raise ValueError(f"record must be a bench.one_launch record with timed cases; got {validate.describe(record)}")
    check_record(profile, "launch_profile", name="profile")  # its table is a key every such record has
    single = {row["format"]: row["ms"] for row in profile["table"] if "tail_one_launch" in row["kernel"]}
    cols: dict[str, dict[str, float]] = {}
    for c in record["cases"]:
        fmt = c["case"].replace("bonsai27b-", "")
        if fmt not in single:
            continue
        res = {k: v["median_ms"] for k, v in c["resident_ms"].items()}
        wait = c["one_launch_split_ms"]["eval_and_wait"]
        col = {
            "kernel run once (ncu)": single[fmt],
            "kernel chained (device time a tail)": c["device_ms_per_tail"]["one_launch"],
            "evaluation and wait": wait,
            "MLX around the kernel, at least": wait - single[fmt],
            "one tiny evaluation": res["one_tiny_eval"],
        }
        if "torch_cuda_graph" in res:
            torch_adds = res["torch_cuda_graph"] - c["device_ms_per_tail"]["torch_cuda_graph"]
            col["PyTorch graph around its kernels"] = torch_adds
            col["kernel for one wait = PyTorch graph, at most"] = res["torch_cuda_graph"] - (wait - single[fmt])
            col["floor"] = c["floor_ms"]
        cols[fmt] = col
    if not cols:
        raise ValueError(
            f"the records share no weight format: the one-launch record times "
            f"{[c['case'] for c in record['cases']]}, the profile ran the one launch in {sorted(single)}"
        )
    return pd.DataFrame(cols)
