"""Metal kernels compiled and executed on the CPU: the ``"metal-emulated"`` backend's engine.

No Metal compiler exists off Apple's platforms, and clang has no Metal front end. But the
Metal source MLX generates for a launch is C++ apart from two pieces of syntax, so it is
made a C++ translation unit (``metal_translation``), compiled with clang against a stand-in
``<metal_stdlib>`` and cached (``metal_toolchain``), loaded with ctypes (plain C ABI: nothing
to install beside clang), and run under an emulator (``kernels/metal_emulation/runtime.c``:
every GPU thread a fiber, barriers released per call site, SIMD-groups of 32, threadgroup
memory fresh, NaN-filled, capped at 32 KB and guarded, device buffers guarded, threads and
groups run in a chosen order). The stacks and buffers are kept from launch to launch
(``metal_memory``). This module is the compiled kernel (:class:`EmulatedKernel`, its
launch and schedules) and compiling one; it re-exports what its users read of the others.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from workbench import validate
from workbench.backends import clang
from workbench.kernels.metal_memory import BUFFER_POOL_BYTES, LOCK, buffers_mapped, give_back, stacks_for, take_buffer
from workbench.kernels.metal_toolchain import (
    CLANG_FLAGS,
    SUPPORT_DIR,
    cache_dir,
    cached_entry_ok,
    clang_path,
    shared_object,
)
from workbench.kernels.metal_translation import MetalCompileError, Param, signature, translation_unit

__all__ = [
    "APART",
    "DEFAULT_ORDER",
    "DEFAULT_SCHEDULES",
    "EVERY",
    "ORDER_CHOICES",
    "BUFFER_POOL_BYTES",
    "CLANG_FLAGS",
    "MATH_ERRORS",
    "MATH_MODES",
    "ORDERS",
    "SCHEDULES",
    "SIMD_WIDTH",
    "SUPPORT_DIR",
    "THREADGROUP_LIMIT",
    "EmulatedKernel",
    "EmulationError",
    "MetalCompileError",
    "Param",
    "ScheduleDependenceError",
    "buffers_mapped",
    "cache_dir",
    "cached_entry_ok",
    "clang",
    "clang_path",
    "compile_all",
    "compile_fresh",
    "compile_source",
    "first_difference",
    "schedules_of",
    "signature",
    "translation_unit",
]

#: Apple GPUs' threadgroup memory a group (bytes), which the emulator enforces.
THREADGROUP_LIMIT = 32768

#: SIMD-group width on Apple GPUs.
SIMD_WIDTH = 32

#: The orders in which the emulator runs the threads of a group between synchronisations
#: (and the groups of a launch), the SIMD-groups of a group kept in step: every runnable
#: thread runs to its next synchronisation, then every SIMD-group whose lanes all arrived
#: is released. Results must be the same bits in every order.
ORDERS: tuple[str, ...] = ("ascending", "descending", "shuffled")

#: Schedules in which the SIMD-groups of a group run apart, as on an Apple GPU (SIMD-groups
#: are independent between threadgroup barriers): one SIMD-group runs as far as it can (to
#: a threadgroup barrier, or its end) before the next starts, in ascending or descending
#: SIMD-group order; or a seeded random runnable thread runs to its next synchronisation at
#: every step. Kept in step, a missing barrier between two phases that each end in a
#: SIMD-group operation goes unseen: every SIMD-group has finished the first phase before
#: any starts the second.
APART: tuple[str, ...] = ("simd-groups-ascending", "simd-groups-descending", "simd-groups-random")

#: Every schedule the emulator runs (:data:`ORDERS`, then :data:`APART`).
SCHEDULES: tuple[str, ...] = ORDERS + APART

#: ``order="default"``: the SIMD-groups in step in ascending thread order, and run apart in
#: descending SIMD-group order, compared bit for bit: the cheapest pair measured that
#: catches both kinds of race. Between the two every SIMD-group, and every lane of one, runs
#: in the opposite order, so a SIMD-group reading another's partial with no barrier reads it
#: unwritten in one and written in the other, whichever way it reads, and a dropped
#: threadgroup barrier lets the SIMD-groups pass it in opposite orders. The in-step schedule
#: costs a fifth of an apart one (``bench.emulator_cost``: the pair 6x one in-step schedule
#: at the test shape, against 10x for the two apart ones); its result is the one returned,
#: the bits the backend gave before. A single schedule is still asked for by name.
DEFAULT_ORDER = "default"
DEFAULT_SCHEDULES: tuple[str, ...] = ("ascending", "simd-groups-descending")

#: ``order="every"``: all of :data:`SCHEDULES`, compared bit for bit.
EVERY = "every"

#: What ``order`` may be wherever a launch takes one.
ORDER_CHOICES: tuple[str, ...] = (DEFAULT_ORDER, EVERY) + SCHEDULES


def schedules_of(order: str) -> tuple[str, ...]:
    """The schedules ``order`` runs (one of :data:`ORDER_CHOICES`): one by name, the
    default pair, or every schedule."""
    validate.one_of("order", order, ORDER_CHOICES)
    return DEFAULT_SCHEDULES if order == DEFAULT_ORDER else SCHEDULES if order == EVERY else (order,)


#: How ``metal::exp``, ``exp2`` and ``rsqrt`` compute (``metal_stdlib``, ``runtime.c``):
#: ``"host"`` the host's float functions (as before math modes existed); ``"precise"`` and
#: ``"fast"`` Metal's two contracts (MSL spec 8.4: precise exp/exp2 within 4 ulp, rsqrt
#: correctly rounded; fast exp/exp2 within 3 + floor(|2x|) ulp, rsqrt 2 ulp, subnormals
#: flushed to zero). ``metal::precise::`` and ``metal::fast::`` calls keep their own mode.
MATH_MODES: tuple[str, ...] = ("host", "precise", "fast")

#: Where inside the bound a precise or fast result lands: the correctly rounded result
#: moved up to the bound's upper edge, down to its lower edge, or to a random point in it
#: (seeded, and a function of the input alone, so schedules still agree).
MATH_ERRORS: tuple[str, ...] = ("edge-high", "edge-low", "random")


class EmulationError(RuntimeError):
    """The emulator stopped a launch: a divergent barrier, lanes at two different SIMD-group
    operations, a shuffle from an inactive lane, a memory fault (a guard page), threadgroup
    memory over the limit; the message says which and where."""


class ScheduleDependenceError(EmulationError):
    """A launch gave different bits in two schedules: the result depends on how threads and
    SIMD-groups interleave, a race (typically a missing threadgroup barrier). The message
    names the first differing output (name and index) and the two schedules."""


def first_difference(results: dict[str, Sequence[np.ndarray]], names: Sequence[str]) -> None:
    """Raise :class:`ScheduleDependenceError` unless every schedule's outputs are the same bits.

    ``results``: the outputs of one launch by schedule name, each in ``names``' order. Bits,
    not values, are compared: a race can move a float by one ulp, and NaN must equal NaN.
    The first schedule is the reference; the error names the first output (in ``names``'
    order) and its first index (row-major) where another schedule differs.
    """
    schedules = list(results)
    ref = schedules[0]
    for name_index, name in enumerate(names):
        a = np.ascontiguousarray(results[ref][name_index])
        bits_a = a.view(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else a
        for other in schedules[1:]:
            b = np.ascontiguousarray(results[other][name_index])
            bits_b = b.view(f"u{b.dtype.itemsize}") if b.dtype.itemsize in (1, 2, 4, 8) else b
            diff = np.flatnonzero(bits_a.reshape(-1) != bits_b.reshape(-1))
            if diff.size:
                i = int(diff[0])
                index = tuple(int(x) for x in np.unravel_index(i, a.shape)) if a.ndim else ()
                raise ScheduleDependenceError(
                    f"output '{name}' differs between schedules '{ref}' and '{other}' first at index {index}: "
                    f"{a.reshape(-1)[i]!r} vs {b.reshape(-1)[i]!r} ({diff.size} of {a.size} elements differ); a "
                    "result that depends on the schedule is a race, typically a missing threadgroup_barrier"
                )


def _check_dims(grid: Sequence[int], threadgroup: Sequence[int]) -> None:
    """``grid`` and ``threadgroup``: three integers >= 1 each, at most 1024 threads a group."""
    for name, value in (("grid", grid), ("threadgroup", threadgroup)):
        if len(value) != 3:
            raise ValueError(f"{name} must be three integers (x, y, z), got {tuple(value)!r}")
        for v in value:
            validate.integer(name, v, minimum=1, maximum=2**32 - 1)
    n = int(threadgroup[0]) * int(threadgroup[1]) * int(threadgroup[2])
    if n > 1024:
        raise ValueError(f"threadgroup={tuple(threadgroup)!r}: {n} threads; allowed: at most 1024 a group")


#: Launch arguments already validated (ints and strings only, so an equal key is the same
#: values of the same types): a repeated launch skips the eight checks.
_VALID_LAUNCHES: set[tuple] = set()


class EmulatedKernel:
    """One compiled kernel; :meth:`launch` runs it over a grid on the CPU."""

    def __init__(self, lib: ctypes.CDLL, source: str) -> None:
        self._lib = lib
        self.source = source
        self.name, self.params, _ = signature(source)
        self._n_buffers = sum(p.buffer is not None for p in self.params)
        self._entry = ctypes.cast(lib.metal_emulation_entry, ctypes.c_void_p)
        self._error = ctypes.create_string_buffer(4096)  # written under LOCK only

    def launch(
        self,
        inputs: Sequence[np.ndarray],
        outputs: Sequence[tuple[tuple[int, ...], Any]],
        *,
        groups: int | None = None,
        threads: int | None = None,
        grid: Sequence[int] | None = None,
        threadgroup: Sequence[int] | None = None,
        order: str = "ascending",
        seed: int = 0,
        init_value: float | None = None,
        last_threads: int | None = None,
        threadgroup_memory: int = THREADGROUP_LIMIT,
        math_mode: str = "host",
        math_error: str = "edge-high",
    ) -> list[np.ndarray]:
        """Run ``groups`` threadgroups of ``threads`` threads (1-D), or a ``grid`` of threads
        in groups of ``threadgroup`` (three integers each, as Metal's ``dispatchThreads``
        takes them: partial groups at the edges); return the outputs.

        ``inputs``: the input buffers in the signature's order (numpy arrays, copied into
        guarded buffers); ``outputs``: ``(shape, numpy dtype)`` each, NaN-filled before the
        launch so an element no thread writes shows (filled with ``init_value`` instead
        when it is given, as MLX's ``init_value``). ``order``: one of :data:`SCHEDULES`.
        ``last_threads``: the last group's threads when the grid is not a multiple of the
        group (Metal runs a partial last group; default ``threads``). ``threadgroup_memory``:
        the bytes of threadgroup memory a group may declare (at most Apple GPUs' 32 KB).
        ``math_mode``, ``math_error``: :data:`MATH_MODES`, :data:`MATH_ERRORS` (``seed``
        seeds the random one too). Raises :class:`EmulationError` with the emulator's diagnosis.
        """
        if (grid is None) != (threadgroup is None) or (grid is None) == (groups is None or threads is None):
            raise ValueError("groups/threads, grid/threadgroup: give groups and threads (1-D) or grid and threadgroup")
        dims = (tuple(grid), tuple(threadgroup)) if grid is not None and threadgroup is not None else ()
        key = (order, groups, threads, last_threads, *dims, threadgroup_memory, math_mode, math_error, seed)
        plain = all(type(v) in (int, str, type(None), tuple) for v in key)
        if not plain or key not in _VALID_LAUNCHES:
            validate.one_of("order", order, SCHEDULES)
            if dims:
                _check_dims(dims[0], dims[1])
            else:
                validate.integer("groups", groups, minimum=1)
                validate.integer("threads", threads, minimum=1, maximum=1024)
                if last_threads is not None:
                    validate.integer("last_threads", last_threads, minimum=1, maximum=threads)
            validate.integer("threadgroup_memory", threadgroup_memory, minimum=16, maximum=THREADGROUP_LIMIT)
            validate.one_of("math_mode", math_mode, MATH_MODES)
            validate.one_of("math_error", math_error, MATH_ERRORS)
            validate.integer("seed", seed, minimum=0, maximum=2**63 - 1)
            if plain and len(_VALID_LAUNCHES) < 4096:
                _VALID_LAUNCHES.add(key)
        if dims:
            grid3, group3 = (int(v) for v in dims[0]), (int(v) for v in dims[1])
        else:
            last = int(threads) if last_threads is None else int(last_threads)
            grid3, group3 = ((int(groups) - 1) * int(threads) + last, 1, 1), (int(threads), 1, 1)
        grid3, group3 = tuple(grid3), tuple(group3)
        threads = group3[0] * group3[1] * group3[2]
        seed, tg_limit = int(seed), int(threadgroup_memory)
        buffers = [np.ascontiguousarray(a) for a in inputs]
        if len(buffers) + len(outputs) != self._n_buffers:
            raise ValueError(
                f"inputs and outputs: {self.name} takes {self._n_buffers} buffers, got {len(buffers)} + {len(outputs)}"
            )
        outs = [np.empty(shape, dtype=dt) for shape, dt in outputs]
        lib = self._lib
        taken: list[tuple[int, int, np.ndarray]] = []
        with LOCK:  # the emulator's state is global to its shared object; one launch at a time
            try:
                ptrs = []
                for a in buffers:
                    base, pages, view, off = take_buffer(lib, max(a.nbytes, 1))
                    taken.append((base, pages, view))
                    ptrs.append(base + off)
                    view[off:] = a.reshape(-1).view(np.uint8) if a.nbytes else 0
                spans = []
                for a in outs:
                    base, pages, view, off = take_buffer(lib, max(a.nbytes, 1))
                    taken.append((base, pages, view))
                    ptrs.append(base + off)
                    view[off:] = 0xFF  # NaN in every float: an element no thread writes shows
                    if init_value is not None:
                        fill = np.full(a.shape, init_value, dtype=a.dtype)
                        view[off : off + a.nbytes] = fill.reshape(-1).view(np.uint8)
                    spans.append((view, off))
                arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
                stacks_for(lib, threads)
                lib.metal_emulation_set_math(MATH_MODES.index(math_mode), MATH_ERRORS.index(math_error), seed)
                rc = lib.metal_emulation_launch(
                    self._entry,
                    arr,
                    (ctypes.c_uint * 3)(*grid3),
                    (ctypes.c_uint * 3)(*group3),
                    SCHEDULES.index(order),
                    seed,
                    tg_limit,
                    self._error,
                    len(self._error),
                )
                if rc != 0:
                    raise EmulationError(f"{self.name}: {self._annotate(self._error.value.decode())}")
                for a, (view, off) in zip(outs, spans):
                    a.reshape(-1).view(np.uint8)[:] = view[off : off + a.nbytes]
            finally:
                for base, pages, view in taken:
                    give_back(lib, base, pages, view)
        return outs

    def launch_every(
        self,
        inputs: Sequence[np.ndarray],
        outputs: Sequence[tuple[tuple[int, ...], Any]],
        *,
        names: Sequence[str],
        schedules: Sequence[str] = SCHEDULES,
        **launch: Any,
    ) -> list[np.ndarray]:
        """:meth:`launch` in every schedule of ``schedules`` (``launch``: its other keywords);
        the outputs, after :func:`first_difference` has checked they are the same bits in all
        of them (``names``: the outputs' names, for its message)."""
        if not schedules:
            raise ValueError("schedules: give at least one; allowed: any of " + ", ".join(SCHEDULES))
        if len(names) != len(outputs):
            raise ValueError(f"names: {len(outputs)} outputs need {len(outputs)} names, got {len(names)}")
        results = {s: self.launch(inputs, outputs, order=s, **launch) for s in schedules}
        first_difference(results, names)
        return results[schedules[0]]

    def run(
        self,
        inputs: Sequence[np.ndarray],
        outputs: Sequence[tuple[tuple[int, ...], Any]],
        *,
        names: Sequence[str],
        order: str = DEFAULT_ORDER,
        **launch: Any,
    ) -> list[np.ndarray]:
        """:meth:`launch` in the schedules ``order`` names (:func:`schedules_of`), compared
        bit for bit when there are several (:meth:`launch_every`)."""
        schedules = schedules_of(order)
        if len(schedules) == 1:
            return self.launch(inputs, outputs, order=schedules[0], **launch)
        return self.launch_every(inputs, outputs, names=names, schedules=schedules, **launch)

    def _annotate(self, message: str) -> str:
        """The emulator's message with the source lines it names quoted."""
        lines = self.source.splitlines()
        quoted = []
        for n in dict.fromkeys(int(x) for x in re.findall(r"line (\d+)", message)):
            if 1 <= n <= len(lines):
                quoted.append(f"  line {n}: {lines[n - 1].strip()}")
        return message + ("\n" + "\n".join(quoted) if quoted else "")


# -- compiling --------------------------------------------------------------------------


def compile_source(source: str) -> EmulatedKernel:
    """:func:`compile_fresh` once a source and clang per process (then the same kernel).
    The clang is looked up by the environment it is found from, so with $WORKBENCH_CLANG or
    $PATH pointing nowhere this still raises ``BackendUnavailable`` rather than running a
    kernel compiled earlier."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError(
            f"source: must be MLX's generated Metal source, a non-empty string, got {validate.describe(source)}"
        )
    return _compiled(clang_path(), source)


# Keyed by clang's path and the source; bounded: a launch after the first pays no
# translation-unit build, hashing, file reading or verification again.
@lru_cache(maxsize=256)
def _compiled(cc: str | None, source: str) -> EmulatedKernel:
    return compile_fresh(source)


def compile_fresh(source: str) -> EmulatedKernel:
    """MLX's generated Metal ``source`` compiled for the emulator (cached by hash).

    Raises :class:`MetalCompileError` with clang's diagnostics (lines numbered as in
    ``source``) when it does not compile, and ``backends.BackendUnavailable`` without clang.
    """
    so = shared_object(translation_unit(source), signature(source)[0])
    return _load(str(so), source)


def compile_all(sources: Sequence[str], workers: int | None = None) -> list[EmulatedKernel]:
    """:func:`compile_source` for several sources at once, ``workers`` clang processes in
    parallel (default: the CPUs this process may use): a test run compiles its kernels first."""
    from concurrent.futures import ThreadPoolExecutor

    n = workers or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(compile_source, sources))


# Keyed by the shared object's path and the source; bounded: ctypes keeps a library loaded
# for the process's life, so one path is loaded once, however many sources share it.
@lru_cache(maxsize=256)
def _load(path: str, source: str) -> EmulatedKernel:
    lib = ctypes.CDLL(path)
    lib.metal_emulation_launch.restype = ctypes.c_int
    lib.metal_emulation_launch.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_uint),
        ctypes.POINTER(ctypes.c_uint),
        ctypes.c_int,
        ctypes.c_ulong,
        ctypes.c_ulong,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.metal_emulation_set_math.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_ulong]
    lib.metal_emulation_stacks.restype = ctypes.c_void_p
    lib.metal_emulation_stacks.argtypes = [ctypes.c_int]
    lib.metal_emulation_stacks_free.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.metal_emulation_use_stacks.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.metal_emulation_buffer.restype = ctypes.c_void_p
    lib.metal_emulation_buffer.argtypes = [ctypes.c_size_t, ctypes.c_int]
    lib.metal_emulation_buffer_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return EmulatedKernel(lib, source)


# -- running ---------------------------------------------------------------------------------
