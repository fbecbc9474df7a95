"""bench.common.bounded_run: a time limit that stops the command and everything it started."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.common.bounded_run import run_bounded


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie waiting for its new parent to reap it counts)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_a_finished_command_returns_its_output_and_status() -> None:
    done = run_bounded(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"], timeout=60
    )
    assert done.returncode == 3 and done.stdout == "out\n" and done.stderr == "err\n"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
def test_the_limit_stops_the_command_and_what_it_started(tmp_path) -> None:
    """The shape of compute-sanitizer / ncu: a process that starts a child and waits on it.
    At the limit both are gone, and what was printed before it comes back."""
    pid_file = tmp_path / "grandchild.pid"
    parent = (
        "import subprocess, sys, time\n"
        # the grandchild's output not piped back: were it left running, this test
        # would then fail, not hang on pipes it holds open
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pid_file)!r}, 'w').write(str(c.pid))\n"
        "print('started', flush=True)\n"
        "c.wait()\n"
    )
    t0 = time.perf_counter()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_bounded([sys.executable, "-c", parent], timeout=3)
    assert time.perf_counter() - t0 < 30
    assert "started" in caught.value.output
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild), "the command's own child outlived the limit"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "10", None, True])
def test_a_limit_that_is_not_a_positive_number_is_refused(bad) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        run_bounded([sys.executable, "-c", "pass"], timeout=bad)


def test_the_command_leads_its_own_process_group() -> None:
    """What makes killing the group safe: the group is the command's, not the caller's."""
    done = run_bounded([sys.executable, "-c", "import os; print(os.getpgrp() == os.getpid())"], timeout=60)
    assert done.stdout.strip() == "True" and os.getpgrp() != 0
