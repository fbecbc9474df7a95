"""Comparing a result with its reference: the per-element criterion and the usual metrics.

One place for every way the workbench says how far a result is from its reference, so a
figure means the same thing wherever it is printed:

* the criterion of frink-models' fused-attention-tail test, ``|x - y| <= tol * max(|y|, 1)``
  per element (:func:`scaled_error`), whose largest value over an output is its
  ``worst`` scaled error and ``margin = tol / worst`` (> 1 passes);
* :func:`compare`: one comparison, every metric, printed as one line (:class:`Comparison`);
* the same metrics per case over a batch (the last axis is the output vector, leading
  axes are cases), for sweeps: :func:`worst_scaled_error`, :func:`max_abs_error`,
  :func:`max_rel_error`, :func:`nmse`, :func:`torch_ratio`, :func:`ulp_distance`.
  :func:`compare` computes its figures with these same functions.

``y`` (``expected``) is always the reference: the float64 truth or the float32 host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench import validate
from workbench.fold.weights import DENSE_DTYPES
from workbench.tail.frink_case import SEED_TOL

#: ``torch.testing.assert_close`` defaults (rtol, atol) per dtype (PyTorch's
#: ``torch.testing.assert_close`` documentation);
#: the tail's output is float32, so ``torch_ratio`` uses the float32 pair.
TORCH_DEFAULTS: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
}


def scaled_error(actual: Any, expected: Any) -> np.ndarray:
    """``|x - y| / max(|y|, 1)`` per element, float64: the criterion is ``<= tol``.

    Vectorised and batch-agnostic, for sweeps. NaN where either side is NaN; 0 where
    both are the same infinity; Inf where only one is infinite.
    """
    x, y = _both(actual, expected)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.abs(x - y) / np.maximum(np.abs(y), 1.0)
    any_inf = np.isinf(x) | np.isinf(y)
    e = np.where(any_inf, np.where(x == y, 0.0, np.inf), e)
    return np.where(np.isnan(x) | np.isnan(y), np.nan, e)


@dataclass(frozen=True)
class Comparison:
    """One comparison: the criterion and the usual metrics; prints as one line.

    ``worst`` is the largest ``|x - y| / max(|y|, 1)`` (pass iff ``worst <= tol`` and no
    NaN); ``margin = tol / worst`` (> 1 passes; "64x under the tolerance"); ``where`` its
    index. ``max_abs`` / ``max_rel`` (``|x - y| / |y|``, over ``y != 0``) and ``nmse``
    (:func:`nmse`: ``sum (y - x)^2 / sum y^2``, y the reference, as llama.cpp's
    test-backend-ops) are over the elements finite on both sides. ``n_nan``: elements where either side is NaN;
    ``n_inf_mismatch``: where only one side is infinite or their signs differ.
    """

    passed: bool
    tol: float
    worst: float
    margin: float
    where: tuple[int, ...]
    max_abs: float
    max_rel: float
    nmse: float
    n: int
    n_nan: int
    n_inf_mismatch: int

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        margin = "inf" if math.isinf(self.margin) else f"{self.margin:.3g}x"
        extra = ""
        if self.n_nan or self.n_inf_mismatch:
            extra = f"; {self.n_nan} NaN, {self.n_inf_mismatch} Inf mismatches"
        return (
            f"{verdict} at tol {self.tol:g}: worst {self.worst:.3g} (margin {margin}) at {self.where}; "
            f"max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}, NMSE {self.nmse:.3g} over {self.n}{extra}"
        )


def compare(actual: Any, expected: Any, *, tol: float = SEED_TOL) -> Comparison:
    """The criterion ``|x - y| <= tol * max(|y|, 1)`` per element, and the metrics.

    ``expected`` is the reference (the host or the truth). Any NaN (either side) fails,
    as in llama.cpp; infinities must match (same position, same sign). ``max_abs``,
    ``max_rel`` and ``nmse`` are the per-case functions of this module over the elements
    finite on both sides.
    """
    tol = validate.number("tol", tol, minimum=0, exclusive_minimum=True)
    x, y = _both(actual, expected)
    e = scaled_error(x, y)
    if e.size == 0:
        raise ValueError(f"actual/expected: must not be empty, got shape {x.shape}")
    nan = np.isnan(e)
    n_nan = int(nan.sum())
    n_inf = int(np.isinf(e).sum())
    if nan.all():
        worst, where = math.nan, tuple(int(i) for i in np.unravel_index(0, e.shape))
    else:
        masked = np.where(nan, -1.0, e)
        i = int(np.argmax(masked))
        worst, where = float(masked.flat[i]), tuple(int(j) for j in np.unravel_index(i, e.shape))
    finite = np.isfinite(x) & np.isfinite(y)
    xf, yf = x[finite], y[finite]
    if xf.size:
        max_abs, max_rel, nm = (float(f(xf, yf)) for f in (max_abs_error, max_rel_error, nmse))
    else:
        max_abs = max_rel = nm = math.nan
    passed = n_nan == 0 and n_inf == 0 and worst <= tol
    margin = math.inf if worst == 0 else (tol / worst if math.isfinite(worst) else 0.0)
    return Comparison(passed, float(tol), worst, margin, where, max_abs, max_rel, nm, int(e.size), n_nan, n_inf)


# -- per case: the last axis is the output vector, leading axes are cases --------------


def _both(actual: Any, expected: Any) -> tuple[np.ndarray, np.ndarray]:
    """Both sides as float64 numpy (lists, numpy, MLX of any float dtype), of one shape; else a ValueError."""
    x = validate.float_array("actual", actual).astype(np.float64)
    y = validate.float_array("expected", expected).astype(np.float64)
    if x.shape != y.shape:
        raise ValueError(f"actual/expected: must have the same shape, got {x.shape} and {y.shape}")
    return x, y


def _pair(actual: Any, expected: Any) -> tuple[np.ndarray, np.ndarray]:
    x, y = _both(actual, expected)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"actual/expected: need a non-empty last axis (the output vector), got shape {x.shape}")
    return x, y


def worst_scaled_error(actual: Any, expected: Any) -> np.ndarray:
    """The criterion per case: ``max_i |x_i - y_i| / max(|y_i|, 1)`` over the last axis.

    A case passes frink-models' test when this is ``<= 2e-4``; :attr:`Comparison.worst` is
    the same figure for one output (where NaN elements are reported apart); here NaN
    anywhere gives NaN.
    """
    x, y = _pair(actual, expected)
    e = scaled_error(x, y)
    return e.max(axis=-1)  # np.max propagates NaN, which is what a failing case should show


def max_abs_error(actual: Any, expected: Any) -> np.ndarray:
    """``max_i |x_i - y_i|`` per case (MLX's test_fast criterion)."""
    x, y = _pair(actual, expected)
    return np.abs(x - y).max(axis=-1)


def max_rel_error(actual: Any, expected: Any) -> np.ndarray:
    """``max_i |x_i - y_i| / |y_i|`` per case, over the elements with ``y_i != 0`` (NaN if none)."""
    x, y = _pair(actual, expected)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(y != 0, np.abs(x - y) / np.abs(y), -np.inf)
    m = r.max(axis=-1)
    return np.where(np.isneginf(m), np.nan, m)


def nmse(actual: Any, expected: Any) -> np.ndarray:
    """``sum (x - y)^2 / sum y^2`` per case, ``y`` the reference (llama.cpp's test-backend-ops)."""
    x, y = _pair(actual, expected)
    num = np.sum((x - y) ** 2, axis=-1)
    den = np.sum(y * y, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num == 0, 0.0, np.inf))


