"""fused_tails builds each tail inside the model's graph (no host read-back) on every lazy backend."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.test_checkpoint import TOKENS, TOL, _logits, tiny_llama
from workbench import backends
from workbench.backends import BackendUnavailable
from workbench.kernels import one_launch
from workbench.real_models import fused_layers as rmod
from workbench.real_models.checkpoint import load_checkpoint
from workbench.tail import tail_graph
from workbench.tail.comparison import compare


def test_which_backends_compose_lazily():
    assert rmod.composes_lazily("graph") and rmod.composes_lazily("cuda") and rmod.composes_lazily("metal")
    assert not rmod.composes_lazily("metal-emulated")
    with pytest.raises(ValueError, match="backend: must be one of"):
        rmod.composes_lazily("auto")


def test_graph_tails_give_the_models_logits_prefill_and_decode():
    model = tiny_llama(3)
    ckpt = load_checkpoint(model)
    ref = _logits(model)
    with rmod.fused_tails(model, [ckpt.tail_weights(i) for i in range(2)], backend="graph"):
        fused = _logits(model)
        step = model(mx.array([[TOKENS[0]]]))
    assert compare(fused, ref, tol=TOL).passed
    assert compare(np.asarray(step[0, -1]), np.asarray(model(mx.array([[TOKENS[0]]]))[0, -1]), tol=TOL).passed


@pytest.mark.parametrize("carry_norm", [True, False])
def test_a_kernel_backend_gets_mlx_vectors_and_stays_in_the_graph(monkeypatch, carry_norm):
    """The CUDA path on a machine without CUDA: a stand-in one launch (the graph tail) records
    what the block hands it. Every call gets 1-D float32 MLX arrays, never numpy. With
    ``carry_norm`` each layer's launch is asked for the norm its output goes into next
    (layer 0: layer 1's input norm; layer 1, the last: the model's final norm), and the
    logits are the model's either way."""
    model = tiny_llama(4)
    ckpt = load_checkpoint(model)
    seen, asked = [], []

    class StandIn:
        def __init__(self, launch, next_norm):
            self.launch, self.next_norm = launch, next_norm

        def compiled(self, trace="shared"):
            assert trace == "shared"  # fused_tails' default

            def call(b, r):
                seen.append((type(b), b.ndim, b.dtype, type(r), r.ndim))
                out = tail_graph(self.launch, b, r)
                if self.next_norm is None:
                    return out
                return out, mx.fast.rms_norm(out, mx.array(self.next_norm.weight), self.next_norm.eps)

            return call

    def for_launch(launch, tuning=None, next_norm=None):
        asked.append(next_norm)
        return StandIn(launch, next_norm)

    monkeypatch.setattr(backends, "resolve_backend", lambda name: name)
    monkeypatch.setattr(one_launch, "for_launch", for_launch)
    # The arithmetic on the CPU on every machine: TOL is a CPU float32 figure, and on a GPU
    # both sides' products round differently (2.3e-3 apart on the H200); what this test
    # checks is what the block hands a launch, not a device's rounding.
    with mx.stream(mx.cpu):
        ref = _logits(model)
        with rmod.fused_tails(model, [ckpt.tail_weights(i) for i in range(2)], backend="cuda", carry_norm=carry_norm):
            fused = _logits(model)
    assert compare(fused, ref, tol=TOL).passed
    assert len(seen) == 2 * len(TOKENS)  # one launch a position a layer
    assert all(s == (mx.array, 1, mx.float32, mx.array, 1) for s in seen)
    if not carry_norm:
        assert asked == [None, None]
    else:
        readers = [model.model.layers[1].input_layernorm, model.model.norm]
        assert [a.key for a in asked] == [rmod.carried_norm(m).key for m in readers]
        assert isinstance(model.model.norm, type(readers[1]))  # put back on exit


