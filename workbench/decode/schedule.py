"""A hybrid model's decode step executed as a stage of the resident-state plan says.

``workbench.waits.plan`` COUNTS the waits a token costs at each stage of the plan; this module
RUNS one token that way and times it, so the table can be checked against a clock:

- recurrent layers (Gated DeltaNet) through ``mx.fast.gated_delta_update`` (or plain MLX
  ops, or with the project's kernels the whole recurrent step as one launch,
  ``workbench.kernels.gdn_step``), their state (and the short convolution's) kept between tokens;
- attention on the host: numpy, with a KV cache, as frink-models' engine runs it (or, at the
  device floor, as MLX ops with the cache on the device);
- the attention tail as two pieces (wo; FFN) or fused (one), on the device;
- the token's GPU pieces grouped into submissions exactly as ``waits.submissions`` groups
  them: each group is built lazily and evaluated by ONE ``mx.eval``, which is one wait.

The executor counts the ``mx.eval`` calls it makes (``TokenResult.waits``); tests check
that against ``waits.waits_per_token`` and against ``wait_measurement.count_waits``, which sees every
evaluation and host read MLX does. Grouping changes where the waits fall, never the
arithmetic: every stage computes the same ops on the same values (checked in tests).

Geometry: :func:`geometry_of` reads a Qwen3.5-style hybrid's widths from its config
(Bonsai-27B: hidden 5120, 24/4 heads of 256 with the output gate, FFN 17408, Gated
DeltaNet 16 key / 48 value heads of 128, conv 4); :data:`CPU_GEOMETRY` is a scaled-down
one for 2 CPU cores. Weights are random (``U(-a, a)``, variance 1/fan_in), seeded.

Simplifications, none of which moves a wait: no RoPE and no per-head q/k norm in the
attention (host work of a few microseconds), no Hadamard fold on wo, the next token's
input is a row of a small host table picked by the argmax of the logits (the embedding
lookup is host work), and the KV cache starts ``context`` tokens long (random keys and
values) so the attention's cost is that of a short chat, not of an empty cache.

Every weight's product goes through ``workbench.decode.matvec``: MLX ops (``matvec="mlx"``)
or the project's kernels (``matvec="kernels"``, weights read in their stored format,
float32 activations), so a stage can split the tail (wo and the FFN in two submissions at
stage 1) or join it to the next recurrent run (stage 4 and the floor) on either path.
``tests/test_schedule.py`` checks the schedule's tail against ``tail.host_tail``, the
oracle; ``check_step`` checks the kernels' token against the MLX-ops one. Beside the
clock: :func:`measure_splits` prices a wait by its kind (``waits.split_kinds``), between
the step's own submissions, for the price model of ``waits.model_saving``.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import mlx.core as mx
import numpy as np

from workbench.decode import matvec as _dm
from workbench.waits import measurement as _wm
from workbench.waits import plan as _waits
from workbench.validate import describe, flag, integer, number, one_of
from workbench.fold.weights import DENSE_DTYPES, QUANT_FORMATS, QuantizedBase, WeightMatrix


@dataclass(frozen=True)
class Geometry:
    """The widths a decode step of a Qwen3.5-style hybrid needs."""

    hidden: int
    ffn: int
    n_q: int
    n_kv: int
    head_dim: int
    attn_output_gate: bool
    gdn_k_heads: int
    gdn_v_heads: int
    gdn_k_dim: int
    gdn_v_dim: int
    conv_kernel: int
    vocab: int
    eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("hidden", "ffn", "n_q", "n_kv", "head_dim", "gdn_k_heads", "gdn_v_heads", "gdn_k_dim",
                     "gdn_v_dim", "conv_kernel", "vocab"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name}: must be a positive int, got {v!r}")
        if self.n_q % self.n_kv:
            raise ValueError(f"n_q: must be a multiple of n_kv ({self.n_kv}), got {self.n_q}")
        if self.gdn_v_heads % self.gdn_k_heads:
            raise ValueError(f"gdn_v_heads: must be a multiple of gdn_k_heads ({self.gdn_k_heads}), got {self.gdn_v_heads}")

    @property
    def branch(self) -> int:
        """The attention output's width before wo (q heads x head_dim)."""
        return self.n_q * self.head_dim

    def layer_params(self, kind: str) -> int:
        """Weights (elements) one layer of ``kind`` (``"attention"`` | ``"recurrent"``) streams."""
        h, f = self.hidden, self.ffn
        ffn = 3 * h * f
        if kind == "attention":
            q = self.branch * (2 if self.attn_output_gate else 1)
            return h * (q + 2 * self.n_kv * self.head_dim) + self.branch * h + ffn
        if kind == "recurrent":
            kd, vd = self.gdn_k_heads * self.gdn_k_dim, self.gdn_v_heads * self.gdn_v_dim
            return h * (2 * kd + 2 * vd + 2 * self.gdn_v_heads) + vd * h + ffn
        raise ValueError(f"kind: must be 'attention' or 'recurrent', got {kind!r}")


#: A scaled-down Bonsai for 2 CPU cores: the same 64-layer pattern (so the same waits a
#: token), widths / 20 or so, a 2k vocabulary. About 60 MB of float32 weights.
CPU_GEOMETRY = Geometry(
    hidden=256, ffn=768, n_q=6, n_kv=1, head_dim=32, attn_output_gate=True,
    gdn_k_heads=2, gdn_v_heads=6, gdn_k_dim=32, gdn_v_dim=32, conv_kernel=4, vocab=2048,
)


