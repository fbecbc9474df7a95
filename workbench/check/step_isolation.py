"""Where a recurrent step under test runs: guarded (:class:`~workbench.check.step_guards.GuardedStep`)
in a worker process of its own (:class:`ProcessStep`) where it can go there (a callable importable
by ``module:qualname``, a kernels folder, a source), else on a worker thread under the time limit
(:class:`~workbench.check.gdn_subjects.TimedStep`).

In a process, a crash (a segfault, an abort) stops the sequence it happened on, reported by
token, and a fresh worker serves the others; a call past the time limit is ended with its
process; the float64 truth never leaves the check's process. The cost: a worker's start, and
a token's inputs and returns through the pipe, the state (``Hv x Dv x Dk`` floats, the large one)
through a mapped shared file each way (:mod:`workbench.check.isolation`); a sequence's constants
are sent once. On a thread, a call past its limit is abandoned (Python cannot stop a thread) and
a crash ends the check: the report says which of the two ran.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from workbench import validate
from workbench.check.gdn_subjects import KernelsFolderStep, StepSource, TimedStep
from workbench.check.isolation import ProcessCaller
from workbench.check.step_guards import TOKEN_ARRAYS, GuardedStep, step_path
from workbench.check.stored import as_numpy
from workbench.check.subjects import SubjectError

#: Sequences a worker holds the constants of at once (a condition's every seed, as a rule).
HOLD = 4096


class ProcessStep:
    """A :class:`GuardedStep` run in a worker process, each call within ``seconds``."""

    def __init__(self, guarded: GuardedStep, seconds: float) -> None:
        self.guarded, self.seconds = guarded, float(seconds)
        self.name, self.kind = guarded.name, guarded.kind
        self.caller = ProcessCaller(guarded, self.seconds, hold=HOLD)
        self._keys = itertools.count()

    def layer(self, shape: Any, consts: Mapping[str, Any], eps: float) -> Callable[[Any], Any]:
        payload = (shape, {k: np.array(v) for k, v in consts.items()}, float(eps))
        return SequenceCall(self, next(self._keys), payload)

    def value(self, o: Any) -> Any:
        """A call's :class:`~workbench.check.time_limit.Outcome` as the step's returns, or raised."""
        if o.timed_out:
            raise SubjectError(f"no result within the {self.seconds:g} s limit (its process was ended)")
        if o.error is not None:
            raise o.error
        value, roundings = o.value
        self.guarded.roundings += roundings
        return value

    def call_all(self, pairs: list[tuple[Any, Any]]) -> list[Any]:
        """Each ``(call, step)`` of one token (the calls :meth:`layer` made): its returns, or the
        exception it raised, all through one message (``ProcessCaller.call_many``)."""
        outcomes = self.caller.call_many([(c.key, c.payload, sent(step)) for c, step in pairs])
        out: list[Any] = []
        for o in outcomes:
            try:
                out.append(self.value(o))
            except Exception as e:
                out.append(e)
        return out

    def close(self) -> None:
        self.caller.close()


def sent(step: Any) -> Any:
    """A token's inputs as a worker is sent them: numpy arrays."""
    return replace(step, **{k: np.asarray(as_numpy(getattr(step, k))) for k in TOKEN_ARRAYS})


class SequenceCall:
    """One sequence's call in a :class:`ProcessStep`: its key and constants, sent once."""

    def __init__(self, owner: ProcessStep, key: int, payload: tuple) -> None:
        self.owner, self.key, self.payload = owner, key, payload

    def __call__(self, step: Any) -> Any:
        return self.owner.value(self.owner.caller.call(self.key, self.payload, sent(step)))


def isolable(subject: Any) -> str:
    """Where ``subject`` can run in a worker process, what it is called there (else ``""``)."""
    if isinstance(subject, (KernelsFolderStep, StepSource)):
        return f"the {subject.kind}'s launches"
    return step_path(subject)


def guarded_step(subject: Any, *, rerun: Any = True, process: Any = None, time_limit: Any = 30.0) -> Any:
    """``subject`` guarded, in a worker process where it can be (``process``: None where it can,
    True to require it, False never), else under ``time_limit`` on a thread."""
    rerun = validate.flag("rerun", rerun)
    seconds = validate.number("time_limit", time_limit, minimum=0, exclusive_minimum=True)
    if process is not None:
        validate.flag("process", process)
    where = isolable(subject)
    if process and not where:
        raise ValueError(
            "process: True needs a step importable by module:qualname (not a lambda, a closure or one defined "
            f"in __main__), a kernels folder or a source, got {validate.describe(getattr(subject, 'fn', subject))}"
        )
    guarded = GuardedStep(subject, rerun=rerun)
    if where and process is not False:
        return ProcessStep(guarded, seconds)
    return TimedStep(guarded, seconds)


def where_it_ran(step: Any) -> str:
    """A line for the report: where the step's calls ran."""
    if isinstance(step, ProcessStep):
        return (
            f"ran in a worker process of its own ({isolable(step.guarded.inner)}): a crash costs its sequence, "
            "a hang its process, the truth is not in reach"
        )
    return "ran in the check's own process, on a worker thread (a crash would end the check)"


def checked(step: Any) -> list[str]:
    """What the check verified of ``step`` (from :func:`guarded_step`), in words."""
    guarded = step.guarded if isinstance(step, ProcessStep) else step.inner
    return [where_it_ran(step), *guarded.checked()]


def close(step: Any) -> None:
    """End ``step``'s worker process, if it has one."""
    if isinstance(step, ProcessStep):
        step.close()
