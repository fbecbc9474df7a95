"""Names that moved to another module, still reachable where they used to live.

When the package was split by concept, several names left the module a user's code may
still import them from (``workbench.tail.compare`` is now ``workbench.comparison.compare``).
Such a module sets ``__getattr__ = forwarder(__name__, {name: new module})``: Python calls
a module's ``__getattr__`` (PEP 562) only for names the module does not have, so the
lookup costs nothing for everything else, and the new module is imported only when an
old name is first asked for (the new modules import the old ones, so importing them at
the old module's top would make a circle).
"""

from __future__ import annotations

import importlib
from typing import Callable, Mapping


def forwarder(module: str, moved: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` that finds each name of ``moved`` in the module it maps to."""

    def __getattr__(name: str) -> object:
        if name in moved:
            return getattr(importlib.import_module(moved[name]), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
