"""The graph tail as a model's forward pass runs it: the five ops of ``tail_graph``, laid out for speed.

    out = residual + down(silu(gate n) * up n),   n = rms_norm(h),   h = residual + wo(branch)

:func:`model_graph_tail` computes the same map as ``workbench.tail.tail_graph`` (float32
activations, float32 accumulation, the stored weights' values exactly), with the weights
prepared ONCE when the tail is built rather than on every call: quantized scales and
half-precision matrices widened to float32, gate and up stacked into one matrix, the norm as
``mx.fast.rms_norm``, the whole traced once by ``mx.compile``. Each rule, and why, is in its
docstring, as is ``activations="stored"``, which gives up float32 activations for speed
where the weights are half precision. :func:`prepared_graph_tail` keeps the prepared tail
per weights object, so swapping a model's tails in again costs nothing.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import mlx.core as mx

from workbench.fold.rotation import FoldSite
from workbench.fold.weights import QuantizedBase, WeightMatrix, quantized_matmul
from workbench.kernels.launch import settle_constants
from workbench.kernels.next_norm import NextNorm, checked
from workbench.tail.paths import TailLaunch
from workbench.validate import describe

__all__ = ["TRACES", "ACTIVATIONS", "widen_scales", "model_graph_tail", "prepared_graph_tail", "stored_dtype"]

Base = mx.array | QuantizedBase


def _wide_base(base: Base) -> Base:
    """A base with its float16 / bfloat16 parts in float32 (the same values); fp4/fp8 scale
    codes (uint8) and float32 parts as they are."""
    if isinstance(base, QuantizedBase):
        if base.scales.dtype in (mx.uint8, mx.float32):
            return base
        return dataclasses.replace(
            base,
            scales=base.scales.astype(mx.float32),
            biases=None if base.biases is None else base.biases.astype(mx.float32),
        )
    return base if base.dtype == mx.float32 else base.astype(mx.float32)


def widen_scales(launch: TailLaunch) -> TailLaunch:
    """``launch`` with its quantized matrices' float16 / bfloat16 scales and biases widened to
    float32: the same map, exactly (see ``QuantizedBase.dequantize``). Dense matrices and
    folds are kept as they are."""
    if not isinstance(launch, TailLaunch):
        raise ValueError(f"launch: must be a TailLaunch (workbench.tail.tail_launch(weights)), got {describe(launch)}")

    def widen(m: WeightMatrix) -> WeightMatrix:
        base, fold = m.launch_parts()
        if not isinstance(base, QuantizedBase):
            return m
        return WeightMatrix(_wide_base(base), fold)

    return dataclasses.replace(
        launch, wo=widen(launch.wo), gate=widen(launch.gate), up=widen(launch.up), down=widen(launch.down)
    )


def _stacked(a: Base, b: Base) -> Base | None:
    """``a`` over ``b`` as one matrix (rows of ``a`` first), or ``None`` where their formats differ."""
    if isinstance(a, QuantizedBase) and isinstance(b, QuantizedBase):
        if (
            a.spec != b.spec
            or a.shape[1] != b.shape[1]
            or a.scales.dtype != b.scales.dtype
            or (a.biases is None) != (b.biases is None)
        ):
            return None
        return dataclasses.replace(
            a,
            w=mx.concatenate([a.w, b.w]),
            scales=mx.concatenate([a.scales, b.scales]),
            biases=None if a.biases is None else mx.concatenate([a.biases, b.biases]),
            shape=(a.shape[0] + b.shape[0], a.shape[1]),
        )
    if isinstance(a, mx.array) and isinstance(b, mx.array) and a.dtype == b.dtype and a.shape[1] == b.shape[1]:
        return mx.concatenate([a, b])
    return None


#: How a matrix is multiplied, without its arrays: ``("q", mode, bits, group_size, biased)``
#: for a quantized base, ``("dense",)`` for a dense one. Tails whose matrices have the same
#: forms (a model's layers) share one traced function (:func:`_shared_rows`).
Form = tuple


def _form(base: Base) -> Form:
    if isinstance(base, QuantizedBase):
        return ("q", base.spec.mode, base.spec.bits, base.spec.group_size, base.biases is not None)
    return ("dense",)


def _product(form: Form, x: mx.array, arrays: tuple[mx.array, ...]) -> mx.array:
    """``x @ base.T`` for float32 rows ``x`` [..., in] (at least 2-D: MLX 0.32.4's CUDA
    ``quantized_matmul`` fails on a 1-D input), the base given by its form and its
    :func:`_parameters`."""
    if form[0] == "q":
        w, s, b = arrays if form[4] else (*arrays, None)
        return quantized_matmul(x, w, s, b, group_size=form[3], bits=form[2], mode=form[1])
    return x @ arrays[0].T


def _parameters(base: Base) -> list[mx.array]:
    if isinstance(base, QuantizedBase):
        return [a for a in (base.w, base.scales, base.biases) if a is not None]
    return [base]


def _rows(
    forms: tuple[Form, ...],
    counts: tuple[int, ...],
    ffn: int,
    eps: float,
    next_eps: float | None,
    fold: Any,
    act: Any = mx.float32,
) -> Callable[..., Any]:
    """The tail as a function of ``(branch, residual, *params)``: ``params`` each matrix's
    :func:`_parameters` (wo, then gate_up or gate and up, then down; ``counts`` arrays
    each), the FFN norm's weight, and the next norm's weight where ``next_eps`` is given.
    Every activation is ``act`` (float32, or the weights' half dtype: :func:`model_graph_tail`)."""
    bounds = [sum(counts[:i]) for i in range(len(counts) + 1)]
    stacked = len(forms) == 3  # wo, gate_up, down; else wo, gate, up, down

    def rows(branch: mx.array, residual: mx.array, *params: mx.array) -> Any:
        mats = [params[bounds[i] : bounds[i + 1]] for i in range(len(forms))]
        norm = params[bounds[-1]]
        x = branch.astype(act)
        if fold is not None and fold.site is FoldSite.INPUT:
            x = fold.rotate(x)
        projected = _product(forms[0], x, mats[0])
        if fold is not None and fold.site is FoldSite.OUTPUT:
            projected = fold.unrotate(projected)
        h = residual.astype(act) + projected
        n = mx.fast.rms_norm(h, norm, eps)
        if stacked:
            y = _product(forms[1], n, mats[1])
            g, u = mx.split(y, [ffn], axis=-1)  # one op with two views; two slices would be two ops
        else:
            g, u = _product(forms[1], n, mats[1]), _product(forms[2], n, mats[2])
        out = h + _product(forms[-1], (g * mx.sigmoid(g)) * u, mats[-1])
        if next_eps is None:
            return out
        return out, mx.fast.rms_norm(out, params[bounds[-1] + 1], next_eps)

    return rows


@lru_cache(maxsize=256)
def _shared_rows(
    forms: tuple[Form, ...],
    counts: tuple[int, ...],
    ffn: int,
    eps: float,
    next_eps: float | None,
    act: Any = mx.float32,
) -> Callable[..., Any]:
    """:func:`_rows` of one form (no fold) traced by ``mx.compile``, ONE function for every tail
    of that form: a model's layers share their shapes, so it is traced once and each layer's
    call finds the trace in MLX's compile cache. A compiled function a tail with its weights
    captured (``trace="per-layer"``) cost the same host time a call on the H200 and never
    made a decode faster (``real_model-nvidia-h200-20261203T123708Z``, ``…124438Z``)."""
    return mx.compile(_rows(forms, counts, ffn, eps, next_eps, None, act))


#: The activations' dtype a graph tail computes in (:func:`model_graph_tail`): ``"float32"``,
#: or ``"stored"``, the weights' own float dtype (:func:`stored_dtype`).
ACTIVATIONS = ("float32", "stored")


def _float_dtype(base: Base) -> Any:
    dt = base.scales.dtype if isinstance(base, QuantizedBase) else base.dtype
    return dt if dt in (mx.bfloat16, mx.float16) else mx.float32


def stored_dtype(launch: TailLaunch) -> Any:
    """The float dtype ``launch``'s weights are stored in, which a model built on them keeps
    its activations in (mlx-lm): a dense matrix's dtype, a quantized one's scales' (bfloat16
    or float16; float32 for anything else, such as fp4's 8-bit scale codes). ValueError where
    the four matrices differ (no one dtype fits every product)."""
    if not isinstance(launch, TailLaunch):
        raise ValueError(f"launch: must be a TailLaunch (workbench.tail.tail_launch(weights)), got {describe(launch)}")
    found = {str(_float_dtype(m.launch_parts()[0])) for m in (launch.wo, launch.gate, launch.up, launch.down)}
    if len(found) != 1:
        raise ValueError(f"activations: 'stored' needs one float dtype in all four matrices, got {sorted(found)}")
    return _float_dtype(launch.wo.launch_parts()[0])


#: What a compiled graph tail's traced function takes (as ``one_launch.TRACES``): ``"shared"``,
#: the weights as inputs, one trace for every tail of the same form; ``"per-layer"``, a tail's
#: own trace with its weights captured in it.
TRACES = ("shared", "per-layer")


def model_graph_tail(
    launch: TailLaunch,
    *,
    stack_gate_up: bool = True,
    compiled: bool = True,
    next_norm: NextNorm | None = None,
    trace: str = "shared",
    activations: str = "float32",
) -> Callable[[mx.array, mx.array], Any]:
    """The graph tail of ``launch`` as a lazy, compiled function of ``(branch, residual)``:
    float32 ``mx.array`` of shape ``[branch]`` / ``[hidden]`` (one position) or
    ``[..., branch]`` / ``[..., hidden]`` (positions on any leading axes, as a model's block
    holds them: ``[batch, tokens, width]`` goes in without a reshape) to float32 ``[hidden]`` /
    ``[..., hidden]``.

    Weights are prepared here, once (each rule, and why, below): scales and half-precision matrices
    widened to float32, gate and up stacked (``stack_gate_up``), all evaluated now; the
    compiled function takes them as inputs and is shared by every tail of the same form
    (:func:`_shared_rows`; with a fold, the tail's own); ``compiled=False`` leaves the ops as they are
    (each its own kernel), to see what the tracing buys on a device. wo's fold, if any, is applied as
    ``HadamardFold`` applies it (INPUT: rotate the branch; OUTPUT: unrotate wo's output).
    ``next_norm``: the norm the output goes into next (``workbench.kernels.next_norm``),
    computed in the same compiled call; the tail then returns ``(out, normed)``.
    ``trace`` (:data:`TRACES`): ``"per-layer"`` traces this tail's own function of the two
    activations, its weights captured as constants (a fold's tail always has its own).
    ``activations`` (:data:`ACTIVATIONS`): ``"stored"`` computes in the weights' own float
    dtype (:func:`stored_dtype`: nothing widened, the output in that dtype; its error cost is
    below), ``"float32"`` (the default) as described above.

    The preparation, each rule and why:

    * **Quantized scales and biases widened to float32** (:func:`widen_scales`). Exact: the
      map ``scale * q + bias`` is formed in float32 by ``mx.quantized_matmul`` either way (a
      float16 scale times a 4- or 8-bit code needs at most 16 significant bits). With
      float32 activations and float16 scales MLX converts the scales and biases on every call:
      about a tenth of a SmolLM2 tail on the CPU, and on a GPU extra kernels a tail. mlx-lm
      widens them the same way when it loads the checkpoint (``mlx_lm_model.reference_model``).
    * **Half-precision dense matrices widened to float32 once.** Exact (float16 and bfloat16
      are subsets of float32). Otherwise ``x @ W.astype(float32).T`` converts the whole matrix
      on every call, reading and writing 3x its bytes before the product reads them again. Cost:
      twice the memory of a half-precision matrix.
    * **gate and up stacked into one matrix** (same format only): one matrix product instead of
      two, which is one kernel launch fewer a tail on a GPU. Each output row is the same dot
      product over the same weights, so the map is the same. The product is cut in two by one
      ``mx.split`` (one op, two views of its buffer), not two slices: in a small model's decode
      each op in the graph is host work (``bench.real_model``'s ops a step).
    * **The norm as ``mx.fast.rms_norm``**: one kernel on a GPU where the formula written out is a
      reduction and element-wise ops; it accumulates in float32, as the formula does.
    * **Traced once by ``mx.compile``**, so the element-wise ops (the adds, silu times up) fuse;
      the weights are the traced function's inputs, and tails of one form share it.

    On a GPU, "float32" means what MLX's products give there: with MLX's default
    (``MLX_ENABLE_TF32`` unset) a product of more than one row runs at TF32-class precision, about
    1e-3 off at these widths (five times the 2e-4 criterion, on the H200); one row, a decode step,
    is float32 either way. ``workbench.backends.reduced_float32_products`` says which holds;
    ``MLX_ENABLE_TF32=0`` before the first product makes every row float32.

    Activations stay float32 by default: the dtype ``reference_model`` gives SmolLM2's activations
    (mlx-lm's own layers then run in float32 too), and the dtype the kernels accumulate in. Rounding
    the normed vector to bfloat16 instead put a tail 1.5e-2 off the float64 truth (``tail.ops``), 75
    times frink-models' 2e-4, so a bfloat16 model's block converts to float32 around the tail.

    ``activations="stored"`` is the other choice, for speed where the weights are half precision:
    the activations in the weights' own float dtype (a dense matrix's, a quantized one's scales'),
    as mlx-lm keeps a bfloat16 or float16 model's. Nothing is widened then, so each product reads
    the stored bytes and no float32 copy (at Bonsai-27B's shape the float32 tail reads a bfloat16
    matrix's copy, twice its bytes). The products and the norm still accumulate in float32 inside
    MLX's kernels, but every activation between them is rounded to half precision: the error cost
    of mlx-lm's own ops, many times frink-models' 2e-4 (``bench.real_model`` reports it beside the
    float32 tail's, ``worst vs f64``).
    """
    if not isinstance(launch, TailLaunch):
        raise ValueError(f"launch: must be a TailLaunch (workbench.tail.tail_launch(weights)), got {describe(launch)}")
    for name, flag in (("stack_gate_up", stack_gate_up), ("compiled", compiled)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}: must be True or False, got {describe(flag)}")
    if trace not in TRACES:
        raise ValueError(f"trace: must be one of {TRACES}, got {describe(trace)}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations: must be one of {ACTIVATIONS}, got {describe(activations)}")
    next_norm = checked(next_norm, int(launch.ffn_norm.shape[0]))
    act = mx.float32 if activations == "float32" else stored_dtype(launch)
    keep = act != mx.float32  # half-precision activations read the weights as stored
    fold = launch.fold  # launch.wo is the stored base alone; the launch carries its rotation
    wide = (lambda base: base) if keep else _wide_base
    wo = wide(launch.wo.launch_parts()[0])
    gate, up, down = (wide(m.launch_parts()[0]) for m in (launch.gate, launch.up, launch.down))
    ffn = int(launch.gate.shape[0])
    gate_up = _stacked(gate, up) if stack_gate_up else None
    norm = launch.ffn_norm.astype(act)
    eps = float(launch.eps)
    prepared = [wo, *([gate_up] if gate_up is not None else [gate, up]), down]
    next_w = None if next_norm is None else mx.array(next_norm.weight).astype(act)
    next_eps = None if next_norm is None else next_norm.eps
    params = [a for base in prepared for a in _parameters(base)] + [norm] + ([] if next_w is None else [next_w])
    settle_constants(*params)  # evaluated once, here, not inside every call's graph
    forms = tuple(_form(b) for b in prepared)
    counts = tuple(len(_parameters(b)) for b in prepared)
    if fold is None and compiled and trace == "shared":
        body_of = _shared_rows(forms, counts, ffn, eps, next_eps, act)

        def body(branch: mx.array, residual: mx.array) -> Any:
            return body_of(branch, residual, *params)
    else:  # a fold's rotation carries arrays of its own: this tail's function alone
        rows = _rows(forms, counts, ffn, eps, next_eps, fold, act)
        if compiled:  # the weights captured: the traced function takes the activations alone
            body = mx.compile(lambda branch, residual: rows(branch, residual, *params))
        else:

            def body(branch: mx.array, residual: mx.array) -> Any:
                return rows(branch, residual, *params)

    def tail(branch: mx.array, residual: mx.array) -> Any:
        if branch.ndim == 1:  # a reshape is a view; an index ([0]) would be a gather kernel on a GPU
            got = body(branch.reshape(1, -1), residual.reshape(1, -1))
            return tuple(a.reshape(-1) for a in got) if isinstance(got, tuple) else got.reshape(-1)
        return body(branch, residual)

    return tail


#: The model graph tails :func:`prepared_graph_tail` made, per weights object (held weakly:
#: they live as long as the weights do) and next norm.
_PREPARED: weakref.WeakKeyDictionary[Any, dict[Any, Callable[[mx.array, mx.array], Any]]] = weakref.WeakKeyDictionary()


def prepared_graph_tail(
    launch: TailLaunch, next_norm: NextNorm | None = None, trace: str = "shared"
) -> Callable[[mx.array, mx.array], Any]:
    """:func:`model_graph_tail` of ``launch`` (with ``next_norm``, traced as ``trace``), made
    once per weights object, next norm and trace.

    Preparing widens and stacks the weights, and ``mx.compile`` traces the tail once per
    input shape: done again each time a model's tails are swapped in, a decode's first step
    would pay 30 traces. Kept per weights object, as the kernels' prepared tails are
    (``workbench.kernels.launch.prepared``), the swap costs nothing the second time."""
    if not isinstance(launch, TailLaunch):
        raise ValueError(f"launch: must be a TailLaunch (workbench.tail.tail_launch(weights)), got {describe(launch)}")
    if trace not in TRACES:
        raise ValueError(f"trace: must be one of {TRACES}, got {describe(trace)}")
    per = _PREPARED.setdefault(launch.weights, {})
    key = (None if next_norm is None else next_norm.key, trace)
    fn = per.get(key)
    if fn is None:
        fn = per[key] = model_graph_tail(launch, next_norm=next_norm, trace=trace)
    return fn
