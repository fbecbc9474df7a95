"""The implementation under test run in a worker process of its own: a crash (a segfault, an
abort) costs its case, not the check, a hang is ended by killing the process, and the float64
truth is never in the worker's reach.

Two kinds of subject go there. A callable importable by ``module:qualname`` (not a lambda, not
one defined in ``__main__``), run through :func:`workbench.check.guards.guarded_call`; and the
kernel forms (a kernels folder, a Metal or CUDA source with its launch), whose launches and, on
the emulator, the compiled C++ of the user's text run in the worker. The subject is sent once,
pickled (a callable by reference, a form by value without its compiled kernels), when a worker
starts; the worker then receives one case at a time (the stored weights and the activations,
never the truth) and runs the calls asked of it, answering each with the output or what went
wrong. A worker that dies or passes the time limit is ended; its case is reported and a fresh
worker serves the next.

The cost, stated (measured 2026-12-05 on this project's 2-core machine under a load of about
10): a worker's start, a fresh interpreter importing MLX, the workbench and the user's module,
waited for apart (up to 60 s, never counted in a call's limit): 1 to 5 s; a call's round trip
through the pipes, about 6 ms there (a step's sequences at one token go in one message, as do
a tail case's calls, one an input scale); and a case's arrays shipped once a case, not once a
call: every array of 64 KB or more goes out-of-band (pickle protocol 5) into a slot, a file
under ``/dev/shm`` where there is one (memory, not disk) that is written over case after case
and that the worker maps read-only once (:class:`ProcessCaller` says when a slot may be
written over): one copy by the check into memory touched before, none by the worker. The
guarded calls then copy what they hand the subject, as they do in the check's own process,
once for all of a case's calls (:func:`workbench.check.guards.guarded_calls`). A kernel
form's case ships the master rows of its weights (the arrays the check's blocks are drawn
from) and the worker makes the stored weights from them exactly as the check's thread would
(:func:`workbench.studies.cases.case_row_weights`).
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from workbench.check.guards import CopyPool, guarded_call, guarded_calls
from workbench.check.stored import as_numpy
from workbench.check.subjects import CallableSubject, SubjectError
from workbench.check.time_limit import Outcome
from workbench.studies.cases import CaseArrays, case_row_weights

_HEADER = struct.Struct("<Q")

#: Arrays at least this large travel through the shared file, smaller ones in the pickle.
OUT_OF_BAND_BYTES = 1 << 16

#: The alignment of each array in the shared file (a cache line; numpy needs the dtype's).
_ALIGN = 64

#: Seconds a new worker may take to come up (the interpreter's start and imports: MLX, the
#: workbench, the user's module), waited for before its first call: not the subject's time.
START_GRACE = 60.0


@dataclass(frozen=True)
class FormCase:
    """One case as a kernel form's worker receives it: the master ``rows`` of its weights (a
    :class:`~workbench.studies.cases.CaseArrays` of one case), the stored weights' ``config``
    (``dtype``, ``fold``, ``spec``, ``eps``), the activations ``branch`` [n, branch] and
    ``residual`` [n, hidden] at each input scale, and its name."""

    rows: CaseArrays
    config: dict[str, Any]
    branch: np.ndarray
    residual: np.ndarray
    case: str

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.rows.shape


def _scratch() -> Path:
    """A private folder for the shared files: in memory (``/dev/shm``) where the system has it."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="workbench-check-", dir=shm if shm.is_dir() else None))


