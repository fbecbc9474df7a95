"""What every benchmark record carries, and the timing helpers they share.

One place, because every record must say the same things the same way (device, date,
MLX version, the command that produced it) and every benchmark times its variants the
same way (interleaved rounds, so drift in a shared machine's load hits each alike); a
second copy in each command would be a second place to keep in step.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import mlx.core as mx
import numpy as np

from workbench import backends


def slug(s: str) -> str:
    """A file-name-safe, lower-case form of ``s``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower() or "device"


def device_kind() -> str:
    """``cuda``, ``metal`` or ``cpu``: which MLX backend this run measured (MLX's default device)."""
    return backends.device_kind()


def comma_list(parser: argparse.ArgumentParser, flag: str, value: str, allowed: Iterable[str]) -> list[str]:
    """``value`` split at commas, every item one of ``allowed``; else the parser's usage error
    naming ``flag``, what was given and what is allowed (so each command says it the same way)."""
    allowed = sorted(allowed)
    items = [s.strip() for s in value.split(",") if s.strip()]
    if not items or any(s not in allowed for s in items):
        parser.error(f"{flag} must be a comma-separated list of {allowed}; got {value!r}")
    return items


def provenance(bench: str, argv: list[str] | None) -> dict[str, Any]:
    """The header of a record: the bench, its exact command line, date, device and versions."""
    args = argv if argv is not None else sys.argv[1:]
    now = _dt.datetime.now(_dt.timezone.utc)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "bench": bench,
        "command": " ".join(["python -m bench." + bench, *args]),
        "date": now.isoformat(timespec="seconds"),
        "device": backends.device_description(),
        "device_kind": device_kind(),
        "mlx_version": mx.__version__,
        "numpy_version": np.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average": list(load) if load else None,
    }


def write(record: dict[str, Any], out_dir: str | Path, stem: str) -> Path:
    """Write ``record`` as ``out_dir/stem.json`` (pretty, newline-terminated); return the path.

    When ``$OUT`` is set, the same file is also written there: the lent GPU machine brings
    back only what a command leaves under ``$OUT``, so a record made there must land in it.
    Values JSON has no type for (a numpy scalar, a dataclass) are written as their
    ``str``: a GPU run's record is worth more with one field stringified than lost.
    """
    text = json.dumps(record, indent=2, default=str) + "\n"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    path.write_text(text)
    print(f"record: {path}")
    if os.environ.get("OUT"):
        copy = Path(os.environ["OUT"]) / path.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(text)
        print(f"record: {copy}")
    return path


def time_rounds(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int) -> dict[str, list[float]]:
    """Wall times (ms) of each callable, interleaved: each round runs each once, in order."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            out[name].append((time.perf_counter() - t0) * 1e3)
    return out


def summarize(ts: list[float]) -> dict[str, float]:
    """Median, minimum and 90th percentile (ms) of a list of times, and how many."""
    s = sorted(ts)
    return {"median_ms": statistics.median(s), "min_ms": s[0], "p90_ms": s[min(len(s) - 1, int(0.9 * len(s)))],
            "n": len(s)}


def copy_bandwidth(nbytes: int = 1 << 28, repeats: int = 5) -> float:
    """This device's streaming bandwidth in bytes/s: ``x + 1`` over ``nbytes`` of float32,
    counted as one read and one write, median of ``repeats`` (after one warm-up)."""
    x = mx.zeros((nbytes // 4,), dtype=mx.float32)
    mx.eval(x)
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        mx.eval(x + 1)
        if i:
            times.append(time.perf_counter() - t0)
    return 2 * nbytes / statistics.median(times)
