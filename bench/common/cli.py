"""A bench command's command line: its parser, its entry point, and argument checks made before any measuring.

A command is run for its numbers, often for minutes, so three rules hold for every one:

* bad input ends in ONE line naming what was wrong and a non-zero exit, never a traceback
  (a traceback buries that line under the workbench's frames, and reads as a bug).
  :func:`run` is each command's ``__main__``: a ``ValueError``, ``BackendUnavailable`` or
  ``OSError`` is printed as ``<prog>: error: <message>`` and exits 2 (argparse's usage-error
  status); anything else is a defect of the command and keeps its traceback, as every error
  does with ``WORKBENCH_TRACEBACK=1``.
* every command starts from the same :func:`parser` (its record options, its help), and
  says a bad option's value the same way (:func:`comma_list`, :func:`at_least`, ...).
* a path the record goes to is checked when the arguments are parsed (:func:`out_dir`,
  :func:`out_file`, :func:`refuse_existing`), so a typo never costs the run it came with.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from workbench.backends import BackendUnavailable
from workbench.reports import records

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
        raise argparse.ArgumentTypeError(
            f"{folder} is a file, not a folder"
            if base == folder
            else f"{folder} lies under {base}, which is not a folder"
        )
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


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after every option's help (argparse's own formatter), the
    description's layout kept; left out where they say nothing (an off switch, None) or
    the help already says its default in words."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if any(action.default is v for v in (None, False, argparse.SUPPRESS)) or "default" in text:
            return text
        return super()._get_help_string(action)


def parser(
    bench: str, doc: str | None, *, writes: str | None = None, record_options: bool = True
) -> argparse.ArgumentParser:
    """The argument parser every bench command starts from.

    ``prog`` is how the command is run (``python -m bench.<bench>``), defaults show in
    ``--help``, the description is the first paragraph of the module's docstring and the
    epilog says what the command writes. With ``record_options``: ``--out-dir`` (default
    the project's ``data/bench/``), ``--no-record`` and ``--force``.
    """
    first = (doc or "").strip().split("\n\n")[0]
    if writes is None:
        writes = (
            f"writes a JSON record (device, date, MLX version, the command line) to "
            f"OUT_DIR/{bench}-<device>-<UTC time>.json; never replaces an existing file without --force; "
            "also copies it to $OUT when that is set"
        )
    p = argparse.ArgumentParser(
        prog=f"python -m bench.{bench}", description=first, epilog=writes, formatter_class=_HelpFormatter
    )
    if record_options:
        add_record_options(p)
    return p


def add_record_options(p: argparse.ArgumentParser) -> None:
    """``--out-dir``, ``--no-record`` and ``--force``, the same in every command."""
    p.add_argument(
        "--out-dir",
        type=out_dir,
        default=records.RECORD_DIR,
        help="the folder the JSON record goes to (default: the project's data/bench/, wherever the command is started)",
    )
    p.add_argument("--no-record", action="store_true", help="print only; write no JSON record")
    p.add_argument("--force", action="store_true", help="replace an existing record of the same name")


def refuse_existing(p: argparse.ArgumentParser, path: Path, force: bool) -> None:
    """The parser's usage error if ``path`` exists and ``--force`` was not given: checked
    before any measuring, so a run is never wasted on a record it may not write."""
    if Path(path).exists() and not force:
        p.error(f"{path} exists; pass --force to replace it, or name another file")


def comma_list(parser: argparse.ArgumentParser, flag: str, value: str, allowed: Iterable[str]) -> list[str]:
    """``value`` split at commas, every item one of ``allowed``; else the parser's usage error
    naming ``flag``, what was given and what is allowed (so each command says it the same way)."""
    allowed = sorted(allowed)
    items = [s.strip() for s in value.split(",") if s.strip()]
    if not items or any(s not in allowed for s in items):
        parser.error(f"{flag} must be a comma-separated list of {allowed}; got {value!r}")
    return items


def progress(iterable: Iterable, total: int | None = None, desc: str = "") -> Iterator:
    """``iterable`` with a progress bar on stderr: tqdm where installed, else a line every
    tenth of the way (a GPU machine may have only numpy and MLX)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        n = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        step = max(1, (n or 10) // 10)
        for i, item in enumerate(iterable, 1):
            yield item
            if i % step == 0 or i == n:
                print(f"  {desc} {i}/{n if n is not None else '?'}", file=sys.stderr, flush=True)
        return
    yield from tqdm(iterable, total=total, desc=desc, leave=False, file=sys.stderr)
