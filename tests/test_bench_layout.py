"""``bench/`` holds benchmark commands, ``bench/common/`` what they share, ``experiments/`` concluded experiments.

A command (``python -m bench.NAME``, one file of ``bench/``) imports what it shares with
other commands from ``bench.common``, never another command: so a command can be read, run
and changed alone, and a helper has one home. ``bench.common`` imports no command and no
experiment. An experiment (``python -m experiments.NAME``) may build on another experiment
and on ``bench.common``, never on a command. No import circle anywhere among them. As in
``tests/test_layout.py``, every import counts: at a module's top, inside a function, or
under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tools import import_graph

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("bench", "experiments")


MODULES = import_graph.modules(ROOT, TOPS)
#: The files of bench/ itself (``python -m bench.NAME``), of bench/common, and of experiments/.
COMMANDS = sorted(m for m, p in MODULES.items() if p.parent == ROOT / "bench" and p.name != "__init__.py")
COMMON = sorted(m for m in MODULES if m == "bench.common" or m.startswith("bench.common."))
EXPERIMENTS = sorted(m for m, p in MODULES.items() if p.parent == ROOT / "experiments" and p.name != "__init__.py")


def imports_of(path: Path) -> set[str]:
    """The bench and experiments modules ``path`` imports (``tools.import_graph.imports_of``)."""
    return import_graph.imports_of(path, TOPS, MODULES)


GRAPH = {m: imports_of(path) for m, path in MODULES.items()}


def test_the_folders_hold_what_they_should():
    assert "bench.common.record" in COMMON and "bench.gpu_check" in COMMANDS
    assert {"experiments.tensor_core_rowdot", "experiments.async_copy_rowdot"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("module", COMMANDS + EXPERIMENTS)
def test_a_command_or_an_experiment_is_something_to_run(module):
    """Each file of bench/ (and of experiments/) is run as ``python -m``: it has a ``main``
    and calls it when run; a helper that only other modules use belongs in bench/common."""
    tree = ast.parse(MODULES[module].read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    runs = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
    assert "main" in names and runs, (
        f"{module}: not a command (no main() run under __main__); a helper goes to bench/common"
    )


@pytest.mark.parametrize("module", COMMANDS)
def test_no_command_imports_another_command(module):
    others = sorted(GRAPH[module] & (set(COMMANDS) - {module}))
    assert not others, f"{module} imports the commands {others}; what commands share goes to bench/common"


@pytest.mark.parametrize("module", COMMON)
def test_bench_common_imports_no_command_and_no_experiment(module):
    wrong = sorted(GRAPH[module] & (set(COMMANDS) | set(EXPERIMENTS)))
    assert not wrong, f"{module} imports {wrong}; bench/common is imported by the commands, never the other way"


@pytest.mark.parametrize("module", EXPERIMENTS)
def test_an_experiment_imports_no_bench_command(module):
    wrong = sorted(GRAPH[module] & set(COMMANDS))
    assert not wrong, f"{module} imports the bench commands {wrong}; what it shares with them is in bench/common"


def test_no_import_circle():
    found = import_graph.circle(GRAPH)
    assert found is None, "import circle: " + " -> ".join(found or ())


def test_the_checker_sees_a_command_imported_inside_a_function(tmp_path):
    """The rules above read function-level imports too (a command that imports another
    lazily still depends on it), and those for type checkers."""
    f = tmp_path / "m.py"
    f.write_text(
        "def main():\n    from bench import gpu_check\n    from bench.common.kernels import BONSAI\n"
        "if TYPE_CHECKING:\n    from bench import one_launch\n"
    )
    assert import_graph.imports_of(f, TOPS, MODULES, type_checking=False) == {"bench.gpu_check", "bench.common.kernels"}
    assert imports_of(f) == {"bench.gpu_check", "bench.common.kernels", "bench.one_launch"}


@pytest.mark.parametrize("module", EXPERIMENTS)
def test_an_experiment_has_its_readme_line_and_its_cuda_source(module):
    """experiments/README.md says each one's question, answer and record; its CUDA is a
    source file beside it, not a Python string."""
    name = module.split(".")[1]
    readme = (ROOT / "experiments" / "README.md").read_text()
    assert f"| `{name}` |" in readme
    assert (ROOT / "experiments" / f"{name}.cu").is_file() and (ROOT / "experiments" / f"{name}.cuh").is_file()
    assert '= r"""' not in MODULES[module].read_text()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_bench_module_uses_a_private_name_of_the_package_or_another_module(module):
    # What a command needs of the workbench, or of bench.common, is that module's API:
    # a name without an underscore, which its owner keeps working for other modules.
    used = import_graph.private_reads(MODULES[module], ("workbench", *TOPS))
    assert not used, f"{module} uses private names of other modules: {used}"