def send_message(stream: BinaryIO, obj: Any, scratch: Path | None = None, slot: Path | None = None) -> None:
    """``obj`` pickled onto ``stream``; with ``scratch``, its large arrays in a new file there,
    which the receiver unlinks; with ``slot``, in that file instead, written over from its start
    and kept (:class:`ProcessCaller` says when a slot may be written over)."""
    big: list[pickle.PickleBuffer] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        if (scratch is None and slot is None) or buf.raw().nbytes < OUT_OF_BAND_BYTES:
            return True  # in the pickle
        big.append(buf)
        return False

    data = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    path, spans = "", []
    if big:
        spans, end = _layout([buf.raw().nbytes for buf in big])
        if slot is not None:
            path = str(slot)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        else:
            fd, path = tempfile.mkstemp(dir=scratch, suffix=".case")
        try:
            if os.fstat(fd).st_size < end:  # a slot only grows: a mapping of it stays valid
                os.ftruncate(fd, end)
            for buf, (offset, _) in zip(big, spans):
                _write_at(fd, buf.raw(), offset)
        finally:
            os.close(fd)
    message = pickle.dumps((data, path, spans, slot is not None), protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(message)) + message)
    stream.flush()


def _layout(sizes: list[int]) -> tuple[list[tuple[int, int]], int]:
    """Each array's ``(offset, bytes)`` in a shared file, aligned, and the file's length."""
    spans, end = [], 0
    for n in sizes:
        end += -end % _ALIGN
        spans.append((end, n))
        end += n
    return spans, end


def _write_at(fd: int, raw: memoryview, offset: int) -> None:
    """All of ``raw`` written at ``offset`` (``pwrite`` may write less than asked)."""
    raw = raw.cast("B")
    done = 0
    while done < raw.nbytes:
        done += os.pwrite(fd, raw[done:], offset + done)


