"""What the NVIDIA driver says about the GPU: its multiprocessor (SM) count.

A launch whose groups wait for each other (the one-launch tail's grid barrier,
:mod:`workbench.kernels.one_launch`) is only safe while every group of its grid is resident, so
its grid is sized from the GPU that runs it, never from a default. MLX does not report
the SM count, so this asks the driver itself (``libcuda``, the CUDA driver API's
``cuDeviceGetAttribute``) through ``ctypes``: the driver library is on every machine
that runs MLX's CUDA back-end, and nothing else is needed. The answer is the SMs this
process may use (under MIG, the instance's).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache

from workbench.backends import BackendUnavailable

#: ``CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`` in the driver API's ``CUdevice_attribute``.
_MULTIPROCESSOR_COUNT = 16


def _driver() -> ctypes.CDLL:
    """The CUDA driver library; BackendUnavailable when this machine has none."""
    for name in ("libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise BackendUnavailable(
        "the CUDA driver library (libcuda.so.1) is not on this machine: the SM count comes from the NVIDIA driver"
    )


def _check(what: str, status: int) -> None:
    if status != 0:
        raise BackendUnavailable(f"the CUDA driver's {what} returned error {status} (CUresult): no usable NVIDIA GPU")


@lru_cache(maxsize=16)
def multiprocessor_count(device: int = 0) -> int:
    """The SM count of CUDA device ``device`` (0: the one MLX uses), from the driver.

    Raises :class:`workbench.backends.BackendUnavailable` where there is no driver or no
    such device, ``ValueError`` for a device index that is not a non-negative integer.
    """
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(f"device must be a non-negative integer (a CUDA device index); got {device!r}")
    lib = _driver()
    _check("cuInit", lib.cuInit(0))
    handle = ctypes.c_int()
    _check(f"cuDeviceGet({device})", lib.cuDeviceGet(ctypes.byref(handle), device))
    count = ctypes.c_int()
    _check(
        "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)",
        lib.cuDeviceGetAttribute(ctypes.byref(count), _MULTIPROCESSOR_COUNT, handle),
    )
    return int(count.value)
