"""The quantized formats the kernels read (affine 4/8-bit, mxfp4, nvfp4): the one table of
formats against the kernels' codes, the exact oracle against MLX, the kernels' decoding
arithmetic replayed in numpy, and the launch builder.

No GPU needed: the GPU runs of the same formats are ``python -m bench.gpu_check``'s.
"""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np
import pytest

from workbench import tail as T
from workbench.fold import formats as F
from workbench.fold.weights import DENSE_DTYPES, QUANT_FORMATS, WeightMatrix
from workbench.kernels import emulated as KE
from workbench.kernels import launch as KL
from workbench.kernels import matrices as KM
from workbench.kernels import source as ks
from workbench.kernels import tuning as KT
from workbench.studies.exact_oracle import E2M1_VALUES, dequantize_exact, e4m3_values, e8m0_values

#: kernels/common.h's names for the weight codes (WF_*) and scale codes (SF_*), and the
#: formats of workbench.fold.formats each names.
_COMMON_H_WEIGHTS = {
    "WF_F32": ["float32"],
    "WF_BF16": ["bfloat16"],
    "WF_Q4": ["affine4"],
    "WF_Q8": ["affine8"],
    "WF_FP4": ["mxfp4", "nvfp4"],
}
_COMMON_H_SCALES = {"SF_F32": "float32", "SF_BF16": "bfloat16", "SF_E8M0": "e8m0", "SF_E4M3": "e4m3"}


def test_the_format_table_has_the_kernels_codes():
    """The Python side reads the kernels' FMT and SFMT numbers from one table
    (workbench.fold.formats); kernels/common.h defines them: the two must agree."""
    text = (ks.KERNEL_DIR / "common.h").read_text()
    defined = {m.group(1): int(m.group(2)) for m in re.finditer(r"^#define ((?:WF|SF)_\w+) (\d+)", text, re.M)}
    assert set(defined) == set(_COMMON_H_WEIGHTS) | set(_COMMON_H_SCALES)
    for macro, names in _COMMON_H_WEIGHTS.items():
        assert [f.name for f in F.by_code(defined[macro])] == names
    assert sorted(f.name for f in F.KERNEL_FORMATS) == sorted(n for ns in _COMMON_H_WEIGHTS.values() for n in ns)
    assert {macro: F.SCALE_CODES[name] for macro, name in _COMMON_H_SCALES.items()} == {
        macro: defined[macro] for macro in _COMMON_H_SCALES
    }
    assert F.MXFP4.scale_code() == defined["SF_E8M0"] and F.NVFP4.scale_code() == defined["SF_E4M3"]
    assert F.AFFINE4.scale_code("float32") == defined["SF_F32"] and F.AFFINE8.scale_code() == defined["SF_BF16"]


def test_one_format_is_found_by_each_of_its_names():
    for f in F.FORMATS:
        assert F.by_name(f.name) is f and str(f) == f.name
        if f.quantized:
            assert F.by_mode(f.mode, f.bits) is f and QUANT_FORMATS[f.name].format is f
            assert (QUANT_FORMATS[f.name].mode, QUANT_FORMATS[f.name].bits) == (f.mode, f.bits)
            assert QUANT_FORMATS[f.name].group_size == f.group_size
        else:
            assert f.name in DENSE_DTYPES and f.name not in QUANT_FORMATS
        if f.served:
            assert f in F.by_code(f.code)
    assert list(QUANT_FORMATS) == [f.name for f in F.FORMATS if f.quantized]
    assert [f.name for f in F.KERNEL_FORMATS] == ["float32", "bfloat16", "affine4", "affine8", "mxfp4", "nvfp4"]
    assert not F.FLOAT16.served and not F.MXFP8.served
    with pytest.raises(ValueError, match=r"name: must be one of .*'affine4'.*got 'int3'"):
        F.by_name("int3")
    with pytest.raises(ValueError, match=r"\(mode, bits\): must be one of .*got \('affine', 3\)"):
        F.by_mode("affine", 3)
    with pytest.raises(ValueError, match=r"code: must be one of the kernels' format codes \[0, 1, 2, 3, 4\], got 7"):
        F.by_code(7)
    with pytest.raises(ValueError, match="code: must be an integer"):
        F.by_code(True)
    with pytest.raises(ValueError, match="scales_dtype: must be one of"):
        F.AFFINE4.scale_code("float16")


def _as_f32(u: np.ndarray) -> np.ndarray:
    return np.asarray(u, dtype=np.uint32).view(np.float32).astype(np.float64)


def _placed(bits: np.ndarray, mask: int, n_exp: int) -> np.ndarray:
    """common.h's placement, replayed: ``and_or(bits, mask, e)`` with e the float32 2^(23 -
    n_exp) as a float, minus 2^(23 - n_exp), in float32 (the subtract the kernels make)."""
    e = np.uint32((150 - n_exp) << 23)
    f = ((bits & np.uint32(mask)) | e).view(np.float32)
    return (f - e.view(np.float32)).astype(np.float32)


