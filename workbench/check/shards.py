"""A check split into shards that merge, kept in columnar files, and resumed when interrupted.

10,000 seeds at a shipped shape are hours of work: they run as shards (``seeds=range(a, b)``,
``--seeds A:B``) on several processes or machines, each a :class:`CheckReport` (or a record
with its per-case tables in Parquet, :func:`write_tables`, read back by :func:`read_report`),
and :func:`merge_reports` gives the report of their union with the same bits as one run over
it: the verdict, the sign tests, the calibration and the determinism are all computed again
from the union's per-case rows (:func:`workbench.check.report.build_report`), never averaged
from the shards' aggregates, which would not give the same quantiles or calibration.

The row order is the one a run gives (:func:`canonical`): configurations in the order first
seen, seeds ascending within each (one run over ``range(a, b)``), the fault models' rows
fault by fault. A case's row does not depend on which block or shard computed it
(``workbench.check.blocks`` gives each case the bits it has alone), so the union is the same
bits however it was cut.

An interrupted run resumes from its :class:`Journal`: a folder where each finished block of
cases is written (its tables in Parquet, then a marker naming its seeds, so a block killed
mid-write is not counted), tagged with what the rows depend on; the run started again with
the same arguments skips the seeds it finds done.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench import files
from workbench.check.report import CheckReport, build_report

#: The columns that name a case's configuration in the tables.
CONFIG_COLUMNS: tuple[str, ...] = ("hidden", "branch", "ffn", "dtype", "fold", "quant")


def _first_seen(frame: Any, columns: Sequence[str]) -> np.ndarray:
    """Each row's index among the distinct values of ``columns``, in the order first seen."""
    if not len(frame):
        return np.zeros(0, dtype=np.int64)
    keys = list(zip(*(frame[c].tolist() for c in columns), strict=True))
    ids: dict[Any, int] = {}
    return np.array([ids.setdefault(k, len(ids)) for k in keys], dtype=np.int64)


def canonical(cases: Any, faults: Any, seed_order: Any = None) -> tuple[Any, Any]:
    """``cases`` and ``faults`` in a run's row order: configuration (first seen), then seed
    (``seed_order``: seed -> position; ``None``: ascending), the faults' rows fault by fault
    (first seen) within a configuration; the rows of one case (its input scales) keep their order."""

    def pos(frame: Any) -> np.ndarray:
        s = frame["seed"].to_numpy()
        return s if seed_order is None else np.array([seed_order[int(v)] for v in s], dtype=np.int64)

    c_order = np.lexsort((pos(cases), _first_seen(cases, CONFIG_COLUMNS)))
    out_cases = cases.iloc[c_order].reset_index(drop=True)
    if faults is None or not len(faults):
        return out_cases, faults
    f_order = np.lexsort((pos(faults), _first_seen(faults, ["fault"]), _first_seen(faults, CONFIG_COLUMNS)))
    return out_cases, faults.iloc[f_order].reset_index(drop=True)


def _user(report: CheckReport) -> tuple[str, float] | None:
    user = report.tolerances.get("user's")
    return None if user is None else (str(user[0]), float(user[1]))


