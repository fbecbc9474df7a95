"""The door to the kernels: the ONE module that says which backend runs a launch, and how.

Every kernel launch reaches its backend (``"metal"``, ``"cuda"``, ``"metal-emulated"``)
through a function here: a tail eagerly (:func:`run_tail`, what ``fused_tail`` runs, and
:func:`run_cuda_tail` / :func:`run_kernel_tail` behind it) or lazily in a model's graph
(:func:`lazy_tail`), a single kernel (:func:`compiled_kernel`, :func:`launch`: the head's
Q/K/V, a Gated DeltaNet step, a decode step's matvecs) and a user's own source
(:func:`source_kernel`). The rule: no other module compares a backend's name; it asks
here (:func:`is_emulated`, :func:`source_dialect`, :func:`check_group_memory`), so adding
or changing a backend is a change in one place. Nothing here is a process-wide setting:
tuning and the one launch's shape are arguments, and what is prepared is kept by its
contract's owner (``workbench.kernels.launch.prepared``, ``one_launch.for_launch``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import backends
from workbench.kernels import emulated, one_launch
from workbench.kernels import launch as kernel_launch
from workbench.kernels import source as kernel_source
from workbench.kernels.contract import TailLaunch, check_launch, check_tail_inputs, each_row
from workbench.kernels.matrices import check_threadgroup_memory
from workbench.kernels.next_norm import NextNorm
from workbench.kernels.one_launch_shape import OneLaunchShape, checked_shape
from workbench.kernels.tuning import KernelTuning, checked_tuning

#: The backend that runs the Metal kernels on the CPU (clang and the emulator).
METAL_EMULATED = emulated.METAL_EMULATED

#: The emulated launches' default ``order``: two schedules (SIMD-groups in step, and apart) compared bit for bit.
DEFAULT_ORDER = emulated.DEFAULT_ORDER

#: The backends that run the kernels on a device; each is also the dialect its text is in.
DEVICE_BACKENDS: tuple[str, ...] = kernel_launch.KERNEL_BACKENDS

#: Every backend a kernel launch can take.
KERNEL_BACKENDS: tuple[str, ...] = DEVICE_BACKENDS + (METAL_EMULATED,)

#: The dialect each backend's kernels are composed in.
DIALECT_OF: dict[str, str] = {"metal": "metal", "cuda": "cuda", METAL_EMULATED: "metal"}


def check_backend(backend: str, name: str = "dialect") -> str:
    """``backend`` if it is a kernel backend, else ValueError naming them (the graph tail is not one)."""
    if not isinstance(backend, str) or backend not in KERNEL_BACKENDS:
        raise ValueError(
            f"{name} must be one of {KERNEL_BACKENDS} (the kernel backends; "
            f"'graph' runs as workbench.tail.tail_graph); got {backend!r}"
        )
    return backend


def is_emulated(backend: str) -> bool:
    """Whether ``backend`` runs its launches on the CPU (the Metal emulator)."""
    return check_backend(backend, "backend") == METAL_EMULATED


def source_dialect(backend: str) -> str:
    """The dialect ``backend``'s kernel text is composed in (``"metal-emulated"`` runs Metal)."""
    return DIALECT_OF[check_backend(backend, "backend")]


def compiled_kernel(backend: str, kernel: str, kernel_dir: Path | None = None) -> Any:
    """The MLX kernel object for ``kernel`` as ``backend`` runs it (``launch.compiled_kernel``
    in the backend's dialect; the emulator reads the Metal object's generated source)."""
    return kernel_launch.compiled_kernel(
        source_dialect(backend), kernel, None if kernel_dir is None else Path(kernel_dir)
    )


def check_group_memory(backend: str, kernel: str, template: list[tuple[str, Any]], width: str) -> None:
    """ValueError where ``backend`` runs Metal text and the launch of ``kernel`` would declare
    more than Apple GPUs' threadgroup memory (``matrices.check_threadgroup_memory``)."""
    if kernel_source.dialect_text(source_dialect(backend)).group_memory_checked:
        check_threadgroup_memory(kernel, template, width)


