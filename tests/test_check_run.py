"""The check of a user's own tail: a correct tail written here (not the workbench's code)
is judged correct; eps outside the square root is caught at small input scales; bad
callables are reported naming the case, never crash the check."""

import time

import numpy as np
import pytest

from workbench.check import FAULTS, CallableSubject, faulty_tail
from workbench.check import check_kernel as check
from workbench.check.stored import stored_case
from workbench.check.verdict import NULL_SHARE, RATIO
from workbench.studies.cases import case_weights


def _fwht(x, block):
    """This test's own orthonormal Walsh-Hadamard over blocks of a power-of-two width."""
    lead = x.shape[:-1]
    y = x.reshape(*lead, -1, block).astype(np.float32).copy()
    h = 1
    while h < block:
        y = y.reshape(*lead, -1, block // (2 * h), 2, h)
        a, b = y[..., 0, :].copy(), y[..., 1, :].copy()
        y[..., 0, :], y[..., 1, :] = a + b, a - b
        h *= 2
    return (y.reshape(*lead, -1) / np.float32(np.sqrt(block))).astype(np.float32)


def user_tail(case, eps_outside=False):
    x = np.asarray(case.branch, np.float32)
    if case.fold is not None:
        x = _fwht(x * case.fold.signs, case.fold.block)
    h = case.residual + case.wo.dense() @ x
    ms = np.float32(np.dot(h, h) / h.size)
    inv = 1 / (np.sqrt(ms) + case.eps) if eps_outside else 1 / np.sqrt(ms + np.float32(case.eps))
    n = h * np.float32(inv) * case.ffn_norm
    g, u = case.gate.dense() @ n, case.up.dense() @ n
    return h + case.down.dense() @ (g / (1 + np.exp(-g)) * u)


SEEDS = range(60)


def test_an_independent_correct_tail_is_judged_correct():
    rep = check(user_tail, seeds=SEEDS, tolerance=1e-4)
    assert rep.passed, str(rep)
    assert rep.calibrated is not None and rep.calibrated.recommended < 2e-4
    assert not rep.problems
    share = (rep.cases.worst > RATIO * rep.cases.ref_worst).mean()
    assert share < NULL_SHARE / 2  # the null bound holds with room


def test_eps_outside_the_root_is_caught_at_small_scale():
    rep = check(lambda c: user_tail(c, eps_outside=True), seeds=SEEDS)
    assert not rep.passed
    t = {t.scale: t for t in rep.tests}
    assert t[0.01].rejected
    small = rep.cases[rep.cases.scale < 0.1]
    assert (small.worst > 2e-4).mean() > 0.5  # fails frink-models' rule where it shows
    big = rep.cases[rep.cases.scale > 10]
    assert (big.worst <= 2e-4).all()  # and hides where activations are large


def test_every_fault_is_caught_somewhere_by_the_calibrated_tolerance():
    rep = check(user_tail, seeds=SEEDS, quantize=(None,), folds=(16,))
    rates = rep.catch_table()["calibrated"]
    for f in FAULTS:
        if f == "group_scale_wrong":
            continue  # quantized cases only
        assert rates.loc[f].max() > 0.5, f
    assert rates.loc["(reference)"].max() < 0.05


def test_faulty_tail_without_fault_is_correct():
    w, b, r = case_weights((64, 96, 80), 3, fold=16)
    sc = stored_case(w, b[None], r[None], "x")
    from workbench.tail import host_tail

    assert np.abs(faulty_tail(sc, None) - host_tail(w, b[None], r[None])).max() < 1e-5


@pytest.mark.parametrize(
    "fn,msg",
    [
        (lambda c: np.zeros(3), "shape"),
        (lambda c: "nope", "not an array"),
        (lambda c: 1 / 0, "ZeroDivisionError"),
        (lambda c: np.full(64, np.nan, np.float32), "NaN"),
    ],
)
def test_bad_callables_are_reported_naming_the_case(fn, msg):
    rep = check(fn, seeds=range(2), faults=())
    assert not rep.passed
    assert msg in rep.problems[0] and "seed 0" in rep.problems[0]


def test_a_hanging_callable_is_reported_and_the_check_goes_on():
    def hang(c):
        time.sleep(3)
        return user_tail(c)

    rep = check(CallableSubject(hang, batched=False), seeds=range(1), scales=(1.0,), faults=(), time_limit=0.2)
    assert "limit" in rep.problems[0]


def test_the_command_exits_by_the_verdict(tmp_path):
    from workbench.check.__main__ import main

    rec = tmp_path / "r.json"
    assert main(["tests.check_user_tails:correct", "--seeds", "40", "--record", str(rec)]) == 0
    assert rec.exists()
    assert main(["tests.check_user_tails:eps_outside", "--seeds", "40"]) == 1
    with pytest.raises(SystemExit):
        main(["--help"])


def test_the_report_names_the_implementation():
    rep = check(CallableSubject(user_tail, name="my tail"), seeds=range(40), faults=())
    assert str(rep).startswith("PASS: callable 'my tail'") and rep.to_record()["subject"] == "my tail"


def test_a_batched_callable_gets_every_input_scale_in_one_call():
    calls = []

    def batched(case):
        calls.append(case.branch.shape)
        return np.stack(
            [
                user_tail(StoredCase(**{**case.__dict__, "branch": b, "residual": r}))
                for b, r in zip(case.branch, case.residual)
            ]
        )

    from workbench.check import StoredCase

    rep = check(CallableSubject(batched, batched=True), seeds=range(30), faults=())
    assert rep.passed and not rep.problems and len(calls) == 2 * 30 and calls[0] == (3, 96)  # and the second run
    per_case = check(user_tail, seeds=range(30), faults=())
    np.testing.assert_array_equal(rep.cases.worst.to_numpy(), per_case.cases.worst.to_numpy())
