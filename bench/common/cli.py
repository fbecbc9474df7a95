"""A bench command's entry point, and argument types that check a path before any measuring.

A command is run for its numbers, often for minutes, so two rules hold for every one:

* bad input (an argument, a record file, a folder it cannot write) ends in ONE line naming
  what was wrong and a non-zero exit, never a traceback: a traceback buries the one line
  that matters under frames of the workbench's internals, and a user reads it as a bug.
  :func:`run` is each command's ``__main__``: the workbench's refusals are ``ValueError``
  (``workbench.validate``'s form, records' ``RecordError``), an absent backend is
  ``BackendUnavailable`` and a file that cannot be read or written is an ``OSError``; those
  are printed as ``<prog>: error: <message>`` and exit 2, argparse's own usage-error
  status. Anything else is a defect of the command and keeps its traceback.
  ``WORKBENCH_TRACEBACK=1`` in the environment keeps the traceback of every error.
* a path the record goes to is checked when the arguments are parsed (:func:`out_dir`,
  :func:`out_file`), not when the record is written after the measuring, so a typo in
  ``--out-dir`` never costs the run it came with.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from workbench.backends import BackendUnavailable

#: The errors that mean "the input was bad", not "the command is wrong" (see the module's docstring).
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, BackendUnavailable)


def one_line(err: BaseException) -> str:
    """``err``'s message on one line (an ``OSError`` as its reason and file, as the shell says it)."""
    if isinstance(err, OSError) and err.strerror:
        where = " -> ".join(str(f) for f in (err.filename, err.filename2) if f is not None)
        text = f"{where}: {err.strerror}" if where else err.strerror
    else:
        text = str(err) or type(err).__name__
    return " ".join(text.split())


def run(main: Callable[[list[str] | None], Any], argv: list[str] | None = None, *, prog: str) -> int:
    """Call ``main(argv)`` and return the process's exit status.

    A command's own status (an ``int`` it returns, a ``SystemExit`` from argparse) is kept;
    any other return value (a record) is success, 0. A :data:`USER_ERRORS` error is printed
    as ``<prog>: error: <one line>`` on stderr and gives 2; Ctrl-C gives 130 with one line.
    """
    try:
        result = main(argv)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as err:
        if os.environ.get("WORKBENCH_TRACEBACK"):
            raise
        print(f"{prog}: error: {one_line(err)}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (the folder a ``mkdir -p`` would start in)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _writable_folder(folder: Path) -> None:
    """Refuse (``ArgumentTypeError``; argparse puts the option's name before the message) a
    folder that is a file, lies under a file, or cannot be written."""
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise argparse.ArgumentTypeError(f"{folder} is a file, not a folder" if base == folder else
                                         f"{folder} lies under {base}, which is not a folder")
    try:  # a real write: permissions, a read-only or pseudo file system (root passes os.access on all)
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(f"{folder}: {base} cannot be written ({err.strerror})") from None


def out_dir(value: str) -> Path:
    """argparse type of ``--out-dir``: a folder that exists or can be made, and can be written."""
    folder = Path(value)
    _writable_folder(folder)
    return folder


def out_file(value: str) -> Path:
    """argparse type of ``--out``: a file path (not a folder) whose folder exists or can be made, writable."""
    path = Path(value)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a folder; name the record's file")
    try:
        _writable_folder(path.parent)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{path}: {err}") from None
    return path


def at_least(parser: argparse.ArgumentParser, flag: str, value: int | None, least: int) -> None:
    """The parser's usage error unless ``value`` (an int option; None: not given) is >= ``least``:
    checked before any device check or measuring, so a bad count fails at once everywhere."""
    if value is not None and value < least:
        parser.error(f"{flag} must be >= {least}; got {value}")


def finite_positive(parser: argparse.ArgumentParser, flag: str, value: float | None) -> None:
    """The parser's usage error unless ``value`` (a float option; None: not given) is finite and > 0."""
    if value is not None and not (math.isfinite(value) and value > 0):
        parser.error(f"{flag} must be a finite number > 0; got {value}")


def existing_file(value: str) -> Path:
    """argparse type of an option naming a file that must exist (a ledger to add to):
    a folder, an empty name or a missing file is refused when the arguments are parsed."""
    path = Path(value)
    if not value.strip() or not path.is_file():
        what = "is a folder" if value.strip() and path.is_dir() else "is not a file that exists"
        raise argparse.ArgumentTypeError(f"{value!r} {what}")
    return path
