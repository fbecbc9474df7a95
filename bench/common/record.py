"""What every benchmark record carries, where it goes, and the helpers the commands share.

One place, because every record must say the same things the same way (device, date,
MLX version, the command that produced it), land in the same folder under the same kind
of name, and never replace another record unasked; and every benchmark times its
variants the same way (interleaved rounds, so drift in a shared machine's load hits each
alike). A second copy in each command would be a second place to keep in step.

Records go to the project's ``data/bench/`` (found from this file, not from the folder the
command is started in), named ``<bench>-<device>-<UTC time YYYYMMDDTHHMMSSZ>.json``, and
are written atomically and exclusively (``workbench.files``): an existing file is
replaced only with ``--force``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import mlx.core as mx
import numpy as np

from bench.common import cli
from workbench import backends
from workbench.kernels import source as kernel_source
from workbench import files
from workbench.reports import records
from workbench.waits import ledger as wait_ledger

#: The project's root and its folder of records, wherever a command is started from.
ROOT = files.PROJECT_ROOT
RECORD_DIR = records.RECORD_DIR


def slug(s: str) -> str:
    """A file-name-safe, lower-case form of ``s``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower() or "device"


def device_slug(name: str | None = None) -> str:
    """A short file-name form of a device's name (default: MLX's default device), as record
    names carry it: ``NVIDIA H200`` -> ``nvidia-h200``, ``Intel(R) Xeon(R) Processor @ 2.00GHz``
    -> ``intel-xeon`` (trademark signs, clock and the word "processor" dropped)."""
    if name is None:
        name = backends.device_description().get("device_name") or device_kind()
    name = re.sub(r"\((R|TM|tm|r)\)", " ", name).split("@")[0]
    name = re.sub(r"\b(processor|cpu)\b", " ", name, flags=re.I)
    return slug(name)[:40].strip("-") or device_kind()


def utc_stamp(when: _dt.datetime | None = None) -> str:
    """``when`` (default now) in UTC as ``YYYYMMDDTHHMMSSZ``, the one time format of record names."""
    when = when or _dt.datetime.now(_dt.timezone.utc)
    return when.astimezone(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def record_stem(bench: str, device: str | None = None, when: _dt.datetime | None = None, tag: str = "") -> str:
    """``<bench>-<device>-<UTC time>`` (and ``-<tag>`` when given): a record's file name without ``.json``."""
    return "-".join([bench, device_slug(device), utc_stamp(when)] + ([slug(tag)] if tag else []))


def device_kind() -> str:
    """``cuda``, ``metal`` or ``cpu``: which MLX backend this run measured (MLX's default device)."""
    return backends.device_kind()


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after every option's help (argparse's own formatter), the
    description's layout kept; left out where they say nothing (an off switch, None) or
    the help already says its default in words."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if any(action.default is v for v in (None, False, argparse.SUPPRESS)) or "default" in text:
            return text
        return super()._get_help_string(action)


def parser(bench: str, doc: str | None, *, writes: str | None = None, record_options: bool = True) -> argparse.ArgumentParser:
    """The argument parser every bench command starts from.

    ``prog`` is how the command is run (``python -m bench.<bench>``), defaults show in
    ``--help``, the description is the first paragraph of the module's docstring and the
    epilog says what the command writes. With ``record_options``: ``--out-dir`` (default
    the project's ``data/bench/``), ``--no-record`` and ``--force``.
    """
    first = (doc or "").strip().split("\n\n")[0]
    if writes is None:
        writes = (f"writes a JSON record (device, date, MLX version, the command line) to "
                  f"OUT_DIR/{bench}-<device>-<UTC time>.json; never replaces an existing file without --force; "
                  "also copies it to $OUT when that is set")
    p = argparse.ArgumentParser(prog=f"python -m bench.{bench}", description=first, epilog=writes,
                                formatter_class=_HelpFormatter)
    if record_options:
        add_record_options(p)
    return p


def add_record_options(p: argparse.ArgumentParser) -> None:
    """``--out-dir``, ``--no-record`` and ``--force``, the same in every command."""
    p.add_argument("--out-dir", type=cli.out_dir, default=RECORD_DIR,
                   help="the folder the JSON record goes to (default: the project's data/bench/, wherever the "
                        "command is started)")
    p.add_argument("--no-record", action="store_true", help="print only; write no JSON record")
    p.add_argument("--force", action="store_true", help="replace an existing record of the same name")


def refuse_existing(p: argparse.ArgumentParser, path: Path, force: bool) -> None:
    """The parser's usage error if ``path`` exists and ``--force`` was not given: checked
    before any measuring, so a run is never wasted on a record it may not write."""
    if Path(path).exists() and not force:
        p.error(f"{path} exists; pass --force to replace it, or name another file")


