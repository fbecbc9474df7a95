"""Which attention tails may run fused, and every reason the others may not.

frink-models' ``fused_attention_refusals`` is one ``||`` chain that stops at the first
condition that holds; `refusals` asks the same questions in the same order and returns EVERY
one that holds, because a user deciding what to change in a model (or the kernels) needs the
whole list. `eligible` is ``not layer_refusals(...)``, and the tail's launch builder calls that same
`refusals` first, so eligibility and the launch cannot disagree ("One body, two callers").
A layer with no FFN (``ffn_dim == 0``) is refused ``NO_FFN`` only, not also ``NOT_ALL_SWIGLU``
and ``NO_DENSE_FFN``, so one cause is not counted three times; ``NO_DENSE_FFN`` is
``LayerFfnParts::for_layer`` returning ``None`` (routed experts, with or without a shared one).

`head_launch_refusals` is frink-models' ``attn_head_launch``: the Q/K/V launches that can be
encoded at the end of the preceding recurrent run. Its ``q_bias.is_some() && false`` clause is
dead, so a Q bias never refuses (the host applies the biases after the launch); the ``q_bias``
parameter is kept so that a test and notebook 02 can show it.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from workbench import validate
from workbench.models.config import LayerConfig, Mixer, ModelConfig

if TYPE_CHECKING:  # pandas for the tables only: the rules themselves need none of it
    import pandas as pd

__all__ = [
    "Refusal",
    "HeadRefusal",
    "layer_refusals",
    "eligible",
    "tail_verdicts",
    "refusal_table",
    "model_summary",
    "head_launch_refusals",
    "explain",
]


class Refusal(enum.Enum):
    """One condition of frink-models' ``fused_attention_refusals``, in frink-models' order."""

    KERNELS_DISABLED = 1
    NOT_GQA = 2
    NO_FFN = 3
    RESIDUAL_SCALE = 4
    NORMED_RESIDUAL_SCALE = 5
    SKIP_STREAM = 6
    GPT_OSS = 7
    NOT_ALL_SWIGLU = 8
    O_SCALE = 9
    O_BIAS = 10
    ATTN_VALUE_SCALE = 11
    POST_ATTN_NORM = 12
    PARALLEL_SSM = 13
    NO_DENSE_FFN = 14
    FFN_BIAS = 15  # the workbench's addition: frink-models' FFN parts carry no biases

    @property
    def explanation(self) -> str:
        """One line: what the condition is and why the fused launch cannot serve it."""
        return _EXPLANATIONS[self]


_EXPLANATIONS = {
    Refusal.KERNELS_DISABLED: "the dense GPU kernels are switched off, so there is nothing to fuse into",
    Refusal.NOT_GQA: "the layer's mixer is not GQA softmax attention (Gated DeltaNet, Mamba-2, MLP-only block)",
    Refusal.NO_FFN: "the layer has no FFN of its own (ffn_dim 0), so there is no wo + FFN pair to join",
    Refusal.RESIDUAL_SCALE: (
        "the residual branches are scaled (e.g. Granite's residual_multiplier); the kernel adds them unscaled"
    ),
    Refusal.NORMED_RESIDUAL_SCALE: "a normed residual scale is applied between wo and the FFN; the kernel has none",
    Refusal.SKIP_STREAM: "the model carries a skip stream beside the residual; the kernel updates only the residual",
    Refusal.GPT_OSS: "gpt-oss's block (sinks, clamped SwiGLU, biases) is handled by its own host path",
    Refusal.NOT_ALL_SWIGLU: (
        "the FFN activation is not plain SwiGLU silu(gate) * up (GeGLU, squared ReLU, clamped SwiGLU)"
    ),
    Refusal.O_SCALE: "wo's output carries a scale companion the host applies and the launch does not",
    Refusal.O_BIAS: "wo has an output bias the host adds and the launch does not",
    Refusal.ATTN_VALUE_SCALE: "an attention value scale is applied after wo by the host",
    Refusal.POST_ATTN_NORM: "a norm on the attention output before the residual add (Gemma 2/3, OLMo 2)",
    Refusal.PARALLEL_SSM: "a parallel Mamba-2 branch is summed into the projection (Falcon-H1)",
    Refusal.NO_DENSE_FFN: "the FFN is not three dense matrices (routed experts), so it has no dense launch parts",
    Refusal.FFN_BIAS: "the FFN's gate/up/down carry biases (Llama's mlp_bias) that the fused FFN does not add",
}


def _layer_refusals(cfg: ModelConfig, lc: LayerConfig, kernels_enabled: bool) -> list[Refusal]:
    """frink-models' chain, every term evaluated. Pure and cheap: a handful of attribute reads."""
    out: list[Refusal] = []
    if not kernels_enabled:
        out.append(Refusal.KERNELS_DISABLED)
    if lc.mixer is not Mixer.ATTENTION:
        out.append(Refusal.NOT_GQA)
    has_ffn = lc.ffn_dim > 0
    if not has_ffn:
        out.append(Refusal.NO_FFN)
    if cfg.residual_scale is not None:
        out.append(Refusal.RESIDUAL_SCALE)
    if cfg.normed_residual_scale is not None:
        out.append(Refusal.NORMED_RESIDUAL_SCALE)
    if cfg.skip_stream:
        out.append(Refusal.SKIP_STREAM)
    if cfg.gpt_oss:
        out.append(Refusal.GPT_OSS)
    if has_ffn and lc.ffn_act != "swiglu":
        out.append(Refusal.NOT_ALL_SWIGLU)
    if lc.o_scale:
        out.append(Refusal.O_SCALE)
    if lc.o_bias:
        out.append(Refusal.O_BIAS)
    if cfg.attn_value_scale is not None:
        out.append(Refusal.ATTN_VALUE_SCALE)
    if lc.post_attn_norm:
        out.append(Refusal.POST_ATTN_NORM)
    if lc.parallel_ssm:
        out.append(Refusal.PARALLEL_SSM)
    if has_ffn and lc.ffn_kind != "dense":
        out.append(Refusal.NO_DENSE_FFN)
    if has_ffn and lc.ffn_bias:
        out.append(Refusal.FFN_BIAS)
    return out


