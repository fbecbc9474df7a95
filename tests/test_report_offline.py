"""The HTML report renders its math with the network off.

Renders notebook 01 (its stored outputs; `make report` executes first, then renders the
same way, through ``tools/report.py``), opens the page in headless Chromium with every
request that leaves the machine refused, and checks that MathJax (the copy beside the
page) typeset the TeX: the rotation ``R = B P D`` is rendered math, and no raw ``$...$``
is left on the page.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools.report import write_report

ROOT = Path(__file__).resolve().parents[1]

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")


@pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium; CI installs it)"
)
def test_the_report_renders_its_math_offline(tmp_path: Path):
    page_path = write_report([ROOT / "notebooks" / "01_hadamard_fold.ipynb"], tmp_path, execute=False)[0]
    refused: list[str] = []

    def offline(route):
        url = route.request.url
        if url.startswith("file://"):
            route.continue_()
        else:  # the network is off: nothing may come from elsewhere
            refused.append(url)
            route.abort()

    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(offline=True)
            page = context.new_page()
            page.route("**/*", offline)
            page.goto(page_path.as_uri())
            # MathJax 2 puts the rendered formula just before each TeX script it typeset
            # (class MathJax, or MathJax_Error where it failed); wait until every one has it.
            rendered = """() => {
                const scripts = [...document.querySelectorAll('script[type^="math/tex"]')];
                const done = scripts.map(s => s.previousElementSibling ? s.previousElementSibling.className : '');
                return scripts.length > 0 && done.every(c => c === 'MathJax' || c === 'MathJax_Error'
                                                              || c === 'MathJax_Display') ? done : null;
            }"""
            done = page.wait_for_function(rendered, timeout=90_000).json_value()
            errors = page.evaluate("() => [...document.querySelectorAll('.MathJax_Error')].map(e => e.textContent)")
            text = page.inner_text("body")
        finally:
            browser.close()
    assert len(done) >= 10 and not errors, errors  # every formula became rendered math, none failed
    assert "$R = B" not in text and "\\mathrm{diag}" not in text  # no raw TeX left on the page
    assert all("mathjax" not in u.lower() for u in refused)  # MathJax came from the copy, not a CDN
