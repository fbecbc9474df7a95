"""Files that are never lost or left half-written: atomic writes and locked updates.

Every record, ledger and plan the workbench writes goes through here, because a plain
``Path.write_text`` truncates first and then writes: a process killed in between leaves a
half-written file, and two processes that read, change and write one file lose each other's
changes. :func:`write_atomic` writes a temporary file in the same folder, ``fsync``\\ s it and
``os.replace``\\ s it over the target, so a reader sees the old file or the new one, never a
mix; with ``overwrite=False`` the last step is an exclusive create (``os.link``), so "never
replace an existing record" holds even when two processes pick the same name at once.
:func:`locked` holds an inter-process lock (``filelock``) beside a shared file, and
:func:`update_json` reads, changes and writes the file under it, so no writer's entry is lost.

It also names the project's folders (:data:`PROJECT_ROOT`, :data:`DATA_DIR`), found from this
file, so every module reads configs, plan, ledger and records from one place.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "DATA_DIR",
    "PROJECT_ROOT",
    "RecordExists",
    "lock_path",
    "locked",
    "update_json",
    "write_atomic",
    "write_json",
]

#: The project's root: the folder holding ``workbench/``, ``kernels/`` and ``data/``.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: The project's data: models' configs, the plan, the wait-price ledger, bench records.
DATA_DIR = PROJECT_ROOT / "data"

#: How long a writer waits for another to finish with a shared file before giving up.
LOCK_TIMEOUT_S = 60.0


class RecordExists(FileExistsError, ValueError):
    """Raised by ``overwrite=False`` when the target exists: a ValueError (the caller asked
    for something the rules refuse), and a FileExistsError (what it is to the OS)."""


def _fsync_dir(folder: Path) -> None:
    # The rename itself must reach the disk too, or a crash can forget it.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. a platform that cannot open folders; the file itself is synced
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: str | bytes, *, overwrite: bool = True) -> Path:
    """Write ``data`` to ``path`` so that it holds the old content or the new, never a mix.

    ``overwrite=False`` refuses an existing ``path`` (:class:`RecordExists`, checked
    atomically at the moment the file appears). The folder is created if missing. A
    failure (a full disk, a kill) leaves ``path`` as it was; the temporary file, named
    ``.<name>.<random>.tmp`` in the same folder, is removed on any Python-level failure.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if not overwrite and target.exists():
        raise RecordExists(f"path: {target} exists; refusing to overwrite it (ask for overwrite to replace it)")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes 0600; keep a replaced file's mode, else as readable as any file here.
        os.chmod(tmp, target.stat().st_mode & 0o777 if target.exists() else 0o644)
        if overwrite:
            os.replace(tmp, target)
        else:
            _create_exclusively(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(target.parent)
    return target


def _create_exclusively(tmp: Path, target: Path) -> None:
    """Move the finished ``tmp`` to ``target`` only if ``target`` does not exist, atomically."""
    exists = RecordExists(f"path: {target} exists; refusing to overwrite it (ask for overwrite to replace it)")
    try:
        os.link(tmp, target)  # fails if target exists: an exclusive create of the whole file
    except FileExistsError:
        raise exists from None
    except OSError:
        # A file system without hard links: claim the name exclusively, then move the
        # finished file over the claim (a reader may see the empty claim for that moment,
        # never a half-written record).
        try:
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            raise exists from None
        os.replace(tmp, target)
        return
    tmp.unlink()


def write_json(path: str | Path, obj: Any, *, overwrite: bool = True, default: Callable | None = None) -> Path:
    """``obj`` as pretty, newline-terminated JSON, written with :func:`write_atomic`.

    NaN and infinities are refused (``allow_nan=False``): they are not JSON, and a file
    holding them would break a strict reader later.
    """
    text = json.dumps(obj, indent=2, default=default, allow_nan=False) + "\n"
    return write_atomic(path, text, overwrite=overwrite)


def lock_path(path: str | Path) -> Path:
    """The lock file that guards ``path``: ``.<name>.lock`` beside it (git ignores ``*.lock``)."""
    p = Path(path)
    return p.with_name(f".{p.name}.lock")


@contextlib.contextmanager
def locked(path: str | Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the inter-process lock of ``path`` for the block.

    A ValueError names the file if another process holds it for ``timeout`` seconds. The
    lock is released when the block ends, however it ends (and by the OS when the
    process dies), so a killed writer never blocks the next one.
    """
    import filelock  # here, not at import: a GPU machine running a bench need not have it

    lock = filelock.FileLock(str(lock_path(path)), timeout=timeout)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise ValueError(
            f"path: {path} is locked by another process (waited {timeout:g} s for {lock_path(path)})"
        ) from None
    try:
        yield
    finally:
        lock.release()


def update_json(path: str | Path, change: Callable[[Any], Any], *, timeout: float = LOCK_TIMEOUT_S) -> Any:
    """Read ``path`` as JSON, apply ``change`` and write the result back, under the file's lock.

    ``change`` receives the parsed content and returns the new content (or raises, which
    leaves the file untouched). Returns what ``change`` returned. The read happens after
    the lock is taken, so two processes updating at once each build on the other's
    committed write.
    """
    p = Path(path)
    with locked(p, timeout):
        try:
            old = json.loads(p.read_text())
        except FileNotFoundError:
            raise ValueError(f"path: {p} does not exist") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"path: {p} is not valid JSON ({err})") from None
        except UnicodeDecodeError as err:
            raise ValueError(
                f"path: {p} is not UTF-8 text (byte {err.start} is {err.object[err.start]:#04x})"
            ) from None
        new = change(old)
        write_json(p, new)
    return new


def command_shown(command: str) -> str:
    """A record's command line as a reader reruns it: without ``--out-dir FOLDER``.

    The bench commands write to the project's ``data/bench/`` unless told otherwise; on a
    lent GPU machine they were told to write into a transfer folder of that machine, which
    says where the file went then, not what was measured (the record is in ``data/bench/``
    now). Everything else is kept as run.
    """
    if not isinstance(command, str):
        raise ValueError(f"command must be a str (a record's 'command'); got {type(command).__name__}")
    words = command.split()
    kept: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        if w == "--out-dir":
            skip = True
            continue
        if w.startswith("--out-dir="):
            continue
        kept.append(w)
    return " ".join(kept)
