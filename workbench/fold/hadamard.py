"""Hadamard matrices and the block Hadamard transform.

A block size is ``b = m * 2**k`` with ``m`` in {1, 12, 20, 28}: the sizes
``mx.hadamard_transform`` serves. For ``m = 1`` the matrix is Sylvester's, in natural
order; for ``m > 1`` it is ``kron(H_m, H_{2^k})`` and the transform is ``y = M x`` (MLX
applies it as ``x @ M.T``; the 20 and 28 tables are not symmetric, so the order matters).

Two paths, one meaning: numpy (:func:`block_transform`: dense block matrices, any float
dtype, float64 for the oracle) and MLX (:func:`block_transform_mx`: ``mx.hadamard_transform``
on each block).

Every size is validated HERE before MLX sees it, because ``mx.hadamard_transform``
accepts n = 36 (m = 9 is not a Hadamard order) and silently returns a matrix that is not
orthogonal: MLX 0.32 never checks that n / m is a power of two.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TypeVar

import mlx.core as mx
import numpy as np

from workbench import backends, validate

#: The odd factors MLX (and so the kernels) have tables for.
ALLOWED_M: tuple[int, ...] = (1, 12, 20, 28)

# The m = 12, 20, 28 tables, row i = M[i, :], '+' = 1 and '-' = -1. Figures from N. J. A.
# Sloane's library of Hadamard matrices (http://neilsloane.com/hadamard/), in the form
# MLX 0.32 uses them (mlx/backend/metal/hadamard.cpp); tests/test_hadamard.py checks
# each against mx.hadamard_transform itself, so a different MLX table would be caught.
_TABLES: dict[int, str] = {
    12: """
+-++++++++++
--+-+-+-+-+-
+++-++----++
+---+--+-++-
+++++-++----
+-+---+--+-+
++--+++-++--
+--++---+--+
++----+++-++
+--+-++---+-
++++----+++-
+-+--+-++---
""",
    20: """
+----+----++--++-++-
-+----+---+++---+-++
--+----+---+++-+-+-+
---+----+---+++++-+-
----+----++--++-++-+
-+++++-----+--+++--+
+-+++-+---+-+--+++--
++-++--+---+-+--+++-
+++-+---+---+-+--+++
++++-----++--+-+--++
--++-+-++-+-----++++
---++-+-++-+---+-+++
+---++-+-+--+--++-++
++---++-+----+-+++-+
-++---++-+----+++++-
-+--+--++-+----+----
+-+-----++-+----+---
-+-+-+---+--+----+--
--+-+++------+----+-
+--+--++------+----+
""",
    28: """
