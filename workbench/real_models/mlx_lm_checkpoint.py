"""An mlx-lm model object (``mlx_lm.load(...)[0]``, or one built from its classes) read into a
:class:`Checkpoint`: its modules' own arrays, nothing copied or re-rounded.

mlx-lm holds norm weights as it multiplies them (it added any 1 when it converted a
zero-centred checkpoint), so such a checkpoint is always ``"plain"``.
"""

from __future__ import annotations

from typing import Any

from workbench.fold.weights import check_quant_spec
from workbench.models.families import from_hf_config
from workbench.real_models.loaded_checkpoint import Checkpoint, check_tensors_match_config
from workbench.real_models.model_parts import decoder_layers
from workbench.real_models.tensor import Tensor
from workbench.validate import describe

__all__ = ["read_mlx_lm_model"]


def _module_tensor(module: Any) -> dict[str, Tensor]:
    """An mlx-lm ``Linear`` / ``QuantizedLinear`` / ``RMSNorm`` as tensors (its bias apart)."""
    out: dict[str, Tensor] = {}
    params = dict(module.items()) if hasattr(module, "items") else {}
    if "scales" in params:
        spec = check_quant_spec(getattr(module, "mode", "affine"), module.bits, module.group_size)
        out[""] = Tensor(params["weight"], params["scales"], params.get("biases"), spec)
    elif "weight" in params:
        out[""] = Tensor(params["weight"])
    if "bias" in params:
        out[".bias"] = Tensor(params["bias"])
    return out


#: mlx-lm model classes whose FFN is SwiGLU by construction (``swiglu(gate, up)`` in their MLP).
_MLX_LM_SWIGLU = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_next", "qwen3_5", "qwen3_5_text"})


def read_mlx_lm_model(model: Any) -> Checkpoint:
    """``model`` (``load_checkpoint``'s ``source``) read as a :class:`Checkpoint`; ValueError naming
    ``source`` for an object that has ``.layers`` and ``.args`` but is not an mlx-lm model."""
    decoder_layers(model, "source")
    args = model.args
    if hasattr(args, "to_dict"):
        raw = args.to_dict()
    else:
        try:
            raw = vars(args)
        except TypeError:  # no __dict__: not mlx-lm's ModelArgs (a dataclass)
            raw = None
    if not isinstance(raw, dict):
        raise ValueError(
            f"source: an mlx-lm model's .args must be its ModelArgs (a dataclass of the config), got {describe(args)}"
        )
    raw = dict(raw)
    raw.setdefault("model_type", getattr(model, "model_type", None))
    if raw["model_type"] in _MLX_LM_SWIGLU:
        # mlx-lm's classes for these families compute silu(gate) * up whatever the
        # config says, and their args keep no hidden_act: the class is the answer.
        target = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
        target.setdefault("hidden_act", "silu")
    config = from_hf_config(raw, name=f"mlx-lm {raw['model_type']}")
    tensors: dict[str, Tensor] = {}
    for i, block in enumerate(model.layers):
        p = f"model.layers.{i}"
        attn = getattr(block, "self_attn", None)
        mods = {
            "post_attention_layernorm": getattr(block, "post_attention_layernorm", None),
            "input_layernorm": getattr(block, "input_layernorm", None),
        }
        if attn is not None:
            mods["self_attn.o_proj"] = attn.o_proj
        mlp = getattr(block, "mlp", None)
        for m in ("gate_proj", "up_proj", "down_proj"):
            if mlp is not None and hasattr(mlp, m):
                mods[f"mlp.{m}"] = getattr(mlp, m)
        for name, mod in mods.items():
            if mod is None:
                continue
            for suffix, t in _module_tensor(mod).items():
                tensors[f"{p}.{name}{suffix}"] = t
    check_tensors_match_config(config, tensors)
    # mlx-lm models hold norm weights as they multiply (it added any 1 at conversion).
    return Checkpoint(config, tensors, "plain", f"mlx-lm model ({type(model).__module__})")
