"""A check's cases drawn into buffers it reuses block after block, the bits of ``draw_block``.

:func:`workbench.studies.cases.draw_block` draws a block's uniforms into a new array and makes
each tensor a new array from them: twice a case's floats of memory touched for the first time
a block, which on this machine's VM (about 0.39 GB/s first touched, 4-5 GB/s re-touched) was
most of the draw's cost at a shipped shape. :class:`Draws` keeps one float32 buffer of a
block's cases, draws each case's uniforms straight into its row (the same PCG64 stream, key
and offset as ``draw_block``'s, so the same floats), and applies each tensor's recipe in
place (the same float32 operations in the same order: the same bits;
``tests/test_check_blocks.py`` holds it to ``draw_block``). The tensors are views of the
row: each case's matrices contiguous, as an implementation is handed them.

The buffer is overwritten by the next block: what a block hands out must not be kept past it
(the check keeps only its metrics, and a call gets fresh copies).
"""

from __future__ import annotations

import math

import numpy as np

from workbench.studies.cases import CASE_BLOCK, SWEEP_SALT, CaseArrays
from workbench.tail.weights import case_recipe


class Draws:
    """The draws of one configuration's blocks at ``shape``, at most ``size`` cases a block."""

    def __init__(self, shape: tuple[int, int, int], size: int):
        self.shape = tuple(int(v) for v in shape)
        self.recipe = case_recipe(*self.shape)
        self.n = sum(math.prod(d.shape) for d in self.recipe)
        self.buf = np.empty((int(size), self.n), dtype=np.float32)

    def block(self, block: int, rows: np.ndarray) -> CaseArrays:
        """Rows ``rows`` (ascending, at most ``size``) of draw block ``block``, as ``draw_block`` gives them."""
        rows = np.asarray(rows, dtype=np.int64)
        key = [SWEEP_SALT, *self.shape, int(block)]
        u = self.buf[: len(rows)]
        for j, i in enumerate(rows):
            rng = np.random.default_rng(key)
            start = int(i) * self.n
            rng.bit_generator.advance(start // 2)
            if start % 2:  # the row starts mid-step: its first half was the row before's
                rng.random(1, dtype=np.float32)
            rng.random(dtype=np.float32, out=u[j])
        out: dict[str, np.ndarray] = {}
        o = 0
        for d in self.recipe:
            k = math.prod(d.shape)
            v = u[:, o : o + k]
            o += k
            if d.signs:
                v[...] = np.where(v < 0.5, np.float32(-1.0), np.float32(1.0))
            else:
                np.multiply(v, np.float32(2 * d.half_width), out=v)
                v -= np.float32(d.half_width)
                if d.centre:
                    v += np.float32(d.centre)
            out[d.name] = v.reshape((len(rows),) + d.shape)
        return CaseArrays(seeds=block * CASE_BLOCK + rows, **out)