def merge_reports(reports: Sequence[CheckReport]) -> CheckReport:
    """The report of the union of disjoint shards (the same subject, tolerance, flake rate and
    checks, on disjoint seeds of each configuration): the same bits as one run over the union
    (seeds ascending). ``ValueError`` naming ``reports`` for shards that do not fit together."""
    reports = list(reports) if not isinstance(reports, (str, bytes)) else []
    if not reports or not all(isinstance(r, CheckReport) for r in reports):
        raise ValueError("reports: must be a non-empty sequence of CheckReport (shards of one check)")
    first = reports[0]
    for i, r in enumerate(reports[1:], 1):
        for what, a, b in (
            ("subject", first.subject, r.subject),
            ("form", first.kind, r.kind),
            ("user's tolerance", _user(first), _user(r)),
            ("flake rate", first.flake_rate, r.flake_rate),
            ("checks", first.checked, r.checked),
            ("input scales", sorted(set(first.cases["scale"])), sorted(set(r.cases["scale"]))),
        ):
            if a != b:
                raise ValueError(f"reports: shard {i} differs from shard 0 in its {what} ({b!r}, not {a!r})")
    reports.sort(key=lambda r: int(r.cases["seed"].min()) if len(r.cases) else 0)
    import pandas as pd

    cases = pd.concat([r.cases for r in reports], ignore_index=True)
    keys = cases[list(CONFIG_COLUMNS) + ["seed", "scale"]]
    dup = keys.duplicated()
    if dup.any():
        row = cases[dup].iloc[0]
        raise ValueError(
            f"reports: the shards overlap (seed {int(row['seed'])} at scale {row['scale']:g}, shape "
            f"({row['hidden']}, {row['branch']}, {row['ffn']}) {row['dtype']} fold {row['fold']} quant "
            f"{row['quant']} is in two of them); shards must hold disjoint seeds"
        )
    fault_frames = [r.faults for r in reports if r.faults is not None and len(r.faults)]
    faults = pd.concat(fault_frames, ignore_index=True) if fault_frames else None
    cases, faults = canonical(cases, faults)
    out = build_report(
        cases,
        faults,
        [p for r in reports for p in r.problems],
        _user(first),
        first.flake_rate,
        first.subject,
        first.kind,
        checked=first.checked,
    )
    out.reproducers = [p for r in reports for p in r.reproducers]
    return out


def _parquet(frame: Any) -> bytes:
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()


def _read_parquet(path: Path) -> Any:
    import pandas as pd

    return pd.read_parquet(path)


def table_paths(record: str | Path) -> dict[str, Path]:
    """The Parquet files beside ``record`` (``check.json`` -> ``check.cases.parquet``, ``check.faults.parquet``)."""
    rec = Path(record)
    stem = rec.name[: -len(rec.suffix)] if rec.suffix else rec.name
    return {t: rec.with_name(f"{stem}.{t}.parquet") for t in ("cases", "faults")}


def write_tables(report: CheckReport, record: str | Path) -> dict[str, str]:
    """The report's per-case tables as Parquet files beside ``record`` (never over a file):
    table -> file name, for the record's ``tables``."""
    import pandas as pd

    paths = table_paths(record)
    faults = report.faults if report.faults is not None else pd.DataFrame()
    for name, frame in (("cases", report.cases), ("faults", faults)):
        files.write_atomic(paths[name], _parquet(frame), overwrite=False)
    return {k: p.name for k, p in paths.items()}


