"""``tests.nbval_exact_outputs``: in nbval's run, an output that is not the committed one fails its cell.

Runs strict nbval with the plugin on a five-cell notebook: a cell whose committed output is
its output, an ``# NBVAL_IGNORE_OUTPUT`` cell whose committed output is another (nbval
passes it; the plugin must not), a cell that prints twice (streams merged as nbval merges
them), an ignored cell that writes to stderr besides its committed output, and an ignored cell
tagged as printing CPU-dependent digits, whose other output passes. One kernel
start (a few seconds); the run over the real notebooks is ``make nbval`` itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.nbval_exact_outputs import CPU_DIGITS, describe, why_not_compared

ROOT = Path(__file__).resolve().parents[1]


def _cell(source: str, *outputs: dict) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.execution_count = 1
    cell.outputs = [nbformat.v4.new_output("stream", name=o.get("name", "stdout"), text=o["text"]) for o in outputs]
    return cell


@pytest.mark.skipif(why_not_compared() is not None, reason=f"the plugin compares nothing here: {why_not_compared()}")
def test_a_differing_output_fails_its_cell_and_names_it(tmp_path: Path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        _cell("print('same')", {"text": "same\n"}),
        _cell("# NBVAL_IGNORE_OUTPUT\nprint('1.25e-06')", {"text": "1.24e-06\n"}),
        _cell("print('a')\nprint('b')", {"text": "a\n"}, {"text": "b\n"}),
        _cell("# NBVAL_IGNORE_OUTPUT\nimport sys\nprint('x')\nprint('warned', file=sys.stderr)", {"text": "x\n"}),
        _cell("# NBVAL_IGNORE_OUTPUT\nprint('3.5e-07')", {"text": "3.6e-07\n"}),
    ]
    nb.cells[-1].metadata["tags"] = [CPU_DIGITS]  # digits another CPU sums differently: not compared
    path = tmp_path / "exact.ipynb"
    nbformat.write(nb, path)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.nbval_exact_outputs",
            "--nbval",
            "--nbval-current-env",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = r.stdout
    assert "2 failed, 3 passed" in out, out[-3000:]
    assert "exact.ipynb::Cell 1" in out and "exact.ipynb::Cell 3" in out, out[-3000:]
    assert "-1.24e-06\n+1.25e-06" in out, out[-3000:]  # the diff: committed, then this run
    assert "2 outputs in this run, 1 committed: ['stdout', 'stderr']" in out
    assert (
        "outputs compared byte for byte with the committed ones: 4 cells in 1 notebooks; 1 cells tagged "
        f"{CPU_DIGITS!r} not compared"
    ) in out


def test_the_description_names_each_output_that_differs():
    png = {"output_type": "display_data", "data": {"image/png": "AAA", "text/plain": "<Figure>"}, "metadata": {}}
    other = {**png, "data": {**png["data"], "image/png": "AAB"}}
    text = {"output_type": "stream", "name": "stdout", "text": "a\nb\n"}
    assert describe([text, png], [text, png]) == []
    assert describe([text, other], [text, png]) == ["output 1 (display_data) differs in image/png"]
    [line] = describe([{**text, "text": "a\nc\n"}], [text])
    assert line.startswith("output 0 (stdout) differs:") and "-b\n+c" in line
