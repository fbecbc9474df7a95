"""Measuring waits: counting the submissions a block of code waits on, and timing one.

A *wait* is one GPU submission whose result the host waits for (the unit the resident-state
plan of ``workbench.waits.plan`` counts and prices). Two instruments, so the plan's claims are
measured rather than asserted:

* :func:`count_waits` counts them: every MLX evaluation and every host read of an MLX array
  inside a ``with`` block (how "the unfused tail waits twice, the fused tail once" is
  checked, and how ``workbench.decode.schedule`` checks a decode step against the plan);
* :func:`measure_wait_price` times the smallest one on a device (what the ledger's
  measured entries hold), and :func:`measure_split_price` what one costs between two
  real submissions, where the device also idles while the host reads, encodes and submits.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import backends
from workbench.validate import describe, integer

# -- counting -------------------------------------------------------------------------


@dataclass
class WaitCount:
    """What :func:`count_waits` saw: ``n`` waits, and ``events`` naming each (``eval``, ``read:asarray``, ...)."""

    events: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.events)

    def __int__(self) -> int:
        return self.n

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            return self.n == other
        if isinstance(other, WaitCount):
            return self.events == other.events
        return NotImplemented

    def __repr__(self) -> str:
        return f"WaitCount(n={self.n}, events={self.events})"


_ABSENT = object()  # an attribute the owner did not hold in its own namespace before patching


class _WaitPatch:
    """The patches :func:`count_waits` installs once, whatever the nesting depth.

    ``originals`` maps ``(owner, attr)`` to what the owner's OWN namespace held (its
    ``__dict__`` entry, or ``_ABSENT``), so uninstalling restores exactly that: the very
    same objects, and no attribute left behind where there was none.
    """

    counters: list[tuple[WaitCount, list]] = []
    originals: dict[tuple[Any, str], Any] = {}
    busy = False  # re-entrancy guard: a counted call that calls another is one wait


def _flatten_arrays(tree: Any, out: list) -> None:
    if isinstance(tree, mx.array):
        out.append(tree)
    elif isinstance(tree, (list, tuple)):
        for t in tree:
            _flatten_arrays(t, out)
    elif isinstance(tree, dict):
        for t in tree.values():
            _flatten_arrays(t, out)


def _record(kind: str, arrays: list, is_eval: bool) -> None:
    for counter, evaluated in _WaitPatch.counters:
        if not is_eval and arrays and all(any(a is e for e in evaluated) for a in arrays):
            continue  # read of an array this block already evaluated: no new submission
        if is_eval:
            evaluated.extend(arrays)
        counter.events.append(kind)


def _wrap(owner: Any, attr: str, kind: str, is_eval: bool, mx_only: bool = False) -> None:
    orig = getattr(owner, attr)
    _WaitPatch.originals[(owner, attr)] = vars(owner).get(attr, _ABSENT)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _WaitPatch.busy:
            return orig(*args, **kwargs)
        arrays: list = []
        if is_eval:
            _flatten_arrays(list(args), arrays)
        elif mx_only:
            if not (args and isinstance(args[0], mx.array)):
                return orig(*args, **kwargs)
            arrays = [args[0]]
        else:
            arrays = [args[0]] if args else []
        _WaitPatch.busy = True
        try:
            result = orig(*args, **kwargs)
        finally:
            _WaitPatch.busy = False
        # Only a call that returned is a wait: one that raised (a bad argument, a failed
        # evaluation) waited for nothing, and counting it would make counts depend on errors.
        if not is_eval or arrays:
            _record(kind, arrays, is_eval)
        return result

    setattr(owner, attr, wrapper)


#: What count_waits patches, as (owner, attribute): the functions that evaluate, and the
#: host reads (MLX's and numpy's entry points); tests check each is restored by identity.
PATCHED: tuple[tuple[Any, str], ...] = (
    (mx, "eval"),
    (mx, "async_eval"),
    *(
        (mx.array, m)
        for m in ("item", "tolist", "__array__", "__float__", "__int__", "__bool__", "__index__", "__dlpack__")
        if hasattr(mx.array, m)
    ),
    *((np, f) for f in ("asarray", "array", "asanyarray", "ascontiguousarray", "copy")),
)


def _install() -> None:
    try:
        for owner, attr in PATCHED:
            if owner is mx:
                _wrap(owner, attr, attr, is_eval=True)
            elif owner is np:
                _wrap(owner, attr, f"read:np.{attr}", is_eval=False, mx_only=True)
            else:
                _wrap(owner, attr, f"read:{attr.strip('_')}", is_eval=False)
    except BaseException:
        _uninstall()  # half a patch set is worse than none
        raise


def _uninstall() -> None:
    for (owner, attr), orig in _WaitPatch.originals.items():
        if orig is _ABSENT:
            delattr(owner, attr)
        else:
            setattr(owner, attr, orig)
    _WaitPatch.originals.clear()


@contextlib.contextmanager
def count_waits() -> Iterator[WaitCount]:
    """Count the submissions a block of code waits on; yields a :class:`WaitCount`.

    What it counts, while the block runs (any code, not only the workbench's):

    * each ``mx.eval`` / ``mx.async_eval`` call given at least one array: one wait (one
      evaluation is one submission, however many arrays it covers);
    * each host read of an ``mx.array`` that this block has NOT already evaluated:
      ``.item()``, ``.tolist()``, ``__array__``, ``float()`` / ``int()`` / ``bool()``,
      ``__dlpack__``, and ``np.asarray`` / ``np.array`` / ``np.asanyarray`` /
      ``np.ascontiguousarray`` / ``np.copy`` of an mx.array (numpy reads MLX through the
      buffer protocol, which cannot be patched, so the numpy entry points are). Reading
      an array the block evaluated costs no new submission and is not counted.

    Not seen: buffer-protocol reads that bypass those numpy functions (``memoryview``,
    a numpy ufunc handed an mx.array directly); an array read that was evaluated
    outside the block counts as a wait (MLX does not say whether an array is
    evaluated). Nested blocks each count everything inside them, and a block ended by an
    exception still counts exactly what ran (a call that raised is not a wait). When the
    outermost block ends, however it ends, every patched function is the original object
    again and nothing is kept (see :data:`PATCHED`). Not thread-safe: it patches module
    attributes while active.
    """
    wc = WaitCount()
    if not _WaitPatch.counters:
        _install()
    entry = (wc, [])
    _WaitPatch.counters.append(entry)
    try:
        yield wc
    finally:
        # By identity: two counters with equal events are still two blocks.
        _WaitPatch.counters[:] = [c for c in _WaitPatch.counters if c is not entry]
        if not _WaitPatch.counters:
            _uninstall()


# -- timing ---------------------------------------------------------------------------


def _as_device(device):
    """``None`` (MLX's default), a ``mx.Device`` or a ``mx.DeviceType`` (``mx.cpu``) as a ``mx.Device``."""
    if device is None:
        return mx.default_device()
    if isinstance(device, mx.DeviceType):
        return mx.Device(device)
    if isinstance(device, mx.Device):
        return device
    raise ValueError(f"device: must be None, an mx.Device or mx.cpu / mx.gpu; got {device!r}")


def _ledger_keys(dev: mx.Device) -> dict[str, str]:
    """The two keys the ledger files a measured price by: ``backend`` (cpu / cuda / metal)
    and ``device`` (the device's name, from the one device description)."""
    backend = backends.device_kind(dev)
    return {"backend": backend, "device": backends.device_description(dev).get("device_name", backend)}


WAIT_METHOD = (
    "One wait = the smallest submission and its round trip to the host: on the device, "
    "y = x + 1 of a resident float32 scalar x (a fresh graph of one op), then y.item(), "
    "which evaluates it, waits for the device and reads the value back. Timed one by one "
    "with time.perf_counter_ns after {warmup} warm-up waits; the price is the median of "
    "{n}; spread: 10th-90th percentile and IQR. Beside it, interleaved, mx.eval(x + 1) "
    "without the read-back (eval_only_ms)."
)


def measure_wait_price(device=None, *, n: int = 2000, warmup: int = 200) -> dict:
    """Measure one wait on an MLX device (default: MLX's default device).

    Returns a ledger-shaped dict: ``ms`` (the median), ``p10_ms``, ``p90_ms``, ``iqr_ms``,
    ``mean_ms``, ``eval_only_ms`` (the same submission waited for without reading it
    back), ``n``, the device (``backends.device_description`` and the ledger's ``backend`` /
    ``device`` keys), the date, and the method
    in words.
    """
    n = integer("n", n, minimum=10)
    warmup = integer("warmup", warmup, minimum=0)
    dev = _as_device(device)
    times, eval_only = [], []
    with mx.stream(dev):
        x = mx.array(1.0, dtype=mx.float32)
        mx.eval(x)
        for i in range(warmup + n):
            t0 = time.perf_counter_ns()
            (x + 1).item()
            t1 = time.perf_counter_ns()
            mx.eval(x + 1)  # the same submission without reading the value back (a side figure)
            t2 = time.perf_counter_ns()
            if i >= warmup:
                times.append((t1 - t0) / 1e6)
                eval_only.append((t2 - t1) / 1e6)
    times.sort()
    q = statistics.quantiles(times, n=20)  # 5% steps: q[1] = p10, q[4] = p25, q[14] = p75, q[17] = p90
    info = {**backends.device_description(dev), **_ledger_keys(dev), "python": sys.version.split()[0]}
    return {
        "ms": statistics.median(times),
        "p10_ms": q[1],
        "p90_ms": q[17],
        "iqr_ms": q[14] - q[4],
        "mean_ms": statistics.fmean(times),
        "eval_only_ms": statistics.median(eval_only),
        "n": n,
        "warmup": warmup,
        "kind": "measured",
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"),
        "method": WAIT_METHOD.format(n=n, warmup=warmup),
        **info,
    }


def measure_split_price(step, x, *, n: int = 50, warmup: int = 5) -> dict:
    """What one wait costs BETWEEN two real submissions, not after a trivial one.

    ``step`` maps an MLX array to one of the same shape (say, a layer's tail). Each round
    runs it twice, dependent, both ways, interleaved:

    * split (two waits): ``y = step(x)`` evaluated and read back to the host, then
      ``step`` on ``y`` uploaded again, evaluated and read back: what an engine does
      when the host sits between two submissions;
    * joined (one wait): ``step(step(x))`` built at once, evaluated and read back.

    The price is the median of the per-round differences ``split - joined``: the round
    trip itself PLUS whatever the device loses by waiting (it idles while the host reads,
    encodes and submits the second half). :func:`measure_wait_price` measures only the
    first part, with a one-op submission. Returns ``ms`` (that median), ``p10_ms``,
    ``p90_ms``, ``split_ms`` and ``joined_ms`` (medians), ``n``.
    """
    n = integer("n", n, minimum=5)
    warmup = integer("warmup", warmup, minimum=0)
    if not callable(step):
        raise ValueError(
            f"step: must be a callable mapping an MLX array to one of the same shape, got {describe(step)}"
        )

    def split() -> None:
        y = np.asarray(step(x))  # wait 1: evaluate, read back
        np.asarray(step(mx.array(y)))  # wait 2

    def joined() -> None:
        np.asarray(step(step(x)))  # the one wait

    diffs, ss, js = [], [], []
    for i in range(warmup + n):
        t0 = time.perf_counter_ns()
        split()
        t1 = time.perf_counter_ns()
        joined()
        t2 = time.perf_counter_ns()
        if i >= warmup:
            ss.append((t1 - t0) / 1e6)
            js.append((t2 - t1) / 1e6)
            diffs.append(ss[-1] - js[-1])
    q = statistics.quantiles(sorted(diffs), n=10)
    return {
        "ms": statistics.median(diffs),
        "p10_ms": q[0],
        "p90_ms": q[8],
        "split_ms": statistics.median(ss),
        "joined_ms": statistics.median(js),
        "n": n,
        "warmup": warmup,
    }


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's garbage collector off while the block runs (collected first), as it was after."""
    import gc

    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


SPLIT_BETWEEN_METHOD = (
    "The price of one split between two real submissions A then B (as a decode step makes them): "
    "per round, split = A built and evaluated (mx.eval), what the host needs of it read (np.asarray), "
    "then B built on that output and evaluated and read (two waits); joined = B(A(x)) built at once, "
    "evaluated and read (one wait); the two interleaved, after {warmup} warm-up rounds. The price is "
    "the median over {n} rounds of split - joined: the round trip plus the device's idle time while "
    "the host reads back, builds, encodes and submits B; spread: 10th-90th percentile."
)


def measure_split_between(
    first, second, x, *, n: int = 30, warmup: int = 3, read_first=None, read_second=None, second_split=None
) -> dict:
    """What one wait costs between submission ``first`` and submission ``second``.

    ``first`` maps ``x`` to an MLX array (or a tuple/list of them); ``second`` maps that
    output to the next one. Each round times both, interleaved:

    * split (two waits): ``a = first(x)``, ``mx.eval(a)``, the host reads ``a``; then
      ``b = second(a)``, ``mx.eval(b)``, the host reads ``b``: a decode step whose plan
      puts a wait between the two;
    * joined (one wait): ``second(first(x))`` built at once, evaluated and read.

    ``second_split``: the second submission where a split puts it after the host's work,
    if that differs from the joined one (default ``second``): after Q/K/V read back, the
    host attends and uploads the branch, where the joined submission attends on the
    device; the difference is then the whole price of the round trip, host work included.

    ``read_first`` / ``read_second``: what the host reads of each side's output (a
    callable returning the arrays; default all of them): a step reads only what it
    needs (after a recurrent layer, nothing; after Q/K/V, the three), and reading a
    megabyte of recurrent state it does not need would be priced as the wait's.
    Python's garbage collector is paused while the rounds run (a collection inside one
    round is noise of a millisecond and more).

    Returns ``ms`` (median of ``split - joined``), ``p10_ms``, ``p90_ms``, ``split_ms`` and
    ``joined_ms`` (medians), ``n``, ``warmup``, ``diffs_ms`` (every round's difference) and
    ``method``. :func:`measure_split_price`
    is the same with one step on both sides and the host re-uploading between them.
    """
    n = integer("n", n, minimum=5)
    warmup = integer("warmup", warmup, minimum=0)
    second_split = second if second_split is None else second_split
    for name, fn in (("first", first), ("second", second), ("second_split", second_split)):
        if not callable(fn):
            raise ValueError(f"{name}: must be a callable building one submission's MLX arrays, got {describe(fn)}")

    def everything(out):
        return out if isinstance(out, (tuple, list)) else (out,)

    pick_first = everything if read_first is None else read_first
    pick_second = everything if read_second is None else read_second

    def read(arrays) -> None:
        for a in arrays:
            np.asarray(a)

    def split() -> list[int]:
        t = [time.perf_counter_ns()]
        a = first(x)
        t.append(time.perf_counter_ns())
        mx.eval(a)
        t.append(time.perf_counter_ns())
        read(pick_first(a))
        t.append(time.perf_counter_ns())
        b = second_split(a)
        t.append(time.perf_counter_ns())
        mx.eval(b)
        t.append(time.perf_counter_ns())
        read(pick_second(b))
        t.append(time.perf_counter_ns())
        return t

    def joined() -> list[int]:
        t = [time.perf_counter_ns()]
        b = second(first(x))
        t.append(time.perf_counter_ns())
        mx.eval(b)
        t.append(time.perf_counter_ns())
        read(pick_second(b))
        t.append(time.perf_counter_ns())
        return t

    diffs, ss, js = [], [], []
    phases: dict[str, list[float]] = {k: [] for k in SPLIT_PHASES + JOINED_PHASES}
    with _gc_paused():
        rounds = [(split(), joined()) for _ in range(warmup + n)]
    for i, (ts, tj) in enumerate(rounds):
        if i >= warmup:
            ss.append((ts[-1] - ts[0]) / 1e6)
            js.append((tj[-1] - tj[0]) / 1e6)
            diffs.append(ss[-1] - js[-1])
            for names, t in ((SPLIT_PHASES, ts), (JOINED_PHASES, tj)):
                for k, a, b in zip(names, t, t[1:]):
                    phases[k].append((b - a) / 1e6)
    q = statistics.quantiles(sorted(diffs), n=10)
    return {
        "ms": statistics.median(diffs),
        "p10_ms": q[0],
        "p90_ms": q[8],
        "split_ms": statistics.median(ss),
        "joined_ms": statistics.median(js),
        "n": n,
        "warmup": warmup,
        "phases_ms": {k: statistics.median(v) for k, v in phases.items()},
        # every round's split - joined, in order: what an interval for the price (and for a
        # prediction that sums such prices) resamples
        "diffs_ms": [round(d, 5) for d in diffs],
        "method": SPLIT_BETWEEN_METHOD.format(n=n, warmup=warmup),
    }


#: The host's steps in a split round and in a joined one, as ``measure_split_between``
#: times them (``phases_ms``: the median of each): building a submission's lazy graph
#: (Python and MLX's graph, the device idle unless it still runs earlier work), its
#: evaluation (encoding, submitting, and waiting for the device), the host's read.
SPLIT_PHASES = (
    "split.build_first",
    "split.eval_first",
    "split.read_first",
    "split.build_second",
    "split.eval_second",
    "split.read_second",
)
JOINED_PHASES = ("joined.build", "joined.eval", "joined.read")
