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

from tools import import_graph

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
    9: ("check",),  # a user's own tail checked: its forms, fault models, verdict and report
}
LEVEL_OF = {p: lvl for lvl, parts in LEVELS.items() for p in parts}


def part_of(module: str) -> str:
    """``workbench.tail.paths`` -> ``tail``; ``workbench.validate`` -> ``validate``."""
    return module.split(".")[1]


MODULES = import_graph.modules(PACKAGE.parent, ["workbench"])


def imports_of(path: Path) -> set[str]:
    """The workbench modules ``path`` imports (``tools.import_graph.imports_of``), less the
    package itself (the public names: only the package's own ``__init__`` reads them)."""
    return import_graph.imports_of(path, ["workbench"], MODULES)


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


@pytest.mark.parametrize("module", PACKAGE_MODULES)
def test_no_module_uses_a_private_name_of_another(module):
    # What one module needs of another is that module's API, named without an underscore.
    used = import_graph.private_reads(MODULES[module], ["workbench"])
    assert not used, f"{module} uses private names of other modules: {used}"


def test_the_import_graph_has_no_circle():
    # Between parts the levels imply it; within a part it is checked here, so a failure says which circle.
    graph = {m: imports_of(MODULES[m]) for m in PACKAGE_MODULES}
    found = import_graph.circle(graph)
    assert found is None, "import circle: " + " -> ".join(found or ())


def test_the_checker_sees_imports_inside_functions_and_private_reads(tmp_path):
    """The rules above read function-level imports (a lazy import is still a dependency),
    not those for type checkers, and a private name read off an imported module."""
    f = tmp_path / "m.py"
    f.write_text("from workbench.tail import paths as P\n"
                 "def f():\n    from workbench.decode import schedule\n    return P._empty_batch\n"
                 "if TYPE_CHECKING:\n    from workbench.reports import plots\n")
    assert imports_of(f) == {"workbench.tail.paths", "workbench.decode.schedule"}
    assert import_graph.private_reads(f, ["workbench"]) == ["workbench.tail.paths._empty_batch"]
    assert import_graph.circle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ("a", "b", "c", "a")
