"""The model's graph tail (weights prepared once, compiled) against the float64 host tail."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench import tail
from workbench.fold.rotation import FoldSite
from workbench.fold.weights import QuantizedBase
from workbench.real_models.graph_tail import model_graph_tail, widen_scales
from workbench.tail.comparison import compare
from workbench.tail.frink_case import SEED_TOL

AFFINE4 = {"mode": "affine", "bits": 4, "group_size": 32}

#: (dtype, quantize, fold_block, fold_site): the stored formats a model hands the tail
CASES = [
    ("float16", AFFINE4, None, FoldSite.INPUT),  # a GGUF's 4-bit matrices, float16 scales
    ("bfloat16", None, None, FoldSite.INPUT),  # a bf16 checkpoint
    ("float32", None, 32, FoldSite.INPUT),  # a folded wo
    ("bfloat16", AFFINE4, 32, FoldSite.OUTPUT),
]


@pytest.mark.parametrize("dtype,quantize,fold_block,site", CASES)
@pytest.mark.parametrize("stack,compiled", [(True, True), (False, True), (True, False)])
def test_the_model_graph_tail_matches_the_float64_host_tail(dtype, quantize, fold_block, site, stack, compiled):
    """frink-models' criterion (|x - y| <= 2e-4 max(|y|, 1), the project's tolerance for a
    float32 tail against float64): the preparation (widening, stacking, the fast norm) keeps
    the map, so it passes with the same margin as the graph tail."""
    w = tail.TailWeights.random(
        64, 96, 128, seed=3, dtype=dtype, quantize=quantize, fold_block=fold_block, fold_site=site
    )
    br, res = tail.random_inputs(w, seed=5, batch=(4,))
    truth = tail.host_tail(w, br, res)
    fn = model_graph_tail(tail.tail_launch(w), stack_gate_up=stack, compiled=compiled)
    rows = np.asarray(fn(mx.array(br.astype(np.float32)), mx.array(res.astype(np.float32))))
    one = np.asarray(fn(mx.array(br[1].astype(np.float32)), mx.array(res[1].astype(np.float32))))
    assert rows.shape == (4, 64) and one.shape == (64,) and rows.dtype == np.float32
    assert compare(rows, truth).passed and compare(one, truth[1]).passed
    graph = np.asarray(
        tail.tail_graph(tail.tail_launch(w), mx.array(br.astype(np.float32)), mx.array(res.astype(np.float32)))
    )
    # the same map as the ops written out, to float32 rounding (not a tolerance of its own:
    # both are float32 tails of the same weights, so they agree far inside 2e-4)
    assert compare(rows, graph, tol=SEED_TOL / 20).passed


def test_widened_scales_are_the_same_map():
    w = tail.TailWeights.random(64, 96, 128, seed=1, dtype="float16", quantize=AFFINE4)
    launch = tail.tail_launch(w)
    wide = widen_scales(launch)
    for old, new in ((launch.wo, wide.wo), (launch.gate, wide.gate), (launch.up, wide.up), (launch.down, wide.down)):
        a, b = old.launch_parts()[0], new.launch_parts()[0]
        assert isinstance(b, QuantizedBase) and a.scales.dtype == mx.float16 and b.scales.dtype == mx.float32
        assert b.biases.dtype == mx.float32 and b.w is a.w
        assert np.array_equal(np.asarray(a.dequantize()), np.asarray(b.dequantize()))


def test_stacking_gate_and_up_gives_the_same_bits_on_this_device():
    """One product over gate and up stacked: each output row is the same dot product, so the
    bits are those of the two products (checked here, on whichever device runs the tests)."""
    w = tail.TailWeights.random(64, 96, 128, seed=2, dtype="float16", quantize=AFFINE4)
    launch = tail.tail_launch(w)
    br, res = tail.random_inputs(w, seed=4)
    b, r = mx.array(br.astype(np.float32)), mx.array(res.astype(np.float32))
    stacked = np.asarray(model_graph_tail(launch, stack_gate_up=True, compiled=False)(b, r))
    apart = np.asarray(model_graph_tail(launch, stack_gate_up=False, compiled=False)(b, r))
    assert np.array_equal(stacked, apart)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"launch": "wo"}, "launch: must be a TailLaunch"),
        ({"stack_gate_up": 1}, "stack_gate_up: must be True or False"),
        ({"compiled": "yes"}, "compiled: must be True or False"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    w = tail.TailWeights.random(64, 96, 128, seed=1)
    args = {"launch": tail.tail_launch(w), **kwargs}
    launch = args.pop("launch")
    with pytest.raises(ValueError, match=match):
        model_graph_tail(launch, **args)
    with pytest.raises(ValueError, match="launch: must be a TailLaunch"):
        widen_scales(w)


def test_tails_of_one_form_share_a_trace_yet_each_runs_its_own_weights():
    """A model's layers have matrices of one form, so their graph tails share one compiled
    function (their weights its inputs): each still computes its own tail (within
    frink-models' criterion of its own float64 tail; the three outputs differ)."""
    from workbench.real_models import graph_tail

    ws = [tail.TailWeights.random(64, 96, 128, seed=s, dtype="float16", quantize=AFFINE4) for s in (11, 12, 13)]
    fns = [model_graph_tail(tail.tail_launch(w)) for w in ws]
    before = graph_tail._shared_rows.cache_info().currsize
    model_graph_tail(tail.tail_launch(ws[0]))
    assert graph_tail._shared_rows.cache_info().currsize == before  # no new function for the same form
    br, res = tail.random_inputs(ws[0], seed=14)
    b, r = mx.array(br.astype(np.float32)), mx.array(res.astype(np.float32))
    outs = [np.asarray(f(b, r)) for f in fns]
    for w, out in zip(ws, outs):
        assert compare(out, tail.host_tail(w, br, res)).passed
    assert not np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[1], outs[2])


