"""What a ``python -m bench.gpu_check`` record says: every kernel check against the float64
oracle, one row a case (:func:`gpu_check_table`) or one a weight format
(:func:`format_summary`).

``bench.gpu_check`` runs the kernels against the float64 oracle, one case a shape, fold and
weight format. These tables let a notebook show and assert a record without reading its
keys itself. Each refuses a dict that is not such a record with a ``ValueError``
(``records.RecordError`` where it is not a record of that kind at all).
"""

from __future__ import annotations

import re
from typing import Any

from workbench import validate
from workbench.models.config import BONSAI_SHAPE
from workbench.reports.records import check as check_record

#: A gpu_check case's first word -> the launch its row names (the rest of the case name
#: repeats the shape, fold and format, which have columns of their own).
LAUNCH_LABELS: dict[str, str] = {
    "seed": "test case",
    "random": "tail",
    "batch": "tail x3",
    "head": "head",
    "Bonsai-27B": "Bonsai-27B",
}

#: The columns of :func:`gpu_check_table`, in order.
CHECK_COLUMNS: tuple[str, ...] = (
    "launch",
    "shape",
    "weights",
    "fold",
    "tol",
    "kernel worst",
    "3 launches worst",
    "f32 oracle worst",
    "pass",
)


def fold_label(fold: str | None) -> str:
    """A check's fold as a short label: ``'HadamardFold(block=192 (= 12 x 2^4), ...,
    perm=yes, ...)'`` -> ``'192 perm'``; no fold (``None`` or ``'None'``) -> ``'none'``."""
    if fold in (None, "None"):
        return "none"
    found = re.search(r"block=(\d+)", fold) if isinstance(fold, str) else None
    if found is None:
        raise ValueError(
            f"fold: must be a HadamardFold's repr (with its block=) or None; got {validate.describe(fold)}"
        )
    return found.group(1) + (" perm" if "perm=yes" in fold else "")


def gpu_check_table(record: dict[str, Any]) -> Any:
    """One row a check of a ``bench.gpu_check`` record (pandas, :data:`CHECK_COLUMNS`): the
    launch (:data:`LAUNCH_LABELS`; a tail at Bonsai-27B's shape is ``Bonsai-27B``), shape,
    weight format, fold (:func:`fold_label`), tolerance, the worst scaled error of what
    ``fused_tail`` ran against the float64 oracle, the same for the three launches where the
    record checked them apart ("-" elsewhere: the head launch, records before the one launch
    was the CUDA path), the float32 oracle's own worst error, and whether the case passed.
    Errors print with two significant digits. Raises ``ValueError`` for a dict that is not
    such a record."""
    import pandas as pd

    checks = check_record(record, "gpu_check")["checks"]
    if not isinstance(checks, list) or not checks or not all(isinstance(c, dict) and "worst" in c for c in checks):
        raise ValueError(f"record must be a bench.gpu_check record with its checks; got {validate.describe(record)}")
    bonsai = "x".join(map(str, BONSAI_SHAPE))
    rows = []
    for c in checks:
        shape = "x".join(map(str, c["shape"]))
        first = c["case"].split()[0]
        launch = "Bonsai-27B" if shape == bonsai else LAUNCH_LABELS.get(first, first)
        three = c.get("three_launches_worst")
        rows.append(
            {
                "launch": launch,
                "shape": shape,
                "weights": c["weights"],
                "fold": fold_label(c["fold"]),
                "tol": c["tol"],
                "kernel worst": f"{c['worst']:.1e}",
                "3 launches worst": "-" if three is None else f"{three:.1e}",
                "f32 oracle worst": f"{c['f32_oracle_worst']:.1e}",
                "pass": bool(c["passed"]),
            }
        )
    return pd.DataFrame(rows, columns=list(CHECK_COLUMNS))


#: The columns of :func:`format_summary`, in order.
SUMMARY_COLUMNS: tuple[str, ...] = ("weights", "cases", "launches", "kernel worst", "f32 oracle worst", "tol", "pass")


def format_summary(record: dict[str, Any]) -> Any:
    """:func:`gpu_check_table` folded to one row a weight format (pandas,
    :data:`SUMMARY_COLUMNS`), in the order the record first checks each: how many cases,
    which launches ran them (:data:`LAUNCH_LABELS`), the worst error of the kernels and of
    the float32 oracle over those cases, the largest tolerance, and whether every case
    passed (errors and tolerance as text, two and one significant digits). A format is its
    name without the group size (``affine4-g64`` -> ``affine4``). Raises what
    :func:`gpu_check_table` raises."""
    import pandas as pd

    table = gpu_check_table(record)
    table["format"] = table["weights"].str.split("-").str[0]
    rows = []
    for fmt, cases in table.groupby("format", sort=False):
        rows.append(
            {
                "weights": fmt,
                "cases": len(cases),
                "launches": ", ".join(dict.fromkeys(cases["launch"])),
                "kernel worst": f"{cases['kernel worst'].astype(float).max():.1e}",
                "f32 oracle worst": f"{cases['f32 oracle worst'].astype(float).max():.1e}",
                "tol": f"{cases['tol'].max():.0e}",
                "pass": bool(cases["pass"].all()),
            }
        )
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


#: What a check computes from its numbers alone: its errors against the float64 oracle (of
#: what ``fused_tail`` ran and of the three launches), the float32 oracle's own, and the
#: verdicts (``first_call_ms``, the time of its first call, depends on the machine: left out).
ERROR_FIGURES: tuple[str, ...] = (
    "tol",
    "worst",
    "nmse",
    "max_abs",
    "f32_oracle_worst",
    "three_launches_worst",
    "passed",
    "three_launches_passed",
    "deterministic",
    "result",
)


def reproduced(first: dict[str, Any], second: dict[str, Any]) -> Any:
    """Two ``bench.gpu_check`` records of the same seed side by side, one row a check
    (pandas): the case, and for each of :data:`ERROR_FIGURES` either record has, whether
    both give the same float bit for bit (``same``), and whether every figure is the same.
    A rerun with the first's ``--seed`` on the same kernel text draws the same inputs, so
    any difference is a change in what the kernels or the oracle compute. Raises
    ``ValueError`` when the records are not such records, ran other seeds, or checked other
    cases."""
    import pandas as pd

    a, b = check_record(first, "gpu_check", name="first"), check_record(second, "gpu_check", name="second")
    if a.get("seed") != b.get("seed"):
        raise ValueError(f"second: must have run first's seed {a.get('seed')!r}, got {b.get('seed')!r}")
    cases_a, cases_b = [c["case"] for c in a["checks"]], [c["case"] for c in b["checks"]]
    if cases_a != cases_b:
        raise ValueError(
            f"second: must check the same cases as first; got {len(cases_b)} cases against "
            f"{len(cases_a)}, first differing: "
            f"{next((x, y) for x, y in zip(cases_a + [None], cases_b + [None]) if x != y)}"
        )
    rows = []
    for ca, cb in zip(a["checks"], b["checks"]):
        keys = [k for k in ERROR_FIGURES if k in ca or k in cb]
        differ = [k for k in keys if ca.get(k) != cb.get(k)]
        rows.append({"case": ca["case"], "figures": len(keys), "differ": ", ".join(differ) or "-", "same": not differ})
    return pd.DataFrame(rows)
