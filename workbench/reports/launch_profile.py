"""What bounds each kernel launch, read from ``python -m bench.launch_profile --stalls`` records.

Nsight Compute runs each launch once (caches flushed) and reports, beside its time and DRAM
bytes, how often a warp scheduler issued, how busy the FMA pipe (float multiply-adds) and the
ALU pipe (integer, bitwise and shift instructions) were, and why warps waited (stall cycles
per instruction issued). :func:`bound_table` puts them side by side and :func:`bound_of`
names the bound by a rule written here, so a notebook can assert it: **memory** when the top
stall is ``long_scoreboard`` (a global load) and no pipe is over half busy (more bytes in
flight or fewer bytes move it); **ALU pipe** / **FMA pipe** when that pipe is over half busy
and at least :data:`PIPE_DOMINANCE` times the other (fewer instructions on *that* pipe move
it); **unclear** otherwise. It lives here, not in the bench, so notebooks can show it
(profiling needs a GPU; reading its record does not).
"""

from __future__ import annotations

from typing import Any

from workbench import validate
from workbench.reports.records import check as check_record
from workbench.reports.records import kind_of

#: How many times busier one pipe must be than the other for :func:`bound_of` to name it.
PIPE_DOMINANCE = 1.5

#: Over this % of its peak a pipe counts as busy (the FMA or ALU bound needs it).
BUSY_PCT = 50.0

#: The columns of :func:`bound_table`, in order.
COLUMNS: tuple[str, ...] = (
    "format",
    "launch",
    "ms",
    "TB/s",
    "issue %",
    "FMA %",
    "ALU %",
    "M instr.",
    "top stall",
    "bound",
)


def _launch_name(kernel: str) -> str:
    """``custom_kernel_fat_ffn_gate_up_256_...`` -> ``ffn_gate_up`` (MLX names a custom
    kernel after the workbench's name plus its template values)."""
    for name in ("wo_residual", "ffn_gate_up", "ffn_down", "tail_one_launch", "head_qkv"):
        if name in kernel:
            return "one launch" if name == "tail_one_launch" else name
    return kernel


def bound_of(row: dict[str, Any]) -> str:
    """The bound a launch's scheduler figures show (``"memory"``, ``"ALU pipe"``, ``"FMA
    pipe"`` or ``"unclear"``), by the rule in this module's doc. ``row``: one entry of a
    ``--stalls`` record's ``table`` (its ``scheduler`` dict)."""
    sc = row["scheduler"]
    fma, alu = sc.get("fma_pipe_pct") or 0.0, sc.get("alu_pipe_pct") or 0.0
    top = sc["top_stalls"][0][0] if sc.get("top_stalls") else None
    if alu > BUSY_PCT and alu >= PIPE_DOMINANCE * fma:
        return "ALU pipe"
    if fma > BUSY_PCT and fma >= PIPE_DOMINANCE * alu:
        return "FMA pipe"
    if top == "long_scoreboard" and max(fma, alu) <= BUSY_PCT:
        return "memory"
    return "unclear"


def _stalls_rows(profile: dict[str, Any], name: str = "profile") -> list[dict[str, Any]]:
    """The rows of a ``--stalls`` record's table; ``ValueError`` naming ``name`` for
    anything else (``records.RecordError`` for what is not a launch_profile record)."""
    table = check_record(profile, "launch_profile", name=name)["table"]
    if not table or not all(isinstance(r, dict) and "scheduler" in r for r in table):
        raise ValueError(
            f"{name} must be a bench.launch_profile record made with --stalls (every row with its "
            f"scheduler figures); got {validate.describe(profile)}"
        )
    return table


def bound_table(profile: dict[str, Any]) -> Any:
    """One row a profiled launch (pandas): format, launch, ms, DRAM TB/s read, issue slots,
    FMA and ALU pipes busy (%), warp instructions executed (millions), the top stall reason
    with its cycles per instruction issued, and :func:`bound_of`. Raises ``ValueError`` for
    a record that is not a ``bench.launch_profile --stalls`` record."""
    import pandas as pd

    rows = []
    for r in _stalls_rows(profile):
        sc = r["scheduler"]
        top = sc["top_stalls"][0] if sc.get("top_stalls") else ("-", float("nan"))
        rows.append(
            {
                "format": r["format"],
                "launch": _launch_name(r["kernel"]),
                "ms": r["ms"],
                "TB/s": r["read_TBps"],
                "issue %": sc["issue_active_pct"],
                "FMA %": sc["fma_pipe_pct"],
                "ALU %": sc["alu_pipe_pct"],
                "M instr.": (sc["instructions"] or 0.0) / 1e6,
                "top stall": f"{top[0]} {top[1]:.1f}",
                "bound": bound_of(r),
            }
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))


