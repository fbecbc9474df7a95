"""The fold R = B P D: orthogonality, round trips, both paths, the kernel plan, bad input."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.fold.rotation import FoldSite, HadamardFold

BLOCK_FAMILIES = [1, 2, 8, 16, 12, 24, 20, 40, 28, 56]


@st.composite
def folds(draw: st.DrawFn) -> tuple[HadamardFold, int]:
    block = draw(st.sampled_from(BLOCK_FAMILIES))
    dim = block * draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31))
    site = draw(st.sampled_from(list(FoldSite)))
    kind = draw(st.sampled_from(["none", "signs", "perm", "both"]))
    rng = np.random.default_rng(seed)
    signs = np.where(rng.random(dim) < 0.5, -1.0, 1.0) if kind in ("signs", "both") else None
    perm = rng.permutation(dim) if kind in ("perm", "both") else None
    return HadamardFold(block, signs, perm, site), dim


@settings(max_examples=80, deadline=None)
@given(fd=folds())
def test_r_is_orthogonal(fd: tuple[HadamardFold, int]) -> None:
    fold, dim = fd
    r = fold.matrix(dim)
    assert np.allclose(r @ r.T, np.eye(dim), atol=1e-12)


@settings(max_examples=80, deadline=None)
@given(fd=folds(), seed=st.integers(0, 2**31))
def test_rotate_is_r_and_unrotate_inverts_it(fd: tuple[HadamardFold, int], seed: int) -> None:
    fold, dim = fd
    x = np.random.default_rng(seed).standard_normal((2, dim))
    r = fold.matrix(dim)
    assert np.allclose(fold.rotate(x), x @ r.T, atol=1e-12)
    assert np.allclose(fold.unrotate(x), x @ r, atol=1e-12)
    assert np.allclose(fold.unrotate(fold.rotate(x)), x, atol=1e-12)


def test_matrix_is_b_p_d_built_by_hand() -> None:
    # R = B P D from its definition, independently of rotate(): D = diag(signs),
    # (P x)[i] = x[perm[i]], B = blockdiag(H_b / sqrt(b)) with H_b from mx itself.
    dim, block = 40, 20
    rng = np.random.default_rng(7)
    signs = np.where(rng.random(dim) < 0.5, -1.0, 1.0)
    perm = rng.permutation(dim)
    d = np.diag(signs)
    p = np.eye(dim)[perm]
    hb = np.array(mx.hadamard_transform(mx.eye(block), scale=1.0, stream=mx.cpu)).T.astype(np.float64) / np.sqrt(block)
    b = np.kron(np.eye(dim // block), hb)
    assert np.allclose(HadamardFold(block, signs, perm).matrix(), b @ p @ d, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(fd=folds(), seed=st.integers(0, 2**31))
def test_numpy_and_mlx_paths_agree(fd: tuple[HadamardFold, int], seed: int) -> None:
    fold, dim = fd
    x = np.random.default_rng(seed).standard_normal((3, dim)).astype(np.float32)
    for op in (fold.rotate, fold.unrotate):
        want = op(x.astype(np.float64))
        got = op(mx.array(x))
        assert isinstance(got, mx.array)
        assert np.max(np.abs(np.array(got) - want)) <= 1e-5 * max(1.0, float(np.max(np.abs(want))))


def test_returns_the_kind_it_was_given() -> None:
    fold = HadamardFold.random(32, 16, seed=0)
    assert isinstance(fold.rotate(np.ones(32)), np.ndarray)
    assert fold.rotate(np.ones(32)).dtype == np.float64
    assert fold.rotate(np.ones(32, dtype=np.float32)).dtype == np.float32
    assert isinstance(fold.rotate(mx.ones(32)), mx.array)


def test_random_is_seeded() -> None:
    a = HadamardFold.random(96, 16, seed=3, permute=True)
    b = HadamardFold.random(96, 16, seed=3, permute=True)
    c = HadamardFold.random(96, 16, seed=4, permute=True)
    assert a.same_rotation(b) and not a.same_rotation(c)
    assert a is not b  # the head launch asks for the SAME object, as frink-models' Arc::ptr_eq (pointer identity)


def test_plan_fills_identity_parts() -> None:
    plan = HadamardFold(24).plan(48)
    assert (plan.block, plan.m, plan.k, plan.width) == (24, 12, 1, 48)
    assert np.array_equal(plan.signs, np.ones(48, np.float32))
    assert np.array_equal(plan.perm, np.arange(48))
    assert plan.table.shape == (12, 12) and not plan.has_signs and not plan.has_perm
    assert plan.scale == pytest.approx(1 / np.sqrt(24))


def test_plan_keeps_signs_and_perm() -> None:
    fold = HadamardFold.random(56, 28, seed=1, permute=True, site=FoldSite.OUTPUT)
    plan = fold.plan(56)
    assert np.array_equal(plan.signs, fold.signs) and np.array_equal(plan.perm, fold.perm)
    assert plan.site is FoldSite.OUTPUT and plan.m == 28 and plan.k == 0


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("block", [3, 36, 44, 72, 0, -16])
def test_bad_block(block: int) -> None:
    with pytest.raises(ValueError, match="block: must be m"):
        HadamardFold(block)
    with pytest.raises(ValueError, match="block: must be m"):
        HadamardFold.random(144, block, seed=0)


def test_dimension_not_divided_by_block() -> None:
    with pytest.raises(ValueError, match=r"multiple of block \(16\)"):
        HadamardFold(16).plan(40)
    with pytest.raises(ValueError, match=r"dim: must be a multiple of block \(16\), got dim \(40\)"):
        HadamardFold.random(40, 16, seed=0)
    with pytest.raises(ValueError, match="must be a multiple of block 16"):
        HadamardFold(16, signs=np.ones(40))
    with pytest.raises(ValueError, match=r"multiple of block \(16\)"):
        HadamardFold(16).rotate(np.ones(40))


def test_width_disagrees_with_signs() -> None:
    fold = HadamardFold.random(96, 16, seed=0)
    with pytest.raises(ValueError, match="width: must equal the fold's dimension 96"):
        fold.plan(64)
    with pytest.raises(ValueError, match="width: must equal the fold's dimension 96"):
        fold.rotate(np.ones(64))


@pytest.mark.parametrize(
    "signs, message",
    [
        (np.ones(15), "must be a multiple of block 16"),
        (np.r_[np.ones(15), 0.5], r"signs\[15\] = 0.5"),
        (np.r_[np.ones(15), 0.0], r"signs\[15\] = 0.0"),
        (np.r_[np.ones(15), np.nan], "found NaN"),
        (np.ones((4, 4)), "1-D"),
        (np.array([], dtype=float), "non-empty"),
        (np.array(["+"] * 16), "signs: must be a non-empty 1-D array of \\+1/-1"),
    ],
)
def test_bad_signs(signs: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HadamardFold(16, signs=signs)


@pytest.mark.parametrize(
    "perm, message",
    [
        (np.r_[np.arange(15), 0], r"permutation of range\(16\)"),
        (np.arange(1, 17), r"permutation of range\(16\)"),
        (np.arange(16.0), "integers"),
        (np.arange(16).reshape(4, 4), "1-D"),
    ],
)
def test_bad_perm(perm: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HadamardFold(16, perm=perm)


def test_signs_and_perm_lengths_disagree() -> None:
    with pytest.raises(ValueError, match=r"signs/perm: must have the same length, got 32 and 16"):
        HadamardFold(16, signs=np.ones(32), perm=np.arange(16))


def test_bad_site() -> None:
    with pytest.raises(ValueError, match="site: must be FoldSite.INPUT or FoldSite.OUTPUT"):
        HadamardFold(16, site="input")  # type: ignore[arg-type]


def test_matrix_needs_a_dim_when_the_fold_has_none() -> None:
    with pytest.raises(ValueError, match="dim: must be given"):
        HadamardFold(16).matrix()