def _half_ops_tail(w: tail.TailWeights, br: np.ndarray, res: np.ndarray, act) -> np.ndarray:
    """The tail as mlx-lm's modules compute it for a half-precision model: every activation
    in ``act``, the weights as stored (what ``activations="stored"`` claims to match)."""
    launch = tail.tail_launch(w)

    def product(m, x):
        base, _ = m.launch_parts()
        if isinstance(base, QuantizedBase):
            s = base.spec
            return mx.quantized_matmul(
                x, base.w, base.scales, base.biases, transpose=True, group_size=s.group_size, bits=s.bits, mode=s.mode
            )
        return x @ base.T

    x, r = mx.array(br.astype(np.float32)).astype(act)[None], mx.array(res.astype(np.float32)).astype(act)[None]
    h = r + product(launch.wo, x)
    n = mx.fast.rms_norm(h, launch.ffn_norm.astype(act), launch.eps)
    g, u = product(launch.gate, n), product(launch.up, n)
    return np.asarray((h + product(launch.down, _silu(g) * u))[0].astype(mx.float32))


def _silu(x: mx.array) -> mx.array:
    return x * mx.sigmoid(x)


@pytest.mark.parametrize("dtype,quantize", [("bfloat16", None), ("float16", AFFINE4), ("bfloat16", AFFINE4)])
def test_stored_activations_compute_in_the_weights_dtype_with_half_precisions_error(dtype, quantize):
    """``activations="stored"``: the output in the weights' float dtype, off the float64 tail
    by what half-precision activations cost (far past 2e-4, as mlx-lm's own ops in that
    dtype are: within twice their worst), while the float32 default still passes 2e-4."""
    w = tail.TailWeights.random(128, 128, 256, seed=11, dtype=dtype, quantize=quantize)
    br, res = tail.random_inputs(w, seed=12)
    truth = tail.host_tail(w, br, res)
    launch = tail.tail_launch(w)
    act = getattr(mx, dtype)
    b, r = mx.array(br.astype(np.float32)), mx.array(res.astype(np.float32))
    half = model_graph_tail(launch, activations="stored")(b, r)
    assert half.dtype == act
    full = model_graph_tail(launch)(b, r)
    assert full.dtype == mx.float32 and compare(np.asarray(full), truth, tol=SEED_TOL).passed
    got = compare(np.asarray(half.astype(mx.float32)), truth, tol=SEED_TOL)
    ops = compare(_half_ops_tail(w, br, res, act), truth, tol=SEED_TOL)
    assert not got.passed and not ops.passed  # half precision misses frink-models' 2e-4 either way
    assert got.worst <= 2 * ops.worst, (got, ops)


def test_stored_activations_of_float32_weights_are_the_float32_tail():
    w = tail.TailWeights.random(64, 64, 128, seed=13, dtype="float32")
    br, res = tail.random_inputs(w, seed=14)
    b, r = mx.array(br.astype(np.float32)), mx.array(res.astype(np.float32))
    launch = tail.tail_launch(w)
    assert mx.array_equal(model_graph_tail(launch, activations="stored")(b, r), model_graph_tail(launch)(b, r)).item()


def test_stored_activations_need_one_dtype_and_a_known_name():
    from workbench.real_models.graph_tail import stored_dtype

    w = tail.TailWeights.random(64, 64, 128, seed=15, dtype="bfloat16")
    launch = tail.tail_launch(w)
    assert stored_dtype(launch) == mx.bfloat16
    with pytest.raises(ValueError, match="activations: must be one of"):
        model_graph_tail(launch, activations="bfloat16")
    mixed = tail.TailWeights.random(64, 64, 128, seed=15, dtype="bfloat16")
    import dataclasses

    from workbench.fold.weights import WeightMatrix

    other = dataclasses.replace(tail.tail_launch(mixed), down=WeightMatrix(mx.zeros((64, 128), dtype=mx.float16)))
    with pytest.raises(ValueError, match=r"activations: 'stored' needs one float dtype in all four matrices"):
        model_graph_tail(other, activations="stored")
