"""What an attention layer's head computes past Q, K and V, family by family: Q/K/V biases,
QK-norm, how much of each head RoPE rotates and at what base, and whether RoPE is scaled.

A config says some of it (``attention_bias``, ``rope_theta``, ``partial_rotary_factor``,
``rope_scaling``, Granite-4.0-H's ``position_embedding_type``); the family's code says the rest
(QK-norm is in Qwen3's and Gemma 3's attention, not in their configs), and where a config
leaves a key out the family's transformers config class gives its default.
:data:`HEAD_FAMILIES` holds the code's part, one row a family, each sourced in
``docs/REFERENCE.md`` ("The attention head's fields"); :func:`head_fields` reads the config's
part. Every family here pairs RoPE's dims in halves (``rotate_half``; mlx-lm's
``traditional=False``), so a layer's pairing is not a field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.models.config_reader import ConfigReader


@dataclass(frozen=True)
class HeadFamily:
    """A family's head as its code has it: ``qk_norm`` (``"head"``, ``"all"``, ``"none"``);
    ``bias`` (``"key"``: q/k/v biased as ``attention_bias`` says, ``bias_default`` when absent;
    ``"always"``; ``"never"``); ``rope`` (False: no RoPE at all); ``theta`` (the config class's
    default base); ``partial`` (its default rotary fraction)."""

    qk_norm: str = "none"
    bias: str = "key"
    bias_default: bool = False
    rope: bool = True
    theta: float = 10000.0
    partial: float = 1.0


#: model_type -> its head (docs/REFERENCE.md says where each row is read).
HEAD_FAMILIES: dict[str, HeadFamily] = {
    "llama": HeadFamily(),
    "mistral": HeadFamily(bias="never"),
    "qwen2": HeadFamily(bias="always"),
    "qwen3": HeadFamily(qk_norm="head"),
    "granite": HeadFamily(),
    "gemma2": HeadFamily(),
    "gemma3_text": HeadFamily(qk_norm="head", theta=1_000_000.0),
    "gemma3": HeadFamily(qk_norm="head", theta=1_000_000.0),
    "olmo2": HeadFamily(qk_norm="all"),
    "qwen3_5": HeadFamily(qk_norm="head", partial=0.25),
    "qwen3_5_text": HeadFamily(qk_norm="head", partial=0.25),
    "qwen3_5_moe": HeadFamily(qk_norm="head", partial=0.25),
    "qwen3_next": HeadFamily(qk_norm="head", partial=0.25),
    "prism_hadamard_qwen35": HeadFamily(qk_norm="head", partial=0.25),
    "granitemoehybrid": HeadFamily(),
    "falcon_h1": HeadFamily(theta=1e11),
    "nemotron_h": HeadFamily(rope=False),
    "jamba": HeadFamily(bias="never", rope=False),
    "gpt_oss": HeadFamily(bias_default=True, theta=150000.0),
}


def _rope_key(r: ConfigReader, key: str, typ: type, default: Any) -> Any:
    """``key`` at the config's level, or inside ``rope_parameters`` (transformers 5 moves the
    RoPE keys there), else ``default``."""
    if r.has(key):
        return r.opt(key, typ, default)
    if r.has("rope_parameters"):
        return r.nested("rope_parameters").opt(key, typ, default)
    return default


def head_fields(r: ConfigReader, family: str, head_dim: int, layer: int = 0) -> dict[str, Any]:
    """The head's ``LayerConfig`` fields for attention layer ``layer`` of the config ``r``
    reads (a family of :data:`HEAD_FAMILIES`, its head ``head_dim`` wide)."""
    fam = HEAD_FAMILIES.get(family)
    if fam is None:
        raise ValueError(f"model_type: no head fields known for {family!r}; known: {', '.join(sorted(HEAD_FAMILIES))}")
    bias = {"always": True, "never": False}.get(fam.bias)
    if bias is None:
        bias = r.opt("attention_bias", bool, fam.bias_default)
    rope = fam.rope and r.opt("position_embedding_type", str, "rope") != "nope"
    if not rope:
        return {"qkv_bias": bias, "qk_norm": fam.qk_norm, "rotary_dim": 0, "rope_theta": 0.0, "rope_scaling": ""}
    theta = _rope_key(r, "rope_theta", float, fam.theta)
    scaling = r.opt("rope_scaling", dict, None) or {}
    kind = str(scaling.get("rope_type", scaling.get("type", ""))) if scaling else ""
    kind = "" if kind == "default" else kind
    if family.startswith("gemma3"):
        # Gemma 3: every sliding_window_pattern-th layer is global (rope_theta, scaled);
        # the rest are local, at rope_local_base_freq, never scaled (transformers' Gemma3Attention)
        pattern = r.opt("sliding_window_pattern", int, 6)
        if (layer + 1) % pattern:
            theta, kind = r.opt("rope_local_base_freq", float, 10000.0), ""
    partial = _rope_key(r, "partial_rotary_factor", float, fam.partial)
    if not 0 < partial <= 1:
        raise ValueError(f"partial_rotary_factor: must be in (0, 1] in a {family} config, got {partial}")
    rotary = int(head_dim * partial) // 2 * 2
    return {"qkv_bias": bias, "qk_norm": fam.qk_norm, "rotary_dim": rotary, "rope_theta": theta, "rope_scaling": kind}
