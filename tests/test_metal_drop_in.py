"""The drop-in for ``mx.fast.metal_kernel`` (``workbench.metal_kernel``): a kernel written as
MLX's custom-kernel documentation shows one runs unchanged on the CPU, matched against numpy,
and what the emulator cannot run is refused naming the argument."""

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends
from workbench.kernels import metal_emulation
from workbench.kernels.metal_drop_in import GridWarning, metal_kernel

pytestmark = pytest.mark.skipif(backends.clang() is None, reason="the Metal emulator needs clang++")

# MLX's documentation example (Custom Metal Kernels: "a simple elementwise exp").
EXP_SOURCE = """
    uint elem = thread_position_in_grid.x;
    T tmp = inp[elem];
    out[elem] = metal::exp(tmp);
"""

# A row sum with simd_sum and a threadgroup reduction across SIMD-groups, as users write.
ROW_SUM_SOURCE = """
    uint row = threadgroup_position_in_grid.x;
    uint lane = thread_index_in_simdgroup;
    uint sg = simdgroup_index_in_threadgroup;
    uint tid = thread_position_in_threadgroup.x;
    threadgroup float partial[32];
    float acc = 0.0f;
    for (uint i = tid; i < N; i += TG) acc += x[row * N + i];
    acc = metal::simd_sum(acc);
    if (lane == 0) partial[sg] = acc;
    BARRIER
    if (sg == 0) {
        float v = lane < TG / 32 ? partial[lane] : 0.0f;
        v = metal::simd_sum(v);
        if (lane == 0) out[row] = v;
    }
"""


def _row_sum(barrier: str):
    return metal_kernel(
        name="row_sum" + ("" if barrier else "_no_barrier"),
        input_names=["x"],
        output_names=["out"],
        source=ROW_SUM_SOURCE.replace("BARRIER", barrier),
    )


def test_mlx_docs_exp_kernel_runs_unchanged_and_matches_numpy():
    kernel = metal_kernel(name="myexp", input_names=["inp"], output_names=["out"], source=EXP_SOURCE)
    a = mx.array(np.linspace(-4, 4, 256, dtype=np.float32))
    (out,) = kernel(
        inputs=[a],
        template=[("T", mx.float32)],
        grid=(a.size, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[a.shape],
        output_dtypes=[a.dtype],
    )
    # float64 oracle; 2 ulp-ish relative bound (host expf is within 1 ulp; Metal precise allows 4)
    np.testing.assert_allclose(np.array(out), np.exp(np.array(a).astype(np.float64)), rtol=5e-7, atol=0)


@pytest.mark.parametrize("order", metal_emulation.ORDERS)
def test_row_sum_with_simd_and_group_reduction_matches_numpy(order):
    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    (out,) = _row_sum("threadgroup_barrier(metal::mem_flags::mem_threadgroup);")(
        inputs=[mx.array(x)],
        template=[("N", 512), ("TG", 256)],
        grid=(4 * 256, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[(4,)],
        output_dtypes=[mx.float32],
        order=order,
        seed=3,
    )
    np.testing.assert_allclose(np.array(out), x.astype(np.float64).sum(axis=1), rtol=0, atol=1e-4)


def test_init_value_fills_the_outputs_no_thread_writes():
    src = "uint i = thread_position_in_grid.x; if (i % 2 == 0) out[i] = inp[i];"
    kernel = metal_kernel(name="evens", input_names=["inp"], output_names=["out"], source=src)
    a = mx.arange(64).astype(mx.float32)
    (out,) = kernel(
        inputs=[a],
        grid=(64, 1, 1),
        threadgroup=(32, 1, 1),
        output_shapes=[(64,)],
        output_dtypes=[mx.float32],
        init_value=-1.0,
    )
    expect = np.where(np.arange(64) % 2 == 0, np.arange(64), -1).astype(np.float32)
    np.testing.assert_array_equal(np.array(out), expect)
    (nan_out,) = kernel(
        inputs=[a], grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)], output_dtypes=[mx.float32]
    )
    assert np.isnan(np.array(nan_out)[1::2]).all()  # without init_value, unwritten elements show


def test_out_of_bounds_index_is_caught():
    src = "uint i = thread_position_in_grid.x; out[i] = inp[i + 1];"
    kernel = metal_kernel(name="oob", input_names=["inp"], output_names=["out"], source=src)
    a = mx.zeros((64,), dtype=mx.float32)
    with pytest.raises(metal_emulation.EmulationError):
        kernel(inputs=[a], grid=(64, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(64,)], output_dtypes=[mx.float32])


