"""An attention layer's three input projections as one matrix product: ``q | k | v = W x``.

In a decoder's attention layer, the query, key and value projections read the same normed
vector. mlx-lm runs them as three products (three ops in the step's graph, three kernels
on a GPU); stacked into one matrix they are one product and one split. Each output row is
the same dot product over the same stored weights, so the map is the same (the tests
compare the bits). frink-models' head launch does the same on the device
(``kernels/head_qkv.body``: one stack of NQ + NK + NV rows).

Why it matters here: in a small model's decode on a GPU a step's time is the host's work
for each op and kernel (SmolLM2-135M on the H200: ``bench.real_model`` counts ops and
kernels a step), so two ops and two kernels fewer a layer is time off every token.
:class:`StackedQKV` is the stacked product of one attention module, :class:`StackedAttention`
the stand-in module that runs it, :func:`swapped_attention` the swap into a model's layers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from workbench.fold.weights import quantized_matmul
from workbench.validate import describe

__all__ = ["StackedQKV", "StackedAttention", "stackable", "swapped_attention"]


def _llama_attention() -> type | None:
    try:
        from mlx_lm.models import llama
    except ImportError:
        return None
    return llama.Attention


def stackable(attn: Any) -> bool:
    """Whether ``attn`` is an attention module whose projections :class:`StackedQKV` stacks:
    exactly mlx-lm's Llama ``Attention``, its q, k and v projections all ``nn.QuantizedLinear``
    of one quantization (mode, bits, group size) or all ``nn.Linear`` of one dtype, none with
    a bias.

    Only mlx-lm's Llama attention (``mlx_lm.models.llama.Attention``: SmolLM2, Llama, and every
    model mlx-lm builds from it) is taken: its forward pass is the one
    :meth:`StackedAttention.__call__` follows, and another family's attention may differ
    (biases, norms on q and k, other rotary embeddings)."""
    cls = _llama_attention()
    if cls is None or type(attn) is not cls:
        return False
    projs = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    if any("bias" in p for p in projs if isinstance(p, nn.Module)):
        return False
    if all(type(p) is nn.QuantizedLinear for p in projs):
        return (
            len({(p.mode, p.bits, p.group_size, p.weight.shape[1], p.scales.dtype, "biases" in p) for p in projs}) == 1
        )
    if all(type(p) is nn.Linear for p in projs):
        return len({(p.weight.dtype, p.weight.shape[1]) for p in projs}) == 1
    return False


class StackedQKV:
    """The q, k and v projections of ``attn`` (:func:`stackable`) as one product: calling it
    on ``x`` [..., hidden] gives ``(q, k, v)`` [..., rows] each, the same values as the
    three projections. The stacked weights are made and evaluated once, here (they take the
    three matrices' memory again while the stand-in lives)."""

    def __init__(self, attn: Any) -> None:
        if not stackable(attn):
            raise ValueError(
                "attn: must be mlx-lm's Llama Attention with q, k, v projections of one format "
                f"and no bias, got {describe(attn)}"
            )
        q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
        self.rows = (int(q.weight.shape[0]), int(k.weight.shape[0]), int(v.weight.shape[0]))
        self._at = [self.rows[0], self.rows[0] + self.rows[1]]
        self.quantized = type(q) is nn.QuantizedLinear
        if self.quantized:
            self._spec = {"group_size": q.group_size, "bits": q.bits, "mode": q.mode}
            self._w = mx.concatenate([q.weight, k.weight, v.weight])
            self._s = mx.concatenate([q.scales, k.scales, v.scales])
            self._b = mx.concatenate([q.biases, k.biases, v.biases]) if "biases" in q else None
            mx.eval(*[a for a in (self._w, self._s, self._b) if a is not None])
        else:
            self._w = mx.concatenate([q.weight, k.weight, v.weight]).T  # [hidden, rows], as x @ W.T reads it
            mx.eval(self._w)

    def product(self, x: mx.array) -> mx.array:
        """``q | k | v`` of ``x`` [..., hidden] as one array [..., sum(rows)], unsplit."""
        if self.quantized:
            return quantized_matmul(x, self._w, self._s, self._b, **self._spec)
        return x @ self._w

    def __call__(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        q, k, v = mx.split(self.product(x), self._at, axis=-1)  # one op, three views of its buffer
        return q, k, v


@lru_cache(maxsize=1)
def _plain_cache() -> type | None:
    """mlx-lm's ``KVCache`` (the plain one a Llama's prompt cache holds), or None without mlx-lm;
    looked up at the first decode step, not at import (mlx-lm is only needed with a model)."""
    try:
        from mlx_lm.models.cache import KVCache
    except ImportError:
        return None
    return KVCache


def _appended(cache: Any, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
    """``cache.update_and_fetch(k, v)`` for one position, the same ops with less host work.

    Where ``cache`` is mlx-lm's plain ``KVCache`` and its buffers have room for the position,
    this writes ``k`` and ``v`` at the cache's offset and returns the buffers up to it, as its
    ``update_and_fetch`` does: the same two slice updates and two slices, so the same graph
    and the same bits. The difference is the index: mlx's ``a[..., i:j, :]`` parses an
    Ellipsis and four items on every call, where a tuple of three slices is read straight
    (on a 2-core CPU, building one layer's update took 22 us with mlx-lm's call and 14 us here). Anything
    else (a cache of another kind, a full buffer that must grow) goes through the cache's
    own ``update_and_fetch``."""
    if type(cache) is not _plain_cache() or cache.keys is None:  # (other caches may hold no keys)
        return cache.update_and_fetch(k, v)
    keys = cache.keys
    start = cache.offset
    end = start + 1
    size = keys.shape[2]
    if end > size:  # the buffer grows by mlx-lm's step: its own code does that
        return cache.update_and_fetch(k, v)
    cache.offset = end
    at = (slice(None), slice(None), slice(start, end))
    keys[at] = k
    cache.values[at] = v
    if end == size:  # as keys_and_values: the whole buffers, no slice
        return keys, cache.values
    upto = (slice(None), slice(None), slice(0, end))
    return keys[upto], cache.values[upto]


class StackedAttention(nn.Module):
    """Stands in for an mlx-lm Llama attention module (``attn``): its projections as one
    :class:`StackedQKV` product, the rest of its forward pass as the module runs it (the
    heads laid out, the rotary embedding at the cache's offset, the cache updated, scaled
    dot-product attention over it, the heads joined), then ``o_proj``. A decode step's one
    position takes the heads' layout with one reshape and one split and is joined with one
    reshape, where the module runs three reshapes and three transposes, then a transpose and
    a reshape: the same values, six ops a layer fewer.

    ``o_proj`` is this stand-in's own attribute, the module's at first: a caller that takes
    the output projection out (``fused_layers``' fused blocks set it to the identity)
    sets it here."""

    def __init__(self, attn: Any) -> None:
        super().__init__()
        self.qkv = StackedQKV(attn)  # stackable(attn) holds, so mlx-lm is importable
        self.inner = attn
        self.o_proj = attn.o_proj
        from mlx_lm.models.base import scaled_dot_product_attention

        self._attend = scaled_dot_product_attention  # looked up once, not on every decode step
        # Where every projection's rows are whole heads of one width: the heads of q, of
        # q and k, and of all three, for a decode step's one-reshape layout (else None).
        nq, nk, nv = self.qkv.rows
        d = nq // attn.n_heads if attn.n_heads else 0
        whole = d > 0 and nq == attn.n_heads * d and nk == attn.n_kv_heads * d and nv == nk
        heads = (attn.n_heads, attn.n_heads + attn.n_kv_heads, attn.n_heads + 2 * attn.n_kv_heads) if whole else None
        # a plain attribute: nn.Module keeps tuples in its tree of parameters, and a lookup there
        # costs more on every step
        object.__setattr__(self, "_heads", heads)
        # the module's rotary embedding, also a plain attribute: reading a child of an mlx module
        # as an attribute is a Python-level lookup on every step
        object.__setattr__(self, "_rope", attn.rope)

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        attn = self["inner"]
        b, n, _ = x.shape
        if n == 1 and self._heads is not None:
            # One position (a decode step): [b, 1, heads x d] and [b, heads, 1, d] are the same
            # memory, so the product's rows take the heads' layout with ONE reshape and one
            # split (views of the same values), where the general path below is three
            # reshapes, three transposes and a split: five ops a layer fewer to build and run.
            q, k, v = mx.split(self.qkv.product(x).reshape(b, self._heads[-1], 1, -1), self._heads[:2], axis=1)
        else:
            q, k, v = self.qkv(x)
            q = q.reshape(b, n, attn.n_heads, -1).transpose(0, 2, 1, 3)
            k = k.reshape(b, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
            v = v.reshape(b, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        rope = self._rope
        if cache is not None:
            q = rope(q, offset=cache.offset)
            k = rope(k, offset=cache.offset)
            k, v = _appended(cache, k, v) if n == 1 else cache.update_and_fetch(k, v)
        else:
            q, k = rope(q), rope(k)
        out = self._attend(q, k, v, cache=cache, scale=attn.scale, mask=mask)
        # [b, heads, n, d] -> [b, n, heads x d]; with one position the transpose moves an axis
        # of one element, so a reshape alone gives the same values (a view where out is
        # row-contiguous, as MLX's attention writes it)
        joined = out.reshape(b, 1, -1) if n == 1 else out.transpose(0, 2, 1, 3).reshape(b, n, -1)
        return self["o_proj"](joined)


@contextlib.contextmanager
def swapped_attention(layers: list[Any]) -> Iterator[int]:
    """Within the block, every one of ``layers`` whose ``self_attn`` is :func:`stackable`
    runs it as a :class:`StackedAttention` (the number swapped is what the block gets);
    every layer's own module is put back on exit. ``fused_layers.stacked_qkv(model)`` uses it
    for the model's own layers, ``fused_layers.fused_tails(stack_qkv=True)`` beside the fused
    tails."""
    swapped = [(layer, layer.self_attn) for layer in layers if stackable(getattr(layer, "self_attn", None))]
    stand_ins = [StackedAttention(attn) for _, attn in swapped]
    try:
        for (layer, _), s in zip(swapped, stand_ins):
            layer.self_attn = s
        yield len(swapped)
    finally:
        for layer, attn in swapped:
            layer.self_attn = attn
