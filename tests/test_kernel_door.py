"""One door to the kernels: no module but ``workbench.kernels.run`` (and ``workbench.backends``)
compares a backend's name, and the kernels never import the tail (the launch contract is theirs)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "workbench"
ALLOWED = {PACKAGE / "kernels" / "run.py", PACKAGE / "backends.py"}
NAMES = {"metal", "cuda", "metal-emulated"}
CONSTANTS = {"METAL_EMULATED", "KERNEL_BACKENDS", "DEVICE_BACKENDS", "GDN_BACKENDS", "DIALECTS"}


def _is_backend_variable(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.endswith("backend") or name.endswith("dialect")


def _is_backend_value(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_backend_value(e) for e in node.elts)
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in CONSTANTS


def comparisons(path: Path) -> list[str]:
    """``path``'s comparisons of a backend/dialect variable with a kernel backend's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        ops = [op for op in node.ops if isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))]
        if ops and any(_is_backend_variable(s) for s in sides) and any(_is_backend_value(s) for s in sides):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_only_the_door_switches_on_a_kernel_backend():
    found = [c for p in sorted(PACKAGE.rglob("*.py")) if p not in ALLOWED for c in comparisons(p)]
    assert not found, f"compare a backend's name through workbench.kernels.run instead: {found}"


def test_the_scan_sees_a_switch(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('if self.backend == "metal-emulated":\n    pass\nif dialect in KERNEL_BACKENDS:\n    pass\n'
                 'if backend == "graph":\n    pass\n')
    assert len(comparisons_of(f)) == 2


def comparisons_of(path: Path) -> list[int]:
    return [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Compare)
            and any(_is_backend_variable(s) for s in [n.left, *n.comparators])
            and any(_is_backend_value(s) for s in [n.left, *n.comparators])]


def test_the_kernels_never_import_the_tail():
    # Not even under TYPE_CHECKING: the launch contract is the kernels' own (kernels/contract.py).
    for path in sorted((PACKAGE / "kernels").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "workbench.tail" or n.startswith("workbench.tail.") for n in names), path.name


def test_no_module_default_is_left_to_flip():
    for root in (PACKAGE, PACKAGE.parent / "bench"):
        for path in root.rglob("*.py"):
            text = path.read_text()
            assert "def set_default_" not in text and ".set_default_tuning" not in text \
                and ".set_default_shape" not in text, path
