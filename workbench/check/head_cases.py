"""Seeded cases of an attention head, and one case as an implementation is handed it.

A head's bugs hide at one input: they show along axes. The input scale (every RMS norm's eps
shows when the hidden state is small: ``mean x^2`` near eps), the position (RoPE is the
identity at position 0, so a wrong rotation shows only past it, and a wrong frequency only
far from it), and the spec's own fields (a fold, a gate, QK-norm, a partial rotary
fraction: :mod:`workbench.check.head_spec`). :func:`draw_head_cases` draws a block of seeds'
weights and hidden states, each seed's draws its own (the same seed gives the same case
whatever else is in the block).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.check.head_math import HeadWeights
from workbench.check.head_spec import HeadSpec

#: The positions a check runs by default: 0 (RoPE the identity), 1, and two far ones (a
#: wrong frequency grows with the position; 4095 is where float32's angle keeps 3 digits
#: of a turn at rope_theta's highest frequency).
DEFAULT_POSITIONS: tuple[int, ...] = (0, 1, 100, 4095)

#: The hidden state's scales swept by default: the RMS norm's eps (1e-6) shows at 1e-3
#: (``mean x^2`` = 1e-6), not at 1.
HEAD_SCALES: tuple[float, ...] = (1e-3, 1.0)


@dataclass(frozen=True)
class HeadInputs:
    """One case of a head, as an implementation is handed it (arrays of the form's kind):
    ``hidden`` [hidden] (before the norm), ``attn_norm`` [hidden], the STORED ``q_w``
    [q_rows, hidden] (a gate's rows after each head's query rows), ``k_w``, ``v_w``
    [kv_rows, hidden], ``q_b``, ``k_b``, ``v_b`` (None without biases), ``q_norm``,
    ``k_norm`` [head_dim] (None without QK-norm), ``fold`` (the ``HadamardFold`` the
    projections share: rotate the normed vector with ``fold.rotate``; None unfolded),
    ``position``, ``spec`` (the :class:`~workbench.check.head_spec.HeadSpec`: widths, eps,
    rotary_dim, rope_theta), ``case`` (where it is in the check)."""

    hidden: Any
    attn_norm: Any
    q_w: Any
    k_w: Any
    v_w: Any
    q_b: Any
    k_b: Any
    v_b: Any
    q_norm: Any
    k_norm: Any
    fold: Any
    position: int
    spec: HeadSpec
    case: str = ""


@dataclass(frozen=True)
class HeadCases:
    """A block of S cases of one spec: float32 ``weights`` (a set a case), ``hidden`` [S, hidden]."""

    spec: HeadSpec
    seeds: np.ndarray
    weights: HeadWeights
    hidden: np.ndarray

    def inputs(self, i: int, position: int, label: str = "") -> HeadInputs:
        """Case ``i`` at ``position`` (numpy float32 arrays)."""
        c = self.weights.case(i)
        return HeadInputs(
            self.hidden[i], *(c[k] for k in HeadWeights.ARRAYS), c["fold"], int(position), self.spec, label
        )


def _one(spec: HeadSpec, seed: int, scale: float) -> tuple[list[np.ndarray | None], np.ndarray, Any]:
    rng = np.random.default_rng([int(seed), 55])
    h, d = spec.hidden, spec.head_dim
    attn_norm = 1 + 0.1 * rng.standard_normal(h)
    ws = [rng.standard_normal((rows, h)) / np.sqrt(h) for rows in (spec.q_rows, spec.kv_rows, spec.kv_rows)]
    bs = [0.5 * rng.standard_normal(rows) for rows in (spec.q_rows, spec.kv_rows, spec.kv_rows)]
    norms = [1 + 0.1 * rng.standard_normal(d) for _ in range(2)]
    hidden = rng.standard_normal(h) * scale
    fold = None
    if spec.fold_block:
        from workbench.fold.rotation import HadamardFold

        fold = HadamardFold.random(h, spec.fold_block, seed=int(rng.integers(1 << 62)), permute=True)
        r = fold.matrix(h)
        ws = [w @ r.T for w in ws]  # stored W R^T: W' (R n) = W n
    arrays = [
        attn_norm,
        *ws,
        *(bs if spec.bias else [None] * 3),
        *(norms if spec.qk_norm else [None] * 2),
    ]
    return arrays, hidden, fold


def draw_head_cases(spec: HeadSpec, seeds: Sequence[int], *, scale: float) -> HeadCases:
    """Each seed's case of ``spec`` with its hidden state at ``scale``: weights ~ N(0, 1/hidden),
    biases ~ N(0, 1/4), norm weights ~ 1 + N(0, 1/100), stored float32 (folded first)."""
    if not isinstance(spec, HeadSpec):
        raise ValueError(f"spec: must be a HeadSpec, got {type(spec).__name__}")
    parts = [_one(spec, int(s), scale) for s in seeds]
    arrays = []
    for j in range(len(HeadWeights.ARRAYS)):
        col = [p[0][j] for p in parts]
        arrays.append(None if col[0] is None else np.stack(col).astype(np.float32))
    folds = tuple(p[2] for p in parts) if spec.fold_block else ()
    w = HeadWeights(*arrays, rotations=folds)
    hidden = np.stack([p[1] for p in parts]).astype(np.float32)
    return HeadCases(spec, np.asarray(seeds, dtype=np.int64), w, hidden)
