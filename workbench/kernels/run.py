"""A tail on a kernel backend: what ``fused_tail(backend="metal")`` and
``fused_tail(backend="metal-emulated")`` run, and what the CUDA path falls back to.

From :func:`workbench.tail.fused_tail` to a launch: ``fused_tail`` resolves the backend's
name with :func:`workbench.backends.resolve_backend` (which raises when the device is
absent) and builds a :class:`workbench.tail.TailLaunch`. For ``"cuda"`` it calls
``workbench.kernels.one_launch.run_cuda_tail`` (the tail as one launch; these three
launches where it does not fit); for ``"metal"`` and ``"metal-emulated"``,
:func:`run_kernel_tail`, which prepares the launches once per weights object
(``launch.prepared``) and evaluates them, or emulates them on the CPU
(``emulated.emulated_tail``). Both kernel backends always exist in code; only the
device decides whether one can run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from workbench import backends
from workbench.kernels.emulated import METAL_EMULATED, emulated_tail
from workbench.kernels.launch import KERNEL_BACKENDS, as_mx32, prepared
from workbench.kernels.tuning import KernelTuning

if TYPE_CHECKING:  # tail imports this module at its top; a runtime import back would be a circle
    from workbench.tail.paths import TailLaunch


def kernel_tail(launch: TailLaunch, branch: mx.array, residual: mx.array, dialect: str,
                tuning: KernelTuning | None = None) -> mx.array:
    """The kernel tail as a lazy MLX array (leading batch axes allowed: each row its launches)."""
    prep = prepared(launch, dialect, tuning)
    b = branch.astype(mx.float32)
    r = residual.astype(mx.float32)
    if b.ndim == 1:
        return prep.compiled()(b, r)
    lead = b.shape[:-1]
    bf, rf = b.reshape(-1, b.shape[-1]), r.reshape(-1, r.shape[-1])
    return mx.stack([prep(bf[i], rf[i]) for i in range(bf.shape[0])]).reshape(*lead, prep.hidden)


def run_kernel_tail(dialect: str, launch: TailLaunch, branch: Any, residual: Any) -> np.ndarray:
    """The fused tail through the ``dialect`` kernels' three launches (``"metal"`` or
    ``"cuda"``) in one evaluation, float32 numpy out: what ``fused_tail(backend="metal")``
    runs (``fused_tail(backend="cuda")`` runs ``workbench.kernels.one_launch.run_cuda_tail``: one
    launch, these three only where it does not fit).

    ``branch`` / ``residual``: numpy or MLX, optional leading batch axes. Raises
    ``ValueError`` for a dialect that is not a kernel backend and
    :class:`workbench.backends.BackendUnavailable` when its device is absent here.
    """
    if dialect not in KERNEL_BACKENDS + (METAL_EMULATED,):
        raise ValueError(f"dialect must be one of {KERNEL_BACKENDS + (METAL_EMULATED,)} (the kernel backends; "
                         f"'graph' runs as workbench.tail.tail_graph); got {dialect!r}")
    backends.resolve_backend(dialect)  # a kernel asked for on a machine without its device says so
    if dialect == METAL_EMULATED:
        return emulated_tail(launch, branch, residual)
    out = kernel_tail(launch, as_mx32(branch), as_mx32(residual), dialect)
    mx.eval(out)  # the ONE submission: all launches of the tail
    return np.array(out)
