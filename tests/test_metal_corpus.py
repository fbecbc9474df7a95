"""A corpus of small Metal kernels written as users write them for ``mx.fast.metal_kernel``
(body only, MLX generates the signature; ``metal`` names unqualified, as MLX's preamble
allows), each run through the drop-in ``workbench.metal_kernel`` on the CPU in EVERY
schedule of the emulator (``order="every"``: SIMD-groups in step and apart, outputs
compared bit for bit) and checked against a numpy float64 oracle; and each with planted
bugs of the kinds users make -- a missing barrier between SIMD-groups, an out-of-bounds
index, a lane that skips (or is left out of) a reduction -- every one of which must be
caught: as an emulator error (a guard-page fault, a divergent barrier or SIMD-group
operation), as schedules that disagree, or as a result numpy refutes.

Tolerances: float32 reductions of at most 1,000 terms against float64, so a relative
error of 1e-5 of the row's scale is ~10x above float32 rounding (2^-24 x sqrt(terms) x a
few) and far below what the planted bugs do (NaN from unwritten group memory, a missing
partial sum, a wrong maximum).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends
from workbench.kernels import metal_emulation as ME
from workbench.kernels.metal_drop_in import GridWarning, metal_kernel

pytestmark = pytest.mark.skipif(backends.clang() is None, reason="the Metal emulator needs clang++")

BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup);"


def _plant(source: str, old: str, new: str) -> str:
    """``source`` with ``old`` (there exactly once, so a bug cannot silently stop being
    planted when the kernel changes) replaced by ``new``."""
    assert source.count(old) == 1, f"{old!r} is in the kernel {source.count(old)} times, not once"
    return source.replace(old, new)


def _caught(run, oracle: np.ndarray, rtol: float) -> str:
    """How a planted bug was caught: 'emulator' (an EmulationError other than schedules
    disagreeing), 'schedules', or 'numpy'; fails when it was not caught at all."""
    try:
        out = run()
    except ME.ScheduleDependenceError:
        return "schedules"
    except ME.EmulationError:
        return "emulator"
    bad = not np.allclose(out, oracle, rtol=0, atol=rtol * max(1.0, float(np.abs(oracle).max())), equal_nan=False)
    assert bad, "the planted bug was not caught: same bits in every schedule, within tolerance of numpy"
    return "numpy"


# -- MLX's documentation example, as the docs show it ----------------------------------------


def test_the_docs_exp_example_runs_as_written_in_float16():
    """Custom Metal Kernels, "Simple Example": the kernel built once, called from a
    function, with a float16 input of shape (4, 16) and a grid of a.size threads in groups
    of 256 -- a grid smaller than its group, which Metal runs as one partial group (and the
    drop-in warns about, as a grid given in groups would look the same)."""
    source = """
        uint elem = thread_position_in_grid.x;
        T tmp = inp[elem];
        out[elem] = metal::exp(tmp);
    """
    kernel = metal_kernel(name="myexp", input_names=["inp"], output_names=["out"], source=source)

    def exp_elementwise(a: mx.array) -> mx.array:
        outputs = kernel(
            inputs=[a],
            template=[("T", mx.float32)],
            grid=(a.size, 1, 1),
            threadgroup=(256, 1, 1),
            output_shapes=[a.shape],
            output_dtypes=[a.dtype],
            order="every",
        )
        return outputs[0]

    a = mx.array(np.random.default_rng(0).standard_normal((4, 16)).astype(np.float16))
    with pytest.warns(GridWarning, match="smaller than threadgroup"):
        b = exp_elementwise(a)
    assert b.dtype == mx.float16 and b.shape == (4, 16)
    # float64 oracle rounded to float16: float exp (1 ulp of float) then one rounding to
    # half is the correctly rounded half except at near-ties, so at most 1 ulp of half.
    truth = np.exp(np.array(a).astype(np.float64))
    got = np.array(b).astype(np.float64)
    half_ulp = np.spacing(truth.astype(np.float16)).astype(np.float64)
    assert (np.abs(got - truth) <= half_ulp).all()


def test_half_conversions_round_to_nearest_even_as_numpy():
    """float -> half in the stand-in header (software, clang 14 has no _Float16) against
    numpy's float16 on ties, subnormals, overflow and random values; half -> float exactly."""
    rng = np.random.default_rng(1)
    special = np.array(
        [
            0.0,
            -0.0,
            1.0,
            65504.0,
            65519.99,
            65520.0,
            1e6,
            -1e6,
            2.0**-24,
            2.0**-25,
            1.5 * 2.0**-25,
            2.0**-14,
            2.0**-14 - 2.0**-25,
            1.0 + 2.0**-11,
            1.0 + 3 * 2.0**-11,
            np.inf,
            -np.inf,
            5.96e-8,
            6.1e-5,
            -3.0e-6,
        ],
        np.float32,
    )
    x = np.concatenate([special, rng.standard_normal(2000).astype(np.float32) * 10.0 ** rng.integers(-8, 5, 2000)])
    x = x.astype(np.float32)
    n = x.size
    src = "uint i = thread_position_in_grid.x; if (i < N) { h[i] = x[i]; back[i] = float(h[i]); }"
    kernel = metal_kernel(name="to_half", input_names=["x"], output_names=["h", "back"], source=src)
    groups = -(-n // 256)
    h, back = kernel(
        inputs=[mx.array(x)],
        template=[("N", n)],
        grid=(groups * 256, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[(n,), (n,)],
        output_dtypes=[mx.float16, mx.float32],
    )
    with np.errstate(over="ignore"):  # 1e6 and 65520 overflow to infinity, as in the kernel
        want = x.astype(np.float16)
    assert np.array_equal(np.array(h).view(np.uint16), want.view(np.uint16))
    assert np.array_equal(np.array(back), want.astype(np.float32))


# -- an elementwise op with exp ---------------------------------------------------------------

SILU = """
    uint i = thread_position_in_grid.x;
    if (i >= N) {
        return;
    }
    float v = x[i];
    y[i] = v / (1.0f + exp(-v));
"""
SILU_N = 1000


def _silu(source: str, name: str) -> np.ndarray:
    kernel = metal_kernel(name=name, input_names=["x"], output_names=["y"], source=source)
    x = np.linspace(-20, 20, SILU_N, dtype=np.float32)
    (y,) = kernel(
        inputs=[mx.array(x)],
        template=[("N", SILU_N)],
        grid=(4 * 256, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[(SILU_N,)],
        output_dtypes=[mx.float32],
        order="every",
    )
    return np.array(y)


def _silu_oracle() -> np.ndarray:
    x = np.linspace(-20, 20, SILU_N, dtype=np.float32).astype(np.float64)
    return x / (1.0 + np.exp(-x))


def test_silu_matches_numpy_in_every_schedule():
    # exp within 1 ulp, one add, one divide: a few ulp of float32 relative to the value
    np.testing.assert_allclose(_silu(SILU, "silu"), _silu_oracle(), rtol=1e-6, atol=1e-30)


def test_silu_without_its_bounds_check_faults_past_the_end():
    bad = _plant(SILU, "if (i >= N) {\n        return;\n    }", "")
    with pytest.raises(ME.EmulationError, match="memory fault"):
        _silu(bad, "silu_unbounded")


# -- a row softmax with simd_max / simd_sum and a reduction across SIMD-groups -----------------

SOFTMAX = """
    uint row = threadgroup_position_in_grid.x;
    uint tid = thread_position_in_threadgroup.x;
    uint lane = thread_index_in_simdgroup;
    uint sg = simdgroup_index_in_threadgroup;
    threadgroup float red[TG / 32];
    const device float* xr = x + row * N;

    float m = -3.0e38f;
    for (uint i = tid; i < N; i += TG) {
        m = max(m, xr[i]);
    }
    m = simd_max(m);
    if (lane == 0) {
        red[sg] = m;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    m = red[0];
    for (uint s = 1; s < TG / 32; ++s) {
        m = max(m, red[s]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // every max read before red is reused

    float sum = 0.0f;
    for (uint i = tid; i < N; i += TG) {
        sum += exp(xr[i] - m);
    }
    sum = simd_sum(sum);
    if (lane == 0) {
        red[sg] = sum;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    sum = 0.0f;
    for (uint s = 0; s < TG / 32; ++s) {
        sum += red[s];
    }
    for (uint i = tid; i < N; i += TG) {
        y[row * N + i] = exp(xr[i] - m) / sum;
    }
"""
SM_ROWS, SM_N, SM_TG = 3, 300, 128


def _softmax_x() -> np.ndarray:
    return (np.random.default_rng(2).standard_normal((SM_ROWS, SM_N)) * 3.0).astype(np.float32)


def _softmax(source: str, name: str) -> np.ndarray:
    kernel = metal_kernel(name=name, input_names=["x"], output_names=["y"], source=source)
    (y,) = kernel(
        inputs=[mx.array(_softmax_x())],
        template=[("N", SM_N), ("TG", SM_TG)],
        grid=(SM_ROWS * SM_TG, 1, 1),
        threadgroup=(SM_TG, 1, 1),
        output_shapes=[(SM_ROWS, SM_N)],
        output_dtypes=[mx.float32],
        order="every",
        seed=5,
    )
    return np.array(y)


def _softmax_oracle() -> np.ndarray:
    x = _softmax_x().astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_softmax_matches_numpy_in_every_schedule():
    np.testing.assert_allclose(_softmax(SOFTMAX, "softmax"), _softmax_oracle(), rtol=1e-5, atol=0)


@pytest.mark.parametrize(
    "bug, old, new, how",
    [
        # a SIMD-group that runs ahead overwrites red[] with its sum while another still reads
        # the maxima: invisible with the SIMD-groups in step (all read before any reaches simd_sum)
        (
            "missing-barrier-between-simd-groups",
            "threadgroup_barrier(mem_flags::mem_threadgroup);  // every max read before red is reused",
            "",
            {"schedules", "numpy"},
        ),
        (
            "missing-barrier-before-reading-partials",
            "    }\n    threadgroup_barrier(mem_flags::mem_threadgroup);\n    m = red[0];",
            "    }\n    m = red[0];",
            {"schedules", "numpy"},
        ),
        (
            "reads-one-past-the-row",
            "for (uint i = tid; i < N; i += TG) {\n        m = max(m, xr[i]);",
            "for (uint i = tid; i <= N; i += TG) {\n        m = max(m, xr[i]);",
            {"emulator"},
        ),
        (
            "idle-lanes-return-before-the-reduction",
            "    float m = -3.0e38f;",
            "    if (tid >= N - 2 * TG) {\n        return;\n    }\n    float m = -3.0e38f;",
            {"emulator"},
        ),
        (
            "last-simd-group-left-out-of-the-sum",
            "for (uint s = 0; s < TG / 32; ++s) {\n        sum += red[s];",
            "for (uint s = 0; s < TG / 32 - 1; ++s) {\n        sum += red[s];",
            {"numpy"},
        ),
    ],
)
def test_softmax_planted_bugs_are_caught(bug, old, new, how):
    got = _caught(
        lambda: _softmax(_plant(SOFTMAX, old, new), "softmax_" + bug.replace("-", "_")), _softmax_oracle(), 1e-5
    )
    assert got in how, f"{bug}: caught by {got}, expected {how}"


# -- an RMS norm with a threadgroup tree reduction ---------------------------------------------

RMS = """
    uint row = threadgroup_position_in_grid.x;
    uint tid = thread_position_in_threadgroup.x;
    threadgroup float sums[TG];
    float acc = 0.0f;
    for (uint i = tid; i < N; i += TG) {
        float v = x[row * N + i];
        acc += v * v;
    }
    sums[tid] = acc;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = TG / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sums[tid] += sums[tid + s];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    float inv = rsqrt(sums[0] / N + eps);
    for (uint i = tid; i < N; i += TG) {
        y[row * N + i] = x[row * N + i] * inv * w[i];
    }
"""
RMS_ROWS, RMS_N, RMS_TG, RMS_EPS = 4, 1000, 256, 1e-5


def _rms_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return rng.standard_normal((RMS_ROWS, RMS_N)).astype(np.float32), (1 + 0.1 * rng.standard_normal(RMS_N)).astype(
        np.float32
    )


def _rms(source: str, name: str, math_mode: str = "host") -> np.ndarray:
    x, w = _rms_inputs()
    kernel = metal_kernel(name=name, input_names=["x", "w", "eps"], output_names=["y"], source=source)
    (y,) = kernel(
        inputs=[mx.array(x), mx.array(w), mx.array(np.float32(RMS_EPS))],
        template=[("N", RMS_N), ("TG", RMS_TG)],
        grid=(RMS_ROWS * RMS_TG, 1, 1),
        threadgroup=(RMS_TG, 1, 1),
        output_shapes=[(RMS_ROWS, RMS_N)],
        output_dtypes=[mx.float32],
        order="every",
        seed=2,
        math_mode=math_mode,
    )
    return np.array(y)


def _rms_oracle() -> np.ndarray:
    x, w = (a.astype(np.float64) for a in _rms_inputs())
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + RMS_EPS) * w


@pytest.mark.parametrize("math_mode", ME.MATH_MODES)
def test_rms_norm_matches_numpy_in_every_schedule_and_math_mode(math_mode):
    np.testing.assert_allclose(_rms(RMS, "rms_norm", math_mode), _rms_oracle(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "bug, old, new, how",
    [
        (
            "missing-barrier-inside-the-tree",
            "        }\n        threadgroup_barrier(mem_flags::mem_threadgroup);\n    }",
            "        }\n    }",
            {"schedules", "numpy"},
        ),
        (
            "missing-barrier-before-the-tree",
            "    sums[tid] = acc;\n    threadgroup_barrier(mem_flags::mem_threadgroup);",
            "    sums[tid] = acc;",
            {"schedules", "numpy"},
        ),
        (
            "reads-one-past-the-row",
            "    for (uint i = tid; i < N; i += TG) {\n        float v",
            "    for (uint i = tid; i <= N; i += TG) {\n        float v",
            {"emulator"},
        ),
        (
            "last-lane-left-out-of-the-tree",
            "for (uint s = TG / 2; s > 0; s >>= 1)",
            "for (uint s = TG / 2; s > 1; s >>= 1)",
            {"numpy"},
        ),
    ],
)
def test_rms_norm_planted_bugs_are_caught(bug, old, new, how):
    got = _caught(lambda: _rms(_plant(RMS, old, new), "rms_" + bug.replace("-", "_")), _rms_oracle(), 1e-5)
    assert got in how, f"{bug}: caught by {got}, expected {how}"


# -- a matvec with x shared in threadgroup memory, tile by tile --------------------------------

MATVEC = """
    uint row = thread_position_in_grid.x;
    uint tid = thread_position_in_threadgroup.x;
    threadgroup float xs[TILE];
    float acc = 0.0f;
    for (uint k0 = 0; k0 < K; k0 += TILE) {
        for (uint j = tid; j < TILE; j += TG) {
            xs[j] = k0 + j < K ? x[k0 + j] : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        uint n = K - k0 < TILE ? K - k0 : TILE;
        for (uint j = 0; j < n; ++j) {
            acc += W[row * K + k0 + j] * xs[j];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    y[row] = acc;
"""
MV_M, MV_K, MV_TG, MV_TILE = 192, 320, 64, 128


def _mv_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    return rng.standard_normal((MV_M, MV_K)).astype(np.float32), rng.standard_normal(MV_K).astype(np.float32)


def _matvec(source: str, name: str) -> np.ndarray:
    w, x = _mv_inputs()
    kernel = metal_kernel(name=name, input_names=["W", "x"], output_names=["y"], source=source)
    (y,) = kernel(
        inputs=[mx.array(w), mx.array(x)],
        template=[("K", MV_K), ("TG", MV_TG), ("TILE", MV_TILE)],
        grid=(MV_M, 1, 1),
        threadgroup=(MV_TG, 1, 1),
        output_shapes=[(MV_M,)],
        output_dtypes=[mx.float32],
        order="every",
        seed=9,
    )
    return np.array(y)


def _mv_oracle() -> np.ndarray:
    w, x = _mv_inputs()
    return w.astype(np.float64) @ x.astype(np.float64)


def test_matvec_matches_numpy_in_every_schedule():
    np.testing.assert_allclose(_matvec(MATVEC, "matvec"), _mv_oracle(), rtol=0, atol=1e-5 * np.abs(_mv_oracle()).max())


@pytest.mark.parametrize(
    "bug, old, new, how",
    [
        (
            "missing-barrier-before-the-next-tile",
            "        }\n        threadgroup_barrier(mem_flags::mem_threadgroup);\n    }",
            "        }\n    }",
            {"schedules", "numpy"},
        ),
        (
            "missing-barrier-after-loading-the-tile",
            "        }\n        threadgroup_barrier(mem_flags::mem_threadgroup);\n        uint n",
            "        }\n        uint n",
            {"schedules", "numpy"},
        ),
        ("tile-loaded-past-the-end-of-x", "xs[j] = k0 + j < K ? x[k0 + j] : 0.0f;", "xs[j] = x[k0 + j];", {"emulator"}),
    ],
)
def test_matvec_planted_bugs_are_caught(bug, old, new, how):
    got = _caught(lambda: _matvec(_plant(MATVEC, old, new), "matvec_" + bug.replace("-", "_")), _mv_oracle(), 1e-5)
    assert got in how, f"{bug}: caught by {got}, expected {how}"


# -- an atomic histogram: a per-group histogram in threadgroup memory, then device atomics ------

HISTOGRAM = """
    uint i = thread_position_in_grid.x;
    uint tid = thread_position_in_threadgroup.x;
    threadgroup atomic<uint> local[BINS];
    for (uint b = tid; b < BINS; b += TG) {
        atomic_store_explicit(&local[b], 0u, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (i < N) {
        uint b = uint(x[i] * BINS);
        b = b < BINS ? b : BINS - 1;
        atomic_fetch_add_explicit(&local[b], 1u, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint b = tid; b < BINS; b += TG) {
        uint c = atomic_load_explicit(&local[b], memory_order_relaxed);
        if (c > 0) {
            atomic_fetch_add_explicit(&hist[b], c, memory_order_relaxed);
        }
    }
"""
H_N, H_BINS, H_TG = 3000, 48, 128


def _h_x() -> np.ndarray:
    x = np.random.default_rng(6).random(H_N).astype(np.float32)
    x[::97] = 1.0  # the top edge: the clamp puts it in the last bin
    return x


def _histogram(source: str, name: str) -> np.ndarray:
    kernel = metal_kernel(name=name, input_names=["x"], output_names=["hist"], source=source, atomic_outputs=True)
    groups = -(-H_N // H_TG)
    (h,) = kernel(
        inputs=[mx.array(_h_x())],
        template=[("N", H_N), ("BINS", H_BINS), ("TG", H_TG)],
        grid=(groups * H_TG, 1, 1),
        threadgroup=(H_TG, 1, 1),
        output_shapes=[(H_BINS,)],
        output_dtypes=[mx.uint32],
        init_value=0,
        order="every",
        seed=4,
    )
    return np.array(h)


def _h_oracle() -> np.ndarray:
    x = _h_x().astype(np.float64)
    return np.bincount(np.minimum((x * H_BINS).astype(np.int64), H_BINS - 1), minlength=H_BINS)


def test_atomic_histogram_matches_numpy_exactly_in_every_schedule():
    np.testing.assert_array_equal(_histogram(HISTOGRAM, "histogram"), _h_oracle())


@pytest.mark.parametrize(
    "bug, old, new, how",
    [
        (
            "missing-barrier-after-zeroing",
            "    }\n    threadgroup_barrier(mem_flags::mem_threadgroup);\n    if (i < N)",
            "    }\n    if (i < N)",
            {"schedules", "numpy"},
        ),
        (
            "missing-barrier-before-flushing",
            "    }\n    threadgroup_barrier(mem_flags::mem_threadgroup);\n    for (uint b",
            "    }\n    for (uint b",
            {"schedules", "numpy"},
        ),
        ("bin-index-not-clamped", "        b = b < BINS ? b : BINS - 1;\n", "", {"emulator"}),
    ],
)
def test_atomic_histogram_planted_bugs_are_caught(bug, old, new, how):
    got = _caught(
        lambda: _histogram(_plant(HISTOGRAM, old, new), "histogram_" + bug.replace("-", "_")), _h_oracle(), 0.0
    )
    assert got in how, f"{bug}: caught by {got}, expected {how}"


def test_a_float_atomic_sum_depends_on_the_schedule_and_is_reported():
    """Float atomics add in the order threads arrive, so the rounding follows the schedule
    (as it follows the GPU's timing): the emulator reports the dependence instead of
    returning one schedule's bits as the answer."""
    src = "uint i = thread_position_in_grid.x; atomic_fetch_add_explicit(&total[0], x[i], memory_order_relaxed);"
    kernel = metal_kernel(
        name="float_atomic_sum", input_names=["x"], output_names=["total"], source=src, atomic_outputs=True
    )
    x = (np.random.default_rng(8).standard_normal(1024) * 1e3).astype(np.float32)
    with pytest.raises(ME.ScheduleDependenceError, match=r"output 'total' differs .* first at index \(0,\)"):
        kernel(
            inputs=[mx.array(x)],
            grid=(1024, 1, 1),
            threadgroup=(256, 1, 1),
            output_shapes=[(1,)],
            output_dtypes=[mx.float32],
            init_value=0.0,
            order="every",
            seed=1,
        )


def test_the_softmax_race_between_simd_groups_needs_the_apart_schedules():
    """The first planted softmax bug, schedule by schedule: with the SIMD-groups in step every
    thread order gives the same bits and matches numpy (every SIMD-group reads the maxima
    before any reaches simd_sum); run apart, each schedule's result is wrong."""
    src = _plant(
        SOFTMAX, "threadgroup_barrier(mem_flags::mem_threadgroup);  // every max read before red is reused", ""
    )
    kernel = metal_kernel(name="softmax_race", input_names=["x"], output_names=["y"], source=src)
    outs = {}
    for order in ME.SCHEDULES:
        (y,) = kernel(
            inputs=[mx.array(_softmax_x())],
            template=[("N", SM_N), ("TG", SM_TG)],
            grid=(SM_ROWS * SM_TG, 1, 1),
            threadgroup=(SM_TG, 1, 1),
            output_shapes=[(SM_ROWS, SM_N)],
            output_dtypes=[mx.float32],
            order=order,
            seed=5,
        )
        outs[order] = np.array(y)
    in_step = {outs[o].tobytes() for o in ME.ORDERS}
    assert len(in_step) == 1
    np.testing.assert_allclose(outs["ascending"], _softmax_oracle(), rtol=1e-5, atol=0)
    for order in ME.APART:
        assert not np.allclose(outs[order], _softmax_oracle(), rtol=1e-5, atol=0), order
