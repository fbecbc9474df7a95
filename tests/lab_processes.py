"""What the two JupyterLab tests (``test_lab``, ``test_lab_browser``) both need of a server
they start: a free local port, and the server's whole process group stopped afterwards
(``make lab`` and ``jupyter lab`` start children that a signal to the parent alone leaves
running)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(proc: subprocess.Popen, timeout_s: float) -> None:
    """Stop ``proc``'s process group (started with ``start_new_session=True``): SIGTERM, and
    SIGKILL if it has not exited within ``timeout_s``."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
