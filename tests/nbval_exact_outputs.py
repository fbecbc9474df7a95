"""A pytest plugin: in nbval's run, every cell's outputs are the committed ones, byte for byte.

Why: the promise that running a notebook in JupyterLab and saving it leaves ``git status``
clean needs a run's outputs to be the committed ones, the ones nbval does not compare
(``# NBVAL_IGNORE_OUTPUT``: device figures, PNG figures) included. Running every notebook
once more for that would double the notebooks' time in ``make test``, so this plugin reads
the run strict nbval already makes: after each cell, the outputs nbval collected from the
kernel are compared with the committed cell's, exactly (no sanitizing), streams merged by
name on both sides as nbval merges them. A difference fails that cell, naming each output
that differs. ``tests/test_lab_browser.py`` holds the other two parts of the promise (a
save from JupyterLab leaves every committed notebook as it is; a run through its UI is
written in the committed form) and says how the three add up.

A cell whose printed digits depend on the CPU it runs on (float32 sums whose order the
machine's BLAS picks: raw error figures, catch rates beside a calibrated threshold) carries
the cell tag :data:`CPU_DIGITS`, and is not compared: nbval ignores its output already, and
no committed output can be every CPU's, so it is committed and saved without outputs
(``tools/normalize_notebooks.py``: the normal form, and JupyterLab's pre-save hook). Such a
cell shows figures on the screen; its claims are asserted.

Load it with ``-p tests.nbval_exact_outputs`` beside ``--nbval`` (the Makefile's ``nbval``
target does). It compares where the JupyterLab check runs (Chromium and playwright
present), on the machine the committed outputs were made on; elsewhere the device
figures may differ, and the summary says it compared nothing and why.
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
import os
import shutil
from pathlib import Path

import nbformat
import pytest

# The notebooks' kernels inherit this process's environment: MLX's float32 matrix products in
# full float32 there too, as in the unit tests (tests/conftest.py says why).
os.environ.setdefault("MLX_ENABLE_TF32", "0")


def why_not_compared() -> str | None:
    """None where the JupyterLab check runs, else why it does not (as it skips)."""
    if not (shutil.which("chromium") or Path("/usr/bin/chromium").exists()):
        return "Chromium is not installed"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed"
    return None


#: The cell tag of a cell whose output's digits depend on the CPU (module docstring).
CPU_DIGITS = "cpu-dependent-digits"

_state: dict = {"why_not": None, "cells": 0, "notebooks": set(), "cpu_cells": 0}
_committed: dict[Path, nbformat.NotebookNode] = {}


def pytest_configure(config: pytest.Config) -> None:
    _state["why_not"] = why_not_compared()


def _committed_outputs(item) -> list:
    """The committed cell's outputs as nbval merges streams, from a copy of the file as
    committed (nbval's own comparison merges the outputs of the cells it checks in place)."""
    from nbval.plugin import coalesce_streams

    path = Path(str(item.parent.path))
    if path not in _committed:
        _committed[path] = nbformat.read(path, as_version=4)
    cell = [c for c in _committed[path].cells if c.cell_type == "code"][item.cell_num]  # nbval counts code cells
    return coalesce_streams(copy.deepcopy(cell.get("outputs", [])))


def describe(fresh: list, committed: list) -> list[str]:
    """Each output that differs: its index and kind, and for text the first lines of a diff
    (committed, then this run's)."""
    out = []
    if len(fresh) != len(committed):
        out.append(
            f"{len(fresh)} outputs in this run, {len(committed)} committed: "
            f"{[o.get('name', o.get('output_type')) for o in fresh]} vs "
            f"{[o.get('name', o.get('output_type')) for o in committed]}"
        )
    for i, (a, b) in enumerate(zip(fresh, committed)):
        if a == b:
            continue
        kind = a.get("name") or a.get("output_type")
        if a.get("output_type") == b.get("output_type") == "stream":
            diff = list(
                difflib.unified_diff(
                    b.get("text", "").splitlines(),
                    a.get("text", "").splitlines(),
                    "committed",
                    "this run",
                    n=0,
                    lineterm="",
                )
            )
            out.append(f"output {i} ({kind}) differs:\n" + "\n".join(diff[:12]))
            continue
        keys = sorted(
            k for k in {*a.get("data", {}), *b.get("data", {})} if a.get("data", {}).get(k) != b.get("data", {}).get(k)
        )
        rest = sorted(k for k in {*a, *b} - {"data"} if a.get(k) != b.get(k))
        out.append(f"output {i} ({kind}) differs in {', '.join(keys + rest)}")
    return out


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield  # nbval's own run and comparison first: its failure, where it fails, stands
    if type(item).__name__ != "IPyNbCell" or _state["why_not"] is not None or item.test_outputs is None:
        return result
    from nbval.plugin import NbCellError

    if CPU_DIGITS in item.cell.get("metadata", {}).get("tags", []):
        _state["cpu_cells"] += 1
        return result
    committed = _committed_outputs(item)
    fresh = list(item.test_outputs)
    _state["cells"] += 1
    _state["notebooks"].add(str(item.parent.path))
    if fresh != committed:
        raise NbCellError(
            item.cell_num,
            "Cell outputs differ from the committed ones byte for byte "
            "(a save from JupyterLab after this run would change the file)",
            item.cell.source,
            "\n".join(describe(fresh, committed)),
        )
    return result


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not config.getoption("nbval", default=False):
        return
    if _state["why_not"] is not None:
        terminalreporter.write_line(
            f"outputs not compared byte for byte with the committed ones: "
            f"{_state['why_not']} (the JupyterLab check does not run here)"
        )
    else:
        terminalreporter.write_line(
            f"outputs compared byte for byte with the committed ones: {_state['cells']} "
            f"cells in {len(_state['notebooks'])} notebooks; {_state['cpu_cells']} cells "
            f"tagged {CPU_DIGITS!r} not compared"
        )
