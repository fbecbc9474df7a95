"""Attention heads a user might write, importable by path for the head's tests and command:
a float32 numpy head (correct, or given one fault model's bug), mlx-lm's own Qwen3.5 attention
modules, a Metal head body, and a dump written by docs/DUMP_LAYOUT.md's own block."""

from __future__ import annotations

import re
from pathlib import Path

import mlx.core as mx
import numpy as np

from workbench.check import DEFAULT_HEAD_SPECS, HeadSpec, HeadWeights
from workbench.check.head_cases import draw_head_cases
from workbench.check.head_math import head_block

ROOT = Path(__file__).resolve().parent.parent

#: The inputs, launch and template of :data:`METAL_BODY` (one thread a head).
METAL_INPUTS = ("hidden", "attn_norm", "q_w", "k_w", "v_w", "q_norm", "k_norm", "eps", "position", "rope_theta")
METAL_TEMPLATE = {"HID": "HID", "HQ": "HQ", "HKV": "HKV", "D": "D", "ROT": "ROT"}

#: A Metal head of the "model" shape (no biases, unfolded), one thread a head: HQ query heads
#: (each writing its gate too), HKV key heads, HKV value heads.
METAL_BODY = """
    uint t = thread_position_in_grid.x;
    if (t >= HQ + 2 * HKV) return;
    float ms = 0.0f;
    for (uint i = 0; i < HID; ++i) ms += hidden[i] * hidden[i];
    float inv = metal::rsqrt(ms / float(HID) + eps[0]);
    uint which = t < HQ ? 0 : (t < HQ + HKV ? 1 : 2);
    uint h = which == 0 ? t : (which == 1 ? t - HQ : t - HQ - HKV);
    const device float* w = which == 0 ? q_w : (which == 1 ? k_w : v_w);
    uint row0 = which == 0 ? h * 2 * D : h * D;   // q_proj: a head's D query rows, then its D gate rows
    float x[D], g[D];
    for (uint j = 0; j < D; ++j) {
        float acc = 0.0f, acc_g = 0.0f;
        for (uint i = 0; i < HID; ++i) {
            float n = hidden[i] * inv * attn_norm[i];
            acc += w[(row0 + j) * HID + i] * n;
            if (which == 0) acc_g += w[(row0 + D + j) * HID + i] * n;
        }
        x[j] = acc;
        g[j] = acc_g;
    }
    if (which == 2) {
        for (uint j = 0; j < D; ++j) v_out[h * D + j] = x[j];
        return;
    }
    float s = 0.0f;
    for (uint j = 0; j < D; ++j) s += x[j] * x[j];
    float r = metal::rsqrt(s / float(D) + eps[0]);
    const device float* nw = which == 0 ? q_norm : k_norm;
    for (uint j = 0; j < D; ++j) x[j] *= r * nw[j];
    for (uint i = 0; i < ROT / 2; ++i) {   // RoPE on the first ROT dims, i paired with i + ROT/2
        float a = position[0] * metal::pow(rope_theta[0], -2.0f * float(i) / float(ROT));
        float c = metal::cos(a), sn = metal::sin(a);
        float x1 = x[i], x2 = x[i + ROT / 2];
        x[i] = x1 * c - x2 * sn;
        x[i + ROT / 2] = x2 * c + x1 * sn;
    }
    device float* out = which == 0 ? q_out : k_out;
    for (uint j = 0; j < D; ++j) out[h * D + j] = x[j];
    if (which == 0) for (uint j = 0; j < D; ++j) gate_out[h * D + j] = g[j];
"""

#: The same head with RoPE's pairs interleaved (2i, 2i+1), as llama.cpp's NORM rope pairs them.
METAL_INTERLEAVED = METAL_BODY.replace(
    "float x1 = x[i], x2 = x[i + ROT / 2];", "float x1 = x[2 * i], x2 = x[2 * i + 1];"
)
METAL_INTERLEAVED = METAL_INTERLEAVED.replace("x[i] = x1 * c - x2 * sn;", "x[2 * i] = x1 * c - x2 * sn;").replace(
    "x[i + ROT / 2] = x2 * c + x1 * sn;", "x[2 * i + 1] = x2 * c + x1 * sn;"
)


def numpy_head(fault=None):
    """A float32 numpy head (the fault models' arithmetic), one case a call, as a user's callable."""

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


correct = numpy_head()
rope_interleaved = numpy_head("rope_interleaved")
eps_outside_root = numpy_head("eps_outside_root")


