"""What a decode step reads and keeps: a hybrid's random weights and the state between tokens.

:class:`HybridWeights` draws every layer's matrices for a :class:`~workbench.decode.geometry.Geometry`,
seeded, ``U(-a, a)`` with variance 1/fan_in, dense or quantized: the decode step is timed
for the waits it makes and the bytes it streams, neither of which depends on trained
values. :class:`DecodeState` is what one decode carries from token to token (recurrent
and convolution states, KV caches on the host and on the device); :func:`new_state`
starts it with a KV cache already ``context`` tokens long (random keys and values), so
the attention costs what a short chat's does, not what an empty cache's does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from workbench.decode.geometry import Geometry
from workbench.fold.weights import DENSE_DTYPES, QUANT_FORMATS, QuantizedBase, WeightMatrix
from workbench.validate import describe, flag, integer, one_of


def _uniform(key: mx.array, shape: tuple[int, ...], fan_in: int, dtype) -> mx.array:
    """``U(-a, a)`` with ``a = sqrt(3 / fan_in)``: variance 1/fan_in, so a product keeps its input's scale."""
    a = math.sqrt(3.0 / fan_in)
    return mx.random.uniform(-a, a, shape, key=key).astype(dtype)


@dataclass
class LayerWeights:
    """One layer's arrays by name, and its kind: ``"attention"`` or ``"recurrent"``."""

    kind: str
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

    def __init__(
        self,
        cfg,
        geom: Geometry,
        *,
        dtype: str = "float32",
        seed: int = 0,
        share: bool = False,
        quant: str | None = None,
    ):
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
        self.layers: list[LayerWeights] = []
        for lc in cfg.layers:
            kind = "attention" if lc.index in attn else "recurrent"
            if share and kind in made:
                self.layers.append(LayerWeights(kind, made[kind]))
                continue
            key, sub = mx.random.split(key)
            w = self._make(kind, sub, dt)
            mx.eval(w)  # materialise now, layer by layer, so peak memory is the weights alone
            made[kind] = w
            self.layers.append(LayerWeights(kind, w))
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
            w.update(
                wq=_uniform(next(ks), (q, h), h, dt),
                wk=_uniform(next(ks), (kv, h), h, dt),
                wv=_uniform(next(ks), (kv, h), h, dt),
                wo=_uniform(next(ks), (h, g.branch), g.branch, dt),
            )
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


#: The most tokens a state's KV caches hold before or after the decode starts (each way):
#: the caches are allocated whole up front, so a count past this is refused, not attempted.
MAX_TOKENS = 1 << 20


def new_state(wts: HybridWeights, *, context: int = 32, max_new: int = 4096, seed: int = 1) -> DecodeState:
    """A fresh state: zero recurrent states, a KV cache already ``context`` tokens long."""
    if not isinstance(wts, HybridWeights):
        raise ValueError(f"wts: must be HybridWeights, got {describe(wts)}")
    context = integer("context", context, minimum=1, maximum=MAX_TOKENS)
    max_new = integer("max_new", max_new, minimum=1, maximum=MAX_TOKENS)
    seed = integer("seed", seed, minimum=0)
    g = wts.geom
    rng = np.random.default_rng(seed)
    ssm, conv, hk, hv, dk, dv = {}, {}, {}, {}, {}, {}
    conv_c = 2 * g.gdn_k_heads * g.gdn_k_dim + g.gdn_v_heads * g.gdn_v_dim
    for li, layer in enumerate(wts.layers):
        if layer.kind == "recurrent":
            ssm[li] = mx.zeros((1, g.gdn_v_heads, g.gdn_v_dim, g.gdn_k_dim), dtype=mx.float32)
            conv[li] = mx.zeros((g.conv_kernel - 1, conv_c), dtype=mx.float32)
        else:
            cap = context + max_new
            hk[li] = np.zeros((cap, g.n_kv, g.head_dim), dtype=np.float32)
            hv[li] = np.zeros((cap, g.n_kv, g.head_dim), dtype=np.float32)
            hk[li][:context] = rng.standard_normal((context, g.n_kv, g.head_dim)).astype(np.float32)
            hv[li][:context] = rng.standard_normal((context, g.n_kv, g.head_dim)).astype(np.float32)
            dk[li] = mx.array(hk[li][:context])
            dv[li] = mx.array(hv[li][:context])
    mx.eval(list(ssm.values()), list(conv.values()), list(dk.values()), list(dv.values()))
    return DecodeState(ssm, conv, hk, hv, dk, dv, context)


def check_state(state: DecodeState, wts: HybridWeights, name: str = "state") -> None:
    """A ValueError naming ``name`` when ``state`` was not made for ``wts`` (by ``new_state``):
    its recurrent states, conv states and KV caches must sit at ``wts``'s layers, in the
    shapes ``wts``'s geometry gives them. A state of other weights would otherwise meet them
    in a matrix product (MLX's bare ``[matmul]``) or a reshape, or, where the shapes happen
    to agree, silently decode from the wrong caches. Only shapes are read: cheap a token."""
    g = wts.geom
    conv_c = 2 * g.gdn_k_heads * g.gdn_k_dim + g.gdn_v_heads * g.gdn_v_dim
    rec = {li for li, layer in enumerate(wts.layers) if layer.kind == "recurrent"}
    att = set(range(len(wts.layers))) - rec
    want = {
        "recurrent states": (state.ssm, rec, (1, g.gdn_v_heads, g.gdn_v_dim, g.gdn_k_dim)),
        "conv states": (state.conv, rec, (g.conv_kernel - 1, conv_c)),
        "host K caches": (state.host_k, att, (g.n_kv, g.head_dim)),
        "host V caches": (state.host_v, att, (g.n_kv, g.head_dim)),
        "device K caches": (state.dev_k, att, (g.n_kv, g.head_dim)),
        "device V caches": (state.dev_v, att, (g.n_kv, g.head_dim)),
    }
    for what, (held, layers, shape) in want.items():
        if not isinstance(held, dict) or set(held) != layers:
            got = sorted(held) if isinstance(held, dict) else describe(held)
            raise ValueError(
                f"{name}: made for other weights: its {what} are at layers {got}, these weights' are at "
                f"{sorted(layers)}; make it with new_state(these weights)"
            )
        for li, a in held.items():
            got = tuple(getattr(a, "shape", ()))
            per_token = what.endswith("caches")  # a cache's first axis is its tokens: any length
            if (got[1:] if per_token else got) != shape:
                which = "per token " if per_token else ""
                raise ValueError(
                    f"{name}: made for other weights: layer {li}'s {what[:-1]} has {which}shape "
                    f"{got[1:] if per_token else got}, these weights' geometry needs {shape}; "
                    f"make it with new_state(these weights)"
                )
