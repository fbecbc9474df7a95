"""The notebooks in JupyterLab itself, driven through its UI in a real browser.

The promise: opening a notebook in JupyterLab, running it and saving it leaves ``git status``
clean. nbval runs the notebooks through a kernel, but a user runs them in JupyterLab. The
promise is checked in three parts, so that ``make test`` runs each notebook once (under
nbval) and not a second time here:

1. **Every notebook opened and saved** (this file): JupyterLab (``make lab``, the README's
   command, or where the project's ``.venv`` is not built the same ``jupyter lab`` command
   from this Python) serves a scratch copy of notebooks/ (beside a link to data/, so the
   notebooks' ``../data`` paths hold); headless Chromium (Debian's, driven by playwright)
   opens each notebook, waits for its kernel (the kernel fills in the notebook's
   ``language_info``), and saves it from the UI. The file written must be the committed
   one, byte for byte: JupyterLab's save leaves every committed notebook, its outputs and
   metadata, as it is (the normal form of ``tools/normalize_notebooks.py``).
2. **One notebook run through the UI** (this file): notebook 01 (both kinds of output the
   notebooks show: printed text and PNG figures) has its outputs cleared, "Restart Kernel
   and Run All Cells" from the Kernel menu, every code cell must run with no error or
   stderr output, and the file saved from JupyterLab must be the committed one, byte for
   byte: the outputs of a live run are written in the committed form.
3. **Every notebook's run reproduces its outputs** (``tests/nbval_exact_outputs.py``, a
   plugin ``make nbval`` loads): in the run strict nbval already makes, every cell's
   outputs must equal the committed ones byte for byte, those nbval does not compare
   (``# NBVAL_IGNORE_OUTPUT``: device figures, PNG figures) included.

So a run of any notebook in JupyterLab gives the committed outputs (3), which JupyterLab
writes in the committed form (2) and saves as the committed file (1). Where files differ,
the message names each cell that differs and how.

``WORKBENCH_LAB_RUN=01,03`` runs the notebooks whose names start so through the UI
(part 2) instead of 01; ``WORKBENCH_LAB_RUN=all`` runs every notebook through the UI (the
whole promise in the browser alone, without part 3; minutes).

Skipped, saying why, only where Chromium or playwright is absent (CI installs both).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lab_processes import free_port, stop_group

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium; CI installs it)"
)


def _run_in_ui() -> list[Path]:
    """The notebooks run through the UI: ``WORKBENCH_LAB_RUN`` (``all``, or name prefixes), else 01."""
    chosen = os.environ.get("WORKBENCH_LAB_RUN", "01")
    if chosen == "all":
        return NOTEBOOKS
    found = [p for p in NOTEBOOKS if p.name.startswith(tuple(chosen.split(",")))]
    if not found:
        raise ValueError(f"WORKBENCH_LAB_RUN: must be 'all' or prefixes of notebooks/ names, got {chosen!r}")
    return found


#: What a notebook may take to run all its cells in the lab on 2 busy cores.
RUN_TIMEOUT_MS = 600_000


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
    (config / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "LabApp": {
                    "user_settings_dir": str(_lab_settings(tmp / "lab-settings")),
                    "workspaces_dir": str(tmp / "workspaces"),
                }
            }
        )
    )
    env = dict(
        os.environ,
        JUPYTER_TOKEN=token,
        JUPYTER_CONFIG_DIR=str(config),
        PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
    )
    if (ROOT / ".venv" / ".installed").exists() and shutil.which("make"):
        cmd = ["make", "-s", "lab", f"PORT={port}", f"NOTEBOOKS={serve}"]
    else:  # the Makefile's lab command, from this Python's environment
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--ServerApp.root_dir={serve}",
            "--ContentsManager.pre_save_hook=tools.normalize_notebooks.pre_save",
        ] + (["--allow-root"] if os.geteuid() == 0 else [])
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


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


@dataclass
class Lab:
    """One JupyterLab server and one browser page on it, shared by the tests below (each
    start costs seconds of the 2 cores)."""

    page: object
    base: str
    token: str
    serve: Path

    def fresh_copy(self, nb: Path) -> Path:
        """The committed file in the served folder, dated in the past: a save moves its date."""
        served = self.serve / nb.name
        shutil.copyfile(nb, served)
        os.utime(served, ns=(10**18, 10**18))
        return served


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("lab")
    serve = tmp / "project" / "notebooks"
    serve.mkdir(parents=True)
    (tmp / "project" / "data").symlink_to(ROOT / "data", target_is_directory=True)
    for nb in NOTEBOOKS:
        shutil.copy2(nb, serve / nb.name)
    port, token = free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    proc = _start_lab(serve, tmp, port, token)
    try:
        _wait_until_up(base, token, proc)
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{base}/lab?token={token}")
                page.locator(".jp-DirListing-item").first.wait_for(timeout=120_000)
                yield Lab(page, base, token, serve)
            finally:
                browser.close()
    finally:
        stop_group(proc, 30)


def differences(saved: dict, committed: dict) -> list[str]:
    """How two notebooks differ, cell by cell: what a reader of the failure needs to find
    the output that depends on the run (a table id, a timing, an address, a figure)."""
    out = []
    if saved.get("metadata") != committed.get("metadata"):
        keys = sorted(
            k
            for k in {*saved.get("metadata", {}), *committed.get("metadata", {})}
            if saved.get("metadata", {}).get(k) != committed.get("metadata", {}).get(k)
        )
        out.append(f"notebook metadata {keys}")
    if len(saved["cells"]) != len(committed["cells"]):
        return out + [f"{len(saved['cells'])} cells saved, {len(committed['cells'])} committed"]
    for i, (a, b) in enumerate(zip(saved["cells"], committed["cells"])):
        if a == b:
            continue
        what = [k for k in sorted({*a, *b}) if k != "outputs" and a.get(k) != b.get(k)]
        outs_a, outs_b = a.get("outputs", []), b.get("outputs", [])
        if outs_a != outs_b:
            kinds = sorted(
                {
                    m
                    for oa, ob in zip(outs_a, outs_b)
                    if oa != ob
                    for m in ({*oa.get("data", {}), *ob.get("data", {})} or {oa.get("output_type")})
                    if oa.get("data", {}).get(m) != ob.get("data", {}).get(m) or "data" not in oa
                }
            )
            what.append(f"outputs ({', '.join(kinds) or f'{len(outs_a)} saved, {len(outs_b)} committed'})")
        head = "".join(b.get("source", ""))[:50].replace("\n", " ")
        out.append(f"cell {i} ({head!r}...): {', '.join(what)}")
    return out or ["the same JSON, written differently (run tools/normalize_notebooks.py)"]


def _dirty(saved: Path, committed: Path) -> str | None:
    """None where the saved file is the committed one byte for byte (what ``git status``
    compares), else the notebook's name and how the two differ."""
    a, b = saved.read_text(encoding="utf-8"), committed.read_text(encoding="utf-8")
    if a == b:
        return None
    return f"{committed.name}: " + "; ".join(differences(json.loads(a), json.loads(b)))


