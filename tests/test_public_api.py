"""The package's top level: the names a user reaches for first, and a light import."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import workbench


def test_every_public_name_is_the_object_of_its_home_module():
    import importlib

    assert len(set(workbench.__all__)) == len(workbench.__all__)
    for name in workbench.__all__:
        obj = getattr(workbench, name)
        if callable(obj):  # functions and classes say where they live; it must be that module's object
            home = importlib.import_module(obj.__module__)
            assert obj.__module__.startswith("workbench.") and getattr(home, name) is obj, name


def test_the_readme_import_works():
    from workbench import HadamardFold, compare, fused_tail, host_tail, load_model, seed_case  # noqa: F401

    c = seed_case()
    assert compare(
        fused_tail(c.weights, c.branch, c.residual, backend="graph"), host_tail(c.weights, c.branch, c.residual)
    ).passed


def test_importing_workbench_loads_no_pandas_or_matplotlib():
    code = "import sys, workbench; print('pandas' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_public_name_imports_its_part_on_first_use():
    """``import workbench`` imports no part of the package; a public name imports its home
    module when first read, and a part read as an attribute (``workbench.tail``) is imported too."""
    code = (
        "import sys, workbench; before = sorted(m for m in sys.modules if m.startswith('workbench.')); "
        "f = workbench.host_tail; from workbench import compare; t = workbench.tail.paths; "
        "print(before, f is t.host_tail, 'workbench.tail.paths' in sys.modules, 'host_tail' in dir(workbench))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "True", "True", "True"]
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        workbench.no_such_name  # noqa: B018


def test_no_public_name_hides_a_module():
    # A function re-exported under its module's name would replace the module as the
    # package's attribute, and `from workbench import <module>` would hand back the function.
    import pkgutil

    modules = {m.name for m in pkgutil.iter_modules(workbench.__path__)}
    assert not modules & set(workbench.__all__)


# --- every part's public names, and the notebooks importing only those ---------------------------------------------

SUBPACKAGES = sorted(m.name for m in pkgutil.iter_modules(workbench.__path__) if m.ispkg)
SHARED = sorted(m.name for m in pkgutil.iter_modules(workbench.__path__) if not m.ispkg)
#: The parts whose names are imported on first use through ``workbench.public_names``: every one.
LAZY = tuple(SUBPACKAGES)
NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_top_level_names_are_one_list():
    assert workbench.__all__ == list(workbench._HOMES)
    for name, home in workbench._HOMES.items():
        assert getattr(workbench, name) is getattr(importlib.import_module(home), name), name


@pytest.mark.parametrize("part", SUBPACKAGES)
def test_a_part_exports_its_public_names(part):
    assert part in LAZY, f"workbench.{part}: list its public names through workbench.public_names"
    pkg = importlib.import_module(f"workbench.{part}")
    assert pkg.__all__ == list(pkg._HOMES) and len(set(pkg.__all__)) == len(pkg.__all__)
    modules = {m.name for m in pkgutil.iter_modules(pkg.__path__)}
    for name, home in pkg._HOMES.items():
        if home == f"workbench.{part}.{name}":  # a module that is a public name itself, as a namespace
            assert name in modules and getattr(pkg, name) is importlib.import_module(home), name
            continue
        # a name that is also a module's would hide the module, or the module it
        assert name not in modules, f"workbench.{part}.{name} is a module: the name cannot be public as well"
        assert getattr(pkg, name) is getattr(importlib.import_module(home), name), name
        assert not name.startswith("_") and name in dir(pkg)
    assert "run_stages" not in pkg.__all__  # the decode schedule's runner belongs to bench/


def test_every_exported_name_imports_from_its_part():
    # each `from workbench.<part> import <name>` of every part with an __all__, tail's included
    for part in SUBPACKAGES:
        pkg = importlib.import_module(f"workbench.{part}")
        for name in getattr(pkg, "__all__", ()):
            exec(f"from workbench.{part} import {name}", {})


def test_the_fold_is_imported_from_its_part():
    from workbench.fold import HadamardFold
    from workbench.tail import TailWeights

    assert HadamardFold is workbench.HadamardFold and TailWeights is workbench.TailWeights


def test_importing_a_part_or_one_module_imports_no_other_module_of_it():
    """A part's names are imported on first use: ``import workbench.fold`` imports none of its
    modules, ``import workbench.fold.hadamard`` only that one of fold (and the shared modules it
    imports), and neither loads pandas or matplotlib."""
    parts = ", ".join(f"workbench.{p}" for p in LAZY)
    code = (
        f"import sys, {parts}, workbench.fold.hadamard; "
        f"print(sorted(m for m in sys.modules if m.split('.')[:2] in [['workbench', p] for p in {LAZY}]), "
        "'pandas' in sys.modules, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("]")[0] + "]" == str(sorted([f"workbench.{p}" for p in LAZY] + ["workbench.fold.hadamard"]))
    assert out.split("]")[1].split() == ["False", "False"]


def notebook_imports(path: Path) -> list[tuple[str, str]]:
    """Every ``from workbench... import name`` of a notebook's code cells, as (module, name)."""
    found = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = "".join(cell["source"]).splitlines()
        code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "workbench":
                found += [(node.module, a.name) for a in node.names]
    return found


def public_in(module: str, name: str) -> bool:
    """Whether ``from module import name`` takes a public name: one of ``workbench.__all__`` or a
    part of the package; one of a part's ``__all__``; a public name of a shared module."""
    parts = module.split(".")
    if module == "workbench":
        return name in workbench.__all__ or name in SUBPACKAGES + SHARED
    if len(parts) == 2 and parts[1] in SHARED:
        return not name.startswith("_") and hasattr(importlib.import_module(module), name)
    if len(parts) == 2 and parts[1] in SUBPACKAGES:
        return name in getattr(importlib.import_module(module), "__all__", ())
    return False


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_imports_only_public_names(path):
    imports = notebook_imports(path)
    assert imports, f"{path.name}: no workbench import found"
    internal = [f"from {m} import {n}" for m, n in imports if m.split(".")[1:2] != [] and not public_in(m, n)]
    assert not internal, f"{path.name} imports names that are not public: {internal}"


# --- bench/ and experiments/ importing only public names ---------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = sorted(
    [*(ROOT / "bench").glob("*.py"), *(ROOT / "bench" / "common").glob("*.py"), *(ROOT / "experiments").glob("*.py")]
)


def program_imports(path: Path) -> list[str]:
    """Every import of a non-public workbench name in a program's code: ``from workbench.<part>.<module>
    import X``, ``from workbench.<part> import X`` with X not in that part's ``__all__``, and
    ``import workbench.<part>.<module>``; each as "line N: the import"."""
    internal = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "workbench":
            internal += [
                f"line {node.lineno}: from {node.module} import {a.name}"
                for a in node.names
                if not public_in(node.module, a.name)
            ]
        elif isinstance(node, ast.Import):
            internal += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name.split(".")[0] == "workbench" and len(a.name.split(".")) > 2
            ]
    return internal


def test_the_programs_are_found():
    assert len(PROGRAMS) > 20 and any(p.parent.name == "common" for p in PROGRAMS)
    assert any(p.parent.name == "experiments" for p in PROGRAMS)


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_bench_program_or_experiment_imports_only_public_names(path):
    internal = program_imports(path)
    assert not internal, f"{path.relative_to(ROOT)} imports names that are not public: {internal}"
