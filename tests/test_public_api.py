"""The package's top level: the names a user reaches for first, and a light import."""

from __future__ import annotations

import subprocess
import sys

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
    assert compare(fused_tail(c.weights, c.branch, c.residual, backend="graph"),
                   host_tail(c.weights, c.branch, c.residual)).passed


def test_importing_workbench_loads_no_pandas_or_matplotlib():
    code = "import sys, workbench; print('pandas' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_public_name_imports_its_part_on_first_use():
    """``import workbench`` imports no part of the package; a public name imports its home
    module when first read, and a part read as an attribute (``workbench.tail``) is imported too."""
    code = ("import sys, workbench; before = sorted(m for m in sys.modules if m.startswith('workbench.')); "
            "f = workbench.host_tail; from workbench import compare; t = workbench.tail.paths; "
            "print(before, f is t.host_tail, 'workbench.tail.paths' in sys.modules, 'host_tail' in dir(workbench))")
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
