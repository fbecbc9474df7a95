"""The two biases the fused tail cannot add: wo's (O_BIAS) and the FFN's (FFN_BIAS), read from configs."""

from __future__ import annotations

import json

import pytest

from workbench.models.config import MODELS_DIR, ModelConfig
from workbench.models.families import from_hf_config
from workbench.models.loader import list_models, load_model
from workbench.models.refusals import Refusal, layer_refusals, tail_verdicts

HYBRIDS = ("qwen3-next-80b-a3b", "qwen3.5-9b", "bonsai-27b")


def _with(name: str, **keys) -> ModelConfig:
    raw = json.loads((MODELS_DIR / f"{name}.json").read_text())
    scope = raw.get("text_config", raw) if name != "qwen3-next-80b-a3b" else raw
    scope.update(keys)
    return from_hf_config(raw, name=name)


@pytest.mark.parametrize("name", HYBRIDS)
def test_hybrid_qwen_attention_bias_refuses_every_attention_tail_o_bias(name):
    cfg = _with(name, attention_bias=True)
    verdicts = tail_verdicts(cfg)
    assert verdicts and all(Refusal.O_BIAS in found for found in verdicts.values())
    # The recurrent layers have no wo of this kind: the bias is not put on them.
    assert not any(cfg.layer(i).o_bias for i in range(cfg.num_layers) if i not in verdicts)
    assert tail_verdicts(_with(name, attention_bias=False)) == tail_verdicts(load_model(name))


@pytest.mark.parametrize("family_file", ["llama-3.1-8b"])
def test_llama_mlp_bias_refuses_ffn_bias_alone(family_file):
    cfg = _with(family_file, mlp_bias=True)
    assert all(found == [Refusal.FFN_BIAS] for found in tail_verdicts(cfg).values())
    assert "biases" in Refusal.FFN_BIAS.explanation


def test_granite_reads_mlp_bias_too():
    raw = {
        "model_type": "granite",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "mlp_bias": True,
    }
    assert layer_refusals(from_hf_config(raw), 1) == [Refusal.FFN_BIAS]


@pytest.mark.parametrize("name", list_models())
def test_no_shipped_config_has_an_ffn_bias(name):
    """The shipped verdicts are unchanged by the new rule: no shipped layer carries FFN biases."""
    assert not any(lc.ffn_bias for lc in load_model(name).layers)
