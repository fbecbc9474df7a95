"""A cell whose digits depend on the CPU (tag ``cpu-dependent-digits``) keeps them out of the
saved notebook: committed without outputs, ignored by nbval, and saved without them by JupyterLab
(``make lab``'s pre-save hook), so a run and a save on any CPU leaves ``git status`` clean."""

import copy
import importlib
import re
from pathlib import Path

import nbformat
import pytest

from tools.normalize_notebooks import CPU_DIGITS, normal_text, pre_save

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _tagged(nb):
    return [c for c in nb.cells if c.cell_type == "code" and CPU_DIGITS in c.metadata.get("tags", [])]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_cpu_dependent_cell_is_committed_without_outputs_and_ignored_by_nbval(path):
    for cell in _tagged(nbformat.read(path, as_version=4)):
        assert cell.outputs == [], f"{path.name}: {cell.source[:60]!r} keeps CPU-dependent outputs"
        assert "# NBVAL_IGNORE_OUTPUT" in cell.source, f"{path.name}: {cell.source[:60]!r}"


def test_the_notebooks_named_in_the_issue_carry_the_tag():
    counts = {p.name[:2]: len(_tagged(nbformat.read(p, as_version=4))) for p in NOTEBOOKS}
    assert counts["03"] >= 3 and counts["04"] >= 8 and counts["07"] >= 5, counts


def test_jupyterlabs_save_drops_the_outputs_of_tagged_cells_only():
    nb = nbformat.read(ROOT / "notebooks" / "07_check_your_own_kernel.ipynb", as_version=4)
    for cell in _tagged(nb):
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="0.625\n")]
    kept = [
        copy.deepcopy(c.outputs)
        for c in nb.cells
        if c.cell_type == "code" and CPU_DIGITS not in c.metadata.get("tags", [])
    ]
    model = {"type": "notebook", "content": nbformat.from_dict(copy.deepcopy(nb))}
    pre_save(model=model, path="07.ipynb", contents_manager=None)
    saved = nbformat.from_dict(model["content"])
    assert all(c.outputs == [] for c in _tagged(saved))
    assert kept == [
        c.outputs for c in saved.cells if c.cell_type == "code" and CPU_DIGITS not in c.metadata.get("tags", [])
    ]
    assert all(c.outputs == [] for c in _tagged(nbformat.reads(normal_text(nbformat.writes(nb)), as_version=4)))
    pre_save(model={"type": "file", "content": "text"}, path="x.txt", contents_manager=None)  # other files: untouched


def test_make_lab_installs_the_hook():
    makefile = (ROOT / "Makefile").read_text()
    hook = re.search(r"^PRE_SAVE = (\S+)$", makefile, re.M).group(1)
    assert "--ContentsManager.pre_save_hook=$(PRE_SAVE)" in makefile
    module, name = hook.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is pre_save
