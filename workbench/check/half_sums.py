"""Matrix-vector products summed in float16, one product at a time: the ``float16_accumulation``
fault model's arithmetic (a kernel that keeps its running sums in half precision).

Each output ``out[r, j]`` is the products ``fl16(fl16(x[r, k]) * fl16(w[j, k]))`` added in
order of ``k``, every partial sum rounded to float16, each operation computed in float32 and
then rounded (numpy's float16 arithmetic: exact products of two halves, a float32 sum rounded
once more). The sum is sequential by definition, so numpy runs it as float16 arrays a slice
of rows at a time, at about 30 M products a second on this project's machine: at
(2048, 2048, 8192) five seconds a case at three input scales, most of a check with its faults
on. The same arithmetic in C (:data:`C_SOURCE`, compiled by clang, the emulator's compiler; on
x86-64 with F16C, sixteen rows and four vectors at once in AVX lanes, so eight sums' latencies
overlap and each weight is read once for every vector; elsewhere a plain loop) runs about forty
times faster (0.034 s against 1.46 for an 8192 x 2048 matrix at three vectors) and gives
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
/* a product of two halves (exact in float), rounded to half; __fp16 is no return type in C */
#define product(x, w) ((__fp16)((x) * (w)))
static void one_row(const float *w, const float *xs, float *out, int nv, long rows, long cols, long j) {
    for (int v = 0; v < nv; v++) {
        const float *xr = xs + v * cols;
        __fp16 s = product((float)(__fp16)xr[0], (float)(__fp16)w[j * cols]);
        for (long k = 1; k < cols; k++)
            s = (__fp16)((float)s + (float)product((float)(__fp16)xr[k], (float)(__fp16)w[j * cols + k]));
        out[v * rows + j] = (float)s;
    }
}
#if defined(__F16C__) && defined(__AVX__)
/* x86-64 with F16C: sixteen rows of w (two vectors of eight lanes) and up to four vectors of x
   at once: eight independent sums in flight, each element of w read once for every vector */
#include <immintrin.h>
#define VECTORS 4
/* every lane rounded to half (to nearest, ties to even) and back: exact in float */
static inline __m256 h(__m256 v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }
static inline __m256 column(const float *w, long cols, long k) {  /* w[l * cols + k], l = 0..7 */
    return _mm256_set_ps(w[7 * cols + k], w[6 * cols + k], w[5 * cols + k], w[4 * cols + k],
                         w[3 * cols + k], w[2 * cols + k], w[1 * cols + k], w[k]);
}
void half_sums(const float *w, const float *x, float *out, long n, long rows, long cols) {
    for (long r0 = 0; r0 < n; r0 += VECTORS) {
        int nv = n - r0 < VECTORS ? (int)(n - r0) : VECTORS;
        const float *xs = x + r0 * cols;
        float *o = out + r0 * rows;
        long j = 0;
        for (; j + 16 <= rows; j += 16) {
            const float *w0 = w + j * cols, *w1 = w + (j + 8) * cols;
            __m256 a[VECTORS], b[VECTORS];
            __m256 c0 = h(column(w0, cols, 0)), c1 = h(column(w1, cols, 0));
            for (int v = 0; v < nv; v++) {
                __m256 xv = _mm256_set1_ps((float)(__fp16)xs[v * cols]);
                a[v] = h(_mm256_mul_ps(xv, c0)); b[v] = h(_mm256_mul_ps(xv, c1));
            }
            for (long k = 1; k < cols; k++) {
                c0 = h(column(w0, cols, k)); c1 = h(column(w1, cols, k));
                for (int v = 0; v < nv; v++) {
                    __m256 xv = _mm256_set1_ps((float)(__fp16)xs[v * cols + k]);
                    a[v] = h(_mm256_add_ps(a[v], h(_mm256_mul_ps(xv, c0))));
                    b[v] = h(_mm256_add_ps(b[v], h(_mm256_mul_ps(xv, c1))));
                }
            }
            for (int v = 0; v < nv; v++) {
                _mm256_storeu_ps(o + v * rows + j, a[v]);
                _mm256_storeu_ps(o + v * rows + j + 8, b[v]);
            }
        }
        for (; j < rows; j++) one_row(w, xs, o, nv, rows, cols, j);
    }
}
#else
void half_sums(const float *w, const float *x, float *out, long n, long rows, long cols) {
    for (long r0 = 0; r0 < n; r0 += 4) {
        int nv = n - r0 < 4 ? (int)(n - r0) : 4;
        for (long j = 0; j < rows; j++) one_row(w, x + r0 * cols, out + r0 * rows, nv, rows, cols, j);
    }
}
#endif
"""


@lru_cache(maxsize=2)
def compiled(host: bool = True) -> ctypes.CDLL | None:
    """The C form loaded, or None where clang is not here or it does not build (the numpy form
    runs); ``host=False``: built without the host CPU's own instructions (the plain loop)."""
    try:
        lib = ctypes.CDLL(str(c_library(C_SOURCE, "half_sums", host=host)))
    except (BackendUnavailable, MetalCompileError, OSError, ValueError):
        return None
    lib.half_sums.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 3
    lib.half_sums.restype = None
    return lib


def half_sums(w: np.ndarray, x: np.ndarray, *, use_c: bool = True, host: bool = True) -> np.ndarray:
    """``w @ x`` summed in float16 (the module doc): ``w`` [rows, cols], ``x`` [n, cols] float32;
    float32 [n, rows] holding float16 values. ``use_c=False``: the numpy form; ``host=False``:
    the C form built without the host CPU's own instructions."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    lib = compiled(host) if use_c else None
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
