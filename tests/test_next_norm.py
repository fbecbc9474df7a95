"""The next layer's input norm carried by a tail (workbench.kernels.next_norm): its parameters,
its float64 oracle, the graph tail and the one CUDA launch that compute it, and the CUDA text
of the launch's epilogue (compiled here where nvcc is)."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from tests.test_one_launch import _ptxas
from workbench import backends as B
from workbench import tail
from workbench.kernels import launch as kernel_launch
from workbench.kernels import one_launch
from workbench.kernels import source as ks
from workbench.kernels.next_norm import NextNorm
from workbench.real_models.graph_tail import model_graph_tail
from workbench.tail.comparison import compare
from workbench.tail.frink_case import SEED_TOL


def _norm(width: int, seed: int = 0) -> NextNorm:
    rng = np.random.default_rng(seed)
    return NextNorm(rng.uniform(0.5, 1.5, width).astype(np.float32), 1e-5)


@pytest.mark.parametrize(
    "weight,eps,match",
    [
        (np.ones((2, 3)), 1e-5, "weight: must be a non-empty 1-D array"),
        (np.array([1.0, np.nan]), 1e-5, "weight: must be a non-empty 1-D array"),
        ("abc", 1e-5, "weight: must be a 1-D array of finite numbers"),
        (np.ones(4), 0.0, "eps: must be a finite number > 0, got 0.0"),
        (np.ones(4), True, "eps: must be a finite number > 0"),
    ],
)
def test_a_norm_refuses_what_it_cannot_be(weight, eps, match):
    with pytest.raises(ValueError, match=match):
        NextNorm(weight, eps)


def test_the_key_is_the_weights_bits_and_eps():
    a, b = _norm(16, 1), _norm(16, 1)
    assert a.key == b.key and a.key != _norm(16, 2).key
    assert a.key != NextNorm(a.weight, 1e-6).key


def test_the_oracle_is_the_rms_norm_formula_in_float64():
    n = _norm(8, 3)
    x = np.random.default_rng(4).standard_normal((3, 8))
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(1e-5)) * n.weight.astype(np.float64)
    np.testing.assert_allclose(n.oracle(x), want, rtol=1e-15)
    with pytest.raises(ValueError, match="out: must have last axis 8"):
        n.oracle(np.zeros(7))


def test_the_packed_input_is_the_weight_then_eps_padded_to_a_float4():
    n = _norm(12, 5)
    p = np.asarray(n.packed())
    assert p.shape == (16,) and p.dtype == np.float32
    np.testing.assert_array_equal(p[:12], n.weight)
    assert p[12] == np.float32(1e-5) and not p[13:].any()


@pytest.mark.parametrize("quantize", [None, {"bits": 4, "group_size": 32}], ids=["bf16", "affine4"])
def test_the_graph_tail_carries_the_norm_of_its_own_output(quantize):
    """The graph tail with a next norm: ``out`` the same bits as without, ``normed`` the norm of
    exactly that ``out`` (mx.fast.rms_norm's bits) and within frink-models' criterion of the
    float64 norm of the float64 tail (both are float32 ops over a float32 tail)."""
    w = tail.TailWeights.random(256, 256, 512, seed=7, fold_block=64, dtype="bfloat16", quantize=quantize)
    launch = tail.tail_launch(w)
    nn = _norm(256, 8)
    br, res = tail.random_inputs(w, seed=9)
    b, r = mx.array(br.astype(np.float32)), mx.array(res.astype(np.float32))
    plain = np.asarray(model_graph_tail(launch)(b, r))
    out, normed = model_graph_tail(launch, next_norm=nn)(b, r)
    np.testing.assert_array_equal(np.asarray(out), plain)
    np.testing.assert_array_equal(np.asarray(normed), np.asarray(mx.fast.rms_norm(out, mx.array(nn.weight), nn.eps)))
    truth = nn.oracle(tail.host_tail(w, br, res))
    verdict = compare(np.asarray(normed), truth, tol=SEED_TOL)
    assert verdict.passed, verdict


def test_a_norm_of_another_width_is_refused(monkeypatch):
    monkeypatch.setattr(kernel_launch, "compiled_kernel", lambda *a, **k: object())  # no GPU needed
    w = tail.TailWeights.random(128, 128, 256, seed=1, dtype="bfloat16")
    with pytest.raises(ValueError, match="next_norm: its weight has 64 entries, the tail's hidden width is 128"):
        model_graph_tail(tail.tail_launch(w), next_norm=_norm(64))
    prep = kernel_launch.prepare_tail(tail.tail_launch(w), "cuda")
    with pytest.raises(ValueError, match="next_norm: its weight has 64 entries"):
        one_launch.OneLaunchTail(prep, one_launch.OneLaunchShape(sm_count=4), next_norm=_norm(64))


def test_the_epilogue_is_composed_only_when_asked_and_only_where_marked(tmp_path: Path):
    _, plain = ks.compose_one_launch()
    _, carried = ks.compose_one_launch(next_norm=True)
    assert "((float4*)nxt)" not in plain and ks.NEXT_NORM_MARK not in plain
    assert "((float4*)nxt)[i4]" in carried and ks.NEXT_NORM_MARK not in carried
    assert ks.one_launch_inputs(next_norm=True) == (*ks.one_launch_inputs()[:-2], "next_nw", "work", "after")
    assert ks.one_launch_outputs(next_norm=True) == ("out", "nxt")
    old = tmp_path / "old"
    shutil.copytree(ks.KERNEL_DIR, old)
    body = old / ks.ONE_LAUNCH_BODY
    body.write_text(body.read_text().replace(ks.NEXT_NORM_MARK, ""))
    ks.compose_one_launch(kernel_dir=old)  # an older folder still composes without it
    with pytest.raises(ValueError, match="cannot carry the next norm"):
        ks.compose_one_launch(kernel_dir=old, next_norm=True)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
@pytest.mark.parametrize("quantize", [None, {"bits": 4, "group_size": 32}], ids=["bf16", "affine4"])
def test_the_carrying_launch_compiles_without_spills_in_the_memory_it_is_said_to_take(tmp_path: Path, quantize):
    w = tail.TailWeights.random(576, 576, 1536, seed=3, dtype="bfloat16", quantize=quantize)
    prep = kernel_launch.prepare_tail(tail.tail_launch(w), "metal")  # template values are dialect-free
    shape = one_launch.shape_for_formats(m.format for m in (prep.wo, prep.gate, prep.up, prep.down))
    for carried in (False, True):
        dtypes = ks.input_dtypes(ks.one_launch_inputs(next_norm=carried), prep.wo.fmt, prep.wo.sfmt)
        src = tmp_path / f"one_{carried}.cu"
        src.write_text(
            ks.one_launch_translation_unit(dtypes, dict(one_launch.launch_template(prep, shape)), next_norm=carried)
        )
        regs, smem, _ = _ptxas(src)
        est = one_launch.static_shared_bytes(prep, shape, carried)
        assert est - 16 <= smem <= est
        assert regs * shape.nt <= 65536


@pytest.mark.cuda
@pytest.mark.skipif(not B.cuda_available(), reason="needs an NVIDIA GPU with MLX's CUDA back-end (mlx[cuda13])")
@pytest.mark.parametrize("quantize", [None, {"bits": 4, "group_size": 32}], ids=["bf16", "affine4"])
def test_the_one_launch_carries_the_norm_of_its_own_output(quantize):
    """On the GPU: the carrying launch's ``out`` is the plain launch's bits, and its ``normed``
    passes frink-models' criterion against the float64 norm of the float64 tail."""
    w = tail.TailWeights.random(576, 576, 1536, seed=11, fold_block=64, dtype="bfloat16", quantize=quantize)
    launch = tail.tail_launch(w)
    nn = _norm(576, 12)
    br, res = tail.random_inputs(w, seed=13)
    plain = one_launch.for_launch(launch)
    carrying = one_launch.for_launch(launch, next_norm=nn)
    assert carrying is not plain and one_launch.for_launch(launch, next_norm=_norm(576, 12)) is carrying
    want = plain.run(br, res)
    out, normed = carrying.run_carried(br, res)
    np.testing.assert_array_equal(out, want)
    truth = nn.oracle(tail.host_tail(w, br, res))
    verdict = compare(normed, truth, tol=SEED_TOL)
    assert verdict.passed, verdict


@pytest.mark.cuda
@pytest.mark.skipif(not B.cuda_available(), reason="needs an NVIDIA GPU with MLX's CUDA back-end (mlx[cuda13])")
def test_a_launch_with_its_constants_copied_gives_the_same_bits():
    """``copy_constants`` (what ``bench.sanitize --device-written`` does to a launch) swaps
    every array the launch reads for a copy, the next norm's weight included: the same
    tail, bit for bit."""
    w = tail.TailWeights.random(
        576, 576, 1536, seed=14, fold_block=64, dtype="bfloat16", quantize={"bits": 4, "group_size": 32}
    )
    prep = kernel_launch.prepared(tail.tail_launch(w), "cuda")
    nn = _norm(576, 15)
    br, res = tail.random_inputs(w, seed=16)
    first = one_launch.OneLaunchTail(prep, one_launch.shape_for(prep), next_norm=nn)
    want = first.run_carried(br, res)
    copied = one_launch.OneLaunchTail(prep, one_launch.shape_for(prep), next_norm=nn)
    copied.copy_constants(lambda a: a * 1)  # a new array of the same bits in any dtype (bfloat16 has no numpy twin)
    got = copied.run_carried(br, res)
    for g, e in zip(got, want):
        np.testing.assert_array_equal(g, e)
