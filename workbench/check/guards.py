"""One call of a user's callable, guarded against the ways it could fool the check.

The callable is handed fresh copies of the case's arrays, made at the call (nothing it keeps
points into the check's own buffers); after the call the copies are compared bit for bit with
the case as the check holds it (an input changed in place is refused, naming the array), and
the output is refused when it shares memory with an input or with a buffer the check holds
(an output the callable may overwrite later is no result). The output is copied at once.
:func:`guarded_call` runs in the check's process or in a worker process
(:mod:`workbench.check.isolation`), the same way in both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from workbench.check.stored import (
    MATRIX_PARTS,
    StoredCase,
    StoredMatrix,
    as_numpy,
    convert,
    map_arrays,
    with_activations,
)
from workbench.check.subjects import SubjectError, checked_output


def case_arrays(sc: StoredCase) -> dict[str, Any]:
    """Every array of ``sc`` by name (``branch``, ``residual``, ``ffn_norm``, ``wo.values``, ...)."""
    out: dict[str, Any] = {"branch": sc.branch, "residual": sc.residual, "ffn_norm": sc.ffn_norm}
    for m in ("wo", "gate", "up", "down"):
        mat: StoredMatrix = getattr(sc, m)
        for part in MATRIX_PARTS:
            a = getattr(mat, part)
            if a is not None:
                out[f"{m}.{part.lstrip('_')}"] = a
    return out


def fresh_copy(sc: StoredCase, pool: CopyPool | None = None) -> StoredCase:
    """``sc`` with every array a new numpy copy (the fold, read-only, is shared); ``pool``: the
    large ones copied into buffers it keeps (:class:`CopyPool`)."""
    return map_arrays(sc, np.array if pool is None else pool.copy)


class CopyPool:
    """Buffers a call's fresh copies of the weights are made in, given back after the call.

    A new copy of a shipped shape's weights (1.2 GB at Bonsai-27B's) is memory touched for the
    first time, which on this machine's VM costs about 0.39 GB/s against 4-5 GB/s re-touched:
    the copies were most of a check's time. Copied into a buffer of an earlier call, they are
    still new copies of the case (nothing the previous call left in them survives the copy),
    and a callable that keeps an input between calls finds it overwritten by the next case,
    so its stale results fail the check rather than pass it. A buffer is taken out of the
    pool for the call and given back only after it returns: a call still running past its
    time limit keeps its own. Arrays under :data:`POOLED_BYTES` are fresh allocations, as
    before; at most :data:`KEPT` buffers of one shape and dtype are kept."""

    POOLED_BYTES = 1 << 20
    KEPT = 2

    def __init__(self) -> None:
        self.free: dict[tuple, list[np.ndarray]] = {}

    def copy(self, a: Any) -> np.ndarray:
        a = np.asarray(a)
        if a.nbytes < self.POOLED_BYTES:
            return np.array(a)
        stack = self.free.get((a.shape, a.dtype.str))
        try:
            buf = stack.pop() if stack else np.empty(a.shape, a.dtype)
        except IndexError:  # emptied by another thread between the test and the pop
            buf = np.empty(a.shape, a.dtype)
        np.copyto(buf, a)
        return buf

    def give_back(self, sc: StoredCase) -> None:
        for a in case_arrays(sc).values():
            if isinstance(a, np.ndarray) and a.nbytes >= self.POOLED_BYTES and a.flags.owndata:
                stack = self.free.setdefault((a.shape, a.dtype.str), [])
                if len(stack) < self.KEPT:
                    stack.append(a)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` hold the same bytes, compared a slice at a time (``tobytes`` made
    two whole copies of every weight a call)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    x = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    y = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    step = 1 << 22
    return all(np.array_equal(x[k : k + step], y[k : k + step]) for k in range(0, x.size, step))


def changed_inputs(pristine: StoredCase, handed: StoredCase) -> list[str]:
    """The names of the arrays whose bits differ between the case as held and as handed."""
    want, got = case_arrays(pristine), case_arrays(handed)
    out = []
    for name, a in want.items():
        b = as_numpy(got.get(name))
        a = np.asarray(a)
        if b is None or b.shape != a.shape or not same_bits(a, np.asarray(b, a.dtype)):
            out.append(name)
    return out


def shared_with(out: np.ndarray, arrays: dict[str, Any]) -> str | None:
    """The name of the first numpy array in ``arrays`` that ``out`` shares memory with, or None."""
    for name, a in arrays.items():
        if isinstance(a, np.ndarray) and np.shares_memory(out, a):
            return name
    return None


def guarded_call(
    fn: Callable[[Any], Any],
    pristine: StoredCase,
    arrays: str,
    want: tuple[int, ...],
    held: Sequence[np.ndarray] = (),
    pool: CopyPool | None = None,
) -> np.ndarray:
    """``fn`` on fresh copies of ``pristine`` (as ``arrays``: numpy, mlx or torch): its output as
    float32 [want], a copy; :class:`SubjectError` when it changed an input, returned memory it
    was handed or the check holds (``held``), or returned no usable array. ``pool``: where the
    large copies are made (:class:`CopyPool`), given back once the call has returned."""
    copy = fresh_copy(pristine, pool)
    try:
        return _judged_call(fn, pristine, copy, arrays, want, held)
    finally:
        if pool is not None:
            pool.give_back(copy)


def _judged_call(
    fn: Callable[[Any], Any],
    pristine: StoredCase,
    copy: StoredCase,
    arrays: str,
    want: tuple[int, ...],
    held: Sequence[np.ndarray],
) -> np.ndarray:
    handed = convert(copy, arrays)
    out = _judged_output(fn(handed), copy, want, held)
    changed = changed_inputs(pristine, handed)
    if changed:
        raise SubjectError(_changed(changed))
    return out


def _changed(names: list[str]) -> str:
    return f"changed its input(s) in place: {', '.join(names)} (an implementation must not)"


def _judged_output(value: Any, copy: StoredCase, want: tuple[int, ...], held: Sequence[np.ndarray]) -> np.ndarray:
    """A call's output as float32 [want], a copy; :class:`SubjectError` where it aliases an
    array the call was handed (``copy``) or one the check holds, or is no usable array."""
    raw = as_numpy(value)
    if isinstance(raw, np.ndarray):
        name = shared_with(raw, case_arrays(copy))
        if name is not None:
            raise SubjectError(f"returned an array that shares memory with its input {name!r} (an alias, not a result)")
        if shared_with(raw, {str(i): h for i, h in enumerate(held)}) is not None:
            raise SubjectError("returned an array that shares memory with a buffer the check holds")
    return np.array(checked_output(value, want), dtype=np.float32, copy=True)


def guarded_calls(
    fn: Callable[[Any], Any],
    pristines: Sequence[StoredCase],
    arrays: str,
    wants: Sequence[tuple[int, ...]],
    pool: CopyPool | None = None,
) -> list[Any]:
    """``fn`` on calls of one case that differ only in their activations (a callable's call a
    scale): each call's output (as :func:`guarded_call` gives it) or the exception it ended with.

    The weights are copied (and converted to ``arrays``) once for all the calls, each call
    handed fresh copies of its activations. At a shipped shape a copy and a compare of the
    weights cost five times the call itself (a numpy tail at (2048, 2048, 8192): 25 + 35 ms
    against 12 ms), and copying them for each call meant once a scale. The activations are compared after each
    call, every input after the last: a weight changed in place fails every call of the case
    (each call after the change was handed weights the case does not hold, and which call
    changed them is not told apart)."""
    first = pristines[0]
    copy = fresh_copy(first, pool)
    try:
        shared = convert(copy, arrays)
        got: list[Any] = []
        handed = shared
        for sc, want in zip(pristines, wants, strict=True):
            mine = replace(copy, branch=np.array(sc.branch), residual=np.array(sc.residual))
            handed = with_activations(shared, mine.branch, mine.residual, arrays)
            try:
                out = _judged_output(fn(handed), mine, want, ())
                moved = [
                    n for n in ("branch", "residual") if not _same_array(getattr(sc, n), as_numpy(getattr(handed, n)))
                ]
                if moved:
                    raise SubjectError(_changed(moved))
                got.append(out)
            except Exception as e:  # the call's own failure, as guarded_call would raise it
                got.append(e)
        changed = [n for n in changed_inputs(first, handed) if n not in ("branch", "residual")]
        if changed:
            bad = SubjectError(_changed(changed))
            got = [bad] * len(got)
        return got
    finally:
        if pool is not None:
            pool.give_back(copy)


def _same_array(a: np.ndarray, b: Any) -> bool:
    return b is not None and np.shape(b) == a.shape and same_bits(a, np.asarray(b, a.dtype))
