"""Metal as users write it, through the drop-in (``workbench.metal_kernel``), each against
numpy: 2-D and 3-D launches with partial groups in every dimension and every thread
attribute; scalar inputs and ``<input>_shape`` / ``_strides`` / ``_ndim``; half, bfloat and
vector types, constructors, swizzles and literal suffixes; the SIMD-group functions and
``simdgroup_barrier``; and the distinct refusal of each built-in not emulated.

Tolerance: exact (integers, and float sums of small integers, which float32 holds exactly),
or the value rounded to the type the kernel computes in (half, bfloat16) compared exactly.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench.kernels import metal_emulation
from workbench.kernels.metal_drop_in import GridWarning, metal_kernel
from workbench.kernels.metal_translation import NOT_EMULATED, MetalCompileError, refuse_not_emulated

pytestmark = pytest.mark.skipif(metal_emulation.clang_path() is None, reason="needs clang++")

ATTRIBUTES = """
uint3 p = thread_position_in_grid;
uint w = threads_per_grid.x, h = threads_per_grid.y;
uint k = (p.z * h + p.y) * w + p.x;
out[k * 8 + 0] = thread_position_in_threadgroup.x + 10 * thread_position_in_threadgroup.y
    + 100 * thread_position_in_threadgroup.z;
out[k * 8 + 1] = threadgroup_position_in_grid.x + 10 * threadgroup_position_in_grid.y
    + 100 * threadgroup_position_in_grid.z;
out[k * 8 + 2] = threads_per_threadgroup.x + 10 * threads_per_threadgroup.y + 100 * threads_per_threadgroup.z;
out[k * 8 + 3] = threadgroups_per_grid.x + 10 * threadgroups_per_grid.y + 100 * threadgroups_per_grid.z;
out[k * 8 + 4] = thread_index_in_threadgroup;
out[k * 8 + 5] = simdgroup_index_in_threadgroup * 100 + thread_index_in_simdgroup;
out[k * 8 + 6] = threads_per_grid.z;
out[k * 8 + 7] = inp[0];
"""


@pytest.mark.parametrize("grid, group", [((70, 1, 1), (32, 1, 1)), ((5, 6, 3), (4, 4, 2)), ((40, 9, 1), (16, 4, 1))])
def test_every_thread_attribute_in_2d_and_3d_launches_with_partial_groups(grid, group):
    kernel = metal_kernel(name="attrs", input_names=["inp"], output_names=["out"], source=ATTRIBUTES)
    n = grid[0] * grid[1] * grid[2]
    with pytest.warns(GridWarning):
        (out,) = kernel(
            inputs=[mx.array([7], dtype=mx.uint32)],
            grid=grid,
            threadgroup=group,
            output_shapes=[(n * 8,)],
            output_dtypes=[mx.uint32],
        )
    got = np.array(out).reshape(grid[2], grid[1], grid[0], 8)
    z, y, x = np.meshgrid(*(np.arange(d) for d in grid[::-1]), indexing="ij")
    pos = [c % t for c, t in zip((x, y, z), group)]
    tg = [c // t for c, t in zip((x, y, z), group)]
    ngroups = [-(-d // t) for d, t in zip(grid, group)]
    size = [np.minimum(t, d - g * t) for g, t, d in zip(tg, group, grid)]
    tindex = pos[0] + size[0] * (pos[1] + size[1] * pos[2])
    want = np.stack(
        [
            pos[0] + 10 * pos[1] + 100 * pos[2],
            tg[0] + 10 * tg[1] + 100 * tg[2],
            size[0] + 10 * size[1] + 100 * size[2],
            np.full(x.shape, ngroups[0] + 10 * ngroups[1] + 100 * ngroups[2]),
            tindex,
            (tindex // 32) * 100 + tindex % 32,
            np.full(x.shape, grid[2]),
            np.full(x.shape, 7),
        ],
        axis=-1,
    )
    np.testing.assert_array_equal(got, want)


def test_a_2d_launch_with_a_scalar_input_and_shape_strides_ndim():
    """MLX's custom-kernel style: a scalar passed as a Python number, sizes read from the input."""
    src = """
    uint2 p = thread_position_in_grid.xy;
    if (p.x >= uint(a_shape[1]) || p.y >= uint(a_shape[0])) return;
    out[p.x * a_shape[0] + p.y] = a[p.y * a_strides[0] + p.x * a_strides[1]] * s + float(a_ndim);
    """
    kernel = metal_kernel(name="transpose_scale", input_names=["a", "s"], output_names=["out"], source=src)
    a = np.arange(35, dtype=np.float32).reshape(5, 7)
    (out,) = kernel(
        inputs=[mx.array(a), 0.5],
        grid=(8, 8, 1),
        threadgroup=(4, 4, 1),
        output_shapes=[(7, 5)],
        output_dtypes=[mx.float32],
        init_value=0.0,
    )
    np.testing.assert_array_equal(np.array(out), a.astype(np.float64).T * 0.5 + 2)