def mlx_lm_head(spec: HeadSpec):
    """mlx-lm 0.32.2's Qwen3NextAttention (Qwen3.5's attention) and an ``nn.RMSNorm`` input norm
    built from a tiny config, each case's weights loaded into its modules, run as its
    ``__call__`` runs them up to attention (q_proj split per head, q_norm/k_norm, rope at the
    offset); handed MLX arrays."""
    import mlx.nn as nn
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
    norm = nn.RMSNorm(spec.hidden, eps=spec.eps)

    def fn(h):
        norm.weight = h.attn_norm
        attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight = h.q_w, h.k_w, h.v_w
        attn.q_norm.weight, attn.k_norm.weight = h.q_norm, h.k_norm
        x = norm(h.hidden.reshape(1, 1, -1))
        queries, gate = mx.split(attn.q_proj(x).reshape(1, 1, attn.num_attention_heads, -1), 2, axis=-1)
        keys, values = attn.k_proj(x), attn.v_proj(x)
        queries = attn.q_norm(queries).transpose(0, 2, 1, 3)
        keys = attn.k_norm(keys.reshape(1, 1, attn.num_key_value_heads, -1)).transpose(0, 2, 1, 3)
        queries, keys = attn.rope(queries, offset=h.position), attn.rope(keys, offset=h.position)
        return queries.reshape(-1), keys.reshape(-1), values.reshape(-1), gate.reshape(-1)

    return fn


def mlx_lm_qwen35(h):
    """:func:`mlx_lm_head` of the default "model" spec, importable by path (``--arrays mlx``)."""
    global _MLX_LM
    if "_MLX_LM" not in globals():
        _MLX_LM = mlx_lm_head(DEFAULT_HEAD_SPECS["model"])
    return _MLX_LM(h)


def documented_block() -> str:
    """The head's writer block of docs/DUMP_LAYOUT.md, as printed there."""
    text = (ROOT / "docs" / "DUMP_LAYOUT.md").read_text()
    part = text[text.index("## The attention head") :]
    return re.search(r"```python\n(.*?)```", part, re.S).group(1)


def write_documented_dump(path: Path, head=correct, *, spec_name: str = "model", rows: int = 12) -> Path:
    """A dump at ``path`` written by the documented block, ``head`` (one case's, as the
    command's callables are) playing the engine, at positions 0, 1, 2, ... ."""
    spec = DEFAULT_HEAD_SPECS[spec_name]
    cases = draw_head_cases(spec, [7], scale=1.0)
    layer = cases.weights.case(0)
    hidden = np.random.default_rng(3).standard_normal((rows, spec.hidden)).astype(np.float32)
    positions = np.arange(rows) * 37

    def engine_head(x, position):
        return head(
            cases.inputs(0, position).__class__(
                x, *(layer[k] for k in HeadWeights.ARRAYS), layer["fold"], int(position), spec
            )
        )

    names = {k: layer[k] for k in HeadWeights.ARRAYS if layer[k] is not None}
    names |= {"hidden": hidden, "positions": positions, "engine_head": engine_head}
    names |= {k: getattr(spec, k) for k in ("q_heads", "kv_heads", "head_dim", "rotary_dim", "rope_theta", "eps")}
    code = documented_block().replace('"head_layer03.safetensors"', repr(str(path)))
    exec(code, names)
    return path


#: :data:`METAL_BODY` in CUDA (NVRTC compiles without the headers that define Metal's ``uint``).
CUDA_BODY = (
    METAL_BODY.replace("uint ", "unsigned int ")
    .replace("thread_position_in_grid.x", "(blockIdx.x * blockDim.x + threadIdx.x)")
    .replace("const device float*", "const float*")
    .replace("device float*", "float*")
    .replace("metal::rsqrt", "rsqrtf")
    .replace("metal::pow", "powf")
    .replace("metal::cos", "cosf")
    .replace("metal::sin", "sinf")
)

#: A Metal head of the "launch" shape, one thread a row of the Q | K | V stack: the normed
#: vector rotated by the fold the three share (``rotation``, dense), the row's dot, its bias.
METAL_LAUNCH_BODY = """
    uint r = thread_position_in_grid.x;
    if (r >= QR + 2 * HKV * D) return;
    float ms = 0.0f;
    for (uint i = 0; i < HID; ++i) ms += hidden[i] * hidden[i];
    float inv = metal::rsqrt(ms / float(HID) + eps[0]);
    const device float* w = q_w;
    const device float* b = q_b;
    device float* out = q_out;
    uint row = r;
    if (r >= QR + HKV * D) {
        w = v_w; b = v_b; out = v_out; row = r - QR - HKV * D;
    } else if (r >= QR) {
        w = k_w; b = k_b; out = k_out; row = r - QR;
    }
    float acc = 0.0f;
    for (uint j = 0; j < HID; ++j) {
        float nj = 0.0f;
        for (uint i = 0; i < HID; ++i) nj += rotation[j * HID + i] * (hidden[i] * inv * attn_norm[i]);
        acc += w[row * HID + j] * nj;
    }
    out[row] = acc + b[row];
"""
METAL_LAUNCH_INPUTS = ("hidden", "attn_norm", "q_w", "k_w", "v_w", "q_b", "k_b", "v_b", "rotation", "eps")
