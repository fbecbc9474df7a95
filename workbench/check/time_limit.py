"""A call under a time limit, so one case that hangs cannot hang the whole check.

The user's callable runs on a worker thread; the check waits at most ``seconds`` for
each call. Python cannot stop a thread from outside, so a call past its limit is left
running on its (daemon) thread and a fresh worker serves the next case: the case is
reported as over its limit, and the check goes on. What the abandoned call computes is
never read. One worker serves every call otherwise (a thread a call would cost more than
a small numpy tail does).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable


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
                except BaseException as e:  # noqa: BLE001 -- any failure of the user's code is a verdict
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