LANGUAGE = """
uint i = thread_position_in_grid.x;
float x = inp[i];
half h = 0.5h;
half2 hv = half2(1.0f, 2.0f);
float4 f4 = float4(x, 2.0f, 3.0f, 4.0f);
bfloat b = x;
out[i * 10 + 0] = simd_shuffle_down(x, 1);
out[i * 10 + 1] = simd_shuffle_up(x, 2);
out[i * 10 + 2] = simd_prefix_exclusive_sum(x) + 1000.0f * simd_prefix_inclusive_sum(x);
out[i * 10 + 3] = simd_min(x) + 1000.0f * simd_max(x);
out[i * 10 + 4] = float(simd_sum(int(i)));
out[i * 10 + 5] = simd_product((i % 32) < 3 ? 2.0f : 1.0f) + simd_broadcast(x, 5) * 10.0f;
simdgroup_barrier(mem_flags::mem_threadgroup);
out[i * 10 + 6] = float(h) + float(hv.y) + f4.wzyx.x + float(b);
half hp = half(x * 0.001f) * half(3.0f);  // one half operation, stored: rounded as Metal rounds it
out[i * 10 + 7] = float(hp);
out[i * 10 + 8] = simd_shuffle_xor(float4(x).y, 1u) + simd_shuffle(float(uint(x)), 0);
out[i * 10 + 9] = float(bfloat(x * 1.001f));
"""


def test_language_features_match_float64_truth():
    kernel = metal_kernel(name="language", input_names=["inp"], output_names=["out"], source=LANGUAGE)
    n = 64
    x = np.arange(n, dtype=np.float32)
    (out,) = kernel(
        inputs=[mx.array(x)],
        grid=(n, 1, 1),
        threadgroup=(n, 1, 1),
        output_shapes=[(n * 10,)],
        output_dtypes=[mx.float32],
    )
    got = np.array(out).reshape(n, 10)
    xd = x.astype(np.float64).reshape(2, 32)
    lane = np.arange(32)
    down = np.where(lane + 1 < 32, xd[:, np.minimum(lane + 1, 31)], xd)
    up = np.where(lane >= 2, xd[:, np.maximum(lane - 2, 0)], xd)
    excl, incl = np.cumsum(xd, axis=1) - xd, np.cumsum(xd, axis=1)
    sums = np.arange(n).reshape(2, 32).sum(axis=1, keepdims=True)
    bf16 = (x * np.float32(1.001)).view(np.uint32)
    bf16 = (((bf16 + 0x7FFF + ((bf16 >> 16) & 1)) >> 16) << 16).view(np.float32)
    want = np.stack(
        [
            down.reshape(-1),
            up.reshape(-1),
            (excl + 1000 * incl).reshape(-1),
            np.repeat(xd.min(axis=1) + 1000 * xd.max(axis=1), 32),
            np.repeat(sums, 32),
            np.repeat(8.0 + 10 * xd[:, 5], 32),
            0.5 + 2.0 + 4.0 + x,
            (np.float16(x * np.float32(0.001)) * np.float16(3.0)).astype(np.float16).astype(np.float64),
            xd[:, lane ^ 1].reshape(-1) + np.repeat(xd[:, 0], 32),
            bf16,
        ],
        axis=-1,
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", NOT_EMULATED)
def test_each_builtin_not_emulated_gets_the_distinct_message(name):
    with pytest.raises(
        MetalCompileError, match=f"`{name}` \\(line 2\\) is a Metal built-in not emulated by the workbench"
    ):
        refuse_not_emulated(f"// {name} in a comment is fine\nauto v = {name}(x);\n")


def test_the_drop_in_refuses_a_builtin_not_emulated_by_name():
    kernel = metal_kernel(name="quad", input_names=["inp"], output_names=["out"], source="out[0] = quad_sum(inp[0]);")
    with pytest.raises(MetalCompileError, match="`quad_sum`.*not emulated by the workbench"):
        kernel(
            inputs=[mx.zeros((1,))],
            grid=(1, 1, 1),
            threadgroup=(1, 1, 1),
            output_shapes=[(1,)],
            output_dtypes=[mx.float32],
        )
