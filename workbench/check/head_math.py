"""The attention head in numpy, a block of cases at once: the float64 truth, and the float32
head given one known bug (the fault models).

One function (:func:`head_block`) so the truth and every fault are the same arithmetic but
for the one thing a fault changes: a fault's error against the truth is the bug's and
float32 rounding's, nothing else. In float64 with no fault it is the head's oracle
(:func:`head_exact` for one case); the formulas are :mod:`workbench.check.head_spec`'s. The
faults are the ones head kernels are known to get wrong: a fold applied to one projection's
input only or not at all (frink-models' launch must rotate the ONE input of all three), eps
added outside the root (as mlx-lm's GDN L2 norm once did), RoPE's pairing or sign or
position or width wrong (llama.cpp's ``rope_type`` NEOX vs NORM split is pairing; a cache
offset read after its update is the position), QK-norm left out, and the output gate read
from the wrong half of q_proj's rows (a split over the whole output instead of per head).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.check.head_spec import HeadSpec

#: fault name -> (what it does, the shapes it applies to).
HEAD_FAULTS: dict[str, str] = {
    "fold_q_only": "the shared fold's rotation applied to Q's input only: K and V read the unrotated normed vector",
    "fold_skipped": "the shared fold's rotation never applied: Q, K and V read the unrotated normed vector",
    "bias_dropped": "the Q/K/V biases never added",
    "eps_outside_root": "every RMS norm divides by sqrt(mean x^2) + eps instead of sqrt(mean x^2 + eps)",
    "qk_norm_dropped": "q and k not RMS-normed per head",
    "gate_halves_swapped": "each head's 2 head_dim rows of q_proj read gate first, query second",
    "gate_split_whole": "q_proj's output split in two over the whole vector, not per head",
    "rope_halves_swapped": "RoPE's halves swapped in the rotation (x1 cos + x2 sin, x2 cos - x1 sin): the angle's sign",
    "rope_interleaved": "RoPE pairs (2i, 2i+1) rotated where the model pairs i with i + rotary_dim/2",
    "rope_position_plus_one": "RoPE at position + 1 (the cache's offset read after its update)",
    "rope_full_width": "all head_dim dims rotated, the partial rotary fraction ignored",
}

#: Which faults a spec can show: those that change nothing in it are not run (a fold fault
#: needs a fold, a gate fault a gate, ...).
NEEDS: dict[str, str] = {
    "fold_q_only": "fold_block",
    "fold_skipped": "fold_block",
    "bias_dropped": "bias",
    "qk_norm_dropped": "qk_norm",
    "gate_halves_swapped": "gate",
    "gate_split_whole": "gate",
    "rope_halves_swapped": "rotary_dim",
    "rope_interleaved": "rotary_dim",
    "rope_position_plus_one": "rotary_dim",
    "rope_full_width": "partial",
}


def applies(fault: str, spec: HeadSpec) -> bool:
    """Whether ``fault`` changes ``spec``'s arithmetic at all."""
    need = NEEDS.get(fault)
    if need is None:
        return True
    if need == "partial":
        return 0 < spec.rotary_dim < spec.head_dim
    return bool(getattr(spec, need))


@dataclass(frozen=True)
class HeadWeights:
    """A head's constants, one set a case (leading axis S): ``attn_norm`` [S, hidden],
    ``q_w`` [S, q_rows, hidden], ``k_w`` and ``v_w`` [S, kv_rows, hidden] (as STORED: folded
    when the spec folds, ``W R^T``), ``q_b`` [S, q_rows], ``k_b``, ``v_b`` [S, kv_rows] (None
    without biases), ``q_norm`` and ``k_norm`` [S, head_dim] (None without QK-norm),
    ``rotations`` the fold of each case (``HadamardFold``; empty when unfolded)."""

    attn_norm: np.ndarray
    q_w: np.ndarray
    k_w: np.ndarray
    v_w: np.ndarray
    q_b: np.ndarray | None
    k_b: np.ndarray | None
    v_b: np.ndarray | None
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    rotations: tuple = ()

    ARRAYS = ("attn_norm", "q_w", "k_w", "v_w", "q_b", "k_b", "v_b", "q_norm", "k_norm")

    def astype(self, dtype: Any) -> HeadWeights:
        conv = {k: None if getattr(self, k) is None else np.asarray(getattr(self, k), dtype) for k in self.ARRAYS}
        return HeadWeights(**conv, rotations=self.rotations)

    def case(self, i: int) -> dict[str, Any]:
        """Case ``i``'s arrays by name (None where the spec has none), and its ``fold``."""
        out = {k: None if getattr(self, k) is None else getattr(self, k)[i] for k in self.ARRAYS}
        out["fold"] = self.rotations[i] if self.rotations else None
        return out


def rms(x: np.ndarray, w: np.ndarray, eps: float, outside: bool) -> np.ndarray:
    """``x / sqrt(mean x^2 + eps) * w`` over the last axis (``outside``: ``/ (sqrt(mean x^2) + eps)``)."""
    dt = x.dtype.type
    ms = (x * x).mean(-1, keepdims=True)
    d = np.sqrt(ms) + dt(eps) if outside else np.sqrt(ms + dt(eps))
    return x / d * w


