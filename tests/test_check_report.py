"""The report reads right on a failing check and on a passing one: the fault table's reference
row is the workbench's reference, the calibrated tolerance is fitted to a correct tail's errors
(and says whose), a reference past the user's tolerance is said so, the tables' columns are in
words, and the figure draws the tolerances on one x range with a y label."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

import tests.check_user_tails as tails
from workbench.check import CallableSubject, check_kernel
from workbench.check.report import REFERENCE_ROW

SEEDS = range(60)


@pytest.fixture(scope="module")
def passing():
    return check_kernel(CallableSubject(tails.correct, process=False), seeds=SEEDS, tolerance=1e-4)


@pytest.fixture(scope="module")
def failing():
    return check_kernel(CallableSubject(tails.eps_outside, process=False), seeds=SEEDS, tolerance=1e-4)


def test_the_reference_row_is_the_workbench_reference_not_the_users_cases(failing):
    table = failing.catch_table()
    ref = table.loc[REFERENCE_ROW]
    assert (ref == 0).all().all()  # the reference's own flake rate, not the user's failing cases
    assert (failing.cases.loc[failing.cases.scale == 0.01, "worst"] > 1e-4).all()  # which fail here
    assert table.loc[("float16_accumulation", 1.0), "calibrated"] == 1.0  # a sharp calibration catches it


def test_the_calibrated_tolerance_is_fitted_to_a_correct_tail_and_printed(failing, passing):
    assert "workbench reference" in failing.calibrated_on and "verdict fails" in failing.calibrated_on
    assert "own errors" in passing.calibrated_on and "passes" in passing.calibrated_on
    assert failing.calibrated.recommended < 2e-4  # not fitted to the buggy 1e-2 errors
    for rep in (failing, passing):
        line = next(x for x in str(rep).splitlines() if x.startswith("calibrated tolerance:"))
        assert f"{rep.calibrated.recommended:.2g}" in line and "flake rate 0.0001" in line
        assert rep.to_record()["calibrated"]["fitted_to"] == rep.calibrated_on


def test_a_reference_past_the_users_tolerance_is_said_so():
    rep = check_kernel(CallableSubject(tails.correct, process=False), seeds=range(20), tolerance=1e-6, faults=())
    assert any("the workbench's own reference exceeds your tolerance (worst <= 1e-06)" in n for n in rep.notes)
    assert "note: the workbench's own reference exceeds" in str(rep)


def test_the_tables_columns_are_named_in_words(passing, failing):
    for rep in (passing, failing):
        text = str(rep)
        for col in ("q50 .. q100", "past 4x ref", "rejects at", "power", REFERENCE_ROW):
            assert f"  {col}  " in text, col


def test_the_figure_draws_the_tolerances_on_one_x_range(failing, passing):
    import matplotlib.pyplot as plt

    for rep in (failing, passing):
        fig = rep.figure()
        axes = fig.axes
        assert len(axes) == 3 and axes[0].get_ylabel() == "cases"
        assert len({a.get_xlim() for a in axes}) == 1
        xs = {round(float(np.asarray(line.get_xdata())[0]), 12) for line in axes[1].get_lines()}
        assert {2e-4, 1e-4, rep.calibrated.recommended} <= xs
        plt.close(fig)
