"""A pytest plugin: each notebook's peak memory under nbval, measured and held under a limit.

Why: a notebook is meant to run on an ordinary laptop. Notebook 03 once needed about
8 GB (Bonsai-27B's tail in float64), which an 8-16 GB laptop swaps on or cannot run.
Executing every notebook once more just to measure it would double CI's notebook time,
so this plugin measures the run nbval already makes: at the end of each notebook (the
teardown of its last cell, before nbval stops the kernel) it reads the kernel process's
peak resident set size, ``VmHWM`` in ``/proc/<pid>/status``: everything the notebook's
code allocated, MLX's buffers included, lives in that one process.

Load it with ``-p tools.notebook_memory`` beside ``--nbval`` (the Makefile's ``nbval``
target does). A notebook over the limit fails its last cell's teardown, naming the peak
and the limit; the peaks are printed in the terminal summary. ``--notebook-memory-limit-gb``
sets the limit (default 4). Where ``/proc`` is absent (macOS) nothing is measured and the
summary says so.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

#: The default limit: 4 GB (10^9 bytes), what a notebook may take on an 8 GB laptop.
DEFAULT_LIMIT_GB = 4.0

_peaks: dict[str, int] = {}  # notebook path -> peak bytes
_unmeasured: set[str] = set()
_started: dict[str, float] = {}  # notebook path -> when its first cell was set up
_seconds: dict[str, float] = {}  # notebook path -> wall time from its first cell to its last


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--notebook-memory-limit-gb",
        type=float,
        default=DEFAULT_LIMIT_GB,
        help="fail a notebook whose kernel's peak resident memory exceeds this many GB "
        f"(10^9 bytes; default {DEFAULT_LIMIT_GB:g})",
    )


def peak_rss_bytes(pid: int) -> int | None:
    """The peak resident set size of process ``pid`` (``VmHWM``), or None where /proc cannot tell."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                value, unit = line.split()[1:3]
                assert unit == "kB", unit
                return int(value) * 1024
    except OSError:
        return None
    return None


def _kernel_pid(item: pytest.Item) -> int | None:
    """The pid of the kernel nbval runs ``item``'s notebook in, or None for any other item."""
    kernel = getattr(item.parent, "kernel", None)
    km = getattr(kernel, "km", None)
    provisioner = getattr(km, "provisioner", None)
    pid = getattr(provisioner, "pid", None)
    return int(pid) if pid else None


def _notebook(item: pytest.Item) -> str:
    return str(Path(str(item.parent.path)).relative_to(item.config.rootpath))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if type(item).__name__ == "IPyNbCell":  # nbval's cell item
        _started.setdefault(_notebook(item), time.monotonic())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # tryfirst: before pytest's own teardown, which stops the notebook's kernel after its last cell.
    last_cell = nextitem is None or nextitem.parent is not item.parent
    pid = _kernel_pid(item)
    if pid is None or not last_cell:
        return
    notebook = _notebook(item)
    if notebook in _started:
        _seconds[notebook] = time.monotonic() - _started[notebook]
    peak = peak_rss_bytes(pid)
    if peak is None:
        _unmeasured.add(notebook)
        return
    _peaks[notebook] = max(peak, _peaks.get(notebook, 0))
    limit_gb = item.config.getoption("--notebook-memory-limit-gb")
    if peak > limit_gb * 1e9:
        pytest.fail(
            f"{notebook}: the kernel's peak resident memory was {peak / 1e9:.2f} GB, "
            f"over the {limit_gb:g} GB limit (--notebook-memory-limit-gb)",
            pytrace=False,
        )


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _peaks and not _unmeasured:
        return
    limit_gb = config.getoption("--notebook-memory-limit-gb")
    terminalreporter.section(f"notebooks' peak memory (kernel VmHWM; limit {limit_gb:g} GB) and run time")
    for notebook, peak in sorted(_peaks.items()):
        seconds = f"{_seconds[notebook]:6.0f} s" if notebook in _seconds else ""
        terminalreporter.write_line(f"{notebook:<48} {peak / 1e9:6.2f} GB {seconds}")
    for notebook in sorted(_unmeasured):
        terminalreporter.write_line(f"{notebook:<48} not measured (no /proc/<pid>/status here)")
