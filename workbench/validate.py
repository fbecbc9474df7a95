"""Checks at a public call's boundary, with one message form for every module.

Every public function and constructor of the workbench answers bad input with a
``ValueError`` whose message names the parameter, what was given and what is allowed:
``"eps: must be a finite number > 0, got -5"``. The helpers below are that sentence
written once. They accept what a user would naturally pass (numpy scalars where a
number is asked, Python lists where an array is asked) and refuse what is almost always
a mistake (``True`` as a number, a string of digits as a count), so nothing is silently
converted into something the caller did not mean.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "describe",
    "integer",
    "number",
    "one_of",
    "flag",
    "seed",
    "sequence",
    "float_dtype",
    "float_array",
    "as_float32",
    "memory_cap_bytes",
    "within_memory",
    "token_ids",
]


def describe(value: Any, limit: int = 60) -> str:
    """A short, unambiguous rendering of ``value`` for an error message (type shown for non-scalars)."""
    if isinstance(value, (bool, int, float, str, type(None))) or isinstance(value, numbers.Number):
        text = repr(value)
    elif isinstance(value, type):  # a class (np.int32, list): its name, not its descriptors
        text = f"the type {value.__module__}.{value.__qualname__}"
    else:
        shape = getattr(value, "shape", None)
        dtype = getattr(value, "dtype", None)
        try:
            if shape is not None and dtype is not None:
                # A DataFrame's "dtype" may be a column of that name (a Series, many lines): a
                # dtype is said only when it is one short line.
                kind = str(dtype)
                tail = f" and dtype {kind}" if "\n" not in kind and len(kind) <= 40 else ""
                return f"a {type(value).__name__} of shape {tuple(shape)}{tail}"
            text = f"{type(value).__name__} {value!r}"
        except Exception:  # a repr that fails must not turn a clear error into an unclear one
            text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_bool(value: Any) -> bool:
    # numpy's bool_ is not a subclass of bool, but is just as surely not a number here.
    return isinstance(value, (bool, np.bool_))


def number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    finite: bool = True,
) -> float:
    """``value`` as a Python float, or a ValueError naming ``name``.

    Accepts ints, floats and numpy scalars; refuses bools and strings. ``minimum`` is
    inclusive unless ``exclusive_minimum``; NaN and infinities are refused unless
    ``finite`` is False.
    """
    bounds = []
    if minimum is not None:
        bounds.append(f"{'>' if exclusive_minimum else '>='} {minimum:g}")
    if maximum is not None:
        bounds.append(f"<= {maximum:g}")
    allowed = ("a finite number" if finite else "a number") + (" " + " and ".join(bounds) if bounds else "")
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: must be {allowed}, got {describe(value)}")
    x = float(value)
    if finite and not math.isfinite(x):
        raise ValueError(f"{name}: must be {allowed}, got {describe(value)}")
    too_low = minimum is not None and (x <= minimum if exclusive_minimum else x < minimum)
    too_high = maximum is not None and x > maximum
    if too_low or too_high:
        raise ValueError(f"{name}: must be {allowed}, got {describe(value)}")
    return x


def integer(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as a Python int, or a ValueError naming ``name``.

    Accepts ints and numpy integers; refuses bools, floats (even 3.0: a count that
    arrives as a float is usually a computed quantity gone wrong) and strings.
    """
    bounds = []
    if minimum is not None:
        bounds.append(f">= {minimum}")
    if maximum is not None:
        bounds.append(f"<= {maximum}")
    allowed = "an integer" + (" " + " and ".join(bounds) if bounds else "")
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: must be {allowed}, got {describe(value)}")
    n = int(value)
    if (minimum is not None and n < minimum) or (maximum is not None and n > maximum):
        raise ValueError(f"{name}: must be {allowed}, got {describe(value)}")
    return n


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool; only True and False (Python or numpy) are accepted."""
    if not _is_bool(value):
        raise ValueError(f"{name}: must be True or False, got {describe(value)}")
    return bool(value)


def one_of(name: str, value: Any, allowed: Iterable[Any]) -> Any:
    """``value`` itself if it is among ``allowed``, else a ValueError listing them."""
    options = tuple(allowed)
    try:
        ok = value in options
    except Exception:  # an unhashable or incomparable value is simply not allowed
        ok = False
    if not ok:
        listed = ", ".join(repr(o) for o in options)
        raise ValueError(f"{name}: must be one of {listed}, got {describe(value)}")
    return value


def seed(name: str, value: Any) -> int:
    """A random seed: an int >= 0 (numpy's generators refuse negatives with a message naming nothing)."""
    return integer(name, value, minimum=0)


def sequence(name: str, value: Any, *, what: str = "values", non_empty: bool = True) -> tuple:
    """``value`` (a list, tuple, range or other iterable, but not a string or a mapping) as a tuple."""
    if isinstance(value, (str, bytes)) or value is None or isinstance(value, dict) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name}: must be a sequence of {what} (e.g. a list or tuple), got {describe(value)}")
    out = tuple(value)
    if non_empty and not out:
        raise ValueError(f"{name}: must hold at least one of {what}, got an empty {type(value).__name__}")
    return out