def test_cuda_absent_raises_before_the_layers_change():
    if "cuda" in backends.available_backends():
        pytest.skip("CUDA is here")
    model = tiny_llama(5)
    ckpt = load_checkpoint(model)
    before = list(model.model.layers)
    with pytest.raises(BackendUnavailable):
        with rmod.fused_tails(model, [ckpt.tail_weights(i) for i in range(2)], backend="cuda"):
            pass
    assert all(a is b for a, b in zip(model.model.layers, before))


def test_weights_of_another_layer_are_refused():
    model = tiny_llama(6)
    ckpt = load_checkpoint(model)
    with pytest.raises(ValueError, match=r"weights\[0\]: TailWeights of layer 1, not of layer 0"):
        with rmod.fused_tails(model, [ckpt.tail_weights(1), ckpt.tail_weights(0)]):
            pass


def test_emulated_metal_runs_on_the_host_and_matches():
    if "metal-emulated" not in backends.available_backends():
        pytest.skip("the Metal emulation needs clang++")
    model = tiny_llama(7)
    ckpt = load_checkpoint(model)
    ref = _logits(model)
    with rmod.fused_tails(model, [ckpt.tail_weights(i) for i in range(2)], backend="metal-emulated"):
        fused = _logits(model)
    assert compare(fused, ref, tol=TOL).passed


def test_the_one_launch_grid_rule_counts_busy_groups():
    from dataclasses import dataclass

    @dataclass
    class Prep:
        hidden: int
        ffn: int

    shape = one_launch.OneLaunchShape(nt=640, down_rows=4, sm_count=132)
    assert one_launch.groups_for(Prep(576, 1536), shape) is None  # down's 144 row groups fill 132 SMs
    assert one_launch.groups_for(Prep(64, 96), shape) == 16  # down: 64 rows / 4
    assert one_launch.groups_for(Prep(5120, 17408), shape) is None
    with pytest.raises(ValueError, match="groups"):
        one_launch.OneLaunchShape(groups=0)


def test_a_trace_of_its_own_a_layer_gives_the_shared_traces_bits():
    """``fused_tails(trace="per-layer")``: each graph tail traced on its own with its weights
    captured gives the logits of the shared trace bit for bit, prefill and a cached decode
    step; another trace is refused by name."""
    from mlx_lm.models.cache import make_prompt_cache

    model = tiny_llama(5, quantized=True)
    ckpt = load_checkpoint(model)
    weights = [ckpt.tail_weights(i) for i in range(2)]

    def decode() -> list[np.ndarray]:
        cache = make_prompt_cache(model)
        first = model(mx.array([TOKENS]), cache=cache)[0, -1]
        return [np.asarray(first), np.asarray(model(mx.array([[TOKENS[1]]]), cache=cache)[0, -1])]

    with rmod.fused_tails(model, weights, backend="graph"):
        shared = decode()
    with rmod.fused_tails(model, weights, backend="graph", trace="per-layer"):
        own = decode()
    for a, b in zip(own, shared):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="trace: must be one of"):
        with rmod.fused_tails(model, weights, trace="captured"):
            pass


def test_carry_norm_must_be_a_flag():
    model = tiny_llama(8)
    ckpt = load_checkpoint(model)
    with pytest.raises(ValueError, match="carry_norm: must be True or False, got"):
        with rmod.fused_tails(model, [ckpt.tail_weights(i) for i in range(2)], carry_norm="yes"):
            pass


def test_the_carried_norm_is_the_readers_own_and_a_rounded_output_is_normed_by_its_reader():
    """float32 activations: carrying the norm gives the logits of every block norming its own
    input, bit for bit (the same mx.fast.rms_norm of the same array). bfloat16 activations:
    the block rounds its output, so nothing is carried (the norm of the float32 output would
    not be the reader's), and both ways are the same bits too."""
    for dtype in (mx.float32, mx.bfloat16):
        model = tiny_llama(9)
        model.set_dtype(dtype)
        ckpt = load_checkpoint(model)
        ws = [ckpt.tail_weights(i) for i in range(2)]
        logits = []
        for carry in (True, False):
            with rmod.fused_tails(model, ws, carry_norm=carry):
                logits.append(_logits(model))
        assert np.array_equal(logits[0], logits[1]), dtype
