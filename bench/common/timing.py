"""How every benchmark times: interleaved rounds, their summary, a piece's device time, the copy bandwidth.

One place, so every command's figures are taken the same way and compare across records.
Variants run in interleaved rounds (:func:`time_rounds`, :func:`interleaved`), so drift in a
shared machine's load hits each alike. A piece's device time is the marginal time of one
more copy chained into ONE evaluation (:func:`piece_device_ms`): the wait and the fixed costs
are in both sides and drop out. The one streaming bandwidth a floor divides bytes by is
:func:`copy_bandwidth`; :data:`COPY_METHODS` says how it is measured on each kind of device,
and a record states that text beside the figure (:func:`copy_floor`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import mlx.core as mx
import numpy as np

from bench.common.cli import progress
from workbench import backends
from workbench.validate import integer


def time_rounds(
    fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 3, desc: str | None = None
) -> dict[str, list[float]]:
    """Wall times (ms) of each callable, interleaved: each round runs each once, in order,
    after ``warmup`` such rounds. ``desc`` shows a progress bar over the rounds (for runs
    longer than a few seconds); :func:`summaries` turns the lists into summaries."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    rounds: Iterable[int] = range(repeats) if desc is None else progress(range(repeats), repeats, desc)
    for _ in rounds:
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            out[name].append((time.perf_counter() - t0) * 1e3)
    return out


def summarize(ts: list[float]) -> dict[str, float]:
    """Median, minimum and 90th percentile (ms) of a list of times, and how many."""
    s = sorted(ts)
    return {
        "median_ms": statistics.median(s),
        "min_ms": s[0],
        "p90_ms": s[min(len(s) - 1, int(0.9 * len(s)))],
        "n": len(s),
    }


def summaries(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """:func:`summarize` of each list of :func:`time_rounds`' result, under the same names."""
    return {k: summarize(v) for k, v in times.items()}


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[Any]]:
    """Each callable's results, ``rounds`` times (rounded up to even), alternating: every
    round runs each once, the order reversed every other round, so each side runs first
    in exactly half the rounds (with an odd count, a median of few rounds can lean
    towards whichever side ran first more often)."""
    out: dict[str, list[Any]] = {k: [] for k in fns}
    names = list(fns)
    for i in range(rounds + rounds % 2):
        for k in names if i % 2 == 0 else names[::-1]:
            out[k].append(fns[k]())
    return out


def piece_device_ms(piece: Callable[[mx.array], tuple], x: mx.array, *, k: int = 8, n: int = 5) -> float:
    """What one more copy of ``piece`` (a callable ``x -> outputs``, a tuple, the next input
    first) adds to ONE evaluation: ``k`` copies chained against one, ``(t_k - t_1) / (k - 1)``,
    the median of ``n`` (the wait and the fixed costs are in both, so they drop out). That is
    the device's time for it, or MLX's time to encode and launch it where that is longer."""
    k = integer("k", k, minimum=2)
    n = integer("n", n, minimum=1)

    def run(m: int) -> float:
        y, outs = x, []
        t0 = time.perf_counter()
        for _ in range(m):
            o = piece(y)
            y, outs = o[0], outs + list(o[1:])
        mx.eval(y, *outs)
        return time.perf_counter() - t0

    run(k)  # warm
    diffs = sorted((run(k) - run(1)) / (k - 1) * 1e3 for _ in range(n))
    return float(diffs[len(diffs) // 2])


#: How :func:`copy_bandwidth` measures, by the kind of device MLX runs on.
COPY_METHODS = {
    "cpu": "numpy copyto between two buffers of nbytes (read + write), median of the repeats",
    "gpu": "MLX y + 1 over nbytes of float32, chain copies in ONE evaluation against one (read + write each), "
    "the marginal time of a copy, median of the repeats",
}


def copy_method() -> str:
    """How :func:`copy_bandwidth` measures on this machine: one of :data:`COPY_METHODS`' texts."""
    return COPY_METHODS["cpu" if backends.device_kind() == "cpu" else "gpu"]


def copy_bandwidth(nbytes: int = 1 << 28, repeats: int = 5, *, chain: int = 8) -> float:
    """This device's streaming bandwidth in bytes/s, one read and one write of ``nbytes`` a
    copy, measured as :func:`copy_method` says: on the CPU numpy's ``copyto`` (a ``memcpy``),
    timed ``repeats`` times after one warm-up; on a GPU the marginal time of MLX's ``y + 1``
    (:func:`piece_device_ms`, ``chain`` copies against one, ``repeats`` times), so the wait
    and the allocation are not counted. Raises ``RuntimeError`` where the chained copies took
    no longer than one (the clock is noisier than the copy: a figure would be made up)."""
    nbytes, repeats = int(nbytes), int(repeats)
    if nbytes < 1 or repeats < 1:
        raise ValueError(f"copy_bandwidth: nbytes and repeats must be >= 1, got {nbytes} and {repeats}")
    if backends.device_kind() == "cpu":
        src = np.ones(max(1, nbytes // 8), dtype=np.float64)  # written once, so its pages are real
        dst = np.empty_like(src)
        times = []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            if i:
                times.append(time.perf_counter() - t0)
        return 2 * src.nbytes / statistics.median(times)
    x = mx.zeros((max(1, nbytes // 4),), dtype=mx.float32)
    mx.eval(x)
    ms = piece_device_ms(lambda y: (y + 1.0,), x, k=chain, n=repeats)
    size = x.nbytes
    del x
    if ms <= 0:
        raise RuntimeError(
            f"copy_bandwidth: {chain} chained copies of {size} bytes took no longer than one "
            f"(marginal {ms:.4f} ms): the clock is noisier than the copy; use more nbytes or repeats"
        )
    return 2 * size / (ms / 1e3)


def copy_floor(nbytes: int = 1 << 28, repeats: int = 5) -> dict[str, Any]:
    """:func:`copy_bandwidth` with what a record states beside it: the method, the bytes and
    the repeats (``{"bytes_per_s", "method", "nbytes", "repeats"}``)."""
    return {
        "bytes_per_s": copy_bandwidth(nbytes, repeats),
        "method": copy_method(),
        "nbytes": int(nbytes),
        "repeats": int(repeats),
    }
