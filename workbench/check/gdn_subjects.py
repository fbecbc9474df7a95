"""The forms of a Gated DeltaNet step under test: a Python callable, a kernels folder (the
user's ``gdn_step.body`` on the workbench's launch), or a Metal / CUDA source with its launch.

Each form takes one token of one sequence (:class:`StepInputs`: the layer's constants, the
token's inputs and both states) and returns ``(out [Hv Dv], conv_state' [K-1, C],
state' [Hv, Dv, Dk])``; the check feeds both states back as the next token's. What a form
returns is checked tensor by tensor (:func:`checked_step`): a wrong shape or dtype is a
:class:`~workbench.check.subjects.SubjectError` naming the tensor, never a crash.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import backends
from workbench.check.source_launch import launch_fields
from workbench.check.stored import ARRAY_KINDS
from workbench.check.subjects import EMULATOR_ORDERS, SubjectError
from workbench.check.time_limit import LimitedCaller
from workbench.kernels import run as kernel_run
from workbench.kernels.gdn_step import GdnShape
from workbench.validate import describe, one_of

#: The tensors a step's source may take, and the names of the three it writes (in this order:
#: the output, the conv state, the recurrent state; named apart from the inputs they follow).
STEP_INPUTS: tuple[str, ...] = (
    "mixed",
    "z",
    "b",
    "a",
    "conv_state",
    "state",
    "conv_w",
    "a_log",
    "dt_bias",
    "o_norm",
    "eps",
)
STEP_OUTPUTS: tuple[str, ...] = ("out", "conv_state_out", "state_out")

#: The three tensors a step returns, as messages name them.
RETURNED: tuple[str, ...] = ("out", "conv_state", "state")

#: Template values that stand for the geometry's dimensions (``"C"``: the conv's channels).
STEP_DIMS: tuple[str, ...] = ("HK", "HV", "DK", "DV", "K", "C")


@dataclass(frozen=True)
class StepInputs:
    """One token of one sequence, as a step is handed it (arrays of the form's ``arrays`` kind):
    the token's ``mixed`` [C] (q | k | v before the conv), ``z`` [Hv Dv], ``b`` and ``a``
    [Hv]; the states ``conv_state`` [K-1, C] and ``state`` [Hv, Dv, Dk]; the layer's
    ``conv_w`` [K, C], ``a_log``, ``dt_bias`` [Hv], ``o_norm`` [Dv], ``eps`` (the RMS
    norm's) and ``k_heads``; ``case`` and ``token`` say where it is in the check."""

    mixed: Any
    z: Any
    b: Any
    a: Any
    conv_state: Any
    state: Any
    conv_w: Any
    a_log: Any
    dt_bias: Any
    o_norm: Any
    eps: float
    k_heads: int
    case: str = ""
    token: int = 0


def to_kind(kind: str, a: Any) -> Any:
    """``a`` (a numpy or MLX array) as ``kind`` (:data:`ARRAY_KINDS`); an array already of
    the kind is handed on as it is (an MLX state a step returned goes back to it uncopied)."""
    if kind == "numpy":
        return np.asarray(a)
    if kind == "mlx":
        return a if isinstance(a, mx.array) else mx.array(a)
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))


def _as_numpy(v: Any) -> tuple[np.ndarray | None, str]:
    """A returned tensor as numpy with its dtype's name as returned (a bfloat16 MLX array is
    read as float32 but named bfloat16, so the dtype check sees what was returned; a float32
    one is read in place, not copied)."""
    if isinstance(v, np.ndarray):
        return v, str(v.dtype)
    if isinstance(v, mx.array):
        name = str(v.dtype).removeprefix("mlx.core.")
        return np.asarray(v if v.dtype == mx.float32 else v.astype(mx.float32)), name
    if type(v).__module__.startswith("torch"):
        try:
            return v.detach().to("cpu").float().numpy(), str(v.dtype).removeprefix("torch.")
        except Exception:  # not a tensor after all: reported as a non-array
            return None, ""
    return None, ""


