"""The exact oracle of the kernel checks: numpy dequantization, the float64 tail, the tolerance rule."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import tail as T
from workbench.fold.weights import WeightMatrix
from workbench.studies.exact_oracle import (
    dequantize_exact,
    host_tail_exact,
    nice_ceil,
    oracle_tolerance,
    tolerance_for,
)
from workbench.tail.comparison import compare
from workbench.tail.frink_case import seed_case


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_exact_dequantization_matches_mlx_with_float32_scales(group_size: int):
    w = WeightMatrix.quantize(
        np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32), bits=4, group_size=group_size
    )
    np.testing.assert_allclose(dequantize_exact(w), w.dense(np.float64), rtol=0, atol=1e-6)


def test_a_dense_matrix_is_its_own_weights():
    a = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_array_equal(dequantize_exact(WeightMatrix(a)), a.astype(np.float64))


def test_every_mlx_quantization_mode_is_unpacked():
    """mxfp4 / nvfp4 / mxfp8 as well as affine (tests/test_kernel_formats.py checks each against
    mx.dequantize bit for bit): a matrix of -1.5 and 3 comes back exactly in each microscaling
    format (both are codes times a power of two; affine's scale 4.5/255 is not exact)."""
    a = np.tile(np.array([-1.5, 3.0], np.float32), (8, 32))
    for mode, bits, gs in (("mxfp4", 4, 32), ("nvfp4", 4, 16), ("mxfp8", 8, 32)):
        w = WeightMatrix.quantize(a, mode=mode, bits=bits, group_size=gs)
        np.testing.assert_array_equal(dequantize_exact(w), a.astype(np.float64), err_msg=mode)


def test_the_seed_case_is_held_to_2e_4():
    c = seed_case()
    truth = host_tail_exact(c.weights, c.branch, c.residual)
    np.testing.assert_array_equal(truth, T.host_tail(c.weights, c.branch, c.residual))  # no quantization: the same
    tol, f32_worst = tolerance_for(c.weights, c.branch, c.residual, truth)
    assert tol == 2e-4 and 0 < f32_worst < 1e-4


def test_a_quantized_tail_uses_the_exact_weights():
    w = T.TailWeights.random(
        64, 128, 128, seed=3, fold_block=128, dtype="bfloat16", quantize={"mode": "affine", "bits": 4, "group_size": 64}
    )
    br, res = T.random_inputs(w, seed=4)
    exact = host_tail_exact(w, br, res)
    by_mlx = T.host_tail(w, br, res)  # dequantized by MLX with float32 scales: the same map
    assert compare(exact, by_mlx, tol=1e-6).passed


@pytest.mark.parametrize(
    "x,want", [(1.3e-4, 2e-4), (2e-4, 2e-4), (6e-5, 1e-4), (3e-3, 5e-3), (7e-2, 1e-1), (1.0, 1.0), (0.0, 0.0)]
)
def test_nice_ceil_rounds_up_to_1_2_5(x: float, want: float):
    assert nice_ceil(x) == pytest.approx(want, rel=1e-12)


def test_the_tolerance_grows_only_past_the_float32_oracles_own_error():
    assert oracle_tolerance(0.0) == 2e-4
    assert oracle_tolerance(9e-5) == 2e-4
    assert oracle_tolerance(1.3e-4) == pytest.approx(5e-4)
