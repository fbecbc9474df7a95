"""Fault models: the bugs a fused-tail kernel is known to have, as wrong float32 tails.

Each fault is the same float32 tail (:func:`faulty_tail`, numpy, on the case's STORED
weights, dequantized) given one wrong thing, so its error against the float64 truth is the
bug's and float32 rounding's, nothing else. Run on the same cases and input scales as the
implementation under test, they say which tolerance would catch which bug, and where:
a catch rate means something only beside the flake rate the same tolerance costs a
correct implementation.

The workbench's own mutations (``workbench.studies.sweeps.MUTATIONS``: dropped residual,
wrong eps, rotation skipped, sign flipped, norm over the wrong length) are here too, so one
table holds them all; the others are the ones kernels are known to get wrong.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workbench.check.stored import StoredCase, StoredMatrix
from workbench.fold import hadamard
from workbench.fold.rotation import FoldSite

#: fault name -> what it does (for tables and ``--help``).
FAULTS: dict[str, str] = {
    "eps_outside_root": "the norm divides by sqrt(mean x^2) + eps instead of sqrt(mean x^2 + eps)",
    "wrong_eps": "eps ten times too large (1e-5 for 1e-6: Llama's default for Qwen's)",
    "norm_wrong_length": "the mean square over the branch length instead of hidden (hidden + 1 if equal)",
    "dropped_residual": "the residual is never read (zero): both adds lose it",
    "gate_up_swapped": "silu applied to up x instead of gate x",
    "transposed_weight": "down read with the wrong stride (its [hidden, ffn] bytes as [ffn, hidden], transposed)",
    "sign_flipped": "the branch's first element negated (with a fold: one sign of D)",
    "rotation_skipped": "wo's fold rotation not applied (folded cases only)",
    "rotation_twice": "wo's fold rotation applied twice (folded cases only)",
    "group_scale_wrong": "one group's scale doubled (wo, row 0, group 0; quantized cases only)",
    "float16_accumulation": "every matrix-vector product summed in float16",
}


def applies(fault: str, sc: StoredCase) -> bool:
    """Whether ``fault`` exists for this case (a rotation needs a fold, a group scale a quantized wo)."""
    if fault in ("rotation_skipped", "rotation_twice"):
        return sc.fold is not None
    if fault == "group_scale_wrong":
        return sc.wo.quantized
    return True


def _dense(m: StoredMatrix) -> np.ndarray:
    return np.asarray(m.dense(), dtype=np.float32)


def _group_scale_doubled(m: StoredMatrix) -> np.ndarray:
    """The dequantized matrix with group 0 of row 0 at twice its scale: ``2 s q + b = 2 v - b``."""
    w = _dense(m).copy()
    g = int(m.group_size)
    bias = np.float32(0.0) if m.biases is None else np.float32(np.asarray(m.biases)[0, 0])
    w[0, :g] = 2 * w[0, :g] - bias
    return w


def _mv(w: np.ndarray, x: np.ndarray, f16: bool) -> np.ndarray:
    """``w @ x`` over the last axis, float32; or summed in float16 one product at a time.

    ``w``: [out, in], or one matrix a case [S, out, in] with ``x`` [S, n, in] (the same
    products, case by case, as the 2-D form gives each case)."""
    if not f16:
        return x @ w.T if w.ndim == 2 else np.matmul(x, np.swapaxes(w, -1, -2))
    wide = w if w.ndim == 2 else w[:, None]
    prods = x[..., None, :].astype(np.float16) * wide.astype(np.float16)
    return np.cumsum(prods, axis=-1, dtype=np.float16)[..., -1].astype(np.float32)


def _faulty(
    wo: np.ndarray,
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    ffn_norm: np.ndarray,
    eps: float,
    x: np.ndarray,
    r: np.ndarray,
    fault: str | None,
    rotate: Any,
    unrotate: Any,
) -> np.ndarray:
    """The float32 tail with ``fault`` on arrays (one case, or a block with a leading case
    axis on every array); ``rotate`` / ``unrotate``: the fold around ``wo`` (or None)."""
    h_dim, b_dim = wo.shape[-2], wo.shape[-1]
    f16 = fault == "float16_accumulation"
    if fault == "transposed_weight":  # down's [hidden, ffn] bytes read as [ffn, hidden]
        down = np.swapaxes(down.reshape(*down.shape[:-2], down.shape[-1], down.shape[-2]), -1, -2)
    if fault == "gate_up_swapped":
        gate, up = up, gate
    x = np.asarray(x, dtype=np.float32)
    r = np.asarray(r, dtype=np.float32)
    if fault == "dropped_residual":
        r = np.zeros_like(r)
    if fault == "sign_flipped":
        x = x.copy()
        x[..., 0] = -x[..., 0]
    folded = rotate is not None or unrotate is not None
    times = 0 if not folded or fault == "rotation_skipped" else 2 if fault == "rotation_twice" else 1
    for _ in range(times if rotate is not None else 0):
        x = rotate(x).astype(np.float32)
    p = _mv(wo, x, f16)
    for _ in range(times if unrotate is not None else 0):
        p = unrotate(p).astype(np.float32)
    h = r + p
    e = np.float32(eps * (10.0 if fault == "wrong_eps" else 1.0))
    n = (b_dim if b_dim != h_dim else h_dim + 1) if fault == "norm_wrong_length" else h_dim
    ms = np.sum(h * h, axis=-1, keepdims=True) / np.float32(n)
    if fault == "eps_outside_root":
        normed = h / (np.sqrt(ms) + e)
    else:
        normed = h / np.sqrt(ms + e)
    normed = normed * np.asarray(ffn_norm, dtype=np.float32)
    g = _mv(gate, normed, f16)
    with np.errstate(over="ignore"):
        act = g / (np.float32(1.0) + np.exp(-g)) * _mv(up, normed, f16)
    return (h + _mv(down, act, f16)).astype(np.float32)


def _check_fault(fault: str | None) -> None:
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"fault: must be one of {tuple(FAULTS)} or None, got {fault!r}")


def faulty_tail(sc: StoredCase, fault: str | None) -> np.ndarray:
    """The float32 tail of ``sc`` with ``fault`` (a name of :data:`FAULTS`, or ``None``: no fault).

    ``sc.branch`` / ``sc.residual`` may carry leading axes (the input scales of one case).
    """
    _check_fault(fault)
    wo = _group_scale_doubled(sc.wo) if fault == "group_scale_wrong" else _dense(sc.wo)
    fold = sc.fold
    rotate = fold.rotate if fold is not None and fold.site is FoldSite.INPUT else None
    unrotate = fold.unrotate if fold is not None and fold.site is FoldSite.OUTPUT else None
    return _faulty(
        wo,
        _dense(sc.gate),
        _dense(sc.up),
        _dense(sc.down),
        sc.ffn_norm,
        sc.eps,
        sc.branch,
        sc.residual,
        fault,
        rotate,
        unrotate,
    )


def faulty_block(
    wo: np.ndarray,
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    ffn_norm: np.ndarray,
    eps: float,
    branch: np.ndarray,
    residual: np.ndarray,
    fault: str | None,
    *,
    fold_block: int | None = None,
    signs: np.ndarray | None = None,
    group_size: int | None = None,
    wo_bias: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`faulty_tail` for a block of cases at once: dense float32 weights [S, out, in],
    ``ffn_norm`` [S, hidden], ``branch`` [S, n, branch], ``residual`` [S, n, hidden]; a fold
    on ``wo``'s input of ``fold_block`` with each case's ``signs`` [S, branch]; for
    ``group_scale_wrong`` the quantization's ``group_size`` and each case's bias of row 0,
    group 0 (``wo_bias`` [S], or None for a format without biases). Each case gets the bits
    :func:`faulty_tail` gives it alone (``tests/test_check_blocks.py``)."""
    _check_fault(fault)
    if fault == "group_scale_wrong":
        if group_size is None:
            raise ValueError("group_size: group_scale_wrong needs the quantization's group size (quantized wo only)")
        wo = wo.copy()
        bias = np.zeros(len(wo), np.float32) if wo_bias is None else np.asarray(wo_bias, np.float32)
        wo[:, 0, :group_size] = 2 * wo[:, 0, :group_size] - bias[:, None]
    rotate = None
    if fold_block is not None:
        d = np.asarray(signs, dtype=np.float32)[:, None, :]

        def rotate(v: np.ndarray) -> np.ndarray:  # R x = B (D x), each case its own D
            return hadamard.block_transform(v * d.astype(v.dtype), int(fold_block))

    return _faulty(
        wo, gate, up, down, np.asarray(ffn_norm, np.float32)[:, None, :], eps, branch, residual, fault, rotate, None
    )
