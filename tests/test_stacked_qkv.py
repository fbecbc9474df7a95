"""workbench.real_models.stacked_attention: an attention's q, k and v projections as one product,
swapped into mlx-lm's Llama layers alone (``fused_layers.stacked_qkv``) and beside the
fused tails (``fused_tails(stack_qkv=True)``): the same bits as the three projections, the
same logits as the model's own layers, and the model's own modules back on exit."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from tests.test_checkpoint import TOKENS, _logits, tiny_llama
from workbench.real_models import fused_layers as rmod
from workbench.real_models.checkpoint import load_checkpoint
from workbench.real_models.stacked_attention import StackedAttention, StackedQKV, stackable


@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "affine4"])
def test_the_stacked_product_gives_the_three_projections_bits(quantized):
    attn = tiny_llama(4, quantized=quantized).layers[1].self_attn
    assert stackable(attn)
    x = mx.random.normal((2, 3, attn.q_proj.weight.shape[1] * (8 if quantized else 1)), key=mx.random.key(5))
    got = StackedQKV(attn)(x)
    for g, proj in zip(got, (attn.q_proj, attn.k_proj, attn.v_proj)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(proj(x)))


@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "affine4"])
def test_the_models_layers_with_stacked_projections_give_its_logits_bit_for_bit(quantized):
    model = tiny_llama(6, quantized=quantized)
    ref = _logits(model)
    own = [layer.self_attn for layer in model.layers]
    with rmod.stacked_qkv(model) as m:
        assert m is model and all(isinstance(layer.self_attn, StackedAttention) for layer in model.layers)
        stacked = _logits(model)
    assert [layer.self_attn for layer in model.layers] == own  # put back on exit
    np.testing.assert_array_equal(stacked, ref)


def _cached_decode(model: nn.Module, steps: int) -> list[np.ndarray]:
    """The prompt's last logits, then ``steps`` decode steps (one position each, KV cache)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    got = [np.asarray(model(mx.array([TOKENS]), cache=cache)[0, -1])]
    for t in TOKENS[:steps]:
        got.append(np.asarray(model(mx.array([[t]]), cache=cache)[0, -1]))
    return got


@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "affine4"])
def test_decode_steps_take_the_heads_layout_in_one_reshape_with_the_models_bits(quantized):
    """A decode step's one position takes the heads' layout with one reshape and one split
    (StackedAttention's decode path): the same logits, bit for bit, as the model's own
    layers through a prefill and cached steps, with fewer ops in a step's graph."""
    model = tiny_llama(9, quantized=quantized)
    ref = _cached_decode(model, 3)
    with rmod.stacked_qkv(model):
        got = _cached_decode(model, 3)
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)

    from mlx_lm.models.cache import make_prompt_cache

    from bench.common.step_profile import graph_ops

    def step_ops() -> dict[str, int]:
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([TOKENS]), cache=cache))
        return graph_ops(model(mx.array([[TOKENS[0]]]), cache=cache))

    own = step_ops()
    with rmod.stacked_qkv(model):
        stacked = step_ops()
    n = len(model.layers)
    matmul = "QuantizedMatmul" if quantized else "Matmul"
    # a layer's three products and their layout (3 reshapes, 3 transposes) become one product,
    # one reshape and one split; the heads are joined by one reshape instead of a transpose and one
    # (dense: nn.Linear's x @ W.T is a transpose op of each weight too; the stacked matrix is
    # stored transposed, evaluated once)
    weight_t = 0 if quantized else 3
    assert stacked[matmul] == own[matmul] - 2 * n
    assert stacked.get("Transpose", 0) == own.get("Transpose", 0) - (4 + weight_t) * n
    assert stacked["Reshape"] == own["Reshape"] - 2 * n
    assert stacked["Split"] == own.get("Split", 0) + n
    if quantized:  # (a dense 3-D product is also a flatten and an unflatten op each)
        assert sum(stacked.values()) == sum(own.values()) - 7 * n