def launch(
    backend: str,
    kernel: Any,
    inputs: list[mx.array],
    kw: dict[str, Any],
    *,
    order: str = emulated.DEFAULT_ORDER,
    seed: int = 0,
    verbose: bool = False,
) -> list[mx.array]:
    """One launch of ``kernel`` (from :func:`compiled_kernel`) on ``backend``: lazy outputs on a
    device (``verbose``: MLX prints the generated source); on ``"metal-emulated"`` run on the
    CPU at once, in ``order`` (by default two schedules (SIMD-groups in step, and apart) compared; ``seed`` for
    the random schedules), the outputs new arrays."""
    if is_emulated(backend):
        return [mx.array(o) for o in emulated.emulate_launch(kernel, inputs, kw, order=order, seed=seed)]
    return list(kernel(inputs=inputs, verbose=verbose, **kw))


def source_kernel(
    backend: str,
    name: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    source: str,
    header: str = "",
    *,
    source_name: str = "source",
) -> Any:
    """A user's own kernel source as ``backend`` runs it: ``mx.fast.metal_kernel`` /
    ``mx.fast.cuda_kernel``, or on ``"metal-emulated"`` the drop-in that runs Metal on the CPU
    (its call also takes ``order`` and ``seed``; its compile errors call the source
    ``source_name``, with the source's own line numbers). ``BackendUnavailable`` where absent."""
    backends.resolve_backend(check_backend(backend, "backend"))
    if is_emulated(backend):
        from workbench.kernels.metal_drop_in import metal_kernel  # clang and ctypes only when asked

        kernel = metal_kernel(
            name=name, input_names=list(input_names), output_names=list(output_names), source=source, header=header
        )
        kernel.source_name = source_name
        return kernel
    make = getattr(mx.fast, kernel_source.dialect_text(source_dialect(backend)).maker)
    return make(name=name, input_names=list(input_names), output_names=list(output_names), source=source, header=header)


def as_mx32(a: Any) -> mx.array:
    """``a`` (numpy or MLX) as a float32 ``mx.array``."""
    return kernel_launch.as_mx32(a)


def kernel_tail(
    launch: TailLaunch,
    branch: mx.array,
    residual: mx.array,
    dialect: str,
    tuning: KernelTuning | None = None,
    *,
    kernel_dir: Path | None = None,
) -> mx.array:
    """The three launches as a lazy MLX array (leading batch axes allowed: each row its launches)."""
    check_tail_inputs(check_launch(launch), branch, residual)
    prep = kernel_launch.prepared(launch, dialect, tuning, kernel_dir=kernel_dir)
    b, r = branch.astype(mx.float32), residual.astype(mx.float32)
    if b.ndim == 1:
        return prep.compiled()(b, r)
    return each_row(prep, b, r, prep.hidden, mx.stack)


def run_kernel_tail(
    dialect: str,
    launch: TailLaunch,
    branch: Any,
    residual: Any,
    *,
    tuning: KernelTuning | None = None,
    kernel_dir: Path | None = None,
) -> np.ndarray:
    """The fused tail through the three launches in one evaluation (or the emulator), float32
    numpy out: what ``fused_tail(backend="metal")`` / ``"metal-emulated"`` runs, and the CUDA
    path where the one launch does not fit.

    ``branch`` / ``residual``: numpy or MLX, optional leading batch axes. Raises
    ``ValueError`` for a dialect that is not a kernel backend and
    :class:`workbench.backends.BackendUnavailable` when its device is absent here.
    """
    check_backend(dialect)
    check_tail_inputs(check_launch(launch), branch, residual)
    backends.resolve_backend(dialect)  # a kernel asked for on a machine without its device says so
    if is_emulated(dialect):
        return emulated.emulated_tail(launch, branch, residual, tuning=tuning, kernel_dir=kernel_dir)
    out = kernel_tail(launch, as_mx32(branch), as_mx32(residual), dialect, tuning, kernel_dir=kernel_dir)
    mx.eval(out)  # the ONE submission: all launches of the tail
    return np.array(out)


