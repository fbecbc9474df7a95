"""Which tolerance sees a bug, and what it costs: tolerances per input scale, set beside a
wrong implementation's catches and the correct one's flakes.

A tolerance is only as sharp as the error floor it was calibrated on. The errors of a
correct float32 tail grow with the input scale (at 100x they are tens of times those at
1x), so one tolerance calibrated over all scales together is set by the largest scale and
is blind at the others: eps outside the square root, a few times float32's rounding error
at scale 1, passes it there. Calibrated on the implementation's own errors at each scale
separately (:func:`calibrated_per_scale`), it catches that bug at scale 1 on most cases,
and :func:`catch_and_flake` states what the user pays for it: the share of the CORRECT
implementation's cases the same tolerance fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from workbench import validate
from workbench.studies.calibration import calibrate_tolerance


def _scales(report: Any) -> list[float]:
    return sorted(float(s) for s in report.cases["scale"].unique())


def calibrated_per_scale(report: Any, *, flake_rate: float = 1e-4, metric: str = "worst") -> dict[float, float]:
    """Input scale -> the recommended tolerance calibrated on ``report``'s own ``metric`` errors
    at that scale only (``workbench.studies.calibration.calibrate_tolerance``; ``ValueError``
    when a scale has too few errors to fit, the calibration's own message)."""
    flake_rate = validate.number("flake_rate", flake_rate, minimum=0, exclusive_minimum=True, maximum=0.5)
    out = {}
    for s in _scales(report):
        v = report.cases.loc[report.cases["scale"] == s, metric].to_numpy()
        out[s] = calibrate_tolerance(v[np.isfinite(v)], flake_rate=flake_rate).recommended
    return out


def catch_and_flake(
    correct: Any, wrong: Any, tolerances: Mapping[str, float | Mapping[float, float]], *, metric: str = "worst"
):
    """One row a tolerance (a limit, or input scale -> limit): its limit at each scale
    (``limit <s>``), the share of ``wrong``'s cases it fails there (``catch <s>``) and the
    share of ``correct``'s (``flake <s>``).

    ``correct`` and ``wrong``: two :class:`~workbench.check.run.CheckReport` of the same
    cases and scales (a correct implementation and a wrong one)."""
    import pandas as pd

    scales = _scales(correct)
    if _scales(wrong) != scales:
        raise ValueError(f"wrong: must be checked at the same input scales as correct ({scales}), got {_scales(wrong)}")
    rows = []
    for name, tol in tolerances.items():
        limits = {s: float(tol[s]) for s in scales} if isinstance(tol, Mapping) else dict.fromkeys(scales, float(tol))
        row: dict[str, Any] = {"tolerance": name, **{f"limit {s:g}": limits[s] for s in scales}}
        for label, rep in (("catch", wrong), ("flake", correct)):
            for s in scales:
                v = rep.cases.loc[rep.cases["scale"] == s, metric].to_numpy()
                row[f"{label} {s:g}"] = float(np.mean(~(v <= limits[s])))  # NaN counts as failed
        rows.append(row)
    return pd.DataFrame(rows).set_index("tolerance")
