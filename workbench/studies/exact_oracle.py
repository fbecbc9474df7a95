"""The exact oracle the GPU kernels are held to, and the tolerance it implies.

The kernels read quantized weights in MLX's layouts themselves, so an oracle that
dequantized through ``mx.dequantize`` would trust the very library whose layout is under
test. Here the codes are unpacked in numpy (:func:`dequantize_exact`) and the float64
host tail runs on them (:func:`host_tail_exact`): the truth for every kernel check.

The tolerance of a case is the one the float32 oracle itself needs there
(:func:`tolerance_for`): the float32 host tail (frink-models' "host") is compared with
the float64 truth by the test's criterion ``|x - y| <= tol * max(|y|, 1)``, and a kernel
must meet ``max(2e-4, 2 x that error)``, rounded up to 1, 2 or 5 x 10^k. frink-models'
2e-4 stands wherever float32 itself is well inside it (frink-models' test case and every small
shape); only where float32 arithmetic alone errs by more (long reductions, e.g.
Bonsai-27B's FFN) does the tolerance grow, and then by the float32 oracle's own measure,
not by a figure picked to make the kernels pass.
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import tail, validate
from workbench.fold.weights import QuantizedBase, WeightMatrix
from workbench.tail.comparison import compare
from workbench.tail.frink_case import SEED_TOL


def nice_ceil(x: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at or above ``x`` (``x`` itself when not positive and finite).

    Tolerances are printed and compared across runs; a round figure keeps one run's noise
    in the float32 error from moving the tolerance every time.
    """
    x = validate.number("x", x, finite=False)
    if x <= 0 or not math.isfinite(x):
        return x
    e = math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * 10**e >= x * (1 - 1e-12):  # the margin absorbs log10's rounding at exact powers
            return float(m * 10**e)
    return float(10 ** (e + 1))


#: E2M1 (mxfp4 / nvfp4 codes): sign, two exponent bits (bias 1), one mantissa bit.
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def e8m0_values(s: np.ndarray) -> np.ndarray:
    """mxfp4's / mxfp8's scales: 2^(s - 127) (the OCP microscaling E8M0 byte), float64."""
    return np.ldexp(1.0, np.asarray(s).astype(np.int64) - 127)


def e4m3_values(b: np.ndarray) -> np.ndarray:
    """FP8 E4M3 bytes as float64: sign, 4 exponent bits (bias 7), 3 mantissa bits, exponent
    0 subnormal (m/8 * 2^-6); nvfp4's scales and mxfp8's codes (0x7f / 0xff, NaN, not decoded)."""
    b = np.asarray(b).astype(np.int64)
    e, m = (b >> 3) & 15, b & 7
    mag = np.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * np.ldexp(1.0, e - 7))
    return np.where(b & 0x80, -mag, mag)


def _codes(words: np.ndarray, bits: int) -> np.ndarray:
    """The codes of uint32 words (rows of them), lowest bits first: [rows, words * 32 / bits]."""
    per = 32 // bits
    return np.stack([(words >> (bits * i)) & ((1 << bits) - 1) for i in range(per)], -1).reshape(words.shape[0], -1)


def dequantize_exact(wm: WeightMatrix, dtype: Any = np.float64) -> np.ndarray:
    """A quantized matrix's weights computed in ``dtype`` (dense: its base), from its codes.

    Unpacks MLX's layouts in numpy (codes little-endian in uint32 words, one scale a group),
    independently of ``mx.dequantize``, so the oracle does not trust the library whose
    layout the kernels read: affine ``scale * q + bias`` (4 and 8 bits; float32 or bf16
    scales and biases); mxfp4 ``2^(s-127) * e2m1(q)``; nvfp4 ``e4m3(s) * e2m1(q)`` (no global
    scale: ``mx.quantize`` makes none); mxfp8 ``2^(s-127) * e4m3(q)``. Every product is
    exact in float64. (``WeightMatrix.dense`` agrees with it since ``QuantizedBase.dequantize``
    casts the affine scales to float32 first; before that it rounded every weight to bf16
    and moved the Bonsai tail ~5e-3 off.)
    """
    if not isinstance(wm, WeightMatrix):
        raise ValueError(f"wm: must be a WeightMatrix, got {validate.describe(wm)}")
    dtype = validate.float_dtype("dtype", dtype)
    base, _ = wm.launch_parts()
    if not isinstance(base, QuantizedBase):
        return wm.dense(dtype)
    mode, bits, gs = base.spec.mode, base.spec.bits, base.spec.group_size
    codes = _codes(np.array(base.w).view(np.uint32), bits)
    if mode == "affine":
        sc = np.array(base.scales.astype(mx.float32)).astype(dtype).repeat(gs, axis=1)
        bi = np.array(base.biases.astype(mx.float32)).astype(dtype).repeat(gs, axis=1)
        return sc * codes.astype(dtype) + bi
    raw = np.array(base.scales)
    scale = (e4m3_values(raw) if mode == "nvfp4" else e8m0_values(raw)).repeat(gs, axis=1)
    values = e4m3_values(codes) if mode == "mxfp8" else E2M1_VALUES[codes]
    return (scale * values).astype(dtype)


def host_tail_exact(w: tail.TailWeights, br: np.ndarray, res: np.ndarray, dtype: Any = np.float64) -> np.ndarray:
    """``tail.host_tail`` with quantized weights dequantized exactly (:func:`dequantize_exact`)."""
    br, res = tail.check_inputs(w, br, res)
    dtype = validate.float_dtype("dtype", dtype)
    if w.wo.quantization is None:
        return tail.host_tail(w, br, res, dtype=dtype)
    br, res = validate.float_array("br", br), validate.float_array("res", res)
    m = [dequantize_exact(x, dtype) for x in (w.wo, w.gate, w.up, w.down)]
    return tail.tail_np(
        m[0],
        w.wo.fold,
        w.ffn_norm.astype(dtype),
        m[1],
        m[2],
        m[3],
        w.eps,
        np.asarray(br).astype(dtype),
        np.asarray(res).astype(dtype),
    )


def oracle_tolerance(f32_worst: float) -> float:
    """The tolerance a kernel is held to where the float32 oracle's worst scaled error is
    ``f32_worst``: ``max(2e-4, nice_ceil(2 x f32_worst))`` (see the module's docstring).

    ``f32_worst`` must be a finite number >= 0 (a scaled error): a NaN would otherwise
    fall through ``max`` and come back as 2e-4, a tolerance no case supports.
    """
    f32_worst = validate.number("f32_worst", f32_worst, minimum=0)
    return max(SEED_TOL, nice_ceil(2 * f32_worst))


def tolerance_for(w: tail.TailWeights, br: np.ndarray, res: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """``(tol, f32_worst)``: the float32 host oracle's worst scaled error against ``truth``
    (the float64 :func:`host_tail_exact`) and the tolerance it implies (:func:`oracle_tolerance`)."""
    f32 = host_tail_exact(w, br, res, dtype=np.float32)
    truth = validate.float_array("truth", truth)
    if truth.shape != f32.shape:
        raise ValueError(f"truth: must have the tail's output shape {f32.shape} (host_tail_exact's), got {truth.shape}")
    worst = compare(f32, truth).worst
    if not math.isfinite(worst):
        raise ValueError(
            "truth: the float32 oracle's error against it is not finite (a NaN or Inf on either side); "
            "no tolerance follows from it"
        )
    return oracle_tolerance(worst), worst
