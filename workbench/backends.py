"""Which fused-tail backends this machine has, and the error for one that is absent.

The backends of :func:`workbench.tail.fused_tail`: ``"graph"`` (the tail as MLX ops evaluated
once, wherever MLX runs); ``"metal"`` (the fused kernels through ``mx.fast.metal_kernel``, on an
Apple GPU); ``"cuda"`` (their twin through ``mx.fast.cuda_kernel``, on an NVIDIA GPU with
``mlx[cuda13]``); ``"metal-emulated"`` (the Metal kernels compiled by clang and run on the CPU by
:mod:`workbench.kernels.metal_emulation`: a slow checking tool, only ever asked for by name);
``"auto"`` (the first available of cuda, metal, graph: never the emulator). The kernels always exist in code
(:mod:`workbench.kernels.launch`), so a kernel backend is unavailable only when its device is.
One asked for and absent raises :class:`BackendUnavailable` saying what is missing; nothing
falls back silently, since a graph result mistaken for a kernel result would hide exactly the
bugs the kernels are checked for.

:func:`device_description` is the one description of a device that every record carries;
:func:`reduced_float32_products` says whether MLX's float32 matrix products there are full float32.
"""

from __future__ import annotations

import os
import platform
import shutil

import mlx.core as mx

#: Every name :func:`resolve_backend` accepts.
BACKENDS: tuple[str, ...] = ("auto", "graph", "metal", "cuda", "metal-emulated")

#: The order ``"auto"`` tries, best first.
_PREFERENCE: tuple[str, ...] = ("cuda", "metal", "graph")

#: Every backend that can run somewhere, in the order :func:`available_backends` lists them:
#: ``"auto"``'s order, then the emulator, which is a slow checking tool and never chosen for you.
_LISTED: tuple[str, ...] = (*_PREFERENCE, "metal-emulated")


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
    except Exception:
        return False


def clang() -> str | None:
    """The clang++ the emulated backend compiles with: ``$WORKBENCH_CLANG``, else ``clang++``
    on the PATH (Debian's ``clang`` package), else None."""
    env = os.environ.get("WORKBENCH_CLANG")
    if env:
        return shutil.which(env)
    for name in ("clang++", "clang++-19", "clang++-18", "clang++-17", "clang++-16", "clang++-15", "clang++-14"):
        found = shutil.which(name)
        if found:
            return found
    return None


def clang_available() -> bool:
    """Whether a clang++ is here for the ``"metal-emulated"`` backend (:func:`clang`'s search)."""
    return clang() is not None


def _missing(name: str) -> str | None:
    """Why ``name`` cannot run here, or ``None`` when it can."""
    if name == "metal" and not metal_available():
        return (
            "backend 'metal' needs an Apple GPU with MLX's Metal back-end: mx.metal.is_available() is "
            f"False on this machine ({platform.system()} {platform.machine()}, MLX {mx.__version__})"
        )
    if name == "cuda" and not cuda_available():
        return (
            "backend 'cuda' needs an NVIDIA GPU with MLX's CUDA back-end (pip install 'mlx[cuda13]'): "
            f"mx.cuda.is_available() is False on this machine (MLX {mx.__version__})"
        )
    if name == "metal-emulated" and not clang_available():
        return (
            "backend 'metal-emulated' needs clang++ (C++17) to compile the Metal kernels against the "
            "stand-in <metal_stdlib>: apt-get install clang (Debian/Ubuntu), or set $WORKBENCH_CLANG to a "
            "clang++ on the PATH"
        )
    return None


def available_backends() -> list[str]:
    """Every backend that can run here, ``"auto"``'s order first (``"graph"`` always; never ``"auto"``
    itself), then ``"metal-emulated"`` where a clang++ is here.

    The truth, so that a caller (or a test's skip) asking "can metal-emulated run?" gets the
    answer ``resolve_backend`` would give; ``"auto"`` picks from :func:`auto_backends` only.
    """
    return [b for b in _LISTED if _missing(b) is None]


