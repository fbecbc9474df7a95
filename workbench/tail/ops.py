"""The tail's math, once in numpy and once in MLX: the same five ops.

    out = residual + ffn(rms_norm(residual + wo(branch)))      ffn(x) = down(silu(gate x) * up x)

:func:`tail_np` (numpy, any float dtype: float64 is the oracle) and :func:`tail_mx` (an MLX
graph, float32 activations and accumulation) are pure functions of arrays, so the sweeps
can vectorise them (a leading batch axis on the activations AND on the weights).

Precision: weights may be bf16 / f16 / quantized, but activations and accumulation are
float32 on the MLX paths: a graph that cast the normed vector to bf16 was 1.5e-2 off the
float64 truth, seventy-five times frink-models' tolerance of 2e-4.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.fold.weights import WeightMatrix

# ---------------------------------------------------------------------------------------
# The math: one numpy function, one MLX function
# ---------------------------------------------------------------------------------------


def _mv_np(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``w @ x`` along the last axis, in x's dtype; ``w`` [out, in] or batched [..., out, in].

    A weight of another dtype is cast to x's for this one product (a float64 host copy
    read by a float32 tail): the same values and the same product as a float32 copy held
    beside it, without holding one (1.2 GB at Bonsai-27B's shape)."""
    if w.dtype != x.dtype:
        w = w.astype(x.dtype)
    if w.ndim == 2:
        return x @ w.T
    return (w @ x[..., None])[..., 0]


