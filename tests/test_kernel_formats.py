"""The quantized formats the kernels read (affine 4/8-bit, mxfp4, nvfp4): the exact oracle
against MLX, the kernels' decoding arithmetic replayed in numpy, and the launch builder.

No GPU needed: the GPU runs of the same formats are ``python -m bench.gpu_check``'s.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench import kernel_launch as KL
from workbench import kernel_source as ks
from workbench import tail as T
from workbench.exact_oracle import E2M1_VALUES, dequantize_exact, e4m3_values, e8m0_values
from workbench.weights import QUANT_FORMATS, WeightMatrix


def _as_f32(u: np.ndarray) -> np.ndarray:
    return np.asarray(u, dtype=np.uint32).view(np.float32).astype(np.float64)


def _byte_perm(x: int, y: int, s: np.ndarray) -> np.ndarray:
    """CUDA's __byte_perm (and the Metal prelude's byte_perm): byte n = byte (s >> 4n) & 7 of (x, y)."""
    pair = np.uint64(x) | (np.uint64(y) << np.uint64(32))
    out = np.zeros_like(s, dtype=np.uint64)
    for n in range(4):
        k = (s.astype(np.uint64) >> np.uint64(4 * n)) & np.uint64(7)
        out |= ((pair >> (np.uint64(8) * k)) & np.uint64(0xFF)) << np.uint64(8 * n)
    return out.astype(np.uint32)


def _placed(bits: np.ndarray, mask: int, n_exp: int) -> np.ndarray:
    """common.h's placement, replayed: ``and_or(bits, mask, e)`` with e the float32 2^(23 -
    n_exp) as a float, minus 2^(23 - n_exp), in float32 (the subtract the kernels make)."""
    e = np.uint32((150 - n_exp) << 23)
    f = ((bits & np.uint32(mask)) | e).view(np.float32)
    return (f - e.view(np.float32)).astype(np.float32)


def test_fp4_bytes_and_their_floats_decode_every_e2m1_code():
    """common.h's fp4_bytes + dot_fp4x8's placement: every code in every nibble -> a byte
    b = 12 + 2 e2m1, placed into 2^(23 - 8n) by one mask-and-or; minus 2^(23 - 8n) + 12 =
    2 e2m1(code), exactly in float32 (the subtraction dot_fp4x8 makes before each FMA)."""
    pos_lo, pos_hi, neg_lo, neg_hi = 0x0F0E0D0C, 0x18141210, 0x090A0B0C, 0x00040608
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32),
                        np.array([0x11111111 * c for c in range(16)], dtype=np.uint32)])
    codes = np.stack([(v >> np.uint32(4 * i)) & np.uint32(15) for i in range(8)], 1)

    def fp4_bytes(c: np.ndarray) -> np.ndarray:
        idx = c & np.uint32(0x7777)
        pos, neg = _byte_perm(pos_lo, pos_hi, idx), _byte_perm(neg_lo, neg_hi, idx)
        sel = np.uint32(0x3210) | ((c >> np.uint32(1)) & np.uint32(0x4444))
        return np.array([_byte_perm(int(p), int(n), np.array([s]))[0] for p, n, s in zip(pos, neg, sel)],
                        dtype=np.uint32)

    lo, hi = fp4_bytes(v), fp4_bytes(v >> np.uint32(16))
    assert ((lo >> np.uint32(16)) & np.uint32(0xE0)).max() == 0  # byte 2 < 32: clear of the exponent

    def code(y: np.ndarray, n: int) -> np.ndarray:  # FP4_CODE(y, n)
        e = np.uint32((150 - 8 * n) << 23)
        f = ((y & np.uint32(0xFF << (8 * n))) | e).view(np.float32)
        return (f - (e.view(np.float32) + np.float32(12))).astype(np.float32)

    got = np.stack([code(lo, 0), code(lo, 1), code(lo, 2), code(lo >> np.uint32(8), 2),
                    code(hi, 0), code(hi, 1), code(hi, 2), code(hi >> np.uint32(8), 2)], 1)  # elements 0..7
    np.testing.assert_array_equal(got.astype(np.float64), 2 * E2M1_VALUES[codes])


def test_q4_codes_are_placed_by_one_mask_and_or_exactly():
    """dot_q4x8: code n of a word (n <= 4) or-ed where it lies into 2^(23 - 4n), minus that,
    is q; codes 5-7 the same after the word is moved down 12 bits. Exact in float32."""
    v = np.concatenate([np.random.default_rng(2).integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32),
                        np.array([0, 0xFFFFFFFF, 0x88888888, 0x77777777], dtype=np.uint32)])
    q = np.stack([(v >> np.uint32(4 * i)) & np.uint32(15) for i in range(8)], 1).astype(np.float64)
    h = v >> np.uint32(12)
    got = np.stack([_placed(v, 0xF << (4 * n), 4 * n) for n in range(5)]
                   + [_placed(h, 0xF << (4 * n), 4 * n) for n in (2, 3, 4)], 1)
    np.testing.assert_array_equal(got.astype(np.float64), q)


def test_q8_codes_widen_to_one_plus_q_over_256_exactly():
    """dot_q8x4: byte k of the word in the top mantissa bits of a float32 = 1 + q/256."""
    v = np.random.default_rng(1).integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32)
    q = np.stack([(v >> np.uint32(8 * k)) & np.uint32(255) for k in range(4)], 1).astype(np.float64)
    mask, one = np.uint32(0x007F8000), np.uint32(0x3F800000)
    shifted = [v << np.uint32(15), v << np.uint32(7), v >> np.uint32(1), v >> np.uint32(9)]
    got = np.stack([_as_f32((s & mask) | one) for s in shifted], 1)
    np.testing.assert_array_equal(got, 1 + q / 256)
    np.testing.assert_array_equal((got - np.float32(1)).astype(np.float32), q / 256)  # the subtract, exact


def test_scale_bytes_decode_as_the_oracle_does():
    """common.h's e8m0_float / e4m3_float, replayed: every byte (E4M3's NaNs aside) = the oracle's value."""
    b = np.arange(256, dtype=np.uint32)
    e8 = np.where(b > 0, _as_f32(b << np.uint32(23)), 2.0**-127)
    np.testing.assert_array_equal(e8[:255], e8m0_values(b)[:255])  # 255 = 2^128: infinite in float32
    e, m = (b >> np.uint32(3)) & np.uint32(15), b & np.uint32(7)
    mag = np.where(e > 0, _as_f32(((e + np.uint32(120)) << np.uint32(23)) | (m << np.uint32(20))),
                   m.astype(np.float32) * np.float32(0.001953125))
    e4 = np.where(b & 0x80, -mag, mag)
    finite = (b & 0x7F) != 0x7F
    np.testing.assert_array_equal(e4[finite], e4m3_values(b)[finite])


