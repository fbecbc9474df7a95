"""Chain implementations written outside the workbench's code, for the chain's tests, notebook
11 and the command's (``tests.check_user_chains:qwen35_chain``).

:func:`qwen35_chain` is mlx-lm 0.32.2's own Qwen3.5 decoder layers (mlx_lm/models/qwen3_5.py:
``DecoderLayer``, ``GatedDeltaNet``) at the chain's tiny config, float32, the case's random
weights loaded into them: the attention layer's ``DecoderLayer.__call__`` run as written, its
attention's output standing for ``o_proj(branch)`` (the tail begins at ``o_proj``), then the
next, linear-attention layer's input norm, projections and ``GatedDeltaNet.__call__`` with
an ``ArraysCache`` holding the case's conv and recurrent state, its ``out_proj`` an identity
(the gdn part's output is before it).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np


class _Branch(nn.Module):
    """The attention module's place in mlx-lm's ``DecoderLayer``: returns ``o_proj(branch)``."""

    def __init__(self, o_proj: nn.Linear):
        super().__init__()
        self.o_proj = o_proj
        self.branch = mx.zeros((o_proj.weight.shape[1],))

    def __call__(self, x, mask=None, cache=None):
        return self.o_proj(self.branch)[None, None]


def _args(dims):
    from mlx_lm.models.qwen3_5 import TextModelArgs

    return TextModelArgs(
        model_type="qwen3_5_text",
        hidden_size=dims.hidden,
        intermediate_size=dims.ffn,
        num_hidden_layers=2,
        num_attention_heads=dims.branch // 16,
        num_key_value_heads=1,
        head_dim=16,
        rms_norm_eps=dims.eps,
        vocab_size=16,
        linear_num_value_heads=dims.v_heads,
        linear_num_key_heads=dims.k_heads,
        linear_key_head_dim=dims.k_dim,
        linear_value_head_dim=dims.v_dim,
        linear_conv_kernel_dim=dims.conv,
        full_attention_interval=2,
    )


def qwen35_layers(case):
    """mlx-lm's attention layer (index 1) and linear-attention layer (index 2), the case's weights in."""
    from mlx_lm.models.qwen3_5 import DecoderLayer

    args = _args(case.dims)
    attn, lin = DecoderLayer(args, 1), DecoderLayer(args, 2)
    assert not attn.is_linear and lin.is_linear
    t, g, s = case.weights["tail"], case.weights["gdn_in"], case.weights["gdn"]
    a = mx.array
    attn.self_attn = _Branch(attn.self_attn.o_proj)
    attn.load_weights(
        [
            ("self_attn.o_proj.weight", a(t["wo"])),
            ("post_attention_layernorm.weight", a(t["ffn_norm"])),
            ("mlp.gate_proj.weight", a(t["gate"])),
            ("mlp.up_proj.weight", a(t["up"])),
            ("mlp.down_proj.weight", a(t["down"])),
        ],
        strict=False,
    )
    lin.linear_attn.out_proj = nn.Identity()
    lin.load_weights(
        [
            ("input_layernorm.weight", a(g["input_norm"])),
            *((f"linear_attn.{k}.weight", a(g[k])) for k in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")),
            ("linear_attn.conv1d.weight", a(np.ascontiguousarray(s["conv_w"].T[:, :, None]))),
            ("linear_attn.A_log", a(s["a_log"])),
            ("linear_attn.dt_bias", a(s["dt_bias"])),
            ("linear_attn.norm.weight", a(s["o_norm"])),
        ],
        strict=False,
    )
    return attn, lin


def qwen35_chain(case, *, layers=None):
    """The chain (tail, gdn_in, gdn) through mlx-lm's Qwen3.5 layers: every link's outputs."""
    from mlx_lm.models.cache import ArraysCache

    attn, lin = qwen35_layers(case) if layers is None else layers
    x = case.inputs
    attn.self_attn.branch = mx.array(x["branch"])
    hidden = attn(mx.array(x["residual"])[None, None])  # DecoderLayer.__call__: h = x + r; h + mlp(norm(h))
    xn = lin.input_layernorm(hidden)
    la = lin.linear_attn
    mixed, z, b, a = (getattr(la, k)(xn) for k in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))
    cache = ArraysCache(size=2)
    cache[0], cache[1] = mx.array(x["conv_state"])[None], mx.array(x["state"])[None]
    out = la(xn, None, cache)
    flat = lambda v: v.reshape(-1)  # noqa: E731
    return {
        "tail": flat(hidden),
        "gdn_in": (flat(mixed), flat(z), flat(b), flat(a)),
        "gdn": (flat(out), cache[0][0], cache[1][0]),
    }


def numpy_link(link):
    """One link in float32 numpy from the formulas, for a chain given as a callable a link."""

    def rms(x, w, eps):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(eps)) * w

    def tail(c):
        w, x = c.weights, c.inputs
        h = x["residual"] + w["wo"] @ x["branch"]
        n = rms(h, w["ffn_norm"], c.dims.eps)
        g = w["gate"] @ n
        return h + w["down"] @ (g / (np.float32(1) + np.exp(-g)) * (w["up"] @ n))

    def gdn_in(c):
        w = c.weights
        n = rms(c.inputs["hidden"], w["input_norm"], c.dims.eps)
        return tuple(w[k] @ n for k in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))

    return {"tail": tail, "gdn_in": gdn_in}[link]


def tail_without_second_add(c):
    """The tail with a fault: the second residual add dropped (``ffn`` alone returned)."""
    return numpy_link("tail")(c) - (c.inputs["residual"] + c.weights["wo"] @ c.inputs["branch"])


def qwen35_chain_bf16_state(case):
    """mlx-lm's chain with a faulty recurrent step: its state kept as bfloat16 between tokens
    (the ollama bug; returned in a float32 buffer)."""
    out = qwen35_chain(case)
    o, conv, st = out["gdn"]
    out["gdn"] = (o, conv, st.astype(mx.bfloat16).astype(mx.float32))
    return out


def qwen35_chain_zero_centred_twice(case):
    """mlx-lm's chain with a faulty input norm: its weight read as zero-centred (``1 + w``)
    although it is stored as the scale itself (the Qwen3.5 checkpoint convention applied twice)."""
    attn, lin = qwen35_layers(case)
    lin.input_layernorm.weight = 1 + lin.input_layernorm.weight
    return qwen35_chain(case, layers=(attn, lin))


def mlx_lm_gdn_link(c):
    """The gdn link around mlx-lm's own recurrence (``gated_delta_ops``; tests.test_check_gdn)."""
    from types import SimpleNamespace

    from tests.test_check_gdn import mlx_lm_step

    s = SimpleNamespace(**{k: mx.array(v) for k, v in {**c.inputs, **c.weights}.items()})
    s.eps, s.k_heads = c.dims.eps, c.dims.k_heads
    return mlx_lm_step("ops")(s)


def mlx_lm_head_link(c):
    """The head link as mlx-lm's Qwen3NextAttention runs it (tests.test_check_head's ``mlx_lm_head``)."""
    from types import SimpleNamespace

    from tests.test_check_head import mlx_lm_head

    h = SimpleNamespace(**{k: mx.array(v) for k, v in {**c.inputs, **c.weights}.items()})
    h.position = c.dims.position
    return mlx_lm_head(c.dims.head_spec())(h)


def mlx_lm_head_rope_at_next_position(c):
    """The head with a fault: RoPE at position + 1 (the cache's offset read after its update)."""
    from dataclasses import replace

    return mlx_lm_head_link(replace(c, dims=replace(c.dims, position=c.dims.position + 1)))


#: The recurrent run's last step, the layer's out_proj and FFN as the tail, the next head: a
#: callable a link, mlx-lm's recurrence and attention head around a numpy tail.
RUN_END = {"gdn": mlx_lm_gdn_link, "tail": numpy_link("tail"), "head": mlx_lm_head_link}
