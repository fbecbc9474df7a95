"""One door to the kernels: the kernels never import the tail (the launch contract is theirs),
and no module default is left for a bench to flip. ``tests/test_layout.py`` holds the rule
that only ``workbench.kernels.run`` switches over the kernel backends."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "workbench"


def test_the_kernels_never_import_the_tail():
    # Not even under TYPE_CHECKING: the launch contract is the kernels' own (kernels/contract.py).
    for path in sorted((PACKAGE / "kernels").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n == "workbench.tail" or n.startswith("workbench.tail.") for n in names), path.name


def test_no_module_default_is_left_to_flip():
    for root in (PACKAGE, PACKAGE.parent / "bench"):
        for path in root.rglob("*.py"):
            text = path.read_text()
            assert (
                "def set_default_" not in text
                and ".set_default_tuning" not in text
                and ".set_default_shape" not in text
            ), path
