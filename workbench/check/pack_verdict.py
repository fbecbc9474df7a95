"""A pack layer check's rows and verdict: the subject's, the reference's and each fault's outputs
against the float64 truth, turned into :func:`workbench.check.report.build_report`'s tables.

The layer checks of a Hadamard pack (:mod:`workbench.check.pack_head`, the attention head;
:mod:`workbench.check.pack_step`, the recurrent layer) return several tensors a case (q, k,
v and the gate; or a run of tokens' outputs): each case's outputs are laid end to end along
the last axis, so a case's ``worst`` is the worst element's ``|x - y| / max(|y|, 1)`` over
every tensor (frink-models' criterion, ``workbench.tail.comparison``), and the verdict is
the tail's: the 2e-4 bound, and the paired sign test against the workbench's float32
reference on the same cases, input scale by input scale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.check.report import CheckReport, build_report
from workbench.tail.comparison import max_abs_error, nmse, worst_scaled_error


def metrics(out: np.ndarray, truth: np.ndarray) -> dict[str, np.ndarray]:
    """The three per-case figures over the last axis (``out``, ``truth`` [..., width])."""
    return {"worst": worst_scaled_error(out, truth), "max_abs": max_abs_error(out, truth), "nmse": nmse(out, truth)}


def pack_report(
    *,
    name: str,
    base: Mapping[str, Any],
    seeds: Sequence[int],
    scales: Sequence[float],
    out: np.ndarray,
    ref: np.ndarray,
    truth: np.ndarray,
    faults: Mapping[str, np.ndarray],
    problems: list[str],
    user: tuple[str, float] | None,
    flake_rate: float,
    checked: list[str],
) -> CheckReport:
    """The report of a check whose arrays are [seeds, scales, width] (``out`` NaN where the
    subject gave nothing); ``base``: the columns every row carries (what was checked)."""
    import pandas as pd

    cols = {"seed": np.repeat(list(seeds), len(scales)), "scale": np.tile(list(scales), len(seeds))}
    mo, mr = metrics(out, truth), metrics(ref, truth)
    cases = pd.DataFrame(
        {
            **base,
            **cols,
            **{k: v.reshape(-1) for k, v in mo.items()},
            **{f"ref_{k}": v.reshape(-1) for k, v in mr.items()},
        }
    )
    frames = [
        pd.DataFrame({**base, "fault": f, **cols, **{k: v.reshape(-1) for k, v in metrics(fo, truth).items()}})
        for f, fo in faults.items()
    ]
    fault_df = pd.concat(frames, ignore_index=True) if frames else None
    return build_report(cases, fault_df, problems, user, flake_rate, name, "callable", checked=checked)
