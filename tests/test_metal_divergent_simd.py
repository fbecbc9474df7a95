"""SIMD-group operations inside divergent control flow, as Metal defines them: a SIMD-group
function combines the lanes that execute it (the active set); the lanes that took another
path -- finished, or waiting at a threadgroup barrier -- contribute nothing and get nothing.
A shuffle or broadcast that reads an inactive lane is undefined in Metal and refused here;
lanes waiting at two different operations are refused too (which runs first depends on
where Apple's compiler reconverges the paths).

Each kernel runs in every schedule (``order="every"``: the SIMD-groups in step and apart,
outputs compared bit for bit) against numpy: float64 sums of at most 32 float32 terms, so a
relative 1e-6 of the largest partial sum is ~10x float32 rounding and far below a lane
wrongly counted in or out (each lane's value is O(1)). Maxima and shuffles are exact.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends
from workbench.kernels import metal_emulation as ME
from workbench.kernels.metal_drop_in import metal_kernel

pytestmark = pytest.mark.skipif(backends.clang() is None, reason="the Metal emulator needs clang++")

N, TG = 256, 128


def _x() -> np.ndarray:
    return np.random.default_rng(11).uniform(0.5, 1.5, N).astype(np.float32)


def _run(name: str, source: str, *, n: int = N, order: str = "every", seed: int = 2) -> np.ndarray:
    kernel = metal_kernel(name=name, input_names=["x"], output_names=["out"], source=source)
    (out,) = kernel(
        inputs=[mx.array(_x()[:n])],
        grid=(n, 1, 1),
        threadgroup=(TG, 1, 1),
        output_shapes=[(n,)],
        output_dtypes=[mx.float32],
        init_value=-7.0,
        order=order,
        seed=seed,
    )
    return np.array(out)


def _lanes() -> np.ndarray:
    return np.arange(N) % 32


def test_only_lanes_below_16_call_simd_sum_and_sum_those_16():
    out = _run(
        "half_sum",
        """
    uint i = thread_position_in_grid.x;
    uint lane = thread_index_in_simdgroup;
    if (lane < 16) {
        out[i] = simd_sum(x[i]);
    }
""",
    )
    x = _x().astype(np.float64).reshape(-1, 32)
    want = np.repeat(x[:, :16].sum(axis=1)[:, None], 32, axis=1)
    want[:, 16:] = -7.0  # never written: init_value
    np.testing.assert_allclose(out, want.reshape(-1), rtol=0, atol=1e-6 * 16 * 1.5)
    # not the whole SIMD-group's sum: the inactive lanes' values are left out
    assert np.abs(out.reshape(-1, 32)[:, 0] - x.sum(axis=1)).min() > 1.0


SOURCE_BOUNDED = """
    uint i = thread_position_in_grid.x;
    if (i >= 200) {
        return;
    }
    out[i] = simd_max(x[i]) + simd_sum(x[i]);
"""


def test_lanes_past_the_end_return_before_the_reduction():
    """The common bounds check (``if (i >= n) return;``) before a reduction: the last
    SIMD-group's returned lanes are inactive, so the sum covers the elements that exist."""
    out = _run("bounded_sum", SOURCE_BOUNDED)  # threads 200..255 return; SIMD-group 6 keeps 8 lanes
    x = _x().astype(np.float64)
    want = np.full(N, -7.0)  # never written: init_value
    for s in range(0, 200, 32):
        e = min(s + 32, 200)
        want[s:e] = x[s:e].max() + x[s:e].sum()
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-6 * 32 * 1.5 * 2)


def test_simd_max_and_a_shuffle_among_the_active_lanes():
    out = _run(
        "active_shuffle",
        """
    uint i = thread_position_in_grid.x;
    uint lane = thread_index_in_simdgroup;
    if (lane >= 8 && lane < 24) {
        float m = simd_max(x[i]);
        out[i] = m - simd_shuffle(x[i], 31 - lane);  // 31 - lane: 23 .. 8, all active
    }
""",
    )
    x = _x().reshape(-1, 32)
    want = np.full_like(x, -7.0)
    for lane in range(8, 24):
        want[:, lane] = x[:, 8:24].max(axis=1) - x[:, 31 - lane]
    assert np.array_equal(out.reshape(-1, 32), want)  # max and a copy: float32-exact, one subtraction


@pytest.mark.parametrize("order", ME.SCHEDULES)
def test_a_shuffle_from_an_inactive_lane_is_refused_naming_both_lanes(order):
    with pytest.raises(
        ME.EmulationError,
        match=r"reads an inactive lane in group \d+, SIMD-group \d+: lane 0 "
        r"reads lane 16, which finished.*undefined",
    ):
        _run(
            "inactive_shuffle",
            """
    uint i = thread_position_in_grid.x;
    uint lane = thread_index_in_simdgroup;
    if (lane < 16) {
        out[i] = simd_shuffle(x[i], lane + 16);
    }
""",
            order=order,
        )


@pytest.mark.parametrize("order", ME.SCHEDULES)
def test_two_different_operations_on_divergent_paths_are_refused(order):
    with pytest.raises(
        ME.EmulationError,
        match=r"divergent SIMD-group operations in group \d+, SIMD-group \d+: "
        r"lane 0 waits at the operation on line \d+, lane 16 at the one on "
        r"line \d+.*reconverges",
    ):
        _run(
            "two_paths",
            """
    uint i = thread_position_in_grid.x;
    uint lane = thread_index_in_simdgroup;
    float v = x[i];
    if (lane < 16) {
        v = simd_sum(v);
    }
    out[i] = simd_max(v);
""",
            order=order,
        )


def test_a_lane_at_a_barrier_is_inactive_and_the_barrier_still_holds():
    """Lanes 0-15 reduce while 16-31 already wait at the barrier; the barrier is released
    only when every thread reached it, so the staged sums are all written before any read."""
    out = _run(
        "sum_then_barrier",
        """
    uint i = thread_position_in_grid.x;
    uint tid = thread_position_in_threadgroup.x;
    uint lane = thread_index_in_simdgroup;
    threadgroup float stage[TG / 32];
    if (lane < 16) {
        float s = simd_sum(x[i]);
        if (lane == 0) {
            stage[tid / 32] = s;
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[i] = stage[(tid / 32 + 1) % (TG / 32)];
""".replace("TG / 32", str(TG // 32)),
    )
    x = _x().astype(np.float64).reshape(N // TG, TG // 32, 32)
    halves = x[:, :, :16].sum(axis=2)
    want = np.repeat(np.roll(halves, -1, axis=1)[:, :, None], 32, axis=2).reshape(-1)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-6 * 16 * 1.5)