@pytest.mark.parametrize("name", ["affine4", "affine8", "mxfp4", "nvfp4", "mxfp8"])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_dequantize_exact_matches_mlx_bit_for_bit(name, dtype):
    """The numpy oracle's weights = mx.dequantize's (float32 out), rounded to float32 where MLX
    computes an affine scale * q + bias in float32 (exact for bfloat16 scales)."""
    q = QUANT_FORMATS[name]
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((17, 256)) * np.exp(rng.uniform(-5, 5, (17, 1)))).astype(np.float32)
    w[3] = 0  # an all-zero row: a zero scale (nvfp4) or a smallest one
    wm = WeightMatrix.quantize(mx.array(w).astype(dtype), **q.as_quantize())
    b = wm.launch_parts()[0]
    scales = b.scales if b.scales.dtype == mx.uint8 else b.scales.astype(mx.float32)
    biases = None if b.biases is None else b.biases.astype(mx.float32)
    ref = np.array(mx.dequantize(b.w, scales, biases, **q.as_quantize(), dtype=mx.float32))
    got = dequantize_exact(wm)
    assert got.dtype == np.float64
    if q.mode == "affine" and dtype == mx.float32:
        # MLX rounds scale * q, then + bias, in float32; the oracle keeps them exact: equal
        # after the same two roundings.
        sc = np.array(b.scales).repeat(q.group_size, 1)
        bi = np.array(b.biases).repeat(q.group_size, 1)
        qs = (got - bi.astype(np.float64)) / sc.astype(np.float64)  # the codes back, exactly
        np.testing.assert_array_equal(np.rint(qs), qs)
        np.testing.assert_array_equal((sc * qs.astype(np.float32)) + bi, ref)
    else:
        np.testing.assert_array_equal(got, ref.astype(np.float64))


@pytest.mark.parametrize("name,fmt,sfmt,gs", [("affine4", ks.WF_Q4, ks.SF_BF16, 64), ("affine8", ks.WF_Q8, ks.SF_BF16, 64),
                                              ("mxfp4", ks.WF_FP4, ks.SF_E8M0, 32), ("nvfp4", ks.WF_FP4, ks.SF_E4M3, 16)])
def test_launch_builder_takes_each_format(name, fmt, sfmt, gs):
    q = QUANT_FORMATS[name]
    w = T.TailWeights.random(128, 1024, 512, seed=3, fold_block=256, dtype="bfloat16",
                             quantize=q.as_quantize())
    prep = KL.prepare_tail(T.tail_launch(w), "metal")
    wo = dict(prep.templates()["wo_residual"])
    assert (wo["FMT"], wo["SFMT"], wo["GS"]) == (fmt, sfmt, gs)
    assert wo["QI"] == ((1024 // (32 // q.bits)) % 128 == 0)  # 1024 in: 128 4-bit words, 256 8-bit ones
    assert wo["U"] == KL._units(fmt, KL.DEFAULT_TUNING.u_wo)
    assert prep.weight_bytes() == sum(m.nbytes for m in (w.wo, w.gate, w.up, w.down)) + 4 * 128
    src = KL.metal_tail_source(T.tail_launch(w))
    assert len(src) == 3
    if sfmt in (ks.SF_E8M0, ks.SF_E4M3):
        assert all("const device uint8_t* ws" in s or "const device uint8_t* wgs" in s or "const device uint8_t* wds" in s
                   for s in src.values())


def test_units_are_sixteen_bytes_of_each_format():
    assert [KL._units(f, 8) for f in (ks.WF_F32, ks.WF_BF16, ks.WF_Q4, ks.WF_Q8, ks.WF_FP4)] == [8, 8, 2, 4, 2]
