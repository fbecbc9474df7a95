"""Greedy decoding through mlx-lm's KV cache, and where teacher forcing first leaves a reference.

:func:`greedy` keeps each step's logit margin (top-1 minus top-2), which says how close a
token was to flipping; :func:`greedy_captured` also records the prompt's pass,
:func:`greedy_beside` decodes with the model's own layers and with fused tails side by
side. :func:`first_departure` counts how many of a reference's tokens a model's greedy
choices reproduce (:func:`first_departures`: for several weight sets at once). Independent
passes are built each on a stream of its own and evaluated together: on a CPU MLX runs each
stream on its own thread and its quantized products are single-threaded there, so the
passes share the cores instead of queueing on one; each stream's arithmetic is its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from workbench.real_models.capture import LayerCapture, tapped
from workbench.real_models.fused_layers import fused_blocks, swapped_in
from workbench.real_models.model_parts import head, layer_owner, vocab_size
from workbench.real_models.transformers_advice import without_transformers_advice
from workbench.tail.weights import TailWeights
from workbench.validate import describe, integer, token_ids

__all__ = [
    "Generation",
    "first_departure",
    "first_departures",
    "forced_choices",
    "greedy",
    "greedy_beside",
    "greedy_captured",
]


def forced_choices(model: nn.Module, sequence: Sequence[int], start: int) -> np.ndarray:
    """The model's argmax after each of ``sequence[start - 1:-1]`` in ONE pass over
    ``sequence`` (teacher forcing): what its greedy decoding would choose at each step
    given that history. The head runs only on those rows (it is the costliest op)."""
    ids = mx.array(token_ids("sequence", sequence, vocab_size(model)))[None]
    start = (
        integer("start", start, minimum=1, maximum=int(ids.shape[1]) - 1)
        if ids.shape[1] > 1
        else integer("start", start, minimum=1, maximum=0)
    )
    hidden = layer_owner(model)(ids)
    return np.asarray(mx.argmax(head(model, hidden[:, start - 1 : -1]), axis=-1)[0])


def first_departure(model: nn.Module, prompt: Sequence[int], tokens: Sequence[int]) -> int:
    """How many of ``tokens`` ``model``'s greedy decoding after ``prompt`` reproduces before
    its first different choice (teacher forcing: each choice given ``prompt`` and the tokens
    before it, as :func:`forced_choices` makes them).

    Through mlx-lm's KV cache in at most two passes: the prompt (whose last row gives the
    first choice), then, only where that choice agrees, the rest of ``tokens`` in one more
    pass. A model that leaves at the first step (a near tie there) costs the prompt's pass
    alone, not a pass over the whole sequence; the head runs only on the rows compared.
    """
    ids, toks = _prompt_and_tokens(model, prompt, tokens)
    return _departures(model, ids, toks, [contextlib.nullcontext])[0]


def first_departures(
    model: nn.Module,
    prompt: Sequence[int],
    tokens: Sequence[int],
    weight_sets: Sequence[Sequence[TailWeights | None]],
    *,
    backend: str = "graph",
) -> list[int]:
    """:func:`first_departure` of ``model`` with each of ``weight_sets`` swapped in
    (as :func:`~workbench.real_models.fused_layers.fused_tails` swaps them, ``backend``),
    one count a set.

    The sets' prompt passes are independent, so each is built on a stream of its own and all
    are evaluated together; every set's choices are the ones :func:`first_departure` makes
    with that set alone. A set whose first choice agrees takes its second pass, over the
    rest of ``tokens``, afterwards on its own. Each set's blocks are built once, before any
    pass runs (a set the rules refuse raises first).
    """
    ids, toks = _prompt_and_tokens(model, prompt, tokens)
    sets = [list(ws) for ws in weight_sets]
    if not sets:
        raise ValueError(f"weight_sets: must hold at least one set of TailWeights, got {describe(weight_sets)}")
    built = [fused_blocks(model, ws, backend) for ws in sets]
    return _departures(model, ids, toks, [lambda b=b: swapped_in(model, *b) for b in built])


def _prompt_and_tokens(model: nn.Module, prompt: Sequence[int], tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    vocab = vocab_size(model)
    return token_ids("prompt", prompt, vocab), token_ids("tokens", tokens, vocab)


def _departures(
    model: nn.Module,
    ids: np.ndarray,
    toks: np.ndarray,
    layer_sets: Sequence[Callable[[], AbstractContextManager[object]]],
) -> list[int]:
    """The first departure of ``toks`` after ``ids`` inside each of ``layer_sets`` (each a
    context in which the model runs one set of layers), in at most two passes a set: every
    set's prompt pass built (each on a stream of its own where there are several) and
    evaluated together, then the second pass of each set whose first choice agrees."""
    with without_transformers_advice():
        from mlx_lm.models.cache import make_prompt_cache

    owner = layer_owner(model)
    # One pass alone needs no stream of its own: it runs on the caller's.
    on_streams = (
        [mx.stream(s) for s in _pass_streams(len(layer_sets))] if len(layer_sets) > 1 else [contextlib.nullcontext()]
    )
    passes = []
    for layers, on_stream in zip(layer_sets, on_streams):
        with layers(), on_stream:
            cache = make_prompt_cache(model)
            hidden = owner(mx.array(ids)[None], cache=cache)
            passes.append((cache, mx.argmax(head(model, hidden[:, -1:]), axis=-1)))
    mx.eval([first for _, first in passes])
    counts = []
    for layers, (cache, first) in zip(layer_sets, passes):
        if int(first.item()) != int(toks[0]):
            counts.append(0)
        elif toks.size == 1:
            counts.append(1)
        else:
            with layers():
                hidden = owner(mx.array(toks[:-1])[None], cache=cache)
                chosen = np.asarray(mx.argmax(head(model, hidden), axis=-1)[0])
            differs = np.nonzero(chosen != toks[1:])[0]
            counts.append(1 + int(differs[0]) if differs.size else int(toks.size))
    return counts


#: The streams :func:`first_departures` and :func:`greedy_beside` build their independent passes on,
#: one a pass, made once a device and kept: MLX keeps a stream, and on a CPU its thread, for the
#: life of the process, so a new one a call would only add threads.
_PASS_STREAMS: dict[str, list[mx.Stream]] = {}


def _pass_streams(n: int) -> list[mx.Stream]:
    device = mx.default_device()
    held = _PASS_STREAMS.setdefault(str(device), [])
    while len(held) < n:
        held.append(mx.new_stream(device))
    return held[:n]


@dataclass(frozen=True)
class Generation:
    """Greedy tokens after a prompt, and each step's logit margin (top-1 minus top-2)."""

    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    margins: tuple[float, ...]
    top2: tuple[int, ...]