def rms_norm_np(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``x * rsqrt(mean(x^2) + eps) * weight`` along the last axis (frink_core::rms_norm)."""
    dt = x.dtype
    if dt.char == "e":  # float16: np.mean sums it in float32; keep its bits
        mean = np.mean(x * x, axis=-1, keepdims=True)
    else:
        # np.mean's own arithmetic (a sum, then a division by the count) without its Python
        # wrapper, which costs more than the sum at the test shape: the same bits.
        mean = np.add.reduce(x * x, axis=-1, keepdims=True) / x.shape[-1]
    return x * (1.0 / np.sqrt(mean + dt.type(eps))) * weight


def silu_np(x: np.ndarray) -> np.ndarray:
    """``x * sigmoid(x)``; exp overflow for very negative x gives the right limit, -0."""
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def tail_np(
    wo: np.ndarray,
    fold: HadamardFold | None,
    ffn_norm: np.ndarray,
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    eps: float,
    branch: np.ndarray,
    residual: np.ndarray,
    *,
    ffn_folds: tuple[HadamardFold | None, HadamardFold | None, HadamardFold | None] | None = None,
) -> np.ndarray:
    """The five ops in numpy, in the dtype of the arrays given (float64: the truth).

    ``wo`` is the STORED base (``W R^T`` / ``R W`` when folded) and ``fold`` its rotation,
    applied as the host applies it (INPUT: rotate the branch first; OUTPUT: unrotate wo's
    output). Every weight may carry leading batch axes equal to the activations' (one
    weight set per row: ``wo`` [S, hidden, branch], ``ffn_norm`` [S, hidden], branch
    [S, branch]), so a sweep over seeds is one call; 2-D weights serve any batch.

    ``ffn_folds``: the rotations ``(gate, up, down)`` carry, each applied as wo's is (a
    Hadamard pack rotates the input of every packed linear: gate and up read the normed
    hidden rotated, down the activation rotated, each with its own signs); None: none.
    """
    if ffn_folds is not None:
        fg, fu, fd = ffn_folds
        mv_gate, mv_up, mv_down = (_folded_mv_np(w_, f) for w_, f in ((gate, fg), (up, fu), (down, fd)))
        h = residual + _folded_mv_np(wo, fold)(branch)
        normed = rms_norm_np(h, ffn_norm, eps)
        return h + mv_down(silu_np(mv_gate(normed)) * mv_up(normed))
    x = fold.rotate(branch) if fold is not None and fold.site is FoldSite.INPUT else branch
    projected = _mv_np(wo, x)
    if fold is not None and fold.site is FoldSite.OUTPUT:
        projected = fold.unrotate(projected)
    h = residual + projected  # op 2: the first residual add
    normed = rms_norm_np(h, ffn_norm, eps)  # op 3
    ffn = _mv_np(down, silu_np(_mv_np(gate, normed)) * _mv_np(up, normed))  # op 4: SwiGLU
    return h + ffn  # op 5: the second residual add


def _folded_mv_np(w: np.ndarray, fold: HadamardFold | None) -> Any:
    """``x -> W x`` with ``fold`` around the stored ``w`` (INPUT: rotate x first; OUTPUT: unrotate the product)."""

    def mv(x: np.ndarray) -> np.ndarray:
        if fold is not None and fold.site is FoldSite.INPUT:
            x = fold.rotate(x)
        y = _mv_np(w, x)
        return fold.unrotate(y) if fold is not None and fold.site is FoldSite.OUTPUT else y

    return mv


def _mv_mx(w: Any, x: mx.array) -> mx.array:
    """``w @ x`` along the last axis in MLX, accumulating in float32.

    ``w``: a ``WeightMatrix`` (its stored base, with its own fold applied around it, as a
    Hadamard pack's gate, up and down carry one; quantized bases go through
    ``mx.quantized_matmul``) or a dense ``mx.array`` [out, in] / [..., out, in]. ``wo``'s fold
    is the tail's ``fold`` argument, and its matrix comes without one.
    """
    if isinstance(w, WeightMatrix):
        return w.apply(x)
    w = w.astype(mx.float32)
    if w.ndim == 2:
        return x @ w.T
    # Batched weights: each row as a 1 x in matrix times w's transpose. MLX's CPU runs this
    # layout 4-6x faster than (w @ x[..., None])[..., 0], with the same bits (a sweep's rows
    # are held to the per-case tails in tests/test_sweeps.py).
    return (x[..., None, :] @ mx.swapaxes(w, -1, -2))[..., 0, :]


def _rotate_mx(fold: HadamardFold, x: mx.array, inverse: bool) -> mx.array:
    return fold.unrotate(x) if inverse else fold.rotate(x)


def tail_mx(
    wo: Any,
    fold: HadamardFold | None,
    ffn_norm: mx.array,
    gate: Any,
    up: Any,
    down: Any,
    eps: float,
    branch: mx.array,
    residual: mx.array,
    *,
    normed_dtype: Any = None,
) -> mx.array:
    """The five ops as ONE lazy MLX graph, float32 activations; nothing is evaluated here.

    Same arguments as :func:`tail_np`, with MLX arrays; the matrices may also be
    ``WeightMatrix`` objects (their stored bases are used, so a quantized base stays
    quantized). Rotations go through ``mx.hadamard_transform`` (``HadamardFold``).

    ``normed_dtype``: round the normed vector to this MLX dtype before the FFN (e.g.
    ``mx.bfloat16``), to study what low-precision activations cost; ``None`` (the
    fused tail's choice) keeps float32.
    """
    x = branch.astype(mx.float32)
    r = residual.astype(mx.float32)
    if fold is not None and fold.site is FoldSite.INPUT:
        x = _rotate_mx(fold, x, inverse=False)
    projected = _mv_mx(wo, x)
    if fold is not None and fold.site is FoldSite.OUTPUT:
        projected = _rotate_mx(fold, projected, inverse=True)
    h = r + projected
    norm_w = ffn_norm.astype(mx.float32)
    # Written out rather than mx.fast.rms_norm, so it is visibly the same formula as
    # rms_norm_np (and batched weights broadcast); MLX reduces in float32 either way.
    normed = h * mx.rsqrt(mx.mean(h * h, axis=-1, keepdims=True) + eps) * norm_w
    if normed_dtype is not None:
        normed = normed.astype(normed_dtype).astype(mx.float32)
    g = _mv_mx(gate, normed)
    ffn = _mv_mx(down, (g * mx.sigmoid(g)) * _mv_mx(up, normed))
    return h + ffn