def geometry_of(cfg, *, vocab: int | None = None) -> Geometry:
    """The full geometry of a Qwen3.5-style hybrid (Gated DeltaNet + gated GQA) from its config."""
    from workbench.models.config import Mixer

    raw = dict(cfg.raw)
    text = dict(raw.get("text_config", raw))
    attn = cfg.attention_layers()
    if not attn:
        raise ValueError(f"cfg: {cfg.name} has no attention layer")
    kinds = {lc.mixer for lc in cfg.layers} - {Mixer.ATTENTION}
    if kinds - {Mixer.LINEAR_ATTENTION}:
        raise ValueError(f"cfg: the schedule runs Gated DeltaNet hybrids; {cfg.name} has {sorted(k.value for k in kinds)}")
    need = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
    missing = [k for k in need if k not in text]
    if missing:
        raise ValueError(f"cfg: {cfg.name}'s config lacks {missing}")
    a = cfg.layer(attn[0])
    return Geometry(
        hidden=cfg.hidden_size, ffn=a.ffn_dim, n_q=a.num_q_heads, n_kv=a.num_kv_heads, head_dim=a.head_dim,
        attn_output_gate=bool(a.attn_output_gate),
        gdn_k_heads=int(text["linear_num_key_heads"]), gdn_v_heads=int(text["linear_num_value_heads"]),
        gdn_k_dim=int(text["linear_key_head_dim"]), gdn_v_dim=int(text["linear_value_head_dim"]),
        conv_kernel=int(text.get("linear_conv_kernel_dim", 4)),
        vocab=int(vocab if vocab is not None else text.get("vocab_size", 32000)), eps=float(cfg.rms_norm_eps),
    )


# ---------------------------------------------------------------------------------------
# Weights and state


def _uniform(key: mx.array, shape: tuple[int, ...], fan_in: int, dtype) -> mx.array:
    a = math.sqrt(3.0 / fan_in)
    return mx.random.uniform(-a, a, shape, key=key).astype(dtype)


@dataclass
class _Layer:
    kind: str  # "attention" | "recurrent"
    w: dict[str, mx.array]


class HybridWeights:
    """Random weights for every layer of ``cfg`` at ``geom``, on MLX's default device.

    ``share``: one set of weights per layer kind, used by every layer of that kind (the
    full Bonsai geometry is ~50 GB of bf16 otherwise). A token still streams every layer's
    matrices from memory (one layer's are far larger than any cache), so the time a token
    takes is that of distinct weights; the record says which was used.

    ``quant``: None (dense ``dtype`` weights), or a name of ``weights.QUANT_FORMATS``
    (``"affine4"``: affine 4-bit, groups of 64): every projection matrix, the LM head
    included, quantized from its ``dtype`` draw by ``mx.quantize`` and stored as a
    ``weights.QuantizedBase``; the short convolution and the norms stay float32.
    """

    def __init__(self, cfg, geom: Geometry, *, dtype: str = "float32", seed: int = 0, share: bool = False,
                 quant: str | None = None):
        one_of("dtype", dtype, sorted(DENSE_DTYPES))
        if quant is not None:
            one_of("quant", quant, sorted(QUANT_FORMATS))
        self.quant = quant
        if not isinstance(geom, Geometry):
            raise ValueError(f"geom: must be a Geometry (geometry_of(cfg) or CPU_GEOMETRY), got {describe(geom)}")
        seed = integer("seed", seed, minimum=0)
        share = flag("share", share)
        self.cfg, self.geom, self.dtype, self.share = cfg, geom, dtype, share
        dt = DENSE_DTYPES[dtype]
        attn = set(cfg.attention_layers())
        key = mx.random.key(seed)
        made: dict[str, dict[str, mx.array]] = {}
        self.layers: list[_Layer] = []
        for lc in cfg.layers:
            kind = "attention" if lc.index in attn else "recurrent"
            if share and kind in made:
                self.layers.append(_Layer(kind, made[kind]))
                continue
            key, sub = mx.random.split(key)
            w = self._make(kind, sub, dt)
            mx.eval(w)  # materialise now, layer by layer, so peak memory is the weights alone
            made[kind] = w
            self.layers.append(_Layer(kind, w))
        g = geom
        key, k1, k2 = mx.random.split(key, 3)
        self.final_norm = mx.ones((g.hidden,), dtype=mx.float32)
        self.lm_head = self._quantized(_uniform(k1, (g.vocab, g.hidden), g.hidden, dt))
        # The embedding lookup is host work: a small host table, indexed by argmax % rows.
        self.embed = np.random.default_rng(seed).uniform(-1, 1, size=(64, g.hidden)).astype(np.float32)
        mx.eval(self.lm_head.w if isinstance(self.lm_head, QuantizedBase) else self.lm_head)

    def _quantized(self, w: mx.array) -> mx.array | QuantizedBase:
        """``w`` as stored: itself, or quantized to ``self.quant``."""
        if self.quant is None:
            return w
        spec = QUANT_FORMATS[self.quant]
        base = WeightMatrix.quantize(w, **spec.as_quantize()).launch_parts()[0]
        assert isinstance(base, QuantizedBase)
        return base

    def bytes_per_token(self) -> int:
        """Bytes of weights one token streams: every layer's arrays (a shared set counted
        once per layer that reads it), the final norm and the LM head. The recurrent
        states and KV caches a token also reads and writes are not included."""
        total = int(self.lm_head.nbytes + self.final_norm.nbytes)
        for layer in self.layers:
            total += sum(int(a.nbytes) for a in layer.w.values())
        return total

    def _make(self, kind: str, key: mx.array, dt) -> dict[str, mx.array]:
        g = self.geom
        ks = iter(mx.random.split(key, 16))
        h, f = g.hidden, g.ffn
        w = {
            "ffn_norm": 1.0 + mx.random.uniform(-0.25, 0.25, (h,), key=next(ks)),
            "gate": _uniform(next(ks), (f, h), h, dt),
            "up": _uniform(next(ks), (f, h), h, dt),
            "down": _uniform(next(ks), (h, f), f, dt),
            "norm": 1.0 + mx.random.uniform(-0.25, 0.25, (h,), key=next(ks)),
        }
        if kind == "attention":
            q = g.branch * (2 if g.attn_output_gate else 1)
            kv = g.n_kv * g.head_dim
            w.update(wq=_uniform(next(ks), (q, h), h, dt), wk=_uniform(next(ks), (kv, h), h, dt),
                     wv=_uniform(next(ks), (kv, h), h, dt), wo=_uniform(next(ks), (h, g.branch), g.branch, dt))
            for name in ("wq", "wk", "wv", "wo"):
                w[name] = self._quantized(w[name])
        else:
            kd, vd = g.gdn_k_heads * g.gdn_k_dim, g.gdn_v_heads * g.gdn_v_dim
            conv_c = 2 * kd + vd
            w.update(
                in_qkvz=_uniform(next(ks), (2 * kd + 2 * vd, h), h, dt),
                in_ba=_uniform(next(ks), (2 * g.gdn_v_heads, h), h, dt),
                conv=_uniform(next(ks), (g.conv_kernel, conv_c), g.conv_kernel, mx.float32),
                a_log=mx.log(mx.random.uniform(1.0, 16.0, (g.gdn_v_heads,), key=next(ks))),
                dt_bias=mx.random.uniform(-1.0, 1.0, (g.gdn_v_heads,), key=next(ks)),
                o_norm=1.0 + mx.random.uniform(-0.25, 0.25, (g.gdn_v_dim,), key=next(ks)),
                out=_uniform(next(ks), (h, vd), vd, dt),
            )
            for name in ("in_qkvz", "in_ba", "out"):
                w[name] = self._quantized(w[name])
        for name in ("gate", "up", "down"):
            w[name] = self._quantized(w[name])
        return w