def auto_backends() -> list[str]:
    """The backends ``"auto"`` may pick here, best first: cuda, metal, graph (``"graph"`` always).

    The emulator is left out: it runs the Metal kernels on the CPU thousands of times slower,
    so it is a checking tool that is asked for by name, never a default."""
    return [b for b in _PREFERENCE if _missing(b) is None]


def resolve_backend(name: str) -> str:
    """The concrete backend for ``name`` (``"auto"`` -> the best available).

    Raises ``ValueError`` for a name that is not a backend and
    :class:`BackendUnavailable` (saying what is missing) for one that cannot run here.
    """
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {name!r}")
    if name == "auto":
        return auto_backends()[0]
    why = _missing(name)
    if why is not None:
        raise BackendUnavailable(why)
    return name


#: The environment variable MLX reads, once, when it first multiplies float32 matrices: ``0``
#: keeps float32 matrix products in full float32; unset or any other value lets MLX run them
#: at reduced precision where the hardware has matrix units (MLX's "Numerical Precision" page).
TF32_VARIABLE = "MLX_ENABLE_TF32"


def reduced_float32_products(device: mx.Device | None = None) -> bool:
    """Whether MLX may run float32 matrix products on ``device`` (default: MLX's default) at
    reduced, TF32-class precision (a 10-bit mantissa for each input).

    On a GPU it does unless ``MLX_ENABLE_TF32=0`` was set before the process's first float32
    product: MLX 0.32's CUDA back-end then asks cuBLAS for its TF32 tensor-core mode, and a
    product of more than one row lands ~1e-3 off (a tail's 2e-4 criterion fails); one row
    (a decode step's matrix-vector product) is computed in float32 either way. MLX's sm90
    kernels for quantized products of many rows are built on TF32 tensor-core instructions
    too (their names in its library say so). The CPU always computes
    in float32.
    Every kernel of the workbench accumulates in float32 itself; this concerns MLX's own
    products (the graph tail, mlx-lm's layers, a reference)."""
    dev = device if device is not None else mx.default_device()
    if dev.type == mx.cpu:
        return False
    return os.environ.get(TF32_VARIABLE, "1").strip() != "0"


def cuda_is_default() -> bool:
    """Whether MLX's default device is a GPU of its CUDA back-end: where the workbench routes the
    few MLX ops that back-end gets wrong to MLX's CPU stream (``fold.hadamard``, ``fold.weights``)."""
    return mx.default_device().type == mx.gpu and cuda_available()


def device_kind(device: mx.Device | None = None) -> str:
    """``cpu``, ``cuda`` or ``metal``: which MLX backend runs ``device`` (default: MLX's default
    device). Records and the wait-price ledger file their measurements by it."""
    dev = device if device is not None else mx.default_device()
    if dev.type == mx.cpu:
        return "cpu"
    return "cuda" if cuda_available() else "metal"


def device_description(device: mx.Device | None = None) -> dict[str, str]:
    """An MLX device (default: MLX's default) and what it says about itself, for records.

    ``mlx_device``, ``mlx_version``, ``platform``, whatever ``mx.device_info`` reports
    (``device_name`` on a GPU), and on the CPU the processor's model name as
    ``device_name``: one description for every record, whichever command writes it.
    """
    dev = device if device is not None else mx.default_device()
    info: dict[str, str] = {"mlx_device": str(dev), "mlx_version": str(mx.__version__)}
    try:
        info.update({str(k): str(v) for k, v in mx.device_info(dev).items()})
    except Exception:
        pass
    if dev.type == mx.cpu and "device_name" not in info:
        name = platform.processor() or platform.machine()
        try:
            for line in open("/proc/cpuinfo", encoding="utf-8"):
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        info["device_name"] = name
    info["platform"] = f"{platform.system()} {platform.machine()}"
    info["float32_products"] = "reduced (TF32-class)" if reduced_float32_products(dev) else "float32"
    return info
