"""The test case of frink-models' fused attention tail, bit for bit, and its criterion.

frink-models 0.48.0 (a Rust decoder engine for Apple GPUs) checks its fused attention tail
with one test, ``the_fused_attention_tail_matches_the_host_tail``: a tail of hidden 64,
branch 96 and FFN 80 whose inputs come from a 32-bit linear congruential generator (LCG),
``wo`` folded with a block-16 Hadamard rotation and drawn signs, the fused Metal result
held to the host's within ``|x - y| <= 2e-4 * max(|y|, 1)`` per element. This module
rebuilds that case exactly (every value is the test's own float32 value), so the
workbench's tails can be checked on the very numbers the engine was; "the seed" in
names here means that test and the engine change it checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench import validate
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.tail.weights import TailWeights

#: The test's tolerance: ``|x - y| <= 2e-4 * max(|y|, 1)`` per element, float32 device
#: against float32 host.
SEED_TOL = 2e-4

#: The test's shape (hidden, branch, ffn) and norm epsilon.
SEED_SHAPE = (64, 96, 80)
SEED_EPS = 1e-6
#: The test's LCG start value (u32).
SEED_LCG_START = 6_180_339


#: The most values :func:`lcg_stream` draws in one call: it is a Python loop (about a
#: million values a second), sized for test cases; ten million is ten seconds.
MAX_LCG_VALUES = 10_000_000


def lcg_stream(n: int, scale: float, state: int) -> tuple[np.ndarray, int]:
    """``n`` values of the test's u32 LCG, and the state after them.

    ``state = state * 1664525 + 1013904223 (mod 2^32)``, then the value is
    ``((state >> 9) / 2^23 - 0.5) * scale`` computed in float32, exactly as frink-models' test
    computes it (every step is exact in float32 for power-of-two scales, so the values
    are bit-for-bit the Rust ones). Sequential on purpose: it is the order that matters.
    """
    n = validate.integer("n", n, minimum=0, maximum=MAX_LCG_VALUES)
    scale = validate.number("scale", scale)
    s = validate.integer("state", state, minimum=0, maximum=0xFFFFFFFF)  # a u32, as in the Rust test
    out = np.empty(n, dtype=np.uint32)
    for i in range(n):
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        out[i] = s >> 9
    vals = (out.astype(np.float32) / np.float32(1 << 23) - np.float32(0.5)) * np.float32(scale)
    return vals.astype(np.float32), s


@dataclass(frozen=True)
class SeedArrays:
    """The test's raw inputs, float32, in the shapes frink-models' test builds."""

    wo: np.ndarray  # [hidden, branch], BEFORE the fold (the test folds it afterwards)
    gate: np.ndarray  # [ffn, hidden]
    up: np.ndarray  # [ffn, hidden]
    down: np.ndarray  # [hidden, ffn]
    ffn_norm: np.ndarray  # [hidden], 1 + rnd(0.5)
    branch: np.ndarray  # [branch]
    residual: np.ndarray  # [hidden]
    signs: np.ndarray  # [branch], +1/-1
    eps: float


def seed_arrays() -> SeedArrays:
    """The test's inputs in its draw order: wo, gate, up, down, ffn_norm, branch, residual, signs."""
    hidden, branch_dim, ffn_dim = SEED_SHAPE
    state = SEED_LCG_START

    def rnd(n: int, scale: float) -> np.ndarray:
        nonlocal state
        v, state = lcg_stream(n, scale, state)
        return v

    wo = rnd(hidden * branch_dim, 1.0).reshape(hidden, branch_dim)
    gate = rnd(ffn_dim * hidden, 1.0).reshape(ffn_dim, hidden)
    up = rnd(ffn_dim * hidden, 1.0).reshape(ffn_dim, hidden)
    down = rnd(hidden * ffn_dim, 1.0).reshape(hidden, ffn_dim)
    ffn_norm = (np.float32(1.0) + rnd(hidden, 0.5)).astype(np.float32)  # f32 add, as in Rust
    branch = rnd(branch_dim, 1.0)
    residual = rnd(hidden, 1.0)
    signs = np.where(rnd(branch_dim, 2.0) < 0, np.float32(-1.0), np.float32(1.0)).astype(np.float32)
    return SeedArrays(wo, gate, up, down, ffn_norm, branch, residual, signs, SEED_EPS)


@dataclass(frozen=True)
class SeedCase:
    """The test's case: its weights (wo folded with block 16 and its signs), branch, residual."""

    weights: TailWeights
    branch: np.ndarray
    residual: np.ndarray
    tol: float = SEED_TOL


def seed_case() -> SeedCase:
    """The test's inputs exactly, bit for bit frink-models' test's (as float32).

    ``wo`` is folded with block 16, the drawn signs, no permutation, site INPUT, as the
    test folds it (``wo.fold_hadamard(fold)``: the stored base becomes ``W R^T``,
    the map stays ``W``).
    """
    a = seed_arrays()
    fold = HadamardFold(16, a.signs, None, FoldSite.INPUT)
    w = TailWeights.from_arrays(a.wo, a.ffn_norm, a.gate, a.up, a.down, eps=a.eps, fold=fold)
    return SeedCase(w, a.branch, a.residual)
