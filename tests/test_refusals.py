"""Refusal rules: per-layer verdicts for every shipped model, derived by hand.

How the expected verdicts below were derived: from each data/models/<name>.json,
reading (1) which layers are attention (``layer_types`` / ``full_attention_interval``,
``hybrid_override_pattern``, ``attn_layer_period/offset``, or all of them), (2) the
FFN at each layer (``intermediate_size`` dense / ``num_experts`` routed, the
activation key), and (3) the extras frink-models asks about (``residual_multiplier``,
``attention_bias``, the family's norm placement, Falcon-H1's parallel Mamba-2, the
gpt-oss flag), then walking frink-models' chain in its order and writing down every term
that holds. Nothing is read back from the code under test.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import workbench.models.refusals as refusals_mod
from workbench.fold.rotation import HadamardFold
from workbench.models.config import Mixer, ModelConfig, replace_layer
from workbench.models.loader import list_models, load_model
from workbench.models.refusals import (
    HeadRefusal,
    Refusal,
    eligible,
    explain,
    head_launch_refusals,
    layer_refusals,
    model_summary,
    refusal_table,
    tail_verdicts,
)

R = Refusal
NEMOTRON_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"


def _qwen_hybrid(i: int) -> list[Refusal]:
    # layer_types: full_attention where (i + 1) % 4 == 0, else Gated DeltaNet; every
    # layer a dense SwiGLU (hidden_act silu); no model-level extras; the output gate is
    # before wo and not a condition.
    return [] if i % 4 == 3 else [R.NOT_GQA]


def _qwen_next(i: int) -> list[Refusal]:
    # full_attention_interval 4; num_experts 512, decoder_sparse_step 1, mlp_only_layers
    # [] => routed experts in every layer.
    return [R.NO_DENSE_FFN] if i % 4 == 3 else [R.NOT_GQA, R.NO_DENSE_FFN]


def _granite4(i: int) -> list[Refusal]:
    # layer_types: attention at 5, 15, 25, 35, else mamba; shared_mlp dense SwiGLU in
    # every layer (num_local_experts 0); residual_multiplier 0.22.
    return [R.RESIDUAL_SCALE] if i in (5, 15, 25, 35) else [R.NOT_GQA, R.RESIDUAL_SCALE]


def _nemotron(i: int) -> list[Refusal]:
    # One mixer per block: '*' attention with no FFN; 'M' Mamba-2 with no FFN;
    # '-' an MLP block (mlp_hidden_act relu2, no gate).
    return {"*": [R.NO_FFN], "M": [R.NOT_GQA, R.NO_FFN], "-": [R.NOT_GQA, R.NOT_ALL_SWIGLU]}[NEMOTRON_PATTERN[i]]


def _jamba(i: int) -> list[Refusal]:
    # attention where i % 8 == 4, else Mamba; routed experts where i % 2 == 1, else a
    # dense SwiGLU MLP. Attention layers (even) are therefore plain.
    if i % 8 == 4:
        return []
    return [R.NOT_GQA, R.NO_DENSE_FFN] if i % 2 == 1 else [R.NOT_GQA]


EXPECTED = {
    "bonsai-27b": _qwen_hybrid,
    "qwen3.5-9b": _qwen_hybrid,
    "qwen3-next-80b-a3b": _qwen_next,
    # Llama / Qwen3 / Mistral: all GQA, dense SwiGLU, attention_bias false (Mistral has
    # none), post_attention_layernorm is the pre-FFN norm: nothing refuses.
    "llama-3.1-8b": lambda i: [],
    "qwen3-8b": lambda i: [],
    "mistral-7b": lambda i: [],
    # Gemma 2/3: hidden_activation gelu_pytorch_tanh (GeGLU) and a real norm on the
    # attention output -- in chain order NOT_ALL_SWIGLU comes before POST_ATTN_NORM.
    "gemma-2-9b": lambda i: [R.NOT_ALL_SWIGLU, R.POST_ATTN_NORM],
    "gemma-3-1b": lambda i: [R.NOT_ALL_SWIGLU, R.POST_ATTN_NORM],
    # OLMo 2: silu MLP, norm on the attention output (and none before Q/K/V).
    "olmo-2-7b": lambda i: [R.POST_ATTN_NORM],
    # Granite 3.1: plain Llama shape except residual_multiplier 0.22.
    "granite-3.1-8b": lambda i: [R.RESIDUAL_SCALE],
    "granite-4.0-h-micro": _granite4,
    # Falcon-H1: every layer attention + a parallel Mamba-2 branch; SwiGLU MLP.
    "falcon-h1-7b": lambda i: [R.PARALLEL_SSM],
    "nemotron-h-8b": _nemotron,
    "jamba-v0.1": _jamba,
    # gpt-oss: frink-models' gpt-oss flag; its clamped (up + 1) * gate * sigmoid(1.702 gate)
    # is not silu(gate) * up; attention_bias true puts a bias on o_proj too; 32 routed
    # experts and no dense FFN. (reference/models.md lists GPT_OSS, O_BIAS, NO_DENSE_FFN;
    # NOT_ALL_SWIGLU holds as well and is listed because every reason is.)
    "gpt-oss-20b": lambda i: [R.GPT_OSS, R.NOT_ALL_SWIGLU, R.O_BIAS, R.NO_DENSE_FFN],
}


def test_every_shipped_model_has_hand_derived_verdicts():
    assert sorted(EXPECTED) == list_models()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_per_layer_verdicts_match_the_hand_derivation(name):
    cfg = load_model(name)
    for li in range(cfg.num_layers):
        assert layer_refusals(cfg, li) == EXPECTED[name](li), f"{name} layer {li}"


@pytest.mark.parametrize(
    "name,n_attn,n_ok",
    [
        ("bonsai-27b", 16, 16),
        ("qwen3.5-9b", 8, 8),
        ("qwen3-next-80b-a3b", 12, 0),
        ("llama-3.1-8b", 32, 32),
        ("qwen3-8b", 36, 36),
        ("mistral-7b", 32, 32),
        ("gemma-2-9b", 42, 0),
        ("gemma-3-1b", 26, 0),
        ("olmo-2-7b", 32, 0),
        ("granite-3.1-8b", 40, 0),
        ("granite-4.0-h-micro", 4, 0),
        ("falcon-h1-7b", 44, 0),
        ("nemotron-h-8b", 4, 0),
        ("jamba-v0.1", 4, 4),
        ("gpt-oss-20b", 24, 0),
    ],
)
def test_eligible_tail_counts(name, n_attn, n_ok):
    cfg = load_model(name)
    verdicts = tail_verdicts(cfg)
    assert len(verdicts) == n_attn
    assert sum(eligible(cfg, li) for li in verdicts) == n_ok


def test_bonsai_all_sixteen_tails_fuse_saving_sixteen_waits():
    s = model_summary([load_model("bonsai-27b")]).iloc[0]
    assert (s.attention_layers, s.eligible_tails, s.waits_saved, s.reasons) == (16, 16, 16, "")


# -- the traps, as verdicts --------------------------------------------------------------------


def test_trap_llama_post_attention_layernorm_does_not_refuse():
    assert all(eligible(load_model("llama-3.1-8b"), li) for li in range(32))


def test_trap_qwen35_output_gate_does_not_refuse():
    cfg = load_model("bonsai-27b")
    assert cfg.layer(63).attn_output_gate and eligible(cfg, 63)


def test_trap_gemma_and_olmo2_post_attention_norm_refuses():
    for name in ("gemma-2-9b", "gemma-3-1b", "olmo-2-7b"):
        assert R.POST_ATTN_NORM in layer_refusals(load_model(name), 0)


def test_trap_nemotron_attention_block_has_no_ffn():
    assert layer_refusals(load_model("nemotron-h-8b"), 7) == [R.NO_FFN]


def test_trap_jamba_attention_layers_fuse_though_the_model_has_experts():
    jamba = load_model("jamba-v0.1")
    assert [li for li in range(32) if eligible(jamba, li)] == [4, 12, 20, 28]
    assert R.NO_DENSE_FFN in layer_refusals(jamba, 5)


def test_trap_granite_residual_multiplier_refuses():
    assert layer_refusals(load_model("granite-3.1-8b"), 0) == [R.RESIDUAL_SCALE]


def test_trap_falcon_h1_parallel_mamba_refuses():
    assert layer_refusals(load_model("falcon-h1-7b"), 0) == [R.PARALLEL_SSM]


def test_trap_gpt_oss_bias_and_experts_refuse():
    found = layer_refusals(load_model("gpt-oss-20b"), 1)
    assert {R.GPT_OSS, R.O_BIAS, R.NO_DENSE_FFN} <= set(found)


# -- every condition, one at a time ----------------------------------------------------------

PLAIN = ModelConfig.synthetic(64, ffn_dim=80, num_q_heads=4, num_kv_heads=2, head_dim=24)

ONE_AT_A_TIME = {
    R.NOT_GQA: lambda c: replace_layer(c, 0, mixer=Mixer.LINEAR_ATTENTION),
    R.NO_FFN: lambda c: replace_layer(c, 0, ffn_dim=0, ffn_kind="none", ffn_act="none"),
    R.RESIDUAL_SCALE: lambda c: dataclasses.replace(c, residual_scale=0.22),
    R.NORMED_RESIDUAL_SCALE: lambda c: dataclasses.replace(c, normed_residual_scale=0.5),
    R.SKIP_STREAM: lambda c: dataclasses.replace(c, skip_stream=True),
    R.GPT_OSS: lambda c: dataclasses.replace(c, gpt_oss=True),
    R.NOT_ALL_SWIGLU: lambda c: replace_layer(c, 0, ffn_act="geglu"),
    R.O_SCALE: lambda c: replace_layer(c, 0, o_scale=True),
    R.O_BIAS: lambda c: replace_layer(c, 0, o_bias=True),
    R.ATTN_VALUE_SCALE: lambda c: dataclasses.replace(c, attn_value_scale=2.0),
    R.POST_ATTN_NORM: lambda c: replace_layer(c, 0, post_attn_norm=True),
    R.PARALLEL_SSM: lambda c: replace_layer(c, 0, parallel_ssm=True),
    R.NO_DENSE_FFN: lambda c: replace_layer(c, 0, ffn_kind="experts", num_experts=8),
    R.FFN_BIAS: lambda c: replace_layer(c, 0, ffn_bias=True),
}


def test_the_plain_synthetic_layer_is_eligible():
    assert layer_refusals(PLAIN, 0) == [] and eligible(PLAIN, 0)


@pytest.mark.parametrize("reason", list(ONE_AT_A_TIME), ids=lambda r: r.name)
def test_each_condition_alone_refuses_with_exactly_its_reason(reason):
    cfg = ONE_AT_A_TIME[reason](PLAIN)
    assert layer_refusals(cfg, 0) == [reason]
    assert not eligible(cfg, 0)


def test_kernels_disabled_refuses_everything_and_comes_first():
    assert layer_refusals(PLAIN, 0, kernels_enabled=False) == [R.KERNELS_DISABLED]
    assert not eligible(PLAIN, 0, kernels_enabled=False)
    gem = load_model("gemma-2-9b")
    assert layer_refusals(gem, 3, kernels_enabled=False) == [R.KERNELS_DISABLED, R.NOT_ALL_SWIGLU, R.POST_ATTN_NORM]


@settings(max_examples=200, deadline=None)
@given(st.sets(st.sampled_from(list(ONE_AT_A_TIME))))
def test_all_reasons_come_back_in_the_seeds_order(chosen):
    cfg = PLAIN
    # NO_FFN last: it removes the FFN the other edits describe.
    for r in sorted(chosen, key=lambda r: (r is R.NO_FFN, r.value)):
        cfg = ONE_AT_A_TIME[r](cfg)
    # A layer with no FFN is NO_FFN alone: it cannot also be not-SwiGLU or not-dense.
    expect = set(chosen)
    if R.NO_FFN in expect:
        expect -= {R.NOT_ALL_SWIGLU, R.NO_DENSE_FFN, R.FFN_BIAS}
    found = layer_refusals(cfg, 0)
    assert set(found) == expect
    assert found == sorted(found, key=lambda r: r.value)
    assert eligible(cfg, 0) == (not found)


def test_refusal_members_are_the_seeds_conditions_in_its_order():
    assert [r.name for r in Refusal] == [
        "KERNELS_DISABLED",
        "NOT_GQA",
        "NO_FFN",
        "RESIDUAL_SCALE",
        "NORMED_RESIDUAL_SCALE",
        "SKIP_STREAM",
        "GPT_OSS",
        "NOT_ALL_SWIGLU",
        "O_SCALE",
        "O_BIAS",
        "ATTN_VALUE_SCALE",
        "POST_ATTN_NORM",
        "PARALLEL_SSM",
        "NO_DENSE_FFN",
        "FFN_BIAS",  # the last is the workbench's
    ]


@pytest.mark.parametrize("r", list(Refusal) + list(HeadRefusal), ids=lambda r: f"{type(r).__name__}.{r.name}")
def test_every_reason_has_a_one_line_explanation(r):
    assert isinstance(r.explanation, str) and r.explanation and "\n" not in r.explanation


def test_explain_prints_one_line_a_reason():
    text = explain([R.O_BIAS, R.NO_FFN])
    assert text.splitlines()[0].startswith("O_BIAS: ") and len(text.splitlines()) == 2


# -- one body ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_eligible_agrees_with_refusals_everywhere(name):
    cfg = load_model(name)
    for li in range(cfg.num_layers):
        for k in (True, False):
            assert eligible(cfg, li, kernels_enabled=k) == (layer_refusals(cfg, li, kernels_enabled=k) == [])


def test_eligible_is_decided_by_the_refusals_body(monkeypatch):
    # eligible holds no rule of its own: replace the body and eligible follows it. The
    # tail's launch builder calls the same `layer_refusals`, so the two cannot disagree.
    calls = []

    def fake(cfg, layer, *, kernels_enabled=True):
        calls.append((cfg.name, layer, kernels_enabled))
        return [R.SKIP_STREAM]

    monkeypatch.setattr(refusals_mod, "layer_refusals", fake)
    assert refusals_mod.eligible(PLAIN, 0) is False
    assert calls == [("synthetic", 0, True)]


def test_refusals_is_pure():
    cfg = load_model("gpt-oss-20b")
    a = layer_refusals(cfg, 0)
    a.clear()
    assert layer_refusals(cfg, 0) == [R.GPT_OSS, R.NOT_ALL_SWIGLU, R.O_BIAS, R.NO_DENSE_FFN]
    assert cfg == load_model("gpt-oss-20b")


@pytest.mark.parametrize("li", [-1, 64, 2.0])
def test_layer_out_of_range_is_a_clear_error(li):
    cfg = load_model("bonsai-27b")
    for f in (layer_refusals, eligible, head_launch_refusals):
        with pytest.raises(ValueError, match=r"layer: .*0\.\.63"):
            f(cfg, li)


# -- tables ------------------------------------------------------------------------------------


def test_refusal_table_one_row_per_layer():
    t = refusal_table(load_model("jamba-v0.1"))
    assert list(t.columns) == ["layer", "mixer", "eligible", "reasons"]
    assert list(t.layer) == list(range(32))
    assert t.loc[4].to_dict() == {"layer": 4, "mixer": "attention", "eligible": True, "reasons": ""}
    assert t.loc[5].to_dict() == {"layer": 5, "mixer": "mamba2", "eligible": False, "reasons": "NOT_GQA, NO_DENSE_FFN"}


def test_model_summary_counts_reasons_over_the_tails_only():
    s = model_summary([load_model("nemotron-h-8b"), load_model("gpt-oss-20b")]).set_index("model")
    # Nemotron-H: the 48 Mamba/MLP blocks have no tail; the 4 attention blocks are NO_FFN.
    assert s.loc["nemotron-h-8b", "reasons"] == "NO_FFN x4"
    assert s.loc["gpt-oss-20b", "reasons"] == "GPT_OSS x24, NOT_ALL_SWIGLU x24, O_BIAS x24, NO_DENSE_FFN x24"
    assert list(s.columns) == ["layers", "attention_layers", "eligible_tails", "waits_saved", "reasons"]
    assert isinstance(s, pd.DataFrame)


# -- the head launch ------------------------------------------------------------------------------


def test_head_launch_plain_layer_unfolded_and_folded():
    bonsai = load_model("bonsai-27b")
    assert head_launch_refusals(bonsai, 3) == []
    f = HadamardFold.random(5120, 1024, seed=1)
    assert head_launch_refusals(bonsai, 3, q_fold=f, k_fold=f, v_fold=f) == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_dead_q_bias_clause_never_refuses(name):
    # frink-models: `!Gqa || layer.attn.q_bias.is_some() && false`; `&&` binds tighter, and
    # `x && false` is false for every x, so a Q bias changes nothing anywhere.
    cfg = load_model(name)
    for li in range(cfg.num_layers):
        assert head_launch_refusals(cfg, li, q_bias=True) == head_launch_refusals(cfg, li, q_bias=False)


def test_head_launch_refuses_what_is_not_gqa_and_olmo2s_missing_pre_norm():
    assert head_launch_refusals(load_model("bonsai-27b"), 0) == [HeadRefusal.NOT_GQA]
    assert head_launch_refusals(load_model("olmo-2-7b"), 0) == [HeadRefusal.PRE_NORM_NOT_RMS]


def test_head_launch_kernels():
    cfg = load_model("llama-3.1-8b")
    assert head_launch_refusals(cfg, 0, q_kernel=False, v_kernel=False) == [
        HeadRefusal.Q_NO_KERNEL,
        HeadRefusal.V_NO_KERNEL,
    ]
    assert head_launch_refusals(cfg, 0, k_kernel=False) == [HeadRefusal.K_NO_KERNEL]


def test_head_launch_folds_must_be_one_rotation():
    cfg = load_model("llama-3.1-8b")
    f = HadamardFold.random(4096, 128, seed=2)
    twin = HadamardFold(f.block, f.signs.copy(), None)  # equal values, another object
    assert twin.same_rotation(f)
    assert head_launch_refusals(cfg, 0, q_fold=f, k_fold=f, v_fold=twin) == [HeadRefusal.FOLDS_DIFFER]
    assert head_launch_refusals(cfg, 0, q_fold=f, k_fold=f) == [HeadRefusal.FOLDS_DIFFER]
    assert head_launch_refusals(cfg, 0, k_fold=f, v_fold=f) == [HeadRefusal.FOLDS_DIFFER]


def test_head_launch_fold_must_fit_the_hidden_width():
    cfg = load_model("llama-3.1-8b")  # hidden 4096
    wrong_dim = HadamardFold.random(2048, 128, seed=3)
    assert head_launch_refusals(cfg, 0, q_fold=wrong_dim, k_fold=wrong_dim, v_fold=wrong_dim) == [
        HeadRefusal.FOLD_DOES_NOT_FIT
    ]
    gemma = load_model("gemma-3-1b")  # hidden 1152 = 9 * 128: a block of 1024 cannot tile it
    no_signs = HadamardFold(1024)
    assert head_launch_refusals(gemma, 0, q_fold=no_signs, k_fold=no_signs, v_fold=no_signs) == [
        HeadRefusal.FOLD_DOES_NOT_FIT
    ]
    with pytest.raises(ValueError, match="q_fold"):
        head_launch_refusals(cfg, 0, q_fold=np.ones(4), k_fold=None)


# -- the figure ------------------------------------------------------------------------------------


def test_plot_refusal_map_draws_one_row_a_model():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workbench.reports.plots import plot_refusal_map

    cfgs = [load_model("bonsai-27b"), load_model("nemotron-h-8b")]
    fig = plot_refusal_map(cfgs)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["bonsai-27b", "nemotron-h-8b"]
    grid = ax.images[0].get_array()
    assert grid.shape == (2, 64)
    assert grid[0, 3] == 2 and grid[0, 0] == 1  # eligible tail; Gated DeltaNet layer
    assert grid[1, 7] == 2 + Refusal.NO_FFN.value and grid[1, 60] == 0  # first reason; past the end
    plt.close(fig)
    with pytest.raises(ValueError, match="cfgs"):
        plot_refusal_map([])
