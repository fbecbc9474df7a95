"""A recurrent step's reproducer (:mod:`workbench.check.step_reproducer`) run again: the run
regenerated from its condition and seed (its inputs verified against the stored ones), the step
given again checked on it alone with the settings it was judged by, and the verdict and the
per-token error bits compared with those written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from workbench import validate
from workbench.check.gdn_cases import token_run
from workbench.check.gdn_run import check_step
from workbench.check.replay import Replay, read_file
from workbench.check.step_reproducer import PART, RUN_TENSORS, run_failures, tolerances_of
from workbench.kernels.gdn_step import GdnShape


def replay_step(path: Any, subject: Any, *, time_limit: float = 30.0, process: bool | None = None) -> Replay:
    """Run ``subject`` (a step callable or form, as the check was given it) again on the run of
    the reproducer ``path``; ``time_limit`` / ``process`` as :func:`~workbench.check.gdn_run.check_step`."""
    case, t = read_file(path, RUN_TENSORS + ("out_errors", "state_errors"))
    name = Path(path).name
    if case.get("part") != PART:
        raise ValueError(f"replay: {name} is a reproducer of the tail: replay it without --part gdn")
    if not callable(subject) and not hasattr(subject, "layer"):
        raise ValueError(f"subject: must be a step callable or form, got {validate.describe(subject)}")
    form = getattr(subject, "kind", "callable") if hasattr(subject, "layer") else "callable"
    if form != case["form"]:
        raise ValueError(f"subject: {name} was written by a check of a {case['form']}, got a {form}")
    geo = tuple(int(v) for v in str(case["geometry"]).split("/"))
    seed, tokens = int(case["seed"]), int(case["tokens"])
    cond = {"scale": float(case["scale"]), "gate": str(case["gate"]), "state_scale": float(case["state_scale"])}
    r = token_run(GdnShape(*geo), [seed], tokens, **cond)
    made = {k: getattr(r, k)[0] for k in RUN_TENSORS[:6]} | {k: getattr(r.weights, k)[0] for k in RUN_TENSORS[6:]}
    if any(not np.array_equal(made[k], t[k]) for k in RUN_TENSORS):
        raise ValueError(f"replay: {name}'s inputs are not those its seed regenerates (written by another version?)")
    rep = check_step(
        subject,
        geometries=[geo],
        seeds=[seed],
        tokens=tokens,
        horizons=[tokens],
        scales=[cond["scale"]],
        gates=[cond["gate"]],
        state_scales=[cond["state_scale"]],
        tolerance=case["tolerance"],
        faults=(),
        reference=case["reference"],
        rerun=bool(case["rerun"]),
        process=process,
        time_limit=time_limit,
    )
    worst = float(np.max(rep.curves["worst"][0]))
    now = run_failures(case["name"], rep.problems, worst, tolerances_of(case["tolerance"]))
    same = all(np.array_equal(t[f"{k}_errors"], rep.curves[k][0], equal_nan=True) for k in ("out", "state"))
    return Replay(Path(path), case["name"], list(case["failures"]), now, bool(same), [])