+------++----++-+--+-+--++--
-+-----+++-----+-+--+-+--++-
--+-----+++---+-+-+----+--++
---+-----+++---+-+-+-+--+--+
----+-----+++---+-+-+++--+--
-----+-----++++--+-+--++--+-
------++----++-+--+-+--++--+
--++++-+-------++--+++-+--+-
---++++-+-----+-++--+-+-+--+
+---+++--+----++-++--+-+-+--
++---++---+----++-++--+-+-+-
+++---+----+----++-++--+-+-+
++++--------+-+--++-++--+-+-
-++++--------+++--++--+--+-+
-+-++-++--++--+--------++++-
+-+-++--+--++--+--------++++
-+-+-++--+--++--+----+---+++
+-+-+-++--+--+---+---++---++
++-+-+-++--+------+--+++---+
-++-+-+-++--+------+-++++---
+-++-+---++--+------+-++++--
-++--++-+-++-+++----++------
+-++--++-+-++-+++-----+-----
++-++---+-+-++-+++-----+----
-++-++-+-+-+-+--+++-----+---
--++-++++-+-+----+++-----+--
+--++-+-++-+-+----+++-----+-
++--++-+-++-+-+----++------+
""",
}


def factor_block(block: int) -> tuple[int, int]:
    """``(m, k)`` with ``block == m * 2**k`` and ``m`` in :data:`ALLOWED_M`.

    Raises ``ValueError`` naming ``block`` for anything else (0, negatives, 3, 36, 44,
    72, non-integers), so no invalid size ever reaches ``mx.hadamard_transform``.
    """
    if isinstance(block, (bool, np.bool_)) or not isinstance(block, (int, np.integer)):
        raise ValueError(
            f"block: must be an int of the form m * 2**k with m in {ALLOWED_M}, got {validate.describe(block)}"
        )
    block = int(block)
    if block >= 1:
        for m in ALLOWED_M:
            if block % m == 0:
                q = block // m
                if q & (q - 1) == 0:
                    return m, q.bit_length() - 1
    raise ValueError(
        f"block: must be m * 2**k with m in {ALLOWED_M} and k >= 0 "
        f"(1, 2, 4, ..., 12, 24, ..., 20, 40, ..., 28, 56, ...), got {block}"
    )


@lru_cache(maxsize=8)  # m is one of four block factors
def _table(m: int) -> np.ndarray:
    if m == 1:
        return np.ones((1, 1), dtype=np.int8)
    rows = _TABLES[m].split()
    return np.array([[1 if c == "+" else -1 for c in row] for row in rows], dtype=np.int8)


@lru_cache(maxsize=32)  # k: the log2 of a block's power of two, a few values
def _sylvester(k: int) -> np.ndarray:
    h = np.ones((1, 1), dtype=np.int8)
    for _ in range(k):
        h = np.block([[h, h], [h, -h]])
    return h


def table(m: int) -> np.ndarray:
    """The m x m +-1 table MLX uses for the odd factor ``m`` (``m = 1``: ``[[1]]``)."""
    validate.one_of("m", m, ALLOWED_M)
    out = _table(m).copy()
    out.flags.writeable = False
    return out


def hadamard_matrix(n: int) -> np.ndarray:
    """The unnormalised +-1 matrix ``M`` (int8, n x n) of ``mx.hadamard_transform``.

    ``mx.hadamard_transform(x, scale=1.0) == x @ M.T``; ``M @ M.T == n I``.
    """
    m, k = factor_block(n)
    validate.within_memory("n", 9 * n * n, f"a dense {n} x {n} Hadamard matrix")  # int8, and float64 for the oracle
    return np.kron(_table(m), _sylvester(k)).astype(np.int8)


@lru_cache(maxsize=32)
def _orthonormal(n: int) -> np.ndarray:
    h = hadamard_matrix(n).astype(np.float64) / np.sqrt(n)
    h.flags.writeable = False
    return h


@lru_cache(maxsize=32)
def _orthonormal_t(n: int) -> np.ndarray:
    """``(H / sqrt(n)).T`` as its own C-ordered array: what ``rows @ .`` multiplies by for ``B x``.

    Not the transposed view: OpenBLAS (AVX-512 kernels) multiplies a few rows by a
    transposed operand with its small-matrix kernel and many rows with the large one,
    which sum in different orders, so a row's bits would depend on its batch (block 64:
    up to 18 rows; 256: up to 4); by a C-ordered operand every multiple of 8 rows gives
    the same bits (tests/test_hadamard.py holds it)."""
    h = np.ascontiguousarray(_orthonormal(n).T)
    h.flags.writeable = False
    return h


ArrayT = TypeVar("ArrayT", np.ndarray, mx.array)


def _check_width(shape: tuple[int, ...], block: int) -> None:
    if len(shape) == 0 or shape[-1] == 0 or shape[-1] % block != 0:
        raise ValueError(
            f"x: its last axis must be a multiple of block ({block}), block * j for j >= 1; got shape {tuple(shape)}"
        )


_FLOAT64 = np.dtype(np.float64)

#: Block sizes (plain ints) that passed :func:`factor_block` in a call of :func:`block_transform`.
#: The oracle applies a fold once a case, a hundred thousand times in a sweep's checks, and the
#: full checks cost more than the transform at the test shape: a float64 array with a block
#: seen here takes the short path, in a few comparisons.
_checked_blocks: set[int] = set()


def block_transform(x: np.ndarray, block: int, *, transpose: bool = False) -> np.ndarray:
    """``B x`` (or ``B^T x``) along the last axis, numpy, in x's float dtype.

    ``B = blockdiag(H_b / sqrt(b))``. This is the oracle path: dense block matrices, so
    float64 in gives float64 arithmetic throughout. A numpy float array is taken as it is
    (the check costs a type test); anything else goes through ``validate.float_array``.
    """
    if (
        type(x) is np.ndarray
        and x.dtype is _FLOAT64
        and type(block) is int
        and block in _checked_blocks
        and x.ndim
        and x.shape[-1]
        and x.shape[-1] % block == 0
    ):
        # The oracle's call (float64, a block checked before), in as few steps as the work.
        return _rows_times(x.reshape(-1, block), _orthonormal(block) if transpose else _orthonormal_t(block)).reshape(
            x.shape
        )
    factor_block(block)
    block = int(block)
    if not (type(x) is np.ndarray and x.dtype.kind == "f"):
        x = validate.float_array("x", x)
    _check_width(x.shape, block)
    _checked_blocks.add(block)
    h = _orthonormal(block).astype(x.dtype, copy=False)
    # y_block = H x_block, i.e. x_block @ H.T; B^T x uses H instead of H.T.
    m = h if transpose else h.T
    if x.dtype != np.float64:
        xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
        return (xb @ m).reshape(x.shape)
    return _rows_times(x.reshape(-1, block), h if transpose else _orthonormal_t(block)).reshape(x.shape)


#: float64 rows go through BLAS in groups whose count is a multiple of this: OpenBLAS's
#: dgemm gives a row the same bits whatever the row count when the count is a multiple of 8
#: (its edge kernels for the last 1-7 rows sum in another order), so a case's truth does not
#: depend on how many cases share the call (tests/test_hadamard.py holds it).
ROW_GROUP = 8


def _rows_times(rows: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``rows @ m`` as ONE large product (float64), the last ``len(rows) % 8`` rows padded to 8.

    One product over every block of every row reads ``m`` once; a stacked ``(..., nblocks,
    block) @ m`` runs one small product per row and re-reads ``m`` each time (Bonsai-27B's
    folds: 8 MB a product, 4 GFLOP/s instead of 45).
    """
    n = rows.shape[0]
    full = n - n % ROW_GROUP
    if full == n:
        return rows @ m
    pad = np.zeros((ROW_GROUP, rows.shape[1]), dtype=np.float64)
    pad[: n - full] = rows[full:]
    if not full:  # one vector's few blocks, the oracle's usual call: one small product
        return (pad @ m)[:n]
    out = np.empty((n, m.shape[1]), dtype=np.float64)
    np.matmul(rows[:full], m, out=out[:full])
    out[full:] = (pad @ m)[: n - full]
    return out


