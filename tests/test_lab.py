"""The README's main-job command (`make lab`) brings up JupyterLab serving notebooks/.

Runs the real command, reads the URL with its token from what it prints, and asks `/api/status`:
200 with the token, 403 without it; `/api/contents`
lists the notebooks, so it serves notebooks/ and not some other folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.lab_processes import free_port, stop_group

ROOT = Path(__file__).resolve().parents[1]


def _get(url: str, token: str | None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_lab_serves_the_notebooks() -> None:
    """As a headless user would: run `make lab`, read the printed URL and its token, ask."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}  # let it make its own
    proc = subprocess.Popen(
        ["make", "-s", "lab", f"PORT={port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lines: list[str] = []
    url_re = re.compile(rf"http://127\.0\.0\.1:{port}/lab\?token=([0-9a-f]+)")
    found: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            lines.append(line)
            m = url_re.search(line)
            if m and not found:
                found.append(m.group(1))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not found and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert found, "make lab printed no URL with a token:\n" + "".join(lines[-20:])
        token = found[0]
        status = None
        while time.monotonic() < deadline:
            try:
                status, _ = _get(f"{base}/api/status", token)
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.3)
        assert status == 200, f"JupyterLab did not answer on {base}/api/status"
        assert _get(f"{base}/api/status", None)[0] == 403
        assert _get(f"{base}/api/status", "wrong" + token)[0] == 403
        code, body = _get(f"{base}/api/contents", token)
        names = {item["name"] for item in json.loads(body)["content"]}
        assert code == 200 and "01_hadamard_fold.ipynb" in names
    finally:
        stop_group(proc, 20)
