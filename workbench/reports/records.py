"""The contract between the bench commands that write records and the reports that read them.

A bench record is one JSON object in the project's ``data/bench/``, written by ``python -m
bench.NAME`` (through ``bench.common.record``) as ``NAME-<device>-<UTC time>.json``. Its
*kind* (:data:`KINDS`) has a schema version and the top-level keys every record of the kind
carries; the writer stamps the schema and checks the record, and every reader checks it
before reading, so a record of another kind, of a newer layout, or without a promised key is
one clear :class:`RecordError` at either end, not a ``KeyError`` deep inside a table.
:func:`check`'s rules: the **kind** is the record's ``"bench"`` string, or, where that holds
results or is absent (some ``gpu_check``, ``kernel_bench`` and ``wait_price`` records), the
module of its ``command``; the **schema** is ``"schema"``, 1 where absent, and a reader reads
every schema up to its kind's; the **keys** are those every committed record of the kind has
(keys only some have are read with ``.get`` by the report that needs them). Notebooks show
a record through :func:`load` / :func:`load_all` / :func:`newest` and :func:`headline`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from workbench import files
from workbench.validate import describe

__all__ = [
    "KINDS",
    "RECORD_DIR",
    "Header",
    "RecordError",
    "RecordKind",
    "check",
    "headline",
    "kind_of",
    "load",
    "load_all",
    "lookup",
    "newest",
    "stamp",
]

#: The project's folder of bench records, wherever the process was started.
RECORD_DIR = files.DATA_DIR / "bench"


class RecordError(ValueError):
    """A record that is not what its reader or writer expects: another kind, a newer
    schema, a missing key, or a file that is missing, not JSON or not a JSON object."""


class Header(TypedDict, total=False):
    """What ``bench.common.record.provenance`` puts at the top of every record it makes
    (older records lack the keys added since; :data:`KINDS` says which each kind has)."""

    bench: str  # the command: python -m bench.<bench>
    schema: int  # the kind's schema when written (absent: 1)
    command: str  # the exact command line
    date: str  # ISO 8601, UTC (a day alone in schedule_run and wait_price records)
    device: Any  # backends.device_description() (a dict); the device's name (a str) in some kinds
    device_kind: str  # cuda, metal or cpu
    mlx_version: str
    numpy_version: str
    python: str
    cpu_count: int
    load_average: list  # the host's 1, 5 and 15 minute load when the run started
    kernel_text: str  # workbench.kernels.source.fingerprint() of the kernels that ran


@dataclass(frozen=True)
class RecordKind:
    """One kind of bench record: ``name`` is the bench command that writes it, ``schema``
    the newest layout this workbench reads and writes, ``keys`` the top-level keys every
    record of the kind has, ``description`` one line of what a record holds, and
    ``also_named`` the file-name patterns its records once had beside ``<name>-*.json``."""

    name: str
    schema: int
    keys: tuple[str, ...]
    description: str
    also_named: tuple[str, ...] = ()

    @property
    def patterns(self) -> tuple[str, ...]:
        """The file-name patterns of this kind's records in a folder."""
        return (f"{self.name}-*.json", *self.also_named)


# Header keys by how long the writers have written them: every record has _HEAD (the
# first wait_price records lack "bench"); _PROVENANCE is provenance's header without the
# kernel text, which only records made since it was added carry.
_HEAD = ("bench", "command", "date", "device", "mlx_version")
_PROVENANCE = (*_HEAD, "device_kind", "numpy_version", "python", "cpu_count", "load_average")
_ROW_DOT = (
    "what",
    "shape",
    "threads",
    "blocks",
    "chain",
    "repeats",
    "seed",
    "weight_bytes",
    "copy_bandwidth_Bps",
    "floor_ms",
    "check_tol",
    "variants",
    "all_checks_passed",
)

