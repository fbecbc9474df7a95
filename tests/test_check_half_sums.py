"""The float16 fault model's sums: the compiled C form gives numpy's float16 arithmetic bit for
bit (overflow to infinity and NaN included), at every shape the check's fault models use it."""

import numpy as np
import pytest

from workbench.backends import clang_available
from workbench.check.half_sums import compiled, half_sums, numpy_half_sums

needs_clang = pytest.mark.skipif(not clang_available(), reason="the C form is compiled by clang, not installed here")


def _case(rows, cols, n, seed):
    rng = np.random.default_rng(seed)
    w = rng.random((rows, cols), dtype=np.float32) * 0.2 - 0.1
    x = (rng.random((n, cols), dtype=np.float32) * 2 - 1) * np.logspace(-3, 3, n, dtype=np.float32)[:, None]
    x[-1, :3] = 7.0e4  # past float16's largest: infinities, and NaN where they meet
    if cols < 3:
        return w, x
    w[::2, :3] = np.abs(w[::2, :3]) * np.array([1, -1, 1], dtype=np.float32)  # even rows: inf - inf
    w[1::2, :3] = np.abs(w[1::2, :3])  # odd rows: +inf
    return w, x


@needs_clang
@pytest.mark.parametrize("host", [True, False], ids=["host-cpu", "plain"])
@pytest.mark.parametrize("rows,cols,n", [(1, 1, 1), (7, 13, 2), (9, 64, 3), (64, 9, 5), (130, 257, 3), (33, 40, 9)])
def test_the_c_form_is_numpys_float16_arithmetic_bit_for_bit(rows, cols, n, host):
    # both C forms: the host CPU's (x86-64 with F16C: sixteen rows and four vectors at once in
    # AVX lanes, the rest one by one) and the plain loop a CPU without them runs
    assert compiled(host) is not None
    w, x = _case(rows, cols, n, rows * cols)
    want = numpy_half_sums(w, x)
    got = half_sums(w, x, host=host)
    assert got.dtype == np.float32 and got.shape == (n, rows)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    if rows > 1 and n > 1 and cols >= 3:  # every kind was compared
        assert np.isinf(want).any() and np.isnan(want).any() and np.isfinite(want).any()


def test_the_numpy_form_sums_in_order_rounding_every_step():
    # 2048 + 1 + 1 in float16: 2048 + 1 rounds back to 2048 (ties to even) at each step,
    # where a float32 sum would reach 2050
    w = np.ones((1, 3), dtype=np.float32)
    x = np.array([[2048.0, 1.0, 1.0]], dtype=np.float32)
    assert half_sums(w, x, use_c=False)[0, 0] == 2048.0
    assert half_sums(w, x)[0, 0] == 2048.0
    assert half_sums(w, x[:, ::-1].copy())[0, 0] == 2050.0  # 1 + 1 first: 2, then 2050
