"""The emulator's clang toolchain: finding clang, its flags, and the compile cache of kernels' shared objects.

A kernel's translation unit (``metal_translation``) is compiled with clang as C++17 against
the stand-in ``<metal_stdlib>`` (``kernels/metal_emulation/``) and linked with the
emulator's runtime (C11, compiled once). Compiling takes seconds, so every object is cached
by the hash of everything that goes into it (the translation unit, the stand-in header, the
runtime, the flags, clang's version) in ``$WORKBENCH_METAL_EMULATION_CACHE`` or else a
folder in the system's temporary directory; an entry is written atomically under its lock,
with its size and SHA-256 beside it, and verified before every load (ctypes loading a bad
shared object can crash the process rather than raise), a bad entry rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from workbench import files
from workbench.backends import BackendUnavailable, clang
from workbench.kernels.metal_translation import MetalCompileError
from workbench.kernels.source import KERNEL_DIR

#: The stand-in ``<metal_stdlib>`` and the emulator's runtime.
SUPPORT_DIR = KERNEL_DIR / "metal_emulation"

#: clang's flags: C++17; no floating-point contraction beyond the source's own fma calls
#: (so results do not depend on the optimiser); an unsuffixed literal such as ``0.1`` is a
#: float, as Metal compiles it (Metal has no double, so ``x * 0.1`` is float arithmetic
#: there; computed in double here it would round differently); unknown Metal attributes
#: ([[kernel]], [[buffer(i)]]) ignored. The ``double`` type itself is refused by the
#: stand-in header.
#: ``half`` is clang's ``__fp16`` made a native arithmetic type (``-fnative-half-type``, with
#: half parameters and results allowed: see :func:`clang_flags`), so each half operation is
#: rounded to half, as Metal computes it; the stand-in header says why not a class or ``_Float16``.
#: On Linux, -Bsymbolic binds each kernel's calls into the runtime to its own copy (every
#: kernel's shared object carries the runtime; ctypes loads them side by side).
CLANG_FLAGS: tuple[str, ...] = (
    "-std=c++17",
    "-O2",
    "-fPIC",
    "-shared",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    "-Wno-unknown-attributes",
    "-cl-single-precision-constant",
    "-Xclang",
    "-fnative-half-type",
    *(("-Wl,-Bsymbolic",) if sys.platform.startswith("linux") else ()),
)

#: How a clang is told that ``half`` may be a parameter or a result, tried in this order:
#: clang 15 and older need ``-fallow-half-arguments-and-returns``; clang 16 removed that flag
#: (LLVM review D133885; llvm/llvm-project#61143), where x86-64 allows it with no flag, and
#: ``-fnative-half-arguments-and-returns`` is the cc1 flag left for targets that do not.
HALF_ARGUMENT_FLAGS: tuple[tuple[str, ...], ...] = (
    ("-Xclang", "-fallow-half-arguments-and-returns"),
    (),
    ("-Xclang", "-fnative-half-arguments-and-returns"),
)

#: A half parameter, result and operation: what the stand-in header needs of the compiler.
_HALF_PROBE = "__fp16 twice(__fp16 x) { return x + x; }\n"


# Keyed by the clang's path; a few entries: each probe runs the compiler, once a clang.
@lru_cache(maxsize=8)
def clang_flags(path: str) -> tuple[str, ...]:
    """:data:`CLANG_FLAGS` with the first of :data:`HALF_ARGUMENT_FLAGS` that lets the clang at
    ``path`` compile a function taking and returning ``half``: clang's flags for this moved
    between versions, and a flag a clang does not know stops every compile. Raises
    ``BackendUnavailable`` naming the clang when none does."""
    tried = []
    for extra in HALF_ARGUMENT_FLAGS:
        r = subprocess.run(
            [path, "-x", "c++", "-std=c++17", "-fsyntax-only", "-Xclang", "-fnative-half-type", *extra, "-"],
            input=_HALF_PROBE,
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode == 0:
            return (*CLANG_FLAGS, *extra)
        tried.append(f"{' '.join(extra) or '(no flag)'}: {r.stderr.strip().splitlines()[-1:] or ['?']}")
    raise BackendUnavailable(
        f"the clang at {path} ({clang_version(path)}) cannot compile half parameters and results, "
        f"which the Metal emulator's half needs; tried {'; '.join(tried)}"
    )


def cache_dir() -> Path:
    """Where compiled kernels are kept (``$WORKBENCH_METAL_EMULATION_CACHE``, else a folder
    of this user's in the system's temporary directory)."""
    env = os.environ.get("WORKBENCH_METAL_EMULATION_CACHE")
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"workbench-metal-emulation-{os.getuid()}"


# Keyed by the clang's path; a few entries: each lookup runs a process, and a launch asks.
@lru_cache(maxsize=8)
def clang_version(path: str) -> str:
    """The first line of ``path --version``: part of every cache key (another clang, another object)."""
    return subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout.splitlines()[0]


def support_text() -> str:
    """The stand-in header and the runtime's text: part of every kernel's cache key."""
    return "".join((SUPPORT_DIR / f).read_text() for f in ("metal_stdlib", "runtime.c"))


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
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with files.locked(target):
            if cached_entry_ok(target):  # another process rebuilt it while this one waited
                return target
            with tempfile.TemporaryDirectory(dir=target.parent) as d:
                out = Path(d) / target.name
                build(out)
                if not out.is_file():
                    raise MetalCompileError(f"the compiler exited without an error but wrote no {target.name}")
                digest = _digest(out)
                os.replace(out, target)
            files.write_atomic(_sum_path(target), digest + "\n")
    except OSError as e:
        # A cache folder that is a file, cannot be made, or holds a folder where an object
        # goes: the user's setting or disk, said with the path, not a bare OSError.
        raise ValueError(
            f"$WORKBENCH_METAL_EMULATION_CACHE: the emulator's compile cache {target.parent} cannot hold "
            f"{target.name} ({type(e).__name__}: {e.strerror or e}); point it at a writable folder"
        ) from None
    return target


def _compile(args: list[str], failure: str, tail: int = 4000) -> None:
    """clang run with ``args``; :class:`MetalCompileError` saying ``failure`` and the end of
    clang's diagnostics when it fails."""
    r = subprocess.run(args, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise MetalCompileError(f"{failure}:\n{r.stderr[-tail:]}")


def _runtime_object(cc: str, folder: Path) -> Path:
    """The emulator's runtime compiled once (C11) for every kernel to link, cached by hash."""
    text = (SUPPORT_DIR / "runtime.c").read_text()
    key = hashlib.sha256("\0".join((text, clang_version(cc))).encode()).hexdigest()[:24]

    def build(out: Path) -> None:
        args = [cc, "-x", "c", "-std=c11", "-O2", "-fPIC", "-c", "-o", str(out), str(SUPPORT_DIR / "runtime.c")]
        _compile(args, "the emulator's runtime does not compile")

    return _cached(folder / f"runtime-{key}.o", build)


# Keyed by the values of the two variables clang is found by; a few entries: the search
# stats a dozen paths, and a launch asks for it, while changed variables are still seen.
@lru_cache(maxsize=16)
def _clang_for(workbench_clang: str | None, path: str | None) -> str | None:
    return clang()


def clang_path() -> str | None:
    """The clang++ the emulator compiles with (``backends.clang``), looked up once for each
    value of the variables it is found by, ``$WORKBENCH_CLANG`` and ``$PATH``."""
    return _clang_for(os.environ.get("WORKBENCH_CLANG"), os.environ.get("PATH"))


def shared_object(tu: str, name: str) -> Path:
    """The translation unit ``tu`` (of the kernel ``name``) compiled and linked with the
    runtime: the cached shared object's path, built when missing or bad.

    Raises :class:`MetalCompileError` with clang's diagnostics (lines numbered as in the
    Metal source) when it does not compile, and ``BackendUnavailable`` without clang.
    """
    cc = clang()
    if cc is None:
        raise BackendUnavailable(
            "compiling Metal source for the emulator needs clang++: apt-get install clang "
            "(Debian/Ubuntu), or set $WORKBENCH_CLANG to a clang++ on the PATH"
        )
    flags = clang_flags(cc)
    key = hashlib.sha256("\0".join((tu, support_text(), " ".join(flags), clang_version(cc))).encode())
    folder = cache_dir()

    def build(out: Path) -> None:
        runtime = _runtime_object(cc, folder)
        cpp = out.with_name("kernel.cpp")
        cpp.write_text(tu)
        _compile(
            [cc, *flags, "-I", str(SUPPORT_DIR), "-o", str(out), str(cpp), str(runtime)],
            f"the Metal source of {name} does not compile against the stand-in <metal_stdlib>",
            tail=6000,
        )

    return _cached(folder / f"{key.hexdigest()[:24]}.so", build)


def _host_flags() -> tuple[str, ...]:
    """Flags for the host's own C: x86-64's half conversions in hardware (F16C) where the CPU
    has them; elsewhere clang's own conversions (the same correctly rounded results)."""
    if os.uname().machine not in ("x86_64", "AMD64"):
        return ()
    try:
        flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "")
    except OSError:
        return ()
    return ("-mf16c",) if "f16c" in flags.split() else ()


