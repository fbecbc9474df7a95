"""The fused tail swapped into mlx-lm's model: :func:`fused_tails`.

Within the block every layer's tail (``o_proj``, the residual add, the FFN norm, the FFN,
the second add) is the workbench's fused tail instead of mlx-lm's modules; mlx-lm still
runs the embedding, attention and head. :func:`vector_tail` is one layer's tail on one
backend (built lazily inside the model's graph on ``graph``, ``cuda`` and ``metal``; on the
host for ``metal-emulated``); :func:`fused_blocks` and :func:`swapped_in` split the swap
into building the blocks once and entering them, so a decoding can switch layer sets at
every step. :func:`stacked_qkv` makes the stacked-attention change alone, for comparison.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from workbench import backends
from workbench import tail as tails
from workbench.kernels import run as kernel_run
from workbench.kernels.next_norm import NextNorm, checked
from workbench.real_models import graph_tail
from workbench.real_models.graph_tail import prepared_graph_tail
from workbench.real_models.model_parts import BlockStandIn, decoder_layers, layer_owner
from workbench.real_models.stacked_attention import swapped_attention
from workbench.tail.weights import TailWeights
from workbench.validate import describe, one_of, sequence

__all__ = [
    "LAZY_BACKENDS",
    "MODEL_BACKENDS",
    "TRACES",
    "carried_norm",
    "composes_lazily",
    "fused_blocks",
    "fused_tails",
    "stacked_qkv",
    "swapped_in",
    "vector_tail",
]


# ---------------------------------------------------------------------------------------
# The fused tail swapped in
# ---------------------------------------------------------------------------------------


#: The backends whose tail is built as MLX arrays inside the model's graph: a token stays
#: one evaluation, as with mlx-lm's own layers. ``"metal-emulated"`` is not among them: it
#: runs the Metal kernels on the host by nature, so each of its tails reads branch and
#: residual back and evaluates on its own (two host round trips a layer).
LAZY_BACKENDS: tuple[str, ...] = ("graph", "cuda", "metal")

#: The backends ``fused_tails`` takes.
MODEL_BACKENDS: tuple[str, ...] = LAZY_BACKENDS + ("metal-emulated",)

#: What a fused tail's compiled call takes (:func:`vector_tail`): the weights as inputs of
#: one trace shared by every layer of the same form, or a trace of its own a layer with its
#: weights captured (the graph tail's and the one launch's ``TRACES``, the same names).
TRACES: tuple[str, ...] = graph_tail.TRACES


def composes_lazily(backend: str) -> bool:
    """Whether ``fused_tails(..., backend=backend)`` builds each tail inside the model's graph
    (True for ``graph``, ``cuda``, ``metal``) or runs it on the host, reading its inputs
    back (``metal-emulated``: the emulator is a CPU program)."""
    return one_of("backend", backend, MODEL_BACKENDS) in LAZY_BACKENDS


def vector_tail(
    launch: tails.TailLaunch,
    backend: str,
    next_norm: NextNorm | None = None,
    trace: str = "shared",
    *,
    tuning: Any = None,
    shape: Any = None,
) -> Callable[[mx.array, mx.array], Any]:
    """One tail on one position, as a function of ``(branch, residual)`` float32
    ``mx.array`` of one position each (``[branch]`` / ``[hidden]``, or any shape of that size,
    such as a block's ``[1, 1, hidden]``) to a lazy float32 array of the residual's shape, for
    ``backend`` (the graph tail also takes many positions at once: ``[..., width]``).

    * ``graph``: the tail's MLX ops with the weights prepared once and traced by
      ``mx.compile`` (``graph_tail.model_graph_tail``: scales widened, gate and up stacked,
      ``mx.fast.rms_norm``; its element-wise ops fuse);
    * ``cuda``: the tail as one launch (``workbench.kernels.one_launch``, in ``shape`` or
      ``one_launch.shape_for``'s), or its three launches where that does not fit;
    * ``metal``: the three launches, encoded in the caller's evaluation;
    * ``metal-emulated``: evaluated here, on the host (the emulator runs on the CPU), its
      result a new array.

    ``next_norm``: the norm the tail's output goes into next (the next block's input norm,
    or the model's final norm); the function then returns ``(out, normed)``. The one CUDA
    launch and the graph tail compute it in their own launch / compiled call (one launch a
    layer fewer on a GPU, ``workbench.kernels.next_norm``); the three launches and the
    emulator follow it with ``mx.fast.rms_norm``, the same map.

    ``trace`` (:data:`TRACES`): what the graph tail's or the one CUDA launch's compiled
    function takes: ``"shared"``, the weights as inputs of one trace every layer of the same
    form shares; ``"per-layer"``, a tail's own trace with its weights captured in it (the
    three launches always trace each tail on its own, and the emulator traces nothing).

    The kernel backends are reached through their door, ``workbench.kernels.run.lazy_tail``
    (``tuning``, ``shape``: as for ``fused_tail``). Raises ``BackendUnavailable`` where the
    backend's device is absent.
    """
    name = one_of("backend", backend, MODEL_BACKENDS)
    trace = one_of("trace", trace, TRACES)
    next_norm = checked(next_norm, int(launch.ffn_norm.shape[0]))
    backends.resolve_backend(name)
    if name == "graph":
        return prepared_graph_tail(launch, next_norm, trace)
    return kernel_run.lazy_tail(name, launch, next_norm, trace, tuning=tuning, shape=shape)


class _Handoff:
    """Where a fused block leaves the norm of its output for the module that reads that
    output next: ``normed`` is valid for exactly the array ``source`` (checked by identity,
    so any other input is normed by the reader's own module)."""

    __slots__ = ("source", "normed")

    def __init__(self) -> None:
        self.source: mx.array | None = None
        self.normed: mx.array | None = None

    def put(self, source: mx.array, normed: mx.array) -> None:
        self.source, self.normed = source, normed

    def take(self, x: mx.array) -> mx.array | None:
        """The carried norm of ``x``, or None where ``x`` is not the array it was computed for;
        emptied either way (holding no arrays past their step)."""
        normed = self.normed if self.source is x else None
        self.source = self.normed = None
        return normed


def carried_norm(norm: Any) -> NextNorm | None:
    """``norm`` (a module the model applies to a block's output) as a :class:`NextNorm`
    where it is exactly mlx's ``nn.RMSNorm`` (``x * rsqrt(mean(x^2) + eps) * weight``), else
    None: a norm of any other form (a ``1 + weight`` norm, a LayerNorm) is left to its module."""
    if type(norm) is not nn.RMSNorm:
        return None
    return NextNorm(np.asarray(norm.weight.astype(mx.float32)), float(norm.eps))


class _CarriedNormStandIn(nn.Module):
    """Stands in for the model's final norm: the last fused block's carried norm where the
    input is that block's output, else the norm module itself."""

    def __init__(self, inner: nn.Module, handoff: _Handoff):
        super().__init__()
        self.inner = inner
        self._handoff = handoff

    def __call__(self, x: mx.array) -> mx.array:
        normed = self._handoff.take(x)
        return self.inner(x) if normed is None else normed


class _FusedTailBlock(BlockStandIn):
    """A decoder block whose tail is the workbench's: mlx-lm's norm and attention up to
    o_proj's input (the branch, after any output gate), then ``fused tail(branch, residual)``.

    The tail runs on float32 activations (the kernels read float32; accumulation is float32
    on every backend) and its output takes the block input's dtype: for a float32 model
    (``reference_model`` keeps SmolLM2's activations float32) nothing is rounded; for a
    bfloat16 model the output is rounded once to bfloat16, as mlx-lm's own add would.

    Building a step's graph is host work that a small model's decode waits on (on the H200,
    SmolLM2's decode is bound by it: ``bench.real_model`` counts tokens per CPU second beside
    tokens per second), so a call adds as few ops as it can: no cast where the dtype is
    already float32, the graph tail handed the rows as they are (one compiled call), and
    ``o_proj`` taken out of the attention once for the whole :func:`fused_tails` block
    (:meth:`bare`) rather than swapped in and out on every call.
    """

    def __init__(
        self,
        block: nn.Module,
        weights: TailWeights,
        backend: str,
        next_norm: NextNorm | None = None,
        handoff: _Handoff | None = None,
        incoming: _Handoff | None = None,
        trace: str = "shared",
        shape: Any = None,
    ):
        super().__init__(block)
        self._weights = weights
        self._backend = backend
        self._launch = tails.tail_launch(weights)  # the rules are asked here, once
        self._tail = vector_tail(self._launch, backend, next_norm, trace, shape=shape)
        self._rows = backend == "graph"  # the graph tail takes [n, width] rows in one call
        self._bare = False
        # With a next norm, the tail also returns the norm its output goes into next, left in
        # `handoff` for the reader (the next fused block, or the final norm's stand-in);
        # `incoming` is where the previous fused block leaves this block's input norm.
        self._handoff = handoff if next_norm is not None else None
        self._incoming = incoming

    @contextlib.contextmanager
    def bare(self) -> Iterator[None]:
        """Within the block, the attention's ``o_proj`` is the identity, so the attention
        returns the branch; the model's own ``o_proj`` is put back on exit."""
        attn = self.block.self_attn
        o_proj = attn.o_proj
        attn.o_proj = nn.Identity()
        self._bare = True
        try:
            yield
        finally:
            self._bare = False
            attn.o_proj = o_proj

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        # The block's modules are read from the module's own dict (``self["block"]``), not as
        # attributes: an attribute of an mlx module is a Python-level lookup (this stand-in's
        # __getattr__, then nn.Module's), microseconds a layer on every decode step.
        block = self["block"]
        normed = self._incoming.take(x) if self._incoming is not None else None
        if normed is None:
            normed = block["input_layernorm"](x)
        if self._bare:
            branch = block["self_attn"](normed, mask, cache)
        else:
            with self.bare():
                branch = block["self_attn"](normed, mask, cache)
        b = branch if branch.dtype == mx.float32 else branch.astype(mx.float32)
        r = x if x.dtype == mx.float32 else x.astype(mx.float32)
        if self._rows:  # the graph takes the block's [batch, tokens, width] as it is: no reshape
            got = self._tail(b, r)
        elif b.size == b.shape[-1]:  # a kernel, a decode step: one position, in the block's shape
            # (the one launch takes it as it is; an index, b[0], would be a gather kernel on a GPU)
            got = self._tail(b, r)
        else:  # the kernels take one position a launch: a prompt's positions one after another
            bf, rf = b.reshape(-1, b.shape[-1]), r.reshape(-1, r.shape[-1])
            each = [self._tail(bf[i], rf[i]) for i in range(bf.shape[0])]
            if self._handoff is None:
                got = mx.stack(each).reshape(x.shape)
            else:
                got = tuple(mx.stack([e[k] for e in each]).reshape(x.shape) for k in (0, 1))
        out, carried = got if self._handoff is not None else (got, None)
        if out.dtype != x.dtype:
            # the reader norms the rounded output itself: the carried norm is of the float32 one
            return out.astype(x.dtype)
        if carried is not None:
            self._handoff.put(out, carried)
        return out


@contextlib.contextmanager
def fused_tails(
    model: nn.Module,
    weights: Sequence[TailWeights | None],
    *,
    backend: str = "graph",
    carry_norm: bool = True,
    stack_qkv: bool = False,
    trace: str = "shared",
    shape: Any = None,
) -> Iterator[nn.Module]:
    """Within the block, every layer of ``model`` with a ``TailWeights`` runs its fused tail.

    ``weights``: one entry a layer, ``ckpt.tail_weights(i)`` (or a re-quantized / folded
    variant), or ``None`` to keep the model's own layer (a recurrent layer of a hybrid);
    an entry that names another layer (``TailWeights.layer``) is refused, since its rules
    were asked about that layer. ``backend``: ``"graph"`` (the tail's MLX ops), ``"cuda"``
    (the tail as one launch) or ``"metal"`` (three launches), each built lazily INSIDE the
    model's forward pass, so a decode step stays one evaluation (:func:`vector_tail`); or
    ``"metal-emulated"``, which runs on the host by nature: each tail reads its inputs back
    and evaluates on its own (:func:`composes_lazily` says which). A layer the rules refuse
    raises ``TailRefused``, an absent backend ``BackendUnavailable``, before anything runs.
    The model's own layers are put back on exit.

    ``carry_norm``: a fused tail whose output goes straight into the next fused block's
    input norm, or (the last block) into the model's final norm, also computes that norm,
    when it is mlx's ``nn.RMSNorm`` (:func:`carried_norm`): in the one CUDA launch, one
    launch a layer fewer (``workbench.kernels.next_norm``). The reader takes it only for
    the very array it was computed from (a bfloat16 model rounds the output first, and its
    reader norms the rounded array itself). False: every block norms its own input.

    ``stack_qkv``: every layer whose attention is mlx-lm's Llama attention also runs its
    q, k and v projections as one product (``workbench.real_models.stacked_attention``: the same
    map, two ops and two GPU kernels a layer fewer). That is a change to the attention, not
    to the tail, so it is off by default; :func:`stacked_qkv` makes the same change to the
    model's own layers, for a comparison that tells the two apart.

    ``trace``: what each tail's compiled call takes (:func:`vector_tail`): ``"shared"``, one
    trace for every layer of the same form, the weights passed as inputs; ``"per-layer"``, a
    trace of its own a layer, its weights captured.
    """
    if not isinstance(carry_norm, bool):
        raise ValueError(f"carry_norm: must be True or False, got {describe(carry_norm)}")
    if not isinstance(stack_qkv, bool):
        raise ValueError(f"stack_qkv: must be True or False, got {describe(stack_qkv)}")
    blocks, final = fused_blocks(model, weights, backend, carry_norm, trace, shape)
    with contextlib.ExitStack() as inside:
        if stack_qkv:  # first: the fused blocks then take o_proj out of the stand-ins
            _stacked_in(model, inside, "stack_qkv")
        inside.enter_context(swapped_in(model, blocks, final))
        yield model


def _stacked_in(model: nn.Module, stack: contextlib.ExitStack, name: str) -> None:
    """Every stackable attention of ``model``'s layers swapped for its stacked stand-in
    until ``stack`` closes; ValueError naming the parameter ``name`` where none is (the
    change would change nothing, and a comparison made with it would be mislabelled)."""
    if stack.enter_context(swapped_attention(decoder_layers(model))) == 0:
        raise ValueError(
            f"{name}: no layer's attention is mlx-lm's Llama Attention with q, k, v projections of "
            f"one format and no bias (workbench.real_models.stacked_attention.stackable), in {describe(model)}"
        )


@contextlib.contextmanager
def stacked_qkv(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, the model's own layers with each attention's q, k and v projections
    as one product (``workbench.real_models.stacked_attention``), every layer's own module put
    back on exit: mlx-lm's layers with only that change, the comparison that tells what
    ``fused_tails(stack_qkv=True)`` owes to the stacking and what to the tails. ValueError
    where no layer's attention is stackable."""
    with contextlib.ExitStack() as inside:
        _stacked_in(model, inside, "model")
        yield model


def fused_blocks(
    model: nn.Module,
    weights: Sequence[TailWeights | None],
    backend: str,
    carry_norm: bool = True,
    trace: str = "shared",
    shape: Any = None,
) -> tuple[list[nn.Module], _Handoff | None]:
    """The model's blocks with a :class:`_FusedTailBlock` wherever ``weights`` has an entry
    (checked as :func:`fused_tails` documents; the rules asked here, once), and the
    handoff the last block leaves the final norm in (None where it carries none)."""
    backend = one_of("backend", backend, MODEL_BACKENDS)
    trace = one_of("trace", trace, TRACES)
    original = list(layer_owner(model).layers)
    weights = list(sequence("weights", weights, what="TailWeights or None, one a layer", non_empty=False))
    if len(weights) != len(original):
        raise ValueError(f"weights: need one entry for each of the {len(original)} layers, got {len(weights)}")
    for i, w in enumerate(weights):
        if w is None:
            continue
        if not isinstance(w, TailWeights):
            raise ValueError(f"weights[{i}]: must be TailWeights or None, got {describe(w)}")
        if w.layer is not None and int(w.layer) != i:
            raise ValueError(
                f"weights[{i}]: TailWeights of layer {int(w.layer)}, not of layer {i} (the rules were "
                f"asked about layer {int(w.layer)}); pass ckpt.tail_weights({i})"
            )
    owner = layer_owner(model)
    n = len(original)
    # The module that reads layer i's output next: layer i + 1's input norm (only a fused
    # block asks its handoff), or after the last layer the model's final norm.
    readers = [
        getattr(original[i + 1], "input_layernorm", None)
        if i + 1 < n and weights[i + 1] is not None
        else (getattr(owner, "norm", None) if i + 1 == n else None)
        for i in range(n)
    ]
    handoffs = [_Handoff() for _ in range(n)]
    blocks: list[nn.Module] = []
    final = None
    for i, (blk, w) in enumerate(zip(original, weights)):
        if w is None:
            blocks.append(blk)
            continue
        nxt = carried_norm(readers[i]) if carry_norm else None
        incoming = handoffs[i - 1] if i > 0 and weights[i - 1] is not None else None
        blocks.append(_FusedTailBlock(blk, w, backend, nxt, handoffs[i], incoming, trace, shape))
        if i + 1 == n and nxt is not None:
            final = handoffs[i]
    return blocks, final


@contextlib.contextmanager
def swapped_in(model: nn.Module, blocks: Sequence[nn.Module], final: _Handoff | None = None) -> Iterator[None]:
    """Within the block, ``blocks`` (from :func:`fused_blocks`) are the model's layers, each
    fused one's ``o_proj`` the identity, and with ``final`` the model's final norm a
    stand-in that takes the last block's carried norm; all put back on exit. Entering costs
    attribute sets only, so a decoding may switch between two layer sets at every step."""
    owner = layer_owner(model)
    original = list(owner.layers)
    norm = getattr(owner, "norm", None)
    with contextlib.ExitStack() as bare:
        for blk in blocks:
            if isinstance(blk, _FusedTailBlock):
                bare.enter_context(blk.bare())
        owner.layers = list(blocks)
        if final is not None:
            owner.norm = _CarriedNormStandIn(norm, final)
        try:
            yield
        finally:
            owner.layers = original
            if final is not None:
                owner.norm = norm