def run_cuda_tail(
    launch: TailLaunch,
    branch: Any,
    residual: Any,
    *,
    tuning: KernelTuning | None = None,
    shape: OneLaunchShape | None = None,
) -> np.ndarray:
    """What ``fused_tail(backend="cuda")`` runs: the tail as ONE launch
    (``one_launch.for_launch``, in ``shape`` or the policy's) in one evaluation, float32
    numpy out; the three launches (:func:`run_kernel_tail`) where it does not fit.

    Leading batch axes: each row its own launch, each ordered after the one before, all in
    the one evaluation. Raises ``one_launch.GridBarrierTimeout`` if a barrier gave up and
    ``BackendUnavailable`` where MLX's CUDA back-end is absent.
    """
    check_tail_inputs(check_launch(launch), branch, residual)
    one = one_launch.for_launch(launch, tuning, shape=checked_shape(shape))
    if one is None:
        given = {} if tuning is None else {"tuning": tuning}  # only what the caller named is passed on
        return run_kernel_tail("cuda", launch, branch, residual, **given)
    b, r = as_mx32(branch), as_mx32(residual)
    out = one.compiled()(b, r) if b.ndim == 1 else each_row(one, b, r, one.prep.hidden, mx.stack)
    mx.eval(out)  # the ONE submission: every row's launch
    one.raise_if_barrier_failed()
    return np.array(out)


def run_tail(
    backend: str,
    launch: TailLaunch,
    branch: Any,
    residual: Any,
    *,
    tuning: KernelTuning | None = None,
    shape: OneLaunchShape | None = None,
) -> np.ndarray:
    """The tail on a kernel backend, eagerly (``fused_tail``'s kernel branch): CUDA as one
    launch (:func:`run_cuda_tail`), Metal and the emulator as three (:func:`run_kernel_tail`).
    ``tuning`` / ``shape`` (CUDA's one launch only): None for the defaults; only what is
    given is passed on."""
    check_backend(backend, "backend")
    check_tail_inputs(check_launch(launch), branch, residual)
    given = {"tuning": checked_tuning(tuning)} if tuning is not None else {}
    if backend == "cuda":
        if shape is not None:
            given["shape"] = checked_shape(shape)
        return run_cuda_tail(launch, branch, residual, **given)
    if shape is not None:
        raise ValueError(f"shape: the one launch's shape is CUDA's; backend {backend!r} takes none")
    return run_kernel_tail(backend, launch, branch, residual, **given)


def lazy_tail(
    backend: str,
    launch: TailLaunch,
    next_norm: NextNorm | None = None,
    trace: str = "shared",
    *,
    tuning: KernelTuning | None = None,
    shape: OneLaunchShape | None = None,
) -> Callable[[mx.array, mx.array], Any]:
    """One tail on one position as a function ``(branch, residual) -> lazy float32 array`` of the
    residual's shape, for a model's graph: ``"cuda"`` the one launch (its compiled ``trace``;
    it also writes ``next_norm`` where given) or the three where it does not fit; ``"metal"``
    the three launches, encoded in the caller's evaluation; ``"metal-emulated"`` evaluated
    here on the host, its result a new array. With ``next_norm`` the function returns
    ``(out, normed)``; where the launch does not compute the norm, ``mx.fast.rms_norm`` follows it."""
    check_backend(backend, "backend")
    check_launch(launch)
    backends.resolve_backend(backend)
    if backend == "cuda":
        given = {} if shape is None else {"shape": checked_shape(shape)}
        one = one_launch.for_launch(launch, tuning, next_norm=next_norm, **given)
        if one is not None:
            return one.compiled(trace)  # takes and gives any shape of one position: no reshape op
    elif shape is not None:
        raise ValueError(f"shape: the one launch's shape is CUDA's; backend {backend!r} takes none")
    if is_emulated(backend):

        def tail(b: mx.array, r: mx.array) -> mx.array:
            return mx.array(
                emulated.emulated_tail(
                    launch, np.asarray(b).reshape(-1), np.asarray(r).reshape(-1), tuning=tuning
                ).reshape(r.shape)
            )
    else:
        three = kernel_launch.prepared(launch, backend, tuning).compiled()

        def tail(b: mx.array, r: mx.array) -> mx.array:
            return three(b, r) if b.ndim == 1 else three(b.reshape(-1), r.reshape(-1)).reshape(r.shape)

    if next_norm is None:
        return tail
    weight, eps = mx.array(next_norm.weight), next_norm.eps
    mx.eval(weight)

    def carried(b: mx.array, r: mx.array) -> tuple[mx.array, mx.array]:
        out = tail(b, r)
        return out, mx.fast.rms_norm(out, weight, eps)

    return carried
