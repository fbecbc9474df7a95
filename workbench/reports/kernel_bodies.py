"""Two kernel texts side by side, read from ``python -m bench.kernel_bodies`` records
(on a GPU: same bits, and how fast) and ``python -m bench.sass_counts`` records (no GPU:
what nvcc makes of each).

``bench.kernel_bodies --old DIR`` prepares each tail twice from the same weights and
tuning, its kernels composed from an older ``kernels/`` folder ("old") and from the
repository's ("new"), checks both against the float64 oracle and against each other, then
times them alternating round by round. :func:`versions_table` puts what a notebook shows
of that in one table: whether the outputs kept their bits, and the new text's time over
the old's. It lives here, not in the bench, so notebooks can show it (the bench needs a
GPU; reading its record does not).
"""

from __future__ import annotations

from typing import Any

from workbench import validate
from workbench.reports.records import check as check_record


def versions_table(record: dict[str, Any]) -> Any:
    """One column a tail case of a ``bench.kernel_bodies`` record (pandas), rows: outputs
    with the same bits in both texts (``"same/all"``), device ms a tail with each text
    (medians) and new / old, and one wait new / old; where the record also ran the tail as
    one launch (CUDA), the same rows for it, prefixed ``one launch:`` (blank for a case
    without). Raises ``ValueError`` for a dict that is not such a record."""
    import pandas as pd

    cases = check_record(record, "kernel_bodies")["cases"]
    if not cases or not all(isinstance(c, dict) and "device_ms_per_tail" in c for c in cases):
        raise ValueError(
            f"record must be a bench.kernel_bodies record with its timed cases; got {validate.describe(record)}"
        )
    cols = {}
    for c in cases:
        bits, dev, wait = c["check"]["new_vs_old"], c["device_ms_per_tail"], c["one_wait_ms"]
        cols[c["case"]] = {
            "same bits": f"{bits['same_bits']}/{bits['elements']}",
            "device ms, old": dev["old"]["median_ms"],
            "device ms, new": dev["new"]["median_ms"],
            "device new / old": dev["new"]["median_ms"] / dev["old"]["median_ms"],
            "one wait new / old": wait["new"]["median_ms"] / wait["old"]["median_ms"],
        }
        one = c.get("one_launch")
        if one is not None and "device_ms_per_tail" in one:  # the tail as one launch (CUDA), both texts
            bits1, dev1, wait1 = one["check"]["new_vs_old"], one["device_ms_per_tail"], one["one_wait_ms"]
            cols[c["case"]].update(
                {
                    "one launch: same bits": f"{bits1['same_bits']}/{bits1['elements']}",
                    "one launch: device ms, old": dev1["old"]["median_ms"],
                    "one launch: device ms, new": dev1["new"]["median_ms"],
                    "one launch: device new / old": dev1["new"]["median_ms"] / dev1["old"]["median_ms"],
                    "one launch: one wait new / old": wait1["new"]["median_ms"] / wait1["old"]["median_ms"],
                }
            )
    return pd.DataFrame(cols)


#: The one launch's rows in a ``bench.sass_counts`` record (``launch``; the bench names
#: them by this), and its phases: ``kernel_source.ONE_LAUNCH_PHASES``' launches in order
#: (written out: this module sits on the bottom floor beside kernel_source; a test holds
#: the two equal), then the grid barriers' waits.
SASS_ONE_LAUNCH = "one_launch"
SASS_PHASES: tuple[str, ...] = ("wo_residual", "ffn_gate_up", "ffn_down", "barriers")


def _sass_row(
    launch: str, fmt: str, old: dict[str, Any] | None, new: dict[str, Any], regs_old: int | None, regs_new: int | None
) -> dict[str, Any]:
    """One row of :func:`sass_table`: a loop count and its classes with each text
    (``old`` None: that text had no such launch, its columns NaN)."""
    nan = float("nan")
    was = old["loop_instructions"] if old else nan
    return {
        "launch": launch,
        "format": fmt,
        "loop old": was,
        "loop now": new["loop_instructions"],
        "now / old": new["loop_instructions"] / was if old and was else nan,
        "int old": old["loop_classes"]["int"] if old else nan,
        "int now": new["loop_classes"]["int"],
        "fma old": old["loop_classes"]["fma"] if old else nan,
        "fma now": new["loop_classes"]["fma"],
        "regs old": regs_old if old else nan,
        "regs now": regs_new,
    }


def sass_table(record: dict[str, Any]) -> Any:
    """A ``bench.sass_counts --old`` record as one row a launch and format (pandas): the
    row loop's instructions with the older text and now, new / old, the integer-pipe and
    FMA-pipe instructions among them (old and now), and the registers a thread (old and
    now). Raises ``ValueError`` for a dict that is not such a record (one with both sides).

    Records since the bench counts the tail's one launch also have its rows, after the
    three launches': one a phase (``one_launch/ffn_down``; ``one_launch/barriers``, the
    grid barriers' waits), its outer loops' instructions as the loop and the registers of
    that phase compiled alone (the one launch has one count for all: ptxas cannot say
    which phase asks for them); then ``one_launch``, every phase's loops summed, with the
    launch's own registers. A one launch the older text lacked has NaN old columns.
    Older records (no one launch) read as before."""
    import pandas as pd

    rows = check_record(record, "sass_counts")["rows"]
    rows_ok = isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
    sides = {r.get("side") for r in rows} if rows_ok else set()
    if sides != {"old", "new"}:
        raise ValueError(f"record must be a bench.sass_counts record run with --old; got {validate.describe(record)}")
    by = {(r["launch"], r["format"], r["side"]): r for r in rows}
    out, one = [], []
    for (launch, fmt, side), new in by.items():
        if side != "new":
            continue
        old = by.get((launch, fmt, "old"))
        if launch != SASS_ONE_LAUNCH:
            if old is None:
                raise ValueError(
                    f"record must be a bench.sass_counts record run with --old; {launch} {fmt} has no old row"
                )
            out.append(_sass_row(launch, fmt, old, new, old["registers"], new["registers"]))
            continue
        for phase in SASS_PHASES:
            ph_new, ph_old = new["phases"][phase], old["phases"][phase] if old else None
            alone = {s: (p or {}).get("alone", {}).get("registers") for s, p in (("old", ph_old), ("new", ph_new))}
            one.append(_sass_row(f"{launch}/{phase}", fmt, ph_old, ph_new, alone["old"], alone["new"]))
        whole = {
            s: {
                "loop_instructions": sum(r["phases"][p]["loop_instructions"] for p in SASS_PHASES),
                "loop_classes": {
                    c: sum(r["phases"][p]["loop_classes"][c] for p in SASS_PHASES) for c in ("int", "fma")
                },
            }
            for s, r in (("old", old), ("new", new))
            if r is not None
        }
        one.append(_sass_row(launch, fmt, whole.get("old"), whole["new"], old and old["registers"], new["registers"]))
    return pd.DataFrame(out + one)
