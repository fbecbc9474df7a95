"""Each failing run of a recurrent step's check written as a self-contained reproducer.

A reproducer is one safetensors file a failing run (one seed of one condition): the condition
and seed that regenerate the run (``gdn_cases.token_run``), the run's inputs as handed (every
token's ``mixed``, ``z``, ``b``, ``a``, the initial states, the layer's constants), and the
subject's per-token scaled errors of its output and states against the float64 truth (float64
[T]: the same bits only when the subject gave the same bits), with the settings judged and the
run's failures in words. :func:`workbench.check.step_replay.replay_step` runs it again. A run
fails where it gave no usable result (its problem names it) or where its worst error within
the run passes a fixed or the user's tolerance. Written as the tail's reproducers are
(:mod:`workbench.check.replay`): atomically, never over a file, under a size cap checked before
any run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from workbench.check.gdn_cases import token_run
from workbench.check.gdn_report import FIXED_TOLERANCES
from workbench.check.replay import MARK, STEP_PART, ReplayDir, write_file
from workbench.kernels.gdn_step import GdnShape

#: The part a step reproducer's metadata names.
PART = STEP_PART

#: The tensors of a run a reproducer holds (the constants' and the initial states' names as StepInputs has them).
RUN_TENSORS: tuple[str, ...] = ("mixed", "z", "b", "a", "conv_state", "state", "conv_w", "a_log", "dt_bias", "o_norm")


def reproducer_bytes(shape: GdnShape, tokens: int) -> int:
    """The tensors' bytes of one run's reproducer."""
    s = shape
    per_token = s.channels + s.vd + 2 * s.hv
    once = (s.kw - 1) * s.channels + s.hv * s.dv * s.dk + s.kw * s.channels + 2 * s.hv + s.dv
    return 4 * (tokens * per_token + once) + 8 * 2 * tokens


def check_fits(where: ReplayDir, shape: GdnShape, tokens: int) -> None:
    """``ValueError`` naming ``replay_max_bytes`` when a run's reproducer would pass the cap."""
    size = reproducer_bytes(shape, tokens)
    if size > where.max_bytes:
        raise ValueError(
            f"replay_max_bytes: a reproducer of geometry {shape.hk}/{shape.hv}/{shape.dk}/{shape.dv}/{shape.kw} "
            f"over {tokens} tokens takes {size} bytes, over the cap of {where.max_bytes}; raise the cap, or check "
            "fewer tokens"
        )


def run_failures(label: str, problems: list[str], worst: float, tolerances: dict[str, float]) -> list[str]:
    """What fails one run, in words: its problems, then each tolerance its worst error passes."""
    out = [p for p in problems if f", {label}, " in p]
    for name, limit in tolerances.items():
        if not worst <= limit:
            out.append(f"the {name} tolerance (worst <= {limit:g}): worst {worst:.3g}")
    return out


def tolerances_of(user: float | None) -> dict[str, float]:
    """The tolerances a run is judged by: the fixed ones and the user's."""
    return {**FIXED_TOLERANCES, **({"user's": float(user)} if user is not None else {})}


def write_failing_runs(where: ReplayDir, rep: Any, settings: dict[str, Any]) -> list[Path]:
    """A reproducer in ``where`` for each failing run of ``rep`` (a ``StepReport``); ``settings``:
    ``tokens``, ``tolerance``, ``reference``, ``rerun`` (what the check was given)."""
    tols = tolerances_of(settings["tolerance"])
    written = []
    for i, row in rep.runs.reset_index(drop=True).iterrows():
        geo = str(row["geometry"])
        seed, scale, gate, st = int(row["seed"]), float(row["scale"]), str(row["gate"]), float(row["state_scale"])
        label = f"case geometry {geo} scale {scale:g} gate {gate} state {st:g} seed {seed}"
        worst = float(np.max(rep.curves["worst"][i]))
        failures = run_failures(label, rep.problems, worst, tols)
        if not failures:
            continue
        shape = GdnShape(*(int(v) for v in geo.split("/")))
        r = token_run(shape, [seed], settings["tokens"], scale=scale, gate=gate, state_scale=st)
        w = r.weights
        tensors = {
            "mixed": r.mixed[0],
            "z": r.z[0],
            "b": r.b[0],
            "a": r.a[0],
            "conv_state": r.conv_state[0],
            "state": r.state[0],
            **{k: getattr(w, k)[0] for k in ("conv_w", "a_log", "dt_bias", "o_norm")},
            "out_errors": rep.curves["out"][i],
            "state_errors": rep.curves["state"][i],
        }
        case = {
            "part": PART,
            "geometry": geo,
            "seed": seed,
            "scale": scale,
            "gate": gate,
            "state_scale": st,
            "tokens": int(settings["tokens"]),
            "tolerance": settings["tolerance"],
            "reference": settings["reference"],
            "rerun": bool(settings["rerun"]),
            "subject": rep.subject,
            "form": rep.kind,
            "name": label,
            "failures": failures,
        }
        stem = f"gdn-{rep.kind}-{geo.replace('/', 'x')}-s{scale:g}-{gate}-st{st:g}-seed{seed}"
        meta = {MARK: "1", **{k: json.dumps(v) for k, v in case.items()}}
        written.append(write_file(where, stem, tensors, meta))
    return written
