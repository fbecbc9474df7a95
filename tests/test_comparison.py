"""comparison's per-case metrics against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.studies import calibration
from workbench.tail import comparison
from workbench.tail.comparison import compare

# ---------------------------------------------------------------------------------------
# per-case metrics, by hand
# ---------------------------------------------------------------------------------------


def test_worst_scaled_error_by_hand() -> None:
    # |x - y| / max(|y|, 1): 0.5/1, 1/max(4,1) = 0.25, 0.01/1 -> worst 0.5
    x = np.array([[1.5, 5.0, 0.01], [2.0, 2.0, 2.0]])
    y = np.array([[1.0, 4.0, 0.0], [2.0, 2.0, 2.0]])
    np.testing.assert_allclose(comparison.worst_scaled_error(x, y), [0.5, 0.0])


def test_max_abs_and_rel_by_hand() -> None:
    x = np.array([[1.5, 5.0, 0.01]])
    y = np.array([[1.0, 4.0, 0.0]])
    np.testing.assert_allclose(comparison.max_abs_error(x, y), [1.0])
    # rel over y != 0 only: 0.5 / 1 and 1 / 4
    np.testing.assert_allclose(comparison.max_rel_error(x, y), [0.5])
    assert np.isnan(comparison.max_rel_error(np.array([[1.0]]), np.array([[0.0]])))[0]


def test_nmse_by_hand() -> None:
    # sum (x-y)^2 / sum y^2 = (1 + 4) / (9 + 16) = 0.2
    x = np.array([[4.0, 2.0]])
    y = np.array([[3.0, 4.0]])
    np.testing.assert_allclose(comparison.nmse(x, y), [0.2])
    np.testing.assert_allclose(comparison.nmse(np.zeros((1, 2)), np.zeros((1, 2))), [0.0])


def test_torch_ratio_by_hand() -> None:
    # float32 defaults rtol 1.3e-6, atol 1e-5: at y = 0, |d| = 1e-5 is exactly the limit
    assert comparison.torch_ratio(np.array([1e-5]), np.array([0.0]))[()] == pytest.approx(1.0)
    # at y = 10: limit 1e-5 + 1.3e-5 = 2.3e-5; |d| = 4.6e-5 -> 2
    assert comparison.torch_ratio(np.array([10.0 + 4.6e-5]), np.array([10.0]))[()] == pytest.approx(2.0, rel=1e-6)


def test_ulp_distance_by_hand() -> None:
    one = np.float32(1.0)
    up1 = np.nextafter(one, np.float32(2))
    up2 = np.nextafter(up1, np.float32(2))
    x = np.array([one, up1, up2, -0.0, np.float32(1e-45), np.float32(-1e-45)], dtype=np.float32)
    y = np.array([1.0, 1.0, 1.0, 0.0, 0.0, np.float32(1e-45)], dtype=np.float64)
    np.testing.assert_array_equal(comparison.ulp_distance(x, y), [0, 1, 2, 0, 1, 2])
    # the float64 truth is rounded to float32 first: 1 + 2^-30 rounds to 1, so 0 ulp
    assert comparison.ulp_distance(np.array([1.0]), np.array([1.0 + 2.0**-30]))[0] == 0
    # float16: 1 and 1 + 2^-10 are neighbours; bfloat16: 1 and 1 + 2^-7
    assert comparison.ulp_distance(np.array([1.0 + 2.0**-10]), np.array([1.0]), dtype="float16")[0] == 1
    assert comparison.ulp_distance(np.array([1.0 + 2.0**-6]), np.array([1.0]), dtype="bfloat16")[0] == 2
    assert np.isnan(comparison.ulp_distance(np.array([np.nan]), np.array([1.0]))[0])


def test_metrics_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="same shape"):
        comparison.worst_scaled_error(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="dtype: must be one of"):
        comparison.ulp_distance(np.zeros(3), np.zeros(3), dtype="int8")
    with pytest.raises(ValueError, match="dtype: must be one of"):
        comparison.torch_ratio(np.zeros(3), np.zeros(3), dtype="float8")


def test_nan_fails_every_metric() -> None:
    x = np.array([[1.0, np.nan]])
    y = np.array([[1.0, 1.0]])
    assert np.isnan(comparison.worst_scaled_error(x, y)[0])
    t = {"seed": ("worst", 2e-4)}
    import pandas as pd

    df = pd.DataFrame({"worst": comparison.worst_scaled_error(x, y), "mutation": ["m"]})
    assert calibration.catch_rates(df, t).loc["m", "seed"] == 1.0  # a NaN counts as caught


# -- one comparison ------------------------------------------------------------------------


def test_compare_criterion_and_metrics():
    y = np.array([0.5, -2.0, 10.0, 0.0])
    x = y + np.array([1e-4, -3e-4, 1e-3, 0.0])
    r = compare(x, y)
    # scaled errors: 1e-4/1, 3e-4/2, 1e-3/10, 0 -> worst 1.5e-4 at index 1
    assert r.passed and r.where == (1,)
    assert r.worst == pytest.approx(1.5e-4)
    assert r.margin == pytest.approx(2e-4 / 1.5e-4)
    assert r.max_abs == pytest.approx(1e-3)
    assert r.max_rel == pytest.approx(2e-4)
    assert r.nmse == pytest.approx((1e-8 + 9e-8 + 1e-6) / (0.25 + 4 + 100))
    assert "\n" not in str(r) and str(r).startswith("PASS")
    assert not compare(x, y, tol=1e-4).passed


def test_compare_edges():
    assert compare([np.inf, 1.0], [np.inf, 1.0]).passed  # infinities that match
    r = compare([np.inf, 1.0], [-np.inf, 1.0])
    assert not r.passed and r.n_inf_mismatch == 1
    assert not compare([np.nan], [np.nan]).passed  # NaN fails, as in llama.cpp
    assert compare([1.0], [1.0]).margin == math.inf
    assert compare(np.zeros((2, 3)), np.ones((2, 3)) * 1e-5).where == (0, 0)
    with pytest.raises(ValueError, match="same shape"):
        compare([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="tol"):
        compare([1.0], [1.0], tol=-1)
