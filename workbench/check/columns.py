"""The columns of a check that do not depend on the implementation, kept by case key.

The float64 truth, the graph reference and the fault models' rows of a block of cases depend
only on the cases (shape, stored dtype, fold, quantization, eps, input scales, seeds) and on
the faults asked for, never on the implementation under test: a notebook checks several
tails on the same seeds, a mutant study checks every mutant of a kernel on the same eight,
and each computed them again (the float16 fault alone was two thirds of a check with faults
on). :data:`COLUMNS` keeps them for the process, keyed by those values, least recently used
first out past :data:`MAX_BYTES`; a hit returns arrays marked read-only, so no caller can
change what the next one reads.
"""

from __future__ import annotations

from collections import OrderedDict
from threading import Lock

import numpy as np

#: Bytes the kept columns may hold (truth and reference: hidden x scales float64/float32 a
#: case; the fault rows: three floats a case, scale and fault).
MAX_BYTES = 256 * 2**20


def block_key(config: tuple, seeds: np.ndarray, scales: list[float], faults: tuple[str, ...], eps: float) -> tuple:
    """What a block's implementation-independent columns depend on, as a hashable key."""
    shp, dtype, fold, qlabel, _, _ = config
    return (tuple(shp), dtype, str(fold), qlabel, float(eps), tuple(scales), tuple(faults), seeds.tobytes())


def _nbytes(value: tuple) -> int:
    truth, ref, frames = value
    return int(truth.nbytes + ref.nbytes + sum(int(f.memory_usage(index=True).sum()) for f in frames))


class Columns:
    """A bounded, least-recently-used store of blocks' ``(truth, reference, fault frames)``."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.held: OrderedDict[tuple, tuple] = OrderedDict()
        self.bytes = 0
        self.lock = Lock()

    def get(self, key: tuple) -> tuple | None:
        with self.lock:
            value = self.held.get(key)
            if value is not None:
                self.held.move_to_end(key)
            return value

    def put(self, key: tuple, truth: np.ndarray, ref: np.ndarray, frames: list) -> None:
        truth.flags.writeable = False
        ref.flags.writeable = False
        value = (truth, ref, list(frames))
        size = _nbytes(value)
        if size > self.max_bytes:
            return
        with self.lock:
            if key in self.held:
                self.bytes -= _nbytes(self.held.pop(key))
            self.held[key] = value
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, old = self.held.popitem(last=False)
                self.bytes -= _nbytes(old)

    def clear(self) -> None:
        with self.lock:
            self.held.clear()
            self.bytes = 0


#: The process's kept columns (:class:`Columns`, at most :data:`MAX_BYTES`).
COLUMNS = Columns(MAX_BYTES)
