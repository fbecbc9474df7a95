"""The README's examples run as written, and print what the README says they print.

A reader copies an example before reading anything else; one that fails (a file that does
not exist, a name never defined) is the first thing they learn about the project. So every
```python block of README.md, and of the documents it sends a reader to for an example
(docs/CHECKPOINTS.md: the own-checkpoint example), runs here as a script of its own, in a
child process started in the project's root (as a user starts ``python`` there); where the
text after a block quotes what it prints ("prints `PASS at tol ...; ...`"), the printed
line must start with the quoted part before its ``...``. Inline calls of the package's
front names (``refusal_table(load_model("bonsai-27b"))``) are evaluated too, when every
name they use is one ``workbench`` exports.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import workbench

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/CHECKPOINTS.md")
BLOCK = re.compile(r"```python\n(.*?)```\n(.*?)(?:\n\n|\Z)", re.S)
#: The quoted output after a block: "prints `...`" (the sentence may break the line first).
QUOTED = re.compile(r"prints\s+`([^`]+)`")


def examples() -> list[tuple[str, int, str, str | None]]:
    """(document, block number, code, the quoted start of its first printed line or None)."""
    out = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for i, m in enumerate(BLOCK.finditer(text)):
            quoted = QUOTED.search(m.group(2))
            prefix = None if quoted is None else re.split(r"\s*\.\.\.", quoted.group(1))[0].rstrip("; ")
            out.append((doc, i, m.group(1), prefix or None))
    return out


EXAMPLES = examples()


def test_there_are_examples_to_run():
    """The readers' way in has examples, and at least one quotes its output (else this file checks nothing)."""
    assert any(doc == "README.md" for doc, *_ in EXAMPLES)
    assert any(prefix for *_, prefix in EXAMPLES)


@pytest.mark.parametrize("doc, i, code, prefix", EXAMPLES, ids=[f"{d}#{i}" for d, i, *_ in EXAMPLES])
def test_an_example_runs_as_written_and_prints_what_it_says(doc, i, code, prefix):
    # The quoted outputs are MLX's CPU's (the documents say so): on a machine with a GPU the
    # example runs with the CPU as MLX's default device, so its digits are the ones quoted.
    cpu = "import mlx.core as _mx; _mx.set_default_device(_mx.cpu)\n" if prefix is not None else ""
    r = subprocess.run([sys.executable, "-c", cpu + code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, f"{doc}, python block {i}, failed:\n{r.stderr[-3000:]}"
    if prefix is not None:
        first = r.stdout.strip().splitlines()[0] if r.stdout.strip() else ""
        assert first.startswith(prefix), f"{doc}, python block {i}: says it prints {prefix!r}...; printed {first!r}"


def inline_calls(text: str) -> list[str]:
    """The inline code spans that are calls using only names ``workbench`` exports."""
    out = []
    for span in re.findall(r"`([^`\n]+\))`", text):
        try:
            tree = ast.parse(span, mode="eval")
        except SyntaxError:
            continue
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        if isinstance(tree.body, ast.Call) and names and names <= set(workbench.__all__):
            out.append(span)
    return out


INLINE = inline_calls((ROOT / "README.md").read_text(encoding="utf-8"))


def test_the_readme_names_calls_to_try():
    assert 'refusal_table(load_model("bonsai-27b"))' in INLINE


@pytest.mark.parametrize("call", INLINE)
def test_an_inline_call_of_the_readme_runs(call):
    namespace = {name: getattr(workbench, name) for name in workbench.__all__}
    assert eval(call, namespace) is not None


def test_the_readme_lists_every_notebook_and_counts_none():
    """The README's notebook table names exactly the notebooks in ``notebooks/`` (a notebook
    added without its row, or a row left for one removed, fails here), and no sentence of the
    README counts them in words: a count typed once goes stale with the next notebook."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The notebooks", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\d\d_[a-z0-9_]+)` \|", section, re.M)
    present = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(listed) == present, f"README lists {listed}; notebooks/ holds {present}"
    words = "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|\\d+"
    counted = re.findall(rf"\b(?:{words})\s+notebooks\b", text, re.I)
    assert not counted, f"the README counts the notebooks ({counted}); say 'the notebooks' and let the table list them"
