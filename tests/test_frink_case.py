"""frink-models' test case: the LCG by hand, the draw order, the case passing at its tolerance."""

from __future__ import annotations

import numpy as np

from workbench import tail as T
from workbench.fold.rotation import FoldSite
from workbench.tail.comparison import compare
from workbench.tail.frink_case import SEED_LCG_START, SEED_SHAPE, lcg_stream, seed_arrays, seed_case


def test_lcg_first_values_by_hand():
    # 6180339 * 1664525 + 1013904223 = 10287481066198198 = 1896004278 (mod 2^32)
    # 1896004278 >> 9 = 3703133; 3703133 / 2^23 - 0.5 = -0.05855214595794678
    # next: 1270674077 >> 9 = 2481785 -> -0.20414817333221436
    # next:  252105560 >> 9 =  492393 -> -0.44130218029022217
    v, state = lcg_stream(3, 1.0, 6_180_339)
    assert state == 252105560
    assert v.dtype == np.float32
    np.testing.assert_array_equal(
        v, np.array([-0.05855214595794678, -0.20414817333221436, -0.44130218029022217], dtype=np.float32)
    )
    a = seed_arrays()
    np.testing.assert_array_equal(a.wo.ravel()[:3], v)  # wo is drawn first, row-major


def test_seed_arrays_order_and_shapes():
    a = seed_arrays()
    h, b, f = SEED_SHAPE
    assert a.wo.shape == (h, b) and a.gate.shape == (f, h) and a.up.shape == (f, h) and a.down.shape == (h, f)
    # replay the stream by hand in frink-models' test's order
    s = SEED_LCG_START
    chunks = {}
    for name, n, scale in [
        ("wo", h * b, 1.0),
        ("gate", f * h, 1.0),
        ("up", f * h, 1.0),
        ("down", h * f, 1.0),
        ("norm", h, 0.5),
        ("branch", b, 1.0),
        ("residual", h, 1.0),
        ("signs", b, 2.0),
    ]:
        chunks[name], s = lcg_stream(n, scale, s)
    np.testing.assert_array_equal(a.down.ravel(), chunks["down"])
    np.testing.assert_array_equal(a.ffn_norm, np.float32(1) + chunks["norm"])
    np.testing.assert_array_equal(a.branch, chunks["branch"])
    np.testing.assert_array_equal(a.residual, chunks["residual"])
    np.testing.assert_array_equal(a.signs, np.where(chunks["signs"] < 0, -1.0, 1.0))
    assert set(np.unique(a.signs)) == {-1.0, 1.0}
    assert a.eps == 1e-6


def test_seed_case_passes_at_the_seeds_tolerance():
    c = seed_case()
    fold = c.weights.wo.fold
    assert fold.block == 16 and fold.perm is None and fold.site is FoldSite.INPUT
    host32 = T.host_tail(c.weights, c.branch, c.residual, dtype=np.float32)
    truth = T.host_tail(c.weights, c.branch, c.residual)
    fused = T.fused_tail(c.weights, c.branch, c.residual, backend="graph")
    assert fused.dtype == np.float32 and fused.shape == (64,)
    r = compare(fused, host32, tol=c.tol)
    assert r.passed, str(r)
    assert r.margin > 10  # float32 sums of <= 96 terms: far inside 2e-4
    assert compare(fused, truth).passed
    assert compare(T.unfused_tail(c.weights, c.branch, c.residual), host32).passed


def test_seed_fold_keeps_the_map():
    # wo.fold_hadamard keeps the map: the folded wo applies W itself (to float32 rounding of W R^T)
    c = seed_case()
    a = seed_arrays()
    np.testing.assert_allclose(c.weights.wo.linear_map(), a.wo, atol=1e-6)
