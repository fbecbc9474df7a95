"""What each layer of an mlx-lm model sees: its input, ``o_proj``'s input and its output.

:func:`capture_layers` runs the model's own forward pass once with every block and every
``self_attn.o_proj`` wrapped by a recorder (:func:`tapped`), so the layer's input (the
residual), the branch a tail takes and the layer's output are the model's own arrays at
every position; everything is put back afterwards, also on an error. Decoding captures the
prompt's pass through the same taps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from workbench.real_models.model_parts import BlockStandIn, layer_owner, vocab_size
from workbench.validate import token_ids

__all__ = ["LayerCapture", "capture_layers", "tapped"]


class _Tap(nn.Module):
    """Stands in for ``o_proj``: records its input, then applies it."""

    def __init__(self, inner: nn.Module, record: list):
        super().__init__()
        self.inner = inner
        self._record = record

    def __call__(self, x: mx.array) -> mx.array:
        self._record.append(x)
        return self.inner(x)


class _BlockTap(BlockStandIn):
    """Records a block's input and output as the model's loop calls it."""

    def __init__(self, block: nn.Module, record: list):
        super().__init__(block)
        self._io = record

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        out = self.block(x, *args, **kwargs)
        self._io.append((x, out))
        return out


@dataclass(frozen=True)
class LayerCapture:
    """One layer on one prompt: ``residual`` (its input), ``branch`` (o_proj's input; ``None``
    for a layer without softmax attention) and ``output``, each float32 numpy ``[positions, width]``."""

    layer: int
    residual: np.ndarray
    branch: np.ndarray | None
    output: np.ndarray


@contextlib.contextmanager
def tapped(model: nn.Module) -> Iterator[Callable[[], list[LayerCapture]]]:
    """Within the block, every block of ``model`` records its input and output and every
    ``self_attn.o_proj`` its input (the branch) as the model's own loop calls them; yields
    a function that reads the FIRST call's records back as :class:`LayerCapture` (float32
    numpy, the batch's first row). Everything is put back on exit, also on an error."""
    owner = layer_owner(model)
    original = list(owner.layers)
    ios: list[list] = [[] for _ in original]
    branches: list[list] = [[] for _ in original]
    attns = [getattr(blk, "self_attn", None) for blk in original]

    def np32(a: mx.array) -> np.ndarray:
        return np.asarray(a[0].astype(mx.float32))

    def collect() -> list[LayerCapture]:
        return [
            LayerCapture(i, np32(io[0][0]), np32(br[0]) if br else None, np32(io[0][1]))
            for i, (io, br) in enumerate(zip(ios, branches))
        ]

    try:
        for attn, rec in zip(attns, branches):
            if attn is not None:
                attn.o_proj = _Tap(attn.o_proj, rec)
        owner.layers = [_BlockTap(blk, rec) for blk, rec in zip(original, ios)]
        yield collect
    finally:
        owner.layers = original
        for attn in attns:
            if attn is not None and isinstance(attn.o_proj, _Tap):
                attn.o_proj = attn.o_proj.inner


def capture_layers(model: nn.Module, tokens: Sequence[int]) -> list[LayerCapture]:
    """Run ``model`` over ``tokens`` once (no cache, the model's own forward pass) and
    capture every layer's ``(residual, branch, output)`` at every position.

    Each block is wrapped (its input and output recorded as the model's loop calls it)
    and each ``self_attn.o_proj`` too (its input is the branch); everything is put back
    afterwards, also on an error. Inside :func:`fused_tails` the branch is the fused
    block's (``o_proj`` is the identity there, the tail takes its input).
    """
    ids = mx.array(token_ids("tokens", tokens, vocab_size(model)))[None]
    with tapped(model) as collect:
        mx.eval(layer_owner(model)(ids))  # the decoder stack only: the head's logits are not needed here
        return collect()
