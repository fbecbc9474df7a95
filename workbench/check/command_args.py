"""The pieces every part's command shares: argparse types that refuse a bad value in one
line, a user's ``module:function`` imported without writing beside it, the record's
provenance and its atomic, never-overwriting write, and an error as the command's one line.

``python -m workbench.check`` (the tail's options, ``__main__``), its ``--part gdn``
(``gdn_command``), ``--part head`` (``head_command``) and ``--chain`` (``chain_command``) read
them, so every part refuses the same mistakes in the same words and launches a source alike.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workbench import backends, files


def as_option(message: str, options: Mapping[str, str]) -> str:
    """``message`` on one line, its leading parameter name (``folds: ...``) replaced by the
    option the user typed (``--fold: ...``, from ``options``); a message naming no parameter
    is kept as is."""
    text = " ".join(str(message).split())
    head, sep, rest = text.partition(": ")
    base = head.split("[", 1)[0]
    return f"{options[base]}{head[len(base) :]}: {rest}" if sep and base in options else text


def one_line(err: BaseException, options: Mapping[str, str]) -> str:
    """``err`` as the command's one line: an ``OSError`` as its file and reason (as the shell
    says it), anything else by its message under the option's name (:func:`as_option`)."""
    if isinstance(err, OSError) and err.strerror and not isinstance(err, ValueError):
        return f"{err.filename}: {err.strerror}" if err.filename is not None else err.strerror
    return as_option(str(err) or type(err).__name__, options)


def count(least: int, most: int) -> Callable[[str], int]:
    """argparse type: an int in [least, most]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"must be an integer in {least}..{most}, got {value}")
        return value

    return parse


def dims(most: int, product_most: int | None = None) -> Callable[[str], tuple[int, int, int]]:
    """argparse type: ``X`` (1-D, as before) or ``X,Y,Z``, each an int in [1, most] (and
    their product at most ``product_most``): a launch's grid or threadgroup, in threads."""

    def parse(text: str) -> tuple[int, int, int]:
        parts = text.split(",")
        if len(parts) not in (1, 3):
            raise argparse.ArgumentTypeError(f"must be X or X,Y,Z (integers), got {text!r}")
        values = tuple(count(1, most)(p.strip()) for p in parts) + (1, 1)[: 3 - len(parts)]
        x, y, z = values
        if product_most is not None and x * y * z > product_most:
            raise argparse.ArgumentTypeError(f"must be at most {product_most} threads in all, got {x}x{y}x{z}")
        return x, y, z

    return parse


def seed_range(most: int) -> Callable[[str], range]:
    """argparse type of ``--seeds``: ``N`` (seeds 0..N-1) or ``A:B`` (seeds A..B-1, a shard
    of a larger run: shards of disjoint ranges merge), at most ``most`` seeds."""

    def parse(text: str) -> range:
        head, colon, tail = text.partition(":")
        if not colon:
            return range(count(1, most)(text))
        a, b = count(0, 2**62)(head.strip()), count(1, 2**62)(tail.strip())
        if not a < b or b - a > most:
            raise argparse.ArgumentTypeError(f"A:B must have A < B and at most {most} seeds, got {text!r}")
        return range(a, b)

    return parse


def shape(text: str) -> tuple[int, int, int]:
    """argparse type of ``--shape``: ``H,B,F`` (hidden, branch, ffn), positive ints."""
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"must be H,B,F (hidden, branch, ffn), got {text!r}")
    h, b, f = (count(1, 2**31 - 1)(p.strip()) for p in parts)
    return h, b, f


