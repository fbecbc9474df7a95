"""A call under a time limit, so one case that hangs cannot hang the whole check.

The user's callable runs on a worker thread; the check waits at most ``seconds`` for
each call. Python cannot stop a thread from outside, so a call past its limit is left
running on its (daemon) thread and a fresh worker serves the next case: the case is
reported as over its limit, and the check goes on. What the abandoned call computes is
never read. One worker serves every call otherwise (a thread a call would cost more than
a small numpy tail does).

:meth:`LimitedCaller.run_all` hands a whole list of calls to the worker at once: the
check's thread then sleeps until the list is done or the call in progress passes its
limit, instead of waking once a call (on two shared cores a hand-over each way cost
about as much as a small numpy tail).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """What one limited call gave: ``value``, or ``error`` (the exception), or ``timed_out``."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False


class LimitedCaller:
    """Calls ``fn(*args)`` on a worker thread and waits at most ``seconds`` for each."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self._jobs: queue.Queue | None = None

    def _start(self) -> queue.Queue:
        jobs: queue.Queue = queue.Queue()

        def work() -> None:
            while True:
                fn, args, done = jobs.get()
                try:
                    done.put(Outcome(value=fn(*args)))
                except BaseException as e:
                    done.put(Outcome(error=e))

        threading.Thread(target=work, daemon=True, name="workbench-check-call").start()
        return jobs

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Outcome:
        if self._jobs is None:
            self._jobs = self._start()
        done: queue.Queue = queue.Queue(maxsize=1)
        self._jobs.put((fn, args, done))
        try:
            return done.get(timeout=self.seconds)
        except queue.Empty:
            self._jobs = None  # that worker is stuck in the call: the next call gets a fresh one
            return Outcome(timed_out=True)

    def run_all(self, fns: Sequence[Callable[[], Any]]) -> list[Outcome]:
        """Each of ``fns`` (no arguments) in order, each within the limit; one outcome each.

        A call past its limit is reported as timed out and abandoned with its worker; the
        calls after it go to a fresh worker. An abandoned call's result is never read.
        """
        out: list[Outcome | None] = [None] * len(fns)
        start = 0
        while start < len(fns):
            lock = threading.Lock()
            state = {"index": start, "since": time.monotonic(), "cancelled": False}
            finished = threading.Event()

            def work(
                first: int = start,
                state: dict = state,
                lock: threading.Lock = lock,
                finished: threading.Event = finished,
            ) -> None:
                for k in range(first, len(fns)):
                    try:
                        result = Outcome(value=fns[k]())
                    except BaseException as e:
                        result = Outcome(error=e)
                    with lock:
                        if state["cancelled"]:
                            return
                        out[k] = result
                        state["index"], state["since"] = k + 1, time.monotonic()
                finished.set()

            if self._jobs is None:
                self._jobs = self._start()
            done: queue.Queue = queue.Queue(maxsize=1)
            self._jobs.put((work, (), done))
            while True:
                with lock:
                    deadline = state["since"] + self.seconds
                if finished.wait(timeout=max(0.0, deadline - time.monotonic())):
                    done.get()  # the worker is free again
                    return [o if o is not None else Outcome(timed_out=True) for o in out]
                with lock:
                    k = state["index"]
                    if time.monotonic() - state["since"] >= self.seconds and k < len(fns):
                        state["cancelled"] = True
                        out[k] = Outcome(timed_out=True)
                        self._jobs = None  # that worker is stuck in the call: a fresh one for the rest
                        start = k + 1
                        break
        return [o if o is not None else Outcome(timed_out=True) for o in out]
