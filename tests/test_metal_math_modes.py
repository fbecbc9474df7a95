"""The emulator's math modes: ``metal::exp``, ``exp2`` and ``rsqrt`` as the host computes
them, or as Metal's precise and fast contracts bound them (MSL spec section 8.4: precise
exp/exp2 within 4 ulp, rsqrt correctly rounded; fast exp/exp2 within 3 + floor(|2x|) ulp,
rsqrt within 2 ulp, subnormals flushed to zero), each result at the upper or lower edge of
its bound or at a seeded random point inside it; ``metal::precise::`` and ``metal::fast::``
keep their own mode. The oracle is float64 numpy; a result's error is counted in ulps of
float32 at the true value, which is how the spec states the bounds.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends
from workbench.kernels import metal_emulation as ME
from workbench.kernels.metal_drop_in import metal_kernel

pytestmark = pytest.mark.skipif(backends.clang() is None, reason="the Metal emulator needs clang++")

SOURCE = """
    uint i = thread_position_in_grid.x;
    float v = x[i];
    float p = pos[i];
    e[i] = exp(v);
    e2[i] = exp2(v);
    r[i] = rsqrt(p);
    pe[i] = precise::exp(v);
    fe[i] = fast::exp(v);
"""
N = 2048
NAMES = ["e", "e2", "r", "pe", "fe"]


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.uniform(-20, 20, N).astype(np.float32)
    pos = (10.0 ** rng.uniform(-30, 30, N)).astype(np.float32)
    return x, pos


def _run(mode: str, error: str = "edge-high", seed: int = 0) -> dict[str, np.ndarray]:
    kernel = metal_kernel(name="math_modes", input_names=["x", "pos"], output_names=NAMES, source=SOURCE)
    x, pos = _inputs()
    outs = kernel(
        inputs=[mx.array(x), mx.array(pos)],
        grid=(N, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[(N,)] * 5,
        output_dtypes=[mx.float32] * 5,
        math_mode=mode,
        math_error=error,
        seed=seed,
    )
    return {k: np.array(v) for k, v in zip(NAMES, outs)}


def _ulps(got: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Signed error in ulps of float32 at the true value (normal results only)."""
    ulp = np.ldexp(1.0, np.floor(np.log2(truth)).astype(int) - 23)
    return (got.astype(np.float64) - truth) / ulp


def _truth() -> dict[str, np.ndarray]:
    x, pos = (a.astype(np.float64) for a in _inputs())
    return {"e": np.exp(x), "e2": np.exp2(x), "r": 1.0 / np.sqrt(pos)}


def _bound(fn: str, mode: str) -> np.ndarray:
    x = _inputs()[0].astype(np.float64)
    if fn == "r":
        return np.full(N, 2.0 if mode == "fast" else 0.5)  # correctly rounded: within half an ulp
    return 3.0 + np.floor(np.abs(2.0 * x)) if mode == "fast" else np.full(N, 4.0)


def _normal(t: np.ndarray) -> np.ndarray:
    return (t > np.finfo(np.float32).tiny) & (t < np.finfo(np.float32).max)


@pytest.mark.parametrize("mode", ["precise", "fast"])
@pytest.mark.parametrize("error", ME.MATH_ERRORS)
def test_each_result_lies_within_its_bound_and_at_the_edge_asked_for(mode, error):
    out, truth = _run(mode, error, seed=3), _truth()
    for fn in ("e", "e2", "r"):
        ok = _normal(truth[fn])
        u, b = _ulps(out[fn], truth[fn])[ok], _bound(fn, mode)[ok]
        assert (np.abs(u) <= b + 1e-9).all(), (fn, float(np.max(np.abs(u) - b)))
        if fn == "r" and mode == "precise":
            continue  # correctly rounded: no room to move
        if error == "edge-high":
            assert (u > b - 1.0).all(), fn  # within one ulp of the upper edge
        elif error == "edge-low":
            assert (u < -(b - 1.0)).all(), fn
        else:  # random: spread over the bound, both signs
            assert (u > 0.5).any() and (u < -0.5).any() and np.abs(u).max() > 0.5 * b.max(), fn


def test_host_mode_is_the_host_float_functions():
    out, truth = _run("host"), _truth()
    for fn in ("e", "e2"):
        ok = _normal(truth[fn])
        assert (np.abs(_ulps(out[fn], truth[fn]))[ok] <= 1.0).all(), fn
    x, pos = _inputs()
    assert np.array_equal(out["r"], np.float32(1.0) / np.sqrt(pos))  # 1.0f / sqrtf(x): two roundings


