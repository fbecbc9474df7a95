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

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
from collections.abc import Sequence
from typing import Any, BinaryIO

from workbench.check.guards import guarded_call
from workbench.check.stored import StoredCase
from workbench.check.subjects import SubjectError, load
from workbench.check.time_limit import Outcome

_HEADER = struct.Struct("<Q")


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    """The next message, or EOFError when the other side is gone."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    n = _HEADER.unpack(head)[0]
    data = stream.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


def serve(path: str, arrays: str) -> None:  # pragma: no cover -- runs in the worker
    """The worker's loop: cases in on stdin, outcomes out on the original stdout (what the
    callable prints goes to stderr, so it cannot corrupt the messages)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    fn = load(path)
    stdin = sys.stdin.buffer
    while True:
        try:
            sc, want = _receive(stdin)
        except EOFError:
            return
        try:
            _send(out, ("ok", guarded_call(fn, sc, arrays, want)))
        except SubjectError as e:
            _send(out, ("subject", str(e)))
        except BaseException as e:
            _send(out, ("raised", f"{type(e).__name__}: {e}"))


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

    def _start(self) -> None:
        # A fresh interpreter, not multiprocessing's spawn: that re-runs the user's __main__
        # script, which starts checks of its own unless guarded by ``if __name__ == "__main__"``.
        # the parent's import path; no __pycache__ written beside the user's module
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        code = "import sys; from workbench.check.isolation import serve; serve(sys.argv[1], sys.argv[2])"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code, self.path, self.arrays], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=5)
            for f in (self._proc.stdin, self._proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        self._proc = None

    def close(self) -> None:
        """End the worker (a later call starts a fresh one)."""
        if self._proc is not None:
            try:
                self._proc.stdin.close()  # the worker reads EOF and returns
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            finally:
                self._stop()

    def _one(self, sc: StoredCase, want: tuple[int, ...], first: bool) -> Outcome:
        if self._proc is None:
            self._start()
        proc = self._proc
        try:
            _send(proc.stdin, (sc, want))
            # the first call of a worker also waits for its start (imports): not the subject's time
            ready, _, _ = select.select([proc.stdout], [], [], self.seconds + (60.0 if first else 0.0))
        except (BrokenPipeError, OSError):
            ready = [proc.stdout]
        if not ready:
            self._stop()
            return Outcome(timed_out=True)
        try:
            kind, value = _receive(proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            self._stop()
            return Outcome(error=SubjectError(f"its process died ({_died(code)}) on this case; the check went on"))
        if kind == "ok":
            return Outcome(value=value)
        return Outcome(error=SubjectError(value if kind == "subject" else f"raised {value}"))

    def run_all(self, jobs: Sequence[tuple[StoredCase, tuple[int, ...]]]) -> list[Outcome]:
        """One outcome a job (a case and the output shape it must have), in order."""
        out = []
        for sc, want in jobs:
            out.append(self._one(sc, want, first=self._proc is None))
        return out
