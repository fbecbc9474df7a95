"""The scaled errors of a recurrent-step check's float32 trajectories against its float64 truth,
token by token: ``|x - y| / max(|y|, 1)``, worst element of each sequence (:class:`Errors`).

A token's state is the large tensor (Bonsai-27B's recurrent geometry: 786k elements a
trajectory), and comparing it costs about what the truth's step does, so :class:`Errors`
compares it on a thread of its own (:meth:`Errors.compare`) chunk by chunk as the truth's
chunks are made on the check's thread (:meth:`Errors.made_final`), and the reference's once
the reference's thread hands it over (:meth:`Errors.give`). The arithmetic is the same on
any thread and in any order of chunks: each row's error is the same operations on the same
values (``tests/test_check_gdn_overlap.py`` holds a run to a serial one, bit for bit).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from workbench.backends import BackendUnavailable
from workbench.check.gdn_faults import chunk_rows
from workbench.kernels.metal_toolchain import c_library
from workbench.kernels.metal_translation import MetalCompileError

#: The C form of a trajectory's worst error on rows of the truth (:class:`Errors`): per row and
#: trajectory, ``max |((x - hi) - lo) * inv|`` over its elements, each element split from the
#: float64 truth as numpy's form splits it (``hi = (float)y``, ``lo = (float)(y - hi)`` in
#: double, ``inv = 1 / max(|hi|, 1)`` with NaN kept, one float32 rounding an operation, no
#: contraction: ``c_library`` compiles with ``-ffp-contract=off``), a block of the row split
#: once for every trajectory. The maximum is taken over the absolute values' bits (for
#: non-negative floats their order as unsigned integers is their order as numbers, infinity
#: and NaN above all finite ones), so a row with a NaN or an infinity gives a non-finite
#: result exactly where numpy's does, and a finite one numpy's value. A row whose result is
#: zero is taken from numpy's form (the sign of a zero maximum there follows its reduction's
#: order, which only numpy knows).
C_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>
#define BLOCK 512
void state_worst(const double *y, const float *const *xs, long k, long r0, long r1, long cols,
                 float *worst, long wstride) {
    float hi[BLOCK], lo[BLOCK], inv[BLOCK];
    for (long r = r0; r < r1; r++) {
        const double *yr = y + r * cols;
        for (long j = 0; j < k; j++) worst[j * wstride + r] = 0.0f;
        for (long i0 = 0; i0 < cols; i0 += BLOCK) {
            long n = cols - i0 < BLOCK ? cols - i0 : BLOCK;
            for (long i = 0; i < n; i++) {
                double yv = yr[i0 + i];
                float h = (float)yv;
                float a = fabsf(h);
                float m = (a >= 1.0f || a != a) ? a : 1.0f;
                hi[i] = h;
                lo[i] = (float)(yv - (double)h);
                inv[i] = 1.0f / m;
            }
            for (long j = 0; j < k; j++) {
                const float *xr = xs[j] + r * cols + i0;
                uint32_t best;
                memcpy(&best, &worst[j * wstride + r], 4);
                for (long i = 0; i < n; i++) {
                    float d = ((xr[i] - hi[i]) - lo[i]) * inv[i];
                    uint32_t b;
                    memcpy(&b, &d, 4);
                    b &= 0x7fffffffu;
                    best = b > best ? b : best;
                }
                memcpy(&worst[j * wstride + r], &best, 4);
            }
        }
    }
}
"""


@lru_cache(maxsize=1)
def compiled() -> ctypes.CDLL | None:
    """The C form loaded, or None where clang is not here or it does not build (numpy's form runs)."""
    try:
        lib = ctypes.CDLL(str(c_library(C_SOURCE, "gdn_state_worst")))
    except (BackendUnavailable, MetalCompileError, OSError, ValueError):
        return None
    lib.state_worst.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_long] * 4 + [ctypes.c_void_p, ctypes.c_long]
    lib.state_worst.restype = None
    return lib