@dataclass
class DecodeState:
    """What one decode keeps between tokens: recurrent and conv states, KV caches, position."""

    ssm: dict[int, mx.array]
    conv: dict[int, mx.array]
    host_k: dict[int, np.ndarray]
    host_v: dict[int, np.ndarray]
    dev_k: dict[int, mx.array]
    dev_v: dict[int, mx.array]
    length: int
    token: int = 0


def new_state(wts: HybridWeights, *, context: int = 32, max_new: int = 4096, seed: int = 1) -> DecodeState:
    """A fresh state: zero recurrent states, a KV cache already ``context`` tokens long."""
    if not isinstance(wts, HybridWeights):
        raise ValueError(f"wts: must be HybridWeights, got {describe(wts)}")
    context = integer("context", context, minimum=1, maximum=1 << 20)
    max_new = integer("max_new", max_new, minimum=1, maximum=1 << 20)
    seed = integer("seed", seed, minimum=0)
    g = wts.geom
    rng = np.random.default_rng(seed)
    ssm, conv, hk, hv, dk, dv = {}, {}, {}, {}, {}, {}
    conv_c = 2 * g.gdn_k_heads * g.gdn_k_dim + g.gdn_v_heads * g.gdn_v_dim
    for l, layer in enumerate(wts.layers):
        if layer.kind == "recurrent":
            ssm[l] = mx.zeros((1, g.gdn_v_heads, g.gdn_v_dim, g.gdn_k_dim), dtype=mx.float32)
            conv[l] = mx.zeros((g.conv_kernel - 1, conv_c), dtype=mx.float32)
        else:
            cap = context + max_new
            hk[l] = np.zeros((cap, g.n_kv, g.head_dim), dtype=np.float32)
            hv[l] = np.zeros((cap, g.n_kv, g.head_dim), dtype=np.float32)
            hk[l][:context] = rng.standard_normal((context, g.n_kv, g.head_dim)).astype(np.float32)
            hv[l][:context] = rng.standard_normal((context, g.n_kv, g.head_dim)).astype(np.float32)
            dk[l] = mx.array(hk[l][:context])
            dv[l] = mx.array(hv[l][:context])
    mx.eval(list(ssm.values()), list(conv.values()), list(dk.values()), list(dv.values()))
    return DecodeState(ssm, conv, hk, hv, dk, dv, context)


# ---------------------------------------------------------------------------------------
# The pieces, as lazy MLX ops


_rms = _dm.rms


