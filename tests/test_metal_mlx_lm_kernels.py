"""mlx-lm's own Metal kernels as a test corpus: its gated-delta kernels (mlx_lm.models.gated_delta),
built through ``workbench.metal_kernel`` in place of ``mx.fast.metal_kernel`` and launched
exactly as mlx-lm launches them (a grid of (32, Dv, B * Hv) in threadgroups of (32, 4, 1), or
the packed kernel's (32, Dv / 8, B * Hv) in (32, 2, 1); ``T`` a scalar input), in every
schedule, against mlx-lm's own ``gated_delta_ops``.

Tolerance: ``|kernel - ops| <= 4e-6 max(|ops|, 1)`` elementwise, float32 rounding: both sides
compute in float32 and differ only in the order of each Dk-term dot (the kernel's simd_sum
butterfly against MLX's sum), a few ulps a step over a few steps; a wrong index or a missed
term moves results by O(1). Measured worst: 1.8e-7 (y), 8.9e-8 (state).
"""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np
import pytest

from workbench.kernels import metal_emulation
from workbench.kernels.metal_drop_in import metal_kernel

gd = pytest.importorskip("mlx_lm.models.gated_delta")

#: About 32 float32 ulps relative (module docstring: the metric and why).
TOL = 4e-6

pytestmark = pytest.mark.skipif(metal_emulation.clang_path() is None, reason="needs clang++")

#: (has_mask, vectorized) -> the name mlx-lm keeps that kernel under.
VARIANTS = {
    (False, False): "_gated_delta_kernel",
    (True, False): "_gated_delta_kernel_masked",
    (False, True): "_gated_delta_kernel_vec",
    (True, True): "_gated_delta_kernel_vec_masked",
}


@pytest.fixture(scope="module")
def kernels() -> dict[str, object]:
    """mlx-lm's kernel makers run with the drop-in as ``mx.fast.metal_kernel`` (and Metal
    reported available, which the makers ask first); mlx-lm's own source, nothing copied."""
    mp = pytest.MonkeyPatch()
    mp.setattr(mx.metal, "is_available", lambda: True)
    mp.setattr(mx.fast, "metal_kernel", metal_kernel)
    try:
        made = {name: gd._make_gated_delta_kernel(has_mask=m, vectorized=v) for (m, v), name in VARIANTS.items()}
        made["_gated_delta_kernel_packed"] = gd._make_gated_delta_packed_kernel()
    finally:
        mp.undo()
    return made


def _case(dk: int, vectorized: bool, masked: bool, dv: int = 8, seed: int = 0) -> tuple:
    b, t, hk, hv = 1, 3, 1, 2
    rng = np.random.default_rng(seed)

    def a(*shape: int, scale: float = 1.0) -> mx.array:
        return mx.array((scale * rng.standard_normal(shape)).astype(np.float32))

    q, k = a(b, t, hk, dk, scale=dk**-0.5), a(b, t, hk, dk, scale=dk**-0.5)
    v = a(b, t, hv, dv)
    gshape = (b, t, hv, dk) if vectorized else (b, t, hv)
    g = mx.array(rng.uniform(0.5, 1.0, gshape).astype(np.float32))
    beta = mx.array(rng.uniform(0.0, 1.0, (b, t, hv)).astype(np.float32))
    state = a(b, hv, dv, dk, scale=0.5)
    mask = mx.array(np.array([[True, False, True]])) if masked else None
    return q, k, v, g, beta, state, mask


def _close(got: mx.array, want: mx.array) -> float:
    g, w = np.array(got, dtype=np.float64), np.array(want, dtype=np.float64)
    return float(np.max(np.abs(g - w) / np.maximum(np.abs(w), 1.0)))


