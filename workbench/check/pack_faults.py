"""Fault models of a Hadamard pack's tail: every packed linear rotates its own input.

In a PrismML pack (``mlx_lm/models/prism_hadamard_qwen35.py``) wo, gate, up and down each
store ``W R^T`` with their own block and signs, so a kernel must rotate each input with that
matrix's rotation: wo's the branch, gate's and up's the normed hidden, down's the activation.
Each fault is the float32 tail on the case's stored weights with ONE of those wrong (a
rotation skipped on one linear, or applied with another's signs), or the float16 scales and
biases read as bfloat16 (a kernel written for mlx-lm's bf16 4-bit packs). Their errors
against the float64 truth say which tolerance catches which bug, beside the flakes it costs.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from workbench.check.stored import StoredCase, StoredMatrix
from workbench.fold.affine_codes import dequantize_float64
from workbench.fold.rotation import FoldSite, HadamardFold

#: The tail's matrices, in the order their products run.
LINEARS: tuple[str, ...] = ("wo", "gate", "up", "down")

#: fault name -> what it does.
PACK_FAULTS: dict[str, str] = {
    **{f"rotation_skipped_{m}": f"{m}'s input rotation not applied (its codes read unrotated input)" for m in LINEARS},
    "gate_with_up_signs": "gate's input rotated with up's signs (the same width, another module's vector)",
    "up_with_gate_signs": "up's input rotated with gate's signs",
    "down_with_gate_block": "down's input rotated in gate's block size, with down's own signs",
    "scales_bfloat16": "every matrix's float16 scales and biases read as bfloat16 (rounded to 8 significant bits)",
    "scales_bits_as_bfloat16": "every matrix's float16 scale and bias bits taken for bfloat16 bits (a bf16 template)",
}


def _fold(sc: StoredCase, name: str) -> HadamardFold | None:
    return sc.fold if name == "wo" else getattr(sc, name).fold


def applies(fault: str, sc: StoredCase) -> bool:
    """Whether ``fault`` exists for this case: the rotations named must be there (and fit)."""
    if fault.startswith("rotation_skipped_"):
        return _fold(sc, fault.removeprefix("rotation_skipped_")) is not None
    g, u, d = _fold(sc, "gate"), _fold(sc, "up"), _fold(sc, "down")
    if fault in ("gate_with_up_signs", "up_with_gate_signs"):
        return g is not None and u is not None and g.signs is not None and u.signs is not None
    if fault == "down_with_gate_block":
        return d is not None and g is not None and g.block != d.block and d.signs.size % g.block == 0
    return fault.startswith("scales_") and all(getattr(sc, m).quantized for m in LINEARS)


def _bf16(a: Any) -> np.ndarray:
    return np.array(mx.array(np.asarray(a, dtype=np.float32)).astype(mx.bfloat16).astype(mx.float32))


def _bits_as_bf16(a: Any) -> np.ndarray:
    """float16 values' bits read as bfloat16's: a bfloat16 is the high half of a float32."""
    bits = np.asarray(a, dtype=np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
    return (bits << np.uint32(16)).view(np.float32)


def _weights(m: StoredMatrix, fault: str | None) -> np.ndarray:
    if fault not in ("scales_bfloat16", "scales_bits_as_bfloat16"):
        return np.asarray(m.dense(), dtype=np.float32)
    read = _bf16 if fault == "scales_bfloat16" else _bits_as_bf16
    s, b = read(m.scales), read(m.biases)
    return dequantize_float64(np.asarray(m.codes), s, b, bits=m.bits, group_size=m.group_size).astype(np.float32)


def _rotation(sc: StoredCase, name: str, fault: str | None) -> HadamardFold | None:
    """The rotation the faulty kernel applies to ``name``'s input."""
    f = _fold(sc, name)
    if f is None or fault == f"rotation_skipped_{name}":
        return None
    if fault == "gate_with_up_signs" and name == "gate":
        return HadamardFold(f.block, signs=sc.up.fold.signs)
    if fault == "up_with_gate_signs" and name == "up":
        return HadamardFold(f.block, signs=sc.gate.fold.signs)
    if fault == "down_with_gate_block" and name == "down":
        return HadamardFold(sc.gate.fold.block, signs=f.signs)
    return f


def packed_faulty_tail(sc: StoredCase, fault: str | None) -> np.ndarray:
    """The float32 tail of ``sc`` (each matrix rotating its own input) with ``fault`` (a name
    of :data:`PACK_FAULTS`, or None: the correct float32 tail). ``sc.branch`` / ``sc.residual``
    may carry leading axes."""
    if fault is not None and fault not in PACK_FAULTS:
        raise ValueError(f"fault: must be one of {tuple(PACK_FAULTS)} or None, got {fault!r}")

    def linear(name: str, x: np.ndarray) -> np.ndarray:
        f = _rotation(sc, name, fault)
        if f is not None and f.site is FoldSite.INPUT:
            x = f.rotate(x).astype(np.float32)
        y = x @ _weights(getattr(sc, name), fault).T
        if f is not None and f.site is FoldSite.OUTPUT:
            y = f.unrotate(y).astype(np.float32)
        return y

    x = np.asarray(sc.branch, dtype=np.float32)
    h = np.asarray(sc.residual, dtype=np.float32) + linear("wo", x)
    ms = np.sum(h * h, axis=-1, keepdims=True) / np.float32(h.shape[-1])
    normed = h / np.sqrt(ms + np.float32(sc.eps)) * np.asarray(sc.ffn_norm, dtype=np.float32)
    g = linear("gate", normed)
    with np.errstate(over="ignore"):
        act = g / (np.float32(1.0) + np.exp(-g)) * linear("up", normed)
    return (h + linear("down", act)).astype(np.float32)
