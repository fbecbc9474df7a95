"""A recurrent step under test guarded as the tail's implementation is: handed fresh copies of its
inputs, verified unchanged after each call, an output aliasing an input refused, each token
called a second time and the bits compared, and run in a worker process of its own where it
can be (a crash costs its sequence, a hang is ended at the time limit, the truth is out of reach).

A step is called once a token of a sequence with that sequence's states fed back, so its second
run is a second call of the same token on fresh copies of the same inputs, made at once (a
whole second trajectory would hold every token's state). Different bits then mean the step is
nondeterministic, or keeps state between calls, or caches by the identity of its inputs (fresh
copies are new objects, and a freed array's id is reused): a :class:`SubjectError` that names
the tensor and the largest difference, and stops the sequence. Where the difference is at the
rounding level of float32 (at most :data:`ROUNDING` of ``max(|y|, 1)``, as a float atomic's order
moves a sum), the call is not failed: it is counted, and the report says so.

MLX arrays are values (nothing a Python step does changes one in place), so a step handed MLX
arrays is handed them as they are, neither copied nor compared; its returns are fed back
uncopied. numpy and PyTorch arrays are copied, and the copies compared after the call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np

from workbench.check.stored import as_numpy
from workbench.check.subjects import SubjectError, importable_path

#: The arrays of a token's inputs a step is handed (``StepInputs``' fields, the constants apart).
TOKEN_ARRAYS: tuple[str, ...] = ("mixed", "z", "b", "a", "conv_state", "state")

#: The returned tensors' names, in order.
RETURNED: tuple[str, ...] = ("out", "conv_state", "state")

#: The largest difference between two calls' bits (scaled by ``max(|y|, 1)``) taken as the rounding
#: of a legitimately unordered float sum (float atomics): a few float32 ulps.
ROUNDING = 4 * float(np.finfo(np.float32).eps)


def _numpy_view(a: Any) -> np.ndarray | None:
    """``a``'s memory as numpy where it has host memory numpy can see (numpy, a CPU tensor)."""
    if isinstance(a, np.ndarray):
        return a
    if type(a).__module__.startswith("torch"):
        try:
            return a.detach().numpy()
        except Exception:  # a CUDA tensor, or not a tensor: no host memory to share
            return None
    return None


def _fresh(a: Any) -> Any:
    """A copy of a numpy or PyTorch array; an MLX array (a value) as it is."""
    if isinstance(a, np.ndarray):
        return np.array(a)
    if type(a).__module__.startswith("torch"):
        return a.clone()
    return a


def _bits(a: Any) -> np.ndarray | None:
    # a float32 MLX array read in place (it is a value: nothing writes it), not copied as as_numpy
    # does: at Bonsai-27B's geometry a copy of each call's state cost the check 0.3 ms a token
    v = np.asarray(a) if isinstance(a, mx.array) and a.dtype == mx.float32 else as_numpy(a)
    return None if v is None else np.ascontiguousarray(v, dtype=np.float32)


def _frozen(value: Any) -> Any:
    """The step's returns with every numpy or PyTorch array copied (a buffer the step may
    write again later is no result); MLX arrays as returned."""
    if not isinstance(value, (tuple, list)):
        return value
    return tuple(np.array(_numpy_view(v)) if _numpy_view(v) is not None else v for v in value)