def layer_refusals(cfg: ModelConfig, layer: int, *, kernels_enabled: bool = True) -> list[Refusal]:
    """EVERY reason layer ``layer``'s tail may not run fused, in frink-models' order; [] = eligible.

    The one body: `eligible` and the tail's launch builder both call this. Raises
    ValueError (naming ``layer`` and the allowed range) for a layer out of range.
    """
    _check_cfg(cfg)
    return _layer_refusals(cfg, cfg.layer(layer), validate.flag("kernels_enabled", kernels_enabled))


def _check_cfg(cfg: object, name: str = "cfg") -> None:
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"{name}: must be a ModelConfig (e.g. load_model('bonsai-27b')), got {validate.describe(cfg)}")


def eligible(cfg: ModelConfig, layer: int, *, kernels_enabled: bool = True) -> bool:
    """Whether layer ``layer``'s tail may run fused: `refusals` returned nothing."""
    return not layer_refusals(cfg, layer, kernels_enabled=kernels_enabled)


def tail_verdicts(cfg: ModelConfig, *, kernels_enabled: bool = True) -> dict[int, list[Refusal]]:
    """``{attention layer: its refusals}`` for every attention layer (the tails there are)."""
    _check_cfg(cfg)
    return {li: layer_refusals(cfg, li, kernels_enabled=kernels_enabled) for li in cfg.attention_layers()}


