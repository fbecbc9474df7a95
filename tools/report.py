"""Write the notebooks as HTML pages whose math renders with no network.

Why: nbconvert's HTML loads MathJax from a CDN, so a report opened offline (on a plane,
behind a firewall, years later) showed ``$R = B\\,P\\,D$`` as raw TeX. Here the report
folder carries its own MathJax: the copy the ``jupyter-server-mathjax`` package ships
(MathJax 2.7, installed by the project's set-up), copied to ``<out>/mathjax/`` and named
by a relative URL, so the folder renders anywhere it is moved, with no server.

    python tools/report.py --execute --out report notebooks/*.ipynb    # what `make report` runs
    python tools/report.py --out report notebooks/01_hadamard_fold.ipynb  # stored outputs, no kernel
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

if __package__:  # imported as tools.report (the tests)
    from tools.notebook_file import read_notebook
else:  # run as python tools/report.py: tools/ is on sys.path
    from notebook_file import read_notebook

ROOT = Path(__file__).resolve().parents[1]
#: The MathJax configurations the report loads, in order: the combined TeX-in, HTML-CSS-out
#: one the package ships, the Safe extension, and ours (below).
MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe,local/workbench"
#: Ours: the package ships only the STIX-Web fonts, not MathJax's default TeX fonts, so
#: HTML-CSS is told to use those; left at its default it asks for the absent TeX font data
#: and fails on glyphs such as a prime (``W'``) with "[Math Processing Error]".
LOCAL_CONFIG = """MathJax.Hub.Config({
  "HTML-CSS": {availableFonts: ["STIX-Web"], preferredFont: "STIX-Web", webFont: "STIX-Web", imageFont: null}
});
MathJax.Ajax.loadComplete("[MathJax]/config/local/workbench.js");
"""


def mathjax_source() -> Path:
    """The MathJax 2 folder shipped by ``jupyter-server-mathjax``; raises if it is not installed."""
    try:
        import jupyter_server_mathjax
    except ImportError as e:
        raise RuntimeError(
            "the offline report needs the package jupyter-server-mathjax "
            "(pip install -e '.[test]', which `make report` runs)"
        ) from e
    src = Path(jupyter_server_mathjax.__file__).parent / "static"
    if not (src / "MathJax.js").is_file():
        raise RuntimeError(f"jupyter-server-mathjax has no MathJax.js under {src}")
    return src


def write_report(notebooks: list[Path], out: Path, *, execute: bool, timeout_s: int = 1800) -> list[Path]:
    """Write ``<out>/<name>.html`` for each notebook, with MathJax copied to ``<out>/mathjax``.

    ``execute``: run each notebook first (in its own folder, as nbval and JupyterLab do),
    else render its stored outputs. Returns the pages written.
    """
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CellExecutionError, ExecutePreprocessor

    out.mkdir(parents=True, exist_ok=True)
    target = out / "mathjax"
    if not (target / "MathJax.js").is_file():
        shutil.copytree(mathjax_source(), target, dirs_exist_ok=True)
    (target / "config" / "local").mkdir(parents=True, exist_ok=True)
    (target / "config" / "local" / "workbench.js").write_text(LOCAL_CONFIG, encoding="utf-8")
    exporter = HTMLExporter(template_name="lab", mathjax_url=f"mathjax/MathJax.js?config={MATHJAX_CONFIG}")
    pages = []
    for nb_path in notebooks:
        nb = read_notebook(nb_path)
        if execute:
            try:
                ExecutePreprocessor(timeout=timeout_s, kernel_name="python3").preprocess(
                    nb, {"metadata": {"path": str(nb_path.resolve().parent)}}
                )
            except CellExecutionError as err:  # the cell's own traceback is in the notebook, not here
                raise ValueError(f"{nb_path}: a cell raised {err.ename}: {err.evalue}") from None
        body, _ = exporter.from_notebook_node(nb)
        page = out / (nb_path.stem + ".html")
        tmp = page.with_suffix(".html.tmp")
        tmp.write_text(body, encoding="utf-8")
        tmp.replace(page)  # a page is whole or absent, never half written
        pages.append(page)
        print(f"wrote {page}", flush=True)
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/report.py",
        description="Write notebooks as HTML pages whose math renders offline (MathJax copied beside them).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("notebooks", nargs="+", type=Path, help="the notebooks to render")
    parser.add_argument("--out", type=Path, default=ROOT / "report", help="the folder to write the pages to")
    parser.add_argument("--execute", action="store_true", help="execute each notebook before rendering it")
    args = parser.parse_args(argv)
    missing = [p for p in args.notebooks if not p.is_file()]
    if missing:
        parser.error("notebooks: no such file: " + ", ".join(map(str, missing)))
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out}: is a file; name a folder")
    try:  # every notebook checked before any page is written
        for p in args.notebooks:
            read_notebook(p)
        write_report(args.notebooks, args.out, execute=args.execute)
    except (ValueError, OSError, RuntimeError) as err:  # a malformed notebook, a folder not writable, no MathJax
        parser.error(" ".join(str(err).split()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