def c_library(text: str, name: str, *, host: bool = True) -> Path:
    """The C source ``text`` (a helper of the workbench's own, ``name``) compiled by clang into
    a shared object: its cached path, built when missing or bad. No floating-point
    contraction (``-ffp-contract=off``): each operation rounds as written. ``host=False``:
    without the host CPU's own instructions (:func:`_host_flags`), as a CPU without them
    compiles it (the tests run both). Raises
    :class:`MetalCompileError` with clang's diagnostics, ``BackendUnavailable`` without clang."""
    cc = clang()
    if cc is None:
        raise BackendUnavailable(
            f"compiling the workbench's {name} needs clang: apt-get install clang (Debian/Ubuntu), "
            "or set $WORKBENCH_CLANG to a clang++ on the PATH"
        )
    flags = ("-x", "c", "-std=c11", "-O2", "-fPIC", "-shared", "-ffp-contract=off", *(_host_flags() if host else ()))
    key = hashlib.sha256("\0".join((text, " ".join(flags), support_text(), clang_version(cc))).encode())

    folder = cache_dir()

    def build(out: Path) -> None:
        # linked with the emulator's runtime: its exact half conversions are what clang calls
        # where the CPU has none of its own (x86-64 without F16C)
        runtime = _runtime_object(cc, folder)
        src = out.with_name(f"{name}.c")
        src.write_text(text)
        args = [cc, *flags, "-o", str(out), str(src), "-x", "none", str(runtime)]
        _compile(args, f"the workbench's {name} does not compile")

    return _cached(folder / f"{name}-{key.hexdigest()[:24]}.so", build)