def refusal_table(cfg: ModelConfig, *, kernels_enabled: bool = True) -> pd.DataFrame:
    """One row per layer: ``layer``, ``mixer`` (its value, e.g. "attention"), ``eligible``,
    ``reasons`` (the names, comma-separated; "" when eligible)."""
    import pandas as pd

    _check_cfg(cfg)
    rows = []
    for lc in cfg.layers:
        found = layer_refusals(cfg, lc.index, kernels_enabled=kernels_enabled)
        rows.append(
            {
                "layer": lc.index,
                "mixer": lc.mixer.value,
                "eligible": not found,
                "reasons": ", ".join(r.name for r in found),
            }
        )
    return pd.DataFrame(rows, columns=["layer", "mixer", "eligible", "reasons"])


def reason_counts(cfg: ModelConfig, *, kernels_enabled: bool = True) -> Counter[Refusal]:
    """How many of ``cfg``'s attention tails each reason refuses (a tail refused for two
    reasons counts under both); recurrent layers have no tail and are not counted."""
    return Counter(r for found in tail_verdicts(cfg, kernels_enabled=kernels_enabled).values() for r in found)


def format_reason_counts(counts: Counter[Refusal]) -> str:
    """``"NO_DENSE_FFN x12, ..."`` in the order :class:`Refusal` lists the reasons; "" for none."""
    if not isinstance(counts, Counter):
        raise ValueError(f"counts: must be a Counter of Refusal (from reason_counts), got {validate.describe(counts)}")
    return ", ".join(f"{r.name} x{counts[r]}" for r in Refusal if counts[r])


def model_summary(cfgs: Iterable[ModelConfig], *, kernels_enabled: bool = True) -> pd.DataFrame:
    """One row per model: what the fusion does for it.

    Columns: ``model``, ``layers``, ``attention_layers``, ``eligible_tails``,
    ``waits_saved`` (one wait per token for each eligible tail: the fusion joins that
    layer's wo and FFN submissions), and ``reasons``: over the attention layers only
    (a recurrent layer has no tail to refuse), each reason with how many tails it
    refuses, e.g. ``"NO_DENSE_FFN x12"``; "" when every tail is eligible.
    """
    import pandas as pd

    cfgs = validate.sequence("cfgs", cfgs, what="ModelConfigs", non_empty=False)
    for i, cfg in enumerate(cfgs):
        _check_cfg(cfg, f"cfgs[{i}]")
    rows = []
    for cfg in cfgs:
        verdicts = tail_verdicts(cfg, kernels_enabled=kernels_enabled)
        n_ok = sum(1 for found in verdicts.values() if not found)
        rows.append(
            {
                "model": cfg.name,
                "layers": cfg.num_layers,
                "attention_layers": len(verdicts),
                "eligible_tails": n_ok,
                "waits_saved": n_ok,
                "reasons": format_reason_counts(reason_counts(cfg, kernels_enabled=kernels_enabled)),
            }
        )
    return pd.DataFrame(
        rows, columns=["model", "layers", "attention_layers", "eligible_tails", "waits_saved", "reasons"]
    )


# -- the head launch ---------------------------------------------------------------------


class HeadRefusal(enum.Enum):
    """One condition of frink-models' ``attn_head_launch``, in its order."""

    NOT_GQA = 1
    PRE_NORM_NOT_RMS = 2
    Q_NO_KERNEL = 3
    K_NO_KERNEL = 4
    V_NO_KERNEL = 5
    FOLDS_DIFFER = 6
    FOLD_DOES_NOT_FIT = 7

    @property
    def explanation(self) -> str:
        return _HEAD_EXPLANATIONS[self]