#: ``--memory-budget``'s suffixes: powers of 1024.
BYTE_UNITS: dict[str, int] = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def byte_count(text: str) -> int:
    """argparse type of ``--memory-budget``: bytes, or a number with K, M, G or T (powers of 1024)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in BYTE_UNITS and t[-1:] else ""
    try:
        value = float(t[: len(t) - len(unit)])
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value * BYTE_UNITS[unit] < 1:
        raise argparse.ArgumentTypeError(f"must be bytes, or a number with K, M, G or T (4G), got {text!r}")
    return int(value * BYTE_UNITS[unit])


def real(text: str, *, positive: bool) -> float:
    """``text`` as a finite number >= 0 (``positive``: > 0), or argparse's one-line refusal."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise argparse.ArgumentTypeError(f"must be a finite number {'>' if positive else '>='} 0, got {text!r}")
    return value


def non_negative(text: str) -> float:
    """argparse type of ``--tolerance``: a finite number >= 0 (NaN would pass every case)."""
    return real(text, positive=False)


def positive(text: str) -> float:
    """argparse type of ``--time-limit``: a finite number of seconds > 0."""
    return real(text, positive=True)


def number_list(*, positive: bool) -> Callable[[str], list[float]]:
    """argparse type: comma-separated finite numbers > 0 (``positive``) or >= 0."""

    def parse(text: str) -> list[float]:
        items = [t.strip() for t in text.split(",")]
        if not text.strip() or any(not t for t in items):
            raise argparse.ArgumentTypeError(
                f"must be comma-separated numbers {'>' if positive else '>='} 0, got {text!r}"
            )
        return [real(t, positive=positive) for t in items]

    return parse


def template(text: str | None, dims: tuple[str, ...]) -> dict[str, Any]:
    """``--template NAME=value,...``: a value is an int, a float, or one of the part's dimensions
    by name (``dims``: resolved per case, so one template serves every shape)."""
    out: dict[str, Any] = {}
    for item in filter(None, (text or "").split(",")):
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise ValueError(f"--template: items must be NAME=value, got {item!r}")
        if value in dims:
            out[name] = value
            continue
        try:
            out[name] = int(value)
        except ValueError:
            try:
                out[name] = float(value)
            except ValueError:
                out[name] = math.nan
            if not math.isfinite(out[name]):
                raise ValueError(
                    f"--template: {name}'s value must be a finite number or one of {dims}, got {value!r}"
                ) from None
    return out


