"""count_waits: what it counts, nesting, and restoring what it patches."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench.waits.measurement import count_waits


def test_count_waits_counts_reads_and_evals_and_restores():
    orig = (mx.eval, np.asarray, mx.array.item)
    a = mx.array([1.0, 2.0]) * 2
    with count_waits() as outer:
        b = a + 1
        mx.eval(b)
        np.asarray(b)  # evaluated in this block: no new wait
        c = b * 3
        _ = c.item  # attribute access is not a read
        with count_waits() as inner:
            float(c.sum())  # a read of an unevaluated array
        (c + 1).tolist()
        mx.eval([])  # nothing to evaluate: not a wait
    assert inner.n == 1
    assert outer.n == 3, outer
    assert (mx.eval, np.asarray, mx.array.item) == orig
    with count_waits() as none:
        np.asarray([1.0, 2.0])  # numpy data, no MLX
    assert none.n == 0


def test_count_waits_restores_after_an_exception():
    orig = mx.eval
    with pytest.raises(RuntimeError):
        with count_waits():
            raise RuntimeError("boom")
    assert mx.eval is orig


def test_nested_blocks_that_saw_the_same_events_each_keep_their_own_counter():
    # Leaving the inner block must remove the inner counter even when the outer one, having
    # seen exactly the same waits so far, compares equal to it.
    orig = (mx.eval, np.asarray)
    with count_waits() as outer:
        with count_waits() as inner:
            mx.eval(mx.array([1.0]) + 1)
        assert inner == outer  # equal events: the case a removal by value got wrong
        mx.eval(mx.array([2.0]) + 1)
    assert (inner.n, outer.n) == (1, 2)
    assert (mx.eval, np.asarray) == orig


# -- exactness: nesting, exceptions, identity, leaks -------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from workbench.waits import measurement as wm  # noqa: E402


def _own_attributes() -> dict:
    """What every patched owner holds in its own namespace, by identity."""
    return {(id(o), a): vars(o).get(a, wm._ABSENT) for o, a in wm.PATCHED}


def _assert_pristine(before: dict) -> None:
    after = _own_attributes()
    assert all(after[k] is before[k] for k in before), "a patched function is not the original object"
    assert wm._WaitPatch.counters == [] and wm._WaitPatch.originals == {} and not wm._WaitPatch.busy


#: A program: a list of operations; ("block", ops, raises) runs ops inside count_waits and
#: then raises out of it when ``raises``. Leaves: evaluate a new array, read a new array,
#: read the last array made (evaluated or read in this or an enclosing block, or not).
_ops = st.recursive(
    st.sampled_from(["eval", "read_new", "read_last"]),
    lambda inner: st.tuples(st.just("block"), st.lists(inner, max_size=4), st.booleans()),
    max_leaves=14,
)


class _Boom(Exception):
    pass


def _run(ops, active: list[dict], arrays: list, checks: list) -> None:
    """Run ``ops``, keeping the model's count for every open block: an eval is a wait in
    every open block; a read is a wait in every open block that has not evaluated it."""
    for op in ops:
        if op == "eval":
            a = mx.array([float(len(arrays))]) + 1
            arrays.append(a)
            mx.eval(a)
            for b in active:
                b["n"] += 1
                b["evaluated"].add(id(a))
        elif op in ("read_new", "read_last"):
            if op == "read_new" or not arrays:
                arrays.append(mx.array([float(len(arrays))]) * 2)
            a = arrays[-1]
            np.asarray(a)
            for b in active:
                b["n"] += id(a) not in b["evaluated"]
        else:
            _, inner, raises = op
            model = {"n": 0, "evaluated": set()}
            try:
                with count_waits() as wc:
                    _run(inner, active + [model], arrays, checks)
                    if raises:
                        raise _Boom
            except _Boom:
                pass
            checks.append((wc.n, model["n"]))


@given(st.lists(_ops, max_size=5))
@settings(max_examples=60, deadline=None)
def test_nested_blocks_count_exactly_what_the_model_says(program) -> None:
    before = _own_attributes()
    arrays: list = []
    checks: list = []
    _run(program, [], arrays, checks)
    assert all(got == want for got, want in checks), checks
    _assert_pristine(before)


def test_after_the_outermost_block_nothing_is_patched_or_kept() -> None:
    before = _own_attributes()
    with count_waits() as outer:
        with count_waits() as inner:
            mx.eval(mx.array([1.0]) + 1)
        with pytest.raises(ZeroDivisionError):
            with count_waits():
                _ = 1 / 0
        mx.eval(mx.array([2.0]) + 1)
    _assert_pristine(before)
    assert mx.eval is before[(id(mx), "eval")] and np.asarray is before[(id(np), "asarray")]
    # Later evaluations outside any block are counted nowhere and grow nothing.
    for _ in range(20):
        mx.eval(mx.array([3.0]) + 1)
        np.asarray(mx.array([4.0]) * 2)
    assert (inner.n, outer.n) == (1, 2)
    _assert_pristine(before)


def test_a_call_that_raises_is_not_a_wait() -> None:
    before = _own_attributes()
    with count_waits() as wc:
        with pytest.raises(ValueError):
            mx.eval(mx.array([1.0, 2.0]) @ mx.array([1.0, 2.0, 3.0]))  # shapes that cannot multiply
        mx.eval(mx.array([1.0]) + 1)
    assert wc.n == 1, wc
    _assert_pristine(before)


def test_blocks_left_out_of_order_each_remove_only_themselves() -> None:
    before = _own_attributes()
    a, b = count_waits(), count_waits()
    ca = a.__enter__()
    cb = b.__enter__()
    mx.eval(mx.array([1.0]) + 1)
    a.__exit__(None, None, None)  # the outer one first: the inner one still counts
    mx.eval(mx.array([2.0]) + 1)
    b.__exit__(None, None, None)
    assert (ca.n, cb.n) == (1, 2)
    _assert_pristine(before)