#: The columns of :func:`bound_change`, in order.
CHANGE_COLUMNS: tuple[str, ...] = (
    "format",
    "launch",
    "ms before",
    "ms after",
    "M ALU before",
    "M ALU after",
    "ALU % before",
    "ALU % after",
    "bound before",
    "bound after",
)


def _alu_millions(row: dict[str, Any]) -> float:
    """Warp instructions the ALU pipe executed (millions); NaN in records made before
    ``--stalls`` counted instructions by pipe."""
    by_pipe = row["scheduler"].get("instructions_by_pipe") or {}
    return by_pipe["alu"] / 1e6 if by_pipe.get("alu") is not None else float("nan")


def bound_change(before: dict[str, Any], after: dict[str, Any]) -> Any:
    """The launches two ``--stalls`` records both profiled (same format and launch), side by
    side (pandas, :data:`CHANGE_COLUMNS`): time, ALU-pipe warp instructions (millions) and
    how busy that pipe was, and :func:`bound_of`, before and after a change of the kernels.
    Raises ``ValueError`` for records that are not such records or share no launch."""
    import pandas as pd

    def keyed(profile: dict[str, Any], name: str) -> dict[tuple[str, str], dict[str, Any]]:
        return {(r["format"], _launch_name(r["kernel"])): r for r in _stalls_rows(profile, name)}

    rows_before, rows_after = keyed(before, "before"), keyed(after, "after")
    shared = [k for k in rows_after if k in rows_before]  # in the after record's order
    if not shared:
        raise ValueError(f"the records share no launch: before has {sorted(rows_before)}, after {sorted(rows_after)}")
    rows = []
    for key in shared:
        b, a = rows_before[key], rows_after[key]
        rows.append(
            {
                "format": key[0],
                "launch": key[1],
                "ms before": b["ms"],
                "ms after": a["ms"],
                "M ALU before": _alu_millions(b),
                "M ALU after": _alu_millions(a),
                "ALU % before": b["scheduler"]["alu_pipe_pct"],
                "ALU % after": a["scheduler"]["alu_pipe_pct"],
                "bound before": bound_of(b),
                "bound after": bound_of(a),
            }
        )
    return pd.DataFrame(rows, columns=list(CHANGE_COLUMNS))


def row_dot_table(record: dict[str, Any], copy_bandwidth_Bps: float | None = None) -> Any:
    """The row dots of a ``experiments.tensor_core_rowdot`` / ``experiments.async_copy_rowdot`` record,
    one row each (pandas): device ms, times the floor, the ratio to the kernels' row dot,
    the worst scaled error against float64 and the check. The floor is the record's bytes
    over ``copy_bandwidth_Bps`` where given (a device-timed copy from another record of the
    same machine: the first tensor-core record divided by MLX's host-timed copy, about half
    the device's rate), else over the record's own ``used_for_floor``."""
    import pandas as pd

    # either row-dot bench; anything else is named as not a tensor_core_rowdot record
    check_record(record, "async_copy_rowdot" if kind_of(record) == "async_copy_rowdot" else "tensor_core_rowdot")
    if not isinstance(record["variants"], dict):
        raise ValueError(
            f"record must be a row-dot bench record (variants, weight_bytes); got {validate.describe(record)}"
        )
    if copy_bandwidth_Bps is None:
        bw = record.get("copy_bandwidth_Bps")
        copy_bandwidth_Bps = bw["used_for_floor"] if isinstance(bw, dict) else bw
    if not isinstance(copy_bandwidth_Bps, (int, float)) or copy_bandwidth_Bps <= 0:
        raise ValueError(
            f"copy_bandwidth_Bps must be a positive number of bytes a second; got "
            f"{validate.describe(copy_bandwidth_Bps)}"
        )
    floor_ms = record["weight_bytes"] / copy_bandwidth_Bps * 1e3
    return pd.DataFrame(
        {
            name: {
                "device ms": v["device_ms"],
                "x floor": v["device_ms"] / floor_ms,
                "/ CUDA cores": v["vs_cuda_cores"],
                "worst scaled": v["worst_scaled_error"],
                "check": "pass" if v["passed"] else "FAIL",
            }
            for name, v in record["variants"].items()
        }
    ).T
