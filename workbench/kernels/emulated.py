"""The Metal launches run on the CPU (the ``"metal-emulated"`` backend), and the Metal
source MLX generates for a launch, read on any machine.

MLX prints the source it generates for a kernel call made with ``verbose=True``; tracing
the call with ``mx.export_function`` builds the graph without running it, so the text can
be read without a GPU (:func:`generated_source`, capturing file descriptor 1, where MLX's
C++ prints). :func:`emulate_launch` compiles that text with clang against the stand-in
``<metal_stdlib>`` and runs it on the CPU (:mod:`workbench.kernels.metal_emulation`);
:func:`emulated_tail` does so for a prepared tail's three launches, the same
:class:`~workbench.kernels.launch.PreparedTail` the ``"metal"`` backend runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np

from workbench import backends
from workbench.kernels.contract import TailLaunch, each_row
from workbench.kernels.launch import PreparedTail, as_mx32, prepare_tail, prepared
from workbench.kernels.metal_emulation import DEFAULT_ORDER
from workbench.kernels.tuning import KernelTuning

#: The backend that compiles the Metal kernels with clang and runs them on the CPU
#: (:mod:`workbench.kernels.metal_emulation`): the same launches as ``"metal"``, emulated.
METAL_EMULATED = "metal-emulated"


@contextlib.contextmanager
def _stdout_to(path: str) -> Iterator[None]:
    """Send file descriptor 1 (where MLX's C++ prints) to ``path`` while the block runs."""
    sys.stdout.flush()
    saved = os.dup(1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.dup2(fd, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(fd)
        os.close(saved)


def generated_source(fn: Callable[..., Any], *args: mx.array) -> dict[str, str]:
    """The kernel sources MLX generates when ``fn(*args)`` calls kernels with ``verbose=True``.

    Works without the kernels' device: ``mx.export_function`` traces ``fn`` (building the
    graph, printing each kernel's generated source) and runs nothing. Returns
    ``{generated kernel name: source}``.
    """
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "stdout.txt")
        with _stdout_to(log):
            mx.export_function(os.path.join(d, "fn.mlxfn"), fn, *args)
        text = Path(log).read_text()
    out: dict[str, str] = {}
    marker = "Generated source code for `"
    for chunk in text.split(marker)[1:]:
        name, rest = chunk.split("`", 1)
        body = rest.split("```", 2)
        out[name] = body[1].strip("\n") if len(body) > 1 else rest
    return out


def metal_tail_source(launch: TailLaunch, tuning: KernelTuning | None = None) -> dict[str, str]:
    """The Metal source MLX would compile for this launch's tail (three kernels), on any machine."""
    prep = prepare_tail(launch, "metal", tuning)
    return generated_source(
        lambda b, r: prep(b, r, verbose=True),
        mx.zeros((prep.branch_dim,), dtype=mx.float32),
        mx.zeros((prep.hidden,), dtype=mx.float32),
    )


# -- the Metal kernels on the CPU (backend "metal-emulated") ------------------------------

#: Generated Metal sources, by kernel object, template values and input dtypes (all the
#: generated text depends on; the kernel object itself is in the key, so it is never
#: another's), the least recently used dropped past :data:`MAX_SOURCES`.
_SOURCES: OrderedDict[tuple, str] = OrderedDict()

#: How many generated sources are kept (a model's launches in a few forms each).
MAX_SOURCES = 256


def _host(a: mx.array) -> np.ndarray:
    """``a``'s bytes as numpy (bfloat16 as its 16-bit patterns: numpy has no bfloat16)."""
    return np.array(a.view(mx.uint16)) if a.dtype == mx.bfloat16 else np.array(a)


def launch_source(kernel: Any, inputs: list[mx.array], kw: dict[str, Any]) -> str:
    """The Metal source MLX generates for ``kernel(inputs=inputs, **kw)`` (made once per
    kernel, template values and input dtypes)."""
    key = (kernel, tuple((n, str(v)) for n, v in kw["template"]), tuple((str(a.dtype), a.size < 8) for a in inputs))
    if key in _SOURCES:
        _SOURCES.move_to_end(key)
        return _SOURCES[key]
    (src,) = generated_source(lambda *xs: kernel(inputs=list(xs), verbose=True, **kw), *inputs).values()
    _SOURCES[key] = src
    while len(_SOURCES) > MAX_SOURCES:
        _SOURCES.popitem(last=False)
    return src


def emulated_tail_sources(
    launch: TailLaunch, tuning: KernelTuning | None = None, *, kernel_dir: Path | None = None
) -> list[str]:
    """The three Metal sources :func:`emulated_tail` compiles for ``launch`` (to compile
    many at once: ``metal_emulation.compile_all``)."""
    return _tail_sources(prepared(launch, "metal", tuning, kernel_dir=kernel_dir))


def _tail_sources(prep: PreparedTail) -> list[str]:
    b, r = mx.zeros((prep.branch_dim,), dtype=mx.float32), mx.zeros((prep.hidden,), dtype=mx.float32)
    wo, gu, dn = prep.calls().values()
    return [
        launch_source(wo.kernel, [b, *wo.consts, r], wo.kw),
        launch_source(gu.kernel, [r, *gu.consts], gu.kw),
        launch_source(dn.kernel, [mx.zeros((prep.ffn,), dtype=mx.float32), r, *dn.consts], dn.kw),
    ]


class _EmulatedCall(NamedTuple):
    """One of a prepared tail's launches as the emulator runs it: the compiled kernel, the
    constants as numpy, the grid and the outputs."""

    kernel: Any
    consts: list[np.ndarray]
    groups: int
    threads: int
    outputs: list[tuple[tuple[int, ...], Any]]


def _tail_plan(prep: PreparedTail, clang: str) -> list[_EmulatedCall]:
    """The prepared tail's three launches ready for the emulator, kept on the prepared tail
    itself (``PreparedTail.emulated_plans``, by the clang that compiled them), so they die
    with it. The constants are converted to numpy once: they are the prepared tail's own
    arrays, made from the weights once and never written, the rule ``prepared`` already
    rests on. (A cache of a caller's arrays could not rest on that: an ``mx.array`` is
    written in place by ``a[i] = v``, keeping its identity and its buffer's address.)"""
    from workbench.kernels import metal_emulation  # only this backend needs clang and ctypes

    per = prep.emulated_plans
    if clang not in per:
        plan = []
        for call, source in zip(prep.calls().values(), _tail_sources(prep)):
            threads = int(call.kw["threadgroup"][0])
            plan.append(
                _EmulatedCall(
                    metal_emulation.compile_source(source),
                    [_host(c) for c in call.consts],
                    int(call.kw["grid"][0]) // threads,
                    threads,
                    [(tuple(s), np.float32) for s in call.kw["output_shapes"]],
                )
            )
        per[clang] = plan
    return per[clang]


def emulate_launch(
    kernel: Any,
    inputs: list[mx.array],
    kw: dict[str, Any],
    *,
    order: str = DEFAULT_ORDER,
    seed: int = 0,
    math_mode: str = "host",
    math_error: str = "edge-high",
) -> list[np.ndarray]:
    """One Metal launch run on the CPU: the source MLX generates for ``kernel(inputs=inputs,
    **kw)`` (``kw``: template, grid, threadgroup, output shapes and dtypes, as a launch
    passes them), compiled by clang and executed by :mod:`workbench.kernels.metal_emulation` in
    ``order`` (``metal_emulation.schedules_of``: by default two schedules, SIMD-groups in step and
    apart, compared bit for bit; or one schedule by name), with ``math_mode`` / ``math_error``
    (``metal_emulation.MATH_MODES`` / ``MATH_ERRORS``). Raises ``metal_emulation.EmulationError`` /
    ``MetalCompileError`` with the diagnosis."""
    from workbench.kernels import metal_emulation  # only this backend needs clang and ctypes

    compiled = metal_emulation.compile_source(launch_source(kernel, inputs, kw))
    outputs = [(tuple(s), np.float32) for s in kw["output_shapes"]]
    return compiled.run(
        [_host(a) for a in inputs],
        outputs,
        names=[f"output {i}" for i in range(len(outputs))],
        grid=tuple(int(v) for v in kw["grid"]),
        threadgroup=tuple(int(v) for v in kw["threadgroup"]),
        order=order,
        seed=seed,
        math_mode=math_mode,
        math_error=math_error,
    )


def emulated_tail(
    launch: TailLaunch,
    branch: Any,
    residual: Any,
    *,
    order: str = DEFAULT_ORDER,
    seed: int = 0,
    tuning: KernelTuning | None = None,
    kernel_dir: Path | None = None,
    math_mode: str = "host",
    math_error: str = "edge-high",
) -> np.ndarray:
    """The fused tail's three Metal launches run on the CPU (``fused_tail(backend="metal-emulated")``).

    The same ``PreparedTail`` as the ``"metal"`` backend (same refusals, template
    values, grids and constants); each launch's generated source is compiled by clang
    against the stand-in header and executed by the emulator in ``order``: by default two
    schedules (``metal_emulation.DEFAULT_SCHEDULES``: SIMD-groups in step, and apart), each
    launch's outputs compared bit for bit (a race raises ``ScheduleDependenceError``),
    ``"every"`` all six, or one of ``metal_emulation.SCHEDULES`` alone (``seed`` for the
    shuffled and random ones). float32 numpy out, with
    ``branch``'s leading batch axes. ``kernel_dir``: as for ``launch.prepare_tail`` (the
    mutation tests run deliberately broken copies of ``kernels/``). ``math_mode``,
    ``math_error``: how ``metal::exp`` and ``rsqrt`` compute (``metal_emulation.MATH_MODES``:
    the host's functions, or Metal's precise or fast contract at a bound's edge or random
    within it).
    """
    from workbench.kernels import metal_emulation  # only this backend needs clang and ctypes

    clang = metal_emulation.clang_path()
    if clang is None:
        backends.resolve_backend(METAL_EMULATED)  # raises, saying what to install
    prep = prepared(launch, "metal", tuning, kernel_dir=kernel_dir)
    wo, gu, dn = _tail_plan(prep, clang)
    b = np.asarray(_host(as_mx32(branch)), dtype=np.float32)
    r = np.asarray(_host(as_mx32(residual)), dtype=np.float32)
    run = {"order": order, "seed": seed, "math_mode": math_mode, "math_error": math_error}

    def row(b1: np.ndarray, r1: np.ndarray) -> np.ndarray:
        (h,) = wo.kernel.run([b1, *wo.consts, r1], wo.outputs, names=["h"], groups=wo.groups, threads=wo.threads, **run)
        (act,) = gu.kernel.run([h, *gu.consts], gu.outputs, names=["act"], groups=gu.groups, threads=gu.threads, **run)
        (out,) = dn.kernel.run(
            [act, h, *dn.consts], dn.outputs, names=["out"], groups=dn.groups, threads=dn.threads, **run
        )
        return out

    return each_row(row, b, r, prep.hidden, np.stack)