KINDS: dict[str, RecordKind] = {
    k.name: k
    for k in (
        RecordKind(
            "gpu_check",
            1,
            (*_HEAD, "what", "device_info", "dialect", "seed", "checks", "checks_passed", "seconds"),
            "the kernels checked against the float64 oracle on a GPU (and, unless --checks-only, the "
            "benchmark's results under 'bench')",
        ),
        RecordKind(
            "kernel_bench",
            1,
            (*_PROVENANCE, "what", "dialect"),
            "the tail timed in every weight format against its floor (the results under 'bench')",
        ),
        RecordKind(
            "kernel_bodies",
            1,
            (
                *_PROVENANCE,
                "what",
                "device_info",
                "dialect",
                "mlx_ptx_cache_dir",
                "old_dir",
                "mlx_names",
                "same_text",
                "copy_bandwidth_Bps",
                "tuning",
                "shape",
                "fold_block",
                "rounds",
                "seed",
                "cases",
                "checks_passed",
            ),
            "an older kernels/ text against the current one: same bits, then device time",
        ),
        RecordKind(
            "launch_profile",
            1,
            (*_PROVENANCE, "what", "ncu_command", "returncode", "table", "launches", "output_tail"),
            "each tail launch once under Nsight Compute: time, DRAM bytes, and with --stalls the scheduler",
        ),
        # a run whose checks failed stops before timing: its cases, sweeps and bandwidth are absent
        RecordKind(
            "one_launch",
            1,
            (*_PROVENANCE, "what", "formats", "checks", "all_checks_passed"),
            "the tail as one CUDA launch against its three launches: checks, shape sweep, timings",
        ),
        RecordKind(
            "real_model",
            1,
            (*_PROVENANCE, "model", "checkpoint", "prompt", "prompt_tokens", "bandwidth_bytes_per_s", "decode", "tail"),
            "a real checkpoint's decode and one layer's tail, each variant against float64",
        ),
        RecordKind(
            "sanitize",
            1,
            (*_PROVENANCE, "what", "shapes", "formats", "all_clean"),
            "compute-sanitizer's tools over the kernels' cases: which runs were clean",
        ),
        RecordKind(
            "sass_counts",
            1,
            (
                *_PROVENANCE,
                "kernel_text",
                "what",
                "nvcc",
                "cuobjdump",
                "arch",
                "shape",
                "old_dir",
                "old_kernel_text",
                "classes",
                "rows",
            ),
            "registers and the row loops' instructions of each kernel as nvcc compiles it, old text and new",
        ),
        RecordKind(
            "schedule_run",
            1,
            (
                *_HEAD,
                "backend",
                "model",
                "geometry",
                "geometry_values",
                "dtype",
                "weights",
                "weight_bytes_per_token",
                "eligible",
                "gdn",
                "tokens_per_round",
                "rounds",
                "warmup",
                "context",
                "price",
                "stages",
                "comparisons",
                "fit",
                "all_waits_match",
            ),
            "the decode schedule stage by stage: waits made against predicted, ms a token, savings",
            also_named=("schedule-*.json",),
        ),
        RecordKind(
            "emulator_cost",
            1,
            (*_PROVENANCE, "what", "target_ms", "cold_ms", "ratio", "results"),
            "the Metal emulator's cost an emulated tail, beside the graph tail",
        ),
        RecordKind(
            "check_rate",
            1,
            (*_HEAD, "numpy_version", "python", "cpu_count", "target", "notes", "results"),
            "how fast a user's numpy tail is checked, beside the graph sweep of the same cases",
        ),
        RecordKind(
            "check_shapes",
            1,
            (*_PROVENANCE, "target", "notes", "floor", "results"),
            "the tail's check at shipped shapes: seconds a seed beside a plain loop's floor, with and without faults, "
            "peak memory",
        ),
        RecordKind(
            "check_bonsai_pack",
            1,
            (*_HEAD, "numpy_version", "python", "cpu_count", "target", "notes", "results"),
            "a Hadamard pack's layer at Bonsai-27B's shape checked in one call: seconds, peak memory, verdict",
        ),
        RecordKind(
            "check_cluster",
            1,
            (*_HEAD, "numpy_version", "python", "cpu_count", "target", "notes", "results"),
            "the check on a Dask LocalCluster beside one serial process: rates, the same bits, projected hours",
        ),
        RecordKind(
            "check_gdn_rate",
            1,
            (*_HEAD, "numpy_version", "python", "cpu_count", "target", "notes", "results"),
            "the recurrent step's check's own cost over a run of tokens, beside the oracle and the ops step",
        ),
        RecordKind(
            "split_price",
            1,
            (*_PROVENANCE, "method", "results"),
            "the price of one wait between two real submissions, a step and shape each",
        ),
        RecordKind(
            "sweep_rate",
            1,
            (*_HEAD, "numpy_version", "python", "cpu_count", "target", "notes", "results", "mutation_catch_rates"),
            "how fast the error sweep runs, and how often it catches planted mistakes",
        ),
        RecordKind(
            "tail_bench",
            1,
            (
                *_HEAD,
                "numpy_version",
                "python",
                "cpu_count",
                "backends_available",
                "copy_bandwidth_GBps",
                "bandwidth_measured",
                "notes",
                "results",
            ),
            "the tail unfused, fused and resident against its floor, shape by shape",
        ),
        RecordKind(
            "tensor_core_rowdot",
            1,
            (*_PROVENANCE, "kernel_text", *_ROW_DOT, "units"),
            "a tensor-core row dot for affine 4-bit weights beside the kernels' and MLX's",
        ),
        RecordKind(
            "async_copy_rowdot",
            1,
            (*_PROVENANCE, "kernel_text", *_ROW_DOT, "stages", "shared_bytes"),
            "a row dot fed by asynchronous copies beside the kernels' and the tensor cores'",
        ),
        RecordKind(
            "launch_host_cost",
            1,
            (*_PROVENANCE, "what", "links", "repeats", "variants", "all_checks_passed"),
            "what one custom-kernel launch costs the host: its text's length, its inputs, mx.compile",
        ),
        RecordKind(
            "wait_price",
            1,
            (
                "command",
                "date",
                "device",
                "mlx_version",
                "mlx_device",
                "backend",
                "python",
                "kind",
                "method",
                "ms",
                "p10_ms",
                "p90_ms",
                "iqr_ms",
                "mean_ms",
                "eval_only_ms",
                "n",
                "warmup",
                "record",
            ),
            "the price of one wait: the smallest submission and its round trip, n times",
        ),
    )
}

