"""The three tails: the oracle, the engine before the fusion, and fused.

* :func:`host_tail` -- the oracle, op by op in numpy, the five ops frink-models' test
  composes (wo with its rotation, residual add, RMS norm, SwiGLU FFN, residual add).
  float64 is the truth; float32 is "the host";
* :func:`unfused_tail` -- the engine before the fusion: two MLX submissions, two waits;
* :func:`fused_tail` -- one submission: ``backend="graph"`` (MLX ops, any MLX device), or
  ``"metal"`` / ``"cuda"`` / ``"metal-emulated"``, the kernels through their one door
  (``workbench.kernels.run``). Every backend goes through ONE launch builder,
  :func:`tail_launch` (the kernels' contract, ``workbench.kernels.contract.TailLaunch``,
  re-exported here), which asks the refusal rules first, as the engine's ``attn_tail_launch`` does.

``branch`` is the attention output BEFORE ``wo`` (for a gated attention, after its output
gate); frink-models 0.48.0 runs this tail in one Metal submission instead of two.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from workbench import backends, validate
from workbench.fold.rotation import FoldSite
from workbench.fold.weights import WeightMatrix
from workbench.kernels.contract import TailLaunch
from workbench.kernels.tuning import KernelTuning, checked_tuning
from workbench.models import config as model
from workbench.models import refusals
from workbench.tail.ops import rms_norm_np, tail_mx, tail_np
from workbench.tail.weights import TailRefused, TailWeights

# ---------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------


def check_inputs(w: TailWeights, branch: Any, residual: Any) -> tuple[Any, Any]:
    """Validate shapes (and that they are float arrays); return them unchanged in kind.

    Non-finite values are NOT rejected: the tails propagate them as IEEE arithmetic does
    (see :func:`host_tail`), because checking would cost the fused path a host read, the
    very wait it exists to save. :func:`compare` fails any NaN.
    """
    if type(w) is TailWeights and type(branch) is np.ndarray and type(residual) is np.ndarray:
        # The oracle's usual call, checked in a few comparisons (the full checks below give
        # the same verdict; they cost more than the tail itself at the test shape).
        hidden, bdim, _ = w.shape
        bs, rs = branch.shape, residual.shape
        if (
            branch.dtype.kind == "f"
            and residual.dtype.kind == "f"
            and bs
            and rs
            and bs[-1] == bdim
            and rs[-1] == hidden
            and bs[:-1] == rs[:-1]
        ):
            return branch, residual
    if not isinstance(w, TailWeights):
        raise ValueError(f"w: must be TailWeights, got {validate.describe(w)}")
    hidden, bdim, _ = w.shape

    def arr(name: str, a: Any) -> Any:
        if type(a) is np.ndarray and a.dtype.kind == "f":  # the common case, checked in one test
            return a
        if isinstance(a, mx.array):
            if not mx.issubdtype(a.dtype, mx.floating):
                raise ValueError(f"{name}: must be a float array, got {validate.describe(a)}")
            return a
        try:
            a = np.asarray(a)
        except Exception:  # a ragged list
            raise ValueError(f"{name}: must be a float array, got {validate.describe(a)}") from None
        if not np.issubdtype(a.dtype, np.floating):
            raise ValueError(f"{name}: must be a float array, got {validate.describe(a)}")
        return a

    branch, residual = arr("branch", branch), arr("residual", residual)
    if branch.ndim < 1 or branch.shape[-1] != bdim:
        raise ValueError(f"branch: must have last axis {bdim} (wo's in dimension), got shape {tuple(branch.shape)}")
    if residual.ndim < 1 or residual.shape[-1] != hidden:
        raise ValueError(f"residual: must have last axis {hidden} (hidden), got shape {tuple(residual.shape)}")
    if tuple(branch.shape[:-1]) != tuple(residual.shape[:-1]):
        raise ValueError(
            f"branch/residual: must have the same leading (batch) axes, got {tuple(branch.shape[:-1])} "
            f"and {tuple(residual.shape[:-1])}"
        )
    return branch, residual


def _empty_batch(branch: Any, hidden: int) -> np.ndarray | None:
    """The float32 result of a tail over an EMPTY batch (a leading axis of length 0), else None.

    All three tails answer an empty batch with an empty result of shape ``(..., 0, ..., hidden)``
    without submitting anything: MLX refuses empty arrays in ``hadamard_transform``, and
    there is nothing to compute. ``host_tail`` gives the same shape in its dtype.
    """
    lead = tuple(branch.shape[:-1])
    return np.zeros(lead + (hidden,), dtype=np.float32) if 0 in lead else None


# ---------------------------------------------------------------------------------------
# The three tails
# ---------------------------------------------------------------------------------------


def host_tail(w: TailWeights, branch: Any, residual: Any, *, dtype: Any = np.float64) -> np.ndarray:
    """The oracle: the five ops in numpy, in ``dtype`` throughout (float64: the truth).

    Leading batch axes on ``branch`` / ``residual`` are kept. Reads nothing from MLX once
    the weights' host copies exist (:meth:`TailWeights.host_arrays`).

    Non-finite inputs propagate: a NaN or Inf anywhere in ``branch`` reaches every element
    of wo's output (a matvec mixes all of them), and one in ``residual`` reaches the norm's
    mean, so the whole output row is NaN (Inf times rsqrt(Inf) = Inf * 0 = NaN). The fused
    and unfused tails do the same; :func:`compare` reports it as a failure.
    """
    branch, residual = check_inputs(w, branch, residual)
    dt = dtype if dtype is np.float64 else validate.float_dtype("dtype", dtype)  # the default needs no check
    # An MLX input (bfloat16 included, which numpy has no type for) is read as the fused tail reads it.
    if type(branch) is not np.ndarray:
        branch = validate.float_array("branch", branch)
    if type(residual) is not np.ndarray:
        residual = validate.float_array("residual", residual)
    # Every dtype reads the float64 host copies (the truth's, cached): tail_np casts each
    # matrix to the activations' dtype for its own product, so a float32 host tail holds one
    # float32 matrix at a time, not a second set of weights. The stored values are float32
    # or narrower, so the cast is exact: the same matrices as a float32 copy of the base.
    wo, norm, gate, up, down = w.host_arrays(np.float64)
    if dt != np.float64:
        norm = w.ffn_norm.astype(dt, copy=False)
    # copy=False: tail_np never writes to its inputs, so a float64 input needs no copy.
    ffn_folds = (w.gate.fold, w.up.fold, w.down.fold)
    return tail_np(
        wo,
        w.wo.fold,
        norm,
        gate,
        up,
        down,
        w.eps,
        branch.astype(dt, copy=False),
        residual.astype(dt, copy=False),
        ffn_folds=None if ffn_folds == (None, None, None) else ffn_folds,
    )


def to_mx(a: Any) -> mx.array:
    """An activation as a float32 ``mx.array`` (numpy is copied in; MLX is cast, lazily)."""
    if isinstance(a, mx.array):
        if not (mx.issubdtype(a.dtype, mx.floating) or mx.issubdtype(a.dtype, mx.integer)):
            raise ValueError(f"a: must be an array of real numbers, got {validate.describe(a)}")
        return a.astype(mx.float32)
    return mx.array(validate.float_array("a", a).astype(np.float32))


def unfused_tail(w: TailWeights, branch: Any, residual: Any) -> np.ndarray:
    """The engine before the fusion: TWO submissions, two waits.

    1. ``wo`` (with its rotation) as one MLX submission; its result read back (wait 1).
    2. On the host, in float32: ``h = residual + projected``, ``rms_norm(h)``.
    3. The SwiGLU FFN as a second MLX submission; read back (wait 2).
    4. On the host: ``h + ffn``.

    Returns float32 numpy with the inputs' batch axes. Refuses nothing: this is the path
    every layer can take.
    """
    branch, residual = check_inputs(w, branch, residual)
    empty = _empty_batch(branch, w.shape[0])
    if empty is not None:
        return empty
    projected = np.asarray(w.wo.apply(to_mx(branch)))  # submission 1, and its wait
    h = validate.float_array("residual", residual).astype(np.float32) + projected
    normed = rms_norm_np(h, w.ffn_norm, w.eps).astype(np.float32)
    nx = mx.array(normed)
    g = w.gate.apply(nx)
    ffn = np.asarray(w.down.apply((g * mx.sigmoid(g)) * w.up.apply(nx)))  # submission 2, and its wait
    return h + ffn


def tail_refusals(w: TailWeights, *, kernels_enabled: bool = True) -> list:
    """Every ``Refusal`` the rules find for the layer ``w`` stands for (empty: it fuses).

    The ONE body (``workbench.models.refusals.layer_refusals``) that the launch builder asks too, so
    the two cannot disagree. Bare weights (``config is None``) are a plain GQA layer with
    a dense SwiGLU FFN; they are asked about as such, not waved through.
    """
    if w.config is None:
        hidden, branch, ffn = w.shape
        cfg = model.ModelConfig.synthetic(
            hidden, ffn_dim=ffn, num_q_heads=1, num_kv_heads=1, head_dim=branch, rms_norm_eps=w.eps
        )
        layer = 0
    else:
        cfg, layer = w.config, int(w.layer)
    return list(refusals.layer_refusals(cfg, layer, kernels_enabled=kernels_enabled))


def tail_launch(w: TailWeights, *, kernels_enabled: bool = True) -> TailLaunch:
    """The launch for ``w``'s tail, or :class:`TailRefused` with every reason.

    Asks the refusal body FIRST, then assembles wo's parts, the fold plan for its width
    (which raises if the fold does not fit) and the FFN parts.
    """
    if not isinstance(w, TailWeights):
        raise ValueError(f"w: must be TailWeights, got {validate.describe(w)}")
    kernels_enabled = validate.flag("kernels_enabled", kernels_enabled)
    found = tail_refusals(w, kernels_enabled=kernels_enabled)
    if found:
        where = "a plain layer" if w.config is None else f"{getattr(w.config, 'name', 'the model')} layer {w.layer}"
        raise TailRefused(found, where)
    base, fold = w.wo.launch_parts()
    plan = None
    if fold is not None:
        hidden, branch, _ = w.shape
        plan = fold.plan(branch if fold.site is FoldSite.INPUT else hidden)
    return TailLaunch(w, WeightMatrix(base), fold, plan, w.mx_norm(), w.eps, w.gate, w.up, w.down)


def tail_graph(launch: TailLaunch, branch: mx.array, residual: mx.array) -> mx.array:
    """The fused tail as one lazy MLX graph from a launch (the ``"graph"`` backend's body)."""
    return tail_mx(
        launch.wo, launch.fold, launch.ffn_norm, launch.gate, launch.up, launch.down, launch.eps, branch, residual
    )


def fused_tail(
    w: TailWeights,
    branch: Any,
    residual: Any,
    *,
    backend: str = "auto",
    return_backend: bool = False,
    kernels_enabled: bool = True,
    tuning: KernelTuning | None = None,
    shape: Any = None,
) -> np.ndarray | tuple[np.ndarray, str]:
    """The tail in ONE submission; float32 numpy out, with the inputs' batch axes.

    ``backend``: ``"graph"`` (the whole tail as MLX ops, evaluated once, on MLX's
    default device), ``"metal"`` / ``"cuda"`` (the kernels; ``BackendUnavailable`` says
    what is missing when they cannot run here), or ``"auto"`` (the best available; with
    ``return_backend=True`` you get ``(out, name)`` to see which it picked). Metal runs
    the three launches in one submission, as frink-models does; CUDA runs the tail as ONE
    launch (``workbench.kernels.one_launch``: the three bodies as phases between grid barriers),
    or the three where that launch's shared memory does not fit.

    Raises :class:`TailRefused` (with every reason) for a layer the rules refuse, before
    anything is built or run; ``kernels_enabled=False`` is the engine's first rule (the
    engine's dense kernels switched off), so it refuses every layer.

    ``tuning`` (a ``workbench.kernels.tuning.KernelTuning``) and ``shape`` (the CUDA one
    launch's ``workbench.kernels.one_launch_shape.OneLaunchShape``): how the kernel backends
    launch, None for their defaults; they never change a result, only its speed.
    """
    name = backends.resolve_backend(validate.one_of("backend", backend, backends.BACKENDS))
    tuning = checked_tuning(tuning) if tuning is not None else None
    return_backend = validate.flag("return_backend", return_backend)
    branch, residual = check_inputs(w, branch, residual)
    # Every backend computes in float32; a float64 value beyond float32's range would become
    # an inf no later check tells from the caller's own (the cast happens on the host anyway).
    if isinstance(branch, np.ndarray) and branch.dtype.itemsize > 4:
        branch = validate.as_float32("branch", branch, copy=False)
    if isinstance(residual, np.ndarray) and residual.dtype.itemsize > 4:
        residual = validate.as_float32("residual", residual, copy=False)
    launch = tail_launch(w, kernels_enabled=kernels_enabled)
    empty = _empty_batch(branch, w.shape[0])
    if empty is not None:
        result = empty
    elif name == "graph":
        out = tail_graph(launch, to_mx(branch), to_mx(residual))
        mx.eval(out)  # the one submission
        result = np.asarray(out)  # already evaluated: reading it waits on nothing more
    else:
        # The kernels' door is imported by the backends that run them, so the oracle and
        # the graph tail (most callers) do not pay for it.
        from workbench.kernels import run as kernel_run

        result = kernel_run.run_tail(name, launch, branch, residual, tuning=tuning, shape=shape)
    return (result, name) if return_backend else result
