"""Hadamard matrices: MLX's definition, orthogonality, the two paths, bad sizes."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.fold import hadamard

VALID_BLOCKS = [1, 2, 4, 16, 64, 12, 24, 48, 20, 40, 80, 28, 56, 112]
# 36 is the trap: mx.hadamard_transform accepts it and returns a non-orthogonal result.
INVALID_BLOCKS = [3, 36, 44, 72, 0, -1, -16, 6, 9, 100]


@pytest.mark.parametrize("n", VALID_BLOCKS)
def test_matrix_is_what_mlx_computes(n: int) -> None:
    # mx.hadamard_transform(e_i, scale=1) is row i of I @ M.T, i.e. column i of M.
    from_mlx = np.array(mx.hadamard_transform(mx.eye(n), scale=1.0, stream=mx.cpu))
    assert np.array_equal(from_mlx, hadamard.hadamard_matrix(n).T)


@pytest.mark.parametrize("n", VALID_BLOCKS)
def test_matrix_is_hadamard(n: int) -> None:
    h = hadamard.hadamard_matrix(n).astype(np.int64)
    assert set(np.unique(h)) <= {-1, 1}
    assert np.array_equal(h @ h.T, n * np.eye(n, dtype=np.int64))


def test_20_and_28_tables_are_not_symmetric() -> None:
    # Why the transform must be applied as M x (x @ M.T), not x @ M.
    assert not np.array_equal(hadamard.table(20), hadamard.table(20).T)
    assert not np.array_equal(hadamard.table(28), hadamard.table(28).T)


def test_mlx_accepts_36_and_is_not_orthogonal_which_is_why_we_validate() -> None:
    # The MLX behaviour the workbench guards against (a bug in MLX 0.32); if MLX fixes
    # it, this test says so and the guard stays harmless.
    try:
        h = np.array(mx.hadamard_transform(mx.eye(36), stream=mx.cpu))
    except ValueError:
        pytest.skip("this MLX rejects n = 36 itself")
    assert not np.allclose(h @ h.T, np.eye(36), atol=1e-3)


@pytest.mark.parametrize("block", INVALID_BLOCKS)
def test_invalid_blocks_raise_naming_block(block: int) -> None:
    with pytest.raises(ValueError, match=r"block: must be m \* 2\*\*k with m in \(1, 12, 20, 28\)"):
        hadamard.factor_block(block)
    with pytest.raises(ValueError, match="block: must be"):
        hadamard.block_transform(np.ones(max(abs(block), 1) * 2), block)
    with pytest.raises(ValueError, match="block: must be"):
        hadamard.block_transform_mx(mx.ones(max(abs(block), 1) * 2), block)


@pytest.mark.parametrize("block", [2.0, "16", True, None])
def test_non_integer_blocks_raise(block: object) -> None:
    with pytest.raises(ValueError, match="block: must be an int"):
        hadamard.factor_block(block)  # type: ignore[arg-type]


def test_width_not_a_multiple_of_block_raises() -> None:
    with pytest.raises(ValueError, match=r"must be a multiple of block \(16\)"):
        hadamard.block_transform(np.ones(40), 16)
    with pytest.raises(ValueError, match=r"must be a multiple of block \(16\)"):
        hadamard.block_transform_mx(mx.ones(40), 16)


@settings(max_examples=60, deadline=None)
@given(
    block=st.sampled_from(VALID_BLOCKS),
    nblocks=st.integers(1, 4),
    transpose=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_numpy_and_mlx_paths_agree(block: int, nblocks: int, transpose: bool, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((3, block * nblocks)).astype(np.float32)
    want = hadamard.block_transform(x.astype(np.float64), block, transpose=transpose)
    got = np.array(hadamard.block_transform_mx(mx.array(x), block, transpose=transpose))
    # float32 vs float64 on an orthonormal transform: rounding grows ~ sqrt(block) ulps.
    assert np.max(np.abs(got - want)) <= 1e-5 * max(1.0, np.max(np.abs(want)))


@pytest.mark.parametrize("block", VALID_BLOCKS)
def test_transpose_is_the_inverse(block: int) -> None:
    x = np.random.default_rng(block).standard_normal((2, 2 * block))
    y = hadamard.block_transform(x, block)
    assert np.allclose(hadamard.block_transform(y, block, transpose=True), x, atol=1e-12)
    ym = hadamard.block_transform_mx(mx.array(x.astype(np.float32)), block)
    back = np.array(hadamard.block_transform_mx(ym, block, transpose=True))
    assert np.allclose(back, x, atol=1e-5)


@pytest.mark.parametrize("block", [1, 12, 16, 20, 28, 64, 256])
@pytest.mark.parametrize("transpose", [False, True])
def test_float64_rows_do_not_depend_on_the_batch(block: int, transpose: bool) -> None:
    """A row's float64 transform has the same bits alone as in any batch (the one large
    product pads to ROW_GROUP rows), and agrees with the per-block products to rounding."""
    rng = np.random.default_rng(block)
    x = rng.standard_normal((37, 3 * block))
    full = hadamard.block_transform(x, block, transpose=transpose)
    for i in range(0, 37, 5):
        np.testing.assert_array_equal(full[i], hadamard.block_transform(x[i], block, transpose=transpose))
        np.testing.assert_array_equal(
            full[i : i + 11], hadamard.block_transform(x[i : i + 11], block, transpose=transpose)
        )
    h = hadamard.hadamard_matrix(block).astype(np.float64) / np.sqrt(block)
    ref = (x.reshape(37, 3, block) @ (h if transpose else h.T)).reshape(x.shape)
    np.testing.assert_allclose(full, ref, rtol=0, atol=1e-14 * np.sqrt(block))


def test_a_block_mlx_cannot_compile_on_cuda_runs_on_the_cpu_stream_with_the_same_bits(monkeypatch):
    # on an NVIDIA GPU (MLX 0.32) blocks with an m > 1 factor go to the CPU stream: the same
    # values as on the CPU, both directions
    x = mx.random.normal((3, 48), key=mx.random.key(4))
    plain = [np.array(hadamard.block_transform_mx(x, 12, transpose=t)) for t in (False, True)]
    monkeypatch.setattr(hadamard.backends, "cuda_is_default", lambda: True)
    routed = [np.array(hadamard.block_transform_mx(x, 12, transpose=t)) for t in (False, True)]
    for a, b in zip(plain, routed):
        np.testing.assert_array_equal(a, b)