def path(text: str) -> str:
    """argparse type of a path option: an empty name is refused (it would read the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return text


def record(text: str) -> Path:
    """argparse type of ``--record``: a new file whose folder exists or can be made, and can
    be written; checked before the check runs, not after its minutes of work."""
    target = Path(path(text))
    if target.exists() or target.is_symlink():
        what = (
            "is a folder; name the record's file"
            if target.is_dir()
            else "exists; a record is never overwritten (give a new name)"
        )
        raise argparse.ArgumentTypeError(f"{text} {what}")
    base = target.parent
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise argparse.ArgumentTypeError(f"{text} lies under {base}, which is not a folder")
    try:  # a real write: permissions, a read-only file system (root passes os.access everywhere)
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(f"{text}: {base} cannot be written ({err.strerror})") from None
    return target


def load_callable(spec: str, what: str = "case -> output array") -> Callable[..., Any]:
    """The function ``module:function`` names, or ``ValueError`` naming ``implementation``
    (``what``: what the function takes and returns, for the message). Any error of the user's
    module at import is reported in one line (it is their code, not the check's); no bytecode
    is written beside it (the user's files are only read)."""
    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        raise ValueError(f"implementation: must be 'module:function', got {spec!r}")
    if mod.startswith("."):
        raise ValueError(f"implementation: the module must be named in full (mypkg.tails), got {mod!r}")
    keep = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        module = importlib.import_module(mod)
    except ModuleNotFoundError as e:
        if e.name is None or not (mod == e.name or mod.startswith(e.name + ".")):  # the module's own import failed
            raise ValueError(f"implementation: importing {mod!r} raised {type(e).__name__}: {e}") from None
        raise ValueError(
            f"implementation: cannot import {mod!r} ({e}); is its folder on the path "
            "(run from there, or set PYTHONPATH)?"
        ) from None
    except (Exception, SystemExit) as e:
        raise ValueError(f"implementation: importing {mod!r} raised {type(e).__name__}: {e}") from None
    finally:
        sys.dont_write_bytecode = keep
    if not hasattr(module, attr):
        raise ValueError(f"implementation: module {mod!r} has no attribute {attr!r}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise ValueError(f"implementation: {spec} is {type(fn).__name__}, not a function ({what})")
    return fn


def read_text(option: str, given: str, what: str) -> str:
    """The UTF-8 text of the file ``given`` (``option``'s value), or a ValueError naming the option."""
    target = Path(given)
    if not target.is_file():
        raise ValueError(f"{option}: must be a file holding {what}, got {given!r} (not a file)")
    try:
        return target.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{option}: {given} is not UTF-8 text (byte {e.start}); is it {what}?") from None


def provenance(argv: list[str] | None) -> dict[str, Any]:
    """Where and when the check ran, as the bench records say it: date (UTC), the command
    line, MLX's version and device, numpy's, Python's, the platform."""
    import mlx.core as mx
    import numpy as np

    args = sys.argv[1:] if argv is None else list(argv)
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m workbench.check", *args]),
        "mlx_version": mx.__version__,
        "mlx_device": str(mx.default_device()),
        "numpy_version": np.__version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
    }


def write_record(target: Path, rec: Mapping[str, Any], passed: bool) -> None:
    """``rec`` as JSON at ``target``, atomically and never over a file; a failure (a race with
    another writer, a full disk) is a ValueError naming ``--record`` that keeps the verdict."""
    try:
        files.write_atomic(target, json.dumps(rec, indent=1) + "\n", overwrite=False)
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else " ".join(str(e).split())
        raise ValueError(
            f"--record: {target} was not written ({reason}); the verdict printed above "
            f"stands: {'PASS' if passed else 'FAIL'}"
        ) from None


def csv(xs: Any) -> str:
    """Values as a command line takes them back: comma-separated, floats in their shortest form."""
    return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in xs)


def source_launch_group(
    p: argparse.ArgumentParser, writes: str, inputs: tuple[str, ...], names: tuple[str, ...]
) -> argparse._ArgumentGroup:
    """The options of ``--source``'s launch, alike for every part: the body's inputs (default
    ``inputs``), a header, the grid and threadgroup, template values (numbers or the part's
    ``names``), the language and where it runs; ``writes`` says what the body writes."""
    g = p.add_argument_group("the launch of --source", writes)
    g.add_argument("--inputs", help=f"the body's inputs in order, comma-separated (default all: {csv(inputs)})")
    g.add_argument("--header", type=path, help="a file of helper functions placed before the kernel")
    g.add_argument("--grid", type=dims(2**31 - 1), default=(32, 1, 1), help="threads: X or X,Y,Z (default 32)")
    g.add_argument("--threadgroup", type=dims(1024, 1024), default=(32, 1, 1), help="threads a group, X or X,Y,Z (32)")
    g.add_argument("--template", help=f"NAME=value,... (a number, or one of {', '.join(names)})")
    g.add_argument("--language", choices=("metal", "cuda"), default="metal", help="the body's language")
    g.add_argument("--run-on", choices=("emulator", "device"), default="emulator", help="the CPU emulator or the GPU")
    return g


def run_command(run: Callable[[], int], prog: str, options: Mapping[str, str], usage_error: int = 2) -> int:
    """``run()``'s exit status, with what the user did wrong or lacks as one line: an interrupt
    is 130; bad input (ValueError, OSError) or an absent backend prints ``prog: error: ...`` as
    argparse words it, without its usage block (the syntax was right), and exits
    ``usage_error``. ``$WORKBENCH_TRACEBACK`` set: the exception itself, for a bug report."""
    try:
        return run()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, backends.BackendUnavailable) as e:
        if os.environ.get("WORKBENCH_TRACEBACK"):
            raise
        print(f"{prog}: error: {one_line(e, options)}", file=sys.stderr)
        raise SystemExit(usage_error) from None