def test_every_notebook_opened_and_saved_in_jupyterlab_is_unchanged(lab: Lab):
    """Part 1: each notebook opened, its kernel up, saved from the UI: the committed file."""
    timings: dict[str, tuple[float, float]] = {}
    dirty = []
    for nb in NOTEBOOKS:
        served = lab.fresh_copy(nb)
        t0 = time.monotonic()
        _open(lab, nb.name)
        t1 = time.monotonic()
        _save(lab)
        _close(lab)
        timings[nb.name] = (round(t1 - t0, 1), round(time.monotonic() - t1, 1))
        assert served.stat().st_mtime_ns != 10**18, f"{nb.name}: the save wrote nothing"
        if (d := _dirty(served, nb)) is not None:
            dirty.append(d)
    print("seconds per notebook in the lab (open, save):", timings)
    assert not dirty, "saved from JupyterLab, these differ from the committed files:\n" + "\n".join(dirty)


def test_a_notebook_run_in_jupyterlab_saves_as_committed(lab: Lab):
    """Part 2: Restart Kernel and Run All Cells through the UI, then save: the committed file."""
    timings: dict[str, float] = {}
    problems, dirty = [], []
    for nb in _run_in_ui():
        served = lab.fresh_copy(nb)
        t0 = time.monotonic()
        _open(lab, nb.name)
        problems += _run_all(lab, nb.name)
        _save(lab)
        _close(lab)
        timings[nb.name] = time.monotonic() - t0
        assert served.stat().st_mtime_ns != 10**18, f"{nb.name}: the save wrote nothing"
        if (d := _dirty(served, nb)) is not None:
            dirty.append(d)
    print("seconds per notebook run in the lab:", {k: round(v) for k, v in timings.items()})
    assert not problems, "\n".join(problems)
    assert not dirty, "run and saved in JupyterLab, these differ from the committed files:\n" + "\n".join(dirty)


def _open(lab: Lab, name: str) -> None:
    """Open ``name`` from the file browser, as a user would, and wait for its kernel to be idle."""
    page = lab.page
    page.locator(".jp-DirListing-item", has_text=name).dblclick()
    page.locator(".lm-TabBar-tab.jp-mod-current .lm-TabBar-tabLabel", has_text=name).wait_for(timeout=120_000)
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").wait_for(timeout=120_000)
    # The kernel is up when the status bar names it and says Idle.
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=180_000)


def _run_all(lab: Lab, name: str) -> list[str]:
    """Clear the outputs, Restart Kernel and Run All Cells, wait; the problems seen."""
    page = lab.page
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    # Outputs cleared first, so that a stored "[n]:" prompt cannot pass for a fresh run.
    page.locator(".lm-MenuBar-itemLabel", has_text="Edit").click()
    page.locator(".lm-Menu-itemLabel", has_text="Clear Outputs of All Cells").click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt')]
                 .every(p => !/\\d/.test(p.textContent))""",
        timeout=30_000,
    )
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
    return [
        f"{name}: {text[:500]}"
        for text in panel.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
        ).all_inner_texts()
    ]


def _save(lab: Lab) -> None:
    """Ctrl+S in the notebook; done when the server has answered JupyterLab's write (the
    file is then whole on disk) and the tab is no longer marked dirty."""
    page = lab.page
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").click(position={"x": 5, "y": 5})
    with page.expect_response(
        lambda r: r.request.method == "PUT" and "/api/contents/" in r.url, timeout=60_000
    ) as written:
        page.keyboard.press("Control+s")
    assert written.value.ok, f"JupyterLab's save failed: {written.value.status} {written.value.text()[:500]}"
    page.wait_for_function(
        "() => document.querySelector('.lm-TabBar-tab.jp-mod-current') !== null"
        " && document.querySelector('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty') === null",
        timeout=60_000,
    )


def _close(lab: Lab) -> None:
    """Stop every kernel the lab runs (the next notebook has the cores and the memory to
    itself), then close the notebook's tab."""
    headers = {"Authorization": f"token {lab.token}"}
    for kernel in lab.page.request.get(f"{lab.base}/api/kernels", headers=headers).json():
        lab.page.request.delete(f"{lab.base}/api/kernels/{kernel['id']}", headers=headers)
    lab.page.locator(".lm-TabBar-tab.jp-mod-current .lm-TabBar-tabCloseIcon").click()
