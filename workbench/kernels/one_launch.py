"""The fused tail as ONE CUDA launch: the three tail kernels' phases between grid barriers.

It is what ``fused_tail(backend="cuda")`` runs (``workbench.kernels.run.run_cuda_tail``, the
door, in the shape ``one_launch_shape.shape_for`` gives each weight format unless the caller
passes one). ``workbench.kernels.launch.PreparedTail`` encodes a tail as three launches
(wo_residual, ffn_gate_up, ffn_down) in one evaluation, and MLX's cost per custom kernel
dominates a small tail (docs/JOURNAL.md, "The rotation in registers, and what bounds each
launch"). So :class:`OneLaunchTail` runs the same three bodies as the phases of ONE kernel
(``kernels/tail_one_launch.body``, composed by ``kernel_source.compose_one_launch``): every
group does its share of wo, waits at a grid-wide barrier until all of h exists, does its share
of gate/up, waits again, then its rows of down. A grid barrier is safe only under the rules
:class:`OneLaunchTail` enforces. Metal has no forward-progress promise between threadgroups,
so there is no Metal one-launch tail: the Metal path keeps its three dispatches in one
submission, as frink-models does.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import backends, validate
from workbench.kernels import cuda_device
from workbench.kernels import source as kernel_source
from workbench.kernels.contract import TailLaunch
from workbench.kernels.launch import PreparedTail, as_mx32, prepared, settle_constants
from workbench.kernels.matrices import threadgroup_bytes, units_for
from workbench.kernels.next_norm import NextNorm, checked
from workbench.kernels.one_launch_shape import (
    DEFAULT_NT,
    FOUR_BIT_NT,
    FOUR_BIT_ROW_UNITS,
    OneLaunchShape,
    checked_shape,
    groups_for,
    shape_for,
    shape_for_formats,
)
from workbench.kernels.tuning import KernelTuning

#: The one launch's names, and its shape policy's (``one_launch_shape``), read with the launch it shapes.
__all__ = [
    "BARRIER_LIMIT_MS",
    "CHOICE_MARGIN",
    "MAX_BARRIER_LIMIT_MS",
    "SANITIZER_BARRIER_LIMIT_MS",
    "STATIC_SHARED_LIMIT",
    "TRACES",
    "GridBarrierTimeout",
    "OneLaunchTail",
    "fits",
    "for_launch",
    "launch_template",
    "static_shared_bytes",
    "sync_at",
    "DEFAULT_NT",
    "FOUR_BIT_NT",
    "FOUR_BIT_ROW_UNITS",
    "OneLaunchShape",
    "checked_shape",
    "groups_for",
    "shape_for",
    "shape_for_formats",
]

#: CUDA's limit on a kernel's static shared memory; the three phases' group memory is
#: declared side by side (each phase's arrays in its own scope), so their sum must fit.
STATIC_SHARED_LIMIT = 48 * 1024

#: How long a grid barrier waits before it gives up (ms), by default: no barrier of an
#: uninstrumented launch legitimately waits this long (a phase takes well under a
#: millisecond at Bonsai-27B's size). Instrumented launches are another matter (under
#: compute-sanitizer a barrier can wait seconds), so ``bench.sanitize`` passes
#: :data:`SANITIZER_BARRIER_LIMIT_MS` through ``OneLaunchTail(barrier_limit_ms=...)``.
BARRIER_LIMIT_MS = 4000

#: The barrier limit for launches under compute-sanitizer: ten minutes, far above any
#: instrumented phase seen (seconds), yet a real hang still ends as an error, not a stuck run.
SANITIZER_BARRIER_LIMIT_MS = 600_000

#: The largest barrier limit a template value can carry here (one hour, in ms).
MAX_BARRIER_LIMIT_MS = 3_600_000


#: How much faster than the default a swept variant must be (a fraction of the default's
#: device time) for ``python -m bench.one_launch`` to choose it: the same variant's device
#: time moves by up to 8% between two machine starts, so a smaller gain in one sweep is not
#: a finding (docs/JOURNAL.md).
CHOICE_MARGIN = 0.08


#: What :meth:`OneLaunchTail.compiled`'s traced function takes: ``"shared"``, every array
#: as an input, one trace for every launch of the same form; ``"per-layer"``, a launch's own
#: trace with its weights captured in it.
TRACES = ("shared", "per-layer")


class GridBarrierTimeout(RuntimeError):
    """A one-launch tail's grid barrier waited too long: not every group was resident."""


