"""A Hadamard pack's attention head and recurrent layer checked with mlx-lm 0.32.2's own modules
as the implementation under test: the pack written by mlx-lm's class and loaded by
``mlx_lm.utils.load_model`` (``workbench.real_models.hadamard_pack_writer``), each projection
rotating its own input, judged against the float64 truth of the same stored codes
(``workbench.check.pack_head``, ``workbench.check.pack_step``); the same modules given one
known bug (a rotation skipped, the float16 scales read as bfloat16) are caught."""

from __future__ import annotations

import contextlib

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache

from workbench.check import (
    PACK_ATTENTION_FAULTS,
    PACK_HEAD_FAULTS,
    PACK_STEP_FAULTS,
    check_pack_attention,
    check_pack_head,
    check_pack_recurrent,
)
from workbench.models import PackError, read_pack
from workbench.real_models import load_hadamard_pack, write_hadamard_pack

ATTN, LINEAR = 1, 0  # the tiny model's layers: recurrent first, full attention every second
HEAD_SEEDS, STEP_SEEDS, TOKENS = range(8), range(6), 8


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    folder = write_hadamard_pack(tmp_path_factory.mktemp("bonsai_layers"))
    model, _ = load_hadamard_pack(folder)
    return model.language_model.model.layers, read_pack(folder)


@contextlib.contextmanager
def bug(module, kind):
    """mlx-lm's own ``HadamardQuantizedLinear`` given a bug for the duration: its rotation
    skipped (``block`` 0, the branch its ``__call__`` takes for an unrotated module), or its
    scales and biases rounded to bfloat16 (what a kernel reading them as bfloat16 sees)."""
    saved = module.block, module.scales, module.biases
    if kind == "skip":
        module.block = 0
    else:
        module.scales, module.biases = (a.astype(mx.bfloat16).astype(mx.float16) for a in saved[1:])
    try:
        yield
    finally:
        module.block, module.scales, module.biases = saved


def head_subject(layer):
    """mlx-lm's DecoderLayer input norm and ``Qwen3NextAttention``'s own modules, in its
    ``__call__``'s order, up to RoPE at the cache offset (the head part's outputs)."""
    at = layer.self_attn

    def run(hidden, position):
        m = hidden.shape[0]
        x = layer.input_layernorm(mx.array(hidden))[:, None, :]
        q, gate = mx.split(at.q_proj(x).reshape(m, 1, at.num_attention_heads, -1), 2, axis=-1)
        k = at.k_proj(x).reshape(m, 1, at.num_key_value_heads, -1)
        q = at.rope(at.q_norm(q).transpose(0, 2, 1, 3), offset=position)
        k = at.rope(at.k_norm(k).transpose(0, 2, 1, 3), offset=position)
        flat = (q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), at.v_proj(x), gate)
        return [np.array(t.reshape(m, -1)) for t in flat]

    return run


def attention_subject(layer):
    """mlx-lm's DecoderLayer input norm and ``Qwen3NextAttention`` itself, one token a call with
    its ``KVCache``: the module's own ``__call__``, RoPE at the cache's offset, o_proj included."""

    def run(hidden):
        cache, outs = KVCache(), []
        for t in range(hidden.shape[0]):
            x = layer.input_layernorm(mx.array(hidden[t]))[:, None, :]
            outs.append(np.array(layer.self_attn(x, cache=cache)[:, 0]))
        return np.stack(outs)

    return run


def recurrent_subject(layer):
    """mlx-lm's DecoderLayer input norm and its own ``GatedDeltaNet`` module, one token a call
    with its ``ArraysCache`` (the conv and recurrent state) fed back."""

    def run(hidden):
        cache, outs = ArraysCache(size=2), []
        for t in range(hidden.shape[0]):
            x = layer.input_layernorm(mx.array(hidden[t]))[:, None, :]
            outs.append(np.array(layer.linear_attn(x, cache=cache)[:, 0]))
        return np.stack(outs)

    return run


