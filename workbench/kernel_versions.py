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


def versions_table(record: dict[str, Any]) -> Any:
    """One column a tail case of a ``bench.kernel_bodies`` record (pandas), rows: outputs
    with the same bits in both texts (``"same/all"``), device ms a tail with each text
    (medians) and new / old, and one wait new / old; where the record also ran the tail as
    one launch (CUDA), the same rows for it, prefixed ``one launch:`` (blank for a case
    without). Raises ``ValueError`` for a dict that is not such a record."""
    import pandas as pd  # noqa: PLC0415 -- only the notebooks' tables need it

    cases = record.get("cases") if isinstance(record, dict) else None
    if (not isinstance(record, dict) or record.get("bench") != "kernel_bodies" or not cases
            or not all(isinstance(c, dict) and "device_ms_per_tail" in c for c in cases)):
        raise ValueError(f"record must be a bench.kernel_bodies record with its timed cases; got "
                         f"{validate.describe(record)}")
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
            cols[c["case"]].update({
                "one launch: same bits": f"{bits1['same_bits']}/{bits1['elements']}",
                "one launch: device ms, old": dev1["old"]["median_ms"],
                "one launch: device ms, new": dev1["new"]["median_ms"],
                "one launch: device new / old": dev1["new"]["median_ms"] / dev1["old"]["median_ms"],
                "one launch: one wait new / old": wait1["new"]["median_ms"] / wait1["old"]["median_ms"],
            })
    return pd.DataFrame(cols)


def sass_table(record: dict[str, Any]) -> Any:
    """A ``bench.sass_counts --old`` record as one row a launch and format (pandas): the
    row loop's instructions with the older text and now, new / old, the integer-pipe and
    FMA-pipe instructions among them (old and now), and the registers a thread (old and
    now). Raises ``ValueError`` for a dict that is not such a record (one with both sides)."""
    import pandas as pd  # noqa: PLC0415 -- only the notebooks' tables need it

    rows = record.get("rows") if isinstance(record, dict) else None
    rows_ok = isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
    sides = {r.get("side") for r in rows} if rows_ok else set()
    if not isinstance(record, dict) or record.get("bench") != "sass_counts" or sides != {"old", "new"}:
        raise ValueError(f"record must be a bench.sass_counts record run with --old; got {validate.describe(record)}")
    by = {(r["launch"], r["format"], r["side"]): r for r in rows}
    out = []
    for (launch, fmt, side), new in by.items():
        if side != "new":
            continue
        old = by[(launch, fmt, "old")]
        out.append({"launch": launch, "format": fmt, "loop old": old["loop_instructions"],
                    "loop now": new["loop_instructions"],
                    "now / old": new["loop_instructions"] / old["loop_instructions"],
                    "int old": old["loop_classes"]["int"], "int now": new["loop_classes"]["int"],
                    "fma old": old["loop_classes"]["fma"], "fma now": new["loop_classes"]["fma"],
                    "regs old": old["registers"], "regs now": new["registers"]})
    return pd.DataFrame(out)