@pytest.mark.parametrize("order", metal_emulation.SCHEDULES)
@pytest.mark.parametrize("masked, vectorized", list(VARIANTS))
def test_gated_delta_kernels_match_mlx_lm_ops_in_every_schedule(kernels, monkeypatch, masked, vectorized, order):
    for name, k in kernels.items():
        monkeypatch.setattr(gd, name, functools.partial(k, order=order))
    q, k, v, g, beta, state, mask = _case(64, vectorized, masked)
    y, s = gd.gated_delta_kernel(q, k, v, g, beta, state, mask)
    y_ops, s_ops = gd.gated_delta_ops(q, k, v, g, beta, state, mask)
    if masked:  # mlx-lm's ops keep the state where masked; its kernel writes y = 0 there
        y_ops = y_ops * mask[:, :, None, None]
    assert _close(y, y_ops) <= TOL and _close(s, s_ops) <= TOL


@pytest.mark.parametrize("order", metal_emulation.SCHEDULES)
def test_the_packed_gated_delta_kernel_matches_mlx_lm_ops_in_every_schedule(kernels, monkeypatch, order):
    """Dk = 128, scalar gate, no mask: mlx-lm picks its packed kernel (eight value rows a
    SIMD-group, an explicit shuffle_xor butterfly)."""
    for name, k in kernels.items():
        monkeypatch.setattr(gd, name, functools.partial(k, order=order))
    q, k, v, g, beta, state, _ = _case(128, False, False, dv=16)
    y, s = gd.gated_delta_kernel(q, k, v, g, beta, state)
    y_ops, s_ops = gd.gated_delta_ops(q, k, v, g, beta, state)
    assert _close(y, y_ops) <= TOL and _close(s, s_ops) <= TOL


def test_the_default_order_runs_mlx_lm_s_call_unchanged(kernels, monkeypatch):
    """MLX's call signature, no option: the drop-in's default (two schedules compared)."""
    monkeypatch.setattr(gd, "_gated_delta_kernel", kernels["_gated_delta_kernel"])
    q, k, v, g, beta, state, _ = _case(64, False, False)
    y, s = gd.gated_delta_kernel(q, k, v, g, beta, state)
    assert _close(y, gd.gated_delta_ops(q, k, v, g, beta, state)[0]) <= TOL


@pytest.mark.parametrize("state_in", ["float32", "the inputs' dtype"])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bfloat16", "float16"])
def test_the_kernels_run_in_bfloat16_and_float16_as_models_call_them(kernels, monkeypatch, dtype, state_in):
    """mlx-lm's kernels with bfloat16 or float16 inputs (a model's dtype; the state float32 or
    the same dtype), all six schedules compared bit for bit (``order="every"``), against
    mlx-lm's ops on the same inputs. Both compute in float32 and round y (and a low-precision
    state, at every step) to the dtype, so a float32 ulp of difference can flip one rounding:
    a float32 state within TOL, y and a low-precision state within 2 ulps of the dtype at 1
    (eps), relative to max(|ops|, 1). Measured worst: 1 eps (state), eps / 2 (y)."""
    for name, k in kernels.items():
        monkeypatch.setattr(gd, name, functools.partial(k, order="every"))
    eps = 2.0**-7 if dtype == mx.bfloat16 else 2.0**-10
    for dk, vectorized, masked, dv in [(64, False, False, 8), (64, True, True, 8), (128, False, False, 16)]:
        q, k, v, g, beta, state, mask = _case(dk, vectorized, masked, dv=dv)
        q, k, v, g, beta = (x.astype(dtype) for x in (q, k, v, g, beta))
        state = state.astype(mx.float32 if state_in == "float32" else dtype)
        y, s = gd.gated_delta_kernel(q, k, v, g, beta, state, mask)
        y_ops, s_ops = gd.gated_delta_ops(q, k, v, g, beta, state, mask)
        if masked:
            y_ops = y_ops * mask[:, :, None, None]
        assert y.dtype == dtype and s.dtype == state.dtype
        f32 = functools.partial(mx.astype, dtype=mx.float32)
        assert _close(f32(y), f32(y_ops)) <= 2 * eps
        assert _close(f32(s), f32(s_ops)) <= (TOL if state_in == "float32" else 2 * eps)
