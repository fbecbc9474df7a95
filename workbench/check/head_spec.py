"""What an attention head computes, said once (:class:`HeadSpec`), in the two shapes the check
tells apart.

``"launch"``: frink-models' head launch (its ``attn_head_launch``): the weighted RMS
norm of the hidden state, then Q, K and V of that one vector, all three projections folded
with ONE rotation (the kernel rotates their common input once), their biases added after.
Nothing per head happens in it: no QK-norm, no RoPE, no gate.

``"model"``: the head as a hybrid's config has it, as mlx-lm 0.32.2's
``mlx_lm/models/qwen3_next.py`` ``Qwen3NextAttention`` (which Qwen3.5 uses) computes it:
``q_proj``'s output split PER HEAD into the query and an output gate (``attn_output_gate``),
q and k normalised per head (QK-norm, a weighted RMS norm over ``head_dim``), the first
``rotary_dim = head_dim * partial_rotary_factor`` dims of each head rotated at the token's
position, halves paired (``x[i]`` with ``x[i + rotary_dim / 2]``, mlx-lm's
``traditional=False``), frequency ``rope_theta ** (-2 i / rotary_dim)``.

A spec is small on purpose: the check runs a head at a checkable width with a model's
fields (its QK-norm, gate, biases, rotary fraction and base, its query heads per kv head)
kept (:meth:`HeadSpec.from_layer`); the fields themselves are read from the model configs by
``workbench.models`` and sourced in ``docs/REFERENCE.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench import validate

#: The two shapes of a head, and what each is.
HEAD_SHAPES: dict[str, str] = {
    "launch": "frink-models' head launch: weighted RMS norm, Q, K and V sharing one fold, biases after",
    "model": "the config's head: gate split from q_proj per head, QK-norm, RoPE at a position (rotary fraction, base)",
}

#: The RMS norms' eps of the default specs (Qwen3.5's ``rms_norm_eps``).
HEAD_EPS = 1e-6


@dataclass(frozen=True)
class HeadSpec:
    """One head's arithmetic: ``shape`` (:data:`HEAD_SHAPES`), widths ``hidden``, ``q_heads``,
    ``kv_heads``, ``head_dim``; ``rotary_dim`` (dims of a head rotated, even, 0 = no RoPE) and
    ``rope_theta``; ``qk_norm`` (q and k RMS-normed per head), ``gate`` (q_proj carries an
    output gate per head), ``bias`` (Q/K/V biases), ``fold_block`` (the shared fold's block
    size, 0 = unfolded), ``eps`` (every RMS norm's). ``name`` says where it came from."""

    shape: str
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int = 0
    rope_theta: float = 10000.0
    qk_norm: bool = False
    gate: bool = False
    bias: bool = False
    fold_block: int = 0
    eps: float = HEAD_EPS
    name: str = ""

    def __post_init__(self) -> None:
        validate.one_of("shape", self.shape, tuple(HEAD_SHAPES))
        for k in ("hidden", "q_heads", "kv_heads", "head_dim"):
            object.__setattr__(self, k, validate.integer(k, getattr(self, k), minimum=1, maximum=1 << 16))
        for k in ("rotary_dim", "fold_block"):
            object.__setattr__(self, k, validate.integer(k, getattr(self, k), minimum=0, maximum=1 << 16))
        for k in ("qk_norm", "gate", "bias"):
            object.__setattr__(self, k, validate.flag(k, getattr(self, k)))
        object.__setattr__(
            self, "rope_theta", validate.number("rope_theta", self.rope_theta, minimum=1, exclusive_minimum=True)
        )
        object.__setattr__(self, "eps", validate.number("eps", self.eps, minimum=0, exclusive_minimum=True))
        if not isinstance(self.name, str):
            raise ValueError(f"name: must be a string, got {validate.describe(self.name)}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads: must be a multiple of kv_heads ({self.kv_heads}), got {self.q_heads}")
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(f"rotary_dim: must be even and at most head_dim ({self.head_dim}), got {self.rotary_dim}")
        if self.shape == "launch" and (self.qk_norm or self.gate or self.rotary_dim):
            raise ValueError(
                "shape: the 'launch' head has no QK-norm, gate or RoPE (frink-models' launch computes none); "
                f"got qk_norm={self.qk_norm}, gate={self.gate}, rotary_dim={self.rotary_dim}: use shape 'model'"
            )
        if self.fold_block and self.hidden % self.fold_block:
            raise ValueError(f"fold_block: must divide hidden ({self.hidden}), got {self.fold_block}")
        if self.fold_block:
            from workbench.fold.hadamard import factor_block

            factor_block(self.fold_block)  # a block the fold can make, or its own ValueError

    @property
    def q_rows(self) -> int:
        """Rows of the stored q_proj: the query's, and the gate's when it has one."""
        return self.q_heads * self.head_dim * (2 if self.gate else 1)

    @property
    def kv_rows(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def outputs(self) -> tuple[str, ...]:
        """The tensors the head returns, in order."""
        return ("q", "k", "v", "gate") if self.gate else ("q", "k", "v")

    def output_shape(self, name: str) -> tuple[int]:
        return ((self.q_heads if name in ("q", "gate") else self.kv_heads) * self.head_dim,)

    @property
    def label(self) -> str:
        extras = [
            f"rope {self.rotary_dim}/{self.head_dim} theta {self.rope_theta:g}" if self.rotary_dim else "",
            "qk-norm" if self.qk_norm else "",
            "gate" if self.gate else "",
            "bias" if self.bias else "",
            f"fold {self.fold_block}" if self.fold_block else "",
        ]
        dims = f"{self.hidden}/{self.q_heads}/{self.kv_heads}/{self.head_dim}"
        return " ".join([self.name or self.shape, dims, *[e for e in extras if e]])

    @classmethod
    def from_layer(
        cls,
        cfg: object,
        layer: int,
        *,
        hidden: int = 64,
        head_dim: int = 32,
        kv_heads: int = 1,
        fold_block: int = 0,
    ) -> HeadSpec:
        """Attention layer ``layer`` of ``cfg`` (a ``ModelConfig``) as a ``"model"`` head at a
        checkable width (``hidden``, ``head_dim``, ``kv_heads``): its query heads per kv
        head, QK-norm, gate, biases, rotary FRACTION (``rotary_dim / head_dim``) and base,
        and its RMS eps kept. A layer whose RoPE is scaled (llama3, YaRN) is refused: the
        check's RoPE is the plain one."""
        from workbench.models.config import Mixer, ModelConfig

        if not isinstance(cfg, ModelConfig):
            raise ValueError(f"cfg: must be a ModelConfig, got {validate.describe(cfg)}")
        lc = cfg.layer(layer)
        if lc.mixer is not Mixer.ATTENTION:
            raise ValueError(f"layer: {layer} of {cfg.name} is not an attention layer ({lc.mixer.value})")
        if lc.rope_scaling:
            raise ValueError(
                f"layer: {layer} of {cfg.name} scales its RoPE ({lc.rope_scaling}); the check's RoPE is the plain one"
            )
        if lc.qk_norm not in ("none", "head"):
            raise ValueError(
                f"layer: {layer} of {cfg.name} normalises q and k over all heads at once ({lc.qk_norm!r}), "
                "not per head; the check's QK-norm is per head"
            )
        rot = 0 if not lc.rotary_dim else max(2, round(head_dim * lc.rotary_dim / lc.head_dim / 2) * 2)
        return cls(
            "model",
            hidden,
            kv_heads * lc.group_size,
            kv_heads,
            head_dim,
            rotary_dim=rot,
            rope_theta=lc.rope_theta or 10000.0,
            qk_norm=lc.qk_norm == "head",
            gate=lc.attn_output_gate,
            bias=lc.qkv_bias,
            fold_block=fold_block,
            eps=cfg.rms_norm_eps,
            name=f"{cfg.name} layer {lc.index}",
        )


#: The specs a check runs by default, one a shape: frink-models' launch (biases after, a fold
#: of block 16 shared by Q, K and V), and Qwen3.5's head (16 query heads per 4 kv heads:
#: 4 per kv head; gate, QK-norm, a quarter of each head rotated, base 1e7) at a small width.
DEFAULT_HEAD_SPECS: dict[str, HeadSpec] = {
    "launch": HeadSpec("launch", 64, 4, 2, 16, bias=True, fold_block=16, name="launch"),
    "model": HeadSpec(
        "model", 64, 4, 1, 32, rotary_dim=8, rope_theta=1e7, qk_norm=True, gate=True, name="qwen3.5-like"
    ),
}