def comma_list(parser: argparse.ArgumentParser, flag: str, value: str, allowed: Iterable[str]) -> list[str]:
    """``value`` split at commas, every item one of ``allowed``; else the parser's usage error
    naming ``flag``, what was given and what is allowed (so each command says it the same way)."""
    allowed = sorted(allowed)
    items = [s.strip() for s in value.split(",") if s.strip()]
    if not items or any(s not in allowed for s in items):
        parser.error(f"{flag} must be a comma-separated list of {allowed}; got {value!r}")
    return items


def provenance(bench: str, argv: list[str] | None) -> dict[str, Any]:
    """The header of a record (``workbench.reports.records.Header``): the bench, its kind's
    schema, its exact command line, date, device, versions and the kernel text it ran
    (``kernel_source.fingerprint``). ``bench`` must be a kind of ``records.KINDS``."""
    schema = records.lookup(bench).schema
    args = argv if argv is not None else sys.argv[1:]
    now = _dt.datetime.now(_dt.timezone.utc)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "bench": bench,
        "schema": schema,
        # quoted as a shell needs it (an empty argument, a space): the line runs as written
        "command": " ".join(["python -m bench." + bench, shlex.join(args)]).rstrip(),
        "date": now.isoformat(timespec="seconds"),
        "device": backends.device_description(),
        "device_kind": device_kind(),
        "mlx_version": mx.__version__,
        "numpy_version": np.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average": list(load) if load else None,
        # MLX's settings from the environment (MLX_USE_CUDA_GRAPHS, MLX_MAX_OPS_PER_BUFFER, ...):
        # they change what a step costs without showing in the command line
        "mlx_environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MLX_")},
        # which kernel text ran (workbench.kernels.source.fingerprint): records of other text
        # say nothing about this one (a sanitizer run above all)
        "kernel_text": kernel_source.fingerprint(),
    }


def write(record: dict[str, Any], out_dir: str | Path, stem: str, *, force: bool = False) -> Path:
    """Write ``record`` as ``out_dir/stem.json`` (pretty, newline-terminated); return the path.

    First the record is checked against its kind's contract (:func:`checked`: the kind it
    names, its schema, the keys every record of the kind has), so a command whose record
    lacks a key its readers rely on fails here, in its own test, not in a notebook later.

    Atomic (``workbench.files.write_atomic``): a kill or a full disk leaves no broken
    file. An existing file is replaced only with ``force``; otherwise, should the name be
    taken by the time the run ends (two runs in the same second), the record goes to
    ``stem-2.json`` (``-3``, ...) and says so: a measurement is never thrown away and never
    replaces another. When ``$OUT`` is set, the same file is also written there: the lent
    GPU machine brings back only what a command leaves under ``$OUT``. Values JSON has no
    type for (a numpy scalar, a dataclass) are written as their ``str``: a GPU run's
    record is worth more with one field stringified than lost.
    """
    text = json.dumps(checked(record), indent=2, default=str) + "\n"
    try:
        path = _write_new(text, Path(out_dir), stem, force)
    except OSError as err:
        # A full disk or a folder gone since the arguments were checked: the measurement
        # is printed whole, so the run is not lost with the file, and the error says so.
        sys.stdout.write(text)
        raise OSError(err.errno, f"the record could not be written ({err.strerror}); its JSON is printed above",
                      str(Path(out_dir) / f"{stem}.json")) from err
    if os.environ.get("OUT") and Path(os.environ["OUT"]).resolve() != path.parent.resolve():
        # The same rule in $OUT: runs started together in one device call (one a tool, each
        # with its own out_dir) end in the same second, and their copies there once replaced
        # one another, losing all records but the last.
        _write_new(text, Path(os.environ["OUT"]), path.stem, force)
    return path


