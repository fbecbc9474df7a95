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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from workbench import validate
from workbench.check.report import CheckReport, build_report
from workbench.check.subjects import checked_output
from workbench.models.hadamard_pack import HadamardPack
from workbench.tail.comparison import max_abs_error, nmse, worst_scaled_error


def pack_arguments(
    pack: Any, subject: Any, takes: str, seeds: Iterable[int], scales: Sequence[float], tolerance: Any, flake_rate: Any
) -> tuple[list[int], list[float], tuple[str, float] | None, float]:
    """A pack layer check's common arguments checked (each refused naming the parameter):
    ``(seeds, scales, the user's tolerance as build_report takes it, flake_rate)``; ``takes``:
    what the subject is called with, for the message refusing one that is not callable."""
    if not isinstance(pack, HadamardPack):
        raise ValueError(f"pack: must be a HadamardPack (read_pack), got {validate.describe(pack)}")
    if not callable(subject):
        raise ValueError(f"subject: must be a callable {takes}, got {validate.describe(subject)}")
    seed_list = [validate.seed("seeds", s) for s in validate.sequence("seeds", list(seeds), what="seeds")]
    scale_list = [
        float(validate.number("scales", s, minimum=0, exclusive_minimum=True))
        for s in validate.sequence("scales", scales, what="positive numbers")
    ]
    user = None if tolerance is None else ("worst", validate.number("tolerance", tolerance, minimum=0))
    flake_rate = validate.number("flake_rate", flake_rate, minimum=0, exclusive_minimum=True, maximum=0.5)
    return seed_list, scale_list, user, flake_rate


def token_inputs(seeds: Sequence[int], scales: Sequence[float], tokens: int, hidden: int, salt: int) -> np.ndarray:
    """A layer's inputs over a run of tokens, float32 [tokens, S, hidden]: each seed's draws
    (uniform in [-1, 1), ``numpy``'s generator keyed ``[seed, salt]``) times each input scale,
    seed-major (S = seeds x scales)."""
    draws = [np.random.default_rng([s, salt]).uniform(-1, 1, (tokens, hidden)).astype(np.float32) for s in seeds]
    sa = np.asarray(scales, dtype=np.float32)[None, :, None, None]
    x = (np.stack(draws)[:, None] * sa).reshape(-1, tokens, hidden).transpose(1, 0, 2)
    return np.ascontiguousarray(x)


def sequence_output(subject: Any, x: np.ndarray, shape: tuple[int, ...], label: str, problems: list[str]) -> np.ndarray:
    """``subject`` on a copy of the token run ``x``: its output as float32 ``shape``, or NaN with
    what went wrong appended to ``problems`` (the implementation's failure is the check's
    result, not its crash)."""
    try:
        return checked_output(subject(x.copy()), shape)
    except Exception as e:
        problems.append(f"{label}: {type(e).__name__}: {e}")
        return np.full(shape, np.nan, dtype=np.float32)


def by_case(a: np.ndarray, seeds: int, scales: int) -> np.ndarray:
    """A token run's tensor [T, S, width] as a check's cases [seeds, scales, T * width]."""
    return np.asarray(a).transpose(1, 0, 2).reshape(seeds, scales, -1)


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
