"""The README's main-job command (`make lab`) brings up JupyterLab serving notebooks/.

Runs the real command, with the token fixed through JUPYTER_TOKEN (which Jupyter Server
reads), and asks `/api/status`: 200 with the token, 403 without it; `/api/contents`
lists the notebooks, so it serves notebooks/ and not some other folder.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, token: str | None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_lab_serves_the_notebooks() -> None:
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_TOKEN": token}
    proc = subprocess.Popen(
        ["make", "-s", "lab", f"PORT={port}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        status = None
        while time.monotonic() < deadline:
            try:
                status, _ = _get(f"{base}/api/status", token)
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if proc.poll() is not None:
                break
            time.sleep(0.5)
        assert status == 200, f"JupyterLab did not answer on {base}/api/status"
        assert _get(f"{base}/api/status", None)[0] == 403
        code, body = _get(f"{base}/api/contents", token)
        names = {item["name"] for item in json.loads(body)["content"]}
        assert code == 200 and "01_hadamard_fold.ipynb" in names
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
    # Headless-friendly: it printed the URL with its token for the user to open.
    assert f"token={token}" in out.decode(errors="replace") or token in out.decode(errors="replace")
