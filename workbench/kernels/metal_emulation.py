"""Metal kernels compiled and executed on the CPU: the ``"metal-emulated"`` backend's engine.

No Metal compiler exists off Apple's platforms, and clang has no Metal front end. But the
complete Metal source MLX generates for a launch (``emulated.generated_source``) is C++
apart from two pieces of syntax, so it compiles with clang as C++17 against a stand-in
``<metal_stdlib>`` (``kernels/metal_emulation/metal_stdlib``: Metal's address spaces as
clang address spaces, clang vector types with Metal's counted constructors, a
size-checked ``as_type``, no ``double``) and runs under an emulator
(``kernels/metal_emulation/runtime.c``: every GPU thread a fiber, barriers released per
call site, SIMD-groups of 32, threadgroup memory fresh, NaN-filled, capped at 32 KB and
guarded, device buffers guarded, threads and groups run in a chosen order). The fiber
stacks, group memory and device buffers are kept from launch to launch, each cleared so
that a launch sees exactly what fresh memory would show it.

The two rewrites (:func:`translation_unit`), both mechanical:

1. a function-scope ``threadgroup T name[N];`` (Metal's kernel-scope group memory; C++
   has no automatic variables in another address space) becomes a reference to the
   group's array, which the emulator allocates (``typedef T A[N]; threadgroup A& name =
   ...``);
2. MLX's instantiation line ``template [[host_name("...")]] [[kernel]] decltype(...) ...;``
   loses its two attribute lists (C++ allows none there).

Then an ``extern "C"`` entry is appended that calls the instantiated kernel with the
launch's buffers and the thread's attributes, by the names in MLX's generated signature.
The shared object is loaded with ctypes: it is plain C ABI, so no binding library
(pybind11, cffi) is needed, and nothing else has to be installed beside clang.

Compiled kernels are cached by the hash of everything that goes into them (the
translation unit, the stand-in header, the runtime, the flags, clang's version) in
``$WORKBENCH_METAL_EMULATION_CACHE`` or else a folder in the system's temporary
directory; a cached object is written atomically under its lock, with its size and
SHA-256 beside it, and verified before every load (a bad entry is rebuilt).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from workbench import files, validate
from workbench.backends import BackendUnavailable, clang
from workbench.kernels.source import KERNEL_DIR

#: The stand-in header and the emulator's runtime.
SUPPORT_DIR = KERNEL_DIR / "metal_emulation"

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

#: clang's flags: C++17; no floating-point contraction beyond the source's own fma calls
#: (so results do not depend on the optimiser); an unsuffixed literal such as ``0.1`` is a
#: float, as Metal compiles it (Metal has no double, so ``x * 0.1`` is float arithmetic
#: there; computed in double here it would round differently); unknown Metal attributes
#: ([[kernel]], [[buffer(i)]]) ignored. The ``double`` type itself is refused by the
#: stand-in header.
#: On Linux, -Bsymbolic binds each kernel's calls into the runtime to its own copy (every
#: kernel's shared object carries the runtime; ctypes loads them side by side).
CLANG_FLAGS: tuple[str, ...] = ("-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off",
                                "-fno-strict-aliasing", "-Wno-unknown-attributes", "-cl-single-precision-constant",
                                *(("-Wl,-Bsymbolic",) if sys.platform.startswith("linux") else ()))

#: MLX's thread attributes -> the C expression of the emulator's per-thread ids.
_ATTRIBUTES: dict[str, tuple[str, str, str]] = {
    "thread_position_in_threadgroup": ("t->tpitg[0]", "t->tpitg[1]", "t->tpitg[2]"),
    "threadgroup_position_in_grid": ("t->tgpig[0]", "t->tgpig[1]", "t->tgpig[2]"),
    "threadgroups_per_grid": ("t->tpg[0]", "t->tpg[1]", "t->tpg[2]"),
    "threads_per_threadgroup": ("t->tptg[0]", "t->tptg[1]", "t->tptg[2]"),
    "thread_position_in_grid": ("t->tpig[0]", "0u", "0u"),
    "thread_index_in_simdgroup": ("t->simd_lane", "0u", "0u"),
    "simdgroup_index_in_threadgroup": ("t->simd_group", "0u", "0u"),
    "thread_index_in_threadgroup": ("t->tpitg[0]", "0u", "0u"),
}


class MetalCompileError(ValueError):
    """The Metal source does not compile against the stand-in header (clang's message attached)."""


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
                    "result that depends on the schedule is a race, typically a missing threadgroup_barrier")


