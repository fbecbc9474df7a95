"""The links a chain is made of: parts of a hybrid layer as an engine launches them, one after
another, each reading what the one before it wrote.

frink-models' engine encodes the attention tail at the head of the next recurrent run
(its ``fused_attention_tail_then_run``) and the next attention layer's Q/K/V projections at
the end of the run before it (``attn_head_launch``): a kernel engineer writes these launches
as one piece, and an error made early is read by every launch after it. A link is one such
piece: the tensors it reads and writes, its weights (drawn per case), its float64 oracle and
the workbench's float32 reference, both over numpy in and out.

* ``"tail"``: the attention tail (part ``tail``: ``workbench.tail.paths.host_tail`` float64,
  ``fused_tail`` on the graph backend float32): ``branch``, ``residual`` -> ``hidden``;
* ``"gdn_in"``: a linear-attention layer's input RMS norm and its four projections, as
  mlx-lm's Qwen3.5 ``GatedDeltaNet`` has them (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``,
  ``in_proj_a``; mlx_lm/models/qwen3_5.py, 0.32.2): ``hidden`` -> ``mixed``, ``z``, ``b``, ``a``;
* ``"gdn"``: the Gated DeltaNet recurrent step (part ``gdn``: ``kernels.gdn_step.recurrent_step_exact``
  float64, ``decode.layers.recurrent_step`` float32): ``mixed``, ``z``, ``b``, ``a``,
  ``conv_state``, ``state`` -> ``out``, ``conv_state``, ``state``;
* ``"head"``: the next attention layer's head as Qwen3.5 has it (part ``head``:
  ``check.head_math.head_exact`` float64, ``check.head_mlx.head_reference`` float32; the
  ``"model"`` shape of ``check.head_spec``, at the dims' ``position``): ``hidden`` -> ``q``,
  ``k``, ``v``, ``gate``. With the tail before it: frink-models' ``attn_head_launch``,
  encoded at the end of the recurrent run (``gdn``, ``tail``, ``head``: the run's last step,
  the recurrent layer's ``out_proj`` and FFN as the tail, the head).

A link reads each input from the latest link before it that wrote that tensor (or one of
the names it ``accepts`` in its place: the tail's ``branch`` is the recurrent step's ``out``
when a step comes first, its ``residual`` an earlier tail's ``hidden``), else from the
chain's own inputs, which the check draws.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.check.parts import part

Arrays = dict[str, np.ndarray]


#: ChainDims' integer widths (each >= 1).
INT_DIMS: tuple[str, ...] = (
    "hidden",
    "branch",
    "ffn",
    "k_heads",
    "v_heads",
    "k_dim",
    "v_dim",
    "conv",
    "q_heads",
    "kv_heads",
    "head_dim",
)


@dataclass(frozen=True)
class ChainDims:
    """A chain's tiny config: the hidden stream, the attention branch (wo's input) and the
    FFN's width, the recurrent layer's heads (``k_heads``, ``v_heads``, their ``k_dim``,
    ``v_dim``) and its conv width, the RMS norms' ``eps`` (Qwen3.5's 1e-6)."""

    hidden: int = 64
    branch: int = 96
    ffn: int = 80
    k_heads: int = 2
    v_heads: int = 6
    k_dim: int = 32
    v_dim: int = 32
    conv: int = 4
    q_heads: int = 3
    kv_heads: int = 1
    head_dim: int = 32
    rotary_dim: int = 8
    rope_theta: float = 1e7
    position: int = 7
    eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in INT_DIMS:
            validate.integer(f"dims {name}", getattr(self, name), minimum=1, maximum=1 << 16)
        validate.integer("dims rotary_dim", self.rotary_dim, minimum=0, maximum=1 << 16)
        validate.integer("dims position", self.position, minimum=0, maximum=1 << 24)
        validate.number("dims eps", self.eps, minimum=0, exclusive_minimum=True)
        if self.v_heads % self.k_heads:
            raise ValueError(
                f"dims: v_heads must be a multiple of k_heads, got k_heads {self.k_heads}, v_heads {self.v_heads}"
            )
        if self.conv < 2:
            raise ValueError(f"dims: conv (the conv width) must be >= 2, got {self.conv}")
        self.head_spec()  # the head's own rules (q_heads a multiple of kv_heads, rotary_dim even)

    @property
    def channels(self) -> int:
        """The conv's channels: q | k | v before it."""
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    @property
    def value(self) -> int:
        return self.v_heads * self.v_dim

    def head_spec(self) -> Any:
        """The next attention layer's head as Qwen3.5 has it (``check.head_spec``'s ``"model"``
        shape: the output gate split from q_proj per head, QK-norm, partial RoPE)."""
        from workbench.check.head_spec import HeadSpec

        return HeadSpec(
            "model",
            self.hidden,
            self.q_heads,
            self.kv_heads,
            self.head_dim,
            rotary_dim=self.rotary_dim,
            rope_theta=self.rope_theta,
            qk_norm=True,
            gate=True,
            eps=self.eps,
            name="chain head",
        )

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every activation and state a link reads or writes (the tail's ``branch`` is wired)."""
        c = self.channels
        return {
            "branch": (self.branch,),
            "residual": (self.hidden,),
            "hidden": (self.hidden,),
            "mixed": (c,),
            "z": (self.value,),
            "b": (self.v_heads,),
            "a": (self.v_heads,),
            "conv_state": (self.conv - 1, c),
            "state": (self.v_heads, self.v_dim, self.k_dim),
            "out": (self.value,),
            "q": (self.q_heads * self.head_dim,),
            "gate": (self.q_heads * self.head_dim,),
            "k": (self.kv_heads * self.head_dim,),
            "v": (self.kv_heads * self.head_dim,),
        }


@dataclass(frozen=True)
class Link:
    """One link: ``inputs`` and ``outputs`` (tensor names), ``accepts`` (input -> names an
    earlier link may have written it under), ``weights`` (name -> shape, given the dims and
    the inputs' shapes), ``draw`` (rng, dims, shapes, gate -> float32 weights), ``oracle``
    and ``reference`` ((weights, inputs, dims) -> the outputs, float64 and float32)."""

    name: str
    part: str
    what: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weights: Callable[[ChainDims, Mapping[str, tuple[int, ...]]], dict[str, tuple[int, ...]]]
    draw: Callable[[np.random.Generator, ChainDims, Mapping[str, tuple[int, ...]], str], Arrays]
    oracle: Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray], ChainDims], tuple[np.ndarray, ...]]
    reference: Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray], ChainDims], tuple[np.ndarray, ...]]
    accepts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Inputs that are the layer's own state: each occurrence of the link has its own.
    state: tuple[str, ...] = ()