def checked_step(value: Any, shape: GdnShape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``value`` as the three float32 tensors of a step, or a :class:`SubjectError` naming the
    tensor that is missing, not an array, of the wrong shape or not float32."""
    want = {"out": (shape.vd,), "conv_state": (shape.kw - 1, shape.channels), "state": (shape.hv, shape.dv, shape.dk)}
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise SubjectError(f"returned {describe(value)}, expected (out, conv_state, state)")
    got = []
    for name, v in zip(RETURNED, value):
        a, dtype = _as_numpy(v)
        if a is None:
            raise SubjectError(f"tensor {name}: returned {describe(v)}, not an array")
        if tuple(a.shape) != want[name]:
            raise SubjectError(f"tensor {name}: returned shape {tuple(a.shape)}, expected {want[name]}")
        if dtype != "float32":
            raise SubjectError(f"tensor {name}: returned dtype {dtype}, expected float32 (the state is fed back)")
        got.append(a)
    return got[0], got[1], got[2]


@dataclass(frozen=True)
class CallableStep:
    """A Python function ``fn(step: StepInputs) -> (out, conv_state, state)``, handed numpy,
    MLX or PyTorch arrays (``arrays``)."""

    fn: Callable[[StepInputs], Any]
    arrays: str = "numpy"
    name: str = ""
    kind: str = "callable"

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ValueError(f"fn: must be callable (StepInputs -> (out, conv_state, state)), got {describe(self.fn)}")
        one_of("arrays", self.arrays, ARRAY_KINDS)
        if not self.name:
            object.__setattr__(self, "name", getattr(self.fn, "__qualname__", type(self.fn).__name__))

    def layer(self, shape: GdnShape, consts: Mapping[str, np.ndarray], eps: float) -> Callable[[StepInputs], Any]:
        """The call for one sequence: its constants converted once, each token's arrays on the call."""
        conv = {k: to_kind(self.arrays, v) for k, v in consts.items()}

        def call(step: StepInputs) -> Any:
            made = {k: to_kind(self.arrays, getattr(step, k)) for k in STEP_INPUTS[:6]}
            return self.fn(replace(step, **made, **conv))

        return call


def _folder(folder: Any) -> Path:
    if not isinstance(folder, (str, os.PathLike)) or not str(folder).strip():
        raise ValueError(f"folder: must be a folder shaped like kernels/ (a str or Path), got {describe(folder)}")
    path = Path(folder)
    if not (path / "gdn_step.body").is_file():
        raise ValueError(f"folder: must be a folder shaped like kernels/ holding gdn_step.body, got {str(folder)!r}")
    return path


@dataclass(frozen=True)
class KernelsFolderStep:
    """A folder shaped like ``kernels/`` whose ``gdn_step.body`` runs on the workbench's launch
    (``workbench.kernels.gdn_step.prepare``) on ``backend`` (``"metal-emulated"``: the CPU)."""

    folder: Path
    backend: str = "metal-emulated"
    order: str = "ascending"
    name: str = ""
    kind: str = "kernels folder"

    def __post_init__(self) -> None:
        object.__setattr__(self, "folder", _folder(self.folder))
        one_of("backend", self.backend, (kernel_run.METAL_EMULATED,) + kernel_run.DEVICE_BACKENDS)
        one_of("order", self.order, EMULATOR_ORDERS[:-1])
        backends.resolve_backend(self.backend)
        if not self.name:
            object.__setattr__(self, "name", self.folder.name)

    def layer(self, shape: GdnShape, consts: Mapping[str, np.ndarray], eps: float) -> Callable[[StepInputs], Any]:
        from workbench.kernels.gdn_step import prepare

        launch = prepare(
            consts["conv_w"],
            consts["a_log"],
            consts["dt_bias"],
            consts["o_norm"],
            eps,
            k_heads=shape.hk,
            backend=self.backend,
            kernel_dir=self.folder,
        )

        def call(step: StepInputs) -> Any:
            ba = np.concatenate([step.b, step.a])
            out = launch(step.mixed, step.z, ba, step.conv_state, step.state, order=self.order)
            mx.eval(*out)
            return out

        return call


@dataclass(frozen=True)
class StepSource:
    """A Metal or CUDA step body and its launch: ``inputs`` (names of :data:`STEP_INPUTS`; ``eps``
    comes as a one-element float32 array), the outputs named :data:`STEP_OUTPUTS`, ``grid`` and
    ``threadgroup`` (threads, as MLX counts them), ``template`` (name -> number, or a name
    of :data:`STEP_DIMS`), ``header``; run on the emulator (Metal) or the device."""

    source: str
    inputs: tuple[str, ...] = STEP_INPUTS
    grid: tuple[int, int, int] = (32, 1, 1)
    threadgroup: tuple[int, int, int] = (32, 1, 1)
    template: tuple[tuple[str, Any], ...] = ()
    header: str = ""
    language: str = "metal"
    run_on: str = "emulator"
    order: str = "ascending"
    name: str = "user_gdn_step"
    kind: str = "source"
    _kernels: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        ins, tpl = launch_fields(
            self.source,
            self.inputs,
            self.template,
            self.language,
            self.run_on,
            self.order,
            names=STEP_INPUTS,
            dims=STEP_DIMS,
            orders=EMULATOR_ORDERS[:-1],
        )
        object.__setattr__(self, "inputs", ins)
        object.__setattr__(self, "template", tpl)
        self._backend()
        object.__setattr__(self, "kind", f"{self.language} source")

    def __getstate__(self) -> dict[str, Any]:
        """What pickling keeps (the step sent to its worker process): all but the compiled kernels."""
        return {**self.__dict__, "_kernels": {}}

    def _backend(self) -> str:
        return backends.resolve_backend(kernel_run.METAL_EMULATED if self.run_on == "emulator" else self.language)

    def with_source(self, source: str, name: str | None = None) -> StepSource:
        """The same launch around another body (a mutant of it)."""
        return replace(self, source=source, name=name or self.name, _kernels={})

    def kernel(self) -> Any:
        backend = kernel_run.METAL_EMULATED if self.run_on == "emulator" else self.language
        if backend not in self._kernels:
            digest = hashlib.sha256((self.header + self.source).encode()).hexdigest()[:12]
            self._kernels[backend] = kernel_run.source_kernel(
                backend, f"{self.name}_{digest}", self.inputs, STEP_OUTPUTS, self.source, self.header
            )
        return self._kernels[backend]

    def layer(self, shape: GdnShape, consts: Mapping[str, np.ndarray], eps: float) -> Callable[[StepInputs], Any]:
        s = shape
        dims = dict(zip(STEP_DIMS, (s.hk, s.hv, s.dk, s.dv, s.kw, s.channels)))
        kw = dict(
            template=[(k, dims[v] if isinstance(v, str) else v) for k, v in self.template],
            grid=self.grid,
            threadgroup=self.threadgroup,
            output_shapes=[(s.vd,), (s.kw - 1, s.channels), (s.hv, s.dv, s.dk)],
            output_dtypes=[mx.float32] * 3,
        )
        kernel = self.kernel()
        extra = {"order": self.order} if self.run_on == "emulator" else {}
        held = {k: mx.array(v) for k, v in consts.items()}
        held["eps"] = mx.array(np.array([eps], np.float32))

        def call(step: StepInputs) -> Any:
            ins = [held[n] if n in held else mx.array(getattr(step, n)) for n in self.inputs]
            out = kernel(inputs=ins, **kw, **extra)
            mx.eval(*out)
            return out

        return call


class TimedStep:
    """A step form whose every call (a sequence's preparation, a token) runs under a time
    limit: a call past it raises ``TimeoutError`` (the check stops that sequence and names it)."""

    def __init__(self, inner: Any, seconds: float) -> None:
        self.inner, self.seconds, self._caller = inner, seconds, LimitedCaller(seconds)
        self.name, self.kind = inner.name, inner.kind

    def _limited(self, fn: Callable[..., Any], *xs: Any) -> Any:
        o = self._caller(fn, *xs)
        if o.timed_out:
            raise TimeoutError(f"took over {self.seconds:g} s (--time-limit)")
        if o.error is not None:
            raise o.error
        return o.value

    def layer(self, shape: Any, consts: Mapping[str, Any], eps: float) -> Callable[[Any], Any]:
        call = self._limited(self.inner.layer, shape, consts, eps)

        def evaluated(step: Any) -> Any:
            # MLX records a graph on the calling thread's stream: evaluated here, on the
            # worker, so the check's thread reads finished arrays
            out = call(step)
            if isinstance(out, (tuple, list)):
                mx.eval(*[x for x in out if isinstance(x, mx.array)])
            return out

        return lambda step: self._limited(evaluated, step)
