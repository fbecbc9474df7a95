"""Every notebook runs in JupyterLab itself, driven through its UI in a real browser.

nbval runs the notebooks through a kernel, but a user runs them in JupyterLab: this test
does what that user does. It starts `make lab` (the README's command; where the project's
`.venv` is not built, the same `jupyter lab` command from this Python) serving a scratch
copy of notebooks/ (beside a link to data/, so the notebooks' `../data` paths hold), opens
every notebook in headless Chromium (Debian's, driven by playwright), runs "Restart Kernel
and Run All Cells" from the Kernel menu, and checks that every code cell ran and that no
cell shows an error or anything on stderr. It then saves each notebook from JupyterLab and
checks that the file it wrote is the committed one, byte for byte: what ``git status`` would
say. The metadata in the normal form of ``tools/normalize_notebooks.py``, every output the
same, the ones nbval does not check (``# NBVAL_IGNORE_OUTPUT``: timings, figures) included,
so a user who only runs and saves a notebook leaves ``git status`` clean. Where the files
differ, the message names each cell that differs and how.

``WORKBENCH_LAB_NOTEBOOKS=01,03`` runs only the notebooks whose names start so (a quick
check of the notebooks one has changed); unset, all of them.

Skipped, saying why, only where Chromium or playwright is absent (CI installs both).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("*.ipynb")
                   if not os.environ.get("WORKBENCH_LAB_NOTEBOOKS")
                   or p.name.startswith(tuple(os.environ["WORKBENCH_LAB_NOTEBOOKS"].split(","))))
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")

#: What a notebook may take to run all its cells in the lab on 2 busy cores.
RUN_TIMEOUT_MS = 600_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lab_settings(folder: Path) -> Path:
    """A user-settings folder: no autosave (only the explicit save below writes), no news toast."""
    settings = {
        "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
    }
    for rel, value in settings.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(json.dumps(value))
    return folder


def _start_lab(serve: Path, tmp: Path, port: int, token: str) -> subprocess.Popen:
    config = tmp / "jupyter-config"
    config.mkdir()
    # Lab's own state (settings, workspaces) in the scratch folder, not the user's home.
    (config / "jupyter_server_config.json").write_text(json.dumps({"LabApp": {
        "user_settings_dir": str(_lab_settings(tmp / "lab-settings")), "workspaces_dir": str(tmp / "workspaces")}}))
    env = dict(os.environ, JUPYTER_TOKEN=token, JUPYTER_CONFIG_DIR=str(config),
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    if (ROOT / ".venv" / ".installed").exists() and shutil.which("make"):
        cmd = ["make", "-s", "lab", f"PORT={port}", f"NOTEBOOKS={serve}"]
    else:  # the Makefile's lab command, from this Python's environment
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               f"--ServerApp.root_dir={serve}"] + (["--allow-root"] if os.geteuid() == 0 else [])
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _wait_until_up(base: str, token: str, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "JupyterLab exited before it answered"
        try:
            req = urllib.request.Request(f"{base}/api/status", headers={"Authorization": f"token {token}"})
            with urllib.request.urlopen(req, timeout=3) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"JupyterLab did not answer on {base} within {timeout_s:.0f} s")


def differences(saved: dict, committed: dict) -> list[str]:
    """How two notebooks differ, cell by cell: what a reader of the failure needs to find
    the output that depends on the run (a table id, a timing, an address, a figure)."""
    out = []
    if saved.get("metadata") != committed.get("metadata"):
        keys = sorted(k for k in {*saved.get("metadata", {}), *committed.get("metadata", {})}
                      if saved.get("metadata", {}).get(k) != committed.get("metadata", {}).get(k))
        out.append(f"notebook metadata {keys}")
    if len(saved["cells"]) != len(committed["cells"]):
        return out + [f"{len(saved['cells'])} cells saved, {len(committed['cells'])} committed"]
    for i, (a, b) in enumerate(zip(saved["cells"], committed["cells"])):
        if a == b:
            continue
        what = [k for k in sorted({*a, *b}) if k != "outputs" and a.get(k) != b.get(k)]
        outs_a, outs_b = a.get("outputs", []), b.get("outputs", [])
        if outs_a != outs_b:
            kinds = sorted({m for oa, ob in zip(outs_a, outs_b) if oa != ob
                            for m in ({*oa.get("data", {}), *ob.get("data", {})} or {oa.get("output_type")})
                            if oa.get("data", {}).get(m) != ob.get("data", {}).get(m) or "data" not in oa})
            what.append(f"outputs ({', '.join(kinds) or f'{len(outs_a)} saved, {len(outs_b)} committed'})")
        head = "".join(b.get("source", ""))[:50].replace("\n", " ")
        out.append(f"cell {i} ({head!r}...): {', '.join(what)}")
    return out or ["the same JSON, written differently (run tools/normalize_notebooks.py)"]


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium; CI installs it)")
def test_every_notebook_runs_and_saves_clean_in_jupyterlab(tmp_path: Path):
    serve = tmp_path / "project" / "notebooks"
    serve.mkdir(parents=True)
    (tmp_path / "project" / "data").symlink_to(ROOT / "data", target_is_directory=True)
    for nb in NOTEBOOKS:
        shutil.copy2(nb, serve / nb.name)
    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    proc = _start_lab(serve, tmp_path, port, token)
    timings: dict[str, float] = {}
    problems: list[str] = []
    try:
        _wait_until_up(base, token, proc)
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                for nb in NOTEBOOKS:
                    t0 = time.monotonic()
                    problems += _run_in_lab(page, base, token, nb.name)
                    timings[nb.name] = time.monotonic() - t0
            finally:
                browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print("seconds per notebook in the lab:", {k: round(v) for k, v in timings.items()})
    assert not problems, "\n".join(problems)
    dirty = []
    for nb in NOTEBOOKS:  # what JupyterLab saved is what is committed: git status stays clean
        saved, committed = (serve / nb.name).read_text(encoding="utf-8"), nb.read_text(encoding="utf-8")
        if saved != committed:
            dirty.append(f"{nb.name}: " + "; ".join(differences(json.loads(saved), json.loads(committed))))
    assert not dirty, "saved from JupyterLab, these differ from the committed files:\n" + "\n".join(dirty)


def _run_in_lab(page, base: str, token: str, name: str) -> list[str]:
    """Open ``name``, Restart Kernel and Run All Cells, wait, save, close; the problems seen."""
    if "/lab" not in page.url:  # the first notebook loads JupyterLab itself
        page.goto(f"{base}/lab/tree/{name}?token={token}")
    else:  # the others are opened from the file browser, as a user would (no reload of the lab)
        page.locator(".jp-DirListing-item", has_text=name).dblclick()
    page.locator(".lm-TabBar-tab.jp-mod-current .lm-TabBar-tabLabel", has_text=name).wait_for(timeout=120_000)
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    panel.locator(".jp-Notebook").wait_for(timeout=120_000)
    # The kernel is up when the status bar names it and says Idle.
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=180_000)
    # Outputs cleared first, so that a stored "[n]:" prompt cannot pass for a fresh run.
    page.locator(".lm-MenuBar-itemLabel", has_text="Edit").click()
    page.locator(".lm-Menu-itemLabel", has_text="Clear Outputs of All Cells").click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt')]
                 .every(p => !/\\d/.test(p.textContent))""", timeout=30_000)
    page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    page.locator(".lm-Menu-itemLabel", has_text="Restart Kernel and Run All Cells").click()
    page.locator(".jp-Dialog button.jp-mod-accept").click()
    # Every code cell has run when each input prompt shows a number: "[*]" is queued or running.
    # An error stops "Run All" (the cells after it keep an empty prompt), so an error output
    # ends the wait too: the failure is then reported at once, naming the cell's error,
    # instead of after the whole timeout.
    page.wait_for_function(
        """() => {
            const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
            if (panel.querySelector(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")) {
                return true;
            }
            const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent);
            return prompts.length > 0 && prompts.every(t => /\\[\\d+\\]/.test(t));
        }""",
        timeout=RUN_TIMEOUT_MS,
    )
    problems = [f"{name}: {text[:500]}" for text in panel.locator(
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()]
    panel.locator(".jp-Notebook").click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+s")
    # Saved when the notebook's tab is no longer marked dirty.
    page.wait_for_function(
        "() => document.querySelector('.lm-TabBar-tab.jp-mod-current') !== null"
        " && document.querySelector('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty') === null",
        timeout=60_000,
    )
    _shut_down_kernels(page, base, token)
    page.locator(".lm-TabBar-tab.jp-mod-current .lm-TabBar-tabCloseIcon").click()
    return problems


def _shut_down_kernels(page, base: str, token: str) -> None:
    """Stop every kernel the lab runs, so the next notebook has the cores and the memory to itself."""
    headers = {"Authorization": f"token {token}"}
    for kernel in page.request.get(f"{base}/api/kernels", headers=headers).json():
        page.request.delete(f"{base}/api/kernels/{kernel['id']}", headers=headers)