def test_the_random_error_is_a_function_of_seed_and_input_only():
    a, b, c = _run("fast", "random", seed=1), _run("fast", "random", seed=1), _run("fast", "random", seed=2)
    assert all(np.array_equal(a[k], b[k]) for k in NAMES)
    assert not np.array_equal(a["e"], c["e"])


def test_precise_and_fast_namespaces_keep_their_mode_whatever_the_launch():
    host, precise, fast = _run("host", "edge-high"), _run("precise", "edge-high"), _run("fast", "edge-high")
    for launch in (host, precise, fast):
        assert np.array_equal(launch["pe"], precise["e"])
        assert np.array_equal(launch["fe"], fast["e"])


def test_fast_mode_flushes_subnormals():
    src = "uint i = thread_position_in_grid.x; e[i] = exp(x[i]); r[i] = rsqrt(p[i]);"
    kernel = metal_kernel(name="flush", input_names=["x", "p"], output_names=["e", "r"], source=src)
    x = np.array([-100.0, -90.0, 0.0, 1.0], np.float32)  # exp(-100), exp(-90): float32 subnormals
    p = np.array([1e-40, 1e-39, 4.0, 1.0], np.float32)  # subnormal inputs
    args = {
        "inputs": [mx.array(x), mx.array(p)],
        "grid": (4, 1, 1),
        "threadgroup": (4, 1, 1),
        "output_shapes": [(4,), (4,)],
        "output_dtypes": [mx.float32, mx.float32],
    }
    e_fast, r_fast = (np.array(a) for a in kernel(**args, math_mode="fast"))
    e_prec, r_prec = (np.array(a) for a in kernel(**args, math_mode="precise"))
    assert (e_fast[:2] == 0).all() and (e_prec[:2] > 0).all()
    assert np.isinf(r_fast[:2]).all() and np.isfinite(r_prec[:2]).all()
    np.testing.assert_allclose(r_prec[:2], 1.0 / np.sqrt(p[:2].astype(np.float64)), rtol=1e-7)


@pytest.mark.parametrize("mode", ["precise", "fast"])
def test_the_projects_tail_passes_in_both_math_modes_at_every_place_in_the_bounds(mode):
    """frink-models' case through the tail's three Metal launches, exp (SiLU) and rsqrt (the
    norm) at either edge of Metal's bounds or random inside them: within frink-models' 2e-4,
    within 1e-5 (the tail's float32 error is a few 1e-7), and at most 4x the worst error
    with the host's functions (notebook 04 holds the sweep against the calibrated tolerance)."""
    from workbench.kernels.emulated import emulated_tail
    from workbench.studies.exact_oracle import host_tail_exact
    from workbench.tail.comparison import compare
    from workbench.tail.frink_case import SEED_TOL, seed_case
    from workbench.tail.paths import tail_launch

    c = seed_case()
    truth = host_tail_exact(c.weights, c.branch, c.residual)
    host = compare(emulated_tail(tail_launch(c.weights), c.branch, c.residual), truth).worst
    for error in ME.MATH_ERRORS:
        out = emulated_tail(tail_launch(c.weights), c.branch, c.residual, math_mode=mode, math_error=error, seed=5)
        r = compare(out, truth, tol=SEED_TOL)
        assert r.passed and r.worst <= 1e-5, (error, r.worst)
        assert r.worst <= 4 * max(host, 1e-7), (error, r.worst, host)


def test_the_sweep_has_a_row_a_case_and_variant_and_names_bad_arguments():
    from workbench.studies import metal_math_modes as MM

    sweep = MM.math_mode_sweep(1, first_seed=3)
    assert len(sweep) == len(MM.VARIANTS) + 1 and set(sweep["mode"]) == {"host", "precise", "fast", "graph"}
    assert sweep["worst"].between(0, 1e-5).all()
    table = MM.summary(sweep, 1.0)
    assert table["within tolerance"].all() and not MM.summary(sweep, 1e-12)["within tolerance"].any()
    with pytest.raises(ValueError, match="n_cases"):
        MM.math_mode_sweep(0)
    with pytest.raises(ValueError, match="tolerance"):
        MM.summary(sweep, -1.0)