def float_dtype(name: str, value: Any) -> np.dtype:
    """``value`` as a numpy floating dtype (``np.float64``, ``"float32"``, ...), or a ValueError naming ``name``."""
    try:
        dt = np.dtype(value)
    except Exception:  # numpy raises TypeError for names it does not know
        dt = None
    if dt is None or not np.issubdtype(dt, np.floating):
        raise ValueError(f"{name}: must be a numpy float dtype (np.float64, np.float32, ...), got {describe(value)}")
    return dt


def float_array(name: str, value: Any, *, min_ndim: int = 0) -> np.ndarray:
    """``value`` as a numpy array of real floats (ints become float64; float dtypes are kept).

    Accepts numpy arrays, Python lists and numpy scalars, and MLX arrays of any float dtype
    (bfloat16, which numpy has no type for, is read as float32, exactly). Refuses strings,
    objects, complex numbers and bools with a ValueError naming ``name``.
    """
    if type(value).__module__.startswith("mlx"):
        import mlx.core as mx  # only here: this module is imported by everything, MLX by most

        if not isinstance(value, mx.array) or not (
            mx.issubdtype(value.dtype, mx.floating) or mx.issubdtype(value.dtype, mx.integer)
        ):
            raise ValueError(f"{name}: must be an array of real numbers, got {describe(value)}")
        value = np.asarray(value.astype(mx.float32) if value.dtype == mx.bfloat16 else value)
    try:
        arr = np.asarray(value)
    except Exception:  # ragged lists and the like
        raise ValueError(f"{name}: must be an array of real numbers, got {describe(value)}") from None
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{name}: must be an array of real numbers, got {describe(value)}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name}: must have at least {min_ndim} axis(es), got {describe(value)}")
    return arr if np.issubdtype(arr.dtype, np.floating) else arr.astype(np.float64)


def as_float32(name: str, value: Any, *, copy: bool = True) -> np.ndarray:
    """``value`` (what :func:`float_array` reads) as float32, refusing finite values float32 cannot hold.

    numpy casts a float64 beyond float32's range (|x| > 3.4e38) to inf with only a
    warning, and an inf stored in a weight is a wrong result that nothing flags later
    (an inf the caller passed is theirs, and stays, as a NaN does). The check costs a
    byte an element and runs only for inputs wider than float32. ``copy=False`` returns a
    float32 ``value`` itself (a caller that copies anyway need not hold two).
    """
    arr = float_array(name, value)
    if arr.dtype.itemsize <= 4:
        return arr.astype(np.float32, copy=copy)
    with np.errstate(over="ignore"):
        out = arr.astype(np.float32)
    overflow = np.isinf(out)
    if overflow.any():
        overflow &= np.isfinite(arr)
        if overflow.any():
            where = tuple(int(i) for i in np.argwhere(overflow)[0])
            raise ValueError(
                f"{name}: must fit float32 (|x| <= {float(np.finfo(np.float32).max):.4g}), it is stored in float32; "
                f"got {float(arr[where])!r} at index {where} ({int(overflow.sum())} such values in all)"
            )
    return out


def memory_cap_bytes() -> int:
    """The most bytes one call may allocate before it is refused: half this machine's memory.

    Half, because the caller's own arrays and the interpreter share the machine; a
    request past it is almost always a typo (10**9 layers, Bonsai's FFN as a batch of
    256), and refusing it up front beats a MemoryError or the machine swapping.
    """
    import os

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on every platform
        total = 16 * 2**30
    return int(total) // 2


def within_memory(name: str, nbytes: int, what: str) -> int:
    """``nbytes`` unchanged, or a ValueError naming ``name`` when it exceeds :func:`memory_cap_bytes`."""
    cap = memory_cap_bytes()
    if nbytes > cap:
        raise ValueError(
            f"{name}: {what} would need {nbytes / 2**30:.3g} GiB, more than the {cap / 2**30:.3g} GiB "
            f"allowed (half this machine's memory)"
        )
    return nbytes


def token_ids(name: str, value: Any, vocab: int) -> np.ndarray:
    """``value`` (a sequence of token ids) as an int32 numpy array, each in ``0..vocab-1``.

    An id outside the vocabulary would be read out of bounds by an embedding (garbage
    that differs from run to run), a negative one would wrap and a float one be
    truncated: all are refused, naming ``name`` and the first bad id.
    """
    ids = sequence(name, value, what="token ids")
    for i, t in enumerate(ids):
        if _is_bool(t) or not isinstance(t, numbers.Integral) or not 0 <= int(t) < vocab:
            raise ValueError(f"{name}: must hold token ids, integers in 0..{vocab - 1}, got {describe(t)} at {i}")
    return np.asarray([int(t) for t in ids], dtype=np.int32)
