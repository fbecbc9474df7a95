"""What more seeds buy: a check's calibrated tolerance and its catch rates as the seeds grow.

A tolerance calibrated on few errors is set by the few largest of them (a tail fit, at least
100 errors a scale), so it moves as seeds are added, and the share of a fault's cases it
catches moves with it. A cluster exists to add seeds; :func:`settling` shows, from one report,
how far the first ``n`` seeds' answer is from the answer of all of them: the same calibration
(``studies.calibration.calibrate_tolerance``, as ``check.tolerances.calibrated_per_scale``)
on the first ``n`` seeds of the report, at each input scale, with each fault's catch rate and
the reference's flake rate under that tolerance, on the same ``n`` seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from workbench import validate
from workbench.studies.calibration import calibrate_tolerance


def settling(report: Any, counts: Sequence[int], *, flake_rate: float = 1e-4, metric: str = "worst") -> pd.DataFrame:
    """One row a count of seeds ``n`` and input scale: the tolerance calibrated on the first
    ``n`` seeds' ``metric`` errors at that scale (``calibrated``), the share of the workbench
    reference's cases past it (``reference``: what it would cost another correct tail, as the
    report's catch table's reference row) and of each fault's (``catch <fault>``), on the same
    seeds. ``report``: a ``CheckReport``; ``counts``: seed counts, each at least 1 and at most
    the report's seeds (the calibration refuses fewer than 100 errors, in its own words)."""
    flake_rate = validate.number("flake_rate", flake_rate, minimum=0, exclusive_minimum=True, maximum=0.5)
    seeds = pd.unique(report.cases["seed"])
    counts = [
        validate.integer("counts", n, minimum=1, maximum=len(seeds))
        for n in validate.sequence("counts", counts, what=f"seed counts in 1..{len(seeds)}")
    ]
    rows = []
    for n in counts:
        first = set(seeds[:n].tolist())
        cases = report.cases[report.cases["seed"].isin(first)]
        faults = report.faults[report.faults["seed"].isin(first)] if len(report.faults) else report.faults
        for scale, at in cases.groupby("scale"):
            errors = at[metric].to_numpy()
            tol = calibrate_tolerance(errors[np.isfinite(errors)], flake_rate=flake_rate).recommended
            row: dict[str, Any] = {"seeds": n, "scale": float(scale), "calibrated": tol}
            row["reference"] = float(np.mean(~(at[f"ref_{metric}"].to_numpy() <= tol)))
            there = faults[faults["scale"] == scale] if len(faults) else faults
            for fault, g in there.groupby("fault", sort=False):
                row[f"catch {fault}"] = float(np.mean(~(g[metric].to_numpy() <= tol)))  # NaN counts as caught
            rows.append(row)
    return pd.DataFrame(rows).set_index(["seeds", "scale"])
