"""Committed notebooks are in the form JupyterLab 4 writes when it saves them.

So that running a notebook in JupyterLab and saving it, with its outputs unchanged,
leaves ``git status`` clean (``tools/normalize_notebooks.py`` says what the form is and
how it was established; ``tests/test_lab_browser.py`` saves every notebook from a real
JupyterLab and checks that it wrote this form). Checked over ``notebooks/*.ipynb``, so a
new notebook is covered as soon as it is added.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.normalize_notebooks import KERNELSPEC, normal_text, normalize

ROOT = Path(__file__).resolve().parents[1]

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks_to_check():
    assert len(NOTEBOOKS) >= 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_committed_notebook_is_in_jupyterlabs_normal_form(path: Path):
    text = path.read_text(encoding="utf-8")
    assert text == normal_text(text), (
        f"{path.name} is not in the form JupyterLab saves (execution timestamps or kernelspec display "
        f"name): run `python tools/normalize_notebooks.py notebooks/{path.name}` and commit it"
    )


def _executed_by_nbconvert() -> str:
    """A small notebook as ``nbconvert --execute`` leaves it: timestamps and the old display name."""
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": 1,
                "id": "a1",
                "metadata": {"execution": {"iopub.status.busy": "2026-11-30T21:11:09.737590Z"}, "tags": ["parameters"]},
                "outputs": [{"name": "stdout", "output_type": "stream", "text": ["ü 1\n"]}],
                "source": ["print('ü', 1)"],
            }
        ],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python", "version": "3.11.7"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(nb, indent=2)


def test_the_normal_form_drops_timestamps_sets_the_kernelspec_and_keeps_the_rest():
    out = normal_text(_executed_by_nbconvert())
    nb = json.loads(out)
    cell = nb["cells"][0]
    assert "execution" not in cell["metadata"] and cell["metadata"]["tags"] == ["parameters"]
    assert nb["metadata"]["kernelspec"] == KERNELSPEC
    assert nb["metadata"]["language_info"]["version"] == "3.11.7"  # what the last run reported: kept
    assert cell["outputs"] == [{"name": "stdout", "output_type": "stream", "text": ["ü 1\n"]}]
    assert "ü" in out and out.endswith("}\n") and out.startswith('{\n "cells": [\n')  # UTF-8 kept, one-space indent
    assert normal_text(out) == out  # a fixed point


def test_normalize_rewrites_only_what_is_not_normal(tmp_path: Path):
    a, b = tmp_path / "a.ipynb", tmp_path / "b.ipynb"
    a.write_text(_executed_by_nbconvert(), encoding="utf-8")
    b.write_text(normal_text(_executed_by_nbconvert()), encoding="utf-8")
    assert normalize([a, b]) == [a]
    assert a.read_text(encoding="utf-8") == b.read_text(encoding="utf-8")
    assert normalize([a, b]) == []


def test_the_command_checks_and_names_the_notebook(tmp_path: Path):
    a = tmp_path / "a.ipynb"
    a.write_text(_executed_by_nbconvert(), encoding="utf-8")
    tool = [sys.executable, str(ROOT / "tools" / "normalize_notebooks.py")]
    r = subprocess.run(tool + ["--check", str(a)], capture_output=True, text=True)
    assert r.returncode == 1 and "a.ipynb: not in JupyterLab's normal form" in r.stdout
    assert subprocess.run(tool + [str(a)], capture_output=True, text=True).returncode == 0
    assert subprocess.run(tool + ["--check", str(a)], capture_output=True, text=True).returncode == 0
    r = subprocess.run(tool + [str(tmp_path / "missing.ipynb")], capture_output=True, text=True)
    assert r.returncode == 2 and "no such file" in r.stderr


def test_consecutive_stream_outputs_are_merged_as_jupyterlab_merges_them():
    nb = json.loads(_executed_by_nbconvert())
    nb["cells"][0]["outputs"] = [
        {"name": "stdout", "output_type": "stream", "text": "a\n"},
        {"name": "stdout", "output_type": "stream", "text": ["b", "\n", "c\n"]},
        {"name": "stderr", "output_type": "stream", "text": "warn\n"},
        {"name": "stdout", "output_type": "stream", "text": "d\n"},
    ]
    outs = json.loads(normal_text(json.dumps(nb)))["cells"][0]["outputs"]
    assert [(o["name"], "".join(o["text"])) for o in outs] == [
        ("stdout", "a\nb\nc\n"),
        ("stderr", "warn\n"),
        ("stdout", "d\n"),
    ]
