"""A check that cannot be fooled: a callable that changes its inputs, returns an alias of one,
gives other bits on a second run (beyond rounding: failed; at rounding level: reported, not
failed), caches by input identity, or crashes its process is caught and named."""

import pytest

import tests.check_user_tails as tails
from workbench.check import CallableSubject, check_kernel

FEW = {"seeds": range(12), "faults": ()}


def _check(name, process=False, **kw):
    return check_kernel(CallableSubject(getattr(tails, name), process=process), **{**FEW, **kw})


@pytest.mark.parametrize(
    "name,says",
    [("mutates_input", "changed its input(s) in place: residual"), ("aliases_input", "shares memory with its input")],
)
def test_an_input_changed_or_aliased_is_refused_by_name(name, says):
    rep = _check(name)
    assert not rep.passed and says in rep.problems[0] and "seed 0" in rep.problems[0]
    assert any("verified unchanged" in c for c in rep.checked)


@pytest.mark.parametrize("name", ["stateful", "identity_cache"])
def test_a_second_run_beyond_rounding_fails_by_name(name):
    rep = _check(name)
    assert not rep.passed and rep.determinism.startswith("NOT deterministic")
    assert any("cache keyed by input identity" in r for r in rep.reasons)


def test_rounding_level_nondeterminism_is_reported_not_failed():
    rep = _check("rounding_noise")
    assert rep.passed, str(rep)
    assert rep.determinism.startswith("nondeterministic at rounding level") and "not failed" in rep.notes[-1]
    assert "nondeterministic at rounding level" in str(rep)


def test_a_correct_tail_is_deterministic_and_the_report_names_what_was_checked():
    rep = _check("correct", rerun=True)
    assert rep.passed and rep.determinism.startswith("deterministic")
    text = str(rep)
    for words in ("fresh copies", "sharing memory", "second time in the reverse order", "worker thread"):
        assert words in text, words
    assert "no second run" in "".join(_check("correct", rerun=False).checked)


def test_a_segfault_in_its_own_process_costs_its_case_only():
    rep = _check("segfault", process=True, seeds=range(1), scales=(1.0,), rerun=False)
    assert not rep.passed and "its process died (signal SIGSEGV)" in rep.problems[0]
    assert "worker process of its own (tests.check_user_tails:segfault)" in rep.checked[0]


def test_an_importable_callable_runs_in_a_process_and_gives_the_threads_bits():
    in_process = check_kernel(tails.correct, **FEW)
    on_thread = _check("correct")
    assert "worker process" in in_process.checked[0] and "worker thread" in on_thread.checked[0]
    assert (in_process.cases.worst.to_numpy() == on_thread.cases.worst.to_numpy()).all()
    mutated = _check("mutates_input", process=True)
    assert "changed its input(s) in place" in mutated.problems[0]


def test_a_weight_changed_by_one_call_fails_every_call_of_its_case_in_a_process():
    # in a worker process a case's calls share one copy of its weights (one a scale would cost
    # a copy and a compare of every weight a call): a weight changed by the call at one input
    # scale fails every call of the case, each named
    scales = (0.01, 1.0, 100.0)
    rep = _check("mutates_weight_at_large_inputs", process=True, seeds=range(2), scales=scales, rerun=False)
    assert not rep.passed
    changed = [p for p in rep.problems if "changed its input(s) in place: gate.values" in p]
    for seed in (0, 1):
        for scale in scales:
            assert any(f"seed {seed} scale {scale:g}" in p for p in changed), (seed, scale, rep.problems)
    assert len(changed) == len(rep.problems) == 2 * len(scales)


def test_process_true_needs_an_importable_function():
    with pytest.raises(ValueError, match="process: True needs a function importable"):
        CallableSubject(lambda c: c, process=True)
    with pytest.raises(ValueError, match="process: must be True, False or None"):
        CallableSubject(tails.correct, process="yes")
