"""A callable that reached a Dask worker by value (cloudpickle: a lambda, a closure, a function
defined in a notebook), made importable there by ``module:qualname``.

Why: the check runs a callable in a process of its own only where that process can import it
(:mod:`workbench.check.isolation` loads ``module:qualname``), so that a segfault costs its case
and not the process holding the check. On a cluster that process holding the check is a Dask
worker, whose death Dask answers by running the task again elsewhere. So the pickled bytes are
written to this machine's temporary folder under their SHA-256, and ``by_value_<digest>`` of
this module loads them (the module's ``__getattr__``) in the worker and in its child alike; the
digest is checked on load, so a file that changed is refused, never run.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

from workbench import files

#: The attribute prefix of a callable held here; the rest of the name is its bytes' digest.
PREFIX = "by_value_"

#: Hex digits of the SHA-256 a callable is named by (128 bits: no two callables collide).
DIGEST_CHARS = 32

_LOADED: dict[str, Any] = {}


def folder() -> Path:
    """Where this machine keeps the pickled callables (its temporary folder: they are the
    user's function, small, and re-sent with every check)."""
    return Path(tempfile.gettempdir()) / "workbench-cluster-callables"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]


class ByValue:
    """The unpickled callable under the name this module serves it by: ``__module__`` and
    ``__qualname__`` say where it is imported from, so ``check.subjects.importable_path``
    finds it and the check runs it in a process of its own."""

    def __init__(self, fn: Any, digest: str) -> None:
        self.fn = fn
        self.__module__ = __name__
        self.__qualname__ = self.__name__ = PREFIX + digest
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple:
        # pickled by name, as a function is: the process it goes to loads the same file
        return (served, (self.__qualname__,))


def served(name: str) -> ByValue:
    """The callable served as ``name`` (``by_value_<digest>``), loaded from this machine's file."""
    return __getattr__(name)


def register(data: bytes) -> ByValue:
    """The callable pickled in ``data`` (cloudpickle), written here once and served by name."""
    digest = _digest(data)
    path = folder() / f"{digest}.pkl"
    if not path.exists():
        files.write_atomic(path, data)
    return __getattr__(PREFIX + digest)


def __getattr__(name: str) -> Any:
    """``by_value_<digest>``: the callable whose pickled bytes have that digest, loaded once a process."""
    if not name.startswith(PREFIX):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _LOADED:
        import cloudpickle

        digest = name[len(PREFIX) :]
        try:
            data = (folder() / f"{digest}.pkl").read_bytes()
        except OSError:
            raise AttributeError(f"{name}: no callable with that digest on this machine") from None
        if _digest(data) != digest:
            raise AttributeError(f"{name}: the file's bytes no longer have that digest; refused")
        _LOADED[name] = ByValue(cloudpickle.loads(data), digest)
    return _LOADED[name]
