"""The package's parts and which may import which: no upward import, no import circle.

``workbench`` is split by role into subpackages (the fold, the models, the kernels, the
tail, the studies on it, real models, waits, the decode step, reports), over three shared
modules every part may use (``validate``, ``files``, ``backends``). Each part sits on a
level and imports only parts on lower levels, or modules of its own part, so a part can
be read with only what is below it in mind; ``docs/LAYOUT.md`` is the same map in prose.

Every import counts, at a module's top or inside a function, except those under
``if TYPE_CHECKING:`` (names for type checkers, never executed). Within one part, the
modules must not import each other in a circle either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "workbench"

#: level -> the parts on it, bottom first. A part is a subpackage, or one shared module.
LEVELS: dict[int, tuple[str, ...]] = {
    0: ("validate",),  # argument checks: the one message form
    1: ("files", "backends"),  # atomic files and the project's folders; which backends this machine has
    2: ("fold",),  # the block-Hadamard transform, the fold, and the weight matrices that carry it
    3: ("models",),  # real models' configs and the refusal rules over them
    4: ("kernels", "waits"),  # kernel sources and launches, one launch, a GDN step, Metal on the CPU; the plan, ledger, clock
    5: ("tail",),  # the tail's weights, math and three paths; the comparison; frink-models' test case
    6: ("studies", "real_models"),  # error studies; checkpoints, mlx-lm's model carrying them, SmolLM2 end to end
    7: ("decode",),  # a hybrid's decode step, stage by stage of the plan
    8: ("reports",),  # readers of bench records, tables and figures: import anything, imported by nothing
}
LEVEL_OF = {p: lvl for lvl, parts in LEVELS.items() for p in parts}


def part_of(module: str) -> str:
    """``workbench.tail.paths`` -> ``tail``; ``workbench.validate`` -> ``validate``."""
    return module.split(".")[1]


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (subpackage ``__init__`` included)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


MODULES = modules()


def imports_of(path: Path) -> set[str]:
    """The workbench modules ``path`` imports anywhere except under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(sub) for sub in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "workbench":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "workbench")
    found.discard("workbench")  # the public names: only the package's own __init__ reads them
    return found


PACKAGE_MODULES = sorted(m for m in MODULES if m != "workbench")


def test_every_part_has_a_level():
    assert sorted({part_of(m) for m in PACKAGE_MODULES}) == sorted(LEVEL_OF)


def test_every_subpackage_says_what_it_is_for():
    for m, path in MODULES.items():
        if path.name == "__init__.py":
            doc = ast.get_docstring(ast.parse(path.read_text()))
            assert doc and len(doc.split()) >= 15, f"{m}: its __init__ needs a docstring saying what the part is for"


@pytest.mark.parametrize("module", PACKAGE_MODULES)
def test_a_module_imports_only_lower_levels_or_its_own_part(module):
    mine = part_of(module)
    for dep in imports_of(MODULES[module]):
        theirs = part_of(dep)
        if theirs == mine:
            continue
        assert LEVEL_OF[theirs] < LEVEL_OF[mine], (
            f"{module} ({mine}, level {LEVEL_OF[mine]}) imports {dep} ({theirs}, level {LEVEL_OF[theirs]})")


def test_no_module_imports_a_private_name_of_another():
    for module in PACKAGE_MODULES:
        tree = ast.parse(MODULES[module].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("workbench"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{module} imports private names {private} from {node.module}"


def module_aliases(tree: ast.AST) -> dict[str, str]:
    """The names a module binds to workbench modules: ``from workbench.kernels import launch as K`` -> K."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("workbench"):
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULES:
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("workbench.") and a.asname:
                    out[a.asname] = a.name
    return out


@pytest.mark.parametrize("module", PACKAGE_MODULES)
def test_no_module_reads_a_private_name_of_another(module):
    # What one module needs of another is that module's API, named without an underscore.
    tree = ast.parse(MODULES[module].read_text())
    aliases = module_aliases(tree)
    used = sorted({f"{aliases[n.value.id]}.{n.attr}" for n in ast.walk(tree)
                   if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases
                   and n.attr.startswith("_") and not n.attr.startswith("__")})
    assert not used, f"{module} reads private names of other modules: {used}"


def test_the_import_graph_has_no_circle():
    # Between parts the levels imply it; within a part it is checked here, so a failure says which circle.
    graph = {m: imports_of(MODULES[m]) & set(MODULES) for m in PACKAGE_MODULES}
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, "import circle: " + " -> ".join(path + (m,))
        if m in done:
            return
        for dep in sorted(graph.get(m, ())):
            visit(dep, path + (m,))
        done.add(m)

    for m in PACKAGE_MODULES:
        visit(m, ())
