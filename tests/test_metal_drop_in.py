"""The drop-in for ``mx.fast.metal_kernel`` (``workbench.metal_kernel``): a kernel written as
MLX's custom-kernel documentation shows one runs unchanged on the CPU, matched against numpy,
and what the emulator cannot run is refused naming the argument."""

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends
from workbench.kernels import metal_emulation
from workbench.kernels.metal_drop_in import metal_kernel

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
    return metal_kernel(name="row_sum" + ("" if barrier else "_no_barrier"), input_names=["x"], output_names=["out"],
                        source=ROW_SUM_SOURCE.replace("BARRIER", barrier))


def test_mlx_docs_exp_kernel_runs_unchanged_and_matches_numpy():
    kernel = metal_kernel(name="myexp", input_names=["inp"], output_names=["out"], source=EXP_SOURCE)
    a = mx.array(np.linspace(-4, 4, 256, dtype=np.float32))
    (out,) = kernel(inputs=[a], template=[("T", mx.float32)], grid=(a.size, 1, 1), threadgroup=(256, 1, 1),
                    output_shapes=[a.shape], output_dtypes=[a.dtype])
    # float64 oracle; 2 ulp-ish relative bound (host expf is within 1 ulp; Metal precise allows 4)
    np.testing.assert_allclose(np.array(out), np.exp(np.array(a).astype(np.float64)), rtol=5e-7, atol=0)


@pytest.mark.parametrize("order", metal_emulation.ORDERS)
def test_row_sum_with_simd_and_group_reduction_matches_numpy(order):
    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    (out,) = _row_sum("threadgroup_barrier(metal::mem_flags::mem_threadgroup);")(
        inputs=[mx.array(x)], template=[("N", 512), ("TG", 256)], grid=(4 * 256, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(4,)], output_dtypes=[mx.float32], order=order, seed=3)
    np.testing.assert_allclose(np.array(out), x.astype(np.float64).sum(axis=1), rtol=0, atol=1e-4)


def test_init_value_fills_the_outputs_no_thread_writes():
    src = "uint i = thread_position_in_grid.x; if (i % 2 == 0) out[i] = inp[i];"
    kernel = metal_kernel(name="evens", input_names=["inp"], output_names=["out"], source=src)
    a = mx.arange(64).astype(mx.float32)
    (out,) = kernel(inputs=[a], grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)],
                    output_dtypes=[mx.float32], init_value=-1.0)
    expect = np.where(np.arange(64) % 2 == 0, np.arange(64), -1).astype(np.float32)
    np.testing.assert_array_equal(np.array(out), expect)
    (nan_out,) = kernel(inputs=[a], grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)],
                        output_dtypes=[mx.float32])
    assert np.isnan(np.array(nan_out)[1::2]).all()  # without init_value, unwritten elements show


def test_out_of_bounds_index_is_caught():
    src = "uint i = thread_position_in_grid.x; out[i] = inp[i + 1];"
    kernel = metal_kernel(name="oob", input_names=["inp"], output_names=["out"], source=src)
    a = mx.zeros((64,), dtype=mx.float32)
    with pytest.raises(metal_emulation.EmulationError):
        kernel(inputs=[a], grid=(64, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(64,)], output_dtypes=[mx.float32])


@pytest.mark.parametrize("kw, names", [
    ({"grid": (100, 1, 1)}, "grid"),
    ({"grid": (64, 2, 1)}, "grid"),
    ({"threadgroup": (64, 1, 1), "max_threads_per_threadgroup": 32}, "max_threads_per_threadgroup"),
    ({"output_dtypes": [mx.complex64]}, "output_dtypes"),
    ({"stream": mx.cpu}, "stream"),
])
def test_unsupported_launches_are_refused_naming_the_argument(kw, names):
    kernel = metal_kernel(name="myexp", input_names=["inp"], output_names=["out"], source=EXP_SOURCE)
    args = {"inputs": [mx.zeros((64,))], "template": [("T", mx.float32)], "grid": (64, 1, 1),
            "threadgroup": (32, 1, 1), "output_shapes": [(64,)], "output_dtypes": [mx.float32], **kw}
    with pytest.raises(ValueError, match=names):
        kernel(**args)


def test_atomic_outputs_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="atomic_outputs"):
        metal_kernel(name="h", input_names=["x"], output_names=["out"], source="", atomic_outputs=True)


def test_a_missing_barrier_between_simd_groups_is_caught_in_some_order():
    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    expect = x.astype(np.float64).sum(axis=1)
    kernel = _row_sum("")
    wrong = []
    for order in metal_emulation.ORDERS:
        (out,) = kernel(inputs=[mx.array(x)], template=[("N", 512), ("TG", 256)], grid=(4 * 256, 1, 1),
                        threadgroup=(256, 1, 1), output_shapes=[(4,)], output_dtypes=[mx.float32], order=order, seed=3)
        wrong.append(not np.allclose(np.array(out), expect, rtol=0, atol=1e-4))
    assert any(wrong), "the kernel without its barrier matched numpy in every thread order"
