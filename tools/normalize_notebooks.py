"""Write notebooks in the form JupyterLab 4 writes when it saves them, or check that they are.

Why: a notebook executed by ``jupyter nbconvert --execute`` carries per-cell execution
timestamps (``metadata.execution``) and the kernelspec's display name as nbconvert found
it ("Python 3"). Opening it in JupyterLab, running it and saving drops the timestamps and
writes the display name of the kernel it ran ("Python 3 (ipykernel)"), so a user who only
ran a notebook would see a git diff though no output changed. Committed notebooks are kept
in JupyterLab's form (:func:`normal_text`), so that saving an unchanged notebook in
JupyterLab leaves git clean. Usage (from the project's root)::

    python tools/normalize_notebooks.py            # rewrite notebooks/*.ipynb in place
    python tools/normalize_notebooks.py --check    # exit 1 naming each notebook not in the form
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

import nbformat

if __package__:  # imported as tools.normalize_notebooks (the tests)
    from tools.notebook_file import notebook_text
else:  # run as python tools/normalize_notebooks.py: tools/ is on sys.path
    from notebook_file import notebook_text

ROOT = Path(__file__).resolve().parents[1]
#: The tag of a cell whose printed digits depend on the CPU that ran it (``tests/nbval_exact_outputs.py``).
CPU_DIGITS = "cpu-dependent-digits"

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def normal_text(text: str) -> str:
    """The notebook ``text`` (its JSON) in the normal form, as text.

    The normal form (seen by saving every notebook from JupyterLab 4.6 in headless Chromium,
    after "Restart Kernel and Run All Cells", and diffing; ``tests/test_lab_browser.py``
    repeats that check on every run):

    * no ``execution`` entry in any cell's metadata (other cell metadata, e.g. tags, is kept);
    * consecutive stream outputs of the same stream (stdout, stderr) merged into one, as
      JupyterLab's output area merges them (nbconvert keeps one per message the kernel sent,
      so a cell that prints twice could be stored as two outputs or one);
    * the kernelspec ``{"display_name": "Python 3 (ipykernel)", "language": "python",
      "name": "python3"}`` (the one ``make`` installs into ``.venv``);
    * serialized as ``nbformat.writes`` does (one-space indent, sorted keys, UTF-8 kept),
      with one newline at the end, as the Jupyter server writes it.

    * no outputs in a cell tagged :data:`CPU_DIGITS` (its digits depend on the CPU that ran
      it: no saved output could be every CPU's, so none is saved; JupyterLab's save drops
      them too, through :func:`pre_save`, which ``make lab`` installs);

    Outputs, execution counts, cell ids and ``language_info`` are otherwise left as they are:
    they are what the last run produced.
    """
    nb = nbformat.reads(text, as_version=4)
    nb = copy.deepcopy(nb)
    nb.metadata["kernelspec"] = nbformat.from_dict(dict(KERNELSPEC))
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = [] if CPU_DIGITS in cell.metadata.get("tags", []) else _merge_streams(cell.outputs)
    return nbformat.writes(nb) + "\n"


def pre_save(model: dict, **kwargs) -> None:
    """JupyterLab's pre-save hook (``--ContentsManager.pre_save_hook=tools.normalize_notebooks.pre_save``,
    as ``make lab`` runs it): a notebook's cells tagged :data:`CPU_DIGITS` saved without their
    outputs, so that a run and a save on any CPU leaves ``git status`` clean. The outputs stay
    on the screen; the asserts in those cells hold the claims."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    for cell in model["content"].get("cells", []):
        if cell.get("cell_type") == "code" and CPU_DIGITS in cell.get("metadata", {}).get("tags", []):
            cell["outputs"] = []


def _merge_streams(outputs: list) -> list:
    """``outputs`` with each run of stream outputs of the same name joined into one."""
    merged: list = []
    for out in outputs:
        if (
            out.get("output_type") == "stream"
            and merged
            and merged[-1].get("output_type") == "stream"
            and merged[-1].get("name") == out.get("name")
        ):
            merged[-1]["text"] = _text(merged[-1]["text"]) + _text(out["text"])
        else:
            merged.append(out)
    return merged


def _text(text) -> str:
    return text if isinstance(text, str) else "".join(text)


def _write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` in one step, so an interrupted run never leaves half a notebook."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def not_normal(paths: list[Path]) -> list[Path]:
    """The notebooks among ``paths`` whose file is not in the normal form."""
    return [p for p in paths if (text := notebook_text(p)) != normal_text(text)]


def normalize(paths: list[Path]) -> list[Path]:
    """Rewrite each notebook of ``paths`` that is not in the normal form; return those rewritten."""
    changed = []
    for p in paths:
        text = notebook_text(p)
        new = normal_text(text)
        if new != text:
            _write_atomically(p, new)
            changed.append(p)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/normalize_notebooks.py",
        description="Write notebooks in the form JupyterLab 4 saves them in (no execution timestamps, "
        "the ipykernel display name), or check that they are.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "notebooks",
        nargs="*",
        type=Path,
        help="notebooks to normalize (default: every notebooks/*.ipynb of the project)",
    )
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if any notebook is not in the form"
    )
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    missing = [p for p in paths if not p.is_file()]
    if missing:
        parser.error("notebooks: no such file: " + ", ".join(map(str, missing)))
    try:  # every file is read and checked before any is rewritten: a bad one changes nothing
        for p in paths:
            notebook_text(p)
        if args.check:
            bad = not_normal(paths)
            for p in bad:
                print(
                    f"{os.path.relpath(p)}: not in JupyterLab's normal form "
                    f"(run: python tools/normalize_notebooks.py {os.path.relpath(p)})"
                )
            return 1 if bad else 0
        for p in normalize(paths):
            print(f"normalized {os.path.relpath(p)}")
    except (ValueError, OSError) as err:  # a malformed notebook, a file that cannot be read or written
        parser.error(" ".join(str(err).split()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
