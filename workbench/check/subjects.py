"""The forms of an implementation under test, each run on one case: a Python callable, a
kernels folder shaped like ``kernels/``, or a Metal / CUDA source with its launch.

Each form turns a case (the workbench's ``TailWeights`` and the activations, with leading
input-scale axes) into float32 outputs [..., hidden]; what goes wrong is raised as
:class:`SubjectError` with what was wrong, and the check reports it naming the case.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workbench import backends
from workbench.check.source_launch import SourceLaunch, run_metal_emulated, run_on_device, source_inputs
from workbench.check.stored import ARRAY_KINDS, StoredCase, as_numpy, convert
from workbench.kernels import run as kernel_run
from workbench.kernels.output_coverage import UncoveredOutput, covered_launch, mlx_launch
from workbench.tail.weights import TailWeights
from workbench.validate import describe, flag, one_of

#: ``order=`` of the emulated forms: one schedule of ``workbench.kernels.metal_emulation.SCHEDULES``,
#: or ``"every"`` (each case in all of them, the bits compared). Spelled out here so that
#: validating an order does not load the emulator.
EVERY = "every"
EMULATOR_ORDERS: tuple[str, ...] = (
    "ascending",
    "descending",
    "shuffled",
    "simd-groups-ascending",
    "simd-groups-descending",
    "simd-groups-random",
    EVERY,
)


class SubjectError(RuntimeError):
    """The implementation under test gave no usable result for a case (the message says why)."""


def checked_output(value: Any, want: tuple[int, ...]) -> np.ndarray:
    """``value`` as float32 numpy of shape ``want``, or :class:`SubjectError` saying what it was."""
    a = as_numpy(value)
    if a is None:
        raise SubjectError(f"returned {describe(value)}, not an array")
    if tuple(a.shape) != tuple(want):
        raise SubjectError(f"returned shape {tuple(a.shape)}, expected {tuple(want)}")
    if not (np.issubdtype(a.dtype, np.floating)):
        raise SubjectError(f"returned dtype {a.dtype}, expected a float array")
    return a.astype(np.float32)


def importable_path(fn: Any) -> str | None:
    """``"module:qualname"`` when ``fn`` can be imported again by that path in another process
    (the same object found there), else None."""
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qual or module == "__main__" or "<" in qual:
        return None
    try:
        found = load(f"{module}:{qual}")
    except Exception:  # any import failure: the callable stays in the check's process
        return None
    return f"{module}:{qual}" if found is fn else None


def load(path: str) -> Callable[..., Any]:
    """The object at ``"module:qualname"``."""
    module, qual = path.split(":", 1)
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class CallableSubject:
    """A Python function ``fn(case: StoredCase) -> array [hidden]`` (numpy, MLX or PyTorch,
    ``arrays`` says which it is handed); ``batched``: it takes the input scales of one case
    as a leading axis ([n, branch] in, [n, hidden] out) in one call. ``process``: run it in a
    worker process of its own (:mod:`workbench.check.isolation`): None (the default) where
    it is importable by ``module:qualname``, True to require that, False never; ``path`` is
    that import path when it runs there, else ``""``."""

    fn: Callable[[StoredCase], Any]
    arrays: str = "numpy"
    batched: bool = False
    name: str = ""
    kind: str = "callable"
    process: bool | None = None
    path: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ValueError(f"fn: must be callable (case -> output array), got {describe(self.fn)}")
        one_of("arrays", self.arrays, ARRAY_KINDS)
        flag("batched", self.batched)
        if self.process is not None and not isinstance(self.process, bool):
            raise ValueError(f"process: must be True, False or None (where importable), got {describe(self.process)}")
        if not self.name:
            object.__setattr__(self, "name", getattr(self.fn, "__qualname__", type(self.fn).__name__))
        if self.process is not False:
            path = importable_path(self.fn)
            if path is None and self.process:
                raise ValueError(
                    "process: True needs a function importable by module:qualname (not a lambda, a closure "
                    f"or one defined in __main__), got {describe(self.fn)}"
                )
            object.__setattr__(self, "path", path or "")

    def jobs(self, sc: StoredCase) -> list[tuple[StoredCase, tuple[int, ...]]]:
        """The cases one case's calls are handed, numpy (one, or one a scale), each with the
        shape it must return: what :func:`workbench.check.guards.guarded_call` takes."""
        hidden = sc.shape[0]
        if self.batched:
            return [(sc, (sc.branch.shape[0], hidden))]
        return [
            (StoredCase(**{**sc.__dict__, "branch": sc.branch[i], "residual": sc.residual[i]}), (hidden,))
            for i in range(sc.branch.shape[0])
        ]

    def calls(self, sc: StoredCase) -> list[tuple[Callable[[], np.ndarray], tuple[int, ...]]]:
        """The calls one case takes (one, or one a scale), each with the shape it must return."""
        hidden = sc.shape[0]
        if self.batched:
            case = convert(sc, self.arrays)
            return [(lambda c=case: self.fn(c), (sc.branch.shape[0], hidden))]
        out = []
        for i in range(sc.branch.shape[0]):
            one = StoredCase(**{**sc.__dict__, "branch": sc.branch[i], "residual": sc.residual[i]})
            case = convert(one, self.arrays)
            out.append((lambda c=case: self.fn(c), (hidden,)))
        return out


def _check_folder_texts(folder: Path, dialect: str) -> None:
    """``ValueError`` naming ``folder`` and the file unless every text the tail's launches are
    composed of (the dialect's prelude, ``common.h``, each launch's body) is there, is UTF-8
    and is shaped as composing needs: a missing body is said once, here, not as a failure
    of every case of the check."""
    from workbench.kernels import source as kernel_source  # only this form reads kernel texts

    for kernel in kernel_source.TAIL_KERNELS:
        try:
            kernel_source.compose(dialect, kernel, kernel_dir=folder)
        except FileNotFoundError as e:
            raise ValueError(f"folder: {folder} is not shaped like kernels/: {e}") from None
        except UnicodeDecodeError as e:
            raise ValueError(
                f"folder: {folder} holds a kernel text that is not UTF-8 (byte {e.start}: {e.reason})"
            ) from None
        except ValueError as e:
            raise ValueError(f"folder: {folder}: {e}") from None


@dataclass(frozen=True)
class KernelsFolderSubject:
    """A folder shaped like ``kernels/`` (the user's bodies on the workbench's launches), run on
    ``backend``: ``"metal-emulated"`` (the CPU emulator), ``"metal"`` or ``"cuda"``. ``order``:
    the emulator's thread schedule, or ``"every"``: each case in every schedule, a case whose
    bits differ between two reported as a race (a :class:`SubjectError` naming them)."""

    folder: Path
    backend: str = "metal-emulated"
    order: str = "ascending"
    name: str = ""
    kind: str = "kernels folder"
    #: Run in a worker process of its own (:mod:`workbench.check.isolation`): the user's text,
    #: compiled, cannot take the check down with it, nor reach the truth. False: in the
    #: check's process (a crash there ends the check).
    process: bool = True
    #: One call takes a case's every input scale (rows of one launch).
    batched: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        flag("process", self.process)
        if not isinstance(self.folder, (str, os.PathLike)) or not str(self.folder).strip():
            raise ValueError(
                f"folder: must be a folder shaped like kernels/ (a str or Path), got {describe(self.folder)}"
            )
        folder = Path(self.folder)
        if not folder.is_dir():
            raise ValueError(f"folder: must be a folder shaped like kernels/, got {str(self.folder)!r} (not a folder)")
        object.__setattr__(self, "folder", folder)
        one_of("backend", self.backend, (kernel_run.METAL_EMULATED,) + kernel_run.DEVICE_BACKENDS)
        one_of("order", self.order, EMULATOR_ORDERS)
        _check_folder_texts(folder, kernel_run.source_dialect(self.backend))
        backends.resolve_backend(self.backend)
        if not self.name:
            object.__setattr__(self, "name", folder.name)

    def run(self, w: TailWeights, branch: np.ndarray, residual: np.ndarray) -> np.ndarray:
        from workbench.kernels.emulated import emulated_tail  # only this form needs the emulator
        from workbench.tail.paths import tail_launch

        launch = tail_launch(w)
        emulated = kernel_run.is_emulated(self.backend)
        if emulated and self.order == EVERY:
            from workbench.kernels.metal_emulation import SCHEDULES

            outs = {o: emulated_tail(launch, branch, residual, kernel_dir=self.folder, order=o) for o in SCHEDULES}
            first = outs[SCHEDULES[0]]
            for o, v in outs.items():
                if not np.array_equal(first.view(np.uint32), v.view(np.uint32)):
                    raise SubjectError(
                        f"different bits in schedules {SCHEDULES[0]!r} and {o!r} (a race between "
                        "threads: a missing barrier, or a read of memory another thread writes)"
                    )
            return first
        if emulated:  # the emulator NaN-fills every output itself
            return emulated_tail(launch, branch, residual, kernel_dir=self.folder, order=self.order)
        return covered_device_tail(self.backend, launch, branch, residual, self.folder)

    def calls(self, sc: StoredCase, w: TailWeights) -> list[tuple[Callable[[], np.ndarray], tuple[int, ...]]]:
        return [(lambda: self.run(w, sc.branch, sc.residual), (sc.branch.shape[0], sc.shape[0]))]


def covered_device_tail(backend: str, launch: Any, branch: np.ndarray, residual: np.ndarray, folder: Path) -> Any:
    """The tail's three launches of ``folder``'s bodies on a device, one evaluation each, every
    output (``h``, ``act``, ``out``) NaN-filled first and its coverage checked
    (:func:`~workbench.kernels.output_coverage.covered_launch`): a :class:`SubjectError`
    naming the launch and the elements it never wrote. Float32 [..., hidden]. Three
    evaluations a row, not the one an engine submits: the check's cost, not the kernels'."""
    from workbench.kernels.launch import prepared

    calls = prepared(launch, kernel_run.source_dialect(backend), None, kernel_dir=folder).calls()
    b2, r2 = np.asarray(branch, np.float32), np.asarray(residual, np.float32)
    rows = []
    try:
        for b, r in zip(b2.reshape(-1, b2.shape[-1]), r2.reshape(-1, r2.shape[-1])):
            k, consts, kw = calls["wo_residual"]  # the inputs in PreparedTail.launch_wo's order, and so on
            (h,) = covered_launch(mlx_launch(k, [kernel_run.as_mx32(b), *consts, kernel_run.as_mx32(r)], kw), ["h"])
            k, consts, kw = calls["ffn_gate_up"]
            (act,) = covered_launch(mlx_launch(k, [h, *consts], kw), ["act"])
            k, consts, kw = calls["ffn_down"]
            (out,) = covered_launch(mlx_launch(k, [act, h, *consts], kw), ["out"])
            rows.append(np.array(out, dtype=np.float32))
    except UncoveredOutput as e:
        launched = {"h": "wo_residual", "act": "ffn_gate_up", "out": "ffn_down"}[e.output]
        raise SubjectError(f"launch {launched}: {e}") from None
    return np.stack(rows).reshape(r2.shape)


@dataclass(frozen=True)
class SourceSubject:
    """A Metal or CUDA source with its launch (:class:`SourceLaunch`), run on ``"emulator"``
    (Metal only: the CPU) or ``"device"``. Takes dense, unfolded weights: a source that
    rotates or dequantizes would need inputs this form does not name yet."""

    launch: SourceLaunch
    language: str = "metal"
    run_on: str = "emulator"
    order: str = "ascending"
    name: str = ""
    kind: str = "source"
    #: As :attr:`KernelsFolderSubject.process`.
    process: bool = True
    #: One call an input scale (the launch takes one row).
    batched: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        flag("process", self.process)
        if not isinstance(self.launch, SourceLaunch):
            raise ValueError(f"launch: must be a SourceLaunch, got {describe(self.launch)}")
        one_of("language", self.language, ("metal", "cuda"))
        one_of("run_on", self.run_on, ("emulator", "device"))
        one_of("order", self.order, EMULATOR_ORDERS)
        if self.language == "cuda" and self.run_on == "emulator":
            raise ValueError("run_on: a CUDA source runs on the device only (the emulator runs Metal), got 'emulator'")
        backends.resolve_backend("metal-emulated" if self.run_on == "emulator" else self.language)
        if not self.name:
            object.__setattr__(self, "name", self.launch.name)
        object.__setattr__(self, "kind", f"{self.language} source")

    def run_one(self, w: TailWeights, b: np.ndarray, r: np.ndarray) -> np.ndarray:
        if w.wo.fold is not None or w.wo.quantization is not None:
            raise SubjectError("the source form takes dense, unfolded weights; this case is folded or quantized")
        tensors = {
            "branch": b,
            "residual": r,
            "ffn_norm": w.ffn_norm,
            "eps": np.array([w.eps], np.float32),
            **{k: getattr(w, k).launch_parts()[0] for k in ("wo", "gate", "up", "down")},
        }
        inputs = source_inputs(self.launch, tensors)
        try:
            if self.run_on == "emulator":
                return run_metal_emulated(self.launch, inputs, w.shape, order=self.order)
            return run_on_device(self.launch, self.language, inputs, w.shape)
        except UncoveredOutput as e:
            raise SubjectError(str(e)) from None

    def calls(self, sc: StoredCase, w: TailWeights) -> list[tuple[Callable[[], np.ndarray], tuple[int, ...]]]:
        return [
            (lambda i=i: self.run_one(w, sc.branch[i], sc.residual[i]), (sc.shape[0],))
            for i in range(sc.branch.shape[0])
        ]
