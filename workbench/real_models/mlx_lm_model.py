"""The reference forward pass: mlx-lm's own model carrying a checkpoint's weights.

The workbench writes no attention of its own for a real model: :func:`reference_model`
builds mlx-lm's model class for the checkpoint's family (``mlx_lm.models.<model_type>``)
and loads the checkpoint's tensors into it, quantized ones as mlx-lm's own
``QuantizedLinear`` / ``QuantizedEmbedding`` with the SAME packed words, their scales and
biases widened to float32 (exact: the map ``scale * q + bias`` is unchanged, and the
activations then stay float32 end to end, as the fused tail's are).
"""

from __future__ import annotations

import importlib
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from workbench.real_models.loaded_checkpoint import Checkpoint
from workbench.real_models.tensor import Tensor
from workbench.real_models.transformers_advice import without_transformers_advice
from workbench.validate import describe

__all__ = ["reference_model"]


def _dense_for_model(t: Tensor) -> mx.array:
    return t.weight.astype(mx.float32)


def reference_model(ckpt: Checkpoint) -> nn.Module:
    """mlx-lm's model for ``ckpt``'s family with ``ckpt``'s tensors loaded (strictly: every
    parameter the model has must be in the checkpoint, and nothing may be left over).

    Quantized tensors keep their packed words; scales and biases become float32, dense
    weights float32. A zero-centred checkpoint's norms get their 1 added, as mlx-lm's
    converter does.
    """
    if not isinstance(ckpt, Checkpoint):
        raise ValueError(f"ckpt: must be a Checkpoint (load_checkpoint(...)), got {describe(ckpt)}")
    model_type = ckpt.config.raw.get("model_type")
    try:
        with without_transformers_advice():
            module = importlib.import_module(f"mlx_lm.models.{model_type}")
    except ImportError:
        raise ValueError(f"ckpt: mlx-lm has no model class for model_type {model_type!r}") from None
    raw = {k: v for k, v in ckpt.config.raw.items() if not k.startswith("_")}
    model = module.Model(module.ModelArgs.from_dict(raw))
    specs = {name: t.spec for name, t in ckpt.tensors.items() if t.quantized}

    def predicate(path: str, m: nn.Module) -> Any:
        spec = specs.get(path)
        if spec is None:
            return False
        return {"group_size": spec.group_size, "bits": spec.bits, "mode": spec.mode}

    nn.quantize(model, class_predicate=predicate)
    weights: list[tuple[str, mx.array]] = []
    for name, t in ckpt.tensors.items():
        if name.endswith(".bias"):
            weights.append((name, _dense_for_model(t)))
            continue
        if t.quantized:
            assert t.scales is not None
            weights.append((f"{name}.weight", t.weight))
            weights.append((f"{name}.scales", t.scales.astype(mx.float32)))
            if t.biases is not None:
                weights.append((f"{name}.biases", t.biases.astype(mx.float32)))
            continue
        w = _dense_for_model(t)
        if ckpt.norm_convention == "zero_centred" and w.ndim == 1 and "norm" in name:
            w = w + 1.0
        weights.append((f"{name}.weight", w))
    model.load_weights(weights, strict=True)
    mx.eval(model.parameters())
    model.eval()
    return model