def greedy(model: nn.Module, prompt: Sequence[int], n: int) -> Generation:
    """``n`` greedy tokens after ``prompt``, through mlx-lm's KV cache (the prompt in one pass;
    the output head on the last position of each pass)."""
    return _greedy(model, prompt, n, capture=False)[0]


def greedy_captured(model: nn.Module, prompt: Sequence[int], n: int) -> tuple[Generation, list[LayerCapture]]:
    """:func:`greedy`, and every layer's ``(residual, branch, output)`` at every position of
    the prompt, recorded during the prompt's own pass (as :func:`capture_layers` records
    them, but through the KV cache the decoding then continues from).

    On a CPU a prompt pass costs time in proportion to its tokens (MLX's quantized products
    there are linear in rows), so the pass that starts the decoding is the one captured,
    not a second pass over the same tokens.
    """
    gen, captures = _greedy(model, prompt, n, capture=True)
    assert captures is not None
    return gen, captures


class _Greedy:
    """One greedy decoding, a step at a time: :meth:`build` makes the step's graph (lazily,
    on the stream current at the call), :meth:`take` reads the evaluated choice back. The
    head runs on the last position only: the model's own call would multiply every prompt
    position by the vocabulary (49,152 rows for SmolLM2) to keep one row."""

    def __init__(self, model: nn.Module, prompt: Sequence[int], n: int, capture: bool):
        with without_transformers_advice():
            from mlx_lm.models.cache import make_prompt_cache

        self.n = integer("n", n, minimum=1)
        self.model, self.owner = model, layer_owner(model)
        self.prompt = tuple(int(t) for t in token_ids("prompt", prompt, vocab_size(model)))
        self.ids = mx.array(self.prompt)[None]
        context = getattr(getattr(model, "args", None), "max_position_embeddings", None)
        if isinstance(context, int) and len(self.prompt) + self.n > context:
            raise ValueError(
                f"n: the prompt's {len(self.prompt)} tokens and {self.n} more exceed the model's context "
                f"of {context} positions"
            )
        self.cache = make_prompt_cache(model)
        self.capture = capture
        self.captures: list[LayerCapture] | None = None
        self.out: list[int] = []
        self.margins: list[float] = []
        self.second: list[int] = []
        self._collect: Callable[[], list[LayerCapture]] | None = None

    def build(self) -> tuple[mx.array, mx.array]:
        if self.capture and not self.out:
            with tapped(self.model) as collect:
                hidden = self.owner(self.ids, cache=self.cache)
            self._collect = collect  # read after the step's evaluation
        else:
            hidden = self.owner(self.ids, cache=self.cache)
        logits = head(self.model, hidden[:, -1:])[0, -1].astype(mx.float32)
        return logits, mx.argpartition(-logits, kth=1)[:2]

    def take(self, logits: mx.array, top: mx.array) -> None:
        if self._collect is not None:
            self.captures, self._collect = self._collect(), None
        vals = np.asarray(logits)
        a, b = (int(i) for i in np.asarray(top))
        if vals[b] > vals[a]:
            a, b = b, a
        self.out.append(a)
        self.margins.append(float(vals[a] - vals[b]))
        self.second.append(b)
        self.ids = mx.array([[a]], dtype=mx.int32)

    def generation(self) -> Generation:
        return Generation(self.prompt, tuple(self.out), tuple(self.margins), tuple(self.second))


