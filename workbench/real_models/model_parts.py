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

__all__ = ["MLX_LM_MODEL", "BlockStandIn", "decoder_layers", "head", "layer_owner", "vocab_size"]


#: What every refusal here says a model must be.
MLX_LM_MODEL = "an mlx-lm model (an mlx.nn.Module with a .layers list of decoder blocks, as mlx_lm.load(...)[0])"


def decoder_layers(model: nn.Module, name: str = "model") -> list[nn.Module]:
    """``model``'s decoder blocks, or a ValueError naming ``name`` for what is not an mlx-lm model.

    Checked here, before any layer is touched, so that an object that merely has ``.layers``
    (and ``.args``) is refused by name rather than by an AttributeError or TypeError from
    deep inside a swap, a capture or a checkpoint reader."""
    layers = getattr(model, "layers", None) if isinstance(model, nn.Module) else None
    if not isinstance(layers, (list, tuple)) or not all(isinstance(b, nn.Module) for b in layers):
        raise ValueError(f"{name}: must be {MLX_LM_MODEL}, got {describe(model)}")
    return layers


def layer_owner(model: nn.Module) -> nn.Module:
    """The module whose ``.layers`` list the model's loop walks (``model.model`` in mlx-lm)."""
    walked = list(decoder_layers(model))
    inner = getattr(model, "model", model)
    held = getattr(inner, "layers", None)
    held = list(held) if isinstance(held, (list, tuple)) else []
    if len(held) != len(walked) or any(a is not b for a, b in zip(held, walked)):
        raise ValueError(f"model: cannot find the module holding its layers in {describe(model)}")
    if not callable(getattr(inner, "embed_tokens", None)):
        raise ValueError(f"model: must be {MLX_LM_MODEL} whose layers' module has embed_tokens, got {describe(model)}")
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
