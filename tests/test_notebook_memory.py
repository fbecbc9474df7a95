"""``tools.notebook_memory``: a notebook's peak memory under nbval is measured, and held to the limit.

Runs nbval with the plugin on a two-cell notebook whose kernel allocates about 300 MB,
under a 0.1 GB limit: its last cell fails, naming the peak and the limit, and the summary
prints the peak and the run time.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools.notebook_memory import peak_rss_bytes

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="no /proc here (the plugin measures nothing)"
)


def test_peak_rss_reads_this_process():
    import os

    peak = peak_rss_bytes(os.getpid())
    assert peak is not None and 10e6 < peak < 64e9
    assert peak_rss_bytes(2**22 + 12345) is None  # no such process


def _nbval(tmp_path: Path, limit_gb: float) -> subprocess.CompletedProcess:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import numpy as np\nx = np.ones(300_000_000 // 8)"),
        nbformat.v4.new_code_cell("print(round(float(x.sum())))"),
    ]
    path = tmp_path / "allocates.ipynb"
    nbformat.write(nb, path)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tools.notebook_memory",
            "--nbval-lax",
            "--nbval-current-env",
            "--notebook-memory-limit-gb",
            str(limit_gb),
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


def test_a_notebook_over_the_limit_fails_naming_its_peak_and_the_summary_prints_it(tmp_path: Path):
    # One kernel start (a few seconds): the run under the real limit is `make nbval` itself.
    r = _nbval(tmp_path, 0.1)
    assert r.returncode != 0
    assert re.search(
        r"allocates\.ipynb: the kernel's peak resident memory was 0\.[3-9]\d GB, "
        r"over the 0\.1 GB limit",
        r.stdout,
    ), r.stdout[-2000:]
    assert re.search(r"allocates\.ipynb\s+0\.[3-9]\d GB\s+\d+ s", r.stdout), r.stdout[-2000:]
