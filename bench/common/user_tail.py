"""Notebook 07's numpy tail, as a user writes it: the subject of ``bench.check_shapes``.

In a module of its own so the check can import it by ``module:qualname`` in its worker
process (a function of the bench's ``__main__`` could not be).
"""

from __future__ import annotations

import numpy as np


def walsh_hadamard(x, block):
    """Notebook 07's: orthonormal fast Walsh-Hadamard transform over consecutive blocks of the last axis."""
    y = np.array(x, dtype=np.float32).reshape(-1, block)
    h = 1
    while h < block:
        y = y.reshape(len(y), -1, 2, h)
        a, b = y[:, :, 0, :].copy(), y[:, :, 1, :].copy()
        y[:, :, 0, :], y[:, :, 1, :] = a + b, a - b
        y = y.reshape(len(y), block)
        h *= 2
    return (y / np.float32(np.sqrt(block))).reshape(np.shape(x))


def my_tail(case):
    """Notebook 07's numpy tail (the subject of every figure)."""
    x = np.asarray(case.branch, np.float32)
    if case.fold is not None:
        x = walsh_hadamard(x * case.fold.signs, case.fold.block)
    h = case.residual + case.wo.dense() @ x
    mean_sq = np.float32(np.dot(h, h) / h.size)
    inv = 1 / np.sqrt(mean_sq + np.float32(case.eps))
    n = h * np.float32(inv) * case.ffn_norm
    g, u = case.gate.dense() @ n, case.up.dense() @ n
    return h + case.down.dense() @ (g / (1 + np.exp(-g)) * u)