def _matrix(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """N(0, 1 / cols): a product keeps its input's scale, so every link sees O(1) activations."""
    return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)


def _norm_weight(rng: np.random.Generator, n: int) -> np.ndarray:
    return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)


# -- the tail ---------------------------------------------------------------------------


def _tail_weights(d: ChainDims, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    h, f, br = d.hidden, d.ffn, shapes["branch"][0]
    return {"wo": (h, br), "ffn_norm": (h,), "gate": (f, h), "up": (f, h), "down": (h, f)}


def _tail_draw(rng: np.random.Generator, d: ChainDims, shapes: Mapping[str, tuple[int, ...]], gate: str) -> Arrays:
    s = _tail_weights(d, shapes)
    w = {k: _matrix(rng, *v) for k, v in s.items() if len(v) == 2}
    w["ffn_norm"] = _norm_weight(rng, d.hidden)
    return {k: w[k] for k in s}


def _tail_weights_of(w: Mapping[str, np.ndarray], d: ChainDims) -> Any:
    from workbench.tail.weights import TailWeights

    return TailWeights.from_arrays(
        *(np.asarray(w[k], np.float32) for k in ("wo", "ffn_norm", "gate", "up", "down")), eps=d.eps
    )


def _tail_oracle(w: Mapping[str, np.ndarray], x: Mapping[str, np.ndarray], d: ChainDims) -> tuple[np.ndarray]:
    return (part("tail").oracle(_tail_weights_of(w, d), x["branch"], x["residual"]),)


def _tail_reference(w: Mapping[str, np.ndarray], x: Mapping[str, np.ndarray], d: ChainDims) -> tuple[np.ndarray]:
    out = part("tail").reference(_tail_weights_of(w, d), x["branch"], x["residual"], backend="graph")
    return (np.asarray(out, np.float32),)


# -- the recurrent layer's input norm and projections ------------------------------------

_GDN_IN = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")


def _gdn_in_weights(d: ChainDims, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    h = d.hidden
    rows = (d.channels, d.value, d.v_heads, d.v_heads)
    return {"input_norm": (h,), **{k: (r, h) for k, r in zip(_GDN_IN, rows)}}


def _gdn_in_draw(rng: np.random.Generator, d: ChainDims, shapes: Mapping[str, tuple[int, ...]], gate: str) -> Arrays:
    s = _gdn_in_weights(d, shapes)
    return {"input_norm": _norm_weight(rng, d.hidden), **{k: _matrix(rng, *s[k]) for k in _GDN_IN}}


def _gdn_in_oracle(w: Mapping[str, np.ndarray], x: Mapping[str, np.ndarray], d: ChainDims) -> tuple[np.ndarray, ...]:
    from workbench.tail.ops import rms_norm_np

    h = np.asarray(x["hidden"], np.float64)
    n = rms_norm_np(h, np.asarray(w["input_norm"], np.float64), d.eps)
    return tuple(np.asarray(w[k], np.float64) @ n for k in _GDN_IN)


def _gdn_in_reference(w: Mapping[str, np.ndarray], x: Mapping[str, np.ndarray], d: ChainDims) -> tuple[np.ndarray, ...]:
    # the workbench decoder's own ops (decode.matvec: its float32 RMS norm, then MLX products)
    from workbench.decode.matvec import mlx_matvec, rms

    n = rms(mx.array(x["hidden"]), mx.array(w["input_norm"]), d.eps)
    outs = [mlx_matvec(mx.array(w[k]), n) for k in _GDN_IN]
    mx.eval(*outs)
    return tuple(np.array(o, np.float32) for o in outs)


# -- the recurrent step -----------------------------------------------------------------

_GDN_CONSTS = ("conv_w", "a_log", "dt_bias", "o_norm")


def _gdn_weights(d: ChainDims, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    return {"conv_w": (d.conv, d.channels), "a_log": (d.v_heads,), "dt_bias": (d.v_heads,), "o_norm": (d.v_dim,)}


def _gdn_draw(rng: np.random.Generator, d: ChainDims, shapes: Mapping[str, tuple[int, ...]], gate: str) -> Arrays:
    # the step's own check draws its constants per gate regime (gdn_cases); the chain takes them
    from workbench.check.gdn_cases import token_run
    from workbench.kernels.gdn_step import GdnShape

    seed = int(rng.integers(1 << 31))
    shape = GdnShape(d.k_heads, d.v_heads, d.k_dim, d.v_dim, d.conv)
    w = token_run(shape, [seed], 1, scale=1.0, gate=gate, state_scale=0.0).weights
    return {k: getattr(w, k)[0] for k in _GDN_CONSTS}


def _gdn_oracle(w: Mapping[str, np.ndarray], x: Mapping[str, np.ndarray], d: ChainDims) -> tuple[np.ndarray, ...]:
    ba = np.concatenate([np.asarray(x["b"], np.float64), np.asarray(x["a"], np.float64)])
    args = (x["mixed"], x["z"], ba, x["conv_state"], w["conv_w"], w["a_log"], w["dt_bias"], w["o_norm"], x["state"])
    return tuple(part("gdn").oracle(*args, k_heads=d.k_heads, eps=d.eps))


def _gdn_reference(w: Mapping[str, np.ndarray], x: Mapping[str, np.ndarray], d: ChainDims) -> tuple[np.ndarray, ...]:
    f = {k: mx.array(np.asarray(v, np.float32)) for k, v in x.items()}
    ba = mx.concatenate([f["b"], f["a"]])[None]
    outs = part("gdn").reference(
        f["mixed"][None],
        f["z"][None],
        ba,
        f["conv_state"][None],
        f["state"][None],
        *(mx.array(w[k]) for k in _GDN_CONSTS),
        k_heads=d.k_heads,
        eps=d.eps,
        gdn="ops",
    )
    mx.eval(*outs)
    return tuple(np.array(o[0], np.float32) for o in outs)


# -- the attention head ------------------------------------------------------------------

_HEAD = ("attn_norm", "q_w", "k_w", "v_w", "q_norm", "k_norm")


def _head_weights(d: ChainDims, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    s = d.head_spec()
    h = d.hidden
    return {
        "attn_norm": (h,),
        "q_w": (s.q_rows, h),
        "k_w": (s.kv_rows, h),
        "v_w": (s.kv_rows, h),
        "q_norm": (d.head_dim,),
        "k_norm": (d.head_dim,),
    }


def _head_draw(rng: np.random.Generator, d: ChainDims, shapes: Mapping[str, tuple[int, ...]], gate: str) -> Arrays:
    s = _head_weights(d, shapes)
    return {k: _matrix(rng, *v) if len(v) == 2 else _norm_weight(rng, v[0]) for k, v in s.items()}


def _head_oracle(w: Mapping[str, np.ndarray], x: Mapping[str, np.ndarray], d: ChainDims) -> tuple[np.ndarray, ...]:
    case = {**{k: w[k] for k in _HEAD}, "q_b": None, "k_b": None, "v_b": None, "fold": None}
    got = part("head").oracle(d.head_spec(), case, x["hidden"], d.position)
    return tuple(got[k] for k in ("q", "k", "v", "gate"))


def _head_reference(w: Mapping[str, np.ndarray], x: Mapping[str, np.ndarray], d: ChainDims) -> tuple[np.ndarray, ...]:
    from workbench.check.head_math import HeadWeights

    one = {k: np.asarray(w[k], np.float32)[None] for k in _HEAD}
    hw = HeadWeights(**one, q_b=None, k_b=None, v_b=None)
    got = part("head").reference(d.head_spec(), hw, np.asarray(x["hidden"], np.float32)[None], d.position)
    return tuple(np.asarray(got[k][0], np.float32) for k in ("q", "k", "v", "gate"))


LINKS: dict[str, Link] = {
    "tail": Link(
        "tail",
        "tail",
        "the attention tail: wo, the residual add, the FFN norm, gate/up, silu, down, the second add",
        ("branch", "residual"),
        ("hidden",),
        _tail_weights,
        _tail_draw,
        _tail_oracle,
        _tail_reference,
        {"branch": ("out",), "residual": ("hidden",)},
    ),
    "gdn_in": Link(
        "gdn_in",
        "gdn_in",
        "a linear-attention layer's input RMS norm and its projections in_proj_qkv, in_proj_z, in_proj_b, in_proj_a",
        ("hidden",),
        ("mixed", "z", "b", "a"),
        _gdn_in_weights,
        _gdn_in_draw,
        _gdn_in_oracle,
        _gdn_in_reference,
    ),
    "gdn": Link(
        "gdn",
        "gdn",
        "the Gated DeltaNet recurrent step (out before out_proj; conv and recurrent state in and out)",
        ("mixed", "z", "b", "a", "conv_state", "state"),
        ("out", "conv_state", "state"),
        _gdn_weights,
        _gdn_draw,
        _gdn_oracle,
        _gdn_reference,
        state=("conv_state", "state"),
    ),
    "head": Link(
        "head",
        "head",
        "the next attention layer's head as Qwen3.5 has it: input RMS norm, Q/K/V, the output gate split from "
        "q_proj per head, QK-norm, partial RoPE at the dims' position",
        ("hidden",),
        ("q", "k", "v", "gate"),
        _head_weights,
        _head_draw,
        _head_oracle,
        _head_reference,
    ),
}

#: The links a chain may name, in the order an engine's layer runs them.
LINK_NAMES: tuple[str, ...] = tuple(LINKS)
