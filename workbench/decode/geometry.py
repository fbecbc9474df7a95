"""The widths a decode step of a Qwen3.5-style hybrid needs, read from a model's config.

A hybrid of this kind interleaves Gated DeltaNet (recurrent) layers with gated GQA
attention layers, each followed by an FFN. :class:`Geometry` holds every width the
step's weights, states and caches take; :func:`geometry_of` reads them from a config
(Bonsai-27B: hidden 5120, 24/4 heads of 256 with the output gate, FFN 17408, Gated
DeltaNet 16 key / 48 value heads of 128, conv 4), and :data:`CPU_GEOMETRY` is a scaled-down
one for a 2-core CPU, so the same layer pattern (and so the same waits a token) runs there.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.validate import describe, flag, integer, number


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
        for name in (
            "hidden",
            "ffn",
            "n_q",
            "n_kv",
            "head_dim",
            "gdn_k_heads",
            "gdn_v_heads",
            "gdn_k_dim",
            "gdn_v_dim",
            "conv_kernel",
            "vocab",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name}: must be a positive int, got {v!r}")
        # eps NaN or <= 0 makes rms_norm divide by zero or yield NaN: a step would still
        # answer a token (argmax of NaN logits is 0), so it is refused here.
        number("eps", self.eps, minimum=0, exclusive_minimum=True)
        flag("attn_output_gate", self.attn_output_gate)
        if self.n_q % self.n_kv:
            raise ValueError(f"n_q: must be a multiple of n_kv ({self.n_kv}), got {self.n_q}")
        if self.gdn_v_heads % self.gdn_k_heads:
            raise ValueError(
                f"gdn_v_heads: must be a multiple of gdn_k_heads ({self.gdn_k_heads}), got {self.gdn_v_heads}"
            )

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
    hidden=256,
    ffn=768,
    n_q=6,
    n_kv=1,
    head_dim=32,
    attn_output_gate=True,
    gdn_k_heads=2,
    gdn_v_heads=6,
    gdn_k_dim=32,
    gdn_v_dim=32,
    conv_kernel=4,
    vocab=2048,
)


def geometry_of(cfg, *, vocab: int | None = None) -> Geometry:
    """The full geometry of a Qwen3.5-style hybrid (Gated DeltaNet + gated GQA) from its config.

    ``cfg``: a ``ModelConfig`` (``load_model('bonsai-27b')``; a model's name is refused naming
    that call); ``vocab``: None for the config's own, else an integer >= 1."""
    from workbench.models.config import Mixer, ModelConfig
    from workbench.models.loader import list_models

    if not isinstance(cfg, ModelConfig):
        hint = (
            f" (a shipped model's name: load_model({cfg!r}))" if isinstance(cfg, str) and cfg in list_models() else ""
        )
        raise ValueError(f"cfg: must be a ModelConfig (e.g. load_model('bonsai-27b')), got {describe(cfg)}{hint}")
    if vocab is not None:
        vocab = integer("vocab", vocab, minimum=1)
    raw = dict(cfg.raw)
    text = dict(raw.get("text_config", raw))
    attn = cfg.attention_layers()
    if not attn:
        raise ValueError(f"cfg: {cfg.name} has no attention layer")
    kinds = {lc.mixer for lc in cfg.layers} - {Mixer.ATTENTION}
    if kinds - {Mixer.LINEAR_ATTENTION}:
        raise ValueError(
            f"cfg: the schedule runs Gated DeltaNet hybrids; {cfg.name} has {sorted(k.value for k in kinds)}"
        )
    need = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
    missing = [k for k in need if k not in text]
    if missing:
        raise ValueError(f"cfg: {cfg.name}'s config lacks {missing}")
    a = cfg.layer(attn[0])
    return Geometry(
        hidden=cfg.hidden_size,
        ffn=a.ffn_dim,
        n_q=a.num_q_heads,
        n_kv=a.num_kv_heads,
        head_dim=a.head_dim,
        attn_output_gate=bool(a.attn_output_gate),
        gdn_k_heads=int(text["linear_num_key_heads"]),
        gdn_v_heads=int(text["linear_num_value_heads"]),
        gdn_k_dim=int(text["linear_key_head_dim"]),
        gdn_v_dim=int(text["linear_value_head_dim"]),
        conv_kernel=int(text.get("linear_conv_kernel_dim", 4)),
        vocab=int(vocab if vocab is not None else text.get("vocab_size", 32000)),
        eps=float(cfg.rms_norm_eps),
    )
