"""The reference forward pass: mlx-lm's own model carrying a checkpoint's weights.

The workbench writes no attention of its own for a real model: :func:`reference_model`
builds mlx-lm's model class for the checkpoint's family (``mlx_lm.models.<model_type>``)
and loads the checkpoint's tensors into it, quantized ones as mlx-lm's own
``QuantizedLinear`` / ``QuantizedEmbedding`` with the SAME packed words, their scales and
biases widened to float32 (exact: the map ``scale * q + bias`` is unchanged, and the
activations then stay float32 end to end, as the fused tail's are).

Around it:

* :func:`gguf_tokenizer` -- the tokenizer a GGUF file carries in its metadata (BPE
  vocabulary and merges, its pre-tokenizer, chat template), as a ``transformers`` fast
  tokenizer built by the ``tokenizers`` library;
* :func:`capture_layers` -- every layer's ``(residual, branch, output)`` at every
  position of a prompt: the layer's input, ``o_proj``'s input (the branch a tail
  takes) and the layer's output;
* :func:`fused_tails` -- a context in which every layer's tail (``o_proj``, the residual
  add, the FFN norm, the FFN, the second add) is the workbench's fused tail instead of
  mlx-lm's modules; mlx-lm still runs the embedding, attention and head;
* :func:`greedy` -- greedy decoding with mlx-lm's KV cache, keeping each step's logit
  margin (top-1 minus top-2), which says how close a token was to flipping.

mlx-lm (and through it transformers and tokenizers) is imported inside the functions,
so ``import workbench`` stays light.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from workbench import backends
from workbench import tail as tails
from workbench.kernels import run as kernel_run
from workbench.kernels.next_norm import NextNorm, checked
from workbench.real_models import graph_tail
from workbench.real_models.checkpoint import Checkpoint, Tensor
from workbench.real_models.graph_tail import prepared_graph_tail
from workbench.real_models.stacked_qkv import swapped_attention
from workbench.tail.weights import TailWeights
from workbench.validate import describe, integer, one_of, token_ids

__all__ = [
    "reference_model",
    "gguf_tokenizer",
    "LayerCapture",
    "capture_layers",
    "fused_tails",
    "stacked_qkv",
    "vocab_size",
    "LAZY_BACKENDS",
    "TRACES",
    "MODEL_BACKENDS",
    "composes_lazily",
    "vector_tail",
    "Generation",
    "greedy",
    "greedy_captured",
    "greedy_beside",
    "forced_choices",
    "first_departure",
    "first_departures",
]


def _dense_for_model(t: Tensor) -> mx.array:
    return t.weight.astype(mx.float32)


@contextlib.contextmanager
def _without_transformers_advice() -> Iterator[None]:
    """Import mlx-lm / transformers without transformers' import-time advice.

    Without PyTorch, ``import transformers`` logs "PyTorch was not found. Models won't be
    available..." to stderr: true, and beside the point here (the workbench uses only its
    tokenizers; mlx-lm runs the models), yet a notebook would show it as an error-coloured
    output. transformers skips its advisory messages while ``TRANSFORMERS_NO_ADVISORY_WARNINGS``
    is set; it is set for the import only and put back after, so the caller's environment
    and transformers' later warnings are untouched.
    """
    key = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


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
        with _without_transformers_advice():
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


def gguf_tokenizer(metadata: Mapping[str, Any]) -> Any:
    """The tokenizer a GGUF file carries (``tokenizer.ggml.*``), as a transformers fast tokenizer.

    Only the byte-level BPE (``tokenizer.ggml.model == "gpt2"``) that SmolLM2 and the
    Llama-3 family use is built; its pre-tokenizer for ``smollm`` / ``default`` splits
    digits one by one, then GPT-2's byte-level split (llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM).
    Control tokens (type 3) are special tokens; the chat template is the file's.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    with _without_transformers_advice():
        from transformers import PreTrainedTokenizerFast

    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"metadata: tokenizer.ggml.model must be 'gpt2' (byte-level BPE), got {kind!r}")
    tokens = list(metadata["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    types = np.asarray(metadata["tokenizer.ggml.token_type"]).tolist()
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()

    def token(key: str) -> str | None:
        v = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return None if v is None else tokens[int(np.asarray(v))]

    specials = [t for t, k in zip(tokens, types) if k == 3]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=token("bos"), eos_token=token("eos"), unk_token=token("unknown"),
        pad_token=token("padding"), additional_special_tokens=specials,
    )
    template = metadata.get("tokenizer.chat_template")
    if template is not None:
        fast.chat_template = str(template)
    return fast


# ---------------------------------------------------------------------------------------
# Capturing what each layer sees
# ---------------------------------------------------------------------------------------


def _layers(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ValueError(f"model: must be an mlx-lm model (with .layers), got {describe(model)}")
    return layers


def _layer_owner(model: nn.Module) -> nn.Module:
    """The module whose ``.layers`` list the model's loop walks (``model.model`` in mlx-lm)."""
    inner = getattr(model, "model", model)
    held, walked = list(getattr(inner, "layers", None) or ()), list(_layers(model))
    if len(held) != len(walked) or any(a is not b for a, b in zip(held, walked)):
        raise ValueError(f"model: cannot find the module holding its layers in {describe(model)}")
    return inner


class _BlockStandIn(nn.Module):
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


class _Tap(nn.Module):
    """Stands in for ``o_proj``: records its input, then applies it."""

    def __init__(self, inner: nn.Module, record: list):
        super().__init__()
        self.inner = inner
        self._record = record

    def __call__(self, x: mx.array) -> mx.array:
        self._record.append(x)
        return self.inner(x)


class _BlockTap(_BlockStandIn):
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
def _tapped(model: nn.Module) -> Iterator[Callable[[], list[LayerCapture]]]:
    """Within the block, every block of ``model`` records its input and output and every
    ``self_attn.o_proj`` its input (the branch) as the model's own loop calls them; yields
    a function that reads the FIRST call's records back as :class:`LayerCapture` (float32
    numpy, the batch's first row). Everything is put back on exit, also on an error."""
    owner = _layer_owner(model)
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
    with _tapped(model) as collect:
        mx.eval(_layer_owner(model)(ids))  # the decoder stack only: the head's logits are not needed here
        return collect()


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


def vector_tail(launch: tails.TailLaunch, backend: str, next_norm: NextNorm | None = None,
                trace: str = "shared", *, tuning: Any = None,
                shape: Any = None) -> Callable[[mx.array, mx.array], Any]:
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


class _FusedTailBlock(_BlockStandIn):
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

    def __init__(self, block: nn.Module, weights: TailWeights, backend: str, next_norm: NextNorm | None = None,
                 handoff: _Handoff | None = None, incoming: _Handoff | None = None, trace: str = "shared",
                 shape: Any = None):
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
def fused_tails(model: nn.Module, weights: Sequence[TailWeights | None], *, backend: str = "graph",
                carry_norm: bool = True, stack_qkv: bool = False, trace: str = "shared",
                shape: Any = None) -> Iterator[nn.Module]:
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
    q, k and v projections as one product (``workbench.real_models.stacked_qkv``: the same
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
    blocks, final = _fused_blocks(model, weights, backend, carry_norm, trace, shape)
    with contextlib.ExitStack() as inside:
        if stack_qkv:  # first: the fused blocks then take o_proj out of the stand-ins
            _stacked_in(model, inside, "stack_qkv")
        inside.enter_context(_swapped_in(model, blocks, final))
        yield model


def _stacked_in(model: nn.Module, stack: contextlib.ExitStack, name: str) -> None:
    """Every stackable attention of ``model``'s layers swapped for its stacked stand-in
    until ``stack`` closes; ValueError naming the parameter ``name`` where none is (the
    change would change nothing, and a comparison made with it would be mislabelled)."""
    if stack.enter_context(swapped_attention(_layers(model))) == 0:
        raise ValueError(f"{name}: no layer's attention is mlx-lm's Llama Attention with q, k, v projections of "
                         f"one format and no bias (workbench.real_models.stacked_qkv.stackable), in {describe(model)}")


@contextlib.contextmanager
def stacked_qkv(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, the model's own layers with each attention's q, k and v projections
    as one product (``workbench.real_models.stacked_qkv``), every layer's own module put
    back on exit: mlx-lm's layers with only that change, the comparison that tells what
    ``fused_tails(stack_qkv=True)`` owes to the stacking and what to the tails. ValueError
    where no layer's attention is stackable."""
    with contextlib.ExitStack() as inside:
        _stacked_in(model, inside, "model")
        yield model


def _fused_blocks(model: nn.Module, weights: Sequence[TailWeights | None], backend: str,
                  carry_norm: bool = True, trace: str = "shared",
                  shape: Any = None) -> tuple[list[nn.Module], _Handoff | None]:
    """The model's blocks with a :class:`_FusedTailBlock` wherever ``weights`` has an entry
    (checked as :func:`fused_tails` documents; the rules asked here, once), and the
    handoff the last block leaves the final norm in (None where it carries none)."""
    backend = one_of("backend", backend, MODEL_BACKENDS)
    trace = one_of("trace", trace, TRACES)
    original = list(_layer_owner(model).layers)
    weights = list(weights)
    if len(weights) != len(original):
        raise ValueError(f"weights: need one entry for each of the {len(original)} layers, got {len(weights)}")
    for i, w in enumerate(weights):
        if w is None:
            continue
        if not isinstance(w, TailWeights):
            raise ValueError(f"weights[{i}]: must be TailWeights or None, got {describe(w)}")
        if w.layer is not None and int(w.layer) != i:
            raise ValueError(f"weights[{i}]: TailWeights of layer {int(w.layer)}, not of layer {i} (the rules were "
                             f"asked about layer {int(w.layer)}); pass ckpt.tail_weights({i})")
    owner = _layer_owner(model)
    n = len(original)
    # The module that reads layer i's output next: layer i + 1's input norm (only a fused
    # block asks its handoff), or after the last layer the model's final norm.
    readers = [getattr(original[i + 1], "input_layernorm", None) if i + 1 < n and weights[i + 1] is not None
               else (getattr(owner, "norm", None) if i + 1 == n else None) for i in range(n)]
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
def _swapped_in(model: nn.Module, blocks: Sequence[nn.Module], final: _Handoff | None = None) -> Iterator[None]:
    """Within the block, ``blocks`` (from :func:`_fused_blocks`) are the model's layers, each
    fused one's ``o_proj`` the identity, and with ``final`` the model's final norm a
    stand-in that takes the last block's carried norm; all put back on exit. Entering costs
    attribute sets only, so a decoding may switch between two layer sets at every step."""
    owner = _layer_owner(model)
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


# ---------------------------------------------------------------------------------------
# Greedy decoding
# ---------------------------------------------------------------------------------------


def head(model: nn.Module, hidden: mx.array) -> mx.array:
    """The model's output head on final hidden states (``lm_head``, or the tied embedding)."""
    if getattr(model, "lm_head", None) is not None:
        return model.lm_head(hidden)
    inner = getattr(model, "language_model", model)
    if getattr(inner, "lm_head", None) is not None:
        return inner.lm_head(hidden)
    return _layer_owner(model).embed_tokens.as_linear(hidden)


def vocab_size(model: nn.Module) -> int:
    """How many token ids ``model``'s embedding has rows for (dense or quantized)."""
    emb = _layer_owner(model).embed_tokens
    n = getattr(emb, "num_embeddings", None)
    return int(n) if n is not None else int(emb.weight.shape[0])


def forced_choices(model: nn.Module, sequence: Sequence[int], start: int) -> np.ndarray:
    """The model's argmax after each of ``sequence[start - 1:-1]`` in ONE pass over
    ``sequence`` (teacher forcing): what its greedy decoding would choose at each step
    given that history. The head runs only on those rows (it is the costliest op)."""
    ids = mx.array(token_ids("sequence", sequence, vocab_size(model)))[None]
    start = integer("start", start, minimum=1, maximum=int(ids.shape[1]) - 1) if ids.shape[1] > 1 else integer(
        "start", start, minimum=1, maximum=0)
    hidden = _layer_owner(model)(ids)
    return np.asarray(mx.argmax(head(model, hidden[:, start - 1: -1]), axis=-1)[0])


def first_departure(model: nn.Module, prompt: Sequence[int], tokens: Sequence[int]) -> int:
    """How many of ``tokens`` ``model``'s greedy decoding after ``prompt`` reproduces before
    its first different choice (teacher forcing: each choice given ``prompt`` and the tokens
    before it, as :func:`forced_choices` makes them).

    Through mlx-lm's KV cache in at most two passes: the prompt (whose last row gives the
    first choice), then, only where that choice agrees, the rest of ``tokens`` in one more
    pass. A model that leaves at the first step (a near tie there) costs the prompt's pass
    alone, not a pass over the whole sequence; the head runs only on the rows compared.
    """
    with _without_transformers_advice():
        from mlx_lm.models.cache import make_prompt_cache

    vocab = vocab_size(model)
    ids = token_ids("prompt", prompt, vocab)
    toks = token_ids("tokens", tokens, vocab)
    owner = _layer_owner(model)
    cache = make_prompt_cache(model)
    hidden = owner(mx.array(ids)[None], cache=cache)
    if int(mx.argmax(head(model, hidden[:, -1:]), axis=-1).item()) != int(toks[0]):
        return 0
    if toks.size == 1:
        return 1
    hidden = owner(mx.array(toks[:-1])[None], cache=cache)
    chosen = np.asarray(mx.argmax(head(model, hidden), axis=-1)[0])
    differs = np.nonzero(chosen != toks[1:])[0]
    return 1 + int(differs[0]) if differs.size else int(toks.size)


#: Streams :func:`first_departures` builds its passes on, one a weight set, made once a device
#: (MLX keeps a stream, and on a CPU its thread, for the life of the process).
_PASS_STREAMS: dict[str, list[mx.Stream]] = {}


def _pass_streams(n: int) -> list[mx.Stream]:
    device = mx.default_device()
    held = _PASS_STREAMS.setdefault(str(device), [])
    while len(held) < n:
        held.append(mx.new_stream(device))
    return held[:n]


def first_departures(model: nn.Module, prompt: Sequence[int], tokens: Sequence[int],
                     weight_sets: Sequence[Sequence[TailWeights | None]], *, backend: str = "graph") -> list[int]:
    """:func:`first_departure` of ``model`` with each of ``weight_sets`` swapped in
    (:func:`fused_tails`, ``backend``), one count a set.

    The sets' prompt passes are independent, so each is built on a stream of its own and
    all are evaluated together: MLX runs each CPU stream on a thread of its own, and its
    quantized products there are single-threaded, so on a CPU the passes share the cores
    instead of queueing on one (on a GPU the streams overlap on the device). The arithmetic
    is each stream's own, so every set's choices are the ones :func:`first_departure` makes.
    A set whose first choice agrees takes its second pass, over the rest of ``tokens``,
    afterwards on its own.
    """
    with _without_transformers_advice():
        from mlx_lm.models.cache import make_prompt_cache

    vocab = vocab_size(model)
    ids = token_ids("prompt", prompt, vocab)
    toks = token_ids("tokens", tokens, vocab)
    sets = [list(ws) for ws in weight_sets]
    if not sets:
        raise ValueError(f"weight_sets: must hold at least one set of TailWeights, got {describe(weight_sets)}")
    owner = _layer_owner(model)
    passes = []
    for ws, stream in zip(sets, _pass_streams(len(sets))):
        with fused_tails(model, ws, backend=backend), mx.stream(stream):
            cache = make_prompt_cache(model)
            hidden = owner(mx.array(ids)[None], cache=cache)
            passes.append((ws, cache, mx.argmax(head(model, hidden[:, -1:]), axis=-1)))
    mx.eval([first for _, _, first in passes])
    counts = []
    for ws, cache, first in passes:
        if int(first.item()) != int(toks[0]):
            counts.append(0)
        elif toks.size == 1:
            counts.append(1)
        else:
            with fused_tails(model, ws, backend=backend):
                hidden = owner(mx.array(toks[:-1])[None], cache=cache)
                chosen = np.asarray(mx.argmax(head(model, hidden), axis=-1)[0])
            differs = np.nonzero(chosen != toks[1:])[0]
            counts.append(1 + int(differs[0]) if differs.size else int(toks.size))
    return counts


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
    run at about a billion multiply-adds a second there), so the pass that starts the
    decoding is the one captured, not a second pass over the same tokens.
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
        with _without_transformers_advice():
            from mlx_lm.models.cache import make_prompt_cache

        self.n = integer("n", n, minimum=1)
        self.model, self.owner = model, _layer_owner(model)
        self.prompt = tuple(int(t) for t in token_ids("prompt", prompt, vocab_size(model)))
        self.ids = mx.array(self.prompt)[None]
        context = getattr(getattr(model, "args", None), "max_position_embeddings", None)
        if isinstance(context, int) and len(self.prompt) + self.n > context:
            raise ValueError(f"n: the prompt's {len(self.prompt)} tokens and {self.n} more exceed the model's context "
                             f"of {context} positions")
        self.cache = make_prompt_cache(model)
        self.capture = capture
        self.captures: list[LayerCapture] | None = None
        self.out: list[int] = []
        self.margins: list[float] = []
        self.second: list[int] = []
        self._collect: Callable[[], list[LayerCapture]] | None = None

    def build(self) -> tuple[mx.array, mx.array]:
        if self.capture and not self.out:
            with _tapped(self.model) as collect:
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


def _greedy(model: nn.Module, prompt: Sequence[int], n: int, *,
            capture: bool) -> tuple[Generation, list[LayerCapture] | None]:
    g = _Greedy(model, prompt, n, capture)
    for _ in range(g.n):
        logits, top = g.build()
        mx.eval(logits, top)
        g.take(logits, top)
    return g.generation(), g.captures


def greedy_beside(model: nn.Module, prompt: Sequence[int], n: int, weights: Sequence[TailWeights | None], *,
                  backend: str = "graph", capture: bool = False
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
    blocks, final = _fused_blocks(model, weights, backend)
    ref, var = _Greedy(model, prompt, n, capture), _Greedy(model, prompt, n, capture)
    s_ref, s_var = _pass_streams(2)
    for _ in range(ref.n):
        with mx.stream(s_ref):
            built_ref = ref.build()
        with _swapped_in(model, blocks, final), mx.stream(s_var):
            built_var = var.build()
        mx.eval(*built_ref, *built_var)
        ref.take(*built_ref)
        var.take(*built_var)
    return ref.generation(), var.generation(), ref.captures, var.captures