def cache_dir() -> Path:
    """Where compiled kernels are kept (``$WORKBENCH_METAL_EMULATION_CACHE``, else a folder
    of this user's in the system's temporary directory)."""
    env = os.environ.get("WORKBENCH_METAL_EMULATION_CACHE")
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"workbench-metal-emulation-{os.getuid()}"


# -- the translation unit -----------------------------------------------------------------

_INSTANTIATION = re.compile(r"template\s*\[\[host_name\([^)]*\)\]\]\s*\[\[kernel\]\]\s*decltype")
_KERNEL = re.compile(r"\[\[kernel\]\]\s*void\s+(\w+)\s*\((.*?)\)\s*\{", re.S)
_PARAM = re.compile(r"^(?P<type>.+?)\s*(?P<name>\w+)\s*\[\[(?P<attr>\w+)(?:\((?P<index>\d+)\))?\]\]$", re.S)


def _group_memory_rewrite(body: str, qualifiers: Sequence[str]) -> str:
    """Rewrite 1: each ``threadgroup T name[N]...;`` statement -> a reference to the
    group's array from the emulator (``qualifiers``: ``threadgroup`` and every macro the
    source defines as it)."""
    pattern = re.compile(r"^(?P<indent>[ \t]*)(?:" + "|".join(map(re.escape, qualifiers)) +
                         r")\s+(?P<type>[\w:<>, ]+?)\s+(?P<name>\w+)\s*(?P<dims>(?:\[[^\]\n]+\])+)\s*;", re.M)

    def sub(m: re.Match[str]) -> str:
        t, n, d = m.group("type"), m.group("name"), m.group("dims")
        a = f"metal_emulation_array_{n}"  # a typedef: `float4 (` would call float4's constructor macro
        return (f"{m.group('indent')}typedef {t} {a}{d}; threadgroup {a}& {n} = *(threadgroup {a}*)"
                f"metal_emulation_threadgroup_alloc(sizeof({a}), alignof({t}), \"{n}\");")

    return pattern.sub(sub, body)


@dataclass(frozen=True)
class Param:
    """One parameter of MLX's generated kernel signature."""

    type: str
    name: str
    attribute: str
    buffer: int | None


def signature(source: str) -> tuple[str, list[Param], str]:
    """``(kernel name, parameters, template arguments)`` of the generated Metal source."""
    m = _KERNEL.search(source)
    if m is None:
        raise MetalCompileError("the source has no `[[kernel]] void name(...)` signature (is it MLX's generated source?)")
    params = []
    for text in _split_params(m.group(2)):
        p = _PARAM.match(text.strip())
        if p is None:
            raise MetalCompileError(f"cannot read the kernel parameter {text.strip()!r}")
        index = p.group("index")
        params.append(Param(p.group("type").strip(), p.group("name"), p.group("attr"),
                             None if index is None else int(index)))
    inst = re.search(r"decltype\(\s*" + re.escape(m.group(1)) + r"\s*<(.*?)>\s*\)", source, re.S)
    return m.group(1), params, "" if inst is None else inst.group(1)


def _split_params(text: str) -> list[str]:
    """The signature's parameters: split at the commas outside brackets."""
    out: list[str] = []
    depth, cur = 0, []
    for ch in text:
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        depth += ch in "<(["
        depth -= ch in ">)]"
        cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return out


def _entry(name: str, params: list[Param], targs: str) -> str:
    """The ``extern "C"`` entry the emulator calls for each thread."""
    args = []
    for p in params:
        if p.attribute == "buffer":
            if p.type.endswith("&"):
                args.append(f"*({p.type[:-1].strip()}*)b[{p.buffer}]")
            else:
                args.append(f"({p.type})b[{p.buffer}]")
        elif p.attribute in _ATTRIBUTES:
            x, y, z = _ATTRIBUTES[p.attribute]
            if p.type.endswith("3"):
                args.append(f"{p.type}({x}, {y}, {z})")
            elif p.type.endswith("2"):
                args.append(f"{p.type}({x}, {y})")
            else:
                args.append(f"({p.type})({x})")
        else:
            raise MetalCompileError(f"the kernel parameter attribute [[{p.attribute}]] is not emulated")
    call = f"{name}<{targs}>" if targs else name
    return ("\nstruct metal_emulation_ids {\n  unsigned tpitg[3], tgpig[3], tpg[3];\n"
            "  unsigned simd_lane, simd_group, tptg[3];\n  unsigned tpig[3];\n};\n"
            'extern "C" void metal_emulation_entry(void* const* b, const metal_emulation_ids* t) {\n'
            f"  {call}(\n    " + ",\n    ".join(args) + ");\n}\n")


