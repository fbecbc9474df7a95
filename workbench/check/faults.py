"""Fault models: the bugs a fused-tail kernel is known to have, as wrong float32 tails.

Each fault is the same float32 tail (:func:`faulty_tail`, numpy, on the case's STORED
weights, dequantized) given one wrong thing, so its error against the float64 truth is the
bug's and float32 rounding's, nothing else. Run on the same cases and input scales as the
implementation under test, they say which tolerance would catch which bug, and where:
a catch rate means something only beside the flake rate the same tolerance costs a
correct implementation.

The faults are the tail's one vocabulary (``workbench.tail.faults``: the sweeps and the
three-way comparison name and apply them from the same registry); this module is the engine
that runs them in numpy float32, every switch of a ``TailVariant`` honoured.
:data:`FAULTS` is the check's selection: all but ``bf16_normed`` (the three-way's, which a
kernel storing float32 activations cannot have).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from workbench.check.gdn_faults import bfloat16_round
from workbench.check.half_sums import half_sums
from workbench.check.stored import StoredCase, StoredMatrix
from workbench.fold import hadamard
from workbench.fold.rotation import FoldSite
from workbench.tail.faults import TAIL_FAULTS, TailVariant, apply_fault, fault_docs

#: fault name -> what it does (for tables and ``--help``): the check's selection of the registry.
FAULTS: dict[str, str] = fault_docs(n for n in TAIL_FAULTS if n != "bf16_normed")


def applies(fault: str, sc: StoredCase) -> bool:
    """Whether ``fault`` exists for this case (a rotation needs a fold, a group scale a quantized wo)."""
    needs = TAIL_FAULTS[fault].needs
    if needs == "fold":
        return sc.fold is not None
    if needs == "quantized wo":
        return sc.wo.quantized
    return True


def _dense(m: StoredMatrix) -> np.ndarray:
    return np.asarray(m.dense(), dtype=np.float32)


def _mv(w: np.ndarray, x: np.ndarray, f16: bool) -> np.ndarray:
    """``w @ x`` over the last axis, float32; or summed in float16 one product at a time.

    ``w``: [out, in], or one matrix a case [S, out, in] with ``x`` [S, n, in] (the same
    products, case by case, as the 2-D form gives each case)."""
    if not f16:
        return x @ w.T if w.ndim == 2 else np.matmul(x, np.swapaxes(w, -1, -2))
    # float16 sums (workbench.check.half_sums): one matrix, or one a case
    if w.ndim == 2:
        return half_sums(w, x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], w.shape[0])
    x = np.broadcast_to(x, (w.shape[0], *x.shape[-2:])) if x.ndim < 3 else x
    return np.stack([_mv(w[i], x[i], True) for i in range(len(w))])


def _run_variant(v: TailVariant, rotate: Any, unrotate: Any) -> np.ndarray:
    """The float32 tail of a variant (one case, or a block with a leading case axis on every
    array); ``rotate`` / ``unrotate``: the fold around ``wo`` (or None), applied
    ``v.rotations`` times."""
    h_dim = v.wo.shape[-2]
    f16 = v.accumulate == "float16"
    x = np.asarray(v.branch, dtype=np.float32)
    r = np.asarray(v.residual, dtype=np.float32)
    for _ in range(v.rotations if rotate is not None else 0):
        x = rotate(x).astype(np.float32)
    p = _mv(v.wo, x, f16)
    for _ in range(v.rotations if unrotate is not None else 0):
        p = unrotate(p).astype(np.float32)
    h = r + p
    e = np.float32(v.eps)
    ms = np.sum(h * h, axis=-1, keepdims=True) / np.float32(v.norm_length or h_dim)
    normed = h / (np.sqrt(ms) + e) if v.eps_outside_root else h / np.sqrt(ms + e)
    normed = normed * np.asarray(v.ffn_norm, dtype=np.float32)
    if v.normed_dtype is not None:  # the registry's one rounding: bfloat16
        normed = bfloat16_round(normed)
    g = _mv(v.gate, normed, f16)
    with np.errstate(over="ignore"):
        act = g / (np.float32(1.0) + np.exp(-g)) * _mv(v.up, normed, f16)
    return (h + _mv(v.down, act, f16)).astype(np.float32)


def _faulty(v: TailVariant, fault: str | None, rotate: Any, unrotate: Any) -> np.ndarray:
    """``v`` (activations made float32 first, so a fault writes a copy of float32) with ``fault``, run."""
    v = dataclasses.replace(v, branch=np.asarray(v.branch, np.float32), residual=np.asarray(v.residual, np.float32))
    return _run_variant(apply_fault(fault, v), rotate, unrotate)


def _check_fault(fault: str | None) -> None:
    if fault is not None and fault not in TAIL_FAULTS:
        raise ValueError(f"fault: must be one of {tuple(TAIL_FAULTS)} or None, got {fault!r}")


def faulty_tail(sc: StoredCase, fault: str | None) -> np.ndarray:
    """The float32 tail of ``sc`` with ``fault`` (a name of :data:`FAULTS`, or ``None``: no fault).

    ``sc.branch`` / ``sc.residual`` may carry leading axes (the input scales of one case).
    """
    _check_fault(fault)
    fold = sc.fold
    rotate = fold.rotate if fold is not None and fold.site is FoldSite.INPUT else None
    unrotate = fold.unrotate if fold is not None and fold.site is FoldSite.OUTPUT else None
    group = None
    if sc.wo.quantized:
        group = (int(sc.wo.group_size), 0.0 if sc.wo.biases is None else float(np.asarray(sc.wo.biases)[0, 0]))
    v = TailVariant(
        _dense(sc.wo),
        _dense(sc.gate),
        _dense(sc.up),
        _dense(sc.down),
        sc.ffn_norm,
        sc.eps,
        sc.branch,
        sc.residual,
        wo_group=group,
    )
    return _faulty(v, fault, rotate, unrotate)


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
    group = None
    if group_size is not None:
        bias = np.zeros(len(wo), np.float32) if wo_bias is None else np.asarray(wo_bias, np.float32)
        group = (int(group_size), bias)
    elif fault == "group_scale_wrong":
        raise ValueError("group_size: group_scale_wrong needs the quantization's group size (quantized wo only)")
    rotate = None
    if fold_block is not None:
        d = np.asarray(signs, dtype=np.float32)[:, None, :]

        def rotate(v: np.ndarray) -> np.ndarray:  # R x = B (D x), each case its own D
            return hadamard.block_transform(v * d.astype(v.dtype), int(fold_block))

    v = TailVariant(
        wo, gate, up, down, np.asarray(ffn_norm, np.float32)[:, None, :], eps, branch, residual, wo_group=group
    )
    return _faulty(v, fault, rotate, None)