@lru_cache(maxsize=16)
def _kernel(kernel_dir: Path | None = None, compact: bool = True, next_norm: bool = False) -> Any:
    """The one launch's MLX kernel, composed from ``kernel_dir`` (None: the repository's
    ``kernels/``), under a name of its own for another folder (``bench.kernel_bodies``
    runs an older folder's beside the current one). ``compact``: the header handed to MLX
    as an include of a file and the source without comments (``kernel_source.cuda_launch_text``:
    the same code; MLX hashes the whole text on every launch), else the text as composed,
    comments and all. ``next_norm``: with the epilogue that also writes the next layer's
    input norm (``kernels/next_norm.body``; a second output, ``nxt``)."""
    header, source = kernel_source.compose_one_launch(kernel_dir=kernel_dir, next_norm=next_norm)
    if compact:
        header, source = kernel_source.cuda_launch_text(header, source)
    return mx.fast.cuda_kernel(
        name=kernel_source.one_launch_mlx_name(kernel_dir=kernel_dir, next_norm=next_norm),
        input_names=list(kernel_source.one_launch_inputs(next_norm=next_norm)),
        output_names=list(kernel_source.one_launch_outputs(next_norm=next_norm)),
        source=source,
        header=header,
        ensure_row_contiguous=True,
    )