def test_mlx_lm_head_judged_correct_and_its_bugs_caught(pack):
    layers, p = pack
    layer = layers[ATTN]
    report = check_pack_head(head_subject(layer), p, ATTN, seeds=HEAD_SEEDS)
    assert report.passed, report.reasons
    catch = report.catch_table()
    for fault in PACK_HEAD_FAULTS:  # every fault model fails the 2e-4 bound on every case
        assert (catch.loc[fault]["frink-models 2e-4"] == 1.0).all(), fault
    for module, kind in ((layer.self_attn.k_proj, "skip"), (layer.self_attn.q_proj, "bf16")):
        with bug(module, kind):
            bad = check_pack_head(head_subject(layer), p, ATTN, seeds=HEAD_SEEDS)
        assert not bad.passed, kind


def test_mlx_lm_attention_module_judged_correct_and_its_bugs_caught(pack):
    layers, p = pack
    layer = layers[ATTN]
    report = check_pack_attention(attention_subject(layer), p, ATTN, seeds=STEP_SEEDS)
    assert report.passed, report.reasons
    catch = report.catch_table()
    assert set(catch.index.get_level_values(0)) - {"(reference)"} == set(PACK_ATTENTION_FAULTS)
    for fault in PACK_ATTENTION_FAULTS:
        assert (catch.loc[fault]["frink-models 2e-4"] == 1.0).all(), fault
    for module, kind in ((layer.self_attn.k_proj, "skip"), (layer.self_attn.o_proj, "skip")):
        with bug(module, kind):
            bad = check_pack_attention(attention_subject(layer), p, ATTN, seeds=STEP_SEEDS)
        assert not bad.passed, module


def test_mlx_lm_recurrent_layer_judged_correct_and_its_bugs_caught(pack):
    layers, p = pack
    layer = layers[LINEAR]
    report = check_pack_recurrent(recurrent_subject(layer), p, LINEAR, seeds=STEP_SEEDS, tokens=TOKENS)
    assert report.passed, report.reasons
    catch = report.catch_table()
    for fault in PACK_STEP_FAULTS:
        if fault in catch.index.get_level_values(0):
            assert (catch.loc[fault]["frink-models 2e-4"] == 1.0).all(), fault
    assert "rotation_skipped_out_proj" in catch.index.get_level_values(0)
    for module, kind in ((layer.linear_attn.out_proj, "skip"), (layer.linear_attn.in_proj_qkv, "bf16")):
        with bug(module, kind):
            bad = check_pack_recurrent(recurrent_subject(layer), p, LINEAR, seeds=STEP_SEEDS, tokens=TOKENS)
        assert not bad.passed, kind


def test_layer_of_the_wrong_kind_refused(pack):
    _, p = pack
    with pytest.raises(PackError, match="layer: 0 is a linear_attention layer"):
        check_pack_head(lambda h, pos: h, p, LINEAR)
    with pytest.raises(PackError, match="layer: 1 is a full_attention layer"):
        check_pack_recurrent(lambda h: h, p, ATTN)
    with pytest.raises(ValueError, match="subject: must be a callable"):
        check_pack_head(3, p, ATTN)
    with pytest.raises(ValueError, match="pack: must be a HadamardPack"):
        check_pack_recurrent(lambda h: h, "pack", LINEAR)
    with pytest.raises(ValueError, match="tokens"):
        check_pack_attention(lambda h: h, p, ATTN, tokens=0)
    with pytest.raises(ValueError, match="scales"):
        check_pack_recurrent(lambda h: h, p, LINEAR, scales=[-1.0])
    with pytest.raises(ValueError, match="layer"):
        check_pack_head(lambda h, pos: h, p, 7)


def test_a_crashing_implementation_is_a_failed_check(pack):
    _, p = pack
    report = check_pack_head(lambda h, pos: 1 / 0, p, ATTN, seeds=range(2), positions=(0,))
    assert not report.passed and "ZeroDivisionError" in report.reasons[0]
