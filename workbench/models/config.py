"""Per-layer model configuration: what the refusal rules ask about one layer, for every layer.

frink-models (``fused_attention_refusals``) asks, for one layer, about the attention shape,
the FFN (size, kind, activation) and a handful of model-level and layer-level extras.
`ModelConfig` holds exactly those answers for every layer; ``workbench.models.families``
reads them from a Hugging Face ``config.json`` (``from_hf_config``), and
``workbench.models.loader`` loads the configs shipped in ``data/models`` by name.

Layer indices are 0-based throughout.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from workbench import files, validate

__all__ = [
    "Mixer",
    "LayerConfig",
    "ModelConfig",
    "MODELS_DIR",
    "BONSAI_SHAPE",
    "replace_layer",
]

# data/models beside the package (the checkout is installed editable; see pyproject).
MODELS_DIR = files.DATA_DIR / "models"

FFN_KINDS = ("dense", "experts", "none")

#: The most layers a config may declare. The deepest model studied here has 64; a
#: thousand-layer transformer has not been built, so 10,000 is generous, and it keeps a
#: typo such as ``num_hidden_layers: 10**9`` from building a billion layer configs
#: (minutes and gigabytes) before anything could say so.
MAX_LAYERS = 10_000

#: The attention tail of Bonsai-27B, the hybrid these studies scale to: (hidden, branch =
#: 24 q heads x 256, ffn). Bonsai-27B (PrismML) is a 64-layer Gated-DeltaNet hybrid with
#: Qwen3.6-27B's geometry and 16 attention layers; ``loader.load_model("bonsai-27b")`` has its
#: config, and a test holds this shape equal to it.
BONSAI_SHAPE: tuple[int, int, int] = (5120, 6144, 17408)


class Mixer(enum.Enum):
    """What mixes tokens in a layer."""

    ATTENTION = "attention"  # softmax GQA attention (multi-head = group size 1)
    LINEAR_ATTENTION = "linear_attention"  # Gated DeltaNet (Qwen3.5/3.6/Next)
    MAMBA2 = "mamba2"  # Mamba / Mamba-2 SSM mixer (Granite-4.0-H, Nemotron-H, Jamba)
    MLP_ONLY = "mlp_only"  # a block with an FFN and no mixer (Nemotron-H '-' and 'E')
    OTHER = "other"  # anything else; refused as not GQA


@dataclass(frozen=True)
class LayerConfig:
    """Everything the refusal rules ask about one layer.

    ``ffn_dim`` is 0 where the layer has no FFN of its own (then ``ffn_kind`` is
    ``"none"``). For a layer with routed experts, ``ffn_dim`` is one expert's width.
    Head counts and ``head_dim`` are 0 for a layer whose mixer is not attention.
    """

    index: int
    mixer: Mixer
    num_q_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    ffn_dim: int = 0
    ffn_kind: str = "none"
    ffn_act: str = "none"
    # Extras the host tail applies after wo, which the fused launch does not:
    o_scale: bool = False  # a scale companion on wo's output
    o_bias: bool = False  # a bias on wo's output
    ffn_bias: bool = False  # biases on the FFN's gate/up/down (Llama's mlp_bias)
    post_attn_norm: bool = False  # a norm on the attention output (Gemma 2/3, OLMo 2)
    parallel_ssm: bool = False  # a Mamba-2 branch summed into the projection (Falcon-H1)
    attn_output_gate: bool = False  # gate before wo (Qwen3.5/Next): recorded, not refused
    # What the head launch asks about: the norm before Q/K/V.
    pre_norm: str = "rms"  # "rms" (a plain weighted RMSNorm, (1 + w) included) | "none"
    num_experts: int = 0  # routed experts in this layer's FFN (0 = none)
    # What the attention head computes past Q/K/V (workbench.check.head_spec; docs/REFERENCE.md
    # sources each family's values): the config says some, the family's code the rest.
    qkv_bias: bool = False  # biases on q/k/v_proj (gpt-oss's attention_bias)
    qk_norm: str = "none"  # "head": q and k RMS-normed per head (Qwen3, Qwen3.5/Next, Gemma 3); "all": over
    # the whole projection (OLMo 2); "none"
    rotary_dim: int = 0  # dims of each head RoPE rotates, halves paired (0: no RoPE, e.g. Jamba, Nemotron-H)
    rope_theta: float = 0.0  # RoPE's base (0 where there is no RoPE)
    rope_scaling: str = ""  # the RoPE scaling's type ("llama3", "yarn"); "" = plain RoPE

    def __post_init__(self) -> None:
        for name in ("index", "num_q_heads", "num_kv_heads", "head_dim", "ffn_dim", "num_experts"):
            object.__setattr__(self, name, validate.integer(name, getattr(self, name), minimum=0))
        for name in ("o_scale", "o_bias", "post_attn_norm", "parallel_ssm", "attn_output_gate", "qkv_bias"):
            object.__setattr__(self, name, validate.flag(name, getattr(self, name)))
        if not isinstance(self.mixer, Mixer):
            raise ValueError(f"mixer: must be a Mixer, got {self.mixer!r}")
        validate.one_of("ffn_kind", self.ffn_kind, FFN_KINDS)
        if not isinstance(self.ffn_act, str):
            raise ValueError(f"ffn_act: must be an activation's name (a string), got {validate.describe(self.ffn_act)}")
        if self.ffn_dim < 0 or (self.ffn_dim == 0) != (self.ffn_kind == "none"):
            raise ValueError(
                f"ffn_dim/ffn_kind: ffn_dim 0 exactly when ffn_kind is 'none'; got "
                f"ffn_dim={self.ffn_dim}, ffn_kind={self.ffn_kind!r} (layer {self.index})"
            )
        if self.mixer is Mixer.ATTENTION and (self.num_q_heads <= 0 or self.num_kv_heads <= 0 or self.head_dim <= 0):
            raise ValueError(
                f"num_q_heads/num_kv_heads/head_dim: must be positive for an attention layer, "
                f"got {self.num_q_heads}/{self.num_kv_heads}/{self.head_dim} (layer {self.index})"
            )
        if self.mixer is Mixer.ATTENTION and self.num_q_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_q_heads: must be a multiple of num_kv_heads ({self.num_kv_heads}) for GQA, "
                f"got {self.num_q_heads} (layer {self.index})"
            )
        validate.one_of("pre_norm", self.pre_norm, ("rms", "none"))
        validate.one_of("qk_norm", self.qk_norm, ("none", "head", "all"))
        object.__setattr__(self, "rotary_dim", validate.integer("rotary_dim", self.rotary_dim, minimum=0))
        if self.rotary_dim % 2 or (self.head_dim and self.rotary_dim > self.head_dim):
            raise ValueError(
                f"rotary_dim: must be even and at most head_dim ({self.head_dim}), got {self.rotary_dim} "
                f"(layer {self.index})"
            )
        object.__setattr__(self, "rope_theta", validate.number("rope_theta", self.rope_theta, minimum=0))
        if not isinstance(self.rope_scaling, str):
            raise ValueError(f"rope_scaling: must be a string, got {validate.describe(self.rope_scaling)}")

    @property
    def group_size(self) -> int:
        """Query heads per kv head (1 for multi-head attention); 0 off attention."""
        return self.num_q_heads // self.num_kv_heads if self.num_kv_heads else 0


@dataclass(frozen=True)
class ModelConfig:
    """A model as the refusal rules see it: model-level extras plus one `LayerConfig` a layer."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    rms_norm_eps: float
    layers: tuple[LayerConfig, ...]
    residual_scale: float | None = None  # e.g. Granite's residual_multiplier
    normed_residual_scale: float | None = None
    skip_stream: bool = False
    gpt_oss: bool = False
    attn_value_scale: float | None = None
    source: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("name", "model_type", "source"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name}: must be a string, got {validate.describe(getattr(self, name))}")
        for name in ("skip_stream", "gpt_oss"):
            object.__setattr__(self, name, validate.flag(name, getattr(self, name)))
        object.__setattr__(self, "hidden_size", validate.integer("hidden_size", self.hidden_size, minimum=1))
        object.__setattr__(
            self, "num_layers", validate.integer("num_layers", self.num_layers, minimum=1, maximum=MAX_LAYERS)
        )
        object.__setattr__(
            self, "rms_norm_eps", validate.number("rms_norm_eps", self.rms_norm_eps, minimum=0, exclusive_minimum=True)
        )
        for name in ("residual_scale", "normed_residual_scale", "attn_value_scale"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, validate.number(name, getattr(self, name)))
        if not isinstance(self.layers, (tuple, list)) or not all(isinstance(lc, LayerConfig) for lc in self.layers):
            raise ValueError(f"layers: must be a tuple of LayerConfig, got {validate.describe(self.layers)}")
        object.__setattr__(self, "layers", tuple(self.layers))
        # A frozen config must not change under a cache: the raw dict is kept read-only.
        if not isinstance(self.raw, Mapping):
            raise ValueError(f"raw: must be a mapping (the config.json read), got {validate.describe(self.raw)}")
        object.__setattr__(self, "raw", MappingProxyType(dict(self.raw)))
        if len(self.layers) != self.num_layers:
            raise ValueError(f"layers: need num_layers={self.num_layers} LayerConfigs, got {len(self.layers)}")
        for i, lc in enumerate(self.layers):
            if lc.index != i:
                raise ValueError(f"layers: entry {i} has index {lc.index}; indices must run 0..n-1")

    # -- queries -----------------------------------------------------------------------
    def layer(self, index: int) -> LayerConfig:
        """Layer ``index``'s config; ValueError naming ``layer`` and the allowed range."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise ValueError(f"layer: must be an int in 0..{self.num_layers - 1}, got {index!r}")
        index = int(index)
        if not 0 <= index < self.num_layers:
            raise ValueError(f"layer: {index} is out of range for {self.name} (allowed 0..{self.num_layers - 1})")
        return self.layers[index]

    def attention_layers(self) -> list[int]:
        """Indices of the layers whose mixer is attention (the tails there are to fuse)."""
        return [lc.index for lc in self.layers if lc.mixer is Mixer.ATTENTION]

    # -- constructors ------------------------------------------------------------------
    @classmethod
    def synthetic(
        cls,
        hidden: int,
        *,
        ffn_dim: int,
        num_q_heads: int = 1,
        num_kv_heads: int = 1,
        head_dim: int | None = None,
        rms_norm_eps: float = 1e-6,
        name: str = "synthetic",
    ) -> ModelConfig:
        """One plain GQA layer with a dense SwiGLU FFN: nothing refuses it.

        For tail weights that do not come from a real model (frink-models' test case is
        hidden 64, branch 96 = q heads x head_dim, FFN 80). ``head_dim`` defaults to
        ``hidden // num_q_heads``.
        """
        hidden = validate.integer("hidden", hidden, minimum=1)
        ffn_dim = validate.integer("ffn_dim", ffn_dim, minimum=1)
        num_q_heads = validate.integer("num_q_heads", num_q_heads, minimum=1)
        num_kv_heads = validate.integer("num_kv_heads", num_kv_heads, minimum=1)
        if head_dim is not None:
            head_dim = validate.integer("head_dim", head_dim, minimum=1)
        rms_norm_eps = validate.number("rms_norm_eps", rms_norm_eps, minimum=0, exclusive_minimum=True)
        if not isinstance(name, str):
            raise ValueError(f"name: must be a string, got {validate.describe(name)}")
        if head_dim is None:
            if hidden % num_q_heads:
                raise ValueError(
                    f"head_dim: give it explicitly; hidden {hidden} is not a multiple of num_q_heads {num_q_heads}"
                )
            head_dim = hidden // num_q_heads
        if ffn_dim <= 0:
            raise ValueError(f"ffn_dim: must be positive for a plain tail, got {ffn_dim}")
        layer = LayerConfig(
            index=0,
            mixer=Mixer.ATTENTION,
            num_q_heads=num_q_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            ffn_dim=ffn_dim,
            ffn_kind="dense",
            ffn_act="swiglu",
        )
        return cls(
            name=name,
            model_type="synthetic",
            hidden_size=hidden,
            num_layers=1,
            rms_norm_eps=rms_norm_eps,
            layers=(layer,),
            source="synthetic: one plain GQA layer, dense SwiGLU FFN",
        )

    plain_layer = synthetic  # the same constructor, by what it makes: one plain layer


def replace_layer(cfg: ModelConfig, layer: int, **changes: Any) -> ModelConfig:
    """A copy of ``cfg`` with layer ``layer``'s fields changed (for what-if questions and tests)."""
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"cfg: must be a ModelConfig, got {validate.describe(cfg)}")
    fields = {f.name for f in dataclasses.fields(LayerConfig)} - {"index"}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise ValueError(f"changes: {', '.join(unknown)} not a LayerConfig field; allowed: {', '.join(sorted(fields))}")
    layer = int(cfg.layer(layer).index)
    lc = dataclasses.replace(cfg.layer(layer), **changes)
    layers = cfg.layers[:layer] + (lc,) + cfg.layers[layer + 1 :]
    return dataclasses.replace(cfg, layers=layers)
