"""A benchmark record: what every one carries, its name, and writing it.

One place, because every record must say the same things the same way (device, date,
MLX version, the command that produced it), land in the same folder under the same kind
of name, and never replace another record unasked. A second copy in each command would
be a second place to keep in step.

Records go to the project's ``data/bench/`` (found from this file, not from the folder the
command is started in), named ``<bench>-<device>-<UTC time YYYYMMDDTHHMMSSZ>.json``, and
are written atomically and exclusively (``workbench.files``): an existing file is
replaced only with ``--force``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import backends, files
from workbench.kernels import fingerprint
from workbench.reports import records

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
    when = when or _dt.datetime.now(_dt.UTC)
    return when.astimezone(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def record_stem(bench: str, device: str | None = None, when: _dt.datetime | None = None, tag: str = "") -> str:
    """``<bench>-<device>-<UTC time>`` (and ``-<tag>`` when given): a record's file name without ``.json``."""
    return "-".join([bench, device_slug(device), utc_stamp(when)] + ([slug(tag)] if tag else []))


def device_kind() -> str:
    """``cuda``, ``metal`` or ``cpu``: which MLX backend this run measured (MLX's default device)."""
    return backends.device_kind()


def provenance(bench: str, argv: list[str] | None) -> dict[str, Any]:
    """The header of a record (``workbench.reports.records.Header``): the bench, its kind's
    schema, its exact command line, date, device, versions and the kernel text it ran
    (``kernel_source.fingerprint``). ``bench`` must be a kind of ``records.KINDS``."""
    schema = records.lookup(bench).schema
    args = argv if argv is not None else sys.argv[1:]
    now = _dt.datetime.now(_dt.UTC)
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
        "kernel_text": fingerprint(),
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
        raise OSError(
            err.errno,
            f"the record could not be written ({err.strerror}); its JSON is printed above",
            str(Path(out_dir) / f"{stem}.json"),
        ) from err
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
        raise records.RecordError(
            f"record: names {'no kind' if kind is None else f'the kind {kind!r}'}; a bench "
            f"record names one of {sorted(records.KINDS)} by its 'bench' (or a 'python -m "
            "bench.NAME' command)"
        )
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


def project_relative(path: str | Path) -> str:
    """``path`` relative to the project when it lies inside it (what a record or a ledger
    entry should say: the project speaks for itself), else as given."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