def test_stacked_projections_beside_the_fused_tails_decode_as_the_model_does():
    """Prefill and one decode step with a KV cache: the fused tails with stacked projections
    against the fused tails without (the same tails: only the attention's product differs),
    and the model's own output projections back on exit."""
    from mlx_lm.models.cache import make_prompt_cache

    model = tiny_llama(7, quantized=True)
    ckpt = load_checkpoint(model)
    weights = [ckpt.tail_weights(i) for i in range(len(model.layers))]
    o_projs = [layer.self_attn.o_proj for layer in model.layers]

    def decode() -> list[np.ndarray]:
        cache = make_prompt_cache(model)
        first = model(mx.array([TOKENS]), cache=cache)[0, -1]
        step = model(mx.array([[TOKENS[0]]]), cache=cache)[0, -1]
        return [np.asarray(first), np.asarray(step)]

    with rmod.fused_tails(model, weights, backend="graph"):
        plain = decode()
    with rmod.fused_tails(model, weights, backend="graph", stack_qkv=True):
        assert all(isinstance(layer.block.self_attn, StackedAttention) for layer in model.layers)
        stacked = decode()
    for s, p in zip(stacked, plain):
        np.testing.assert_array_equal(s, p)
    assert [layer.self_attn.o_proj for layer in model.layers] == o_projs
    assert not any(isinstance(layer.self_attn, StackedAttention) for layer in model.layers)


def test_what_cannot_be_stacked_is_left_alone_or_refused():
    model = tiny_llama(8)
    attn = model.layers[0].self_attn
    assert not stackable(None) and not stackable(nn.Linear(4, 4))
    attn.k_proj = nn.Linear(attn.k_proj.weight.shape[1], attn.k_proj.weight.shape[0], bias=True)
    assert not stackable(attn)  # a bias: not the form StackedQKV computes
    with pytest.raises(ValueError, match="attn: must be mlx-lm's Llama Attention"):
        StackedQKV(attn)
    with rmod.stacked_qkv(model):  # the other layer is still stacked
        assert model.layers[0].self_attn is attn and isinstance(model.layers[1].self_attn, StackedAttention)
    for layer in model.layers:
        layer.self_attn = nn.Identity()
    with pytest.raises(ValueError, match="model: no layer's attention is mlx-lm's Llama Attention"):
        with rmod.stacked_qkv(model):
            pass
    weights = [None] * len(model.layers)
    with pytest.raises(ValueError, match="stack_qkv: no layer's attention is mlx-lm's Llama Attention"):
        with rmod.fused_tails(model, weights, stack_qkv=True):
            pass
    assert all(isinstance(layer.self_attn, nn.Identity) for layer in model.layers)  # nothing left swapped
    with pytest.raises(ValueError, match="stack_qkv: must be True or False"):
        with rmod.fused_tails(model, [None] * len(model.layers), stack_qkv=1):
            pass


def test_a_decode_steps_cache_update_is_mlx_lms_own_bit_for_bit_across_its_growth():
    """StackedAttention's one-position cache update against mlx-lm's ``update_and_fetch``:
    a prefill, then steps across the buffer's growth (mlx-lm's step of 256 positions) and the
    step that fills it exactly; the same keys and values returned, the same buffers and
    offsets after, the same ops in the graph."""
    from mlx_lm.models.cache import KVCache

    from bench.common.step_profile import graph_ops
    from workbench.real_models.stacked_attention import _appended

    def kv(n: int, seed: int) -> tuple[mx.array, mx.array]:
        k = mx.random.normal((1, 2, n, 8), key=mx.random.key(seed))
        return k, -k

    ours, theirs = KVCache(), KVCache()
    first = kv(250, 0)
    ours.update_and_fetch(*first)
    theirs.update_and_fetch(*first)
    for step in range(12):  # positions 251..262: the buffer fills at 256 and grows at 257
        k, v = kv(1, step + 1)
        got, want = _appended(ours, k, v), theirs.update_and_fetch(k, v)
        assert ours.offset == theirs.offset
        assert graph_ops(got[0]) == graph_ops(want[0])
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    np.testing.assert_array_equal(np.asarray(ours.keys), np.asarray(theirs.keys))
    np.testing.assert_array_equal(np.asarray(ours.values), np.asarray(theirs.values))


def test_another_cache_kind_keeps_its_own_update():
    from workbench.real_models.stacked_attention import _appended

    class Cache:  # a cache StackedAttention does not know: its own update_and_fetch runs
        keys = mx.zeros((1, 1, 4, 2))
        offset = 0

        def update_and_fetch(self, k, v):
            return "own", "update"

    assert _appended(Cache(), mx.zeros((1, 1, 1, 2)), mx.zeros((1, 1, 1, 2))) == ("own", "update")


def test_a_cache_without_keys_keeps_its_own_update():
    from workbench.real_models.stacked_attention import _appended

    class State:  # a recurrent layer's cache: no keys at all
        def update_and_fetch(self, k, v):
            return "own", "update"

    assert _appended(State(), mx.zeros((1, 1, 1, 2)), mx.zeros((1, 1, 1, 2))) == ("own", "update")
