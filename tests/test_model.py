"""ModelConfig: reading real configs, the traps they set, and every malformed config.

Expected values are read off the shipped data/models/*.json (and reference/models.md)
by hand, never from the code under test.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.models.config import MODELS_DIR, LayerConfig, Mixer, ModelConfig, replace_layer
from workbench.models.families import FAMILIES, from_hf_config
from workbench.models.loader import list_models, load_model

SHIPPED = [
    "bonsai-27b",
    "qwen3.5-9b",
    "qwen3-next-80b-a3b",
    "llama-3.1-8b",
    "qwen3-8b",
    "mistral-7b",
    "gemma-2-9b",
    "gemma-3-1b",
    "olmo-2-7b",
    "granite-3.1-8b",
    "granite-4.0-h-micro",
    "falcon-h1-7b",
    "nemotron-h-8b",
    "jamba-v0.1",
    "gpt-oss-20b",
]


def raw(name: str) -> dict:
    return json.loads((MODELS_DIR / f"{name}.json").read_text())


# -- shipped configs -----------------------------------------------------------------------


def test_list_models_is_the_fifteen_the_issue_asks_for():
    assert sorted(SHIPPED) == list_models()


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_says_where_its_values_come_from(name):
    src = raw(name)["_source"]
    assert isinstance(src, str) and "config.json" in src
    assert load_model(name).source == src


# (name, layers, hidden, q heads, kv heads, head_dim, FFN width at attention layers,
#  attention layer indices) -- from reference/models.md and the json files by hand.
GEOMETRY = [
    ("bonsai-27b", 64, 5120, 24, 4, 256, 17408, list(range(3, 64, 4))),
    ("qwen3.5-9b", 32, 4096, 16, 4, 256, 12288, list(range(3, 32, 4))),
    ("qwen3-next-80b-a3b", 48, 2048, 16, 2, 256, 512, list(range(3, 48, 4))),
    ("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, list(range(32))),
    ("qwen3-8b", 36, 4096, 32, 8, 128, 12288, list(range(36))),
    ("mistral-7b", 32, 4096, 32, 8, 128, 14336, list(range(32))),
    ("gemma-2-9b", 42, 3584, 16, 8, 256, 14336, list(range(42))),
    ("gemma-3-1b", 26, 1152, 4, 1, 256, 6912, list(range(26))),
    ("olmo-2-7b", 32, 4096, 32, 32, 128, 11008, list(range(32))),
    ("granite-3.1-8b", 40, 4096, 32, 8, 128, 12800, list(range(40))),
    ("granite-4.0-h-micro", 40, 2048, 32, 8, 64, 8192, [5, 15, 25, 35]),
    ("falcon-h1-7b", 44, 3072, 12, 2, 128, 12288, list(range(44))),
    ("nemotron-h-8b", 52, 4096, 32, 8, 128, 0, [7, 18, 29, 40]),
    ("jamba-v0.1", 32, 4096, 32, 8, 128, 14336, [4, 12, 20, 28]),
    ("gpt-oss-20b", 24, 2880, 64, 8, 64, 2880, list(range(24))),
]


@pytest.mark.parametrize("name,n,hidden,q,kv,hd,ffn,attn", GEOMETRY, ids=[g[0] for g in GEOMETRY])
def test_geometry_matches_the_public_config(name, n, hidden, q, kv, hd, ffn, attn):
    cfg = load_model(name)
    assert (cfg.num_layers, cfg.hidden_size) == (n, hidden)
    assert cfg.attention_layers() == attn
    for li in attn:
        lc = cfg.layer(li)
        assert (lc.num_q_heads, lc.num_kv_heads, lc.head_dim, lc.ffn_dim) == (q, kv, hd, ffn)
        assert lc.group_size == q // kv


def test_multi_head_attention_counts_as_gqa_with_group_size_one():
    olmo = load_model("olmo-2-7b")
    assert all(olmo.layer(li).mixer is Mixer.ATTENTION for li in range(32))
    assert olmo.layer(0).group_size == 1


def test_hybrid_mixers_off_the_attention_layers():
    assert {lc.mixer for lc in load_model("bonsai-27b").layers if lc.index % 4 != 3} == {Mixer.LINEAR_ATTENTION}
    assert {lc.mixer for lc in load_model("granite-4.0-h-micro").layers if lc.index not in (5, 15, 25, 35)} == {
        Mixer.MAMBA2
    }
    nem = load_model("nemotron-h-8b")
    # "M-M-M-M*-...": even blocks before the first '*' are Mamba-2, odd are MLP.
    assert [nem.layer(i).mixer for i in range(8)] == [Mixer.MAMBA2, Mixer.MLP_ONLY] * 3 + [
        Mixer.MAMBA2,
        Mixer.ATTENTION,
    ]
    assert sum(lc.mixer is Mixer.MAMBA2 for lc in nem.layers) == 24
    assert sum(lc.mixer is Mixer.MLP_ONLY for lc in nem.layers) == 24


# -- the traps ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["llama-3.1-8b", "qwen3-8b", "mistral-7b", "granite-3.1-8b", "jamba-v0.1", "gpt-oss-20b", "bonsai-27b"]
)
def test_post_attention_layernorm_of_llama_style_code_is_the_pre_ffn_norm(name):
    # These checkpoints all have a weight named post_attention_layernorm; it is the norm
    # before the FFN, which the fused tail applies itself.
    assert not any(lc.post_attn_norm for lc in load_model(name).layers)


@pytest.mark.parametrize("name", ["gemma-2-9b", "gemma-3-1b", "olmo-2-7b"])
def test_gemma_and_olmo2_have_a_real_post_attention_norm(name):
    assert all(load_model(name).layer(li).post_attn_norm for li in load_model(name).attention_layers())


def test_olmo2_has_no_norm_before_qkv():
    assert load_model("olmo-2-7b").layer(0).pre_norm == "none"
    assert load_model("llama-3.1-8b").layer(0).pre_norm == "rms"


@pytest.mark.parametrize("name", ["bonsai-27b", "qwen3.5-9b", "qwen3-next-80b-a3b"])
def test_qwen_hybrids_gate_the_attention_output(name):
    cfg = load_model(name)
    assert all(cfg.layer(li).attn_output_gate for li in cfg.attention_layers())


def test_nemotron_h_attention_blocks_have_no_ffn():
    nem = load_model("nemotron-h-8b")
    for li in (7, 18, 29, 40):
        assert (nem.layer(li).ffn_dim, nem.layer(li).ffn_kind) == (0, "none")
    assert (nem.layer(1).ffn_dim, nem.layer(1).ffn_act) == (21504, "relu2")


def test_jamba_attention_layers_are_dense_though_odd_layers_have_experts():
    jamba = load_model("jamba-v0.1")
    # expert_layer_period 2, offset 1: the odd layers; attention at 4, 12, 20, 28 is even.
    for li in range(32):
        assert jamba.layer(li).ffn_kind == ("experts" if li % 2 == 1 else "dense")
    assert jamba.layer(1).num_experts == 16


def test_granite_residual_multiplier_is_a_residual_scale():
    assert load_model("granite-3.1-8b").residual_scale == pytest.approx(0.22)
    assert load_model("granite-4.0-h-micro").residual_scale == pytest.approx(0.22)
    d = raw("granite-3.1-8b")
    d["residual_multiplier"] = 1.0  # a multiplier of exactly 1 scales nothing
    assert from_hf_config(d).residual_scale is None


def test_falcon_h1_runs_mamba2_in_parallel_on_every_layer():
    f = load_model("falcon-h1-7b")
    assert all(lc.parallel_ssm and lc.mixer is Mixer.ATTENTION for lc in f.layers)
    d = raw("falcon-h1-7b")
    d["attention_out_multiplier"] = 0.5
    assert from_hf_config(d).layer(0).o_scale


def test_gpt_oss_bias_experts_and_flag():
    g = load_model("gpt-oss-20b")
    assert g.gpt_oss
    assert all(lc.o_bias and lc.ffn_kind == "experts" and lc.num_experts == 32 for lc in g.layers)
    assert g.layer(0).ffn_act == "swiglu_oai"


def test_qwen3_next_has_routed_experts_in_every_layer():
    assert all(lc.ffn_kind == "experts" and lc.num_experts == 512 for lc in load_model("qwen3-next-80b-a3b").layers)


def test_activations_are_named_for_their_glu():
    assert load_model("gemma-2-9b").layer(0).ffn_act == "geglu"
    assert load_model("llama-3.1-8b").layer(0).ffn_act == "swiglu"


def test_granite_4_pattern_may_be_spelled_layers_block_type():
    d = raw("granite-4.0-h-micro")
    d["layers_block_type"] = d.pop("layer_types")
    assert from_hf_config(d).attention_layers() == [5, 15, 25, 35]


def test_qwen_hybrid_without_layer_types_uses_the_interval():
    d = raw("qwen3.5-9b")
    del d["text_config"]["layer_types"]
    assert from_hf_config(d).attention_layers() == list(range(3, 32, 4))


def test_jamba_layers_block_type_overrides_period():
    d = raw("jamba-v0.1")
    d["layers_block_type"] = ["attention" if i == 0 else "mamba" for i in range(32)]
    assert from_hf_config(d).attention_layers() == [0]


# -- reading from disk ---------------------------------------------------------------------


def test_from_hf_config_reads_a_file_a_folder_and_a_dict(tmp_path):
    d = raw("mistral-7b")
    (tmp_path / "config.json").write_text(json.dumps(d))
    a = from_hf_config(tmp_path / "config.json", name="m")
    b = from_hf_config(str(tmp_path), name="m")
    c = from_hf_config(d, name="m")
    assert a == b == c


def test_name_defaults_to_the_model_type():
    assert from_hf_config(raw("mistral-7b")).name == "mistral"


def test_the_config_dict_is_not_modified():
    d = raw("bonsai-27b")
    before = copy.deepcopy(d)
    from_hf_config(d)
    assert d == before


# -- synthetic ---------------------------------------------------------------------------------


def test_synthetic_is_one_plain_gqa_swiglu_layer():
    cfg = ModelConfig.synthetic(64, ffn_dim=80, num_q_heads=4, num_kv_heads=2, head_dim=24)
    lc = cfg.layer(0)
    assert (cfg.num_layers, cfg.hidden_size, cfg.attention_layers()) == (1, 64, [0])
    assert (lc.mixer, lc.ffn_kind, lc.ffn_act, lc.num_q_heads * lc.head_dim) == (Mixer.ATTENTION, "dense", "swiglu", 96)
    assert ModelConfig.plain_layer(64, ffn_dim=80) == ModelConfig.synthetic(64, ffn_dim=80)


@pytest.mark.parametrize("kw", [dict(ffn_dim=0), dict(ffn_dim=80, num_q_heads=3)])
def test_synthetic_rejects_bad_shapes(kw):
    with pytest.raises(ValueError, match="ffn_dim|head_dim"):
        ModelConfig.synthetic(64, **kw)


# -- malformed configs ---------------------------------------------------------------------


def test_unknown_family_names_the_model_type_and_the_known_ones():
    with pytest.raises(ValueError, match=r"model_type.*'mamba_unknown'.*llama"):
        from_hf_config({"model_type": "mamba_unknown"})


@pytest.mark.parametrize("bad", [None, 3, ["llama"]])
def test_missing_or_ill_typed_model_type(bad):
    d = raw("llama-3.1-8b")
    if bad is None:
        del d["model_type"]
    else:
        d["model_type"] = bad
    with pytest.raises(ValueError, match="model_type"):
        from_hf_config(d)


# One key each family cannot do without (read off each builder's docstring by hand).
NEEDED = [
    ("llama-3.1-8b", None, "intermediate_size"),
    ("llama-3.1-8b", None, "hidden_size"),
    ("llama-3.1-8b", None, "num_hidden_layers"),
    ("llama-3.1-8b", None, "num_attention_heads"),
    ("llama-3.1-8b", None, "rms_norm_eps"),
    ("llama-3.1-8b", None, "hidden_act"),
    ("qwen3-8b", None, "intermediate_size"),
    ("mistral-7b", None, "hidden_size"),
    ("gemma-2-9b", None, "intermediate_size"),
    ("gemma-3-1b", None, "hidden_activation"),
    ("olmo-2-7b", None, "num_hidden_layers"),
    ("granite-3.1-8b", None, "intermediate_size"),
    ("bonsai-27b", "text_config", "intermediate_size"),
    ("qwen3.5-9b", "text_config", "num_attention_heads"),
    ("qwen3-next-80b-a3b", None, "full_attention_interval"),
    ("qwen3-next-80b-a3b", None, "moe_intermediate_size"),
    ("granite-4.0-h-micro", None, "shared_intermediate_size"),
    ("granite-4.0-h-micro", None, "layer_types"),
    ("falcon-h1-7b", None, "intermediate_size"),
    ("nemotron-h-8b", None, "hybrid_override_pattern"),
    ("nemotron-h-8b", None, "intermediate_size"),
    ("jamba-v0.1", None, "attn_layer_period"),
    ("jamba-v0.1", None, "expert_layer_offset"),
    ("gpt-oss-20b", None, "num_local_experts"),
]


@pytest.mark.parametrize("name,scope,key", NEEDED, ids=[f"{n}-{k}" for n, _, k in NEEDED])
def test_a_missing_key_names_the_key_and_the_family(name, scope, key):
    d = raw(name)
    target = d[scope] if scope else d
    del target[key]
    family = d["model_type"]
    with pytest.raises(ValueError, match=rf"^{key}\b.*{family}"):
        from_hf_config(d)


@pytest.mark.parametrize(
    "name,key,value",
    [
        ("llama-3.1-8b", "hidden_size", "4096"),
        ("llama-3.1-8b", "hidden_size", 4096.0),
        ("llama-3.1-8b", "num_hidden_layers", True),
        ("llama-3.1-8b", "rms_norm_eps", "1e-5"),
        ("llama-3.1-8b", "attention_bias", "no"),
        ("llama-3.1-8b", "hidden_act", 7),
        ("granite-3.1-8b", "residual_multiplier", "0.22"),
        ("nemotron-h-8b", "hybrid_override_pattern", ["M", "*"]),
        ("jamba-v0.1", "num_experts", 16.5),
        ("gpt-oss-20b", "attention_bias", 1),
        ("granite-4.0-h-micro", "layer_types", "mamba"),
        ("qwen3-next-80b-a3b", "mlp_only_layers", 3),
    ],
)
def test_a_wrong_type_names_the_key_the_type_and_the_family(name, key, value):
    d = raw(name)
    d[key] = value
    with pytest.raises(ValueError, match=rf"^{key}: must be .* {d['model_type']} config"):
        from_hf_config(d)


@pytest.mark.parametrize(
    "name,edit,match",
    [
        ("llama-3.1-8b", lambda d: d.update(hidden_size=0), "hidden_size: must be positive"),
        ("llama-3.1-8b", lambda d: d.update(num_key_value_heads=0), "num_key_value_heads"),
        ("llama-3.1-8b", lambda d: d.update(num_key_value_heads=5), "num_attention_heads: must be a multiple"),
        ("mistral-7b", lambda d: d.update(num_attention_heads=3), "num_attention_heads|head_dim"),
        (
            "bonsai-27b",
            lambda d: d["text_config"].update(layer_types=["full_attention"] * 3),
            "layer_types: must have num_hidden_layers=64",
        ),
        (
            "bonsai-27b",
            lambda d: d["text_config"]["layer_types"].__setitem__(5, "sliding_attention"),
            r"layer_types\[5\]",
        ),
        ("bonsai-27b", lambda d: d.update(text_config=[1, 2]), "text_config: must be an object"),
        (
            "nemotron-h-8b",
            lambda d: d.update(hybrid_override_pattern="M-M"),
            "hybrid_override_pattern: must have num_hidden_layers=52",
        ),
        ("nemotron-h-8b", lambda d: d.update(hybrid_override_pattern="X" * 52), r"hybrid_override_pattern\[0\]"),
        ("granite-4.0-h-micro", lambda d: d["layer_types"].__setitem__(0, "linear_attention"), r"layer_types\[0\]"),
        ("qwen3-8b", lambda d: d.update(head_dim=-128), "head_dim: must be positive"),
    ],
)
def test_inconsistent_configs_are_refused_clearly(name, edit, match):
    d = raw(name)
    edit(d)
    with pytest.raises(ValueError, match=match):
        from_hf_config(d)


def test_bad_paths_and_files(tmp_path):
    with pytest.raises(ValueError, match="path_or_dict: no config file"):
        from_hf_config(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{ not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        from_hf_config(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        from_hf_config(tmp_path / "list.json")
    with pytest.raises(ValueError, match="path_or_dict: must be a path"):
        from_hf_config(42)


def test_load_model_unknown_name_lists_the_shipped_ones():
    with pytest.raises(ValueError, match=r"name: unknown model 'llama-9'.*bonsai-27b"):
        load_model("llama-9")


@pytest.mark.parametrize("li", [-1, 32, 1000, 1.0, "3", True, None])
def test_layer_out_of_range_names_layer_and_the_range(li):
    with pytest.raises(ValueError, match=r"layer: .*0\.\.31"):
        load_model("llama-3.1-8b").layer(li)


def test_layer_config_rejects_inconsistent_fields():
    with pytest.raises(ValueError, match="ffn_kind"):
        LayerConfig(index=0, mixer=Mixer.MAMBA2, ffn_dim=0, ffn_kind="moe")
    with pytest.raises(ValueError, match="ffn_dim/ffn_kind"):
        LayerConfig(index=0, mixer=Mixer.MAMBA2, ffn_dim=10, ffn_kind="none")
    with pytest.raises(ValueError, match="num_q_heads/num_kv_heads/head_dim"):
        LayerConfig(index=0, mixer=Mixer.ATTENTION)
    with pytest.raises(ValueError, match="num_q_heads: must be a multiple"):
        LayerConfig(index=0, mixer=Mixer.ATTENTION, num_q_heads=6, num_kv_heads=4, head_dim=8)
    with pytest.raises(ValueError, match="mixer"):
        LayerConfig(index=0, mixer="attention")
    with pytest.raises(ValueError, match="pre_norm"):
        LayerConfig(index=0, mixer=Mixer.MAMBA2, pre_norm="layernorm")


def test_model_config_rejects_inconsistent_layers():
    cfg = ModelConfig.synthetic(64, ffn_dim=80)
    with pytest.raises(ValueError, match="layers: need num_layers=2"):
        dataclasses.replace(cfg, num_layers=2)
    with pytest.raises(ValueError, match="indices must run"):
        dataclasses.replace(cfg, layers=(dataclasses.replace(cfg.layer(0), index=3),))


def test_replace_layer_changes_one_layer_only():
    cfg = load_model("llama-3.1-8b")
    new = replace_layer(cfg, 5, o_bias=True)
    assert new.layer(5).o_bias and not cfg.layer(5).o_bias
    assert [lc.o_bias for lc in new.layers].count(True) == 1


def test_every_issue_family_is_known():
    for t in (
        "qwen3_5",
        "qwen3_next",
        "llama",
        "qwen3",
        "mistral",
        "gemma2",
        "gemma3_text",
        "olmo2",
        "granite",
        "granitemoehybrid",
        "falcon_h1",
        "nemotron_h",
        "jamba",
        "gpt_oss",
    ):
        assert t in FAMILIES


# -- properties ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["full_attention", "linear_attention"]), min_size=1, max_size=40))
def test_qwen_hybrid_attention_layers_are_exactly_the_full_attention_entries(types):
    d = raw("qwen3.5-9b")
    d["text_config"].update(layer_types=types, num_hidden_layers=len(types))
    cfg = from_hf_config(d)
    assert cfg.attention_layers() == [i for i, t in enumerate(types) if t == "full_attention"]


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="M*-E", min_size=1, max_size=60))
def test_nemotron_pattern_maps_each_character_to_one_block(pattern):
    d = raw("nemotron-h-8b")
    d.update(
        hybrid_override_pattern=pattern,
        num_hidden_layers=len(pattern),
        moe_intermediate_size=1856,
        n_routed_experts=128,
    )
    cfg = from_hf_config(d)
    assert cfg.attention_layers() == [i for i, c in enumerate(pattern) if c == "*"]
    assert [lc.ffn_dim == 0 for lc in cfg.layers] == [c in "M*" for c in pattern]


def test_bonsai_pack_model_type_reads_as_qwen3_5():
    d = raw("bonsai-27b")
    d["model_type"] = "prism_hadamard_qwen35"
    cfg = from_hf_config(d)
    assert cfg.attention_layers() == list(range(3, 64, 4)) and cfg.model_type == "prism_hadamard_qwen35"