def rope(x: np.ndarray, positions: np.ndarray, dims: int, theta: float, fault: str | None) -> np.ndarray:
    """``x`` [S, heads, head_dim] with its first ``dims`` dims rotated at ``positions`` [S],
    halves paired (frequency ``theta ** (-2 i / dims)``), in x's dtype (angles too), or as
    ``fault`` has it."""
    dt = x.dtype.type
    if fault == "rope_full_width":
        dims = x.shape[-1]
    if fault == "rope_position_plus_one":
        positions = positions + 1
    half = dims // 2
    inv = (dt(theta) ** (-(np.arange(half, dtype=x.dtype) * dt(2)) / dt(dims))).astype(x.dtype)
    ang = positions.astype(x.dtype)[:, None, None] * inv
    c, s = np.cos(ang), np.sin(ang)
    out = x.copy()
    if fault == "rope_interleaved":
        x1, x2 = x[..., 0:dims:2], x[..., 1:dims:2]
        out[..., 0:dims:2], out[..., 1:dims:2] = x1 * c - x2 * s, x2 * c + x1 * s
        return out
    x1, x2 = x[..., :half], x[..., half:dims]
    if fault == "rope_halves_swapped":
        out[..., :half], out[..., half:dims] = x1 * c + x2 * s, x2 * c - x1 * s
    else:
        out[..., :half], out[..., half:dims] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


def head_block(
    spec: HeadSpec,
    w: HeadWeights,
    hidden: np.ndarray,
    positions: np.ndarray,
    *,
    fault: str | None = None,
) -> dict[str, np.ndarray]:
    """The head for S cases: ``hidden`` [S, hidden] at ``positions`` [S] (ints) -> name ->
    [S, width] for each of ``spec.outputs``, in ``w``'s dtype (float64: the truth; float32:
    a fault model). ``fault``: a name of :data:`HEAD_FAULTS` or None."""
    if fault is not None and fault not in HEAD_FAULTS:
        raise ValueError(f"fault: must be one of {tuple(HEAD_FAULTS)} or None, got {fault!r}")
    dt = w.q_w.dtype
    outside = fault == "eps_outside_root"
    n = rms(hidden.astype(dt, copy=False), w.attn_norm, spec.eps, outside)
    if w.rotations:
        rotated = np.stack([f.rotate(n[i]) for i, f in enumerate(w.rotations)]).astype(dt, copy=False)
    else:
        rotated = n
    n_q = n if fault == "fold_skipped" else rotated
    n_kv = n if fault in ("fold_skipped", "fold_q_only") else rotated
    q = np.einsum("soh,sh->so", w.q_w, n_q)
    k = np.einsum("soh,sh->so", w.k_w, n_kv)
    v = np.einsum("soh,sh->so", w.v_w, n_kv)
    if spec.bias and fault != "bias_dropped":
        q, k, v = q + w.q_b, k + w.k_b, v + w.v_b
    s, d = len(q), spec.head_dim
    gate = None
    if spec.gate:
        if fault == "gate_split_whole":
            q, gate = q[:, : spec.q_heads * d], q[:, spec.q_heads * d :]
        else:
            qg = q.reshape(s, spec.q_heads, 2 * d)
            first, second = (1, 0) if fault == "gate_halves_swapped" else (0, 1)
            q, gate = qg[..., first * d : (first + 1) * d], qg[..., second * d : (second + 1) * d]
            gate = gate.reshape(s, -1)
    qh, kh = q.reshape(s, spec.q_heads, d), k.reshape(s, spec.kv_heads, d)
    if spec.qk_norm and fault != "qk_norm_dropped":
        qh = rms(qh, w.q_norm[:, None, :], spec.eps, outside)
        kh = rms(kh, w.k_norm[:, None, :], spec.eps, outside)
    if spec.rotary_dim:
        pos = np.asarray(positions, dtype=np.int64)
        rf = fault if fault and fault.startswith("rope_") else None
        qh = rope(qh, pos, spec.rotary_dim, spec.rope_theta, rf)
        kh = rope(kh, pos, spec.rotary_dim, spec.rope_theta, rf)
    out = {"q": qh.reshape(s, -1), "k": kh.reshape(s, -1), "v": v}
    if gate is not None:
        out["gate"] = np.ascontiguousarray(gate)
    return {k: np.asarray(v, dtype=dt) for k, v in out.items()}


def head_exact(spec: HeadSpec, case: Mapping[str, Any], hidden: Any, position: int = 0) -> dict[str, np.ndarray]:
    """The float64 head of ONE case: ``case`` the arrays of :meth:`HeadWeights.case` (with its
    ``fold``), ``hidden`` [hidden], ``position`` (the token's, for RoPE) -> name -> [width]
    float64. Every input is read as stored and widened, so this is the truth of those values."""
    one = {k: None if case.get(k) is None else np.asarray(case[k], np.float64)[None] for k in HeadWeights.ARRAYS}
    fold = case.get("fold")
    w = HeadWeights(**one, rotations=() if fold is None else (fold,))
    h = np.asarray(hidden, np.float64).reshape(1, -1)
    return {k: v[0] for k, v in head_block(spec, w, h, np.array([int(position)])).items()}