@pytest.mark.parametrize(
    "kw, names",
    [
        ({"grid": (64, 0, 1)}, "grid"),
        ({"threadgroup": (32, 32, 2)}, "max_threads_per_threadgroup"),
        ({"threadgroup": (64, 1, 1), "max_threads_per_threadgroup": 32}, "max_threads_per_threadgroup"),
        ({"threadgroup": (2048, 1, 1), "grid": (2048, 1, 1)}, "max_threads_per_threadgroup"),
        ({"threadgroup_memory": 65536}, "threadgroup_memory"),
        ({"simd_width": 64}, "simd_width"),
        ({"order": "warp-first"}, "order"),
        ({"math_mode": "relaxed"}, "math_mode"),
        ({"output_dtypes": [mx.complex64]}, "output_dtypes"),
        ({"stream": mx.cpu}, "stream"),
    ],
)
def test_unsupported_launches_are_refused_naming_the_argument(kw, names):
    kernel = metal_kernel(name="myexp", input_names=["inp"], output_names=["out"], source=EXP_SOURCE)
    args = {
        "inputs": [mx.zeros((64,))],
        "template": [("T", mx.float32)],
        "grid": (64, 1, 1),
        "threadgroup": (32, 1, 1),
        "output_shapes": [(64,)],
        "output_dtypes": [mx.float32],
        **kw,
    }
    with pytest.raises(ValueError, match=names):
        kernel(**args)


