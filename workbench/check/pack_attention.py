"""A Hadamard pack's full-attention layer over a run of tokens, checked against the float64 truth.

:mod:`workbench.check.pack_head` checks what a head kernel returns (q, k, v and the gate at
one position); an engine's attention module returns more: each token's query against every
cached key and value so far, the output gate, and ``o_proj`` (itself packed, rotating its own
input). :func:`check_pack_attention` judges an implementation of the whole module over
``tokens`` tokens at positions 0, 1, ... (mlx-lm 0.32.2's ``Qwen3NextAttention.__call__`` with
a KV cache, one token a call, is the subject the tests give it):

- the float64 truth: :func:`~workbench.check.pack_head.head_variants`' truth at each
  position, causal softmax attention (``scale = head_dim ** -0.5``, each query head reading
  kv head ``h // (q_heads / kv_heads)``), times ``sigmoid(gate)``, then ``o_proj``'s rotation
  and its weights from the stored codes, all in float64;
- the float32 reference: the head's reference, then ``mx.fast.scaled_dot_product_attention``
  a token at a time against the keys so far (as a decode step runs it), the gate, and
  ``o_proj`` through ``WeightMatrix.apply``, on the CPU;
- the faults: the head's (each projection's rotation skipped, the scales read as bfloat16,
  ``o_proj``'s too) and ``o_proj``'s rotation skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.check.head_cases import HEAD_SCALES
from workbench.check.head_spec import HeadSpec
from workbench.check.pack_head import HEAD_PROJECTIONS, head_variants, pack_head_spec
from workbench.check.pack_linear import faulty_linear
from workbench.check.pack_verdict import by_case, pack_arguments, pack_report, sequence_output, token_inputs
from workbench.check.report import CheckReport
from workbench.models.hadamard_pack import HadamardPack

#: fault name -> what it does.
PACK_ATTENTION_FAULTS: dict[str, str] = {
    **{f"rotation_skipped_{p}": f"{p}'s input rotation not applied" for p in (*HEAD_PROJECTIONS, "o_proj")},
    "scales_bfloat16": "every projection's float16 scales and biases (o_proj's too) read as bfloat16",
}

#: Tokens a check runs by default: each token's output reads every key before it.
DEFAULT_ATTENTION_TOKENS = 8


def _split(spec: HeadSpec, a: np.ndarray) -> list[np.ndarray]:
    """q, k, v, gate laid end to end -> [T, S, heads, head_dim] each."""
    d, hq, hk = spec.head_dim, spec.q_heads, spec.kv_heads
    cuts = np.cumsum([hq * d, hk * d, hk * d])
    parts = np.split(a, cuts, axis=-1)
    heads = (hq, hk, hk, hq)
    return [p.reshape(*p.shape[:-1], h, d) for p, h in zip(parts, heads, strict=True)]


def _attend64(spec: HeadSpec, a: np.ndarray) -> np.ndarray:
    """Causal attention of the head outputs ``a`` [T, S, width] (float64) -> gated [T, S, q_heads * d]."""
    q, k, v, g = _split(spec, a)
    rep = spec.q_heads // spec.kv_heads
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)  # query head h reads kv head h // rep
    scores = np.einsum("tshd,ushd->shtu", q, k) * spec.head_dim**-0.5
    t = scores.shape[-1]
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("shtu,ushd->tshd", p, v)
    return (o * (1 / (1 + np.exp(-g)))).reshape(*o.shape[:2], -1)


def _attend32(spec: HeadSpec, a: np.ndarray) -> np.ndarray:
    """:func:`_attend64` in float32 as a decode step runs it: each token's query against the
    keys so far through ``mx.fast.scaled_dot_product_attention``, on the CPU."""
    q, k, v, g = (mx.array(x.transpose(1, 2, 0, 3)) for x in _split(spec, a))  # [S, heads, T, d]
    outs = []
    with mx.stream(mx.cpu):
        for t in range(q.shape[2]):
            o = mx.fast.scaled_dot_product_attention(
                q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], scale=spec.head_dim**-0.5
            )
            outs.append(o[:, :, 0] * mx.sigmoid(g[:, :, t]))
        out = np.array(mx.stack(outs))  # [T, S, heads, d]
    return out.reshape(*out.shape[:2], -1)


def check_pack_attention(
    subject: Callable[[Any], Any],
    pack: HadamardPack,
    layer: int,
    *,
    seeds: Iterable[int] = range(10),
    scales: Sequence[float] = HEAD_SCALES,
    tokens: int = DEFAULT_ATTENTION_TOKENS,
    tolerance: float | None = None,
    flake_rate: float = 1e-4,
) -> CheckReport:
    """Check ``subject(hidden) -> out`` (``hidden`` float32 numpy [tokens, S, hidden_size], S
    sequences' inputs to the layer before its RMS norm, token ``t`` at position ``t``, the
    cache empty before token 0; ``out`` [tokens, S, hidden_size], ``o_proj``'s output) on
    ``pack``'s full-attention ``layer``. The S sequences are each seed's draws (uniform in
    [-1, 1)) times each of ``scales``, seed-major; a case's error is over every token."""
    takes = "hidden [tokens, S, hidden] -> out"
    seed_list, scale_list, user, flake_rate = pack_arguments(pack, subject, takes, seeds, scales, tolerance, flake_rate)
    spec = pack_head_spec(pack, layer)
    tokens = validate.integer("tokens", tokens, minimum=1, maximum=4096)
    x = token_inputs(seed_list, scale_list, tokens, spec.hidden, 5960)  # [T, S, hidden]
    heads = head_variants(pack, layer, x, list(range(tokens)))
    o = pack.matrix(f"model.layers.{layer}.self_attn.o_proj")
    truth64 = _attend64(spec, heads.pop("truth"))
    truth = (o.fold.rotate(truth64) if o.fold is not None else truth64) @ o.dense(np.float64).T
    ref_in = _attend32(spec, heads.pop("reference"))
    with mx.stream(mx.cpu):
        ref = np.array(o.apply(mx.array(ref_in)))
    faults = {f: _attend32(spec, a) for f, a in heads.items()}
    faults = {f: faulty_linear(o, a, o.fold, f == "scales_bfloat16") for f, a in faults.items()}
    if o.fold is not None:
        faults["rotation_skipped_o_proj"] = faulty_linear(o, ref_in, None, False)
    problems: list[str] = []
    out = sequence_output(subject, x, truth.shape, "pack attention layer", problems)

    def cases(a: np.ndarray) -> np.ndarray:
        return by_case(a, len(seed_list), len(scale_list))

    base = {"hidden": spec.hidden, "branch": spec.q_heads * spec.head_dim, "ffn": 0, "dtype": "affine2-g128"}
    base |= {"fold": "per projection", "quant": "affine2-g128"}
    checked = [
        f"pack layer {layer}'s attention over {tokens} tokens (positions 0..{tokens - 1}, the keys so far): "
        "q/k/v/o_proj each its own input rotation, 2-bit codes, QK-norm, RoPE, the output gate; truth in "
        "float64 from the codes"
    ]
    return pack_report(
        name=f"pack attention layer (layer {layer})",
        base=base,
        seeds=seed_list,
        scales=scale_list,
        out=cases(out),
        ref=cases(ref),
        truth=cases(truth),
        faults={f: cases(v) for f, v in faults.items()},
        problems=problems,
        user=user,
        flake_rate=flake_rate,
        checked=checked,
    )
