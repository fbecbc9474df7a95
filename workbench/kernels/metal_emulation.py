"""Metal kernels compiled and executed on the CPU: the ``"metal-emulated"`` backend's engine.

No Metal compiler exists off Apple's platforms, and clang has no Metal front end. But the
complete Metal source MLX generates for a launch (``emulated.generated_source``) is C++
apart from two pieces of syntax, so it compiles with clang as C++17 against a stand-in
``<metal_stdlib>`` (``kernels/metal_emulation/metal_stdlib``: Metal's address spaces as
clang address spaces, clang vector types with Metal's counted constructors, a
size-checked ``as_type``, no ``double``) and runs under an emulator
(``kernels/metal_emulation/runtime.c``: every GPU thread a fiber, barriers released per
call site, SIMD-groups of 32, threadgroup memory fresh, NaN-filled, capped at 32 KB and
guarded, device buffers guarded, threads and groups run in a chosen order).

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
#: (and the groups of a launch). Results must be the same bits in every order.
ORDERS: tuple[str, ...] = ("ascending", "descending", "shuffled")

#: clang's flags: C++17; no floating-point contraction beyond the source's own fma calls
#: (so results do not depend on the optimiser); float promoted to double is an error as
#: Metal has no double; unknown Metal attributes ([[kernel]], [[buffer(i)]]) ignored.
#: On Linux, -Bsymbolic binds each kernel's calls into the runtime to its own copy (every
#: kernel's shared object carries the runtime; ctypes loads them side by side).
CLANG_FLAGS: tuple[str, ...] = ("-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off",
                                "-fno-strict-aliasing", "-Wno-unknown-attributes", "-Werror=double-promotion",
                                *(("-Wl,-Bsymbolic",) if sys.platform.startswith("linux") else ()))

#: MLX's thread attributes -> the C expression of the emulator's per-thread ids.
_ATTRIBUTES: dict[str, tuple[str, str, str]] = {
    "thread_position_in_threadgroup": ("t->tpitg[0]", "t->tpitg[1]", "t->tpitg[2]"),
    "threadgroup_position_in_grid": ("t->tgpig[0]", "t->tgpig[1]", "t->tgpig[2]"),
    "threadgroups_per_grid": ("t->tpg[0]", "t->tpg[1]", "t->tpg[2]"),
    "threads_per_threadgroup": ("t->tptg[0]", "t->tptg[1]", "t->tptg[2]"),
    "thread_position_in_grid": ("t->tgpig[0] * t->tptg[0] + t->tpitg[0]", "0u", "0u"),
    "thread_index_in_simdgroup": ("t->simd_lane", "0u", "0u"),
    "simdgroup_index_in_threadgroup": ("t->simd_group", "0u", "0u"),
    "thread_index_in_threadgroup": ("t->tpitg[0]", "0u", "0u"),
}


class MetalCompileError(ValueError):
    """The Metal source does not compile against the stand-in header (clang's message attached)."""


class EmulationError(RuntimeError):
    """The emulator stopped a launch: a divergent barrier or SIMD-group operation, a memory
    fault (a guard page), threadgroup memory over 32 KB; the message says which and where."""


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
            "  unsigned simd_lane, simd_group, tptg[3];\n};\n"
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


def compile_source(source: str) -> "EmulatedKernel":
    """:func:`compile_fresh` once a source and clang per process (then the same kernel).
    The clang is looked up on every call, so a machine without one still raises
    ``BackendUnavailable`` rather than running a kernel compiled earlier."""
    key = (clang(), source)
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
                                           ctypes.c_int, ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p,
                                           ctypes.c_size_t]
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

    def launch(self, inputs: Sequence[np.ndarray], outputs: Sequence[tuple[tuple[int, ...], Any]], *, groups: int,
               threads: int, order: str = "ascending", seed: int = 0,
               init_value: float | None = None) -> list[np.ndarray]:
        """Run ``groups`` threadgroups of ``threads`` threads; return the outputs.

        ``inputs``: the input buffers in the signature's order (numpy arrays, copied into
        guarded buffers); ``outputs``: ``(shape, numpy dtype)`` each, NaN-filled before the
        launch so an element no thread writes shows (filled with ``init_value`` instead
        when it is given, as MLX's ``init_value``). ``order``: one of :data:`ORDERS`.
        Raises :class:`EmulationError` with the emulator's diagnosis.
        """
        validate.one_of("order", order, ORDERS)
        groups = validate.integer("groups", groups, minimum=1)
        threads = validate.integer("threads", threads, minimum=1, maximum=1024)
        buffers = [np.ascontiguousarray(a) for a in inputs]
        n_buf = sum(p.buffer is not None for p in self.params)
        if len(buffers) + len(outputs) != n_buf:
            raise ValueError(f"inputs and outputs: {self.name} takes {n_buf} buffers, got {len(buffers)} + "
                             f"{len(outputs)}")
        outs = [np.empty(shape, dtype=dt) for shape, dt in outputs]
        lib = self._lib
        ptrs: list[tuple[int, int]] = []
        try:
            for a in buffers:
                p = lib.metal_emulation_buffer(max(a.nbytes, 1), 0)
                if not p:
                    raise MemoryError(f"no memory for a {a.nbytes}-byte buffer")
                ptrs.append((p, max(a.nbytes, 1)))
                ctypes.memmove(p, a.ctypes.data, a.nbytes)
            for a in outs:
                p = lib.metal_emulation_buffer(max(a.nbytes, 1), 0xFF)
                if not p:
                    raise MemoryError(f"no memory for a {a.nbytes}-byte buffer")
                ptrs.append((p, max(a.nbytes, 1)))
                if init_value is not None:
                    fill = np.full(a.shape, init_value, dtype=a.dtype)
                    ctypes.memmove(p, fill.ctypes.data, fill.nbytes)
            arr = (ctypes.c_void_p * len(ptrs))(*[p for p, _ in ptrs])
            err = ctypes.create_string_buffer(4096)
            entry = ctypes.cast(lib.metal_emulation_entry, ctypes.c_void_p)
            with _LOCK:  # the emulator's state is global to its shared object; one launch at a time
                rc = lib.metal_emulation_launch(entry, arr, groups, threads, ORDERS.index(order), seed, err,
                                                len(err))
            if rc != 0:
                raise EmulationError(f"{self.name}: {self._annotate(err.value.decode())}")
            for a, (p, _) in zip(outs, ptrs[len(buffers):]):
                ctypes.memmove(a.ctypes.data, p, a.nbytes)
        finally:
            for p, n in ptrs:
                lib.metal_emulation_buffer_free(p, n)
        return outs

    def _annotate(self, message: str) -> str:
        """The emulator's message with the source lines it names quoted."""
        lines = self.source.splitlines()
        quoted = []
        for n in dict.fromkeys(int(x) for x in re.findall(r"line (\d+)", message)):
            if 1 <= n <= len(lines):
                quoted.append(f"  line {n}: {lines[n - 1].strip()}")
        return message + ("\n" + "\n".join(quoted) if quoted else "")
