"""The head's fields read from the fifteen configs (``workbench.models.head_fields``), as
``docs/REFERENCE.md`` sources them, and a model's head as the check's spec (``HeadSpec.from_layer``)."""

from __future__ import annotations

import pytest

from workbench.check import HeadSpec
from workbench.models import load_model
from workbench.models.families import from_hf_config

# model -> (qkv_bias, qk_norm, rotary_dim, rope_theta, rope_scaling) of its first attention layer
EXPECTED = {
    "bonsai-27b": (False, "head", 64, 1e7, ""),
    "qwen3.5-9b": (False, "head", 64, 1e7, ""),
    "qwen3-next-80b-a3b": (False, "head", 64, 1e7, ""),
    "qwen3-8b": (False, "head", 128, 1e6, ""),
    "llama-3.1-8b": (False, "none", 128, 5e5, "llama3"),
    "mistral-7b": (False, "none", 128, 1e4, ""),
    "gemma-2-9b": (False, "none", 256, 1e4, ""),
    "gemma-3-1b": (False, "head", 256, 1e4, ""),
    "olmo-2-7b": (False, "all", 128, 5e5, ""),
    "granite-3.1-8b": (False, "none", 128, 1e7, ""),
    "granite-4.0-h-micro": (False, "none", 0, 0.0, ""),
    "falcon-h1-7b": (False, "none", 128, 1e11, ""),
    "nemotron-h-8b": (False, "none", 0, 0.0, ""),
    "jamba-v0.1": (False, "none", 0, 0.0, ""),
    "gpt-oss-20b": (True, "none", 64, 1.5e5, "yarn"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_head_fields_of_the_fifteen(name):
    cfg = load_model(name)
    lc = cfg.layer(cfg.attention_layers()[0])
    assert (lc.qkv_bias, lc.qk_norm, lc.rotary_dim, lc.rope_theta, lc.rope_scaling) == EXPECTED[name]


def test_gemma3_global_layers_use_rope_theta_and_local_ones_the_local_base():
    cfg = load_model("gemma-3-1b")
    assert [i for i in cfg.attention_layers() if cfg.layer(i).rope_theta == 1e6] == [5, 11, 17, 23]


def test_rope_keys_are_read_from_rope_parameters_too():
    cfg = load_model("qwen3.5-9b")
    raw = {k: v for k, v in cfg.raw.items()}
    text = dict(raw["text_config"])
    theta, partial = text.pop("rope_theta"), text.pop("partial_rotary_factor")
    text["rope_parameters"] = {"rope_theta": theta, "partial_rotary_factor": partial, "rope_type": "default"}
    moved = from_hf_config({**raw, "text_config": text})
    assert moved.layers[3] == cfg.layers[3]


def test_a_models_head_as_the_checks_spec():
    spec = HeadSpec.from_layer(load_model("qwen3.5-9b"), 3)
    assert (spec.shape, spec.q_heads, spec.kv_heads, spec.head_dim, spec.rotary_dim) == ("model", 4, 1, 32, 8)
    assert (spec.qk_norm, spec.gate, spec.bias, spec.rope_theta, spec.eps) == (True, True, False, 1e7, 1e-6)
    with pytest.raises(ValueError, match="^layer: 0 of .* is not an attention layer"):
        HeadSpec.from_layer(load_model("qwen3.5-9b"), 0)
    with pytest.raises(ValueError, match="scales its RoPE \\(llama3\\)"):
        HeadSpec.from_layer(load_model("llama-3.1-8b"), 0)
    with pytest.raises(ValueError, match="over all heads at once"):
        HeadSpec.from_layer(load_model("olmo-2-7b"), 0)
