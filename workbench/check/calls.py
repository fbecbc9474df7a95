"""The implementation under test on a block of cases, twice: in order, then again in the
reverse order (a callable handed fresh copies of the inputs each call), the bits compared.

A callable runs guarded (:func:`workbench.check.guards.guarded_call`: inputs unchanged, no
aliased output), in a worker process of its own where it is importable
(:class:`workbench.check.isolation.ProcessCaller`; there a case's calls, one an input scale,
go in one message and share one copy of its weights:
:func:`workbench.check.guards.guarded_calls`), else on the check's worker thread
(:class:`workbench.check.time_limit.LimitedCaller`). The kernel forms (a kernels folder, a
source) launch the user's text on the case's weights in a worker process of their own too
(made there from the case's master rows), unless built with ``process=False``. What a call
did wrong is written to ``problems``, naming the case; its output is then NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from workbench.check.guards import CopyPool, guarded_call
from workbench.check.isolation import FormCase, ProcessCaller
from workbench.check.stored import StoredCase
from workbench.check.subjects import (
    CallableSubject,
    KernelsFolderSubject,
    SourceSubject,
    SubjectError,
    checked_output,
)
from workbench.check.time_limit import LimitedCaller, Outcome
from workbench.studies.cases import case_row_weights


@dataclass
class Callers:
    """Where a check's calls run: the thread caller, and a worker process for an importable callable."""

    thread: LimitedCaller
    process: ProcessCaller | None = None
    pool: CopyPool = field(default_factory=CopyPool)  # the thread's calls' fresh copies, reused

    def close(self) -> None:
        if self.process is not None:
            self.process.close()


def in_process(subject: Any) -> bool:
    """Whether ``subject``'s calls go to a worker process: an importable callable (its
    ``path``), a kernel form unless built with ``process=False``."""
    if isinstance(subject, CallableSubject):
        return bool(subject.path)
    return isinstance(subject, (KernelsFolderSubject, SourceSubject)) and subject.process


def callers(subject: Any, seconds: float) -> Callers:
    """The :class:`Callers` for ``subject`` (a worker process where :func:`in_process`)."""
    return Callers(LimitedCaller(seconds), ProcessCaller(subject, seconds) if in_process(subject) else None)


def where_it_ran(subject: Any) -> str:
    """A line for the report: where the implementation's calls ran."""
    own = "a crash costs its case, a hang its process, the truth is not in reach"
    if isinstance(subject, CallableSubject) and subject.path:
        return f"in a worker process of its own ({subject.path}): {own}"
    if isinstance(subject, CallableSubject):
        return (
            "in the check's own process, on a worker thread (not importable by module:qualname, or process=False): "
            "a crash would end the check"
        )
    if in_process(subject):
        return f"in a worker process of its own (the {subject.kind}'s launches): {own}"
    kind = getattr(subject, "kind", "form")
    return f"in the check's own process (the {kind}'s launches, process=False): a crash would end the check"


@dataclass
class BlockRuns:
    """A block's outputs, float32 [S, n, hidden]: ``first`` and ``again`` (the second run, or None)."""

    first: np.ndarray
    again: np.ndarray | None


def _wants(subject: Any, sc: StoredCase) -> list[tuple[int, ...]]:
    """The output shape of each call one case takes: one call of every scale, or one a scale."""
    n, hidden = sc.branch.shape[0], sc.shape[0]
    return [(n, hidden)] if subject.batched else [(hidden,)] * n


def _jobs(subject: Any, scs: list[StoredCase], c: Any, scales: list[float], process: bool, **config: Any) -> list:
    """One ``(run, want, i, j, label)`` a call: ``run`` is the thread's call, or for a worker
    process ``(case name, what it is sent of the case, call index)``."""
    out = []
    for i, sc in enumerate(scs):
        if process:
            payload: Any = sc
            if not isinstance(subject, CallableSubject):  # a form: its weights made in the worker
                payload = FormCase(c.rows(slice(i, i + 1)), config, sc.branch, sc.residual, sc.case)
            made: list[Any] = [((sc.case, payload, j), want) for j, want in enumerate(_wants(subject, sc))]
        elif isinstance(subject, CallableSubject):
            made = subject.jobs(sc)
        else:  # the kernel forms launch the workbench's own TailWeights of the case
            w, _, _ = case_row_weights(c, i, **config)
            made = subject.calls(sc, w)
        for j, (run, want) in enumerate(made):
            label = sc.case if len(made) == 1 else f"{sc.case} scale {scales[j]:g}"
            out.append((run, want, i, j if len(made) > 1 else None, label))
    return out


