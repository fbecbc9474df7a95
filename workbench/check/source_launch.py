"""A user's own Metal or CUDA kernel source and its launch, run on the device or, for Metal, on the CPU.

A :class:`SourceLaunch` is everything ``mx.fast.metal_kernel`` / ``mx.fast.cuda_kernel``
take (the body, the input and output names, grid, threadgroup, template values). Its
input names say which tensor of the case each input is (:data:`SOURCE_INPUTS`); a
template value may be a number or one of the case's dimensions by name (``"hidden"``,
``"branch"``, ``"ffn"``), so one launch serves every shape.

Its kernel objects are made by the kernels' door (``workbench.kernels.run.source_kernel``:
``mx.fast.metal_kernel`` / ``mx.fast.cuda_kernel``, or on ``"metal-emulated"`` the drop-in
that runs Metal on the CPU), so which backend runs a source is said in one place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import backends
from workbench.kernels import run as kernel_run
from workbench.kernels.output_coverage import covered_launch, mlx_launch
from workbench.validate import describe, one_of

#: The tensors a source's inputs may name: the activations, the stored dense weights (in
#: their stored dtype), the effective norm weight, eps as a one-element float32 array.
SOURCE_INPUTS: tuple[str, ...] = ("branch", "residual", "wo", "ffn_norm", "gate", "up", "down", "eps")

#: Template values that stand for the case's dimensions.
SHAPE_NAMES: tuple[str, ...] = ("hidden", "branch", "ffn")


@dataclass(frozen=True)
class SourceLaunch:
    """A kernel body and its launch: ``inputs`` (names of :data:`SOURCE_INPUTS`), the one
    ``output`` ([hidden] float32), ``grid`` and ``threadgroup`` (threads, as MLX counts
    them), ``template`` (name -> int, float, bool or a name of :data:`SHAPE_NAMES`),
    ``header`` (code before the kernel), ``name``."""

    source: str
    inputs: tuple[str, ...]
    output: str = "out"
    grid: tuple[int, int, int] = (32, 1, 1)
    threadgroup: tuple[int, int, int] = (32, 1, 1)
    template: tuple[tuple[str, Any], ...] = ()
    header: str = ""
    name: str = "user_tail"
    #: What a compile error calls the source (the command passes the file's path): its lines
    #: are the source's own, not those of the text MLX generates around it.
    source_file: str = "source"
    _kernels: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(f"source: must be the kernel body as a non-empty string, got {describe(self.source)}")
        inputs = tuple(self.inputs) if isinstance(self.inputs, (list, tuple)) else None
        if not inputs or any(i not in SOURCE_INPUTS for i in inputs) or len(set(inputs)) != len(inputs):
            raise ValueError(f"inputs: must be distinct names of {SOURCE_INPUTS}, got {describe(self.inputs)}")
        object.__setattr__(self, "inputs", inputs)
        # The output is a buffer parameter of the generated kernel: a name that is not an
        # identifier, or one an input already has, makes a source that cannot compile.
        if not isinstance(self.output, str) or not self.output.isidentifier() or self.output in inputs:
            raise ValueError(f"output: must be an identifier other than the inputs' names, got {describe(self.output)}")
        for name in ("grid", "threadgroup"):
            v = getattr(self, name)
            if (
                not isinstance(v, (tuple, list))
                or len(v) != 3
                or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1 for x in v)
            ):
                raise ValueError(
                    f"{name}: must be three positive ints (threads, as MLX counts them), got {describe(v)}"
                )
            object.__setattr__(self, name, tuple(int(x) for x in v))
        if isinstance(self.template, Mapping):
            tpl = tuple(self.template.items())
        elif isinstance(self.template, (tuple, list)):
            tpl = tuple(self.template)
        else:
            raise ValueError(f"template: must be (name, value) pairs or a mapping, got {describe(self.template)}")
        for item in tpl:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise ValueError(f"template: must be (name, value) pairs or a mapping, got {describe(self.template)}")
            v = item[1]
            if isinstance(v, str) and v not in SHAPE_NAMES:
                raise ValueError(f"template[{item[0]!r}]: a name must be one of {SHAPE_NAMES}, got {v!r}")
        object.__setattr__(self, "template", tpl)

    def __getstate__(self) -> dict[str, Any]:
        """What pickling keeps (a kernels form sent to its worker process): everything but the
        compiled kernels, which are made again there from the text."""
        return {**self.__dict__, "_kernels": {}}

    def with_source(self, source: str, name: str | None = None) -> SourceLaunch:
        """The same launch around another body (a generated mutant)."""
        return SourceLaunch(
            source, self.inputs, self.output, self.grid, self.threadgroup, self.template, self.header, name or self.name
        )

    def resolved_template(self, shape: tuple[int, int, int]) -> list[tuple[str, Any]]:
        dims = dict(zip(SHAPE_NAMES, shape))
        return [(k, dims[v] if isinstance(v, str) else v) for k, v in self.template]

    def kernel(self, language: str) -> Any:
        """The ``mx.fast`` kernel object (made once per language); its name carries a hash of
        the body, since MLX caches kernels by name (two bodies under one name once ran the first's code)."""
        if language not in self._kernels:
            digest = hashlib.sha256((self.header + self.source).encode()).hexdigest()[:12]
            self._kernels[language] = kernel_run.source_kernel(
                language,
                f"{self.name}_{digest}",
                self.inputs,
                [self.output],
                self.source,
                self.header,
                source_name=self.source_file,
            )
        return self._kernels[language]

    def launch_args(self, shape: tuple[int, int, int]) -> dict[str, Any]:
        return dict(
            template=self.resolved_template(shape),
            grid=self.grid,
            threadgroup=self.threadgroup,
            output_shapes=[(shape[0],)],
            output_dtypes=[mx.float32],
        )


def source_inputs(launch: SourceLaunch, tensors: Mapping[str, Any]) -> list[mx.array]:
    """The launch's inputs, in its order, from the case's tensors (name -> array)."""
    return [t if isinstance(t, mx.array) else mx.array(t) for t in (tensors[n] for n in launch.inputs)]


def run_metal_emulated(
    launch: SourceLaunch,
    inputs: Sequence[mx.array],
    shape: tuple[int, int, int],
    *,
    order: str = "ascending",
    seed: int = 0,
) -> np.ndarray:
    """The launch's Metal source run on the CPU by the workbench's emulator; float32 [hidden].
    Its output NaN-filled first and every element's write checked, as on a device
    (:func:`workbench.kernels.output_coverage.covered_launch`)."""
    backends.resolve_backend(kernel_run.METAL_EMULATED)  # without clang: BackendUnavailable saying what to install
    kernel = launch.kernel(kernel_run.METAL_EMULATED)
    kw = {**launch.launch_args(shape), "order": order, "seed": seed}
    (out,) = covered_launch(mlx_launch(kernel, inputs, kw), [launch.output])
    return np.asarray(out, dtype=np.float32)


def run_on_device(
    launch: SourceLaunch, language: str, inputs: Sequence[mx.array], shape: tuple[int, int, int]
) -> np.ndarray:
    """The launch on its device (``"metal"``: an Apple GPU; ``"cuda"``: an NVIDIA GPU), its
    output NaN-filled before the launch and an element the grid never wrote named
    (:class:`~workbench.kernels.output_coverage.UncoveredOutput`); ``BackendUnavailable``
    where that device is absent."""
    backends.resolve_backend(language)
    (out,) = covered_launch(mlx_launch(launch.kernel(language), inputs, launch.launch_args(shape)), [launch.output])
    return np.array(out)


def launch_fields(
    source: Any,
    inputs: Any,
    template: Any,
    language: str,
    run_on: str,
    order: str,
    *,
    names: tuple[str, ...],
    dims: tuple[str, ...],
    orders: tuple[str, ...],
) -> tuple[tuple[str, ...], tuple[tuple[str, Any], ...]]:
    """A part's source and its launch checked alike for every part: ``source`` a non-empty
    body; ``inputs`` distinct names of ``names``; ``template`` (a mapping or pairs) whose named
    values are of ``dims``; the language, where it runs (a CUDA source runs on the device only:
    the emulator runs Metal) and the emulator's ``order`` one of ``orders``. Returns the inputs
    and the template as tuples, for a frozen dataclass to hold; a ValueError names what is wrong."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"source: must be the kernel body as a non-empty string, got {describe(source)}")
    ins = tuple(inputs) if isinstance(inputs, (list, tuple)) else ()
    if not ins or any(i not in names for i in ins) or len(set(ins)) != len(ins):
        raise ValueError(f"inputs: must be distinct names of {names}, got {describe(inputs)}")
    tpl = tuple(template.items()) if isinstance(template, Mapping) else tuple(template)
    for k, v in tpl:
        if isinstance(v, str) and v not in dims:
            raise ValueError(f"template[{k!r}]: a name must be one of {dims}, got {v!r}")
    one_of("language", language, ("metal", "cuda"))
    one_of("run_on", run_on, ("emulator", "device"))
    one_of("order", order, orders)
    if language == "cuda" and run_on == "emulator":
        raise ValueError("run_on: a CUDA source runs on the device only (the emulator runs Metal), got 'emulator'")
    return ins, tpl