_COMMAND = re.compile(r"python -m bench\.(\w+)")


def lookup(kind: str) -> RecordKind:
    """The :class:`RecordKind` named ``kind``, or a ValueError listing the kinds."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"kind: must be one of {sorted(KINDS)}, got {describe(kind)}")
    return KINDS[kind]


def kind_of(record: Any) -> str | None:
    """The kind ``record`` names (its ``"bench"`` string, else its command's ``bench.NAME``),
    or None where it names none (not a dict, or neither key)."""
    if not isinstance(record, Mapping):
        return None
    if isinstance(record.get("bench"), str):
        return record["bench"]
    found = _COMMAND.match(record["command"]) if isinstance(record.get("command"), str) else None
    return found.group(1) if found else None


def check(record: Any, kind: str, *, name: str = "record") -> dict[str, Any]:
    """``record`` unchanged if it is a ``kind`` record this workbench reads, else a
    :class:`RecordError` that starts with ``name`` (what the caller calls it) and says what
    is wrong: not a dict, another kind or none, a newer schema, missing keys."""
    spec = lookup(kind)
    if not isinstance(record, Mapping):
        raise RecordError(f"{name}: must be a {kind!r} record (a dict), got {describe(record)}")
    found = kind_of(record)
    if found is None:
        raise RecordError(
            f"{name}: names no kind (no 'bench' and no 'python -m bench.NAME' command), "
            f"expected {kind!r}; got {describe(record)}"
        )
    if found != kind:
        raise RecordError(f"{name}: is a {found!r} record, expected {kind!r}")
    schema = record.get("schema", 1)
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        raise RecordError(f"{name}: schema must be an integer >= 1, got {describe(schema)}")
    if schema > spec.schema:
        raise RecordError(
            f"{name}: schema {schema}; this workbench reads {kind!r} records up to schema "
            f"{spec.schema}: update the workbench"
        )
    missing = [k for k in spec.keys if k not in record]
    if missing:
        raise RecordError(f"{name}: a {kind!r} record must have {missing}; it lacks them")
    return record


def _folder(folder: str | os.PathLike | None) -> Path:
    if folder is None:
        return RECORD_DIR
    if not isinstance(folder, (str, os.PathLike)):
        raise ValueError(
            f"folder: must be a path (str or Path) or None for the project's data/bench, got {describe(folder)}"
        )
    return Path(folder)


def _read(path: Path, kind: str) -> dict[str, Any]:
    """The record in ``path``, checked as a ``kind`` record, with its ``file`` name added."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordError(f"no record {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise RecordError(f"record {path} cannot be read ({err})") from None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as err:
        raise RecordError(f"record {path} is not valid JSON ({err})") from None
    if not isinstance(rec, dict):
        raise RecordError(f"record {path} is not a JSON object (it holds {type(rec).__name__})")
    check(rec, kind, name=path.name)
    return rec | {"file": path.name}


def load(kind: str, name: str | os.PathLike, folder: str | os.PathLike | None = None) -> dict[str, Any]:
    """One ``kind`` record, checked, with its ``file`` name added. ``name`` is the record's
    name as its bench wrote it, ``<kind>-<device>-<UTC time>`` (``"one_launch-nvidia-h200-
    YYYYMMDDTHHMMSSZ"``; ``.json`` may be given too), looked up in ``folder`` (default the
    project's ``data/bench``), or a path with a folder in it, read as given. So a notebook
    names the evidence it shows and never a file. :class:`RecordError` for a missing
    record, bad JSON, a non-object or a record that fails :func:`check`."""
    lookup(kind)
    if not isinstance(name, (str, os.PathLike)) or not str(name):
        raise ValueError(f"name: must be a record's file name or path, got {describe(name)}")
    given = Path(name)
    if given.parent == Path("."):
        given = _folder(folder) / (given.name if given.suffix == ".json" else f"{given.name}.json")
    path = given
    if not path.exists() and path.parent.is_dir():
        kin = sorted(p.name for pat in KINDS[kind].patterns for p in path.parent.glob(pat))
        hint = (
            f"; its {kind!r} records run from {kin[0]} to {kin[-1]} ({len(kin)})"
            if kin
            else f"; it holds no {kind!r} record"
        )
        raise RecordError(f"no record {path}{hint}")
    return _read(path, kind)


def load_all(kind: str, folder: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """Every ``kind`` record in ``folder`` (default the project's ``data/bench``; files named
    by :attr:`RecordKind.patterns`), sorted by file name, each checked and with its ``file``
    name added; ``[]`` where there is none. :class:`RecordError` for a missing folder or a
    file that is not such a record (naming it)."""
    spec = lookup(kind)
    root = _folder(folder)
    if not root.is_dir():
        raise RecordError(f"folder: {root} is not a folder (of {kind!r} records)")
    paths = sorted({p for pattern in spec.patterns for p in root.glob(pattern)}, key=lambda p: p.name)
    return [_read(p, kind) for p in paths]


def _when(rec: Mapping[str, Any]) -> _dt.datetime:
    """A record's date as an aware datetime (a day alone: its start, UTC)."""
    try:
        when = _dt.datetime.fromisoformat(rec["date"])
    except (TypeError, ValueError):
        raise RecordError(
            f"{rec.get('file', 'record')}: date must be an ISO 8601 date, got {describe(rec['date'])}"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=_dt.UTC)


def newest(
    kind: str, folder: str | os.PathLike | None = None, where: Callable[[dict[str, Any]], bool] | None = None
) -> dict[str, Any]:
    """The newest of :func:`load_all`'s records for which ``where(record)`` is true (every
    one without ``where``): the latest ``date``, the file name breaking ties (a date that is
    a day alone, two devices in one second). :class:`RecordError` where none is."""
    if where is not None and not callable(where):
        raise ValueError(f"where: must be a function of a record returning a bool, or None, got {describe(where)}")
    chosen = [r for r in load_all(kind, folder) if where is None or where(r)]
    if not chosen:
        raise RecordError(f"no {kind!r} record in {_folder(folder)}" + (" satisfies where" if where else ""))
    return max(chosen, key=lambda r: (_when(r), r["file"]))


#: A record's UTC time as its name ends: ``...-YYYYMMDDTHHMMSSZ`` (``-2`` where a second
#: record of the same second was written beside it).
_STAMP = re.compile(r"-(\d{8}T\d{6}Z)(?:-\d+)?(?:\.json)?$")


def stamp(record: Mapping[str, Any]) -> str:
    """The UTC time in a loaded record's name (``"YYYYMMDDTHHMMSSZ"``): how tables tell a
    kind's runs apart in one column. :class:`RecordError` for a record loaded from no file
    or whose name carries no time (the first records, such as ``schedule-cpu.json``)."""
    name = record.get("file") if isinstance(record, Mapping) else None
    found = _STAMP.search(name) if isinstance(name, str) else None
    if found is None:
        raise RecordError(
            f"record: must be loaded from a file named <kind>-<device>-<UTC time>.json, got {describe(name)}"
        )
    return found.group(1)


def headline(record: Mapping[str, Any]) -> str:
    """The one line a notebook prints about a record: its file name (where it was loaded
    from one), device, date, MLX version and command as a reader reruns it
    (``files.command_shown``). ``tables.wrap`` fits it to the page."""
    kind = kind_of(record)
    if kind not in KINDS:
        raise RecordError(
            f"record: must be a record of one of the kinds {sorted(KINDS)}, got "
            + (describe(record) if kind is None else f"a {kind!r} record")
        )
    check(record, kind)
    device = record["device"]
    if isinstance(device, Mapping):
        device = device.get("device_name") or device.get("mlx_device") or "?"
    when = _when(record).astimezone(_dt.UTC)
    shown = when.strftime("%Y-%m-%d") if len(str(record["date"])) <= 10 else when.strftime("%Y-%m-%d %H:%M UTC")
    where = f"{record['file']}: " if record.get("file") else ""
    return f"{where}{device}, {shown}, MLX {record['mlx_version']}, command: {files.command_shown(record['command'])}"