def _outcomes(subject: Any, calls: Callers, jobs: list[tuple], order: list[int], held: list) -> list[Outcome]:
    """Each job's outcome (in job order), the jobs run in ``order``."""
    if calls.process is not None:
        got = calls.process.run_all([jobs[k][0] for k in order])
    elif isinstance(subject, CallableSubject):
        fns = [
            partial(guarded_call, subject.fn, jobs[k][0], subject.arrays, jobs[k][1], held, calls.pool) for k in order
        ]
        got = calls.thread.run_all(fns)
    else:
        got = calls.thread.run_all([jobs[k][0] for k in order])
    out: list[Outcome] = [Outcome()] * len(jobs)
    for k, o in zip(order, got):
        out[k] = o
    return out


def _gather(outcomes: list[Outcome], jobs: list[tuple], shape: tuple, seconds: float, problems: list, prefix: str):
    out = np.full(shape, np.nan, dtype=np.float32)
    for o, (_, want, i, j, label) in zip(outcomes, jobs):
        if o.timed_out:
            problems.append(f"{prefix}{label}: no result within the {seconds:g} s limit")
            continue
        if o.error is not None:
            kind = "" if isinstance(o.error, SubjectError) else f"raised {type(o.error).__name__}: "
            problems.append(f"{prefix}{label}: {kind}{o.error}")
            continue
        try:
            got = checked_output(o.value, want)
        except SubjectError as e:
            problems.append(f"{prefix}{label}: {e}")
            continue
        if np.isnan(got).any():
            problems.append(f"{prefix}{label}: NaN in the output")
        if j is None:
            out[i] = got
        else:
            out[i, j] = got
    return out


def run_block(
    subject: Any,
    calls: Callers,
    scs: list[StoredCase],
    c: Any,
    *,
    scales: list[float],
    problems: list[str],
    held: list[np.ndarray],
    rerun: bool,
    **config: Any,
) -> BlockRuns:
    """The implementation on every case of a block (``config``: ``dtype``, ``fold``, ``spec``,
    ``eps`` of the kernel forms' weights), and with ``rerun`` once more in the reverse order.
    A problem of the second run only is written with the prefix ``second run, ``."""
    jobs = _jobs(subject, scs, c, scales, calls.process is not None, **config)
    shape = (len(scs), scs[0].branch.shape[0], scs[0].shape[0])
    order = list(range(len(jobs)))
    first = _gather(_outcomes(subject, calls, jobs, order, held), jobs, shape, calls.thread.seconds, problems, "")
    if not rerun:
        return BlockRuns(first, None)
    again_problems: list[str] = []
    outs = _outcomes(subject, calls, jobs, order[::-1], held)
    again = _gather(outs, jobs, shape, calls.thread.seconds, again_problems, "second run, ")
    seen = {p.split(": ", 1)[0].removeprefix("second run, ") for p in problems}
    problems.extend(p for p in again_problems if p.split(": ", 1)[0].removeprefix("second run, ") not in seen)
    return BlockRuns(first, again)


def rerun_difference(first: np.ndarray, again: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per row, the largest ``|first - again| / max(|truth|, 1)``: 0 for the same bits, NaN where
    only one of the two is NaN (inf where the bits differ and a difference is not a number)."""
    same = np.all(first.view(np.uint32) == again.view(np.uint32), axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(first.astype(np.float64) - again) / np.maximum(np.abs(truth), 1.0)
        worst = np.max(np.where(np.isnan(d), np.inf, d), axis=-1)
    return np.where(same, 0.0, worst)
