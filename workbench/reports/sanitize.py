"""What compute-sanitizer has found clean, read from ``python -m bench.sanitize`` records.

A sanitizer run (``bench.sanitize``) runs a child that evaluates the kernels of a tail
(its three launches, the same tail as one launch, that launch carrying the next norm, the head
launch) at some shapes and
weight formats, and prints one line a case (``tail small bfloat16: PASS ...``). A run
passes only when the sanitizer printed its summary with no error (racecheck: no hazard)
and the child exited 0; a run stopped at its time limit proves nothing about the cases it
reached. :func:`coverage` folds every record into one table: for each shape and format,
which parts ran clean under each tool. It lives here, not in the bench, so notebooks can
show it (the bench needs a GPU; reading its records does not). Each function refuses what
is not a sanitize record (``records.check``).
"""

from __future__ import annotations

import os
from typing import Any

from workbench import validate
from workbench.fold.formats import KERNEL_FORMATS
from workbench.reports.records import check as check_record
from workbench.reports.records import load_all

#: compute-sanitizer's tools, in the order the bench runs them.
TOOLS: tuple[str, ...] = ("memcheck", "racecheck", "synccheck", "initcheck")

#: The weight formats the bench runs, in its order, by name: every format the kernels read
#: (``workbench.fold.formats.KERNEL_FORMATS``: dense float32 / bf16, then the quantized ones).
FORMATS: tuple[str, ...] = tuple(f.name for f in KERNEL_FORMATS)

#: The bench's shapes, in its order.
SHAPES: tuple[str, ...] = ("small", "bonsai")

#: What a case line starts with, and its letter in :func:`coverage`'s cells: T the tail's
#: three launches, 1 the tail as one launch, N that launch carrying the next layer's input
#: norm (``workbench.kernels.next_norm``; kernel text since ``a5b094e07023``), H the head launch.
PART_LETTERS: dict[str, str] = {"tail": "T", "one-launch": "1", "next-norm": "N", "head": "H"}


def load_records(folder: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """Every sanitize record in ``folder`` (default the project's ``data/bench``), sorted by
    file name, each checked and with its ``file`` name (``records.load_all``)."""
    return load_all("sanitize", folder)


def record_runs(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """A sanitize record's runs, each with its tool: records since ``--jobs`` list them
    (``runs``); earlier ones hold one a tool (``tools``)."""
    check_record(rec, "sanitize", name="rec")
    if "runs" in rec:
        return rec["runs"]
    return [dict(r, tool=tool) for tool, r in rec.get("tools", {}).items()]


def of_kernel_text(records: list[dict[str, Any]], kernel_text: str) -> list[dict[str, Any]]:
    """The records whose run carried the kernel text ``kernel_text`` (a
    ``kernel_source.fingerprint``; records made before records carried one match none):
    what a sanitizer found clean in other text says nothing about this one."""
    if not isinstance(kernel_text, str) or not kernel_text:
        raise ValueError(
            f"kernel_text must be a kernel_source.fingerprint string; got {validate.describe(kernel_text)}"
        )
    return [r for r in records if isinstance(r, dict) and r.get("kernel_text") == kernel_text]


def coverage(records: list[dict[str, Any]]) -> Any:
    """One row a (shape, format), one column a tool (pandas); each cell the letters of the
    parts whose cases ran in a clean run of that tool (:data:`PART_LETTERS`), "-" where
    none did (no rows for no records). Raises ``records.RecordError`` (a ``ValueError``)
    for anything that is not a sanitize record. For what covers the kernels as they are
    now, pass :func:`of_kernel_text`'s records."""
    import pandas as pd

    seen: dict[tuple[str, str], dict[str, set[str]]] = {}
    for i, rec in enumerate(records):
        check_record(rec, "sanitize", name=f"records[{i}]")
        for run in record_runs(rec):
            if not run.get("passed"):
                continue
            for line in run.get("cases", []):
                part, shape, fmt = line.split(":", 1)[0].split()[:3]
                seen.setdefault((shape, fmt), {}).setdefault(run["tool"], set()).add(part)

    def rank(key: tuple[str, str]) -> tuple[int, int, str, str]:
        shape, fmt = key
        return (
            SHAPES.index(shape) if shape in SHAPES else len(SHAPES),
            FORMATS.index(fmt) if fmt in FORMATS else len(FORMATS),
            shape,
            fmt,
        )

    order = sorted(seen, key=rank)
    cells = [
        {
            tool: "".join(letter for part, letter in PART_LETTERS.items() if part in seen[key].get(tool, ())) or "-"
            for tool in TOOLS
        }
        for key in order
    ]
    index = pd.MultiIndex.from_arrays([[k[0] for k in order], [k[1] for k in order]], names=["shape", "format"])
    return pd.DataFrame(cells, index=index, columns=list(TOOLS))


def not_yet_clean(table: Any, shape: str, part: str) -> dict[str, list[str]]:
    """From a :func:`coverage` table: for each tool, the formats at ``shape`` whose ``part``
    (a key of :data:`PART_LETTERS`) has not run in a clean run of it; a tool with none maps
    to ``[]``. Formats absent from the table at that shape never ran there at all, so they
    are listed for every tool."""
    if part not in PART_LETTERS:
        raise ValueError(f"part must be one of {list(PART_LETTERS)}; got {validate.describe(part)}")
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {list(SHAPES)}; got {validate.describe(shape)}")
    rows = table.xs(shape, level="shape") if shape in table.index.get_level_values("shape") else None
    letter = PART_LETTERS[part]
    out: dict[str, list[str]] = {}
    for tool in TOOLS:
        out[tool] = [
            fmt for fmt in FORMATS if rows is None or fmt not in rows.index or letter not in rows.loc[fmt, tool]
        ]
    return out


def runs_table(records: dict[str, dict[str, Any]]) -> Any:
    """One row a run of the sanitize records ``records`` (name -> record, in the order
    given): the record's name, the tool, the parts it ran, how many formats, whether its
    tail was device-written, whether it was clean, its errors and its seconds (pandas).
    Raises ``records.RecordError`` (a ``ValueError``) for anything that is not a sanitize
    record."""
    import pandas as pd

    rows = []
    for name, rec in records.items():
        check_record(rec, "sanitize", name=f"records[{name!r}]")
        for run in record_runs(rec):
            rows.append(
                {
                    "record": name,
                    "tool": run["tool"],
                    "parts": "+".join(run.get("parts") or ["?"]),
                    "formats": len(run.get("formats", [])),
                    "device-written": bool(rec.get("device_written")),
                    "clean": bool(run.get("passed")),
                    "errors": run.get("errors"),
                    "seconds": round(run["seconds"]),
                }
            )
    return pd.DataFrame(rows)