def checked(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` checked as a record of the kind it names (``records.check``), with its
    kind's current schema after ``bench`` where it has none (a command that builds its
    header without :func:`provenance`); the caller's dict is left as it is."""
    kind = records.kind_of(record)
    if kind not in records.KINDS:
        raise records.RecordError(f"record: names {'no kind' if kind is None else f'the kind {kind!r}'}; a bench "
                                  f"record names one of {sorted(records.KINDS)} by its 'bench' (or a 'python -m "
                                  "bench.NAME' command)")
    records.check(record, kind)
    if "schema" in record:
        return record
    at = list(record).index("bench") + 1 if "bench" in record else 0
    items = list(record.items())
    return dict(items[:at] + [("schema", records.KINDS[kind].schema)] + items[at:])


def _write_new(text: str, out: Path, stem: str, force: bool) -> Path:
    """``text`` as ``out/stem.json``, or (without ``force``, the name taken) as the first
    free ``stem-2.json``, ``stem-3.json``, ...; prints where it went."""
    path = out / f"{stem}.json"
    if force:
        files.write_atomic(path, text)
    else:
        for i in range(2, 1000):
            try:
                files.write_atomic(path, text, overwrite=False)
                break
            except files.RecordExists:
                taken, path = path, out / f"{stem}-{i}.json"
                print(f"record: {taken} exists (not replaced; --force replaces); writing {path.name}")
    print(f"record: {path}")
    return path


def progress(iterable: Iterable, total: int | None = None, desc: str = "") -> Iterator:
    """``iterable`` with a progress bar on stderr: tqdm where installed, else a line every
    tenth of the way (a GPU machine may have only numpy and MLX)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        n = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        step = max(1, (n or 10) // 10)
        for i, item in enumerate(iterable, 1):
            yield item
            if i % step == 0 or i == n:
                print(f"  {desc} {i}/{n if n is not None else '?'}", file=sys.stderr, flush=True)
        return
    yield from tqdm(iterable, total=total, desc=desc, leave=False, file=sys.stderr)


def time_rounds(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int,
                desc: str | None = None) -> dict[str, list[float]]:
    """Wall times (ms) of each callable, interleaved: each round runs each once, in order.
    ``desc`` shows a progress bar over the rounds (for runs longer than a few seconds)."""
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
    return {"median_ms": statistics.median(s), "min_ms": s[0], "p90_ms": s[min(len(s) - 1, int(0.9 * len(s)))],
            "n": len(s)}


#: How :func:`copy_bandwidth` measures, by the device kind MLX runs on (a record states it
#: beside the figure, :func:`copy_floor`).
COPY_METHODS = {
    "cpu": "numpy copyto between two buffers of nbytes (read + write), median of the repeats",
    "gpu": "MLX x + 1 over nbytes of float32, one evaluation a repeat (read + write), median of the repeats",
}


def copy_method() -> str:
    """How :func:`copy_bandwidth` measures on this machine: one of :data:`COPY_METHODS`' texts."""
    return COPY_METHODS["cpu" if device_kind() == "cpu" else "gpu"]


def copy_bandwidth(nbytes: int = 1 << 28, repeats: int = 5) -> float:
    """This device's streaming bandwidth in bytes/s, counted as one read and one write of
    ``nbytes``, median of ``repeats`` (after one warm-up); :func:`copy_method` says how.

    On the CPU the copy is numpy's ``copyto`` (a ``memcpy``): MLX's CPU ``x + 1`` moves a
    seventh of the machine's rate (1.4 against 10 GB/s, journal 2026-12-02 "the Bonsai-27B
    float64 path, lean"), and a floor divided by it would flatter every CPU path sevenfold.
    On a GPU the copy is MLX's ``x + 1`` on the device, as the kernels' floors have used.
    """
    nbytes = int(nbytes)
    if nbytes < 1 or repeats < 1:
        raise ValueError(f"copy_bandwidth: nbytes and repeats must be >= 1, got {nbytes} and {repeats}")
    times = []
    if device_kind() == "cpu":
        src = np.ones(max(1, nbytes // 8), dtype=np.float64)  # written once, so its pages are real
        dst = np.empty_like(src)
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            if i:
                times.append(time.perf_counter() - t0)
        return 2 * src.nbytes / statistics.median(times)
    x = mx.zeros((max(1, nbytes // 4),), dtype=mx.float32)
    mx.eval(x)
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        mx.eval(x + 1)
        if i:
            times.append(time.perf_counter() - t0)
    return 2 * x.nbytes / statistics.median(times)


def copy_floor(nbytes: int = 1 << 28, repeats: int = 5) -> dict[str, Any]:
    """:func:`copy_bandwidth` with what a record states beside it: the method, the bytes and
    the repeats (``{"bytes_per_s", "method", "nbytes", "repeats"}``)."""
    return {"bytes_per_s": copy_bandwidth(nbytes, repeats), "method": copy_method(), "nbytes": int(nbytes),
            "repeats": int(repeats)}


def project_relative(path: str | Path) -> str:
    """``path`` relative to the project when it lies inside it (what a record or a ledger
    entry should say: the project speaks for itself), else as given."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def add_to_ledger(p: argparse.ArgumentParser, entry: dict[str, Any], ledger: str | Path | None,
                  force: bool) -> dict[str, Any] | None:
    """Put ``entry`` into the wait-price ledger (``wait_ledger.add_price``: checked, under a lock),
    say so, and say what it replaced; a refusal is ``p``'s usage error naming ``--add``.
    The one way every bench files a price, so each says it the same way."""
    try:
        old = wait_ledger.add_price(entry, ledger, replace=force)
    except ValueError as err:
        p.error(f"--add: {err}" + ("" if force else " (--force replaces it)"))
    print(f"added {entry['id']}: {entry['ms']:.4f} ms to {ledger or wait_ledger.LEDGER_PATH}")
    if old is not None:
        print(f"replaced {old['id']}: {old['ms']:.4f} ms, measured {old.get('date')} "
              f"by {old.get('command', old.get('source'))}")
    return old
