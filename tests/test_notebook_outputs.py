"""What the committed notebooks print fits 100 columns and names nothing outside the project.

A line wider than a notebook's text area wraps in JupyterLab and in the HTML report, and a
wrapped table is unreadable (headers split as ``llama.cpp NM`` / ``SE 5e-3``): notebooks
print tables through ``workbench.reports.tables.fit`` and sentences through ``tables.wrap``. Checked
over ``notebooks/*.ipynb``, so a new notebook is covered as soon as it is added.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from workbench.reports.tables import WIDTH

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: Paths and words that only mean something on the machine the project was made on.
OUTSIDE = re.compile(
    r"\.\./shared|/work/|shared/(?:reference|design|seeds|device)|prepare-mlx-cuda"
    r"|\bthe seed\b|\bthe seed's\b|\bRust test\b|\bits LCG\b",
    re.IGNORECASE,
)


def _text_outputs(nb: dict):
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                yield i, "".join(out["text"])
            elif "data" in out and "text/plain" in out["data"]:
                yield i, "".join(out["data"]["text/plain"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_printed_line_fits_100_columns(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    wide = [
        (i, len(line), line[:60]) for i, text in _text_outputs(nb) for line in text.splitlines() if len(line) > WIDTH
    ]
    assert not wide, f"{path.name}: lines wider than {WIDTH} (cell, width, start): {wide}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_names_nothing_outside_the_project(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    found = [(i, m.group(0)) for i, cell in enumerate(nb["cells"]) for m in OUTSIDE.finditer("".join(cell["source"]))]
    assert not found, f"{path.name}: (cell, text) {found}"


#: Every document a reader is sent to: the README, each file of docs/, each folder's README.
DOCUMENTS = sorted(
    ["README.md"]
    + [str(p.relative_to(ROOT)) for p in ROOT.glob("docs/*.md")]
    + [str(p.relative_to(ROOT)) for p in ROOT.glob("*/README.md")]
)


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_the_documents_name_nothing_outside_the_project(doc: str):
    text = (ROOT / doc).read_text(encoding="utf-8")
    found = [m.group(0) for m in OUTSIDE.finditer(text)]
    assert not found, f"{doc}: {found}"


#: What a cell that reads a file itself looks like, or names one: notebooks read records,
#: plans and ledgers through ``workbench`` (``workbench.reports.records`` for bench records,
#: by the record's name), which finds and checks them.
OPENS_A_FILE = re.compile(r"json\.loads?\(|\bopen\(|\.read_text\(|\.read_bytes\(|\bdata/|\.json\b|\bPath\(")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_notebook_cell_opens_a_file(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    found = [
        (i, m.group(0))
        for i, cell in enumerate(nb["cells"])
        if cell["cell_type"] == "code"
        for m in OPENS_A_FILE.finditer("".join(cell["source"]))
    ]
    assert not found, f"{path.name}: (cell, text) {found}"
