"""The tail: the oracle against an independent composition, the graph fused tail against
the float64 truth over shapes and folds, batching, the waits each path costs, refusals,
bad input, and the names that moved out of workbench.tail still reachable there."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import backends as B
from workbench import tail as T
from workbench.backends import BackendUnavailable
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.models.config import BONSAI_SHAPE, ModelConfig, replace_layer
from workbench.models.refusals import Refusal
from workbench.tail.comparison import compare
from workbench.tail.frink_case import seed_arrays, seed_case
from workbench.waits.measurement import count_waits

# Block sizes m * 2^k for each family the kernels serve (m = 1, 12, 20, 28).
BLOCKS = [1, 2, 8, 16, 12, 24, 20, 40, 28, 56]


def independent_tail(w: T.TailWeights, branch: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """The five ops in float64 from the weights' LINEAR MAPS (folds undone as dense
    matrices by WeightMatrix.linear_map), one row at a time with explicit sums: shares
    nothing with tail_np but the stored weights."""
    wo = w.wo.linear_map()
    gate, up, down = (m.linear_map() for m in (w.gate, w.up, w.down))
    norm = w.ffn_norm.astype(np.float64)
    b = np.asarray(branch, np.float64).reshape(-1, wo.shape[1])
    r = np.asarray(residual, np.float64).reshape(-1, wo.shape[0])
    out = np.empty_like(r)
    for i in range(b.shape[0]):
        h = r[i] + np.einsum("ij,j->i", wo, b[i])
        inv = 1.0 / math.sqrt(float(np.sum(h**2)) / h.size + w.eps)
        n = h * inv * norm
        g = np.einsum("ij,j->i", gate, n)
        act = g / (1.0 + np.exp(-g)) * np.einsum("ij,j->i", up, n)
        out[i] = h + np.einsum("ij,j->i", down, act)
    return out.reshape(np.shape(residual))


# -- the oracle ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("site", list(FoldSite))
def test_host_tail_matches_an_independent_composition(dtype, site):
    w = T.TailWeights.random(48, 40, 56, seed=3, fold_block=8, fold_site=site, dtype=dtype)
    br, res = T.random_inputs(w, seed=4, batch=3)
    np.testing.assert_allclose(T.host_tail(w, br, res), independent_tail(w, br, res), rtol=0, atol=1e-12)


def test_host_tail_quantized_matches_an_independent_composition():
    w = T.TailWeights.random(
        64, 128, 64, seed=5, fold_block=32, quantize={"mode": "affine", "bits": 4, "group_size": 64}
    )
    br, res = T.random_inputs(w, seed=6)
    np.testing.assert_allclose(T.host_tail(w, br, res), independent_tail(w, br, res), rtol=0, atol=1e-12)


def test_host_tail_seed_case_independent():
    c = seed_case()
    np.testing.assert_allclose(
        T.host_tail(c.weights, c.branch, c.residual),
        independent_tail(c.weights, c.branch, c.residual),
        rtol=0,
        atol=1e-12,
    )


def test_host_tail_dtype_follows_the_argument():
    c = seed_case()
    assert T.host_tail(c.weights, c.branch, c.residual).dtype == np.float64
    assert T.host_tail(c.weights, c.branch, c.residual, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match="dtype"):
        T.host_tail(c.weights, c.branch, c.residual, dtype=np.int32)


# -- the graph fused tail against the truth --------------------------------------------------


@st.composite
def tail_cases(draw: st.DrawFn):
    site = draw(st.sampled_from(list(FoldSite)))
    block = draw(st.sampled_from(BLOCKS + [None]))
    mult = draw(st.integers(1, 3))
    folded = (block or 1) * mult
    other = draw(st.integers(1, 72))
    ffn = draw(st.integers(1, 96))
    hidden, branch = (other, folded) if site is FoldSite.INPUT else (folded, other)
    if block is None:
        hidden, branch = draw(st.integers(1, 72)), draw(st.integers(1, 72))
    return hidden, branch, ffn, block, site, draw(st.integers(0, 2**31 - 1)), draw(st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tail_cases())
def test_graph_fused_tail_matches_the_truth(case):
    hidden, branch, ffn, block, site, seed, permute = case
    w = T.TailWeights.random(hidden, branch, ffn, seed=seed, fold_block=block, fold_site=site, fold_permute=permute)
    br, res = T.random_inputs(w, seed=seed + 1)
    r = compare(T.fused_tail(w, br, res, backend="graph"), T.host_tail(w, br, res))
    assert r.passed, str(r)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_graph_fused_tail_low_precision_weights_matches_the_truth(dtype):
    # The truth is the exact map of the STORED (rounded) weights, so the only error left is
    # the float32 arithmetic: the same 2e-4 holds.
    w = T.TailWeights.random(256, 192, 320, seed=11, fold_block=64, dtype=dtype)
    br, res = T.random_inputs(w, seed=12, batch=2)
    r = compare(T.fused_tail(w, br, res, backend="graph"), T.host_tail(w, br, res))
    assert r.passed, str(r)


def test_graph_fused_tail_quantized_matches_the_truth():
    w = T.TailWeights.random(
        128, 256, 128, seed=13, fold_block=128, quantize={"mode": "affine", "bits": 4, "group_size": 64}
    )
    br, res = T.random_inputs(w, seed=14)
    r = compare(T.fused_tail(w, br, res, backend="graph"), T.host_tail(w, br, res))
    assert r.passed, str(r)


def test_auto_reports_what_it_picked():
    c = seed_case()
    out, name = T.fused_tail(c.weights, c.branch, c.residual, return_backend=True)
    assert name == B.available_backends()[0]  # "graph" without a Metal or CUDA GPU
    assert out.shape == (64,)


# -- batching -----------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [(4,), (2, 3)])
def test_batched_paths_equal_row_by_row(batch):
    w = T.TailWeights.random(40, 48, 24, seed=21, fold_block=12)
    br, res = T.random_inputs(w, seed=22, batch=batch)
    host = T.host_tail(w, br, res)
    fused = T.fused_tail(w, br, res, backend="graph")
    unfused = T.unfused_tail(w, br, res)
    assert host.shape == fused.shape == unfused.shape == batch + (40,)
    for idx in np.ndindex(*batch):
        np.testing.assert_allclose(host[idx], T.host_tail(w, br[idx], res[idx]), rtol=0, atol=1e-12)
        np.testing.assert_allclose(fused[idx], T.fused_tail(w, br[idx], res[idx], backend="graph"), rtol=0, atol=1e-6)
    assert compare(unfused, host).passed


def test_batched_weights_through_the_pure_functions():
    # One weight set per row: what workbench.studies.sweeps does to sweep seeds in one call.
    ws = [T.TailWeights.random(24, 32, 20, seed=s) for s in range(3)]
    rows = [T.random_inputs(w, seed=100 + i) for i, w in enumerate(ws)]
    br = np.stack([r[0] for r in rows]).astype(np.float64)
    res = np.stack([r[1] for r in rows]).astype(np.float64)
    parts = [w.host_arrays(np.float64) for w in ws]
    wo, norm, gate, up, down = (np.stack([p[i] for p in parts]) for i in range(5))
    fold = HadamardFold.random(32, 8, seed=0)  # one shared rotation for all rows
    got = T.tail_np(wo, fold, norm, gate, up, down, 1e-6, br, res)
    graph = T.tail_mx(
        *(mx.array(a.astype(np.float32)) for a in (wo,)),
        fold,
        *(mx.array(a.astype(np.float32)) for a in (norm, gate, up, down)),
        1e-6,
        mx.array(br.astype(np.float32)),
        mx.array(res.astype(np.float32)),
    )
    for i in range(3):
        one = T.tail_np(wo[i], fold, norm[i], gate[i], up[i], down[i], 1e-6, br[i], res[i])
        np.testing.assert_allclose(got[i], one, rtol=0, atol=1e-12)
    assert compare(np.array(graph), got).passed


# -- waits ----------------------------------------------------------------------------------------


def test_waits_unfused_two_fused_one_oracle_zero():
    c = seed_case()
    T.host_tail(c.weights, c.branch, c.residual)  # the host copies of the weights, made once
    T.host_tail(c.weights, c.branch, c.residual, dtype=np.float32)
    with count_waits() as unfused:
        T.unfused_tail(c.weights, c.branch, c.residual)
    with count_waits() as fused:
        T.fused_tail(c.weights, c.branch, c.residual, backend="graph")
    with count_waits() as oracle:
        T.host_tail(c.weights, c.branch, c.residual)
        T.host_tail(c.weights, c.branch, c.residual, dtype=np.float32)
    assert (unfused.n, fused.n, oracle.n) == (2, 1, 0), (unfused, fused, oracle)
    assert unfused == 2 and int(fused) == 1


def test_waits_batched_fused_is_still_one():
    w = T.TailWeights.random(32, 32, 32, seed=1)
    br, res = T.random_inputs(w, seed=2, batch=16)
    with count_waits() as n:
        T.fused_tail(w, br, res, backend="graph")
    assert n.n == 1


# -- refusals ---------------------------------------------------------------------------------------


def _one_layer(**changes):
    cfg = ModelConfig.synthetic(32, ffn_dim=48, num_q_heads=2, num_kv_heads=1, head_dim=16)
    return replace_layer(cfg, 0, **changes) if changes else cfg


def test_bare_weights_are_asked_about_as_a_plain_layer():
    w = T.TailWeights.random(32, 32, 48, seed=0)
    assert T.tail_refusals(w) == []
    assert T.tail_refusals(w, kernels_enabled=False) == [Refusal.KERNELS_DISABLED]
    br, res = T.random_inputs(w, seed=1)
    with pytest.raises(T.TailRefused, match="KERNELS_DISABLED"):
        T.fused_tail(w, br, res, backend="graph", kernels_enabled=False)


def test_a_layer_with_extras_is_refused_with_every_reason():
    cfg = _one_layer(o_bias=True, post_attn_norm=True)
    w = T.TailWeights.for_layer(cfg, 0, seed=0)
    assert w.shape == (32, 32, 48)
    br, res = T.random_inputs(w, seed=1)
    with count_waits() as n, pytest.raises(T.TailRefused) as e:
        T.fused_tail(w, br, res, backend="graph")
    assert e.value.reasons == [Refusal.O_BIAS, Refusal.POST_ATTN_NORM]
    assert "O_BIAS" in str(e.value) and "POST_ATTN_NORM" in str(e.value)
    assert isinstance(e.value, ValueError)
    assert n.n == 0  # refused before anything ran
    # the fallback, as frink-models' caller has it: the unfused tail serves every layer
    assert T.unfused_tail(w, br, res).shape == (32,)


def test_an_eligible_model_layer_fuses():
    cfg = _one_layer()
    w = T.TailWeights.for_layer(cfg, 0, seed=0, fold_block=16)
    br, res = T.random_inputs(w, seed=1)
    assert compare(T.fused_tail(w, br, res, backend="graph"), T.host_tail(w, br, res)).passed


def test_tail_launch_is_the_one_builder():
    c = seed_case()
    launch = T.tail_launch(c.weights)
    assert launch.fold is c.weights.wo.fold
    assert launch.fold_plan.width == 96 and launch.fold_plan.block == 16
    base, _ = c.weights.wo.launch_parts()
    assert launch.wo.launch_parts()[0] is base and launch.wo.fold is None  # the stored arrays, unfolded


# -- bad input --------------------------------------------------------------------------------------


def test_mismatched_shapes_raise():
    c = seed_case()
    w = c.weights
    for fn in (T.host_tail, T.unfused_tail, T.fused_tail):
        with pytest.raises(ValueError, match="branch: must have last axis 96"):
            fn(w, c.branch[:95], c.residual)
        with pytest.raises(ValueError, match="residual: must have last axis 64"):
            fn(w, c.branch, np.zeros(63, np.float32))
        with pytest.raises(ValueError, match="same leading"):
            fn(w, np.zeros((2, 96), np.float32), np.zeros((3, 64), np.float32))
        with pytest.raises(ValueError, match="float"):
            fn(w, np.zeros(96, np.int32), c.residual)


def test_bad_weights_raise():
    a = seed_arrays()
    with pytest.raises(ValueError, match="gate: must be 80x64"):
        T.TailWeights.from_arrays(a.wo, a.ffn_norm, a.gate[:, :10], a.up, a.down)
    with pytest.raises(ValueError, match="ffn_norm: must have shape"):
        T.TailWeights.from_arrays(a.wo, a.ffn_norm[:3], a.gate, a.up, a.down)
    with pytest.raises(ValueError, match="eps"):
        T.TailWeights.from_arrays(a.wo, a.ffn_norm, a.gate, a.up, a.down, eps=0.0)
    with pytest.raises(ValueError, match="dtype must be one of"):
        T.TailWeights.from_arrays(a.wo, a.ffn_norm, a.gate, a.up, a.down, dtype="int8")
    with pytest.raises(ValueError, match="hidden must be a positive int"):
        T.TailWeights.random(0, 4, 4, seed=0)
    with pytest.raises(ValueError, match="block"):
        T.TailWeights.random(8, 36, 8, seed=0, fold_block=36)
    with pytest.raises(ValueError, match="hidden_size"):
        T.TailWeights.random(16, 32, 48, seed=0, config=_one_layer(), layer=0)
    with pytest.raises(ValueError, match="w: must be TailWeights"):
        T.host_tail("weights", a.branch, a.residual)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # numpy says so; the row is NaN
@pytest.mark.parametrize("where", ["branch", "residual"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_inputs_propagate_to_the_whole_row_and_fail_compare(where, bad):
    c = seed_case()
    br, res = c.branch.copy(), c.residual.copy()
    (br if where == "branch" else res)[5] = bad
    truth = T.host_tail(c.weights, c.branch, c.residual)
    for out in (
        T.host_tail(c.weights, br, res),
        T.unfused_tail(c.weights, br, res),
        T.fused_tail(c.weights, br, res, backend="graph"),
    ):
        # wo mixes every branch element into every output, the norm's mean mixes every
        # residual element: the whole row is NaN (Inf * rsqrt(Inf) = Inf * 0 = NaN)
        assert np.isnan(out).all()
        r = compare(out, truth)
        assert not r.passed and r.n_nan == 64
        assert "FAIL" in str(r)


def test_non_finite_rows_stay_in_their_row():
    w = T.TailWeights.random(16, 16, 16, seed=0)
    br, res = T.random_inputs(w, seed=1, batch=3)
    br[1, 0] = np.nan
    out = T.fused_tail(w, br, res, backend="graph")
    assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2]]).all()


def test_unavailable_backends_raise_and_say_what_is_missing():
    c = seed_case()
    for name, says in (("metal", "Metal"), ("cuda", "CUDA")):
        if name in B.available_backends():  # a GPU machine: this one is here
            continue
        with pytest.raises(BackendUnavailable, match=says):
            T.fused_tail(c.weights, c.branch, c.residual, backend=name)
    with pytest.raises(ValueError, match="backend: must be one of"):
        T.fused_tail(c.weights, c.branch, c.residual, backend="tpu")


# -- Bonsai-27B (slow) ------------------------------------------------------------------------------


@pytest.mark.slow
def test_bonsai_shape_bf16_three_way():
    h, b, f = BONSAI_SHAPE
    w = T.TailWeights.random(h, b, f, seed=27, fold_block=128, dtype="bfloat16")
    br, res = T.random_inputs(w, seed=28)
    truth = T.host_tail(w, br, res)
    host = T.host_tail(w, br, res, dtype=np.float32)
    fused = T.fused_tail(w, br, res, backend="graph")
    assert compare(fused, truth).passed
    assert compare(host, truth).passed
    assert compare(fused, host).passed


# -- the benchmark command (a smoke test: speed is never asserted) -----------------------------------


def test_tail_bench_runs_and_writes_a_record(tmp_path, capsys):
    import json

    from bench import tail_bench

    rec = tail_bench.main(
        ["--shapes", "seed", "--repeats", "2", "--warmup", "0", "--bandwidth-gbps", "1", "--out-dir", str(tmp_path)]
    )
    (path,) = tmp_path.glob("tail_bench-*.json")
    on_disk = json.loads(path.read_text())
    assert on_disk["command"].startswith("python -m bench.tail_bench --shapes seed")
    assert on_disk["mlx_version"] == mx.__version__ and on_disk["date"] and on_disk["device"]
    (row,) = rec["results"]
    assert row["variants"]["unfused"]["waits"] == 2 and row["variants"]["fused"]["waits"] == 1
    assert row["fused_vs_unfused_passed"] and row["weight_bytes"] > 0
    assert "unf/fused" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        tail_bench.main(["--shapes", "nope"])