def _greedy(
    model: nn.Module, prompt: Sequence[int], n: int, *, capture: bool
) -> tuple[Generation, list[LayerCapture] | None]:
    g = _Greedy(model, prompt, n, capture)
    for _ in range(g.n):
        logits, top = g.build()
        mx.eval(logits, top)
        g.take(logits, top)
    return g.generation(), g.captures


def greedy_beside(
    model: nn.Module,
    prompt: Sequence[int],
    n: int,
    weights: Sequence[TailWeights | None],
    *,
    backend: str = "graph",
    capture: bool = False,
) -> tuple[Generation, Generation, list[LayerCapture] | None, list[LayerCapture] | None]:
    """:func:`greedy` with ``model``'s own layers and with ``weights`` swapped in
    (:func:`fused_tails`), side by side: ``(reference, variant, reference_captures,
    variant_captures)``, the captures (with ``capture``) those of each prompt pass, as
    :func:`greedy_captured` makes them.

    The two decodings are independent, so each step builds both graphs, each on a stream of
    its own, and evaluates them together: MLX runs each CPU stream on a thread of its own and
    its quantized products there are single-threaded, so on a CPU the two share the cores
    instead of queueing on one. Each stream's arithmetic is its own: both generations are
    the ones :func:`greedy` makes alone.
    """
    if not isinstance(capture, bool):
        raise ValueError(f"capture: must be True or False, got {describe(capture)}")
    blocks, final = fused_blocks(model, weights, backend)
    ref, var = _Greedy(model, prompt, n, capture), _Greedy(model, prompt, n, capture)
    s_ref, s_var = _pass_streams(2)
    for _ in range(ref.n):
        with mx.stream(s_ref):
            built_ref = ref.build()
        with swapped_in(model, blocks, final), mx.stream(s_var):
            built_var = var.build()
        mx.eval(*built_ref, *built_var)
        ref.take(*built_ref)
        var.take(*built_var)
    return ref.generation(), var.generation(), ref.captures, var.captures
