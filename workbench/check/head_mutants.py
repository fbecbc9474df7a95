"""Source-level mutants of a user's head kernel, run through the head's check.

The same mutants as the tail's (:func:`workbench.check.mutants.source_mutants`: a barrier
dropped, a bound moved by one, a wrong SIMD lane, a group array read one element off), the
same statuses (:class:`~workbench.check.mutants.MutantStudy`): a mutant that gives the
original's bits in every schedule tried is **equivalent**, never a miss; every other one is
**caught** (the head's check fails it) or **missed**. A Metal source runs in each of ``orders``
of the CPU emulator; a kernels folder (its ``head_qkv.body`` mutated, on the workbench's head
launch) in the emulator's one default schedule, which the head launch does not let a caller pick.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from workbench import validate
from workbench.check.head_cases import DEFAULT_POSITIONS, HEAD_SCALES
from workbench.check.head_run import check_head
from workbench.check.head_subjects import HeadSource, KernelsFolderHead
from workbench.check.mutants import KINDS, STUDY_ORDERS, Mutant, MutantStudy, source_mutants


class _Recording:
    """A head form whose every output is kept (spec, case -> float32 arrays; None: no result)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.kind = inner, inner.name, inner.kind
        self.outputs: dict[tuple[str, str], list[np.ndarray] | None] = {}

    def prepare(self, spec: Any) -> Callable[[Any], Any]:
        call = self.inner.prepare(spec)

        def run(head: Any) -> Any:
            key = (spec.label, head.case)
            self.outputs[key] = None
            out = call(head)
            self.outputs[key] = [np.array(o, dtype=np.float32, copy=True) for o in out]
            return out

        return run


def _same_bits(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k, xs in a.items():
        ys = b[k]
        if xs is None or ys is None or len(xs) != len(ys):
            return False
        if any(x.shape != y.shape or not np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(xs, ys)):
            return False
    return True


def _run_all(make: Callable[[str], Any], orders: Sequence[str], check_args: dict) -> tuple[bool, dict, list, list]:
    passed, outs, problems, reasons = True, {}, [], []
    for o in orders:
        rec = _Recording(make(o))
        rep = check_head(rec, **check_args)
        passed = passed and rep.passed
        outs[o] = rec.outputs
        problems += rep.problems
        reasons += [f"{o}: {r}" for r in rep.reasons]
    return passed, outs, problems, reasons


def head_mutant_study(
    subject: HeadSource | KernelsFolderHead,
    *,
    specs: Any = ("model",),
    seeds: Iterable[int] = range(6),
    scales: Sequence[float] = HEAD_SCALES,
    positions: Sequence[int] = DEFAULT_POSITIONS,
    tolerance: float | None = None,
    orders: Sequence[str] = STUDY_ORDERS[:2],
    kinds: Sequence[str] = KINDS,
) -> MutantStudy:
    """Every mutant of ``subject``'s kernel text (a :class:`HeadSource` run on the emulator, or
    a :class:`KernelsFolderHead`'s ``head_qkv.body``), each checked by
    :func:`~workbench.check.head_run.check_head` on the same cases as the original. The
    user's folder is only read (its mutants are copies)."""
    check_args = {
        "specs": specs,
        "seeds": list(seeds),
        "scales": scales,
        "positions": positions,
        "tolerance": tolerance,
        "faults": (),
    }
    if isinstance(subject, HeadSource):
        if subject.run_on != "emulator":
            raise ValueError("subject: a source's mutants run on the emulator; got run_on='device'")
        from workbench.kernels.metal_emulation import SCHEDULES

        orders = tuple(validate.one_of("orders", o, SCHEDULES) for o in validate.sequence("orders", orders))
        found = [("source", m) for m in source_mutants(subject.source, kinds=kinds)]

        def make(variant: tuple[str, Mutant] | None) -> Callable[[str], Any]:
            base = subject if variant is None else subject.with_source(variant[1].source, f"{subject.name}_mutant")
            return lambda o: replace(base, order=o, _kernels={})

        return _study(subject.name, found, make, orders, check_args)
    if not isinstance(subject, KernelsFolderHead):
        raise ValueError(f"subject: must be a HeadSource or a KernelsFolderHead, got {validate.describe(subject)}")
    work = Path(tempfile.mkdtemp(prefix="workbench-head-mutants-"))
    try:
        original = work / "original"
        shutil.copytree(subject.folder, original)
        found = [("head_qkv.body", m) for m in source_mutants((original / "head_qkv.body").read_text(), kinds=kinds)]
        made: dict[int, Path] = {}

        def make_folder(variant: tuple[str, Mutant] | None) -> Callable[[str], Any]:
            if variant is None:
                return lambda o: KernelsFolderHead(original, subject.backend, name=subject.name)
            d = work / f"mutant{len(made)}"
            shutil.copytree(original, d)
            (d / variant[0]).write_text(variant[1].source)
            made[id(variant[1])] = d
            return lambda o: KernelsFolderHead(d, subject.backend, name=subject.name)

        return _study(subject.name, found, make_folder, ("ascending",), check_args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _study(
    name: str,
    mutants: Sequence[tuple[str, Mutant]],
    make: Callable[[tuple[str, Mutant] | None], Callable[[str], Any]],
    orders: Sequence[str],
    check_args: dict,
) -> MutantStudy:
    import pandas as pd

    ok, base, _, _ = _run_all(make(None), orders, check_args)
    same = all(_same_bits(base[orders[0]], base[o]) for o in orders[1:])
    rows = []
    for where, m in mutants:
        passed, outs, problems, reasons = _run_all(make((where, m)), orders, check_args)
        changed = bool(problems) or not all(_same_bits(base[o], outs[o]) for o in orders)
        if problems and all("MetalCompileError" in e for e in problems):
            status = "does not compile"
        elif not changed:
            status = "equivalent"
        else:
            status = "missed" if passed else "caught"
        rows.append(
            {
                "file": where,
                "kind": m.kind,
                "line": m.line,
                "before": m.before,
                "after": m.after,
                "status": status,
                "reason": (reasons or problems or [""])[0],
            }
        )
    table = pd.DataFrame(rows, columns=["file", "kind", "line", "before", "after", "status", "reason"])
    return MutantStudy(name, table, ok, same, tuple(orders))
