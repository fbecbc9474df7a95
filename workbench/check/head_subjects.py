"""The forms of an attention head under test: a Python callable, a kernels folder (the user's
``head_qkv.body`` on the workbench's head launch), or a Metal / CUDA source with its launch.

Each form takes one case (:class:`~workbench.check.head_cases.HeadInputs`) and returns the
head's tensors in :attr:`HeadSpec.outputs` order (``q, k, v`` and, with a gate, ``gate``).
What a form returns is checked tensor by tensor (:func:`checked_head`): a wrong count,
shape or dtype is a :class:`~workbench.check.subjects.SubjectError` naming the tensor.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import backends
from workbench.check.gdn_subjects import to_kind
from workbench.check.head_cases import HeadInputs
from workbench.check.head_spec import HeadSpec
from workbench.check.source_launch import launch_fields
from workbench.check.stored import ARRAY_KINDS
from workbench.check.subjects import EMULATOR_ORDERS, SubjectError
from workbench.kernels import run as kernel_run
from workbench.validate import describe, one_of

#: The tensors a head's source may take. ``rotation``: the shared fold's rotation as a dense
#: [hidden, hidden] matrix R (a kernel computes ``W' (R n)``; an unfolded spec hands the
#: identity); ``eps``, ``position`` and ``rope_theta`` come as one-element float32 arrays.
HEAD_INPUTS: tuple[str, ...] = (
    "hidden",
    "attn_norm",
    "q_w",
    "k_w",
    "v_w",
    "q_b",
    "k_b",
    "v_b",
    "q_norm",
    "k_norm",
    "rotation",
    "eps",
    "position",
    "rope_theta",
)

#: The tensors a head's source writes, by the spec's outputs (named apart from the inputs).
HEAD_OUTPUTS: dict[str, str] = {"q": "q_out", "k": "k_out", "v": "v_out", "gate": "gate_out"}

#: Template values that stand for the spec's dimensions (``QR``: q_proj's rows, the gate's
#: included; ``ROT``: the rotary dims of a head).
HEAD_DIMS: tuple[str, ...] = ("HID", "HQ", "HKV", "D", "QR", "ROT")


def _read(v: Any) -> tuple[np.ndarray | None, str]:
    """A returned tensor as numpy and its dtype's name AS RETURNED (a bfloat16 tensor is read
    widened but named bfloat16, so the dtype check sees what came back)."""
    if isinstance(v, np.ndarray):
        return v, str(v.dtype)
    if isinstance(v, mx.array):
        return np.asarray(v.astype(mx.float32)), str(v.dtype).removeprefix("mlx.core.")
    if type(v).__module__.startswith("torch"):
        try:
            return v.detach().to("cpu").float().numpy(), str(v.dtype).removeprefix("torch.")
        except Exception:  # not a tensor after all: reported as a non-array
            return None, ""
    return None, ""


def checked_head(value: Any, spec: HeadSpec) -> dict[str, np.ndarray]:
    """``value`` as the head's float32 tensors by name, or a :class:`SubjectError` naming the
    tensor that is missing, not an array, of the wrong shape or not float32."""
    names = spec.outputs
    if not isinstance(value, (tuple, list)) or len(value) != len(names):
        raise SubjectError(f"returned {describe(value)}, expected ({', '.join(names)})")
    got = {}
    for name, v in zip(names, value):
        a, dtype = _read(v)
        if a is None:
            raise SubjectError(f"tensor {name}: returned {describe(v)}, not an array")
        want = spec.output_shape(name)
        if tuple(a.shape) != want:
            raise SubjectError(f"tensor {name}: returned shape {tuple(a.shape)}, expected {want}")
        if dtype != "float32":
            raise SubjectError(f"tensor {name}: returned dtype {dtype}, expected float32")
        got[name] = a
    return got


@dataclass(frozen=True)
class CallableHead:
    """A Python function ``fn(head: HeadInputs) -> (q, k, v[, gate])``, handed numpy, MLX or
    PyTorch arrays (``arrays``)."""

    fn: Callable[[HeadInputs], Any]
    arrays: str = "numpy"
    name: str = ""
    kind: str = "callable"

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ValueError(f"fn: must be callable (HeadInputs -> (q, k, v[, gate])), got {describe(self.fn)}")
        one_of("arrays", self.arrays, ARRAY_KINDS)
        if not self.name:
            object.__setattr__(self, "name", getattr(self.fn, "__qualname__", type(self.fn).__name__))

    def prepare(self, spec: HeadSpec) -> Callable[[HeadInputs], Any]:
        kind = self.arrays
        names = ("hidden", "attn_norm", "q_w", "k_w", "v_w", "q_b", "k_b", "v_b", "q_norm", "k_norm")

        def call(head: HeadInputs) -> Any:
            made = {k: None if getattr(head, k) is None else to_kind(kind, getattr(head, k)) for k in names}
            return self.fn(replace(head, **made))

        return call


def _folder(folder: Any) -> Path:
    if not isinstance(folder, (str, os.PathLike)) or not str(folder).strip():
        raise ValueError(f"folder: must be a folder shaped like kernels/ (a str or Path), got {describe(folder)}")
    path = Path(folder)
    if not (path / "head_qkv.body").is_file():
        raise ValueError(f"folder: must be a folder shaped like kernels/ holding head_qkv.body, got {str(folder)!r}")
    return path


@dataclass(frozen=True)
class KernelsFolderHead:
    """A folder shaped like ``kernels/`` whose ``head_qkv.body`` runs on the workbench's head
    launch (``workbench.kernels.head.head_launch``: norm, shared fold, Q/K/V) on ``backend``
    (``"metal-emulated"``: the CPU), the biases added after on the host as frink-models
    does. The launch computes the ``"launch"`` shape only: a ``"model"`` spec is refused."""

    folder: Path
    backend: str = "metal-emulated"
    name: str = ""
    kind: str = "kernels folder"

    def __post_init__(self) -> None:
        object.__setattr__(self, "folder", _folder(self.folder))
        one_of("backend", self.backend, (kernel_run.METAL_EMULATED,) + kernel_run.DEVICE_BACKENDS)
        backends.resolve_backend(self.backend)
        if not self.name:
            object.__setattr__(self, "name", self.folder.name)

    def prepare(self, spec: HeadSpec) -> Callable[[HeadInputs], Any]:
        if spec.shape != "launch":
            raise ValueError(
                f"spec: a kernels folder runs the workbench's head launch, the 'launch' shape; got {spec.label!r}"
            )
        from workbench.fold.weights import WeightMatrix
        from workbench.kernels.head import head_launch

        def call(head: HeadInputs) -> Any:
            q, k, v = (WeightMatrix(mx.array(m), head.fold) for m in (head.q_w, head.k_w, head.v_w))
            out = head_launch(
                mx.array(head.hidden), head.attn_norm, spec.eps, q, k, v, self.backend, kernel_dir=self.folder
            )
            if spec.bias:
                out = tuple(o + mx.array(b) for o, b in zip(out, (head.q_b, head.k_b, head.v_b)))
            mx.eval(*out)
            return out

        return call


@dataclass(frozen=True)
class HeadSource:
    """A Metal or CUDA head body and its launch: ``inputs`` (names of :data:`HEAD_INPUTS`; one
    the spec has not, a bias or a QK-norm weight, comes as a one-element zero), the outputs
    named by :data:`HEAD_OUTPUTS` for the spec's tensors, ``grid`` and ``threadgroup``
    (threads, as MLX counts them), ``template`` (name -> number, or a name of
    :data:`HEAD_DIMS`), ``header``; run on the emulator (Metal) or the device."""

    source: str
    inputs: tuple[str, ...] = HEAD_INPUTS
    grid: tuple[int, int, int] = (32, 1, 1)
    threadgroup: tuple[int, int, int] = (32, 1, 1)
    template: tuple[tuple[str, Any], ...] = ()
    header: str = ""
    language: str = "metal"
    run_on: str = "emulator"
    order: str = "ascending"
    name: str = "user_head"
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
            names=HEAD_INPUTS,
            dims=HEAD_DIMS,
            orders=EMULATOR_ORDERS[:-1],
        )
        object.__setattr__(self, "inputs", ins)
        object.__setattr__(self, "template", tpl)
        backends.resolve_backend(self._backend())
        object.__setattr__(self, "kind", f"{self.language} source")

    def _backend(self) -> str:
        return kernel_run.METAL_EMULATED if self.run_on == "emulator" else self.language

    def with_source(self, source: str, name: str | None = None) -> HeadSource:
        """The same launch around another body (a mutant of it)."""
        return replace(self, source=source, name=name or self.name, _kernels={})

    def kernel(self, outputs: tuple[str, ...]) -> Any:
        key = (self._backend(), outputs)
        if key not in self._kernels:
            digest = hashlib.sha256((self.header + self.source).encode()).hexdigest()[:12]
            self._kernels[key] = kernel_run.source_kernel(
                self._backend(), f"{self.name}_{digest}", self.inputs, outputs, self.source, self.header
            )
        return self._kernels[key]

    def prepare(self, spec: HeadSpec) -> Callable[[HeadInputs], Any]:
        s = spec
        dims = dict(zip(HEAD_DIMS, (s.hidden, s.q_heads, s.kv_heads, s.head_dim, s.q_rows, s.rotary_dim)))
        outs = tuple(HEAD_OUTPUTS[n] for n in s.outputs)
        kw = dict(
            template=[(k, dims[v] if isinstance(v, str) else v) for k, v in self.template],
            grid=self.grid,
            threadgroup=self.threadgroup,
            output_shapes=[s.output_shape(n) for n in s.outputs],
            output_dtypes=[mx.float32] * len(outs),
        )
        kernel = self.kernel(outs)
        extra = {"order": self.order} if self.run_on == "emulator" else {}
        zero = mx.zeros((1,), mx.float32)
        eye = mx.eye(s.hidden, dtype=mx.float32)

        def arg(head: HeadInputs, n: str) -> mx.array:
            if n in ("eps", "position", "rope_theta"):
                value = {"eps": s.eps, "position": head.position, "rope_theta": s.rope_theta}[n]
                return mx.array(np.array([value], np.float32))
            if n == "rotation":
                return eye if head.fold is None else mx.array(head.fold.matrix(s.hidden).astype(np.float32))
            v = getattr(head, n)
            return zero if v is None else mx.array(np.asarray(v, np.float32))

        def call(head: HeadInputs) -> Any:
            out = kernel(inputs=[arg(head, n) for n in self.inputs], **kw, **extra)
            mx.eval(*out)
            return out

        return call
