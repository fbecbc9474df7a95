"""Which Python modules of the project import which: the reader behind the layout tests.

``tests/test_layout.py`` (the package's parts and levels) and ``tests/test_bench_layout.py``
(bench commands, their shared helpers, experiments) hold rules over the same graph, read
here once. Every import counts, at a module's top, inside a function (a lazy import is
still a dependency) or under ``if TYPE_CHECKING:``: a name a module's types need is a
dependency of its meaning even where it is never executed, so a circle hidden there is
still a circle. ``imports_of(..., type_checking=False)`` gives the executed ones alone.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path


def modules(root: Path, tops: Iterable[str]) -> dict[str, Path]:
    """Every module under the folders ``tops`` of ``root``, by dotted name (a package's
    ``__init__`` as the package)."""
    out: dict[str, Path] = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


def _executed(tree: ast.AST) -> list[ast.AST]:
    """The nodes of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(sub) for sub in ast.walk(node))
    return [node for node in ast.walk(tree) if id(node) not in skip]


def imports_of(path: Path, tops: Iterable[str], known: Mapping[str, Path], *, type_checking: bool = True) -> set[str]:
    """The modules of ``tops`` that ``path`` imports: ``from a.b import c`` counts as
    ``a.b.c`` where that is a module of ``known``, else as ``a.b``; the bare top packages
    themselves are left out. ``type_checking=False`` leaves out the imports under
    ``if TYPE_CHECKING:``."""
    tops = tuple(tops)
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if type_checking else _executed(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in tops:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in tops)
    return found - set(tops)


def private_reads(path: Path, tops: Iterable[str]) -> list[str]:
    """The names starting with ``_`` that ``path`` takes from modules of ``tops``: imported
    (``from m import _x``) or read off a module bound by an import (``m._x``, ``import a.b as
    m``). What one module needs of another is its API, named without an underscore."""
    tops = tuple(tops)
    tree = ast.parse(path.read_text())
    aliases: dict[str, str] = {}
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in tops:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                if a.name.startswith("_"):
                    found.add(f"{node.module}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in tops and a.asname:
                    aliases[a.asname] = a.name
    found.update(
        f"{aliases[n.value.id]}.{n.attr}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id in aliases
        and n.attr.startswith("_")
        and not n.attr.startswith("__")
    )
    return sorted(found)


def circle(graph: Mapping[str, Iterable[str]]) -> tuple[str, ...] | None:
    """An import circle of ``graph`` (module -> the modules it imports), as the path that
    closes it (``a, b, a``), or None."""
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
        if m in path:
            return path[path.index(m) :] + (m,)
        if m in done:
            return None
        for dep in sorted(graph.get(m, ())):
            found = visit(dep, path + (m,))
            if found:
                return found
        done.add(m)
        return None

    for m in sorted(graph):
        found = visit(m, ())
        if found:
            return found
    return None
