"""Tolerances per input scale: calibrated on a correct tail's own errors at each scale, they
catch eps outside the root at scale 1 where one pooled over the scales is blind; every
catch rate comes with the flake rate the same tolerance costs the correct tail."""

import numpy as np
import pytest

from tests.test_check_run import user_tail
from workbench.check import check_kernel
from workbench.check.tolerances import calibrated_per_scale, catch_and_flake

SEEDS = range(150)


@pytest.fixture(scope="module")
def reports():
    good = check_kernel(user_tail, seeds=SEEDS, faults=())
    bad = check_kernel(lambda c: user_tail(c, eps_outside=True), seeds=SEEDS, faults=())
    return good, bad


def test_per_scale_tolerances_follow_each_scales_errors(reports):
    good, _ = reports
    tol = calibrated_per_scale(good, flake_rate=1e-3)
    assert sorted(tol) == [0.01, 1.0, 100.0]
    for s, limit in tol.items():
        assert limit >= good.cases.worst[good.cases.scale == s].quantile(0.9)  # above the bulk of its own errors
    assert tol[100.0] > 5 * tol[1.0]  # a correct tail's error grows with the scale


def test_the_per_scale_tolerance_sees_what_the_pooled_one_misses(reports):
    good, bad = reports
    t = catch_and_flake(
        good,
        bad,
        {
            "pooled": good.calibrated.recommended,
            "per scale": calibrated_per_scale(good, flake_rate=1e-3),
            "frink": 2e-4,
        },
    )
    assert list(t.columns[:3]) == ["limit 0.01", "limit 1", "limit 100"]
    assert t.loc["per scale", "catch 1"] > 0.3 > 0.1 > t.loc["pooled", "catch 1"]
    assert t.loc["frink", "catch 0.01"] == 1 and t.loc["frink", "catch 1"] == 0
    assert (t[[c for c in t.columns if c.startswith("flake")]] <= 0.02).all().all()
    shares = t.loc["pooled", ["catch 0.01", "catch 1", "catch 100"]].to_numpy()
    want = [np.mean(bad.cases.worst[bad.cases.scale == s] > good.calibrated.recommended) for s in (0.01, 1.0, 100.0)]
    np.testing.assert_allclose(shares, want)


def test_reports_at_other_scales_are_refused(reports):
    good, _ = reports
    other = check_kernel(user_tail, seeds=range(100), scales=(1.0,), faults=())
    with pytest.raises(ValueError, match="scales"):
        catch_and_flake(good, other, {"x": 1e-4})
    with pytest.raises(ValueError, match="flake_rate"):
        calibrated_per_scale(good, flake_rate=0)