def read_report(record: str | Path) -> CheckReport:
    """The :class:`CheckReport` a record (JSON, with its ``tables`` in Parquet beside it) holds:
    the verdict and every table computed again from its per-case rows (the same bits as the run's)."""
    rec = Path(record)
    try:
        data = json.loads(rec.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"record: cannot read {rec} as a check's JSON record ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != "check" or "tables" not in data:
        raise ValueError(f"record: {rec} is not a check's record with its per-case tables (no 'tables')")
    tables = {}
    for name in ("cases", "faults"):
        path = rec.with_name(str(data["tables"][name]))
        try:
            tables[name] = _read_parquet(path)
        except (OSError, ValueError) as e:
            raise ValueError(f"record: its {name} table {path} cannot be read ({e})") from None
    user = data.get("tolerances", {}).get("user's")
    out = build_report(
        tables["cases"],
        tables["faults"] if len(tables["faults"].columns) else None,
        list(data.get("problems", [])),
        None if user is None else (str(user[0]), float(user[1])),
        float(data.get("flake_rate", 1e-4)),
        str(data.get("subject", "?")),
        str(data.get("form", "callable")),
        checked=list(data.get("checked", [])),
    )
    out.reproducers = list(data.get("reproducers", []))
    return out


def seeds_digest(seeds: np.ndarray) -> str:
    """A short digest of a run's seeds (in order), for a journal's tag."""
    return hashlib.sha256(np.ascontiguousarray(seeds, dtype=np.int64).tobytes()).hexdigest()[:16]


class Journal:
    """A folder where a run writes each finished block, so an interrupted run resumes.

    ``tag``: what the run's rows depend on (subject, configurations, seeds, scales, faults,
    eps, second run): a folder holding another run's blocks is refused, naming the first
    difference, rather than mixed in."""

    META = "journal.json"

    def __init__(self, folder: str | Path, tag: dict[str, Any]):
        self.folder = Path(folder)
        if self.folder.exists() and not self.folder.is_dir():
            raise ValueError(f"journal: {self.folder} exists and is not a folder")
        tag = json.loads(json.dumps(tag))  # as it reads back
        meta = self.folder / self.META
        if meta.exists():
            try:
                held = json.loads(meta.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ValueError(f"journal: {meta} cannot be read ({e})") from None
            for k in sorted(set(held) | set(tag)):
                if held.get(k) != tag.get(k):
                    raise ValueError(
                        f"journal: {self.folder} holds a run with another {k} ({held.get(k)!r}, this run "
                        f"{tag.get(k)!r}); give a new folder, or remove it to start again"
                    )
        self.failed = ""  # why the journal stopped being written (a full disk): the run goes on without it
        if not meta.exists():
            self._write(meta, json.dumps(tag, indent=1) + "\n")
        self.blocks: dict[int, list[tuple[np.ndarray, Any, Any, list[str]]]] = {}
        for marker in sorted(self.folder.glob("block-*.json")):
            done = json.loads(marker.read_text(encoding="utf-8"))
            base = marker.with_suffix("")
            cases = _read_parquet(base.with_name(base.name + ".cases.parquet"))
            faults = _read_parquet(base.with_name(base.name + ".faults.parquet"))
            entry = (np.asarray(done["seeds"], dtype=np.int64), cases, faults, list(done["problems"]))
            self.blocks.setdefault(int(done["config"]), []).append(entry)

    def done(self, config: int) -> set[int]:
        """The seeds of configuration ``config`` already checked."""
        return {int(s) for entry in self.blocks.get(config, []) for s in entry[0]}

    def cases_done(self) -> int:
        return sum(len(e[0]) for entries in self.blocks.values() for e in entries)

    def _write(self, path: Path, data: str | bytes) -> None:
        if self.failed:
            return
        try:
            files.write_atomic(path, data)
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else " ".join(str(e).split())
            self.failed = (
                f"the journal {self.folder} could not be written ({reason}): the run went on without it, "
                "so an interruption would have started it again"
            )

    def add(self, config: int, seeds: np.ndarray, cases: Any, faults: Any, problems: list[str]) -> None:
        """A finished block: its tables, then the marker that makes it count."""
        name = f"block-{config:04d}-{int(seeds[0]):019d}-{len(seeds):06d}"
        self._write(self.folder / f"{name}.cases.parquet", _parquet(cases))
        self._write(self.folder / f"{name}.faults.parquet", _parquet(faults))
        marker = {"config": config, "seeds": [int(s) for s in seeds], "problems": list(problems)}
        self._write(self.folder / f"{name}.json", json.dumps(marker) + "\n")
        self.blocks.setdefault(config, []).append((np.asarray(seeds), cases, faults, list(problems)))


def remove_journal(folder: str | Path) -> None:
    """A journal's folder removed once its run's record is written: only the files a
    :class:`Journal` writes, then the folder if that leaves it empty (anything else is kept)."""
    where = Path(folder)
    for f in list(where.glob("block-*")) + [where / Journal.META]:
        f.unlink(missing_ok=True)
    try:
        where.rmdir()
    except OSError:  # something of the user's in it: kept
        pass
