"""The quantized product of several rows where MLX's CUDA back-end gets it wrong.

MLX 0.32.4's CUDA ``quantized_matmul`` is wrong for more than one row of x when the in
dimension is one group long (``fold.weights.cuda_quantized_rows_wrong``);
``fold.weights.quantized_matmul``, which ``matvec_base`` and the real-model graphs call, then
runs the product on MLX's CPU. These tests hold the rule's cases, the product's value
on a route through the CPU (on any machine) and, on a CUDA GPU, the product against MLX's
CPU for the shapes the rule covers and some it leaves on the GPU.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends
from workbench.fold import weights


@pytest.mark.parametrize(
    "in_dim,group,rows,wrong",
    [
        (64, 64, 3, True),
        (64, 64, 2, True),
        (128, 128, 2, True),
        (64, 64, 1, False),  # one row is right
        (128, 64, 3, False),
        (64, 32, 3, False),
        (32, 32, 3, False),  # right on the H200
    ],
)
def test_the_rule_names_the_shapes_seen_wrong(in_dim, group, rows, wrong):
    assert weights.cuda_quantized_rows_wrong(in_dim, group, rows) is wrong


def _matrix(out_dim: int, in_dim: int, group: int) -> weights.WeightMatrix:
    w = np.random.default_rng(in_dim + out_dim).standard_normal((out_dim, in_dim)).astype(np.float32)
    return weights.WeightMatrix.quantize(mx.array(w), bits=4, group_size=group)


@pytest.mark.parametrize(
    "shape,routed", [((3, 64), True), ((3, 1, 64), True), ((1, 2, 64), True), ((64,), False), ((1, 64), False)]
)
def test_the_cpu_route_gives_the_same_product(monkeypatch, shape, routed):
    """Routed through MLX's CPU (as on a CUDA GPU) several rows give the product MLX's CPU
    computes; one row stays on the default device, whatever the rule's switch says."""
    m = _matrix(128, 64, 64)
    x = mx.array(np.random.default_rng(1).standard_normal(shape).astype(np.float32))
    with mx.stream(mx.cpu if routed else mx.default_device()):
        want = np.array(m.matvec_base(x))
    monkeypatch.setattr(backends, "cuda_is_default", lambda: True)
    got = np.array(m.matvec_base(x))
    np.testing.assert_array_equal(got, want)
    assert got.shape == (*shape[:-1], 128)


@pytest.mark.cuda
@pytest.mark.skipif(not backends.cuda_is_default(), reason="needs MLX's default device to be a CUDA GPU")
@pytest.mark.parametrize("in_dim,group", [(64, 64), (128, 64), (64, 32)])
def test_on_a_cuda_gpu_several_rows_agree_with_the_cpu(in_dim, group):
    m = _matrix(128, in_dim, group)
    x = mx.array(np.random.default_rng(2).standard_normal((3, in_dim)).astype(np.float32))
    got = np.array(m.matvec_base(x))
    with mx.stream(mx.cpu):
        want = np.array(m.matvec_base(x))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_the_route_holds_inside_a_compiled_graph(monkeypatch):
    """The graph tail traces its products with mx.compile: the routed product traces too,
    and gives the plain product's bits (on MLX's CPU both are the CPU's)."""
    w = mx.array(np.random.default_rng(3).standard_normal((128, 64)).astype(np.float32))
    wq, scales, biases = mx.quantize(w, group_size=64, bits=4)
    x = mx.array(np.random.default_rng(4).standard_normal((3, 64)).astype(np.float32))
    with mx.stream(mx.cpu):
        want = np.array(mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=64, bits=4))
    monkeypatch.setattr(backends, "cuda_is_default", lambda: True)
    routed = mx.compile(lambda v: weights.quantized_matmul(v, wq, scales, biases, group_size=64, bits=4) + 0.0)
    np.testing.assert_array_equal(np.array(routed(x)), want)
