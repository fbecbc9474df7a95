"""The recurrent step's check cannot be fooled either: a step that changes its inputs, returns an
alias of one, gives other bits on a second call (beyond rounding: failed; at rounding level:
reported, not failed), caches by input identity, or crashes its process is caught and named, and
the report says what was checked and where the step ran."""

import pytest

import tests.check_adversarial_steps as steps
from tests.test_check_gdn import numpy_step
from workbench.check import CallableStep, check_step

FEW = {
    "geometries": [(2, 6, 32, 32, 4)],
    "seeds": range(3),
    "tokens": 6,
    "gates": ["typical"],
    "scales": [1.0],
    "state_scales": [1.0],
    "faults": (),
}


def _check(name, process=False, **kw):
    return check_step(CallableStep(getattr(steps, name)), process=process, **{**FEW, **kw})


@pytest.mark.parametrize(
    "name,says",
    [
        ("mutates_state", "token 1: changed its input(s) in place: state"),
        ("aliases_state", "token 1: tensor state: returned an array that shares memory with its input 'state'"),
    ],
)
@pytest.mark.parametrize("process", [False, True])
def test_an_input_changed_or_aliased_is_refused_by_name(name, says, process):
    rep = _check(name, process=process)
    assert not rep.passed and len(rep.problems) == 3 and all(says in p for p in rep.problems), rep.problems


def test_a_second_call_beyond_rounding_fails_by_name():
    rep = _check("drifts")
    assert not rep.passed
    assert any("a second call on fresh copies of the same inputs gave other bits" in p for p in rep.problems)


def test_rounding_level_nondeterminism_is_reported_not_failed():
    rep = _check("rounding_noise")
    assert rep.passed, str(rep)
    assert "differed at rounding level only: nondeterministic, not failed" in str(rep)


def test_an_identity_cache_is_caught():
    rep = _check("identity_cache")
    assert not rep.passed, str(rep)


def test_a_segfault_costs_its_sequence_only():
    rep = _check("segfault_once", process=None)
    assert rep.problems == [
        "part gdn, case geometry 2/6/32/32/4 scale 1 gate typical state 1 seed 1, token 3: "
        "its process died (signal SIGSEGV) on this case; the check went on"
    ], rep.problems
    assert "worker process of its own (tests.check_adversarial_steps:segfault_once)" in rep.checked[0]
    assert rep.curves["worst"][[0, 2]].max() < 1e-5  # the other sequences went on, in a fresh worker


def test_a_correct_step_passes_and_the_report_names_what_was_checked():
    rep = check_step(numpy_step, **FEW)
    assert rep.passed, str(rep)
    text = str(rep)
    for words in ("worker process of its own", "fresh copies", "verified unchanged", "called a second time"):
        assert words in text, words
    on_thread = check_step(lambda s: numpy_step(s), rerun=False, **FEW)
    assert "worker thread" in on_thread.checked[0] and "no second call" in on_thread.checked[-1]
    assert (on_thread.curves["worst"] == rep.curves["worst"]).all()


def test_bad_guard_options_are_refused_by_name():
    with pytest.raises(ValueError, match="process: True needs a step importable"):
        check_step(lambda s: numpy_step(s), process=True, **FEW)
    with pytest.raises(ValueError, match="rerun: must be True or False"):
        check_step(numpy_step, rerun="yes", **FEW)
    with pytest.raises(ValueError, match="time_limit: must be a finite number > 0"):
        check_step(numpy_step, time_limit=0, **FEW)