def inverse_scale(truth: np.ndarray) -> np.ndarray:
    """``1 / max(|y|, 1)`` of the truth, flattened a sequence (:func:`scaled_worst`'s ``inv``)."""
    inv = np.abs(truth.reshape(len(truth), -1))
    np.maximum(inv, 1.0, out=inv)
    return np.reciprocal(inv, out=inv)


def scaled_worst(x: np.ndarray, truth: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """Per sequence, ``max |x - y| / max(|y|, 1)`` (``inv`` from :func:`inverse_scale`) in
    float64; NaN anywhere gives NaN. :class:`Errors` computes the same in float32 and comes
    here where its result is not finite."""
    n = len(truth)
    d = np.subtract(x.reshape(n, -1), truth.reshape(n, -1), dtype=np.float64)
    np.abs(d, out=d)
    np.multiply(d, inv, out=d)
    return d.max(axis=1)


class Errors:
    """The scaled errors of float32 trajectories against one float64 truth tensor of a
    token, rows (a state's value heads, a sequence's output or conv state) at a time.

    Each truth row is split once into float32 ``hi = fl(y)`` and ``lo = fl(y - hi)``
    with ``inv = 1 / max(|hi|, 1)`` (``max(|hi|, 1) = fl(max(|y|, 1))``), shared by every
    trajectory, whose error is ``((x - hi) - lo) * inv`` in float32, a chunk of rows
    (:data:`~workbench.check.gdn_faults.CHUNK` elements) at a time: the truth and each
    trajectory are read once a token. ``x - hi`` is exact where x and hi are
    within a factor 2 (Sterbenz) and, where not, dwarfs lo, so the result is the float64
    metric of :func:`scaled_worst` within six float32 roundings: at most 4e-7 of itself
    (or 1e-45 absolute, below float32's normal range). A sequence whose result is not
    finite (a NaN or inf in x, an overflow) is computed again in float64 by
    :func:`scaled_worst`, so NaN and inf are exactly its.

    Where clang is here the passes are :data:`C_SOURCE`'s (one pass over the truth and each
    trajectory, the split made in the core's cache: about a third of numpy's time at
    Bonsai-27B's recurrent geometry), else numpy's, a chunk's split in buffers of their own;
    the two give the same bits (``tests/test_check_gdn_overlap.py``).

    :meth:`start` takes the token's truth and trajectories; then either, on one thread,
    :meth:`take` the truth's rows (or :meth:`take_all`), or, on two, :meth:`compare` on a
    thread of its own while the truth's thread says which rows are final (:meth:`made_final`);
    :meth:`finish` gives the errors."""

    def __init__(self, seqs: int, rows: int, row_size: int, *, c: bool = True):
        """``c``: use the C form where it builds (False: numpy's, as for the conv state, whose
        error is zero wherever a step shifts the window exactly, so every row would go to numpy's)."""
        self.seqs, self.rows, self.cols = seqs, rows, row_size
        self.lib = compiled() if c else None
        self.per = chunk_rows(rows, row_size)
        self.hi, self.lo, self.inv, self.d = (np.empty((self.per, row_size), np.float32) for _ in range(4))
        self.one = np.ones((self.per, row_size), np.float32)
        # the split of every row (compare's: a trajectory handed over later is compared on it
        # after the truth's pass), made on first use
        self.kept: tuple[np.ndarray, ...] = ()
        self.ready = threading.Condition()
        self.final, self.cancelled = 0, False
        self.xs: list[np.ndarray] = []
        self.made: list[np.ndarray | None] = []
        self.worst = np.empty((0, rows), np.float32)
        self.y = np.empty((rows, row_size))

    def start(self, y: np.ndarray, xs: Sequence[Any], later: int = 0) -> None:
        """The token's truth ``y`` (float64, ``rows x row_size`` elements, read only where
        it is final) and trajectories (float32 arrays of y's size, read in place, MLX's too).
        ``later``: how many more trajectories are handed over by :meth:`give` while
        :meth:`compare` runs (numbered before ``xs`` in :meth:`finish`'s list)."""
        self.y = y.reshape(self.rows, self.cols)
        self.xs = [np.asarray(x).reshape(self.rows, self.cols) for x in xs]
        self.made = [None] * later
        self.worst = np.empty((later + len(self.xs), self.rows), np.float32)
        with self.ready:
            self.final, self.cancelled = 0, False
        # the C form reads C-contiguous float64 truth and float32 trajectories (what the check's are)
        self.c = (
            self.lib is not None
            and self.y.dtype == np.float64
            and self.y.flags.c_contiguous
            and all(x.dtype == np.float32 and x.flags.c_contiguous for x in self.xs)
        )
        if later and not self.kept and not self.c:
            self.kept = tuple(np.empty((self.rows, self.cols), np.float32) for _ in range(3))

    def _split(self, r: slice, hi: np.ndarray, lo: np.ndarray, inv: np.ndarray) -> None:
        """The truth's rows ``r`` (at most a chunk) split into ``hi``, ``lo`` and ``inv``."""
        y, one = self.y[r], self.one[: len(hi)]
        np.copyto(hi, y, casting="same_kind")
        np.subtract(y, hi, out=lo, casting="same_kind")
        np.abs(hi, out=inv)
        np.maximum(inv, one, out=inv)  # (an array of ones: a scalar here takes numpy's slow loop)
        np.divide(one, inv, out=inv)

    def _rows(self, x: np.ndarray, j: int, r: slice, hi: Any, lo: Any, inv: Any) -> None:
        """Trajectory ``j``'s (``x``) worst error on rows ``r`` (at most a chunk), the split given."""
        d = self.d[: len(hi)]
        np.subtract(x[r], hi, out=d)
        d -= lo
        d *= inv
        np.maximum(d.max(axis=1), -d.min(axis=1), out=self.worst[j, r])

    def take(self, r0: int, r1: int) -> None:
        """The truth's rows ``r0:r1`` are final: every trajectory's error on them, on this thread."""
        if self.c:
            self._c(self.xs, len(self.made), r0, r1)
            return
        for c0 in range(r0, r1, self.per):
            c1 = min(c0 + self.per, r1)
            r, m = slice(c0, c1), c1 - c0
            hi, lo, inv = self.hi[:m], self.lo[:m], self.inv[:m]
            with np.errstate(over="ignore", invalid="ignore"):
                self._split(r, hi, lo, inv)
                for j, x in enumerate(self.xs):
                    self._rows(x, j, r, hi, lo, inv)

    def take_all(self) -> None:
        self.take(0, self.rows)

    def made_final(self, r1: int) -> None:
        """(The truth's thread) the truth's rows before ``r1`` are final, and so are the
        trajectories' of :meth:`start` (a fault model's chunk is made with the truth's)."""
        with self.ready:
            self.final = r1
            self.ready.notify_all()

    def give(self, j: int, x: Any) -> None:
        """(Another thread) trajectory ``j`` of :meth:`start`'s ``later`` is made: ``x``."""
        x = np.asarray(x).reshape(self.rows, self.cols)
        with self.ready:
            self.made[j] = x
            self.ready.notify_all()

    def _c(self, xs: Sequence[np.ndarray], j0: int, r0: int, r1: int) -> None:
        """Trajectories ``j0, j0 + 1, ...`` (``xs``) on rows ``r0:r1`` by the C form; a row whose
        worst is zero, or a trajectory it cannot read, by numpy's (the class doc says why)."""
        if not xs or r1 <= r0:
            return
        if not all(x.dtype == np.float32 and x.flags.c_contiguous for x in xs):
            for j, x in enumerate(xs, j0):
                self._numpy(x, j, r0, r1)
            return
        ptrs = (ctypes.c_void_p * len(xs))(*[x.ctypes.data for x in xs])
        worst = self.worst.ctypes.data + j0 * self.rows * self.worst.itemsize
        self.lib.state_worst(self.y.ctypes.data, ptrs, len(xs), r0, r1, self.cols, worst, self.rows)
        zero = self.worst[j0 : j0 + len(xs), r0:r1] == 0
        if zero.any():
            for j, r in zip(*np.nonzero(zero)):
                self._numpy(xs[j], j0 + int(j), r0 + int(r), r0 + int(r) + 1)

    def _numpy(self, x: np.ndarray, j: int, r0: int, r1: int) -> None:
        """Trajectory ``j``'s (``x``) error on rows ``r0:r1`` by numpy's form (the chunk buffers)."""
        with np.errstate(over="ignore", invalid="ignore"):
            for a in range(r0, r1, self.per):
                r = slice(a, min(a + self.per, r1))
                split = tuple(k[: r.stop - r.start] for k in (self.hi, self.lo, self.inv))
                self._split(r, *split)
                self._rows(x, j, r, *split)

    def _wait(self, ready: Any) -> bool:
        with self.ready:
            while not ready() and not self.cancelled:
                self.ready.wait()
            return not self.cancelled

    def compare(self) -> None:
        """(A thread of its own) every trajectory's error on every row: each chunk split and
        compared with :meth:`start`'s trajectories as soon as :meth:`made_final` says it is
        final, and with a later one in the same pass where it has been given by then; a later
        one given after is compared on the rows left (numpy's form: on the split kept). Returns
        when all are compared, or at :meth:`cancel`."""
        later = len(self.made)
        done = [0] * later  # the rows each later trajectory is compared on
        c0 = 0
        while c0 < self.rows:
            if not self._wait(lambda c0=c0: self.final > c0):
                return
            c1 = self.final
            if self.c:
                self._c(self.xs, later, c0, c1)
                for j, x in enumerate(self.made):
                    if x is not None and done[j] == c0:
                        self._c([x], j, c0, c1)
                        done[j] = c1
                c0 = c1
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                for a in range(c0, c1, self.per):
                    r = slice(a, min(a + self.per, c1))
                    split = tuple(k[r] for k in self.kept) if later else (self.hi, self.lo, self.inv)
                    split = tuple(k[: r.stop - r.start] for k in split)
                    self._split(r, *split)
                    for j, x in enumerate(self.xs, later):
                        self._rows(x, j, r, *split)
                    for j, x in enumerate(self.made):
                        if x is not None and done[j] == a:
                            self._rows(x, j, r, *split)
                            done[j] = r.stop
            c0 = c1
        for j in range(later):
            if not self._wait(lambda j=j: self.made[j] is not None):
                return
            x = self.made[j]
            if self.c:
                self._c([x], j, done[j], self.rows)
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                for a in range(done[j], self.rows, self.per):
                    r = slice(a, min(a + self.per, self.rows))
                    self._rows(x, j, r, *(k[r] for k in self.kept))

    def cancel(self) -> None:
        """Release a :meth:`compare` waiting for rows or a trajectory that will not come."""
        with self.ready:
            self.cancelled = True
            self.ready.notify_all()

    def finish(self) -> list[np.ndarray]:
        """Per trajectory, its worst error per sequence [S] (float64), once every row is compared."""
        if any(x is None for x in self.made):
            raise RuntimeError("Errors.finish: a later trajectory was never given")
        self.xs = [x for x in self.made if x is not None] + self.xs
        worst = self.worst.reshape(len(self.xs), self.seqs, -1).max(axis=2).astype(np.float64)
        y = self.y.reshape(self.seqs, -1)
        for j, x in enumerate(self.xs):
            bad = ~np.isfinite(worst[j])
            if bad.any():
                yb = y[bad]
                worst[j, bad] = scaled_worst(x.reshape(self.seqs, -1)[bad], yb, inverse_scale(yb))
        self.xs, self.made = [], []
        return list(worst)