def _phase_templates(prep: PreparedTail, shape: OneLaunchShape) -> dict[str, dict[str, Any]]:
    """Each phase's template values as its own launch would take them (``prep.templates()``),
    with the one launch's group size (NT) and down's rows a group from ``shape``."""
    phases = {k: dict(v, NT=shape.nt) for k, v in prep.templates().items()}
    if shape.row_units is not None:
        phases["wo_residual"]["U"] = units_for(prep.wo.fmt, shape.row_units)
        phases["ffn_gate_up"]["U"] = units_for(prep.gate.fmt, shape.row_units)
    # down's units in flight a thread, u_down, shared by its DR rows (as PreparedTail.templates)
    phases["ffn_down"].update(
        DR=shape.down_rows, U=max(1, units_for(prep.down.fmt, prep.tuning.u_down) // shape.down_rows)
    )
    return phases


def static_shared_bytes(prep: PreparedTail, shape: OneLaunchShape, next_norm: bool = False) -> int:
    """The one launch's static shared memory: the three phases' group memory side by side
    (as ``matrices.threadgroup_bytes`` lays out each), the barrier's and the end's words,
    and with ``next_norm`` the epilogue's sum (a float a warp)."""
    phases = _phase_templates(prep, shape)
    epilogue = 4 * (shape.nt // 32) if next_norm else 0
    return sum(threadgroup_bytes(k, phases[k]) for k in kernel_source.TAIL_KERNELS) + 16 + epilogue


def sync_at(prep: PreparedTail) -> int:
    """Where the barrier counter sits in ``work`` (floats): after h and act, on a 128-byte
    line of its own (the failure flag 32 words on, on the next)."""
    return -(-(prep.hidden + prep.ffn) // 32) * 32


def launch_template(
    prep: PreparedTail, shape: OneLaunchShape, barrier_limit_ms: int = BARRIER_LIMIT_MS
) -> list[tuple[str, Any]]:
    """The one launch's template values (``kernel_source.one_launch_template``'s names):
    each phase's values as its own launch would take them (``prep.templates()``), down's
    rows a group from ``shape``, NT = ``shape.nt`` for every phase, and how long a barrier
    waits (``barrier_limit_ms``). Dialect-free, so it can be computed (and the CUDA text
    compiled with nvcc) from any prepared tail."""
    _check_barrier_limit(barrier_limit_ms)
    phases = _phase_templates(prep, shape)
    template: list[tuple[str, Any]] = [
        ("NT", shape.nt),
        ("HID", prep.hidden),
        ("FFN", prep.ffn),
        ("SYNC_AT", sync_at(prep)),
        ("BARRIER_LIMIT_MS", int(barrier_limit_ms)),
    ]
    for kernel, prefix in kernel_source.ONE_LAUNCH_PHASES:
        template += [(prefix + k, v) for k, v in phases[kernel].items() if k != "NT"]
    return template


def _check_barrier_limit(barrier_limit_ms: Any) -> None:
    if (
        isinstance(barrier_limit_ms, bool)
        or not isinstance(barrier_limit_ms, (int, np.integer))
        or not 1 <= barrier_limit_ms <= MAX_BARRIER_LIMIT_MS
    ):
        raise ValueError(
            f"barrier_limit_ms must be an integer from 1 to {MAX_BARRIER_LIMIT_MS} (ms); "
            f"got {validate.describe(barrier_limit_ms)}"
        )


def _call_kernel(
    kernel: Any,
    inputs: list[mx.array],
    next_norm: bool,
    template: tuple | list,
    groups: int,
    nt: int,
    verbose: bool = False,
) -> mx.array | tuple[mx.array, mx.array]:
    """The one launch of ``kernel`` on ``inputs`` (``one_launch_inputs``' order): ``out``, or
    ``(out, nxt)`` with the next norm. The outputs take the residual's shape: the kernel
    reads and writes flat rows, so a model's [1, 1, hidden] goes in and comes out as it is,
    with no reshape op either side."""
    shape = inputs[kernel_source.one_launch_inputs(next_norm=next_norm).index("residual")].shape
    n_out = 2 if next_norm else 1
    outs = kernel(
        inputs=inputs,
        template=list(template),
        grid=(groups * nt, 1, 1),
        threadgroup=(nt, 1, 1),
        output_shapes=[shape] * n_out,
        output_dtypes=[mx.float32] * n_out,
        verbose=verbose,
    )
    return (outs[0], outs[1]) if next_norm else outs[0]


@lru_cache(maxsize=64)
def _shared_trace(kernel: Any, next_norm: bool, template: tuple, groups: int, nt: int) -> Any:
    """:func:`_call_kernel` for one form of launch (its MLX kernel object, next norm, template
    values, grid) as ONE ``mx.compile``-d function of all its inputs, shared by every tail
    of that form (``OneLaunchTail.compiled``)."""
    return mx.compile(lambda *arrays: _call_kernel(kernel, list(arrays), next_norm, template, groups, nt))


class OneLaunchTail:
    """A prepared tail's three phases as one CUDA launch, between grid barriers.

    Built from a ``PreparedTail`` for the ``"cuda"`` dialect: the same
    weights, fold plan, template values (each phase's ``U`` and ``PRE``) and constants.
    Call it with ``branch`` [branch] and ``residual`` [hidden] (float32 ``mx.array``) for
    the lazy output; :meth:`run` evaluates, checks the barrier flag and returns numpy.
    ``barrier_limit_ms``: how long a grid barrier waits before it gives up (raise it only
    for instrumented runs: :data:`SANITIZER_BARRIER_LIMIT_MS`). ``next_norm``: the norm
    that the tail's output goes into next (``workbench.kernels.next_norm``); the launch then
    also writes it, and a call returns ``(out, normed)`` instead of ``out``. ``compact_source``: MLX
    gets the kernel text short (the default: the header as an included file, the source
    without comments; the same code, less host work a launch:
    ``kernel_source.cuda_launch_text``); False hands it over as composed, to measure what
    that costs (``bench.real_model``'s ``cuda-1:annotated``).

    What makes a grid barrier safe, and how it is enforced here:

    * **Every group resident at once.** A group spinning at the barrier holds its SM; if a
      group of the grid has not started, it never will. The grid is exactly
      ``groups_per_sm`` x the GPU's SM count, the count read from the NVIDIA driver
      (:func:`workbench.kernels.cuda_device.multiprocessor_count`), never a default. One group
      an SM always fits (a group that fits no SM alone cannot be launched at all); two fit only
      when their registers and shared memory do, which is why 1 is the default.
    * **No second grid at the same time.** MLX runs graph nodes with no data dependency
      between them concurrently, and two barrier grids sharing the SMs could each wait for
      the other's SMs. Every launch therefore names the previous one's output as ``after``
      (:meth:`__call__` does this itself), which orders them; a tail whose input is
      another's output is ordered anyway.
    * **A hang becomes an error.** A barrier that waits over ``BARRIER_LIMIT_MS`` (4 s; a
      ``barrier_limit_ms`` of the launch's own under a sanitizer) gives up: the group writes
      NaN into its rows of ``out`` and raises a flag in the launch's memory, which
      :meth:`run` reads after the wait and raises :class:`GridBarrierTimeout` (zeroing the
      memory again for the next launch).

    The launch's own memory (``work``: h, act, the barrier counter, the flag) is made once
    and kept, as an engine keeps scratch buffers; the counter returns to 0 at the end of
    every launch.
    """

    def __init__(
        self,
        prep: PreparedTail,
        shape: OneLaunchShape | None = None,
        *,
        barrier_limit_ms: int = BARRIER_LIMIT_MS,
        compact_source: bool = True,
        next_norm: NextNorm | None = None,
    ) -> None:
        if not isinstance(prep, PreparedTail):
            raise ValueError(f"prep must be a kernels.launch.PreparedTail; got {type(prep).__name__}")
        if not kernel_source.dialect_text(prep.dialect).grid_barriers:
            raise ValueError(
                f"the one-launch tail is CUDA only (got a {prep.dialect!r} tail): Metal promises no "
                "forward progress between threadgroups, so its tail keeps three dispatches in one "
                "submission"
            )
        shape = shape or OneLaunchShape()
        if not isinstance(shape, OneLaunchShape):
            raise ValueError(f"shape must be a OneLaunchShape; got {type(shape).__name__}")
        next_norm = checked(next_norm, prep.hidden)
        used = static_shared_bytes(prep, shape, next_norm is not None)
        if used > STATIC_SHARED_LIMIT:
            raise ValueError(
                f"hidden ({prep.hidden}) / branch ({prep.branch_dim}): the one launch would declare {used} "
                f"bytes of shared memory, over CUDA's {STATIC_SHARED_LIMIT} for static shared memory; "
                "use the three launches (kernels.launch.PreparedTail)"
            )
        _check_barrier_limit(barrier_limit_ms)
        if not isinstance(compact_source, bool):
            raise ValueError(f"compact_source: must be True or False, got {compact_source!r}")
        self.prep, self.shape, self.barrier_limit_ms = prep, shape, int(barrier_limit_ms)
        self.compact_source = compact_source
        self.next_norm = next_norm
        self.sms = shape.sm_count if shape.sm_count is not None else cuda_device.multiprocessor_count()
        self.groups = self.sms * shape.groups_per_sm
        if shape.groups is not None:
            self.groups = min(self.groups, shape.groups)
        self.sync_at = sync_at(prep)
        self.work = mx.zeros((self.sync_at + 64,), dtype=mx.float32)
        mx.eval(self.work)
        self._last: mx.array | None = None
        self.template = launch_template(prep, shape, self.barrier_limit_ms)
        wo, g, u, d, rot = prep.wo, prep.gate, prep.up, prep.down, prep.rot
        # every input but the activations, by the kernel's input names (their order is
        # kernel_source.one_launch_inputs()'s, in one place)
        self._consts = {
            "sdest": rot["sdest"],
            "table": rot["table"],
            "params": prep.params,
            "w": wo.w,
            "ws": wo.s,
            "wb": wo.b,
            "nw": prep.norm,
            "wg": g.w,
            "wgs": g.s,
            "wgb": g.b,
            "wu": u.w,
            "wus": u.s,
            "wub": u.b,
            "wd": d.w,
            "wds": d.s,
            "wdb": d.b,
        }
        if next_norm is not None:
            self._consts["next_nw"] = next_norm.packed()
        self._none = mx.zeros((prep.hidden,), dtype=mx.float32)  # `after` for the first launch
        settle_constants(self._none, *self._consts.values())  # before compiled() traces
        self._compiled: dict[str, Any] = {}

    def _launch(
        self, branch: mx.array, residual: mx.array, after: mx.array, verbose: bool = False
    ) -> mx.array | tuple[mx.array, mx.array]:
        arrays = {**self._consts, "x": branch, "residual": residual, "work": self.work, "after": after}
        carried = self.next_norm is not None
        inputs = [arrays[n] for n in kernel_source.one_launch_inputs(next_norm=carried)]
        kernel = _kernel(
            self.prep.kernel_dir, self.compact_source, carried
        )  # the tail's kernel folder (None: kernels/)
        return _call_kernel(kernel, inputs, carried, self.template, self.groups, self.shape.nt, verbose)

    def __call__(
        self, branch: mx.array, residual: mx.array, *, after: mx.array | None = None, verbose: bool = False
    ) -> mx.array | tuple[mx.array, mx.array]:
        """The tail's one launch, lazily: ``out``, or ``(out, normed)`` with a ``next_norm``.
        It names the previous call's output (or ``after``, when given) as an input it never
        reads, so MLX orders the two launches (the class doc: no two barrier grids at once). A
        call whose output is never evaluated is evaluated with the next call's, since the
        next one names it."""
        after = after if after is not None else (self._last if self._last is not None else self._none)
        got = self._launch(branch, residual, after, verbose)
        self._last = got[0] if isinstance(got, tuple) else got
        return got

    def compiled(self, trace: str = "shared") -> Any:
        """:meth:`__call__` through ``mx.compile`` (less Python and MLX graph work a call), a
        function of ``(branch, residual)``.

        ``trace`` (:data:`TRACES`) says what the traced function takes:

        * ``"shared"``: every array, the weights included, is an input, and the function is
          shared by every one launch of the same form (:func:`_shared_trace`): a model's
          layers have the same shapes, so one trace serves them all;
        * ``"per-layer"``: this launch's own function of the activations, the launch memory
          and ``after`` alone, its weights and constants captured in the trace: four inputs
          a call to hand over and match instead of twenty, one trace a layer.

        A call of its own trace costs less host time, yet a model's decode was never faster
        with it (docs/JOURNAL.md), so ``"shared"`` is the default."""
        if trace not in TRACES:
            raise ValueError(f"trace: must be one of {TRACES}, got {validate.describe(trace)}")
        if trace not in self._compiled:
            carried = self.next_norm is not None
            names = kernel_source.one_launch_inputs(next_norm=carried)
            kernel = _kernel(self.prep.kernel_dir, self.compact_source, carried)
            at = {n: names.index(n) for n in ("x", "residual", "work", "after")}
            if trace == "shared":
                traced = _shared_trace(kernel, carried, tuple(self.template), self.groups, self.shape.nt)
                fixed = [self._consts.get(n) for n in names]

                def call(branch: mx.array, residual: mx.array) -> mx.array | tuple[mx.array, mx.array]:
                    args = list(fixed)
                    args[at["x"]], args[at["residual"]], args[at["work"]] = branch, residual, self.work
                    args[at["after"]] = self._last if self._last is not None else self._none
                    got = traced(*args)
                    self._last = got[0] if isinstance(got, tuple) else got
                    return got
            else:
                consts = dict(self._consts)
                template, groups, nt = tuple(self.template), self.groups, self.shape.nt

                def launch(branch: mx.array, residual: mx.array, work: mx.array, after: mx.array) -> Any:
                    arrays = {**consts, "x": branch, "residual": residual, "work": work, "after": after}
                    return _call_kernel(kernel, [arrays[n] for n in names], carried, template, groups, nt)

                own = mx.compile(launch)

                def call(branch: mx.array, residual: mx.array) -> mx.array | tuple[mx.array, mx.array]:
                    got = own(branch, residual, self.work, self._last if self._last is not None else self._none)
                    self._last = got[0] if isinstance(got, tuple) else got
                    return got

            self._compiled[trace] = call
        return self._compiled[trace]

    def copy_constants(self, copy: Callable[[mx.array], mx.array]) -> None:
        """Every array the launch reads but the activations (weights, constants, the next
        norm's weight, its memory) replaced by ``copy(array)``, evaluated now; ``copy`` must
        return the same bits. For instrumented runs: compute-sanitizer's initcheck counts as
        written only what an instrumented kernel wrote (``bench.sanitize --device-written``)."""
        self._consts = {name: copy(a) for name, a in self._consts.items()}
        self.work = copy(self.work)
        mx.eval(self.work, *self._consts.values())
        self._last = None
        self._compiled = {}

    def barrier_failed(self) -> bool:
        """Whether a launch since the last reset found a barrier that waited too long
        (reads the flag: call after evaluating)."""
        return bool(np.array(self.work[self.sync_at + 32 : self.sync_at + 33]).view(np.uint32)[0] != 0)

    def reset(self) -> None:
        """The launch's memory zeroed again (counter and flag), for a fresh start (a new
        array: the compiled form takes it as an input on its next call)."""
        self.work = mx.zeros(self.work.shape, dtype=mx.float32)
        mx.eval(self.work)
        self._last = None
        self._compiled = {}

    def _vectors(self, branch: Any, residual: Any) -> tuple[mx.array, mx.array]:
        """``branch`` and ``residual`` as float32 MLX vectors of this tail's widths, or ValueError."""
        b, r = as_mx32(branch), as_mx32(residual)
        for name, a, n in (("branch", b, self.prep.branch_dim), ("residual", r, self.prep.hidden)):
            if a.shape != (n,):
                raise ValueError(f"{name} must have shape ({n},) for this tail; got {tuple(a.shape)}")
        return b, r

    def run(self, branch: Any, residual: Any) -> np.ndarray:
        """One evaluation of the tail, float32 numpy out; :class:`GridBarrierTimeout`
        (after zeroing the launch's memory) if a barrier gave up."""
        got = self(*self._vectors(branch, residual))
        mx.eval(got)
        self.raise_if_barrier_failed()
        return np.array(got[0]) if isinstance(got, tuple) else np.array(got)

    def run_carried(self, branch: Any, residual: Any) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`run` for a launch with a ``next_norm``: ``(out, normed)``, float32 numpy,
        from the one evaluation."""
        if self.next_norm is None:
            raise ValueError(
                "run_carried: this launch carries no next norm (OneLaunchTail(..., next_norm=NextNorm(...)))"
            )
        out, normed = self(*self._vectors(branch, residual))
        mx.eval(out, normed)
        self.raise_if_barrier_failed()
        return np.array(out), np.array(normed)

    def raise_if_barrier_failed(self) -> None:
        """:class:`GridBarrierTimeout` (after zeroing the launch's memory for the next
        launch) if a barrier gave up since the last reset; call after evaluating."""
        if self.barrier_failed():
            self.reset()
            raise GridBarrierTimeout(
                f"a grid barrier of the one-launch tail waited over "
                f"{self.barrier_limit_ms / 1000:g} s: not every one of its "
                f"{self.groups} groups ({self.shape.groups_per_sm} an SM x {self.sms} SMs "
                "assumed) was resident at once; its output was NaN"
            )


def fits(prep: PreparedTail, shape: OneLaunchShape | None = None, next_norm: bool = False) -> bool:
    """Whether the one launch's static shared memory (:func:`static_shared_bytes`, with the
    next norm's epilogue where ``next_norm``) fits CUDA's :data:`STATIC_SHARED_LIMIT` at
    ``shape`` (default: :func:`shape_for`'s). Where it does not (hidden sizes far above
    Bonsai-27B's 5120), the CUDA path runs the three launches instead."""
    return static_shared_bytes(prep, shape or shape_for(prep), next_norm) <= STATIC_SHARED_LIMIT


#: The one-launch tails the CUDA path made, held weakly by their contract's owner (the
#: weights), one per tuning, shape and next norm (each keeps its launch memory and the last
#: output it ordered itself after, as an engine keeps its scratch buffers).
_TAILS: weakref.WeakKeyDictionary[Any, dict[Any, OneLaunchTail]] = weakref.WeakKeyDictionary()


def for_launch(
    launch: TailLaunch,
    tuning: KernelTuning | None = None,
    next_norm: NextNorm | None = None,
    *,
    shape: OneLaunchShape | None = None,
) -> OneLaunchTail | None:
    """The one-launch tail ``fused_tail(backend="cuda")`` runs for ``launch`` (made once per
    contract owner, tuning, shape and next norm; ``shape`` None: :func:`shape_for`'s), or
    None where its shared memory does not fit (:func:`fits`): the three launches then run.
    ``next_norm``: the launch also writes the norm its output goes into next (a call then
    returns ``(out, normed)``). Raises ``BackendUnavailable`` where MLX's CUDA back-end is
    absent, ``ValueError`` for a contract without an owner (nothing to keep the launch by)."""
    backends.resolve_backend("cuda")
    next_norm = checked(next_norm)
    shape = checked_shape(shape)
    if launch.owner is None:
        raise ValueError("launch: a one-launch tail is kept by its contract's owner; this one has none")
    prep = prepared(launch, "cuda", tuning)
    per = _TAILS.setdefault(launch.owner, {})
    shape = shape or shape_for(prep)
    key = (prep.tuning, shape, None if next_norm is None else next_norm.key)
    if key not in per:
        if not fits(prep, shape, next_norm is not None):
            return None
        per[key] = OneLaunchTail(prep, shape, next_norm=next_norm)
    return per[key]