_HEAD_EXPLANATIONS = {
    HeadRefusal.NOT_GQA: "the layer's mixer is not GQA attention",
    HeadRefusal.PRE_NORM_NOT_RMS: "the norm before Q/K/V is not a plain weighted RMSNorm (OLMo 2 has none there)",
    HeadRefusal.Q_NO_KERNEL: "q_proj's format has no matvec kernel",
    HeadRefusal.K_NO_KERNEL: "k_proj's format has no matvec kernel",
    HeadRefusal.V_NO_KERNEL: "v_proj's format has no matvec kernel",
    HeadRefusal.FOLDS_DIFFER: "Q, K and V are not folded with one and the same rotation (or all unfolded)",
    HeadRefusal.FOLD_DOES_NOT_FIT: "the shared fold cannot rotate a vector of the hidden width",
}


def _same(a: object | None, b: object | None) -> bool:
    # frink-models' Arc::ptr_eq (Rust's pointer identity): the same fold OBJECT, since the kernel applies one
    # rotation to the common input. Two equal-valued folds are still two objects.
    return (a is None and b is None) or (a is not None and a is b)


def head_launch_refusals(
    cfg: ModelConfig,
    layer: int,
    *,
    q_fold: object | None = None,
    k_fold: object | None = None,
    v_fold: object | None = None,
    q_kernel: bool = True,
    k_kernel: bool = True,
    v_kernel: bool = True,
    q_bias: bool = False,
) -> list[HeadRefusal]:
    """EVERY reason the Q/K/V head launch of layer ``layer`` is refused; [] = it launches.

    ``*_fold`` are the projections' folds (`workbench.fold.rotation.HadamardFold`, as
    ``WeightMatrix.launch_parts()`` returns them; None = unfolded). ``*_kernel`` say
    whether each projection's format has a matvec kernel. ``q_bias``: whether q_proj
    has a bias; frink-models' clause ``q_bias.is_some() && false`` is always false, so
    it is accepted and never refuses (kept to show exactly that).
    """
    _check_cfg(cfg)
    lc = cfg.layer(layer)
    for name, v in (("q_kernel", q_kernel), ("k_kernel", k_kernel), ("v_kernel", v_kernel), ("q_bias", q_bias)):
        validate.flag(name, v)
    out: list[HeadRefusal] = []
    # frink-models: `!matches!(.., Gqa) || layer.attn.q_bias.is_some() && false`.
    # `&&` binds tighter than `||`, and `x && false` is false for every x.
    if lc.mixer is not Mixer.ATTENTION or (bool(q_bias) and False):
        out.append(HeadRefusal.NOT_GQA)
    if lc.pre_norm != "rms":
        out.append(HeadRefusal.PRE_NORM_NOT_RMS)
    if not q_kernel:
        out.append(HeadRefusal.Q_NO_KERNEL)
    if not k_kernel:
        out.append(HeadRefusal.K_NO_KERNEL)
    if not v_kernel:
        out.append(HeadRefusal.V_NO_KERNEL)
    if not (_same(q_fold, k_fold) and _same(q_fold, v_fold)):
        out.append(HeadRefusal.FOLDS_DIFFER)
    if q_fold is not None and not _fold_fits(q_fold, cfg.hidden_size):
        out.append(HeadRefusal.FOLD_DOES_NOT_FIT)
    return out


def _fold_fits(fold: object, width: int) -> bool:
    """frink-models' ``f.metal_plan(hidden)?``: whether the fold can rotate ``width``."""
    check = getattr(fold, "check_width", None)
    if check is None:
        raise ValueError(f"q_fold: must be a HadamardFold (with check_width), got {type(fold).__name__}")
    try:
        check(width)
    except ValueError:
        return False
    return True


def explain(reasons: Sequence[Refusal | HeadRefusal]) -> str:
    """The reasons, one per line, each with its explanation (for printing)."""
    reasons = validate.sequence("reasons", reasons, what="Refusal or HeadRefusal values", non_empty=False)
    for i, r in enumerate(reasons):
        if not isinstance(r, (Refusal, HeadRefusal)):
            raise ValueError(f"reasons[{i}]: must be a Refusal or HeadRefusal, got {validate.describe(r)}")
    return "\n".join(f"{r.name}: {r.explanation}" for r in reasons)
