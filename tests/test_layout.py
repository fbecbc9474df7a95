"""The package's parts and which may import which: no upward import, no import circle.

``workbench`` is split by role into subpackages (the fold, the models, the kernels, the
tail, the studies on it, real models, waits, the decode step, reports), over three shared
modules every part may use (``validate``, ``files``, ``backends``). Each part sits on a
level and imports only parts on lower levels, or modules of its own part, so a part can
be read with only what is below it in mind; ``docs/LAYOUT.md`` is the same map in prose.

Every import counts: at a module's top, inside a function, or under ``if TYPE_CHECKING:``
(a type a module names is part of what it means, so a circle there is still a circle).
Within one part, the modules must not import each other in a circle either. The package
also holds three size and shape rules here: no module over 600 lines, one module that
switches over the kernel backends (``tests/test_kernel_door.py``: no module default either).
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
    4: (
        "kernels",
        "waits",
    ),  # kernel sources and launches, one launch, a GDN step, Metal on the CPU; the plan, ledger, clock
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
            f"{module} ({mine}, level {LEVEL_OF[mine]}) imports {dep} ({theirs}, level {LEVEL_OF[theirs]})"
        )


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
    those for type checkers, and a private name read off an imported module."""
    f = tmp_path / "m.py"
    f.write_text(
        "from workbench.tail import paths as P\n"
        "def f():\n    from workbench.decode import schedule\n    return P._empty_batch\n"
        "if TYPE_CHECKING:\n    from workbench.reports import plots\n"
    )
    executed = import_graph.imports_of(f, ["workbench"], MODULES, type_checking=False)
    assert executed == {"workbench.tail.paths", "workbench.decode.schedule"}
    assert imports_of(f) == {"workbench.tail.paths", "workbench.decode.schedule", "workbench.reports.plots"}
    assert import_graph.private_reads(f, ["workbench"]) == ["workbench.tail.paths._empty_batch"]
    assert import_graph.circle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ("a", "b", "c", "a")


#: The most lines a module of the package may have: past it a module holds more than one
#: concept, and a reader has to hold them all to change one.
MAX_MODULE_LINES = 600


@pytest.mark.parametrize("module", PACKAGE_MODULES)
def test_no_module_is_over_the_line_limit(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module}: {lines} lines (at most {MAX_MODULE_LINES}: split it by concept)"


#: The one module that switches over the kernel backends (``workbench.backends`` resolves
#: which exist on this machine; ``workbench.kernels.run`` is the door every launch goes through).
BACKEND_SWITCHES = {"workbench.backends", "workbench.kernels.run"}


#: The kernel backends by name, and the constants that stand for one of them.
KERNEL_BACKEND_NAMES = {"metal", "cuda", "metal-emulated"}
KERNEL_BACKEND_CONSTANTS = {"METAL", "CUDA", "METAL_EMULATED"}


def backend_comparisons(path: Path) -> list[str]:
    """Each ``==``, ``!=``, ``in`` or ``not in`` that asks whether a value named
    ``...backend`` or ``...dialect`` (a variable, an attribute, a key) is one particular
    kernel backend (a name of one, a constant for one, or a literal collection of them):
    a switch over the kernel backends, as ``line: source``. Membership in the whole set of
    backends is validation, and comparing two backend values is a filter; neither is a switch."""

    def named(n: ast.AST) -> bool:
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
            name = str(n.slice.value)
        else:
            name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""
        return name.lower().endswith(("backend", "dialect"))

    def one_backend(n: ast.AST) -> bool:
        if isinstance(n, ast.Constant):
            return n.value in KERNEL_BACKEND_NAMES
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            return any(one_backend(e) for e in n.elts)
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""
        return name in KERNEL_BACKEND_CONSTANTS

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        if not all(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
            continue
        sides = [node.left, *node.comparators]
        if any(named(n) for n in sides) and any(one_backend(n) for n in sides if not named(n)):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


@pytest.mark.parametrize("module", sorted(set(PACKAGE_MODULES) - BACKEND_SWITCHES))
def test_only_the_kernel_door_switches_over_kernel_backends(module):
    found = backend_comparisons(MODULES[module])
    assert not found, (
        f"{module} switches over kernel backends ({found}): ask workbench.kernels.run, "
        f"the one door every kernel launch goes through"
    )


def test_the_backend_switch_checker_sees_comparisons(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "if self.backend == 'metal-emulated': pass\nif dialect in KERNEL_BACKENDS: pass\n"
        "if backend == 'graph': pass\nif backend is None: pass\nif d['backend'] != backend: pass\n"
        "if dialect in ('metal', METAL_EMULATED): pass\nif x.dialect != k.CUDA: pass\n"
    )
    assert backend_comparisons(f) == [
        "1: self.backend == 'metal-emulated'",
        "6: dialect in ('metal', METAL_EMULATED)",
        "7: x.dialect != k.CUDA",
    ]