def receive_message(stream: BinaryIO, mapped: dict[str, mmap.mmap] | None = None) -> Any:
    """The next message, or EOFError when the other side is gone. Its shared file is mapped
    read-only and unlinked (the mapping keeps it while any array of it lives); a slot (kept by
    its sender) is mapped once and its mapping kept in ``mapped``, by path, while large enough:
    its pages are then read where they were read before, not faulted in again."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    n = _HEADER.unpack(head)[0]
    message = stream.read(n)
    if len(message) < n:
        raise EOFError
    data, path, spans, kept = pickle.loads(message)
    if not path:
        return pickle.loads(data)
    end = max(o + k for o, k in spans)
    view = None
    if kept and mapped is not None and path in mapped and len(mapped[path]) >= end:
        view = memoryview(mapped[path])
    if view is None:
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if kept and mapped is not None:
            mapped[path] = m
        elif not kept:
            os.unlink(path)
        view = memoryview(m)
    return pickle.loads(data, buffers=[view[o : o + k] for o, k in spans])


#: The worker process's fresh copies of a case's weights, reused call after call (bounded: two
#: buffers a shape and dtype; :class:`workbench.check.guards.CopyPool` says why).
WORKER_POOL = CopyPool()


def case_calls(subject: Any, payload: Any) -> Callable[[Any], Any]:
    """What a worker calls for one case, given a call's argument: a callable's guarded calls
    (one, or one a scale: the argument is the index), a kernel form's launches on the weights
    made from the case's rows (likewise), or a subject of its own kind's ``worker_call``
    (a recurrent step's sequence: the argument is the token's inputs)."""
    if hasattr(subject, "worker_call"):
        return subject.worker_call(payload)
    if isinstance(subject, CallableSubject):
        return CaseCalls(subject, subject.jobs(payload))
    w, _, _ = case_row_weights(payload.rows, 0, **payload.config)
    fns = [fn for fn, _ in subject.calls(payload, w)]
    return lambda j: fns[j]()


class CaseCalls:
    """A callable's calls of one case in the worker: call ``j`` alone (guarded, fresh copies of
    everything), or several at once (:meth:`many`: one copy of the weights for all of them)."""

    def __init__(self, subject: CallableSubject, jobs: list[tuple[Any, tuple[int, ...]]]) -> None:
        self.subject, self.jobs = subject, jobs

    def __call__(self, j: int) -> Any:
        sc, want = self.jobs[j]
        return guarded_call(self.subject.fn, sc, self.subject.arrays, want, (), WORKER_POOL)

    def many(self, js: list[int]) -> list[Any]:
        picked = [self.jobs[j] for j in js]
        return guarded_calls(
            self.subject.fn, [sc for sc, _ in picked], self.subject.arrays, [w for _, w in picked], WORKER_POOL
        )


def _returned(value: Any) -> Any:
    """What a worker sends back: an array as numpy, a tuple of them likewise (a step's three)."""
    if isinstance(value, (tuple, list)):
        return tuple(_returned(v) for v in value)
    a = as_numpy(value)
    return value if a is None else np.asarray(a)


def serve() -> None:  # pragma: no cover -- runs in the worker
    """The worker's loop: the subject and the folder for shared files, then calls ``(key,
    payload, arg)`` in on stdin (a ``payload`` for a case it does not hold), outcomes out on the
    original stdout (what the subject prints goes to stderr, so it cannot corrupt the messages)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    stdin = sys.stdin.buffer
    try:
        sent, hold, scratch = receive_message(stdin)
    except EOFError:
        return
    try:
        subject, failed = pickle.loads(sent), ""
    except BaseException as e:  # the user's module does not import here: every call says so
        subject, failed = None, f"could not be loaded in the worker process: {type(e).__name__}: {e}"
    held: dict[Any, Callable[[Any], Any]] = {}
    mapped: dict[str, mmap.mmap] = {}
    while True:
        try:
            key, payload, arg = receive_message(stdin, mapped)
        except EOFError:
            return
        if key == PING:
            send_message(out, ("ok", None))
        elif failed:
            send_message(out, ("raised", failed))
        elif key == MANY:
            send_message(out, ("many", _answers(subject, held, hold, arg)), scratch)
        else:
            send_message(out, _answer(subject, held, hold, key, payload, arg), scratch)


#: The key of a message that carries several calls (``ProcessCaller.call_many``).
MANY = "__many__"

#: The key of the message a new worker answers once it is up (the subject loaded): its start
#: is waited for apart, so no call's limit includes it.
PING = "__ping__"


def _answer(subject: Any, held: dict, hold: int, key: Any, payload: Any, arg: Any) -> tuple[str, Any]:
    """One call in the worker: ``("ok", value)``, ``("subject", why)`` or ``("raised", what)``."""
    try:
        if payload is not None:
            if len(held) >= hold:
                held.clear()
            held[key] = case_calls(subject, payload)
        return ("ok", _returned(held[key](arg)))
    except SubjectError as e:
        return ("subject", str(e))
    except BaseException as e:
        return ("raised", f"{type(e).__name__}: {e}")


def _answers(subject: Any, held: dict, hold: int, jobs: list) -> list[tuple[str, Any]]:
    """The calls of a message, in order; a run of calls of one case whose calls run together
    (their ``many``: a callable's calls sharing one copy of the weights) in one go."""
    out: list[tuple[str, Any]] = []
    k = 0
    while k < len(jobs):
        key, payload, _ = jobs[k]
        end = k + 1
        while end < len(jobs) and jobs[end][0] == key and jobs[end][1] is None:
            end += 1
        if end - k > 1:
            try:
                if payload is not None:
                    if len(held) >= hold:
                        held.clear()
                    held[key] = case_calls(subject, payload)
                many = getattr(held[key], "many", None)
            except BaseException as e:
                many, failed = None, ("raised", f"{type(e).__name__}: {e}")
                out += [failed] * (end - k)
                k = end
                continue
            args = [job[2] for job in jobs[k:end]]
            if many is not None:
                out += [_outcome(got) for got in many(args)]
            else:  # the case is held now: its calls one by one, without making it again
                out += [_answer(subject, held, hold, key, None, arg) for arg in args]
            k = end
            continue
        out.append(_answer(subject, held, hold, *jobs[k]))
        k += 1
    return out


def _outcome(got: Any) -> tuple[str, Any]:
    """A call's result or the exception it ended with, as a worker answers it."""
    if isinstance(got, SubjectError):
        return ("subject", str(got))
    if isinstance(got, BaseException):
        return ("raised", f"{type(got).__name__}: {got}")
    try:
        return ("ok", _returned(got))
    except BaseException as e:
        return ("raised", f"{type(e).__name__}: {e}")


def _died(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


class ProcessCaller:
    """Runs ``subject`` (an importable :class:`CallableSubject`, a kernel form, or a subject with
    a ``worker_call``) on cases in a worker process, each call within ``seconds``. The worker
    holds up to ``hold`` cases at a time (a tail's case: one; a step's sequences: every one of
    a condition, their constants are small); both sides forget them all at once when full.

    A message that ships cases writes their arrays into a slot: a file of the scratch folder
    kept and written over, not a new one a case. A new file's pages are memory touched for
    the first time (about 0.39 GB/s on this project's VM, against 4-5 GB/s re-touched): at a
    shipped shape a new file a case was a large part of a check. A slot is written over only
    when no case in it is held any more (both sides forgot them), never by the message that
    makes them forgotten: the worker still reads a held case's arrays until it has read that
    message."""

    def __init__(self, subject: Any, seconds: float, hold: int = 1) -> None:
        self.subject, self.seconds, self.hold = subject, float(seconds), int(hold)
        # pickled here, once: what cannot travel is refused before any case runs
        self._sent = pickle.dumps(subject, protocol=5)
        self._proc: Any = None
        self._held: set = set()
        self._scratch: Path | None = None
        self._free: list[Path] = []  # slots no held case is in
        self._busy: list[Path] = []  # slots of the cases the worker holds
        self._slots = 0

    def _forget(self) -> None:
        """Both sides forget every case (the worker ended or is new): every slot is free."""
        self._held = set()
        self._free += self._busy
        self._busy = []

    def _prepare(self, jobs: Sequence[tuple[Any, Any, Any]]) -> tuple[list[tuple[Any, Any, Any]], Path | None]:
        """``jobs`` as sent (a payload only where the worker does not hold its case) and the
        slot its arrays are written to (None: no case shipped; its arrays in a new file)."""
        free, freed, sent, ships = list(self._free), [], [], False
        for key, payload, arg in jobs:
            ship = key not in self._held
            if ship and len(self._held) >= self.hold:
                self._held.clear()  # the worker does the same on reading this job
                freed += self._busy
                self._busy = []
            sent.append((key, payload if ship else None, arg))
            self._held.add(key)
            ships |= ship
        slot = None
        if ships:
            if free:
                slot = free.pop()
            else:
                self._slots += 1
                slot = self._scratch / f"slot-{self._slots}.case"
            self._busy.append(slot)
        self._free = free + freed
        return sent, slot

    def _start(self) -> None:
        # A fresh interpreter, not multiprocessing's spawn: that re-runs the user's __main__
        # script, which starts checks of its own unless guarded by ``if __name__ == "__main__"``.
        # the parent's import path; no __pycache__ written beside the user's module
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        code = "from workbench.check.isolation import serve; serve()"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        if self._scratch is None:
            self._scratch = _scratch()
        self._forget()
        # the subject as pickled once, framed as send_message frames a message
        first = pickle.dumps((self._sent, self.hold, self._scratch), protocol=5)
        message = pickle.dumps((first, "", [], False), protocol=pickle.HIGHEST_PROTOCOL)
        self._proc.stdin.write(_HEADER.pack(len(message)) + message)
        self._proc.stdin.flush()

    def _started(self) -> str:
        """Start a worker and wait (up to :data:`START_GRACE`) until it is up: ``""``, or what went wrong."""
        try:
            self._start()
            send_message(self._proc.stdin, (PING, None, None))
            ready, _, _ = select.select([self._proc.stdout], [], [], START_GRACE)
            if ready and receive_message(self._proc.stdout)[0] == "ok":
                return ""
            why = f"did not start within {START_GRACE:g} s"
        except (EOFError, OSError, pickle.UnpicklingError) as e:
            why = f"could not be started ({type(e).__name__}: {e})" if isinstance(e, OSError) else "died at its start"
        self._stop()
        return f"its worker process {why}"

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
        self._forget()

    def close(self) -> None:
        """End the worker (a later call starts a fresh one) and remove its shared files."""
        if self._proc is not None:
            try:
                self._proc.stdin.close()  # the worker reads EOF and returns
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            finally:
                self._stop()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        self._free, self._busy = [], []

    def call(self, key: Any, payload: Any, arg: Any) -> Outcome:
        """One call of the case ``key`` (``payload`` shipped only when the worker does not hold it)."""
        if self._proc is None:
            problem = self._started()
            if problem:
                return Outcome(error=SubjectError(problem))
        proc = self._proc
        try:
            (sent,), slot = self._prepare([(key, payload, arg)])
            send_message(proc.stdin, sent, self._scratch, slot)
            ready, _, _ = select.select([proc.stdout], [], [], self.seconds)
        except (BrokenPipeError, OSError):
            ready = [proc.stdout]
        if not ready:
            self._stop()
            return Outcome(timed_out=True)
        try:
            kind, value = receive_message(proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            self._stop()
            return Outcome(error=SubjectError(f"its process died ({_died(code)}) on this case; the check went on"))
        if kind == "ok":
            return Outcome(value=value)
        return Outcome(error=SubjectError(_why(kind, value)))

    def call_many(self, jobs: Sequence[tuple[Any, Any, Any]], seconds: float | None = None) -> list[Outcome]:
        """Several calls ``(key, payload, arg)`` in one message and one answer, all within
        ``seconds`` (default: the limit of one call; a step's sequences at one token: one
        round trip, not one each, which on a loaded machine costs a scheduler's wait each).
        Where they do not all finish, or the worker dies, they run again one by one, so the
        call that hangs or crashes is named."""
        if len(jobs) <= 1:
            return [self.call(*job) for job in jobs]
        if self._proc is None:
            problem = self._started()
            if problem:
                return [Outcome(error=SubjectError(problem)) for _ in jobs]
        proc = self._proc
        sent, slot = self._prepare(jobs)
        try:
            send_message(proc.stdin, (MANY, None, sent), self._scratch, slot)
            ready, _, _ = select.select([proc.stdout], [], [], self.seconds if seconds is None else seconds)
            kind, value = receive_message(proc.stdout) if ready else ("", None)
        except (EOFError, OSError, pickle.UnpicklingError):
            kind, value = "", None
        if kind != "many":
            self._stop()
            return [self.call(*job) for job in jobs]
        return [Outcome(value=v) if k == "ok" else Outcome(error=SubjectError(_why(k, v))) for k, v in value]

    def run_all(self, jobs: Sequence[tuple[Any, Any, Any]]) -> list[Outcome]:
        """One outcome a job ``(key, payload, arg)``, in order: a run of jobs of one case in one
        message (:meth:`call_many`, within the limit of one call each), where the worker runs
        them together (a callable's calls share one copy of the case's weights:
        :func:`workbench.check.guards.guarded_calls`)."""
        out: list[Outcome] = []
        k = 0
        while k < len(jobs):
            end = k + 1
            while end < len(jobs) and jobs[end][0] == jobs[k][0]:
                end += 1
            run = list(jobs[k:end])
            out += self.call_many(run, self.seconds * len(run)) if len(run) > 1 else [self.call(*run[0])]
            k = end
        return out


def _why(kind: str, value: str) -> str:
    """A worker's answer other than ``ok``, in the words a problem gives it."""
    return value if kind == "subject" else f"raised {value}"
