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
from typing import Any

import numpy as np

from workbench.check.stored import MATRIX_PARTS, StoredCase, StoredMatrix, as_numpy, convert, map_arrays
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


def fresh_copy(sc: StoredCase) -> StoredCase:
    """``sc`` with every array a new numpy copy (the fold, read-only, is shared)."""
    return map_arrays(sc, np.array)


def changed_inputs(pristine: StoredCase, handed: StoredCase) -> list[str]:
    """The names of the arrays whose bits differ between the case as held and as handed."""
    want, got = case_arrays(pristine), case_arrays(handed)
    out = []
    for name, a in want.items():
        b = as_numpy(got.get(name))
        a = np.asarray(a)
        if b is None or b.shape != a.shape or a.tobytes() != np.asarray(b, a.dtype).tobytes():
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
) -> np.ndarray:
    """``fn`` on fresh copies of ``pristine`` (as ``arrays``: numpy, mlx or torch): its output as
    float32 [want], a copy; :class:`SubjectError` when it changed an input, returned memory it
    was handed or the check holds (``held``), or returned no usable array."""
    copy = fresh_copy(pristine)
    handed = convert(copy, arrays)
    value = fn(handed)
    raw = as_numpy(value)
    if isinstance(raw, np.ndarray):
        name = shared_with(raw, case_arrays(copy))
        if name is not None:
            raise SubjectError(f"returned an array that shares memory with its input {name!r} (an alias, not a result)")
        if shared_with(raw, {str(i): h for i, h in enumerate(held)}) is not None:
            raise SubjectError("returned an array that shares memory with a buffer the check holds")
    out = np.array(checked_output(value, want), dtype=np.float32, copy=True)
    changed = changed_inputs(pristine, handed)
    if changed:
        raise SubjectError(f"changed its input(s) in place: {', '.join(changed)} (an implementation must not)")
    return out
