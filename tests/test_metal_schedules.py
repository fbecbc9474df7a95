"""The emulator's schedules: SIMD-groups kept in step (three thread orders) and SIMD-groups
running apart (one SIMD-group as far as it can go, in ascending or descending order, and a
seeded random thread at every step), and the comparison that turns a result depending on
the schedule into an error naming the output, the index and the two schedules.

The kernel here has two phases, each ending in a SIMD-group reduction; the second reads
what ANOTHER SIMD-group staged in the first. Kept in step, every SIMD-group finishes the
first phase before any starts the second, so without the threadgroup barrier between them
the result is still right in every thread order; run apart, one SIMD-group reads the
neighbour's stage before it is written (NaN: group memory starts as 0xFF bytes).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends
from workbench.kernels import metal_emulation as ME
from workbench.kernels.metal_drop_in import metal_kernel

pytestmark = pytest.mark.skipif(backends.clang() is None, reason="the Metal emulator needs clang++")

TWO_PHASES = """
    uint tid = thread_position_in_threadgroup.x;
    uint sg = simdgroup_index_in_threadgroup;
    uint lane = thread_index_in_simdgroup;
    uint group = threadgroup_position_in_grid.x;
    threadgroup float stage[TG];
    float v = x[group * TG + tid];
    stage[tid] = 2.0f * v;
    float s = metal::simd_sum(v);
    BARRIER
    float w = stage[(tid + 32) % TG];
    float t = metal::simd_sum(w * s);
    if (lane == 0) out[group * (TG / 32) + sg] = t;
"""

BARRIER = "threadgroup_barrier(metal::mem_flags::mem_threadgroup);"
TG, GROUPS = 128, 3


def _kernel(barrier: bool):
    return metal_kernel(
        name="two_phases" + ("" if barrier else "_no_barrier"),
        input_names=["x"],
        output_names=["out"],
        source=TWO_PHASES.replace("BARRIER", BARRIER if barrier else ""),
    )


def _x() -> np.ndarray:
    return np.random.default_rng(5).standard_normal(GROUPS * TG).astype(np.float32)


def _oracle(x: np.ndarray) -> np.ndarray:
    """float64: each SIMD-group's sum times twice the next SIMD-group's sum (mod the group)."""
    sums = x.astype(np.float64).reshape(GROUPS, TG // 32, 32).sum(axis=2)
    return (sums * 2.0 * np.roll(sums, -1, axis=1)).reshape(-1)


def _run(kernel, order: str, seed: int = 0) -> np.ndarray:
    (out,) = kernel(
        inputs=[mx.array(_x())],
        template=[("TG", TG)],
        grid=(GROUPS * TG, 1, 1),
        threadgroup=(TG, 1, 1),
        output_shapes=[(GROUPS * TG // 32,)],
        output_dtypes=[mx.float32],
        order=order,
        seed=seed,
    )
    return np.array(out)


def test_the_schedules_are_the_in_step_orders_and_the_apart_ones():
    assert ME.SCHEDULES == ME.ORDERS + ME.APART and len(set(ME.SCHEDULES)) == 6


def test_with_its_barrier_every_schedule_gives_the_same_bits_and_matches_float64():
    out = _run(_kernel(True), "every", seed=3)
    # float32 sums of 32 values, one product: relative 1e-5 of the largest term is far above
    # rounding (~1e-6) and far below the NaN or wrong pairing a race gives.
    np.testing.assert_allclose(out, _oracle(_x()), rtol=0, atol=1e-5 * np.abs(_oracle(_x())).max())


def test_a_missing_barrier_between_simd_reductions_is_invisible_in_step():
    kernel = _kernel(False)
    for order in ME.ORDERS:
        out = _run(kernel, order, seed=3)
        np.testing.assert_allclose(out, _oracle(_x()), rtol=0, atol=1e-5 * np.abs(_oracle(_x())).max())


@pytest.mark.parametrize("schedule", ME.APART)
def test_a_missing_barrier_between_simd_reductions_is_wrong_when_simd_groups_run_apart(schedule):
    out = _run(_kernel(False), schedule, seed=3)
    assert not np.allclose(out, _oracle(_x()), rtol=0, atol=1e-3), schedule


def test_every_schedule_names_the_first_differing_output_and_the_two_schedules():
    with pytest.raises(
        ME.ScheduleDependenceError,
        match=r"output 'out' differs between schedules 'ascending' and 'simd-groups-ascending' "
        r"first at index \(0,\)",
    ):
        _run(_kernel(False), "every", seed=3)


def test_first_difference_compares_bits_and_names_the_index():
    a = np.array([[1.0, np.nan], [0.0, 2.0]], np.float32)
    ME.first_difference({"p": [a, a[0]], "q": [a.copy(), a[0].copy()]}, ["y", "z"])  # NaN equals NaN bitwise
    b = a.copy()
    b[1, 0] = -0.0  # equal as a value, not as bits
    with pytest.raises(
        ME.ScheduleDependenceError,
        match=r"output 'y' differs between schedules 'p' and 'r' first "
        r"at index \(1, 0\)",
    ):
        ME.first_difference({"p": [a, a[0]], "q": [a, a[0]], "r": [b, a[0]]}, ["y", "z"])


def test_a_lane_that_skips_a_simd_reduction_is_left_out_of_it_as_on_metal():
    """Metal's SIMD-group functions combine the ACTIVE lanes: lane 7, which takes the other
    branch, contributes nothing to the first sum and keeps its own value. Every schedule
    agrees, and float64 of that rule matches; the kernel's intent (32 lanes) does not."""
    src = TWO_PHASES.replace("BARRIER", BARRIER).replace(
        "float s = metal::simd_sum(v);", "float s = lane == 7 ? v : metal::simd_sum(v);"
    )
    kernel = metal_kernel(name="skipping_lane", input_names=["x"], output_names=["out"], source=src)
    out = _run(kernel, "every", seed=1)
    x = _x().astype(np.float64).reshape(GROUPS, TG // 32, 32)
    s = np.repeat((x.sum(axis=2) - x[:, :, 7])[:, :, None], 32, axis=2)
    s[:, :, 7] = x[:, :, 7]
    t = (2.0 * np.roll(x, -1, axis=1) * s).sum(axis=2).reshape(-1)
    scale = np.abs(t).max()
    np.testing.assert_allclose(out, t, rtol=0, atol=1e-5 * scale)
    assert np.abs(out - _oracle(_x())).max() > 1e-2 * scale  # the kernel's intent is refuted


def test_the_random_schedule_depends_on_its_seed_only():
    kernel = _kernel(False)
    a, b = _run(kernel, "simd-groups-random", seed=4), _run(kernel, "simd-groups-random", seed=4)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
