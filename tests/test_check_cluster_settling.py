"""``check.settling``: the calibrated tolerance and catch rates recomputed on the first n seeds
of a report (no cluster needed: it reads a report's rows)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.check_user_tails import correct
from workbench.check import calibrated_per_scale, check_kernel, settling


@pytest.fixture(scope="module")
def report():
    return check_kernel(correct, seeds=range(110), scales=(1.0, 100.0), faults=("eps_outside_root",), rerun=False)


def test_all_the_seeds_give_the_reports_own_calibration_and_catch_rates(report):
    table = settling(report, [100, 110])
    assert list(table.index) == [(100, 1.0), (100, 100.0), (110, 1.0), (110, 100.0)]
    whole = table.xs(110, level="seeds")
    assert whole["calibrated"].to_dict() == calibrated_per_scale(report)
    for scale in (1.0, 100.0):
        f = report.faults[report.faults["scale"] == scale]["worst"].to_numpy()
        assert whole.loc[scale, "catch eps_outside_root"] == np.mean(~(f <= whole.loc[scale, "calibrated"]))
        r = report.cases[report.cases["scale"] == scale]["ref_worst"].to_numpy()
        assert whole.loc[scale, "reference"] == np.mean(~(r <= whole.loc[scale, "calibrated"]))


def test_the_first_n_seeds_are_the_first_in_the_reports_order(report):
    first = settling(report, [100]).xs(100, level="seeds")
    cut = type(report.cases)(report.cases[report.cases["seed"] < 100])
    assert first["calibrated"].to_dict() == calibrated_per_scale(type("R", (), {"cases": cut})())


def test_bad_counts_and_too_few_errors_are_refused_by_name(report):
    with pytest.raises(ValueError, match="counts: must be"):
        settling(report, [0])
    with pytest.raises(ValueError, match="counts: must be"):
        settling(report, [111])
    with pytest.raises(ValueError, match="at least 100"):
        settling(report, [50])
    with pytest.raises(ValueError, match="flake_rate"):
        settling(report, [100], flake_rate=0)
