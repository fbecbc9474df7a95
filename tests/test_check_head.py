"""The attention head as a part of the check (``workbench.check.head_*``): its float64 truth
against mlx-lm's own modules, its faults caught where they should be, and bad input named."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench.check import (
    DEFAULT_HEAD_SPECS,
    HEAD_FAULTS,
    CallableHead,
    HeadSpec,
    HeadWeights,
    check_head,
    head_exact,
    part,
)
from workbench.check.head_cases import draw_head_cases
from workbench.check.head_math import applies, head_block


def numpy_head(fault=None):
    """A float32 numpy head (the fault models' arithmetic), one case at a time, as a user's callable."""

    def fn(h):
        c = {
            k: None if getattr(h, k) is None else np.asarray(getattr(h, k), np.float32)[None]
            for k in HeadWeights.ARRAYS
        }
        w = HeadWeights(**c, rotations=() if h.fold is None else (h.fold,))
        out = head_block(h.spec, w, np.asarray(h.hidden, np.float32)[None], np.array([h.position]), fault=fault)
        return tuple(out[k][0] for k in h.spec.outputs)

    fn.__qualname__ = f"numpy_head[{fault}]"
    return fn


def mlx_lm_head(spec: HeadSpec):
    """mlx-lm 0.32.2's Qwen3NextAttention (Qwen3.5's attention) and an nn.RMSNorm input norm,
    built from a tiny config, each case's weights loaded into its modules, run in __call__'s order."""
    from mlx_lm.models import qwen3_next as q3

    args = q3.ModelArgs(
        model_type="qwen3_next",
        hidden_size=spec.hidden,
        num_hidden_layers=1,
        intermediate_size=64,
        num_attention_heads=spec.q_heads,
        linear_num_value_heads=2,
        linear_num_key_heads=1,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=0,
        num_experts_per_tok=0,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=0,
        mlp_only_layers=[],
        moe_intermediate_size=0,
        rms_norm_eps=spec.eps,
        vocab_size=16,
        num_key_value_heads=spec.kv_heads,
        rope_theta=spec.rope_theta,
        partial_rotary_factor=spec.rotary_dim / spec.head_dim,
        max_position_embeddings=1 << 16,
        head_dim=spec.head_dim,
    )
    attn = q3.Qwen3NextAttention(args)
    norm = __import__("mlx.nn", fromlist=["RMSNorm"]).RMSNorm(spec.hidden, eps=spec.eps)

    def fn(h):
        norm.weight = h.attn_norm
        attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight = h.q_w, h.k_w, h.v_w
        attn.q_norm.weight, attn.k_norm.weight = h.q_norm, h.k_norm
        x = norm(h.hidden.reshape(1, 1, -1))
        b, n = 1, 1
        queries, gate = mx.split(attn.q_proj(x).reshape(b, n, attn.num_attention_heads, -1), 2, axis=-1)
        keys, values = attn.k_proj(x), attn.v_proj(x)
        queries = attn.q_norm(queries).transpose(0, 2, 1, 3)
        keys = attn.k_norm(keys.reshape(b, n, attn.num_key_value_heads, -1)).transpose(0, 2, 1, 3)
        queries, keys = attn.rope(queries, offset=h.position), attn.rope(keys, offset=h.position)
        return queries.reshape(-1), keys.reshape(-1), values.reshape(-1), gate.reshape(-1)

    return fn


def test_mlx_lm_qwen35_attention_head_judged_correct_at_several_positions():
    spec = DEFAULT_HEAD_SPECS["model"]
    rep = check_head(
        CallableHead(mlx_lm_head(spec), arrays="mlx"),
        specs=[spec],
        seeds=range(12),
        positions=(0, 1, 100, 4095),
        faults=(),
    )
    assert rep.passed, str(rep)
    assert sorted({c["position"] for c in rep.conditions}) == [0, 1, 100, 4095]
    # its errors are those of float32 arithmetic against the float64 truth
    assert np.nanmax(rep.errors["subject"]) < 1e-4


def test_truth_is_float64_and_the_reference_and_numpy_float32_agree_with_it():
    for spec in DEFAULT_HEAD_SPECS.values():
        cases = draw_head_cases(spec, range(4), scale=1.0)
        one = cases.weights.case(2)
        exact = head_exact(spec, one, cases.hidden[2], position=7)
        assert all(v.dtype == np.float64 for v in exact.values()) and tuple(exact) == spec.outputs
        rep = check_head(numpy_head(), specs=[spec], seeds=range(8), positions=(7,), faults=())
        assert rep.passed and np.nanmax(rep.errors["reference"]) < 1e-5


def test_part_head_is_registered_with_its_pieces():
    p = part("head")
    assert p.name == "head" and p.oracle is head_exact and p.faults is HEAD_FAULTS
    assert set(p.axes) == {"specs", "scales", "positions"}


@pytest.mark.parametrize("fault", list(HEAD_FAULTS))
def test_each_fault_fails_where_it_should(fault):
    specs = [s for s in DEFAULT_HEAD_SPECS.values() if applies(fault, s)]
    rep = check_head(numpy_head(fault), specs=specs, seeds=range(12), faults=())
    assert not rep.passed
    failing = {(c["scale"], c["position"]) for t, c in zip(rep.tests, rep.conditions) if t.rejected}
    if fault == "eps_outside_root":  # eps shows only where mean x^2 is near it
        assert {s for s, _ in failing} == {1e-3}
    elif fault in ("rope_halves_swapped", "rope_interleaved", "rope_full_width"):  # RoPE is the identity at 0
        assert failing and all(p > 0 for _, p in failing)
        assert len(failing) == len(rep.conditions) - 2
    else:
        assert len(failing) == len(rep.conditions)


def test_a_wrong_return_is_named_by_part_case_and_tensor():
    def short_k(h):
        q, k, v, g = numpy_head()(h)
        return q, k[:-1], v, g

    rep = check_head(short_k, seeds=range(3), positions=(0,), faults=())
    assert not rep.passed
    assert rep.problems[0].startswith("part head, case qwen3.5-like") and "tensor k: returned shape" in rep.problems[0]


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"specs": ["nope"]}, "specs"),
        ({"positions": [-1]}, "positions"),
        ({"scales": [0]}, "scales"),
        ({"faults": ["rope_sideways"]}, "faults"),
    ],
)
def test_bad_arguments_are_named(kw, named):
    with pytest.raises(ValueError, match=rf"^{named}: "):
        check_head(numpy_head(), **kw)


def test_a_spec_refuses_what_its_shape_cannot_have():
    with pytest.raises(ValueError, match="^shape: the 'launch' head has no QK-norm"):
        HeadSpec("launch", 64, 4, 2, 16, qk_norm=True)
    with pytest.raises(ValueError, match="^rotary_dim: must be even"):
        HeadSpec("model", 64, 4, 2, 16, rotary_dim=5)
