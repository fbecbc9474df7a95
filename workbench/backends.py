"""Which fused-tail backends this machine has, and the error for one that is absent.

Backends of :func:`workbench.tail.fused_tail`:

* ``"graph"``: the whole tail as MLX ops evaluated once; runs wherever MLX runs (CPU,
  Apple GPU, NVIDIA GPU), so it is always available.
* ``"metal"``: the fused kernel through ``mx.fast.metal_kernel``; needs an Apple GPU
  with MLX's Metal back-end AND the kernel registered here.
* ``"cuda"``: its twin through ``mx.fast.cuda_kernel``; needs an NVIDIA GPU with MLX's
  CUDA back-end (``mlx[cuda13]``) AND the kernel registered here.
* ``"auto"``: the first available of cuda, metal, graph.

A backend asked for and absent raises :class:`BackendUnavailable` saying what is
missing; nothing falls back silently, since a graph result mistaken for a kernel result
would hide exactly the bugs the kernels are checked for.

The kernels themselves arrive with the issue "The fused tail as kernels", which registers
them with :func:`register_tail_kernel`.
"""

from __future__ import annotations

import platform
from typing import Any, Callable

import mlx.core as mx

#: Every name :func:`resolve_backend` accepts.
BACKENDS: tuple[str, ...] = ("auto", "graph", "metal", "cuda")

#: The order ``"auto"`` tries, best first.
_PREFERENCE: tuple[str, ...] = ("cuda", "metal", "graph")

#: Kernel runners by backend name: ``runner(launch, branch, residual) -> array [.., hidden]``.
_KERNELS: dict[str, Callable[..., Any]] = {}


class BackendUnavailable(RuntimeError):
    """A backend that was asked for cannot run here; the message says what is missing."""


def metal_available() -> bool:
    """Whether MLX's Metal back-end runs here (an Apple GPU)."""
    try:
        return bool(mx.metal.is_available())
    except AttributeError:  # an MLX build without the metal module
        return False


def cuda_available() -> bool:
    """Whether MLX's CUDA back-end runs here (an NVIDIA GPU and ``mlx[cuda*]``)."""
    cuda = getattr(mx, "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_available())
    except Exception:  # noqa: BLE001 -- a CPU build may raise rather than answer False
        return False


def register_tail_kernel(name: str, runner: Callable[..., Any]) -> None:
    """Register the fused-tail kernel for ``"metal"`` or ``"cuda"``.

    ``runner(launch, branch, residual)`` takes a :class:`workbench.tail.TailLaunch` and
    the activations (numpy or MLX, float32, optional leading batch axes) and returns the
    output (numpy or ``mx.array``), having waited on ONE submission.
    """
    if name not in ("metal", "cuda"):
        raise ValueError(f"name must be 'metal' or 'cuda' (the kernel backends); got {name!r}")
    if not callable(runner):
        raise ValueError(f"runner must be callable; got {type(runner).__name__}")
    _KERNELS[name] = runner


def _missing(name: str) -> str | None:
    """Why ``name`` cannot run here, or ``None`` when it can."""
    if name == "graph":
        return None
    if name == "metal":
        if not metal_available():
            return (
                "backend 'metal' needs an Apple GPU with MLX's Metal back-end: mx.metal.is_available() is "
                f"False on this machine ({platform.system()} {platform.machine()}, MLX {mx.__version__})"
            )
    elif name == "cuda":
        if not cuda_available():
            return (
                "backend 'cuda' needs an NVIDIA GPU with MLX's CUDA back-end (pip install 'mlx[cuda13]'): "
                f"mx.cuda.is_available() is False on this machine (MLX {mx.__version__})"
            )
    if name not in _KERNELS:
        return (
            f"backend {name!r}: the device is here but no fused-tail {name} kernel is registered "
            "(workbench.backends.register_tail_kernel; the issue 'The fused tail as kernels' adds it)"
        )
    return None


def available_backends() -> list[str]:
    """The backends that can run here, best first (``"graph"`` always; never ``"auto"``)."""
    return [b for b in _PREFERENCE if _missing(b) is None]


def resolve_backend(name: str) -> str:
    """The concrete backend for ``name`` (``"auto"`` -> the best available).

    Raises ``ValueError`` for a name that is not a backend and
    :class:`BackendUnavailable` (saying what is missing) for one that cannot run here.
    """
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {name!r}")
    if name == "auto":
        return available_backends()[0]
    why = _missing(name)
    if why is not None:
        raise BackendUnavailable(why)
    return name


def run_tail_kernel(name: str, launch: Any, branch: Any, residual: Any) -> Any:
    """Run the registered ``name`` kernel on a launch (``resolve_backend`` it first)."""
    why = _missing(name)
    if why is not None or name == "graph":
        raise BackendUnavailable(why or "'graph' is not a kernel backend; use workbench.tail.tail_graph")
    return _KERNELS[name](launch, branch, residual)


def device_description() -> dict[str, str]:
    """MLX's default device and what it says about it, for benchmark records."""
    info: dict[str, str] = {"mlx_device": str(mx.default_device()), "mlx_version": str(mx.__version__)}
    try:
        info.update({str(k): str(v) for k, v in mx.device_info().items()})
    except Exception:  # noqa: BLE001 -- older builds / CPU builds may not describe the device
        pass
    info["platform"] = f"{platform.system()} {platform.machine()}"
    return info
