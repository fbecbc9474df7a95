"""A thread of the recurrent-step check's own that runs its jobs one at a time (:class:`Lane`).

The check's work for a token is three passes that need nothing of each other until its end:
the float64 truth (numpy), the float32 reference (MLX) and the comparison of the state's
trajectories with the truth (numpy). On a CPU with a second free core they overlap when each
has a thread (numpy and MLX release Python's lock while they compute). A job's exception is
raised on the check's thread when its result is asked for, never lost on the lane's.

Lanes are kept for the process and lent (:func:`borrow`, :func:`give_back`), not made for each
run: MLX gives each thread that evaluates its own stream, and a stream's worker thread lives
as long as the process, so a thread a condition would leave one more idle thread behind each
condition of each check (measured: 13 a default check). A lane is lent to one run at a time;
as many exist as runs have ever been in progress at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class Lane:
    """A daemon thread named ``name`` running the jobs :meth:`run` hands it, in order, one at a time."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = False
        threading.Thread(target=self._work, daemon=True, name=name).start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._done.put((job(), None))
            except BaseException as e:  # raised on the check's thread by result()
                self._done.put((None, e))

    def run(self, job: Callable[[], Any]) -> None:
        """Hand ``job`` (no arguments) to the thread; its result must be taken before the next."""
        if self._pending:
            raise RuntimeError("Lane.run: the last job's result was not taken")
        self._pending = True
        self._jobs.put(job)

    def result(self) -> Any:
        """Wait for the job handed last; its return value, or its exception raised here."""
        if not self._pending:
            raise RuntimeError("Lane.result: no job was handed over")
        value, error = self._done.get()
        self._pending = False
        if error is not None:
            raise error
        return value

    def close(self) -> None:
        """End the thread once the job in progress (if any) returns."""
        self._jobs.put(None)


_free: list[Lane] = []
_lock = threading.Lock()


def borrow() -> Lane:
    """A lane of the process's no run holds, or a new one."""
    with _lock:
        if _free:
            return _free.pop()
    return Lane("workbench-check-lane")


def give_back(lane: Lane) -> None:
    """``lane`` back for the next run, once its job in progress (a run stopped by an error) has
    returned; that job's result or error is dropped (the run's own error is the one raised)."""
    if lane._pending:
        try:
            lane.result()
        except BaseException:  # the run that handed it over is already failing with its own error
            pass
    with _lock:
        _free.append(lane)