class GuardedStep:
    """``inner`` (a step form: ``layer(shape, consts, eps) -> call``) guarded; ``rerun``: each
    token called twice, the bits compared. ``roundings`` counts the calls whose two runs
    differed at rounding level only."""

    def __init__(self, inner: Any, *, rerun: bool = True) -> None:
        self.inner, self.rerun = inner, bool(rerun)
        self.name, self.kind = inner.name, inner.kind
        self.roundings = 0

    def layer(self, shape: Any, consts: Mapping[str, Any], eps: float) -> Callable[[Any], Any]:
        pristine = {k: np.array(v) for k, v in consts.items()}
        handed = {k: np.array(v) for k, v in consts.items()}
        call = self.inner.layer(shape, handed, eps)

        def guarded(step: Any) -> Any:
            first = self._once(call, step, handed, pristine)
            if self.rerun:
                self._compare(first, self._once(call, step, handed, pristine))
            return first

        return guarded

    def _once(self, call: Callable[[Any], Any], step: Any, handed: dict, pristine: dict) -> Any:
        given = {k: getattr(step, k) for k in TOKEN_ARRAYS}
        copies = {k: _fresh(v) for k, v in given.items()}
        value = call(replace(step, **copies))
        if isinstance(value, (tuple, list)):
            mine = {**copies, **handed}
            for name, v in zip(RETURNED, value):
                got = _numpy_view(v)
                if got is None:
                    continue
                for k, a in mine.items():
                    h = _numpy_view(a)
                    if h is not None and np.shares_memory(got, h):
                        raise SubjectError(
                            f"tensor {name}: returned an array that shares memory with its input {k!r} "
                            "(an alias, not a result: update a copy)"
                        )
        changed = [k for k, a in copies.items() if _changed(given[k], a)]
        changed += [k for k, a in handed.items() if _changed(pristine[k], a)]
        if changed:
            raise SubjectError(f"changed its input(s) in place: {', '.join(changed)} (a step must not)")
        return _frozen(value)

    def _compare(self, first: Any, again: Any) -> None:
        if not (isinstance(first, (tuple, list)) and isinstance(again, (tuple, list))):
            return  # a bad return is the shape check's to name
        worst, where = 0.0, ""
        for name, x, y in zip(RETURNED, first, again):
            a, b = _bits(x), _bits(y)
            if a is None or b is None or a.shape != b.shape:
                continue
            if np.array_equal(a.view(np.uint32), b.view(np.uint32)):
                continue
            with np.errstate(invalid="ignore", over="ignore"):
                d = np.abs(a.astype(np.float64) - b) / np.maximum(np.abs(a.astype(np.float64)), 1.0)
            m = float(np.max(np.where(np.isnan(d), np.inf, d)))
            if m >= worst:
                worst, where = m, name
        if not where:
            return
        if worst <= ROUNDING:
            self.roundings += 1
            return
        raise SubjectError(
            f"tensor {where}: a second call on fresh copies of the same inputs gave other bits (worst scaled "
            f"difference {worst:.3g}): nondeterministic, state kept between calls, or a cache keyed by input identity"
        )

    def worker_call(self, payload: tuple) -> Callable[[Any], tuple[Any, int]]:
        """In a worker process (:mod:`workbench.check.isolation`): the guarded call of the sequence
        ``payload`` (``(shape, consts, eps)``), answering each token with its returns and the
        calls that differed at rounding level (the count lives where the calls run)."""
        call = self.layer(*payload)

        def counted(step: Any) -> tuple[Any, int]:
            before = self.roundings
            value = call(step)
            return value, self.roundings - before

        return counted

    def checked(self) -> list[str]:
        """What was verified, in words, for the report."""
        out = [
            "each call handed fresh copies of its numpy / PyTorch inputs (MLX arrays are values), verified "
            "unchanged after it; a returned tensor sharing memory with an input refused"
        ]
        if self.rerun:
            out.append(
                "each token called a second time on fresh copies and the bits compared"
                + (
                    f" ({self.roundings} calls differed at rounding level only: nondeterministic, not failed)"
                    if self.roundings
                    else ""
                )
            )
        else:
            out.append("no second call (rerun=False)")
        return out


def _changed(want: Any, got: Any) -> bool:
    """Whether ``got`` (the copy handed) no longer holds ``want``'s bits (numpy and PyTorch only)."""
    g = _numpy_view(got)
    if g is None:
        return False
    w = np.asarray(as_numpy(want))
    if g.shape != w.shape or g.dtype != w.dtype:
        return True
    # the bits compared in place, as unsigned integers of the item's size (tobytes would copy both
    # sides each call; bytes would be 4x the elements): NaN and -0 compare by their bits
    bits = np.dtype(f"u{g.itemsize}") if g.itemsize in (1, 2, 4, 8) else np.dtype(np.uint8)
    return not np.array_equal(
        np.ascontiguousarray(g).reshape(-1).view(bits), np.ascontiguousarray(w).reshape(-1).view(bits)
    )


def step_path(subject: Any) -> str:
    """``module:qualname`` of a callable step's function where it is importable, else ``""``."""
    fn = getattr(subject, "fn", None)
    return (importable_path(fn) or "") if fn is not None and getattr(subject, "kind", "") == "callable" else ""
