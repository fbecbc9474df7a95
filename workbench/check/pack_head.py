"""The attention head of a Hadamard pack's layer, checked on the pack's own stored weights.

The head part's own draws (:mod:`workbench.check.head_cases`) give q_proj, k_proj and v_proj
ONE shared fold, as frink-models' launch folds them; a pack rotates each projection's input
with its OWN block and signs (mlx-lm 0.32.2's ``HadamardQuantizedLinear``), so a kernel that
serves a pack must rotate the normed hidden state three times (or once per distinct rotation).
:func:`check_pack_head` judges an implementation of one full-attention layer's head (the
input RMS norm, q_proj with its per-head output gate, k_proj, v_proj, QK-norm, RoPE at the
token's position, as :mod:`workbench.check.head_spec` states it) on the pack's stored 2-bit
codes, float16 scales and biases and rotations:

- the float64 truth: the norm, each projection's rotation (``HadamardFold.rotate``) and its
  weights decoded from the codes in float64 (:mod:`workbench.fold.affine_codes`), then the
  per-head arithmetic of :mod:`workbench.check.head_math` (``rms``, ``rope``) in float64;
- the workbench's float32 reference: each projection through ``WeightMatrix.apply`` on the
  CPU (``mx.hadamard_transform`` of its own input, then ``mx.quantized_matmul``), the rest
  with the MLX operations mlx-lm calls (``mx.fast.rms_norm``, ``mx.fast.rope``; numpy's
  float32 angle at position 4095 would err past 2e-4 on its own, as ``head_mlx`` notes);
- the faults: each projection's rotation skipped alone (``rotation_skipped_<proj>``), and
  the float16 scales and biases read as bfloat16 (``scales_bfloat16``).

Positions: RoPE is the identity at 0, so a check runs several (``DEFAULT_POSITIONS``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.check.head_cases import DEFAULT_POSITIONS, HEAD_SCALES
from workbench.check.head_math import rms, rope
from workbench.check.head_spec import HeadSpec
from workbench.check.pack_linear import faulty_linear
from workbench.check.pack_verdict import pack_arguments, pack_report
from workbench.check.report import CheckReport
from workbench.check.subjects import checked_output
from workbench.models.hadamard_pack import HadamardPack, PackError

#: The head's projections, in the order their outputs are laid out.
HEAD_PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")

#: fault name -> what it does.
PACK_HEAD_FAULTS: dict[str, str] = {
    **{f"rotation_skipped_{p}": f"{p}'s input rotation not applied (the others applied)" for p in HEAD_PROJECTIONS},
    "scales_bfloat16": "every projection's float16 scales and biases read as bfloat16",
}


def pack_head_spec(pack: HadamardPack, layer: int) -> HeadSpec:
    """The head of ``pack``'s full-attention ``layer`` as mlx-lm's ``Qwen3NextAttention`` runs it:
    gate split per head, QK-norm, RoPE over ``head_dim * partial_rotary_factor`` dims at ``rope_theta``."""
    if pack.layer_type(layer) != "full_attention":
        raise PackError(f"layer: {layer} is a {pack.layer_type(layer)} layer, the head needs a full_attention one")
    c = pack.text_config
    rp = c.get("rope_parameters") or {}
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // int(c["num_attention_heads"]))
    frac = float(rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))
    return HeadSpec(
        "model",
        int(c["hidden_size"]),
        int(c["num_attention_heads"]),
        int(c["num_key_value_heads"]),
        head_dim,
        rotary_dim=int(head_dim * frac),
        rope_theta=float(rp.get("rope_theta", c.get("rope_theta", 10000.0))),
        qk_norm=True,
        gate=bool(c.get("attn_output_gate", True)),
        bias=False,
        eps=pack.eps,
        name=f"pack layer {layer}",
    )


def _heads(spec: HeadSpec, q: np.ndarray, k: np.ndarray, v: np.ndarray, qn: Any, kn: Any, pos: int) -> np.ndarray:
    """Projections' outputs [..., rows] -> (q, k, v, gate) laid end to end, in q's dtype."""
    lead, d = q.shape[:-1], spec.head_dim
    q2, k2 = q.reshape(-1, q.shape[-1]), k.reshape(-1, k.shape[-1])
    s = len(q2)
    gate = None
    if spec.gate:
        qg = q2.reshape(s, spec.q_heads, 2 * d)
        q2, gate = qg[..., :d], qg[..., d:].reshape(s, -1)
    qh, kh = rms(q2.reshape(s, spec.q_heads, d), qn, spec.eps, False), rms(k2.reshape(s, -1, d), kn, spec.eps, False)
    positions = np.full(s, pos, dtype=np.int64)
    qh = rope(qh, positions, spec.rotary_dim, spec.rope_theta, None).reshape(s, -1)
    kh = rope(kh, positions, spec.rotary_dim, spec.rope_theta, None).reshape(s, -1)
    parts = [qh, kh, v.reshape(s, -1)] + ([gate] if gate is not None else [])
    return np.concatenate(parts, axis=-1).reshape(*lead, -1)


def _heads32(spec: HeadSpec, q: np.ndarray, k: np.ndarray, v: np.ndarray, qn: Any, kn: Any, pos: int) -> np.ndarray:
    """:func:`_heads` in float32 as mlx-lm runs it (``mx.fast.rms_norm``, ``mx.fast.rope`` with the
    position as offset, on the CPU): the reference's and the faults' per-head arithmetic."""
    lead, d = q.shape[:-1], spec.head_dim
    with mx.stream(mx.cpu):
        q2, k2 = mx.array(q.reshape(-1, q.shape[-1])), mx.array(k.reshape(-1, k.shape[-1]))
        s = q2.shape[0]
        parts = []
        if spec.gate:
            q2, gate = mx.split(q2.reshape(s, spec.q_heads, 2 * d), 2, axis=-1)
            parts.append(gate.reshape(s, -1))
        qh = mx.fast.rms_norm(q2.reshape(s, spec.q_heads, 1, d), mx.array(qn), spec.eps)
        kh = mx.fast.rms_norm(k2.reshape(s, -1, 1, d), mx.array(kn), spec.eps)
        kw = dict(traditional=False, base=spec.rope_theta, scale=1.0, offset=int(pos))
        qh, kh = mx.fast.rope(qh, spec.rotary_dim, **kw), mx.fast.rope(kh, spec.rotary_dim, **kw)
        parts = [qh.reshape(s, -1), kh.reshape(s, -1), mx.array(v.reshape(s, -1))] + parts
        out = np.array(mx.concatenate(parts, axis=-1))
    return out.reshape(*lead, -1)


def head_variants(pack: HadamardPack, layer: int, hidden: np.ndarray, positions: Sequence[int]) -> dict[str, Any]:
    """The head of ``pack``'s ``layer`` on ``hidden`` (float32 [P, ..., hidden_size], the layer's
    input, row ``i`` at ``positions[i]``): ``"truth"`` (float64), ``"reference"`` (float32) and
    each fault of :data:`PACK_HEAD_FAULTS` (float32), each [P, ..., width] with q, k, v and the
    gate laid end to end (q and k after QK-norm and RoPE)."""
    spec = pack_head_spec(pack, layer)
    pre = f"model.layers.{layer}"
    mats = {p: pack.matrix(f"{pre}.self_attn.{p}") for p in HEAD_PROJECTIONS}
    attn_norm = pack.tensor(f"{pre}.input_layernorm.weight")
    qn, kn = pack.tensor(f"{pre}.self_attn.q_norm.weight"), pack.tensor(f"{pre}.self_attn.k_norm.weight")
    h32 = np.ascontiguousarray(hidden, dtype=np.float32)
    n64 = rms(h32.astype(np.float64), attn_norm.astype(np.float64), spec.eps, False)
    with mx.stream(mx.cpu):
        n32 = np.array(mx.fast.rms_norm(mx.array(h32), mx.array(attn_norm), spec.eps))
    proj64 = {p: (m.fold.rotate(n64) if m.fold is not None else n64) @ m.dense(np.float64).T for p, m in mats.items()}
    with mx.stream(mx.cpu):
        proj32 = {p: np.array(m.apply(mx.array(n32))) for p, m in mats.items()}
    runs = {
        f"rotation_skipped_{p}": {**proj32, p: faulty_linear(m, n32, None, False)}
        for p, m in mats.items()
        if m.fold is not None
    }
    runs["scales_bfloat16"] = {p: faulty_linear(m, n32, m.fold, True) for p, m in mats.items()}
    qn64, kn64 = qn.astype(np.float64), kn.astype(np.float64)
    out: dict[str, Any] = {"truth": [], "reference": [], **{f: [] for f in runs}}
    for i, pos in enumerate(positions):
        out["truth"].append(_heads(spec, *(proj64[p][i] for p in HEAD_PROJECTIONS), qn64, kn64, pos))
        out["reference"].append(_heads32(spec, *(proj32[p][i] for p in HEAD_PROJECTIONS), qn, kn, pos))
        for f, pr in runs.items():
            out[f].append(_heads32(spec, *(pr[p][i] for p in HEAD_PROJECTIONS), qn, kn, pos))
    return {k: np.stack(v) for k, v in out.items()}


def check_pack_head(
    subject: Callable[[Any, int], Any],
    pack: HadamardPack,
    layer: int,
    *,
    seeds: Iterable[int] = range(20),
    scales: Sequence[float] = HEAD_SCALES,
    positions: Sequence[int] = DEFAULT_POSITIONS,
    tolerance: float | None = None,
    flake_rate: float = 1e-4,
) -> CheckReport:
    """Check ``subject(hidden, position) -> (q, k, v[, gate])`` (``hidden`` float32 numpy
    [scales, hidden_size], the layer's input before its RMS norm; each output [scales, width],
    q and k after QK-norm and RoPE) on ``pack``'s full-attention ``layer``, at each seed's
    hidden state (uniform in [-1, 1)) times each of ``scales``, at each of ``positions``.
    A case is a (seed, position) pair; its errors are over every tensor returned."""
    takes = "(hidden, position) -> (q, k, v, gate)"
    seed_list, scale_list, user, flake_rate = pack_arguments(pack, subject, takes, seeds, scales, tolerance, flake_rate)
    spec = pack_head_spec(pack, layer)
    pos_list = [
        validate.integer("positions", p, minimum=0, maximum=1 << 20)
        for p in validate.sequence("positions", positions, what="non-negative ints")
    ]
    sa = np.asarray(scale_list, dtype=np.float32)[None, :, None]
    draws = [np.random.default_rng([s, 59]).uniform(-1, 1, spec.hidden).astype(np.float32) for s in seed_list]
    h32 = np.stack(draws)[:, None] * sa  # [seeds, scales, hidden]
    variants = head_variants(pack, layer, np.broadcast_to(h32, (len(pos_list), *h32.shape)), pos_list)
    truth, ref = variants.pop("truth"), variants.pop("reference")
    out, problems = [], []
    for i, pos in enumerate(pos_list):
        o = np.full(truth[i].shape, np.nan, dtype=np.float32)
        for k, seed in enumerate(seed_list):
            try:
                got = subject(h32[k].copy(), int(pos))
                parts = [np.asarray(t, dtype=np.float32).reshape(len(scale_list), -1) for t in got]
                o[k] = checked_output(np.concatenate(parts, axis=-1), o[k].shape)
            except Exception as e:  # the implementation's failure is the check's result, not its crash
                problems.append(f"pack head seed {seed} position {pos}: {type(e).__name__}: {e}")
        out.append(o)

    # a case is (seed, position): positions stacked along the seed axis, labelled seed * 10^6 + position
    def cat(a: Any) -> np.ndarray:
        return np.concatenate(list(a), axis=0)

    mats = {p: pack.matrix(f"model.layers.{layer}.self_attn.{p}") for p in HEAD_PROJECTIONS}
    case_ids = [s * 1_000_000 + p for p in pos_list for s in seed_list]
    base = {"hidden": spec.hidden, "branch": spec.q_rows, "ffn": 0, "dtype": "affine2-g128", "fold": "per projection"}
    base["quant"] = "affine2-g128"
    rot = ", ".join(f"{p} {m.fold!r}" for p, m in mats.items())
    checked = [
        f"pack layer {layer}'s head at positions {pos_list}: each projection its own input rotation ({rot}), "
        f"2-bit codes, QK-norm, RoPE over {spec.rotary_dim} of {spec.head_dim} dims at {spec.rope_theta:g}; "
        "truth in float64 from the codes (case seed = seed * 10^6 + position)"
    ]
    return pack_report(
        name=f"pack head (layer {layer})",
        base=base,
        seeds=case_ids,
        scales=scale_list,
        out=cat(out),
        ref=cat(ref),
        truth=cat(truth),
        faults={f: cat(v) for f, v in variants.items()},
        problems=problems,
        user=user,
        flake_rate=flake_rate,
        checked=checked,
    )
