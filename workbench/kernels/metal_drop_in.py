"""A drop-in for ``mx.fast.metal_kernel`` that runs the kernel on the CPU under the emulator.

A user's ``mx.fast.metal_kernel(name=, input_names=, output_names=, source=, header=,
ensure_row_contiguous=, atomic_outputs=)`` raises "No Metal back-end" wherever there is
no Apple GPU (hosted CI runners among them). :func:`metal_kernel` takes the same
construction arguments and returns a callable with MLX's call signature; switching one
name runs the same kernel on the CPU: MLX still generates the Metal source (its
``verbose`` text, traced without a device), clang compiles it against the stand-in
``<metal_stdlib>``, and :mod:`workbench.kernels.metal_emulation` runs every GPU thread as a
fiber under Metal's rules (guarded buffers, NaN-filled outputs and group memory, 32 KB of
threadgroup memory, SIMD-groups of 32, threads run in a chosen order).

What is supported, and what is refused (a refusal names the argument and what is allowed,
never a silent approximation):

- 1-, 2- and 3-D launches: ``grid=(x, y, z)`` counts THREADS, as Metal's
  ``dispatchThreads`` does; in a dimension not a multiple of the threadgroup's the last
  groups are partial (their ``threads_per_threadgroup`` is their own size), as Metal runs
  them, and a :class:`GridWarning` says so: a grid smaller than its threadgroup, or not a
  multiple of it, is the usual sign of a grid given in threadgroups (mlx #1547, #4534: part
  of the work silently not done); every thread attribute in x, y and z;
- scalar inputs (a Python number, passed as a ``constant`` reference, as MLX does), and
  ``<input>_shape`` / ``_strides`` / ``_ndim``, which MLX passes when the source reads them;
- Apple GPUs' limits as options, a launch over one refused naming it:
  ``max_threads_per_threadgroup`` (1024, lower for heavy pipelines: mlx #2205 was a group
  over the pipeline's limit giving wrong results), ``threadgroup_memory`` (32,768 bytes a
  group), ``simd_width`` (32, the only width Apple GPUs have);
- races caught by default: ``order="default"`` runs two schedules (SIMD-groups in step, and apart)
  (``metal_emulation.DEFAULT_SCHEDULES``) and compares their outputs bit for bit
  (``metal_emulation.ScheduleDependenceError`` names the first differing output, its index
  and the two schedules); ``order="every"`` all of them; one schedule by its name
  (``metal_emulation.SCHEDULES``) runs that one alone;
- SIMD-group functions (``simd_sum``, ``simd_max``, ``simd_shuffle``, ``simd_shuffle_xor``,
  ``simd_broadcast``) in divergent control flow, as Metal defines them: over the active
  lanes, those that call it (the others returned, or wait at a threadgroup barrier), so
  ``if (i >= n) return;`` before a reduction works. Refused, naming the lines: a shuffle or
  broadcast that reads an inactive lane (undefined in Metal), and lanes waiting at two
  different SIMD-group operations at once (which path an Apple GPU runs first depends on
  where its compiler reconverges them). A lane that skipped an earlier pass of the same
  call in a loop is not told apart;
- inputs and outputs of float32, float16, bfloat16, int32, uint32, int8, uint8, bool;
- ``init_value`` (outputs filled with it before the launch; without it they are NaN-filled
  so an element no thread writes shows);
- ``atomic_outputs=True`` and ``metal::atomic<T>`` in device or threadgroup memory (load,
  store, exchange, fetch add/sub/min/max/and/or/xor, compare-exchange; relaxed order);
  integer atomics give the same bits in every schedule, a float atomic sum may not (its
  rounding follows the order of the updates, as on a GPU);
- float16 (``half``, MLX's ``float16_t``) and bfloat16 (``bfloat``, ``bfloat16_t``): converted
  exactly to float and back rounded to nearest even; their arithmetic rounded to the type at
  every operation, as Metal computes it (the stand-in ``<metal_stdlib>`` says how);
- ``math_mode``: ``"host"`` (the host's float exp/exp2/rsqrt), ``"precise"`` or ``"fast"``
  (Metal's contracts, ``metal_emulation.MATH_MODES``);
- not supported: a ``stream``, refused naming it.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.kernels import metal_emulation
from workbench.kernels.emulated import generated_source

#: MLX dtypes the drop-in carries, with the numpy dtype of their bytes (bfloat16 as its
#: 16-bit patterns: numpy has no bfloat16).
_DTYPES: dict[Any, Any] = {
    mx.float32: np.float32,
    mx.float16: np.float16,
    mx.bfloat16: np.uint16,
    mx.int32: np.int32,
    mx.uint32: np.uint32,
    mx.int8: np.int8,
    mx.uint8: np.uint8,
    mx.bool_: np.bool_,
}

#: MLX's own ``mx.fast.metal_kernel``, held at import: a test or a user may put
#: :func:`metal_kernel` in its place (``mx.fast.metal_kernel = workbench.metal_kernel``, to
#: run a library's kernels, mlx-lm's among them, unchanged), and the drop-in still builds
#: MLX's kernel object, whose generated source it runs.
MLX_METAL_KERNEL = mx.fast.metal_kernel

#: The largest threadgroup an Apple GPU pipeline allows (lower for heavy kernels).
MAX_THREADS_PER_THREADGROUP = 1024

#: What MLX puts before a custom kernel's generated source that the stand-in header does not:
#: MLX's preamble opens with ``using namespace metal;``, so users write ``simd_sum``,
#: ``threadgroup_barrier(mem_flags::mem_threadgroup)`` or ``exp`` unqualified.
PREAMBLE = "using namespace metal;\n"

#: ``order="every"``: run the launch in every schedule and compare the outputs' bits.
EVERY = metal_emulation.EVERY


class GridWarning(UserWarning):
    """A grid smaller than its threadgroup or not a multiple of it: legal in Metal (the last
    group is partial), and the usual symptom of a grid given in threadgroups, not threads."""


def _host(a: Any, where: str) -> tuple[mx.array, np.ndarray]:
    x = a if isinstance(a, mx.array) else mx.array(a)
    if x.dtype not in _DTYPES:
        raise ValueError(f"{where}: dtype {x.dtype} is not emulated; allowed: {', '.join(str(d) for d in _DTYPES)}")
    host = np.array(x.view(mx.uint16)) if x.dtype == mx.bfloat16 else np.array(x)
    return x, host


def _triple(name: str, value: Any) -> tuple[int, int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise ValueError(f"{name} must be three integers (x, y, z), got {value!r}")
    x, y, z = (validate.integer(name, v, minimum=1, maximum=2**32 - 1) for v in value)
    return x, y, z


def _grid_warning(grid: tuple[int, int, int], group: tuple[int, int, int]) -> str | None:
    """Why a grid looks given in threadgroups (smaller than its group, or not a multiple of
    it, in some dimension), or None."""
    for d, (n, t) in enumerate(zip(grid, group)):
        axis = "xyz"[d]
        if n < t:
            return (
                f"grid={grid!r} is smaller than threadgroup={group!r} in {axis}: grid counts threads, not "
                f"threadgroups, so this launch runs one partial group of {n} threads in {axis}"
            )
        if n % t:
            return (
                f"grid={grid!r} is not a multiple of threadgroup={group!r} in {axis}: grid counts threads, "
                f"not threadgroups; the last of {-(-n // t)} groups runs {n % t} threads in {axis}"
            )
    return None


def _extra_buffer(param: str, arrays: dict[str, np.ndarray]) -> np.ndarray | None:
    """The buffer MLX passes for ``<input>_shape`` (int32), ``_strides`` (int64, in elements,
    of the row-contiguous input) or ``_ndim`` (int32), or None when ``param`` is none of them."""
    for suffix in ("_shape", "_strides", "_ndim"):
        base = param[: -len(suffix)]
        if param.endswith(suffix) and base in arrays:
            a = arrays[base]
            if suffix == "_ndim":
                return np.array(a.ndim, dtype=np.int32)
            if suffix == "_shape":
                return np.array(a.shape or (0,), dtype=np.int32)
            strides = [int(np.prod(a.shape[i + 1 :])) for i in range(a.ndim)]
            return np.array(strides or [0], dtype=np.int64)
    return None


class EmulatedMetalKernel:
    """The callable :func:`metal_kernel` returns: MLX's call signature, run on the CPU."""

    def __init__(
        self,
        kernel: Any,
        name: str,
        input_names: Sequence[str],
        output_names: Sequence[str],
        source: str = "",
        header: str = "",
    ) -> None:
        self._kernel = kernel
        self.name = name
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.source, self.header = source, header
        #: What a compile error calls the user's source and header (``python -m workbench.check``
        #: sets the files' names): clang's lines are numbered in MLX's generated text.
        self.source_name, self.header_name = "source", "header"
        # Generated sources by template values and input dtypes/shapes (all MLX's text depends
        # on), kept per kernel: a cache keyed by id() would hand a new kernel a dead one's text.
        self._sources: dict[tuple, str] = {}

    def user_lines(self, message: str, generated: str) -> str:
        """``message`` with each line of ``generated`` it names (clang's ``metal_source:L:C``, the
        refusal's ``(line L)``) given as the user's own: ``source:l:C`` / ``header:l:C``, counted in
        the text the user passed, so an error points where the user can fix it."""
        spans = []
        for text, label in ((self.source, self.source_name), (self.header, self.header_name)):
            at = generated.find(text) if text.strip() else -1
            if at >= 0:
                first = generated.count("\n", 0, at) + 1
                spans.append((first, first + text.count("\n"), label))

        def where(line: int) -> str | None:
            for first, last, label in spans:
                if first <= line <= last:
                    return f"{label}:{line - first + 1}"
            return None

        def clang(m: re.Match) -> str:
            mapped = where(int(m.group(1)))
            return m.group(0) if mapped is None else f"{mapped}:{m.group(2)}"

        def refusal(m: re.Match) -> str:
            mapped = where(int(m.group(1)))
            return m.group(0) if mapped is None else f"({mapped})"

        return re.sub(r"\(line (\d+)\)", refusal, re.sub(r"metal_source:(\d+):(\d+)", clang, message))

    def __call__(
        self,
        *,
        inputs: Sequence[Any],
        grid: Sequence[int],
        threadgroup: Sequence[int],
        output_shapes: Sequence[Sequence[int]],
        output_dtypes: Sequence[Any],
        template: Sequence[tuple[str, Any]] | None = None,
        init_value: float | None = None,
        verbose: bool = False,
        stream: Any = None,
        order: str = metal_emulation.DEFAULT_ORDER,
        seed: int = 0,
        max_threads_per_threadgroup: int = MAX_THREADS_PER_THREADGROUP,
        threadgroup_memory: int = metal_emulation.THREADGROUP_LIMIT,
        simd_width: int = metal_emulation.SIMD_WIDTH,
        math_mode: str = "host",
        math_error: str = "edge-high",
    ) -> list[mx.array]:
        """Run the kernel; return its outputs as MLX arrays (as ``mx.fast.metal_kernel`` does).

        Beyond MLX's arguments: ``order`` (``"default"``: two schedules (SIMD-groups
        in step, and apart), outputs compared bit for bit; ``"every"``: all schedules; or one of
        ``metal_emulation.SCHEDULES`` alone; ``seed`` for the shuffled and random ones), and the limits to
        hold the launch to: ``max_threads_per_threadgroup`` (the pipeline's),
        ``threadgroup_memory`` (bytes a group), ``simd_width`` (32 only); ``math_mode`` and
        ``math_error`` (``metal_emulation.MATH_MODES`` / ``MATH_ERRORS``: the host's exp, exp2
        and rsqrt, or Metal's precise or fast contract with results at a bound's edge or
        random within it).
        Raises ``metal_emulation.EmulationError`` with the emulator's diagnosis (an
        out-of-bounds access, a barrier not reached by every thread, threadgroup memory over
        the limit, ...), ``ScheduleDependenceError`` when schedules disagree; warns
        :class:`GridWarning` for a partial threadgroup.
        """
        if stream is not None:
            raise ValueError(f"stream={stream!r}: the emulator runs on the CPU; allowed: None")
        if len(inputs) != len(self.input_names):
            raise ValueError(
                f"inputs: {self.name} takes {len(self.input_names)} ({', '.join(self.input_names)}), got {len(inputs)}"
            )
        if len(output_shapes) != len(self.output_names) or len(output_dtypes) != len(self.output_names):
            raise ValueError(
                f"output_shapes/output_dtypes: {self.name} has {len(self.output_names)} outputs, got "
                f"{len(output_shapes)} shapes and {len(output_dtypes)} dtypes"
            )
        grid3, group3 = _triple("grid", grid), _triple("threadgroup", threadgroup)
        t = group3[0] * group3[1] * group3[2]
        limit = validate.integer(
            "max_threads_per_threadgroup", max_threads_per_threadgroup, minimum=1, maximum=MAX_THREADS_PER_THREADGROUP
        )
        if t > limit:
            raise ValueError(
                f"threadgroup={tuple(threadgroup)!r}: {t} threads is over the pipeline's "
                f"max_threads_per_threadgroup={limit}"
            )
        if simd_width != metal_emulation.SIMD_WIDTH:
            raise ValueError(
                f"simd_width={simd_width!r}: Apple GPUs' SIMD-groups are {metal_emulation.SIMD_WIDTH} "
                f"threads wide; allowed: {metal_emulation.SIMD_WIDTH}"
            )
        validate.integer(
            "threadgroup_memory", threadgroup_memory, minimum=16, maximum=metal_emulation.THREADGROUP_LIMIT
        )
        metal_emulation.schedules_of(order)  # a bad order refused before any work
        why = _grid_warning(grid3, group3)
        if why is not None:
            warnings.warn(why, GridWarning, stacklevel=2)
        for i, d in enumerate(output_dtypes):
            if d not in _DTYPES:
                raise ValueError(f"output_dtypes[{i}]={d}: not emulated; allowed: {', '.join(str(x) for x in _DTYPES)}")
        pairs = [_host(a, f"inputs[{i}] ({self.input_names[i]})") for i, a in enumerate(inputs)]
        kw = {
            "template": list(template or []),
            "grid": tuple(grid),
            "threadgroup": tuple(threadgroup),
            "output_shapes": [tuple(s) for s in output_shapes],
            "output_dtypes": list(output_dtypes),
        }
        key = (
            tuple((k, str(v)) for k, v in kw["template"]),
            tuple((str(x.dtype), x.shape) for x, _ in pairs),
            tuple(kw["output_shapes"]),
            tuple(str(d) for d in kw["output_dtypes"]),
        )
        if key not in self._sources:
            (self._sources[key],) = generated_source(
                lambda *xs: self._kernel(inputs=list(xs), verbose=True, **kw), *[x for x, _ in pairs]
            ).values()
        source = self._sources[key]
        if verbose:
            print(source)
        try:
            compiled = metal_emulation.compile_source(PREAMBLE + source)
        except metal_emulation.MetalCompileError as err:
            raise metal_emulation.MetalCompileError(self.user_lines(str(err), PREAMBLE + source)) from None
        arrays = {n: h for n, (_, h) in zip(self.input_names, pairs)}
        ins = []
        for p in sorted((p for p in compiled.params if p.buffer is not None), key=lambda p: p.buffer or 0):
            if p.name in self.output_names:
                continue
            extra = arrays.get(p.name)
            extra = _extra_buffer(p.name, arrays) if extra is None else extra
            if extra is None:
                raise ValueError(
                    f"source: {self.name}'s generated signature has a buffer {p.name!r} the emulator cannot fill"
                )
            ins.append(extra)
        launch = {
            "grid": grid3,
            "threadgroup": group3,
            "seed": seed,
            "init_value": init_value,
            "threadgroup_memory": threadgroup_memory,
            "math_mode": math_mode,
            "math_error": math_error,
        }
        outputs = [(tuple(s), _DTYPES[d]) for s, d in zip(output_shapes, output_dtypes)]
        outs = compiled.run(ins, outputs, names=self.output_names, order=order, **launch)
        return [mx.array(o).view(mx.bfloat16) if d == mx.bfloat16 else mx.array(o) for o, d in zip(outs, output_dtypes)]


def metal_kernel(
    name: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    source: str,
    header: str = "",
    ensure_row_contiguous: bool = True,
    atomic_outputs: bool = False,
) -> EmulatedMetalKernel:
    """``mx.fast.metal_kernel`` with the same arguments, run on the CPU (module docstring:
    what is supported). Raises ``ValueError`` naming an unsupported argument."""
    kernel = MLX_METAL_KERNEL(
        name=name,
        input_names=list(input_names),
        output_names=list(output_names),
        source=source,
        header=header,
        ensure_row_contiguous=ensure_row_contiguous,
        atomic_outputs=bool(atomic_outputs),
    )
    return EmulatedMetalKernel(kernel, name, input_names, output_names, source=source, header=header)
