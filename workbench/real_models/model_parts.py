"""The parts of an mlx-lm model the workbench reaches into, found one way for every module here.

mlx-lm's model classes keep their decoder blocks in a ``.layers`` list on an inner module
(``model.model``) whose own call runs embedding, blocks and final norm; the head is
``lm_head`` or the tied embedding. Capturing, swapping the fused tail in and decoding all
replace entries of that list for a while and put them back, so they find it here, and a
block's stand-in (:class:`BlockStandIn`) forwards what the model's loop reads off a block.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from workbench.validate import describe

__all__ = ["BlockStandIn", "decoder_layers", "head", "layer_owner", "vocab_size"]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ValueError(f"model: must be an mlx-lm model (with .layers), got {describe(model)}")
    return layers


def layer_owner(model: nn.Module) -> nn.Module:
    """The module whose ``.layers`` list the model's loop walks (``model.model`` in mlx-lm)."""
    inner = getattr(model, "model", model)
    held, walked = list(getattr(inner, "layers", None) or ()), list(decoder_layers(model))
    if len(held) != len(walked) or any(a is not b for a, b in zip(held, walked)):
        raise ValueError(f"model: cannot find the module holding its layers in {describe(model)}")
    return inner


class BlockStandIn(nn.Module):
    """A stand-in for one decoder block in the model's own loop; attributes the loop reads
    (``use_sliding``, ``is_linear``, ...) are the block's."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "block" or "block" not in self:  # not set yet: nothing to forward to
                raise
            return getattr(self["block"], name)


def head(model: nn.Module, hidden: mx.array) -> mx.array:
    """The model's output head on final hidden states (``lm_head``, or the tied embedding)."""
    if getattr(model, "lm_head", None) is not None:
        return model.lm_head(hidden)
    inner = getattr(model, "language_model", model)
    if getattr(inner, "lm_head", None) is not None:
        return inner.lm_head(hidden)
    return layer_owner(model).embed_tokens.as_linear(hidden)


def vocab_size(model: nn.Module) -> int:
    """How many token ids ``model``'s embedding has rows for (dense or quantized)."""
    emb = layer_owner(model).embed_tokens
    n = getattr(emb, "num_embeddings", None)
    return int(n) if n is not None else int(emb.weight.shape[0])
