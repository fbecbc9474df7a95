"""MLX arrays the check's graph reference reads a case's dense weights from, written in place.

``mx.array(numpy)`` copies into memory MLX has just allocated, and on MLX's CPU that memory is
new every time: a case's weights at a shipped shape cost about 1.4 GB/s that way on this
project's VM (47 ms for a 64 MB matrix) against 8 ms copied into memory touched before. So the
check keeps one MLX array a weight (by name and shape) for a run and writes each case's
weights into it through a NumPy view of its memory: MLX documents that such a view shares the
array's memory and that writes to it are seen by the array ("Conversion to NumPy and Other
Frameworks", https://ml-explore.github.io/mlx/build/html/usage/numpy.html). The values are the
same bits either way, so the reference is too (``tests/test_check_blocks.py``).

A staged array is only read by a graph evaluated before the next case is written (the
reference evaluates one case a graph). Where a backend's arrays are not host memory a view
could not share, :class:`GraphStage` finds it out on the first array (a value written through
the view, read back through MLX) and makes a copy a case from then on: the same bits.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


class GraphStage:
    """One MLX array a ``(name, shape, dtype)`` for a run, written case after case."""

    def __init__(self) -> None:
        self.held: dict[tuple, tuple[mx.array, np.ndarray]] = {}
        self.shares: bool | None = None  # found out on the first array

    def load(self, name: str, values: np.ndarray) -> mx.array:
        """``values`` (float32 or float16, numpy) as an MLX array of the same dtype."""
        if self.shares is False:
            return mx.array(values)
        key = (name, values.shape, values.dtype.str)
        got = self.held.get(key)
        if got is None:
            arr = mx.array(np.empty(values.shape, values.dtype))
            mx.eval(arr)
            view = np.array(arr, copy=False)
            if self.shares is None:
                self.shares = _shares(arr, view)
                if not self.shares:
                    return mx.array(values)
            got = self.held[key] = (arr, view)
        arr, view = got
        np.copyto(view, values)
        return arr

    def clear(self) -> None:
        """Let go of every staged array (a run's end: they are as large as a case's weights)."""
        self.held.clear()


def _shares(arr: mx.array, view: np.ndarray) -> bool:
    """Whether a write through ``view`` is seen by ``arr`` (its host memory, not a copy)."""
    if not view.flags.writeable or view.size == 0:
        return False
    flat = view.reshape(-1)
    flat[0] = 1.5
    with mx.stream(mx.cpu):
        first = float(arr.reshape(-1)[0].item())
    flat[0] = -2.5
    with mx.stream(mx.cpu):
        second = float(arr.reshape(-1)[0].item())
    return first == 1.5 and second == -2.5
