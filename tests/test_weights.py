"""WeightMatrix: a fold keeps the map, both paths agree, quantization, bad input."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.fold.weights import WeightMatrix

BLOCK_FAMILIES = [1, 4, 16, 12, 24, 20, 40, 28, 56]


@st.composite
def folded_cases(draw: st.DrawFn) -> tuple[np.ndarray, HadamardFold]:
    block = draw(st.sampled_from(BLOCK_FAMILIES))
    site = draw(st.sampled_from(list(FoldSite)))
    folded_dim = block * draw(st.integers(1, 3))
    other_dim = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31))
    kind = draw(st.sampled_from(["none", "signs", "perm", "both"]))
    rng = np.random.default_rng(seed)
    shape = (other_dim, folded_dim) if site is FoldSite.INPUT else (folded_dim, other_dim)
    w = rng.standard_normal(shape).astype(np.float32)
    signs = np.where(rng.random(folded_dim) < 0.5, -1.0, 1.0) if kind in ("signs", "both") else None
    perm = rng.permutation(folded_dim) if kind in ("perm", "both") else None
    return w, HadamardFold(block, signs, perm, site)


@settings(max_examples=80, deadline=None)
@given(case=folded_cases(), seed=st.integers(0, 2**31))
def test_folded_matrix_is_the_same_map(case: tuple[np.ndarray, HadamardFold], seed: int) -> None:
    w, fold = case
    plain = WeightMatrix(w)
    folded = plain.fold_hadamard(fold)
    x = np.random.default_rng(seed).standard_normal((2, w.shape[1]))
    want = x @ w.astype(np.float64).T
    # The folded base is rounded to float32 once: the map moves by a few float32 ulps.
    tol = 1e-5 * max(1.0, float(np.abs(want).max())) * np.sqrt(w.shape[1])
    assert np.max(np.abs(folded.apply(x) - want)) <= tol
    assert np.allclose(folded.linear_map(), w, atol=1e-5)
    # The base really changed (a fold that is skipped would be invisible otherwise).
    folded_dim = w.shape[1] if fold.site is FoldSite.INPUT else w.shape[0]
    if not np.allclose(fold.matrix(folded_dim), np.eye(folded_dim)):
        assert not np.allclose(folded.dense(), w)


@settings(max_examples=60, deadline=None)
@given(case=folded_cases(), seed=st.integers(0, 2**31))
def test_numpy_and_mlx_apply_agree(case: tuple[np.ndarray, HadamardFold], seed: int) -> None:
    w, fold = case
    m = WeightMatrix(w).fold_hadamard(fold)
    x = np.random.default_rng(seed).standard_normal((3, w.shape[1])).astype(np.float32)
    want = m.apply(x.astype(np.float64))
    got = m.apply(mx.array(x))
    assert isinstance(got, mx.array) and got.dtype == mx.float32
    assert np.max(np.abs(np.array(got) - want)) <= 1e-5 * max(1.0, float(np.abs(want).max()))


def test_fold_sites_store_w_rt_and_r_w() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((24, 48)).astype(np.float32)
    f_in = HadamardFold.random(48, 12, seed=1, permute=True)
    f_out = HadamardFold.random(24, 24, seed=2, site=FoldSite.OUTPUT)
    assert np.allclose(WeightMatrix(w).fold_hadamard(f_in).dense(np.float64), w @ f_in.matrix().T, atol=1e-5)
    assert np.allclose(WeightMatrix(w).fold_hadamard(f_out).dense(np.float64), f_out.matrix() @ w, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dense_dtypes_kept(dtype: str) -> None:
    w = mx.random.normal((8, 16), key=mx.random.key(0)).astype(getattr(mx, dtype))
    m = WeightMatrix(w).fold_hadamard(HadamardFold(16))
    assert m.dtype == dtype
    assert m.nbytes == 8 * 16 * {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    base, fold = m.launch_parts()
    assert isinstance(base, mx.array) and base.dtype == getattr(mx, dtype) and fold is m.fold


@pytest.mark.parametrize(
    "mode, bits, group, max_rel",
    # Mean relative weight error seen for Gaussian weights (MLX 0.32 on the CPU build; docs/REFERENCE.md): affine
    # 4-bit 0.096, mxfp4 0.117, nvfp4 0.091, mxfp8 0.023; limits leave headroom above those.
    [
        ("affine", 4, 64, 0.15),
        ("affine", 8, 64, 0.01),
        ("mxfp4", 4, 32, 0.17),
        ("nvfp4", 4, 16, 0.14),
        ("mxfp8", 8, 32, 0.05),
    ],
)
def test_quantized_apply_matches_its_dequantized_matrix(mode: str, bits: int, group: int, max_rel: float) -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 128)).astype(np.float32)
    fold = HadamardFold.random(128, 32, seed=2)
    q = WeightMatrix.quantize(w, mode=mode, bits=bits, group_size=group, fold=fold)
    assert q.quantization is not None and q.quantization.mode == mode and q.fold is fold
    x = rng.standard_normal(128).astype(np.float32)
    # MLX's quantized matmul against the numpy oracle over the dequantized base.
    got = np.array(q.apply(mx.array(x)))
    assert np.allclose(got, q.apply(x.astype(np.float64)), atol=1e-4, rtol=1e-4)
    # And the quantized map is close to the original one, within the format's error.
    rel = np.mean(np.abs(q.linear_map() - w)) / np.mean(np.abs(w))
    assert rel < max_rel


# -- bad input ----------------------------------------------------------------------------


def test_fold_and_matrix_sizes_disagree() -> None:
    w = np.ones((8, 48), np.float32)
    with pytest.raises(ValueError, match="fold does not fit this matrix.*in \\(columns\\) dimension 48"):
        WeightMatrix(w, HadamardFold.random(64, 16, seed=0))
    with pytest.raises(ValueError, match="fold does not fit this matrix.*out \\(rows\\) dimension 8"):
        WeightMatrix(w).fold_hadamard(HadamardFold(16, site=FoldSite.OUTPUT))
    with pytest.raises(ValueError, match=r"multiple of block \(32\)"):
        WeightMatrix(w).fold_hadamard(HadamardFold(32))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "fp4"}, r"mode: must be one of 'affine', 'mxfp4', 'mxfp8', 'nvfp4'"),
        ({"mode": "affine", "bits": 3}, r"bits: for mode 'affine' must be one of \(2, 4, 8\)"),
        ({"mode": "affine", "bits": 7}, r"bits: for mode 'affine' must be one of \(2, 4, 8\)"),
        (
            {"mode": "affine", "bits": 4, "group_size": 48},
            r"group_size: for mode 'affine' must be one of \(32, 64, 128\)",
        ),
        ({"mode": "mxfp4", "bits": 8}, r"bits: for mode 'mxfp4' must be one of \(4,\)"),
        ({"mode": "mxfp4", "bits": 4, "group_size": 64}, r"group_size: for mode 'mxfp4' must be one of \(32,\)"),
        ({"mode": "nvfp4", "bits": 4, "group_size": 32}, r"group_size: for mode 'nvfp4' must be one of \(16,\)"),
    ],
)
def test_unsupported_quantization(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WeightMatrix.quantize(np.ones((4, 128), np.float32), **kwargs)


def test_quantize_needs_whole_groups() -> None:
    with pytest.raises(ValueError, match=r"group_size: must divide the input dimension \(96\) to quantize, got 64"):
        WeightMatrix.quantize(np.ones((4, 96), np.float32), group_size=64)


def test_folding_a_quantized_or_folded_matrix_is_refused() -> None:
    q = WeightMatrix.quantize(np.ones((4, 128), np.float32))
    with pytest.raises(ValueError, match="cannot fold a quantized matrix"):
        q.fold_hadamard(HadamardFold(16))
    f = WeightMatrix(np.ones((4, 32), np.float32)).fold_hadamard(HadamardFold(16))
    with pytest.raises(ValueError, match="already folded"):
        f.fold_hadamard(HadamardFold(16))


@pytest.mark.parametrize(
    "base, message",
    [
        (np.ones(8, np.float32), "2-D"),
        (np.ones((2, 2, 2), np.float32), "2-D"),
        (np.ones((2, 2), np.int32), "float array"),
        (mx.ones((2, 2), dtype=mx.int32), "base: its dtype must be one of"),
        (np.ones((0, 4), np.float32), "must not be empty"),
    ],
)
def test_bad_base(base: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WeightMatrix(base)


def test_input_of_the_wrong_width() -> None:
    m = WeightMatrix(np.ones((4, 32), np.float32))
    with pytest.raises(
        ValueError, match=r"x: its last axis must be 32 \(the matrix's in dimension\), got shape \(16,\)"
    ):
        m.apply(np.ones(16))
    with pytest.raises(ValueError, match=r"last axis must be 32"):
        m.apply(mx.ones(16))


def test_outlier_matrix_and_quantization_error() -> None:
    from workbench.fold.weights import outlier_matrix, quantization_error, quantization_study

    w = outlier_matrix(64, 256, n_outliers=2, outlier_scale=20.0, seed=0)
    big = np.abs(w).max(axis=0) > 10
    assert big.sum() == 2
    fold = HadamardFold.random(256, 128, seed=1)
    plain = quantization_error(w, mode="affine", bits=4, group_size=64)
    folded = quantization_error(w, mode="affine", bits=4, group_size=64, fold=fold)
    # The reason engines fold: the rotation spreads the outlier columns over the block.
    assert folded < 0.8 * plain
    # Computed by hand for the unfolded case: dequantize and take the Frobenius ratio.
    q = WeightMatrix.quantize(w, mode="affine", bits=4, group_size=64)
    assert plain == pytest.approx(np.linalg.norm(q.dense(np.float64) - w) / np.linalg.norm(w.astype(np.float64)))
    df = quantization_study(w, {"none": None, "block 128": fold})
    assert df.loc["affine 4-bit g64", "none"] == pytest.approx(plain)
    assert df.loc["affine 4-bit g64", "block 128"] == pytest.approx(folded)
    with pytest.raises(ValueError, match="n_outliers: must be an integer"):
        outlier_matrix(4, 8, n_outliers=9, outlier_scale=2.0, seed=0)


def test_bf16_quantized_host_map_is_what_quantized_matmul_computes() -> None:
    # bf16 scales: the host's dequantized matrix must not be rounded to bf16, or the
    # oracle drifts from mx.quantized_matmul (seen 1.2e-2 on a whole tail).
    rng = np.random.default_rng(3)
    w = mx.array(rng.standard_normal((64, 256)).astype(np.float32)).astype(mx.bfloat16)
    q = WeightMatrix.quantize(w, mode="affine", bits=4, group_size=64)
    x = rng.standard_normal(256).astype(np.float32)
    got = np.array(q.apply(mx.array(x)))
    want = q.apply(x.astype(np.float64))
    assert np.max(np.abs(got - want)) <= 2e-5 * max(1.0, float(np.abs(want).max()))


def test_each_named_format_makes_itself_through_as_quantize():
    """QuantSpec.as_quantize() is the ``quantize=`` argument the benches pass: it must make
    weights of the very format it names."""
    from workbench import tail
    from workbench.fold.weights import QUANT_FORMATS

    for name, spec in QUANT_FORMATS.items():
        assert spec.as_quantize() == {"mode": spec.mode, "bits": spec.bits, "group_size": spec.group_size}
        # widths of 128: a group of affine2's 128 fits every matrix
        w = tail.TailWeights.random(128, 128, 128, seed=0, dtype="bfloat16", quantize=spec.as_quantize())
        assert w.wo.quantization == spec, name


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_host_copy_is_mlxs_cast_for_every_bf16_pattern(dtype, monkeypatch) -> None:
    """The host copy of a bf16 base (its bits shifted into a float32, converted in row
    chunks) is MLX's own cast for all 65,536 bit patterns, NaN payloads and infinities
    included, whatever the chunk; a float32 base is copied as it is."""
    from workbench.fold import weights as fw

    base = mx.view(mx.array(np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)), mx.bfloat16)
    with np.errstate(invalid="ignore"):  # the signalling NaNs, widened
        want = np.asarray(base.astype(mx.float32)).astype(dtype)
    for chunk in (1 << 20, 700, 1):  # every row at once, 2 rows at a time (the last chunk short), one row
        monkeypatch.setattr(fw, "HOST_CHUNK", chunk)
        got = fw.host_copy(base, dtype)
        assert got.dtype == dtype and got.shape == (256, 256)
        np.testing.assert_array_equal(
            got.view(np.uint64 if dtype == np.float64 else np.uint32),
            want.view(np.uint64 if dtype == np.float64 else np.uint32),
        )
    f32 = mx.array(np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32))
    np.testing.assert_array_equal(fw.host_copy(f32, dtype), np.asarray(f32).astype(dtype))
    with pytest.raises(ValueError, match="base: must be a bfloat16 or float32"):
        fw.host_copy(f32.astype(mx.float16), dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_dense_is_the_stored_base_exactly(dtype) -> None:
    """``dense`` in float64 and float32 holds the stored values, read through MLX's own cast."""
    base = mx.array(np.random.default_rng(1).standard_normal((33, 40)).astype(np.float32)).astype(getattr(mx, dtype))
    want = np.asarray(base.astype(mx.float32))
    m = WeightMatrix(base)
    np.testing.assert_array_equal(m.dense(np.float32), want)
    np.testing.assert_array_equal(m.dense(np.float64), want.astype(np.float64))


def test_a_large_host_copy_is_mlxs_cast_in_its_own_mapping() -> None:
    """A float64 host copy past 16 MB lives in its own memory map (no huge pages asked for)
    and holds MLX's own cast, like a small one; read-only once ``dense`` caches it."""
    base = mx.array(np.random.default_rng(2).standard_normal((2048, 1536)).astype(np.float32)).astype(mx.bfloat16)
    m = WeightMatrix(base)
    got = m.dense(np.float64)
    np.testing.assert_array_equal(got, np.asarray(base.astype(mx.float32)).astype(np.float64))
    assert got.nbytes >= 1 << 24 and not got.flags.writeable
