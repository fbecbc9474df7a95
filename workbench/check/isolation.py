"""A user's callable run in a worker process of its own: a crash (a segfault) costs its case,
not the check, and the float64 truth is never in the worker's reach.

The worker imports the callable by ``module:qualname`` (so only a function importable that
way can go there: not a lambda, not one defined in ``__main__``), receives one case at a time
(the stored weights and activations, never the truth), runs it through
:func:`workbench.check.guards.guarded_call` and sends back the output or what went wrong. A
worker that dies or passes the time limit is ended; the case is reported and a fresh worker
serves the next.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import signal
from collections.abc import Callable, Sequence
from typing import Any

from workbench.check.guards import guarded_call
from workbench.check.stored import StoredCase
from workbench.check.subjects import SubjectError
from workbench.check.time_limit import Outcome


def importable_path(fn: Any) -> str | None:
    """``"module:qualname"`` when ``fn`` can be imported again by that path in another process
    (the same object found there), else None."""
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qual or module == "__main__" or "<" in qual:
        return None
    try:
        found = load(f"{module}:{qual}")
    except Exception:  # any import failure: the callable stays in the check's process
        return None
    return f"{module}:{qual}" if found is fn else None


def load(path: str) -> Callable[..., Any]:
    """The object at ``"module:qualname"``."""
    module, qual = path.split(":", 1)
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _serve(conn: Any, path: str, arrays: str) -> None:  # pragma: no cover -- runs in the worker
    fn = load(path)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        sc, want = job
        try:
            conn.send(("ok", guarded_call(fn, sc, arrays, want)))
        except SubjectError as e:
            conn.send(("subject", str(e)))
        except BaseException as e:
            conn.send(("raised", f"{type(e).__name__}: {e}"))


def _died(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


class ProcessCaller:
    """Runs the callable at ``path`` on cases in a worker process, each within ``seconds``."""

    def __init__(self, path: str, arrays: str, seconds: float) -> None:
        self.path, self.arrays, self.seconds = path, arrays, float(seconds)
        self._proc: Any = None
        self._conn: Any = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, self.path, self.arrays), daemon=True, name="workbench-check")
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5)
            self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        """End the worker (a later call starts a fresh one)."""
        if self._proc is not None:
            try:
                self._conn.close()  # the worker's recv sees EOF and returns
                self._proc.join(timeout=5)
            finally:
                self._stop()

    def _one(self, sc: StoredCase, want: tuple[int, ...], first: bool) -> Outcome:
        if self._proc is None:
            self._start()
        try:
            self._conn.send((sc, want))
            # the first call of a worker also waits for its start (imports): not the subject's time
            ready = self._conn.poll(self.seconds + (60.0 if first else 0.0))
        except (BrokenPipeError, OSError):
            ready = True
        if not ready:
            self._stop()
            return Outcome(timed_out=True)
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(timeout=5)
            how = _died(self._proc.exitcode)
            self._stop()
            return Outcome(error=SubjectError(f"its process died ({how}) on this case; the check went on"))
        if kind == "ok":
            return Outcome(value=value)
        return Outcome(error=SubjectError(value if kind == "subject" else f"raised {value}"))

    def run_all(self, jobs: Sequence[tuple[StoredCase, tuple[int, ...]]]) -> list[Outcome]:
        """One outcome a job (a case and the output shape it must have), in order."""
        out = []
        for sc, want in jobs:
            out.append(self._one(sc, want, first=self._proc is None))
        return out