def translation_unit(source: str) -> str:
    """The C++ file clang compiles for MLX's generated Metal ``source``: the stand-in
    header, the source with the two rewrites, and the emulator's entry."""
    name, params, targs = signature(source)
    qualifiers = ["threadgroup"] + re.findall(r"^\s*#\s*define\s+(\w+)\s+threadgroup\s*$", source, re.M)
    start = source.index("[[kernel]] void " + name)
    body = source[:start] + _group_memory_rewrite(source[start:], qualifiers)
    body = _INSTANTIATION.sub("template decltype", body)
    return "#include <metal_stdlib>\n#line 1 \"metal_source\"\n" + body + "\n" + _entry(name, params, targs)


# -- compiling -----------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _clang_version(path: str) -> str:
    return subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout.splitlines()[0]


def _support_text() -> str:
    return "".join((SUPPORT_DIR / f).read_text() for f in ("metal_stdlib", "runtime.c"))


_LOCK = threading.Lock()

#: The process's fiber stacks (address, threads), shared by every kernel's runtime and
#: grown to the largest group launched so far; used under ``_LOCK`` only.
_STACKS: list[int] = [0, 0]


def _stacks_for(lib: ctypes.CDLL, threads: int) -> None:
    """Hand ``lib``'s runtime the process's stacks, grown to ``threads`` if need be (one
    mapping for every kernel: each runtime keeping its own would exhaust the process's
    memory areas after a few dozen kernels). Call under ``_LOCK``."""
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
#: ``_LOCK`` only. A launch takes its buffers from here and gives them back: mapping,
#: guarding and unmapping a buffer cost three system calls and a fault a page, every launch.
_BUFFERS: dict[int, list[tuple[int, np.ndarray]]] = {}
_BUFFER_BYTES: list[int] = [0]
_MAPPED: list[int] = [0]


def buffers_mapped() -> int:
    """How many device buffers this process has mapped so far: a launch whose buffers' sizes
    an earlier launch already had maps none."""
    return _MAPPED[0]


def _take_buffer(lib: ctypes.CDLL, n: int) -> tuple[int, int, np.ndarray, int]:
    """``(mapping, pages, its bytes as numpy, data offset)``: a device buffer of ``n`` bytes
    (n >= 1) whose last byte sits right before a guard page, the pages' bytes before the data
    zero, as in a fresh mapping (the caller writes all ``n`` data bytes): so a reused buffer
    shows a launch nothing an earlier one left. Call under ``_LOCK``."""
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


def _give_back(lib: ctypes.CDLL, base: int, pages: int, view: np.ndarray) -> None:
    """A buffer from :func:`_take_buffer` kept for a later launch, or unmapped when the idle
    buffers would pass :data:`BUFFER_POOL_BYTES`. Call under ``_LOCK``."""
    if _BUFFER_BYTES[0] + pages * _PAGE <= BUFFER_POOL_BYTES:
        _BUFFERS.setdefault(pages, []).append((base, view))
        _BUFFER_BYTES[0] += pages * _PAGE
    else:
        lib.metal_emulation_buffer_free(base, pages * _PAGE)


def _sum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sum")


def _digest(path: Path) -> str:
    data = path.read_bytes()
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def cached_entry_ok(path: Path) -> bool:
    """Whether a compile-cache entry is whole: its size and SHA-256 match the ``.sum`` written
    beside it when it was built. Checked before every load, because ctypes loading a
    truncated, scrambled or swapped shared object can crash the process rather than raise."""
    try:
        return _sum_path(path).read_text().strip() == _digest(path)
    except OSError:
        return False