@pytest.mark.parametrize(
    "grid, groups_note",
    [((100, 1, 1), "the last of 2 groups runs 36 threads"), ((40, 1, 1), "one partial group of 40 threads")],
)
def test_a_partial_threadgroup_runs_as_metal_runs_it_with_a_warning(grid, groups_note):
    """grid counts threads (mlx #1547, #4534): a grid not a multiple of its group, or smaller
    than it, runs a partial last group (its threads_per_threadgroup its own size) and warns."""
    src = "uint i = thread_position_in_grid.x;\nout[i] = inp[i] + 1000.0f * threads_per_threadgroup.x;"
    kernel = metal_kernel(name="partial", input_names=["inp"], output_names=["out"], source=src)
    n = grid[0]
    a = mx.arange(n).astype(mx.float32)
    with pytest.warns(GridWarning, match=groups_note):
        (out,) = kernel(
            inputs=[a],
            grid=grid,
            threadgroup=(64, 1, 1),
            output_shapes=[(n,)],
            output_dtypes=[mx.float32],
            order="every",
        )
    sizes = np.minimum(64, n - (np.arange(n) // 64) * 64)
    np.testing.assert_array_equal(np.array(out), np.arange(n) + 1000.0 * sizes)


def test_a_grid_given_in_threadgroups_is_warned_about_and_its_missing_work_shows():
    """The pitfall itself: grid=(groups, 1, 1) for 4 x 64 elements runs 4 threads; the
    elements no thread wrote stay NaN (no init_value), so a check against numpy fails."""
    src = "uint i = thread_position_in_grid.x; out[i] = inp[i] * 2.0f;"
    kernel = metal_kernel(name="grid_in_groups", input_names=["inp"], output_names=["out"], source=src)
    a = mx.arange(256).astype(mx.float32)
    with pytest.warns(GridWarning, match="smaller than threadgroup"):
        (out,) = kernel(
            inputs=[a], grid=(4, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(256,)], output_dtypes=[mx.float32]
        )
    assert np.isnan(np.array(out)[4:]).all() and np.array_equal(np.array(out)[:4], [0, 2, 4, 6])


def test_threadgroup_memory_over_the_option_is_refused_naming_it():
    src = (
        "threadgroup float buf[TG];\n"
        "uint t = thread_position_in_threadgroup.x; buf[t] = inp[t];\n"
        "threadgroup_barrier(metal::mem_flags::mem_threadgroup);\n"
        "out[t] = buf[(t + 1) % TG];"
    )
    kernel = metal_kernel(name="tg_mem", input_names=["inp"], output_names=["out"], source=src)
    args = {
        "inputs": [mx.zeros((256,))],
        "template": [("TG", 256)],
        "grid": (256, 1, 1),
        "threadgroup": (256, 1, 1),
        "output_shapes": [(256,)],
        "output_dtypes": [mx.float32],
    }
    kernel(**args, threadgroup_memory=1024)  # 1 KB: exactly fits
    with pytest.raises(
        metal_emulation.EmulationError,
        match=r"threadgroup memory over the limit.*"
        r"threadgroup_memory=1008.*'buf' \(1024 bytes\)",
    ):
        kernel(**args, threadgroup_memory=1008)


def test_launch_source_never_hands_a_new_kernel_a_dead_ones_text():
    """launch_source keys kernels by id(); a freed kernel's id is reused by the next object,
    so the cache keeps each kernel alive: every kernel here, made and dropped in turn, gets
    its own text."""
    from workbench.kernels.emulated import launch_source

    a = mx.zeros((64,))
    kw = {
        "template": [],
        "grid": (64, 1, 1),
        "threadgroup": (64, 1, 1),
        "output_shapes": [(64,)],
        "output_dtypes": [mx.float32],
    }
    for k in range(6):
        kernel = mx.fast.metal_kernel(
            name="reused_id",
            input_names=["inp"],
            output_names=["out"],
            source=f"out[thread_position_in_grid.x] = inp[0] + {k}.5f;",
        )
        assert f"+ {k}.5f" in launch_source(kernel, [a], kw)
        del kernel


def test_a_missing_barrier_between_simd_groups_is_caught_in_some_order():
    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    expect = x.astype(np.float64).sum(axis=1)
    kernel = _row_sum("")
    wrong = []
    for order in metal_emulation.ORDERS:
        (out,) = kernel(
            inputs=[mx.array(x)],
            template=[("N", 512), ("TG", 256)],
            grid=(4 * 256, 1, 1),
            threadgroup=(256, 1, 1),
            output_shapes=[(4,)],
            output_dtypes=[mx.float32],
            order=order,
            seed=3,
        )
        wrong.append(not np.allclose(np.array(out), expect, rtol=0, atol=1e-4))
    assert any(wrong), "the kernel without its barrier matched numpy in every thread order"


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/maps"), reason="counts Linux's memory areas")
def test_kernels_share_one_set_of_fiber_stacks():
    """Every kernel's shared object carries its own runtime; the fiber stacks (a guard page
    below each, so two memory areas a thread) are the process's, handed to each launch. Kept
    per kernel, a few dozen kernels of 1024 threads would pass Linux's 65,530 areas."""

    def areas() -> int:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    x = mx.zeros((1024,))
    for k in range(2):  # the first launches may grow the shared stacks to 1024 threads
        kernel = metal_kernel(
            name=f"wide_warmup_{k}",
            input_names=["x"],
            output_names=["y"],
            source=f"uint i = thread_position_in_grid.x; y[i] = x[i] + {k}.0f;",
        )
        kernel(
            inputs=[x], grid=(1024, 1, 1), threadgroup=(1024, 1, 1), output_shapes=[(1024,)], output_dtypes=[mx.float32]
        )
    before = areas()
    for k in range(4):
        kernel = metal_kernel(
            name=f"wide_{k}",
            input_names=["x"],
            output_names=["y"],
            source=f"uint i = thread_position_in_grid.x; y[i] = x[i] * {k + 2}.0f;",
        )
        (y,) = kernel(
            inputs=[x], grid=(1024, 1, 1), threadgroup=(1024, 1, 1), output_shapes=[(1024,)], output_dtypes=[mx.float32]
        )
        assert np.array_equal(np.array(y), np.zeros(1024, np.float32))
    # a kernel's shared object maps a handful of areas; its own stacks would add 2048
    assert areas() - before < 4 * 100


def test_a_compile_error_points_at_the_users_own_line():
    """clang numbers MLX's generated text; the error names the line of the source (or header)
    the user passed, so it points where the user can fix it."""
    x = mx.arange(8, dtype=mx.float32)
    launch = dict(grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)], output_dtypes=[mx.float32])
    source = "uint i = thread_position_in_grid.x;\nout[i] = inp[i] * no_such_name;\n"
    k = metal_kernel(
        name="user_line",
        input_names=["inp"],
        output_names=["out"],
        source=source,
        header="// a header\n// of two lines\n",
    )
    with pytest.raises(metal_emulation.MetalCompileError, match=r"source:2:\d+: error: use of undeclared identifier"):
        k(inputs=[x], **launch)
    k = metal_kernel(
        name="user_header_line",
        input_names=["inp"],
        output_names=["out"],
        source="uint i = thread_position_in_grid.x;\nout[i] = f(inp[i]);\n",
        header="float f(float v) {\n  return v * no_such_name;\n}\n",
    )
    k.header_name = "helpers.metal"
    with pytest.raises(metal_emulation.MetalCompileError, match=r"helpers\.metal:2:\d+: error"):
        k(inputs=[x], **launch)
    k = metal_kernel(
        name="user_refused_line",
        input_names=["inp"],
        output_names=["out"],
        source="uint i = thread_position_in_grid.x;\n\nfloat b = quad_sum(1.0f);\nout[i] = inp[i];\n",
    )
    with pytest.raises(metal_emulation.MetalCompileError, match=r"`quad_sum` \(source:3\) is a Metal built-in not"):
        k(inputs=[x], **launch)