def torch_ratio(actual: Any, expected: Any, *, dtype: str = "float32") -> np.ndarray:
    """``max_i |x_i - y_i| / (atol + rtol |y_i|)`` per case with torch's defaults for ``dtype``.

    ``torch.testing.assert_close(x, y)`` passes exactly when this is ``<= 1``.
    """
    validate.one_of("dtype", dtype, sorted(TORCH_DEFAULTS))
    rtol, atol = TORCH_DEFAULTS[dtype]
    x, y = _pair(actual, expected)
    return (np.abs(x - y) / (atol + rtol * np.abs(y))).max(axis=-1)


def _bf16_bits(x32: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even), as int32 for arithmetic."""
    b = x32.view(np.uint32).astype(np.uint64)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    nan = np.isnan(x32)
    return np.where(nan, 0x7FC0, r).astype(np.int64)


def _ordered(bits: np.ndarray, width: int) -> np.ndarray:
    """Sign-magnitude bit patterns -> integers in the order of the values they encode.

    +0 and -0 both map to 0, and adjacent floats to adjacent integers, so the difference of
    two mapped values is their distance in units in the last place.
    """
    sign = np.int64(1) << (width - 1)
    mag = bits & (sign - 1)
    return np.where(bits & sign, -mag, mag)


def ulp_distance(actual: Any, expected: Any, *, dtype: str = "float32") -> np.ndarray:
    """Elementwise distance in units in the last place of ``dtype`` (float64 result, exact integers).

    Both sides are rounded to ``dtype`` first (``expected`` is usually the float64 truth), so
    0 means ``actual`` IS the correctly rounded truth, 1 its neighbour, and so on; across zero
    the count runs through the subnormals. NaN where either side is NaN. bfloat16 rounds via
    float32 (a double rounding that can differ from a direct one only on exact ties).
    """
    validate.one_of("dtype", dtype, tuple(DENSE_DTYPES))
    x, y = _both(actual, expected)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "float32":
            bx = x.astype(np.float32).view(np.uint32).astype(np.int64)
            by = y.astype(np.float32).view(np.uint32).astype(np.int64)
            width = 32
        elif dtype == "float16":
            bx = x.astype(np.float16).view(np.uint16).astype(np.int64)
            by = y.astype(np.float16).view(np.uint16).astype(np.int64)
            width = 16
        else:
            bx = _bf16_bits(np.ascontiguousarray(x.astype(np.float32)))
            by = _bf16_bits(np.ascontiguousarray(y.astype(np.float32)))
            width = 16
    d = np.abs(_ordered(bx, width) - _ordered(by, width)).astype(np.float64)
    return np.where(np.isnan(x) | np.isnan(y), np.nan, d)
