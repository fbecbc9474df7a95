"""Matrix-vector products summed in float16, one product at a time: the ``float16_accumulation``
fault model's arithmetic (a kernel that keeps its running sums in half precision).

Each output ``out[r, j]`` is the products ``fl16(fl16(x[r, k]) * fl16(w[j, k]))`` added in
order of ``k``, every partial sum rounded to float16, each operation computed in float32 and
then rounded (numpy's float16 arithmetic: exact products of two halves, a float32 sum rounded
once more). The sum is sequential by definition, so numpy runs it as float16 arrays a slice
of rows at a time, at about 30 M products a second on this project's machine: at
(2048, 2048, 8192) five seconds a case at three input scales, most of a check with its faults
on. The same arithmetic in C (:data:`C_SOURCE`, compiled by clang, the emulator's compiler;
eight rows at once so the sums' latencies overlap) runs about twenty times faster and gives
the same bits, NaN and infinity included (``tests/test_check_half_sums.py`` holds the two to
each other). Where clang is not here, or the C does not build, the numpy form runs: the same
results, slower.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

from workbench.backends import BackendUnavailable
from workbench.kernels.metal_toolchain import c_library
from workbench.kernels.metal_translation import MetalCompileError

#: Bytes of float16 products the numpy form makes at once.
SLICE_BYTES = 1 << 25

#: The C form: ``out[r * rows + j]`` for ``n`` vectors ``x`` [n, cols] and ``w`` [rows, cols].
C_SOURCE = r"""
#define LANES 8
/* a product of two halves (exact in float), rounded to half; __fp16 is no return type in C */
#define product(x, w) ((__fp16)((x) * (float)(__fp16)(w)))
void half_sums(const float *w, const float *x, float *out, long n, long rows, long cols) {
    for (long r = 0; r < n; r++) {
        const float *xr = x + r * cols;
        long j = 0;
        for (; j + LANES <= rows; j += LANES) { /* eight rows' sums at once: their latencies overlap */
            __fp16 s[LANES];
            float x0 = (float)(__fp16)xr[0];
            for (int l = 0; l < LANES; l++) s[l] = product(x0, w[(j + l) * cols]);
            for (long k = 1; k < cols; k++) {
                float xk = (float)(__fp16)xr[k];
                for (int l = 0; l < LANES; l++)
                    s[l] = (__fp16)((float)s[l] + (float)product(xk, w[(j + l) * cols + k]));
            }
            for (int l = 0; l < LANES; l++) out[r * rows + j + l] = (float)s[l];
        }
        for (; j < rows; j++) {
            __fp16 s = product((float)(__fp16)xr[0], w[j * cols]);
            for (long k = 1; k < cols; k++)
                s = (__fp16)((float)s + (float)product((float)(__fp16)xr[k], w[j * cols + k]));
            out[r * rows + j] = (float)s;
        }
    }
}
"""


@lru_cache(maxsize=1)
def compiled() -> ctypes.CDLL | None:
    """The C form loaded, or None where clang is not here or it does not build (the numpy form runs)."""
    try:
        lib = ctypes.CDLL(str(c_library(C_SOURCE, "half_sums")))
    except (BackendUnavailable, MetalCompileError, OSError, ValueError):
        return None
    lib.half_sums.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 3
    lib.half_sums.restype = None
    return lib


def half_sums(w: np.ndarray, x: np.ndarray, *, use_c: bool = True) -> np.ndarray:
    """``w @ x`` summed in float16 (the module doc): ``w`` [rows, cols], ``x`` [n, cols] float32;
    float32 [n, rows] holding float16 values. ``use_c=False``: the numpy form."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    lib = compiled() if use_c else None
    if lib is None:
        return numpy_half_sums(w, x)
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    lib.half_sums(w.ctypes.data, x.ctypes.data, out.ctypes.data, x.shape[0], w.shape[0], w.shape[1])
    return out


def numpy_half_sums(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The numpy form of :func:`half_sums`: float16 arrays, a slice of rows at a time (each
    row's sum is its own, so the same bits as all rows at once)."""
    rows = w.shape[0]
    step = max(1, SLICE_BYTES // (2 * w.shape[1] * x.shape[0]))
    out = np.empty((x.shape[0], rows), dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # infinities and NaN are results here
        x16 = x[:, None, :].astype(np.float16)
        for r in range(0, rows, step):
            prods = x16 * w[r : r + step].astype(np.float16)
            out[:, r : r + step] = np.cumsum(prods, axis=-1, dtype=np.float16)[..., -1]
    return out
