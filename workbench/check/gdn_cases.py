"""Seeded runs of tokens for the Gated DeltaNet step, along its input axes.

A recurrent kernel's bugs hide on one step of random normal inputs; they show along axes:
the input scale (the L2 norms' eps shows when q and k are small), the gate regime (decay
near 1 keeps every error in the state; strong forgetting keeps none), the state's
magnitude, and the head ratio Hv / Hk (with Hv = Hk a wrong key-head mapping reads the
right head). :func:`token_run` draws one condition's weights, initial states and T tokens
of inputs for a block of seeds, each seed's draws its own (the same seed gives the same
run whatever else is in the block).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench import validate
from workbench.check.gdn_faults import StepWeights
from workbench.kernels.gdn_step import GdnShape

#: The geometries a check runs by default: small, with Bonsai-27B's head ratio (48/16 = 3)
#: and Qwen3.5-9B's (32/16 = 2), so a wrong key-head mapping shows.
DEFAULT_GEOMETRIES: tuple[tuple[int, int, int, int, int], ...] = ((2, 6, 32, 32, 4), (2, 4, 32, 32, 4))

#: gate regime -> what it draws (A = exp(a_log), dt = softplus(dt_bias); a ~ N(0, 1) a token).
GATES: dict[str, str] = {
    "typical": "A ~ U(1, 16), dt log-uniform in [1e-3, 0.1] (the model family's initialisation): gamma ~ 0.9",
    "near_one": "A ~ U(1e-3, 1e-2), dt as typical: gamma within 1e-4 of 1, the state keeps every error",
    "forgetting": "A ~ U(4, 16), dt_bias ~ U(1, 3): gamma below 1e-3, the state forgets each token",
}

#: The RMS norm's eps of the runs (Qwen3.5's).
STEP_EPS = 1e-6


def geometry(g: object) -> GdnShape:
    """``g`` ((Hk, Hv, Dk, Dv, K) or a :class:`GdnShape`) as a GdnShape, or a ValueError naming it."""
    if isinstance(g, GdnShape):
        vals = (g.hk, g.hv, g.dk, g.dv, g.kw)
    elif isinstance(g, (tuple, list)) and len(g) == 5:
        vals = tuple(g)
    else:
        raise ValueError(f"geometries: each must be (Hk, Hv, Dk, Dv, K), got {validate.describe(g)}")
    names = ("Hk", "Hv", "Dk", "Dv", "K")
    hk, hv, dk, dv, kw = (validate.integer(f"geometries {n}", v, minimum=1) for n, v in zip(names, vals))
    if hv % hk:
        raise ValueError(f"geometries: Hv must be a multiple of Hk, got Hk {hk}, Hv {hv}")
    if kw < 2:
        raise ValueError(f"geometries: K (the conv width) must be >= 2, got {kw}")
    return GdnShape(hk, hv, dk, dv, kw)


@dataclass(frozen=True)
class TokenRun:
    """One condition's run for a block of seeds: float32 ``weights`` (a set a seed), inputs
    ``mixed`` [S, T, C], ``z`` [S, T, Hv Dv], ``b`` and ``a`` [S, T, Hv], initial
    ``conv_state`` [S, K-1, C] and ``state`` [S, Hv, Dv, Dk]."""

    shape: GdnShape
    seeds: np.ndarray
    weights: StepWeights
    mixed: np.ndarray
    z: np.ndarray
    b: np.ndarray
    a: np.ndarray
    conv_state: np.ndarray
    state: np.ndarray

    @property
    def tokens(self) -> int:
        return int(self.mixed.shape[1])


#: Bytes of float64 draws made at once for a run's token inputs (in cache, then narrowed to float32).
DRAW_BYTES = 1 << 20


def _draws_into(rng: np.random.Generator, out: np.ndarray, scale: float | None) -> None:
    """``rng``'s standard normals of ``out``'s shape, times ``scale`` (None: as drawn), in
    float64 and then rounded to ``out``'s float32: a few rows at a time, so a run of thousands
    of tokens never holds its draws in float64 (the generator's stream is the same drawn in
    parts: each part continues where the last stopped)."""
    rows, cols = out.shape
    per = max(1, DRAW_BYTES // (8 * cols))
    buf = np.empty((min(per, rows), cols))
    for r in range(0, rows, per):
        d = buf[: min(per, rows - r)]
        rng.standard_normal(out=d)
        if scale is None:
            np.copyto(out[r : r + len(d)], d, casting="same_kind")
        else:
            np.multiply(d, scale, out=out[r : r + len(d)], casting="same_kind")


def _one(
    shape: GdnShape, seed: int, tokens: int, scale: float, gate: str, state_scale: float, mixed: Any, z: Any
) -> tuple:
    """One seed's draws, in their order; its token inputs written into ``mixed`` [T, C] and
    ``z`` [T, Hv Dv] (float32)."""
    s = shape
    rng = np.random.default_rng([int(seed), 53])
    c = s.channels
    conv_w = rng.standard_normal((s.kw, c)) / np.sqrt(s.kw)
    if gate == "forgetting":
        a_log = np.log(rng.uniform(4, 16, s.hv))
        dt_bias = rng.uniform(1, 3, s.hv)
    else:
        lo, hi = (1.0, 16.0) if gate == "typical" else (1e-3, 1e-2)
        a_log = np.log(rng.uniform(lo, hi, s.hv))
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), s.hv))
        dt_bias = np.log(np.expm1(dt))
    o_norm = 1 + 0.1 * rng.standard_normal(s.dv)
    conv0 = rng.standard_normal((s.kw - 1, c)) * scale
    state0 = rng.standard_normal((s.hv, s.dv, s.dk)) * state_scale
    _draws_into(rng, mixed, scale)
    _draws_into(rng, z, None)
    b = rng.standard_normal((tokens, s.hv))
    a = rng.standard_normal((tokens, s.hv))
    return conv_w, a_log, dt_bias, o_norm, b, a, conv0, state0


def token_run(
    shape: GdnShape, seeds: Sequence[int], tokens: int, *, scale: float, gate: str, state_scale: float
) -> TokenRun:
    """The condition (``scale`` of the conv inputs and conv state, ``gate`` of :data:`GATES`,
    ``state_scale`` of the initial recurrent state) for each seed, T = ``tokens``."""
    validate.one_of("gates", gate, tuple(GATES))
    mixed = np.empty((len(seeds), tokens, shape.channels), np.float32)
    z = np.empty((len(seeds), tokens, shape.vd), np.float32)
    parts = [_one(shape, int(sd), tokens, scale, gate, state_scale, mixed[i], z[i]) for i, sd in enumerate(seeds)]
    f32 = [np.stack([p[i] for p in parts]).astype(np.float32) for i in range(8)]
    conv_w, a_log, dt_bias, o_norm, b, a, conv0, state0 = f32
    w = StepWeights(conv_w, a_log, dt_bias, o_norm, eps=STEP_EPS, k_heads=shape.hk)
    return TokenRun(shape, np.asarray(seeds, dtype=np.int64), w, mixed, z, b, a, conv0, state0)