def _cached(target: Path, build: Callable[[Path], None]) -> Path:
    """``target`` from the compile cache, verified; (re)built under the entry's lock when
    missing or bad: ``build(out)`` writes a fresh file, which replaces ``target`` atomically,
    then its ``.sum``."""
    if cached_entry_ok(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with files.locked(target):
        if cached_entry_ok(target):  # another process rebuilt it while this one waited
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as d:
            out = Path(d) / target.name
            build(out)
            digest = _digest(out)
            os.replace(out, target)
        files.write_atomic(_sum_path(target), digest + "\n")
    return target


def _runtime_object(cc: str, folder: Path) -> Path:
    """The emulator's runtime compiled once (C11) for every kernel to link, cached by hash."""
    text = (SUPPORT_DIR / "runtime.c").read_text()
    key = hashlib.sha256("\0".join((text, _clang_version(cc))).encode()).hexdigest()[:24]

    def build(out: Path) -> None:
        r = subprocess.run([cc, "-x", "c", "-std=c11", "-O2", "-fPIC", "-c", "-o", str(out),
                            str(SUPPORT_DIR / "runtime.c")], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise MetalCompileError(f"the emulator's runtime does not compile:\n{r.stderr[-4000:]}")

    return _cached(folder / f"runtime-{key}.o", build)


#: Kernels compiled (or verified and loaded) in this process, by source: a launch after the
#: first pays no translation-unit build, hashing, file reading or verification again.
_COMPILED: dict[tuple[str | None, str], "EmulatedKernel"] = {}

#: Launch arguments already validated (ints and strings only, so an equal key is the same
#: values of the same types): a repeated launch skips the eight checks.
_VALID_LAUNCHES: set[tuple] = set()


#: clang's path by ($WORKBENCH_CLANG, $PATH): the search stats a dozen paths, and a launch
#: asks for it; keyed by the variables it reads, so changing them is still seen.
_CLANG_BY_ENV: dict[tuple[str | None, str | None], str | None] = {}


def clang_path() -> str | None:
    """The clang++ the emulator compiles with (``backends.clang``), looked up once for each
    value of the variables it is found by, ``$WORKBENCH_CLANG`` and ``$PATH``."""
    env = (os.environ.get("WORKBENCH_CLANG"), os.environ.get("PATH"))
    if env not in _CLANG_BY_ENV:
        _CLANG_BY_ENV[env] = clang()
    return _CLANG_BY_ENV[env]


def compile_source(source: str) -> "EmulatedKernel":
    """:func:`compile_fresh` once a source and clang per process (then the same kernel).
    The clang is looked up by the environment it is found from, so with $WORKBENCH_CLANG or
    $PATH pointing nowhere this still raises ``BackendUnavailable`` rather than running a
    kernel compiled earlier."""
    key = (clang_path(), source)
    kernel = _COMPILED.get(key)
    if kernel is None:
        kernel = compile_fresh(source)
        if key[0] is not None:
            _COMPILED[key] = kernel
    return kernel


def compile_fresh(source: str) -> "EmulatedKernel":
    """MLX's generated Metal ``source`` compiled for the emulator (cached by hash).

    Raises :class:`MetalCompileError` with clang's diagnostics (lines numbered as in
    ``source``) when it does not compile, and ``backends.BackendUnavailable`` without clang.
    """
    cc = clang()
    if cc is None:
        raise BackendUnavailable("compiling Metal source for the emulator needs clang++: apt-get install clang "
                                 "(Debian/Ubuntu), or set $WORKBENCH_CLANG to a clang++ on the PATH")
    tu = translation_unit(source)
    key = hashlib.sha256("\0".join((tu, _support_text(), " ".join(CLANG_FLAGS), _clang_version(cc))).encode())
    folder = cache_dir()

    def build(out: Path) -> None:
        runtime = _runtime_object(cc, folder)
        cpp = out.with_name("kernel.cpp")
        cpp.write_text(tu)
        r = subprocess.run([cc, *CLANG_FLAGS, "-I", str(SUPPORT_DIR), "-o", str(out), str(cpp), str(runtime)],
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise MetalCompileError(f"the Metal source of {signature(source)[0]} does not compile against the "
                                    f"stand-in <metal_stdlib>:\n{r.stderr[-6000:]}")

    so = _cached(folder / f"{key.hexdigest()[:24]}.so", build)
    return _load(str(so), source)


def compile_all(sources: Sequence[str], workers: int | None = None) -> list["EmulatedKernel"]:
    """:func:`compile_source` for several sources at once, ``workers`` clang processes in
    parallel (default: the CPUs this process may use): a test run compiles its kernels first."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    n = workers or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(compile_source, sources))


@lru_cache(maxsize=256)
def _load(path: str, source: str) -> "EmulatedKernel":
    lib = ctypes.CDLL(path)
    lib.metal_emulation_launch.restype = ctypes.c_int
    lib.metal_emulation_launch.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint,
                                           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_ulong,
                                           ctypes.c_ulong, ctypes.c_char_p, ctypes.c_size_t]
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


class EmulatedKernel:
    """One compiled kernel; :meth:`launch` runs it over a grid on the CPU."""

    def __init__(self, lib: ctypes.CDLL, source: str) -> None:
        self._lib = lib
        self.source = source
        self.name, self.params, _ = signature(source)
        self._n_buffers = sum(p.buffer is not None for p in self.params)
        self._entry = ctypes.cast(lib.metal_emulation_entry, ctypes.c_void_p)
        self._error = ctypes.create_string_buffer(4096)  # written under _LOCK only

    def launch(self, inputs: Sequence[np.ndarray], outputs: Sequence[tuple[tuple[int, ...], Any]], *, groups: int,
               threads: int, order: str = "ascending", seed: int = 0,
               init_value: float | None = None, last_threads: int | None = None,
               threadgroup_memory: int = THREADGROUP_LIMIT, math_mode: str = "host",
               math_error: str = "edge-high") -> list[np.ndarray]:
        """Run ``groups`` threadgroups of ``threads`` threads; return the outputs.

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
        key = (order, groups, threads, last_threads, threadgroup_memory, math_mode, math_error, seed)
        plain = all(type(v) in (int, str, type(None)) for v in key)
        if not plain or key not in _VALID_LAUNCHES:
            validate.one_of("order", order, SCHEDULES)
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
        groups, threads, seed, tg_limit = int(groups), int(threads), int(seed), int(threadgroup_memory)
        last = threads if last_threads is None else int(last_threads)
        buffers = [np.ascontiguousarray(a) for a in inputs]
        if len(buffers) + len(outputs) != self._n_buffers:
            raise ValueError(f"inputs and outputs: {self.name} takes {self._n_buffers} buffers, got {len(buffers)} + "
                             f"{len(outputs)}")
        outs = [np.empty(shape, dtype=dt) for shape, dt in outputs]
        lib = self._lib
        taken: list[tuple[int, int, np.ndarray]] = []
        with _LOCK:  # the emulator's state is global to its shared object; one launch at a time
            try:
                ptrs = []
                for a in buffers:
                    base, pages, view, off = _take_buffer(lib, max(a.nbytes, 1))
                    taken.append((base, pages, view))
                    ptrs.append(base + off)
                    view[off:] = a.reshape(-1).view(np.uint8) if a.nbytes else 0
                spans = []
                for a in outs:
                    base, pages, view, off = _take_buffer(lib, max(a.nbytes, 1))
                    taken.append((base, pages, view))
                    ptrs.append(base + off)
                    view[off:] = 0xFF  # NaN in every float: an element no thread writes shows
                    if init_value is not None:
                        fill = np.full(a.shape, init_value, dtype=a.dtype)
                        view[off:off + a.nbytes] = fill.reshape(-1).view(np.uint8)
                    spans.append((view, off))
                arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
                _stacks_for(lib, threads)
                lib.metal_emulation_set_math(MATH_MODES.index(math_mode), MATH_ERRORS.index(math_error), seed)
                rc = lib.metal_emulation_launch(self._entry, arr, groups, threads, last, SCHEDULES.index(order), seed,
                                                tg_limit, self._error, len(self._error))
                if rc != 0:
                    raise EmulationError(f"{self.name}: {self._annotate(self._error.value.decode())}")
                for a, (view, off) in zip(outs, spans):
                    a.reshape(-1).view(np.uint8)[:] = view[off:off + a.nbytes]
            finally:
                for base, pages, view in taken:
                    _give_back(lib, base, pages, view)
        return outs

    def launch_every(self, inputs: Sequence[np.ndarray], outputs: Sequence[tuple[tuple[int, ...], Any]], *,
                     names: Sequence[str], schedules: Sequence[str] = SCHEDULES, **launch: Any) -> list[np.ndarray]:
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

    def _annotate(self, message: str) -> str:
        """The emulator's message with the source lines it names quoted."""
        lines = self.source.splitlines()
        quoted = []
        for n in dict.fromkeys(int(x) for x in re.findall(r"line (\d+)", message)):
            if 1 <= n <= len(lines):
                quoted.append(f"  line {n}: {lines[n - 1].strip()}")
        return message + ("\n" + "\n".join(quoted) if quoted else "")
