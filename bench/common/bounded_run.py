"""A command run with a time limit that, when reached, stops the command AND what it started.

``subprocess.run(..., timeout=T)`` kills only the process it started. The benches start
tools that start the workbench's Python in turn (``compute-sanitizer ... python -m
bench.sanitize --child``, ``ncu ... python -m bench.launch_profile --child``): killing the
tool at its limit left that Python child running, orphaned, still evaluating kernels on
the GPU, slowing the next runs.

:func:`run_bounded` therefore starts the command as the leader of a new process group
(a new session) and, at the limit, kills the whole group before it collects the output.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_bounded(
    cmd: Sequence[str], *, timeout: float, cwd: str | Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (its stdout and stderr captured as text) for at most ``timeout`` seconds.

    Returns the finished process. At the limit, every process of the command's group is
    killed (SIGKILL: the tools at stake do not stop on SIGTERM while a kernel runs) and
    ``subprocess.TimeoutExpired`` is raised with what the command had printed by then
    (``.output`` / ``.stderr``, text). Raises ``ValueError`` for a ``timeout`` that is not
    a positive number.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}")
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=None if env is None else dict(env),
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        # Every process of the group is gone, so the pipes close and this returns at once.
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(list(cmd), timeout, output=out, stderr=err) from None
    except BaseException:  # Ctrl-C, or anything else: leave no orphan behind either
        _kill_group(proc.pid)
        proc.wait()
        raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, stdout=out, stderr=err)


def _kill_group(pgid: int) -> None:
    """SIGKILL to every process of group ``pgid`` (the leader's pid: ``start_new_session``)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group had already exited
        pass
