"""A notebook file read and checked, so the tools that take one refuse a bad file in one line.

nbformat's own reader answers a malformed file with whatever its parser hit first: a
``UnicodeDecodeError`` for a binary file, ``NotJSONError`` for text that is not JSON, an
``AttributeError`` for a JSON list, a ``TypeError`` for ``"cells": 3``, a jsonschema
``ValidationError`` whose message runs to dozens of lines. A user who passed the wrong file
to ``tools/normalize_notebooks.py`` or ``tools/report.py`` needs one line naming the file and
what is wrong with it, so :func:`notebook_text` checks the layers in order (UTF-8, JSON, an
object, the top-level keys and cells of nbformat 4, then nbformat's schema) and raises
``ValueError`` naming the file at the first that fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat

#: The keys nbformat 4 requires at the top of a notebook (its schema's ``required``).
TOP_KEYS = ("cells", "metadata", "nbformat", "nbformat_minor")


def _refuse(path: Path, what: str) -> ValueError:
    return ValueError(f"{path}: not a notebook: {what}")


def notebook_text(path: str | Path) -> str:
    """The text of the notebook at ``path``, checked to be an nbformat 4 notebook.

    Raises ``ValueError`` (``"<path>: not a notebook: <what>"``) for a file that is not
    UTF-8, not JSON, not a JSON object, lacks a required key, has cells that are not a list
    of cell objects, is not version 4, or fails nbformat's schema; ``OSError`` when it
    cannot be read at all (no such file, a folder).
    """
    path = Path(path)
    data = path.read_bytes()
    if not data.strip():
        raise _refuse(path, "the file is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _refuse(path, f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise _refuse(path, f"not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    if not isinstance(raw, dict):
        raise _refuse(path, f"its JSON is a {type(raw).__name__}, not an object")
    missing = [k for k in TOP_KEYS if k not in raw]
    if missing:
        raise _refuse(path, f"no {', '.join(repr(k) for k in missing)} (an nbformat 4 notebook has {list(TOP_KEYS)})")
    if raw["nbformat"] != 4:
        raise _refuse(
            path,
            f"nbformat {raw['nbformat']!r}; these tools read version 4 (jupyter nbconvert --to notebook "
            "upgrades an older one)",
        )
    cells = raw["cells"]
    if not isinstance(cells, list) or not all(
        isinstance(c, dict) and isinstance(c.get("cell_type"), str) for c in cells
    ):
        raise _refuse(path, "'cells' must be a list of cell objects, each with a 'cell_type'")
    try:
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except Exception as err:
        first = (str(getattr(err, "message", "")) or str(err) or type(err).__name__).splitlines()[0]
        raise _refuse(path, f"fails nbformat's schema ({first})") from None
    return text


def read_notebook(path: str | Path) -> nbformat.NotebookNode:
    """The notebook at ``path`` (nbformat 4), checked by :func:`notebook_text` first."""
    return nbformat.reads(notebook_text(path), as_version=4)