def _halves(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """half_lo / half_hi, replayed: the IEEE halves in each word's low and high 16 bits."""
    h = np.asarray(pairs, dtype=np.uint32).view(np.uint16).reshape(-1, 2).view(np.float16).astype(np.float64)
    return h[:, 0], h[:, 1]  # little-endian: the low half first


def test_fp4_pairs_decode_every_e2m1_code_as_a_half():
    """common.h's fp4_pair, replayed: codes n and n + 4 of a word (every code in every
    nibble), their magnitude bits moved to bits 9-11 of each half and their signs to bit
    15, are the halves e2m1 * 2^-14, exactly; times FP4_UNSCALE (2^14) and 1/2 they are
    the 2 e2m1 the byte tables gave before (so dot_fp4x8's sums are that power of two
    times the old ones)."""
    rng = np.random.default_rng(0)
    v = np.concatenate(
        [
            rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32),
            np.array([0x11111111 * c for c in range(16)], dtype=np.uint32),
        ]
    )
    codes = np.stack([(v >> np.uint32(4 * i)) & np.uint32(15) for i in range(8)], 1)
    got = np.zeros((v.size, 8))
    for n in range(4):
        mag = v << np.uint32(9 - 4 * n) if n < 3 else v >> np.uint32(3)
        sgn = v << np.uint32(12 - 4 * n)
        pair = (mag & np.uint32(0x0E000E00)) | (sgn & np.uint32(0x80008000))  # and_or
        got[:, n], got[:, n + 4] = _halves(pair)
    np.testing.assert_array_equal(got, E2M1_VALUES[codes] * 2.0**-14)
    np.testing.assert_array_equal(got * 2.0**14 * 2, 2 * E2M1_VALUES[codes])


def test_q4_codes_are_placed_by_one_mask_and_or_exactly():
    """dot_q4x8: code n of a word (n <= 4) or-ed where it lies into 2^(23 - 4n), minus that,
    is q; codes 5-7 the same after the word is moved down 12 bits. Exact in float32."""
    v = np.concatenate(
        [
            np.random.default_rng(2).integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32),
            np.array([0, 0xFFFFFFFF, 0x88888888, 0x77777777], dtype=np.uint32),
        ]
    )
    q = np.stack([(v >> np.uint32(4 * i)) & np.uint32(15) for i in range(8)], 1).astype(np.float64)
    h = v >> np.uint32(12)
    got = np.stack(
        [_placed(v, 0xF << (4 * n), 4 * n) for n in range(5)] + [_placed(h, 0xF << (4 * n), 4 * n) for n in (2, 3, 4)],
        1,
    )
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
    # e4m3_float: the seven low bits at half bits 7-13, the sign at bit 15, times 256
    e4 = _halves(((b << np.uint32(7)) & np.uint32(0x3F80)) | ((b << np.uint32(8)) & np.uint32(0x8000)))[0] * 256
    finite = (b & 0x7F) != 0x7F
    np.testing.assert_array_equal(e4[finite], e4m3_values(b)[finite])
    np.testing.assert_array_equal(np.abs(e4[~finite]), 480.0)  # E4M3's NaN codes: 480, as the kernels always gave


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
    # MLX's CPU: on an H200 MLX's dequantize differed from this by one float32 ulp in 44% of
    # the weights (its multiply-add rounds once there); the oracle's claim is about the CPU's map
    ref = np.array(mx.dequantize(b.w, scales, biases, **q.as_quantize(), dtype=mx.float32, stream=mx.cpu))
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


@pytest.mark.parametrize(
    "name,fmt,sfmt,gs",
    [
        ("affine4", F.AFFINE4.code, F.SCALE_CODES["bfloat16"], 64),
        ("affine8", F.AFFINE8.code, F.SCALE_CODES["bfloat16"], 64),
        ("mxfp4", F.MXFP4.code, F.SCALE_CODES["e8m0"], 32),
        ("nvfp4", F.NVFP4.code, F.SCALE_CODES["e4m3"], 16),
    ],
)
def test_launch_builder_takes_each_format(name, fmt, sfmt, gs):
    q = QUANT_FORMATS[name]
    w = T.TailWeights.random(128, 1024, 512, seed=3, fold_block=256, dtype="bfloat16", quantize=q.as_quantize())
    prep = KL.prepare_tail(T.tail_launch(w), "metal")
    wo = dict(prep.templates()["wo_residual"])
    assert (wo["FMT"], wo["SFMT"], wo["GS"]) == (fmt, sfmt, gs) and prep.wo.format is F.by_name(name)
    assert wo["QI"] == ((1024 // (32 // q.bits)) % 128 == 0)  # 1024 in: 128 4-bit words, 256 8-bit ones
    assert wo["U"] == KM.units_for(fmt, KT.DEFAULT_TUNING.u_wo)
    assert prep.weight_bytes() == sum(m.nbytes for m in (w.wo, w.gate, w.up, w.down)) + 4 * 128
    src = KE.metal_tail_source(T.tail_launch(w))
    assert len(src) == 3
    if sfmt in (F.SCALE_CODES["e8m0"], F.SCALE_CODES["e4m3"]):
        assert all(
            "const device uint8_t* ws" in s or "const device uint8_t* wgs" in s or "const device uint8_t* wds" in s
            for s in src.values()
        )


def test_units_are_sixteen_bytes_of_each_format():
    assert [KM.units_for(f.code, 8) for f in F.KERNEL_FORMATS] == [8, 8, 2, 4, 2, 2]
