"""The emulator's memory kept from launch to launch: the fiber stacks and the guarded device buffers.

Every emulated kernel's shared object carries its own copy of the runtime, but the memory is
the process's: one mapping of fiber stacks, grown to the largest group launched so far
(each runtime keeping its own would exhaust the process's memory areas after a few dozen
kernels), and a pool of idle device buffers, each whole pages ending at a guard page
(mapping, guarding and unmapping a buffer cost three system calls and a fault a page,
every launch). A buffer taken from the pool is cleared so a launch sees exactly what fresh
memory would show it. Everything here is used under :data:`LOCK` only: the emulator's
state is global to its shared object, so one launch runs at a time.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

#: Held by every launch and every use of the memory below: one launch at a time.
LOCK = threading.Lock()

#: The process's fiber stacks (address, threads), shared by every kernel's runtime and
#: grown to the largest group launched so far; used under ``LOCK`` only.
_STACKS: list[int] = [0, 0]


def stacks_for(lib: ctypes.CDLL, threads: int) -> None:
    """Hand ``lib``'s runtime the process's stacks, grown to ``threads`` if need be (one
    mapping for every kernel: each runtime keeping its own would exhaust the process's
    memory areas after a few dozen kernels). Call under ``LOCK``."""
    if _STACKS[1] < threads:
        pool = lib.metal_emulation_stacks(threads)
        if not pool:
            raise MemoryError(f"no memory for {threads} fiber stacks")
        if _STACKS[0]:
            lib.metal_emulation_stacks_free(_STACKS[0], _STACKS[1])
        _STACKS[:] = [pool, threads]
    lib.metal_emulation_use_stacks(_STACKS[0], _STACKS[1])


#: The page size: device buffers are whole pages ending at a guard page.
_PAGE = os.sysconf("SC_PAGESIZE") if hasattr(os, "sysconf") else 4096

#: The most bytes of idle device buffers kept for later launches (the rest are unmapped).
BUFFER_POOL_BYTES = 64 << 20

#: Idle device buffers by their data pages: (the mapping's address, a numpy view of its
#: bytes), shared by every kernel like the stacks, and the bytes they hold; used under
#: ``LOCK`` only. A launch takes its buffers from here and gives them back: mapping,
#: guarding and unmapping a buffer cost three system calls and a fault a page, every launch.
_BUFFERS: dict[int, list[tuple[int, np.ndarray]]] = {}
_BUFFER_BYTES: list[int] = [0]
_MAPPED: list[int] = [0]


def buffers_mapped() -> int:
    """How many device buffers this process has mapped so far: a launch whose buffers' sizes
    an earlier launch already had maps none."""
    return _MAPPED[0]


def take_buffer(lib: ctypes.CDLL, n: int) -> tuple[int, int, np.ndarray, int]:
    """``(mapping, pages, its bytes as numpy, data offset)``: a device buffer of ``n`` bytes
    (n >= 1) whose last byte sits right before a guard page, the pages' bytes before the data
    zero, as in a fresh mapping (the caller writes all ``n`` data bytes): so a reused buffer
    shows a launch nothing an earlier one left. Call under ``LOCK``."""
    pages = -(-n // _PAGE)
    idle = _BUFFERS.get(pages)
    off = pages * _PAGE - n
    if idle:
        base, view = idle.pop()
        _BUFFER_BYTES[0] -= pages * _PAGE
        view[:off] = 0
    else:
        base = lib.metal_emulation_buffer(pages * _PAGE, 0)  # all of its pages: zero, data at the mapping
        if not base:
            raise MemoryError(f"no memory for a {n}-byte buffer")
        _MAPPED[0] += 1
        view = np.ctypeslib.as_array((ctypes.c_uint8 * (pages * _PAGE)).from_address(base))
    return base, pages, view, off


def give_back(lib: ctypes.CDLL, base: int, pages: int, view: np.ndarray) -> None:
    """A buffer from :func:`take_buffer` kept for a later launch, or unmapped when the idle
    buffers would pass :data:`BUFFER_POOL_BYTES`. Call under ``LOCK``."""
    if _BUFFER_BYTES[0] + pages * _PAGE <= BUFFER_POOL_BYTES:
        _BUFFERS.setdefault(pages, []).append((base, view))
        _BUFFER_BYTES[0] += pages * _PAGE
    else:
        lib.metal_emulation_buffer_free(base, pages * _PAGE)