def gated_delta_ops(q, k, v, gamma, beta, state) -> tuple[mx.array, mx.array]:
    """One token of the gated delta rule as plain MLX ops: ``mx.fast.gated_delta_update``'s twin.

    Shapes as that op takes them with T = 1: q, k [1, 1, Hk, Dk], v [1, 1, Hv, Dv], gamma,
    beta [1, 1, Hv], state [1, Hv, Dv, Dk]; value head h reads key head h // (Hv / Hk).
    ``S = gamma S; S += beta (v - S k) k^T; o = S q``. For a device where the fast op is
    missing; the schedule says which one it ran.
    """
    hk, hv = k.shape[2], v.shape[2]
    qq = mx.repeat(q[0, 0], hv // hk, axis=0)
    kk = mx.repeat(k[0, 0], hv // hk, axis=0)
    s = state[0] * gamma[0, 0][:, None, None]
    delta = (v[0, 0] - (s * kk[:, None, :]).sum(-1)) * beta[0, 0][:, None]
    s = s + delta[:, :, None] * kk[:, None, :]
    o = (s * qq[:, None, :]).sum(-1)
    return o[None, None], s[None]


def fast_gdn_available() -> tuple[bool, str]:
    """Whether ``mx.fast.gated_delta_update`` runs on MLX's default device (and why not)."""
    try:
        q = mx.ones((1, 1, 1, 4))
        v = mx.ones((1, 1, 1, 4))
        g = mx.ones((1, 1, 1))
        mx.eval(mx.fast.gated_delta_update(q, q, v, g, g, initial_state=mx.zeros((1, 1, 4, 4))))
        return True, ""
    except Exception as e:  # noqa: BLE001 - any failure means: not here
        return False, f"{type(e).__name__}: {e}"


#: How a recurrent layer's recurrence runs (``Schedule``'s ``gdn``).
GDN_PATHS: tuple[str, ...] = ("fast", "ops", "kernel")


def _recurrent(geom: Geometry, w: Mapping[str, mx.array], x: mx.array, st: DecodeState, l: int,
               gdn: str, mv) -> mx.array:
    g = geom
    kd, vd = g.gdn_k_heads * g.gdn_k_dim, g.gdn_v_heads * g.gdn_v_dim
    mixed, z, ba = mv.gdn_in(w, x, 2 * kd + vd)
    if gdn == "kernel":  # everything below, to the z gate, in ONE launch (workbench.kernels.gdn_step)
        o, st.conv[l], st.ssm[l] = mv.gdn_step(w, g.gdn_k_heads, mixed, z, ba, st.conv[l], st.ssm[l])
        x = mv.out_add(w, "out", o, x)
        return mv.ffn(w, x)
    window = mx.concatenate([st.conv[l], mixed[None]], axis=0)  # [K, C]: the short convolution
    st.conv[l] = window[1:]
    c = (window * w["conv"]).sum(axis=0)
    c = c * mx.sigmoid(c)
    q = c[:kd].reshape(1, 1, g.gdn_k_heads, g.gdn_k_dim)
    k = c[kd: 2 * kd].reshape(1, 1, g.gdn_k_heads, g.gdn_k_dim)
    v = c[2 * kd:].reshape(1, 1, g.gdn_v_heads, g.gdn_v_dim)
    q = q * mx.rsqrt((q * q).sum(-1, keepdims=True) + 1e-6) / math.sqrt(g.gdn_k_dim)
    k = k * mx.rsqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    b, a = ba[: g.gdn_v_heads], ba[g.gdn_v_heads:]
    beta = mx.sigmoid(b).reshape(1, 1, -1)
    gamma = mx.exp(-mx.exp(w["a_log"]) * mx.logaddexp(a + w["dt_bias"], 0.0)).reshape(1, 1, -1)
    if gdn == "fast":
        o, st.ssm[l] = mx.fast.gated_delta_update(q, k, v, gamma, beta, initial_state=st.ssm[l])
    else:
        o, st.ssm[l] = gated_delta_ops(q, k, v, gamma, beta, st.ssm[l])
    o = _rms(o.reshape(g.gdn_v_heads, g.gdn_v_dim), w["o_norm"], g.eps)
    zz = z.reshape(g.gdn_v_heads, g.gdn_v_dim)
    o = (o * (zz * mx.sigmoid(zz))).reshape(vd)
    x = mv.out_add(w, "out", o, x)
    return mv.ffn(w, x)


def _attend_np(geom: Geometry, q: np.ndarray, kc: np.ndarray, vc: np.ndarray) -> np.ndarray:
    """GQA softmax attention of one token on the host; returns the gated branch (float32)."""
    g = geom
    qq = q[: g.branch].reshape(g.n_kv, g.n_q // g.n_kv, g.head_dim)
    s = np.einsum("hgd,thd->hgt", qq, kc) / math.sqrt(g.head_dim)
    s = np.exp(s - s.max(-1, keepdims=True))
    p = s / s.sum(-1, keepdims=True)
    o = np.einsum("hgt,thd->hgd", p, vc).reshape(g.branch)
    if g.attn_output_gate:
        gate = q[g.branch:]
        o = o / (1.0 + np.exp(-gate))
    return o.astype(np.float32)


def _attend_mx(geom: Geometry, q: mx.array, kc: mx.array, vc: mx.array) -> mx.array:
    """The same attention as MLX ops (the device floor)."""
    g = geom
    qq = q[: g.branch].reshape(g.n_kv, g.n_q // g.n_kv, g.head_dim)
    s = mx.einsum("hgd,thd->hgt", qq, kc) / math.sqrt(g.head_dim)
    o = mx.einsum("hgt,thd->hgd", mx.softmax(s, axis=-1), vc).reshape(g.branch)
    if g.attn_output_gate:
        o = o * mx.sigmoid(q[g.branch:])
    return o


# ---------------------------------------------------------------------------------------
# One token


@dataclass
class TokenResult:
    logits: np.ndarray
    waits: int
    seconds: float
    next_token: int
    eval_seconds: float = 0.0  # of ``seconds``, inside mx.eval (encoding, submitting, waiting)


class Schedule:
    """One model's weights and the plan's grouping of its token, ready to decode.

    ``eligible``: the attention layers whose tail fuses; default ``waits.eligible_layers``
    (``workbench.models.refusals``). ``gdn``: ``"fast"`` runs the recurrence through
    ``mx.fast.gated_delta_update``, ``"ops"`` through :func:`gated_delta_ops`, each with
    the conv, norms, gates and z gate as MLX ops around it; ``"kernel"`` runs all of that
    as ONE launch (``workbench.kernels.gdn_step``, ``kernels/gdn_step.body``), so a recurrent
    layer is four launches: gdn_in, gdn_step, out_add, the FFN's two (only with
    ``matvec="kernels"``: it is one of the project's kernels).
    ``matvec``: every weight's product as MLX ops (``"mlx"``) or through the project's
    kernels (``"kernels"``: ``BackendUnavailable`` where no kernel backend exists); see
    :mod:`workbench.decode.matvec`. ``activations``: the ``"mlx"`` path's (``"weights"``:
    x cast to the weights' dtype, as the schedule always ran; ``"float32"``: the kernels'
    arithmetic, for checking them). ``compiled``: each recurrent layer traced once per
    layer weights by ``mx.compile`` (MLX fuses its elementwise ops, and a token's graph is
    built with one call a layer instead of ~30 ops: Python's graph building is work the
    device waits for, on every path); the waits are the same.
    """

    def __init__(self, cfg, weights: HybridWeights, *, eligible: Sequence[int] | None = None, plan=None,
                 gdn: str = "fast", matvec: str = "mlx", activations: str = "weights", tuning=None,
                 compiled: bool = False):
        one_of("activations", activations, _dm.ACTIVATIONS)
        if gdn not in GDN_PATHS:
            raise ValueError(f"gdn: must be 'fast' (mx.fast.gated_delta_update), 'ops' (gated_delta_ops) or 'kernel' "
                             f"(the gdn_step kernel, with matvec='kernels'), got {gdn!r}")
        if gdn == "kernel":
            one_of("matvec", matvec, _dm.MATVEC_PATHS)
            if matvec != "kernels":
                raise ValueError(f"gdn: 'kernel' (the gdn_step kernel) runs with the project's kernels only "
                                 f"(matvec='kernels'), got matvec={matvec!r}; use gdn='fast' or 'ops' with MLX ops")
        if not isinstance(weights, HybridWeights):
            raise ValueError(f"weights: must be HybridWeights, got {describe(weights)}")
        self.gdn = gdn
        self.cfg, self.w, self.geom = cfg, weights, weights.geom
        self.mv = _dm.make_matvecs(matvec, weights.geom.eps, activations=activations, tuning=tuning)
        self.matvec = self.mv.path
        self.compiled = flag("compiled", compiled)
        self._layer_fns: dict[int, Any] = {}
        self._layer_keep: list = []  # the weight dicts keyed by id in _layer_fns, kept alive
        self.plan = _waits.as_plan(plan)
        self.eligible = tuple(_waits.eligible_layers(cfg) if eligible is None else eligible)
        _waits.submissions(cfg, self.plan.stages[0], plan=self.plan, eligible=self.eligible)  # checks eligible
        self._subs: dict[int, list] = {}

    def submissions(self, stage) -> list:
        st = self.plan.stage(stage)
        if st.number not in self._subs:
            self._subs[st.number] = _waits.submissions(self.cfg, st, plan=self.plan, eligible=self.eligible)
        return self._subs[st.number]

    def _recurrent_fn(self, lw: Mapping[str, Any]):
        """``(x, conv, ssm) -> (x, conv, ssm)`` for one recurrent layer's weights (traced
        once per weights by ``mx.compile`` with ``compiled``)."""
        fn = self._layer_fns.get(id(lw))
        if fn is None:
            g, gdn, mv = self.geom, self.gdn, self.mv

            def layer(x, conv, ssm):
                st = DecodeState({0: ssm}, {0: conv}, {}, {}, {}, {}, 0)
                y = _recurrent(g, lw, x, st, 0, gdn, mv)
                return y, st.conv[0], st.ssm[0]

            fn = mx.compile(layer) if self.compiled else layer
            self._layer_fns[id(lw)] = fn
            self._layer_keep.append(lw)
        return fn

    def step(self, state: DecodeState, stage) -> TokenResult:
        """Decode one token at ``stage``: build each submission lazily, evaluate it once."""
        g, layers = self.geom, self.w.layers
        subs = self.submissions(stage)
        t0 = time.perf_counter()
        x = mx.array(self.w.embed[state.token % self.w.embed.shape[0]])
        pos = state.length
        n_waits = 0
        t_eval = 0.0
        qkv: dict[int, tuple] = {}
        branch: dict[int, mx.array] = {}
        logits = None
        for sub in subs:
            outs: list[mx.array] = []
            for piece in sub:
                l = piece.layer
                if piece.kind == "layer":
                    x, state.conv[l], state.ssm[l] = self._recurrent_fn(layers[l].w)(x, state.conv[l], state.ssm[l])
                    outs += [state.ssm[l], state.conv[l]]
                elif piece.kind == "qkv":
                    qkv[l] = self.mv.attn_qkv(layers[l].w, x)
                    outs += list(qkv[l])
                elif piece.kind == "attention":  # the device floor: cache and softmax on the device
                    q, k, v = qkv.pop(l)
                    state.dev_k[l] = mx.concatenate([state.dev_k[l], k.reshape(1, g.n_kv, g.head_dim)])
                    state.dev_v[l] = mx.concatenate([state.dev_v[l], v.reshape(1, g.n_kv, g.head_dim)])
                    branch[l] = _attend_mx(g, q, state.dev_k[l], state.dev_v[l])
                    outs += [state.dev_k[l], state.dev_v[l]]
                elif piece.kind in ("tail", "wo"):
                    x = self.mv.out_add(layers[l].w, "wo", branch[l], x)
                    if piece.kind == "tail":
                        x = self.mv.ffn(layers[l].w, x)
                elif piece.kind == "ffn":
                    x = self.mv.ffn(layers[l].w, x)
                elif piece.kind == "logits":
                    logits = self.mv.logits(self.w.lm_head, self.w.final_norm, x)
                    outs.append(logits)
            te = time.perf_counter()
            mx.eval(x, *outs)  # the submission, and its one wait
            t_eval += time.perf_counter() - te
            n_waits += 1
            last = sub[-1]
            if last.kind in ("wo", "ffn"):  # unfused or refused: the host takes the result back
                np.asarray(x)
            elif last.kind == "qkv":  # the host needs this layer's Q/K/V: attention on the host
                l = last.layer
                q, k, v = (np.asarray(a) for a in qkv.pop(l))
                state.host_k[l][pos] = k.reshape(g.n_kv, g.head_dim)
                state.host_v[l][pos] = v.reshape(g.n_kv, g.head_dim)
                branch[l] = mx.array(_attend_np(g, q, state.host_k[l][: pos + 1], state.host_v[l][: pos + 1]))
        assert logits is not None
        out = np.asarray(logits)
        nxt = int(np.argmax(out))  # sampling is host work
        seconds = time.perf_counter() - t0
        state.length = pos + 1
        state.token = nxt
        return TokenResult(out, n_waits, seconds, nxt, t_eval)


# ---------------------------------------------------------------------------------------
# The kernels checked against MLX ops, and the price of a wait by its kind

#: The check of a step against the reference step: ``decode_matvec.worst_scaled_error`` of
#: the logits (max |difference| / max(max |reference logit|, 1)) at most this. Both compute
#: every product in float32 from the same stored weights, in another summation order; over
#: 64 layers that stays within float32 rounding (the MLX attention on the device against the
#: host's numpy is held to the same bound in tests/test_schedule.py).
CHECK_TOL = 1e-4


def check_step(sched: Schedule, ref: Schedule, *, stages: Sequence[int] = (5, 6), context: int = 32,
               tol: float = CHECK_TOL) -> dict:
    """One token of ``sched`` against one of ``ref`` (same weights, same start, same token)
    at each of ``stages``: the logits' worst scaled error and whether it is within ``tol``."""
    for name, v in (("sched", sched), ("ref", ref)):
        if not isinstance(v, Schedule):
            raise ValueError(f"{name}: must be a Schedule, got {describe(v)}")
    if ref.w is not sched.w:
        raise ValueError("ref: must decode the same HybridWeights object as sched")
    tol = number("tol", tol, minimum=0, exclusive_minimum=True)
    rows = []
    for n in stages:
        a = sched.step(new_state(sched.w, context=context, max_new=2), n)
        b = ref.step(new_state(ref.w, context=context, max_new=2), n)
        err = _dm.worst_scaled_error(a.logits, b.logits)
        rows.append({"stage": int(n), "worst_scaled_error": err, "same_next_token": a.next_token == b.next_token,
                     "passed": bool(err <= tol)})
    return {"metric": "max |logits - reference logits| / max(max |reference logits|, 1), one token",
            "tol": tol, "matvec": sched.mv.describe(), "reference": ref.mv.describe(), "stages": rows,
            "passed": all(r["passed"] for r in rows)}


#: The split kinds a same-work pair of the plan's stages removes (``waits.model_saving``),
#: which ``split_pieces`` can build on either side.
MEASURED_SPLITS: tuple[str, ...] = ("wo>host|ffn", "ffn>host|layer", "ffn>host|logits", "layer|qkv", "ffn|layer",
                                    "ffn|logits", "layer|layer", "qkv>host|wo")


def split_pieces(sched: Schedule, state: DecodeState) -> dict[str, Any]:
    """The step's submissions as callables ``x -> outputs`` (a tuple, the hidden first),
    built on ``sched``'s weights and matvecs, for timing splits between them:
    ``layer`` (a recurrent layer; its state advances), ``layer2`` (the next one), ``qkv``,
    ``wo`` (with a fixed attention branch), ``ffn`` and ``logits``; and, taking ``qkv``'s
    output, ``attend_wo`` (the cache and softmax on the device, then wo: stage 6's way)
    and ``host_attend_wo`` (Q/K/V read back, attention in numpy, the branch uploaded, then
    wo: stage 5's way), both against a copy of the KV cache ``state`` holds."""
    g, layers = sched.geom, sched.w.layers
    rec = [i for i, lay in enumerate(layers) if lay.kind == "recurrent"][:2]
    att = next(i for i, lay in enumerate(layers) if lay.kind == "attention")
    branch = mx.array(np.random.default_rng(5).uniform(-1, 1, g.branch).astype(np.float32))
    mx.eval(branch)

    def layer(i: int):
        return lambda x: (_recurrent(g, layers[i].w, x, state, i, sched.gdn, sched.mv), state.ssm[i], state.conv[i])

    pos = state.length

    def attend_wo(t):
        x, q, k, v = t
        kc = mx.concatenate([state.dev_k[att], k.reshape(1, g.n_kv, g.head_dim)])
        vc = mx.concatenate([state.dev_v[att], v.reshape(1, g.n_kv, g.head_dim)])
        return (sched.mv.out_add(layers[att].w, "wo", _attend_mx(g, q, kc, vc), x),)

    def host_attend_wo(t):
        x, q, k, v = t
        kc = np.concatenate([state.host_k[att][:pos], np.asarray(k).reshape(1, g.n_kv, g.head_dim)])
        vc = np.concatenate([state.host_v[att][:pos], np.asarray(v).reshape(1, g.n_kv, g.head_dim)])
        b = mx.array(_attend_np(g, np.asarray(q), kc, vc))
        return (sched.mv.out_add(layers[att].w, "wo", b, x),)

    return {
        "attend_wo": attend_wo,
        "host_attend_wo": host_attend_wo,
        "layer": layer(rec[0]),
        "layer2": layer(rec[1]),
        "qkv": lambda x: (x, *sched.mv.attn_qkv(layers[att].w, x)),
        "wo": lambda x: (sched.mv.out_add(layers[att].w, "wo", branch, x),),
        "ffn": lambda x: (sched.mv.ffn(layers[att].w, x),),
        "logits": lambda x: (x, sched.mv.logits(sched.w.lm_head, sched.w.final_norm, x)),
    }


def copy_bandwidth(nbytes: int = 1 << 30, *, k: int = 8, n: int = 5) -> float:
    """The device's streaming bandwidth (bytes/s): ``k`` chained ``y + 1`` over ``nbytes``
    of float32 in ONE evaluation against one, each op a read and a write of ``nbytes``;
    the marginal time, so the wait and the allocation drop out (one ``x + 1`` with its
    wait read 2.8 TB/s on the H200 where the kernels stream at 4 TB/s)."""
    x = mx.zeros((integer("nbytes", nbytes, minimum=1024) // 4,), dtype=mx.float32)
    mx.eval(x)
    ms = piece_device_ms(lambda y: (y + 1.0,), x, k=k, n=n)
    del x
    if ms <= 0:
        # k copies measured no slower than one: the clock's noise is larger than the copy
        # (a loaded host, or nbytes too small for this device). A bandwidth would be a lie.
        raise RuntimeError(f"copy_bandwidth: {k} chained copies of {nbytes} bytes took no longer than one "
                           f"(marginal {ms:.4f} ms): the clock is noisier than the copy; use more nbytes or n")
    return 2 * nbytes / (ms / 1e3)


def piece_device_ms(piece, x: mx.array, *, k: int = 8, n: int = 5) -> float:
    """What one more copy of submission ``piece`` (a callable of :func:`split_pieces`) adds
    to ONE evaluation: ``k`` copies chained against one, ``(t_k - t_1) / (k - 1)``, the
    median of ``n`` (the wait and the fixed costs are in both, so they drop out). That is
    the device's time for it, or MLX's time to encode and launch it where that is longer
    (a recurrent layer's ~20 launches on the H200: the same in bf16 and 4-bit)."""
    k = integer("k", k, minimum=2)
    n = integer("n", n, minimum=1)

    def run(m: int) -> float:
        y, outs = x, []
        t0 = time.perf_counter()
        for _ in range(m):
            o = piece(y)
            y, outs = o[0], outs + list(o[1:])
        mx.eval(y, *outs)
        return time.perf_counter() - t0

    run(k)  # warm
    diffs = sorted((run(k) - run(1)) / (k - 1) * 1e3 for _ in range(n))
    return float(diffs[len(diffs) // 2])


#: What the step's host reads after each piece when a wait follows it (``Schedule.step``):
#: nothing after a recurrent layer, x after wo or the FFN (the unfused tail), Q/K/V
#: (attention on the host), the logits.
HOST_READS: dict[str, Any] = {
    "layer": lambda out: (), "wo": lambda out: out[:1], "ffn": lambda out: out[:1], "qkv": lambda out: out[1:],
    "logits": lambda out: out[1:],
}


def _NOTHING(out) -> tuple:  # noqa: N802 -- a constant's role: the host reads nothing
    return ()


def measure_splits(sched: Schedule, kinds: Sequence[str] = MEASURED_SPLITS, *, n: int = 30, warmup: int = 3,
                   context: int = 32) -> list[dict]:
    """The price of a wait of each kind in ``kinds``, measured between the step's own
    submissions (``wait_measurement.measure_split_between``): ``"wo>host|ffn"`` times wo then
    the FFN split against joined, ``"layer|layer"`` two recurrent layers, and so on."""
    state = new_state(sched.w, context=context, max_new=2)
    pieces = split_pieces(sched, state)
    x = mx.array(sched.w.embed[0])
    mx.eval(x)
    out = []
    for kind in kinds:
        _waits.check_split_kind("kinds[]", kind)
        a, b = kind.split("|")
        reads = a.endswith(_waits.HOST_READ)
        a = a[: -len(_waits.HOST_READ)] if reads else a
        if kind not in MEASURED_SPLITS:
            raise ValueError(f"kinds: {kind!r} cannot be built from the step's pieces; allowed: {MEASURED_SPLITS}")
        first = pieces[a]
        if kind == "qkv>host|wo":
            # Stage 5 against stage 6 at one attention layer: split, the host reads Q/K/V,
            # attends in numpy and uploads the branch; joined, the device attends. The
            # difference is what one such wait costs the step, the host's attention and
            # the device's idle time while it runs included.
            res = _wm.measure_split_between(first, pieces["attend_wo"], x, n=n, warmup=warmup,
                                            read_first=HOST_READS["qkv"], read_second=HOST_READS["wo"],
                                            second_split=pieces["host_attend_wo"])
            dev = {"first": piece_device_ms(first, x),
                   "second": piece_device_ms(lambda y: pieces["attend_wo"](first(y)), x) - piece_device_ms(first, x)}
        else:
            second_piece = pieces["layer2" if (a, b) == ("layer", "layer") else b]
            res = _wm.measure_split_between(first, lambda t, f=second_piece: f(t[0]), x, n=n, warmup=warmup,
                                            read_first=HOST_READS[a] if reads else _NOTHING,
                                            read_second=HOST_READS[b])
            dev = {"first": piece_device_ms(first, x), "second": piece_device_ms(second_piece, x)}
        # The device's idle time in the split round: its wall time less the two submissions' work.
        out.append({"split": kind, **res, "device_ms": dev,
                    "split_idle_ms": res["split_ms"] - dev["first"] - dev["second"],
                    "joined_idle_ms": res["joined_ms"] - dev["first"] - dev["second"]})
    return out


# ---------------------------------------------------------------------------------------
# Stages against the table


def run_stages(
    sched: Schedule,
    *,
    stages: Sequence[int] | None = None,
    tokens: int = 8,
    rounds: int = 5,
    warmup: int = 2,
    context: int = 32,
    price_ms: float | None = None,
    progress=None,
    time_budget_s: float | None = None,
    split_prices: Mapping[str, float] | None = None,
) -> dict:
    """Time ``tokens`` tokens per round at every stage, rounds interleaved; compare with the table.

    Every stage decodes its own state from the same start, so all stages compute the
    same tokens. ``time_budget_s``: stop after the first round that ends past it (the
    record says how many rounds ran). Returns a record: per stage, the waits the executor made a token (and
    whether they equal ``waits_per_token``) and the median ms a token; per pair of
    consecutive stages (and each stage against stage 1), the measured saving and the
    predicted one (waits saved x ``price_ms``) with their ratio.
    """
    if not isinstance(sched, Schedule):
        raise ValueError(f"sched: must be a Schedule, got {describe(sched)}")
    tokens = integer("tokens", tokens, minimum=1)
    rounds = integer("rounds", rounds, minimum=1)
    warmup = integer("warmup", warmup, minimum=0)
    context = integer("context", context, minimum=1)
    if price_ms is not None:
        price_ms = number("price_ms", price_ms, minimum=0, exclusive_minimum=True)
    if time_budget_s is not None:
        time_budget_s = number("time_budget_s", time_budget_s, minimum=0)
    if progress is not None and not callable(progress):
        raise ValueError(f"progress: must be None or a callable (round, rounds), got {describe(progress)}")
    plan = sched.plan
    numbers = [s.number for s in plan.stages] if stages is None else [plan.stage(s).number for s in stages]
    if not numbers or len(set(numbers)) != len(numbers):
        raise ValueError(f"stages: must name one or more distinct stages of the plan, got {describe(stages)}")
    states = {n: new_state(sched.w, context=context, max_new=warmup + tokens * rounds + 1) for n in numbers}
    made: dict[int, set] = {n: set() for n in numbers}
    times: dict[int, list] = {n: [] for n in numbers}
    evals: dict[int, list] = {n: [] for n in numbers}
    for n in numbers:  # warm-up: compile kernels, fault in the weights
        for _ in range(warmup):
            made[n].add(sched.step(states[n], n).waits)
    start = time.perf_counter()
    done = 0
    gc_was = gc.isenabled()
    gc.disable()  # a collection inside a token is noise of a millisecond and more: collect between rounds
    try:
        for r in range(rounds):
            gc.collect()
            for n in numbers:
                for _ in range(tokens):
                    res = sched.step(states[n], n)
                    made[n].add(res.waits)
                    times[n].append(res.seconds * 1e3)
                    evals[n].append(res.eval_seconds * 1e3)
            done = r + 1
            if progress is not None:
                progress(done, rounds)
            if time_budget_s is not None and time.perf_counter() - start > time_budget_s:
                break
    finally:
        if gc_was:
            gc.enable()
    rows = []
    for n in numbers:
        st = plan.stage(n)
        predicted = len(sched.submissions(n))
        t = np.asarray(times[n])
        rows.append({
            "stage": n, "name": st.name, "waits_predicted": predicted, "waits_made": sorted(made[n]),
            "waits_match": made[n] == {predicted},
            "ms_median": float(np.median(t)), "ms_p10": float(np.percentile(t, 10)),
            "ms_p90": float(np.percentile(t, 90)), "tokens": int(t.size),
            # Inside mx.eval (encoding, submitting, waiting) against outside (building the
            # lazy graphs in Python, the host's attention, reads): the device idles for the latter.
            "ms_eval_median": float(np.median(evals[n])), "ms_host_median": float(np.median(t - np.asarray(evals[n]))),
            "ms_each": [round(float(v), 4) for v in t],  # in time order, round by round
        })
    rec: dict[str, Any] = {"stages": rows, "rounds_run": done}
    if price_ms is not None:
        rec["comparisons"] = compare_savings(rows, price_ms, split_prices=split_prices, cfg=sched.cfg,
                                             eligible=sched.eligible)
    return rec


def check_rows(name: str, rows: Any, keys: Sequence[str]) -> list[Mapping]:
    """``rows`` as a non-empty list of mappings that each hold ``keys``, or a ValueError
    naming ``name``, the row and the missing keys (a record from an older or foreign run)."""
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence) or not rows:
        raise ValueError(f"{name}: must be a non-empty list of rows, got {describe(rows)}")
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping):
            raise ValueError(f"{name}[{i}]: must be a mapping, got {describe(r)}")
        missing = [k for k in keys if k not in r]
        if missing:
            raise ValueError(f"{name}[{i}]: lacks {missing}")
    return list(rows)


def compare_savings(rows: Sequence[Mapping], price_ms: float, *, split_prices: Mapping[str, float] | None = None,
                    cfg=None, eligible: Sequence[int] | None = None) -> list[dict]:
    """Measured against predicted savings: each stage against the one before, and against stage 1.

    ``same_work`` is False for a pair of which one stage runs the attention on the device
    (the device floor) and the other on the host: there the arithmetic differs as well as
    the waits, so the pair does not test the table.

    With ``split_prices`` (and ``cfg``, the model decoded) each pair also carries the price
    model's prediction (``waits.model_saving``): ``ms_saved_model``, ``model_priced``
    (every split kind the pair removes has a measured price), ``ratio_model`` and, when
    paired times exist, ``ratio_model_paired``.
    """
    rows = check_rows("rows", rows, ("stage", "waits_predicted", "ms_median"))
    price_ms = number("price_ms", price_ms, minimum=0, exclusive_minimum=True)
    by = {r["stage"]: r for r in rows}
    nums = sorted(by)
    plan = _waits.load_plan()
    device_attention = {s.number for s in plan.stages if s.attention_on_device}
    pairs = [(a, b) for a, b in zip(nums, nums[1:])] + [(nums[0], b) for b in nums[2:]]
    out = []
    for a, b in pairs:
        saved = by[a]["waits_predicted"] - by[b]["waits_predicted"]
        measured = by[a]["ms_median"] - by[b]["ms_median"]
        predicted = saved * price_ms
        row = {
            "from": a, "to": b, "waits_saved": saved, "ms_saved_measured": measured,
            "ms_saved_predicted": predicted, "ratio": measured / predicted if predicted else None,
            # False where one side runs the attention on the device and the other on the
            # host: then more than the waits differ, and the ratio is not the table's check.
            "same_work": (a in device_attention) == (b in device_attention),
        }
        ea, eb = by[a].get("ms_each"), by[b].get("ms_each")
        if ea and eb and len(ea) == len(eb):
            # Token i of stage a and token i of stage b ran in the same round, close in
            # time: the median of their differences cancels slow drift in a shared load.
            paired = float(np.median(np.asarray(ea) - np.asarray(eb)))
            row["ms_saved_paired"] = paired
            row["ratio_paired"] = paired / predicted if predicted else None
        if split_prices is not None:
            if cfg is None:
                raise ValueError("cfg: the price model needs the model decoded (cfg) beside split_prices")
            m = _waits.model_saving(cfg, a, b, split_prices, price_ms, plan=plan, eligible=eligible)
            row["ms_saved_model"] = m["ms"]
            row["model_priced"] = m["priced"]
            row["ratio_model"] = measured / m["ms"] if m["ms"] else None
            if "ms_saved_paired" in row:
                row["ratio_model_paired"] = row["ms_saved_paired"] / m["ms"] if m["ms"] else None
        out.append(row)
    return out


def fit_price(rows: Sequence[Mapping]) -> dict:
    """The price of a wait the clock implies: a least-squares line through (waits, ms a token).

    Every stage computes the same arithmetic, so ``ms = intercept + waits x price`` if a
    wait costs the same wherever it falls; the slope is that price, fitted from all the
    stages at once (steadier than any one difference on a noisy machine).
    """
    rows = check_rows("rows", rows, ("waits_predicted", "ms_median"))
    w = np.array([r["waits_predicted"] for r in rows], dtype=float)
    t = np.array([r["ms_median"] for r in rows], dtype=float)
    if len(set(w.tolist())) < 2:
        raise ValueError("rows: need stages with at least two different wait counts to fit a price")
    slope, intercept = np.polyfit(w, t, 1)
    return {"ms_per_wait": float(slope), "intercept_ms": float(intercept)}
