"""count_waits: what it counts, nesting, and restoring what it patches."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench.wait_measurement import count_waits


def test_count_waits_counts_reads_and_evals_and_restores():
    orig = (mx.eval, np.asarray, mx.array.item)
    a = mx.array([1.0, 2.0]) * 2
    with count_waits() as outer:
        b = a + 1
        mx.eval(b)
        np.asarray(b)  # evaluated in this block: no new wait
        c = b * 3
        c.item  # attribute access is not a read
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