@lru_cache(maxsize=32)
def _table_t_mx(m: int, dtype: mx.Dtype) -> mx.array:
    """``H_m^T / sqrt(m)`` as an MLX constant, made once per (m, dtype)."""
    return mx.array(_table(m).T.astype(np.float32) / np.sqrt(m), dtype=dtype)


def block_transform_mx(x: mx.array, block: int, *, transpose: bool = False) -> mx.array:
    """``B x`` (or ``B^T x``) along the last axis through ``mx.hadamard_transform``. Lazy.

    ``B^T`` for ``m > 1``: ``H_b = kron(A, S)`` with ``A = H_m`` and ``S`` Sylvester
    (symmetric), so on a block reshaped to ``X`` (m x 2^k) ``H_b^T x`` is ``A^T X S``:
    MLX's transform over the 2^k axis, then a small matmul with ``A^T`` over the m axis.

    Where MLX's default device is an NVIDIA GPU, a block with ``m > 1`` is computed on MLX's
    CPU stream (the code says why); powers of two stay on the GPU.
    """
    m, k = factor_block(block)
    if not isinstance(x, mx.array) or not mx.issubdtype(x.dtype, mx.floating):
        raise ValueError(f"x: must be an MLX float array, got {validate.describe(x)}")
    _check_width(tuple(x.shape), block)
    if x.size == 0:
        # An empty batch (a leading axis of 0) rotates to an empty batch, as the numpy path
        # answers; mx.hadamard_transform refuses empty arrays in its own words.
        return x
    if m > 1 and backends.cuda_is_default():
        # MLX 0.32's CUDA back-end fails to compile hadamard_transform for these sizes (its
        # kernel divides by a task count that is zero when 2^k is small), and the
        # transpose's product below would run at TF32-class precision
        # there (workbench.backends.reduced_float32_products). On the CPU stream both are
        # MLX's exact float32 ops; the result stays lazy and feeds the GPU's graph as any array.
        with mx.stream(mx.cpu):
            return _blocks(x, block, m, k, transpose)
    return _blocks(x, block, m, k, transpose)


def _blocks(x: mx.array, block: int, m: int, k: int, transpose: bool) -> mx.array:
    lead = x.shape[:-1]
    nblocks = x.shape[-1] // block
    if not transpose or m == 1:
        y = mx.hadamard_transform(x.reshape(*lead, nblocks, block))
        return y.reshape(x.shape)
    p = 1 << k
    xs = x.reshape(*lead, nblocks, m, p)
    xs = mx.hadamard_transform(xs)  # X S / sqrt(2^k), over the last (2^k) axis
    a_t = _table_t_mx(m, x.dtype)
    y = a_t @ xs  # (m x m) @ (..., m, 2^k): A^T X S / sqrt(b)
    return y.reshape(x.shape)
