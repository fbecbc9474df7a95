"""Source-level mutants of a user's kernel, generated from its text and run through the same check.

The fault models (:mod:`workbench.check.faults`) are bugs of the math; a kernel's source has
bugs of its own. :func:`source_mutants` writes variants of the source with one change each:
``dropped barrier`` (one barrier statement removed); ``bound +1`` / ``bound -1`` (one ``<`` or
``<=`` of a ``for`` condition or ``if`` guard made ``<=`` or ``< (B) - 1``); ``wrong lane`` (the
lane, mask or offset of one SIMD-group shuffle made ``(A) ^ 1``: ``(A) + 1`` would still reach
every lane of an XOR butterfly once and only reorder the sum); ``wrong index`` (one read of a
``threadgroup`` array taken at the next element). Only ``<`` / ``<=`` bounds are mutated: a
loosened ``>`` bound of a loop counting an unsigned index down never ends, and a hang cannot be
stopped from Python (:mod:`workbench.check.time_limit`).

:func:`mutant_study` (a source and its launch) and :func:`folder_mutant_study` (a kernels folder)
run the original and each mutant through the part's check (the tail's
:func:`~workbench.check.run.check_kernel`, the Gated DeltaNet step's
:func:`~workbench.check.gdn_run.check_step` on short runs, states fed back) on the same cases in
several thread schedules of the CPU emulator. A mutant that gives the
original's bits everywhere is **equivalent**, never a miss; every other one is **caught** or
**missed** (a mutant that only reorders a float sum is rightly missed: read misses before calling
them bugs). The original must give the same bits in every schedule, or it has a race.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from workbench import validate
from workbench.check.run import DEFAULT_SCALES, check_kernel
from workbench.check.source_launch import SourceLaunch
from workbench.check.subjects import KernelsFolderSubject, SourceSubject

#: The kinds of mutant :func:`source_mutants` writes.
KINDS: tuple[str, ...] = ("dropped barrier", "bound +1", "bound -1", "wrong lane", "wrong index")

#: The emulator schedules a study runs each mutant in: the two thread orders and one where
#: the SIMD-groups run apart (a barrier missing between two SIMD-group phases shows only there).
STUDY_ORDERS: tuple[str, ...] = ("ascending", "descending", "simd-groups-random")

#: Calls whose second argument is a lane (or a lane mask): Metal's SIMD-group shuffles and
#: broadcast, and the kernels folder's ``lane_xor`` helper.
LANE_CALLS: tuple[str, ...] = (
    "simd_shuffle_xor",
    "simd_shuffle_down",
    "simd_shuffle_up",
    "simd_shuffle",
    "simd_broadcast",
    "lane_xor",
)

_BARRIER = re.compile(r"(?:\bmetal::)?\b(?:\w*barrier\w*|__syncthreads)\s*\([^;]*\)\s*;", re.IGNORECASE)
_FOR = re.compile(r"\bfor\s*\(")
_IF = re.compile(r"\bif\s*\(")
_LESS = re.compile(r"(?<![<])<(=?)(?![<=])")
_LANE_CALL = re.compile(r"\b(?:metal::)?(" + "|".join(LANE_CALLS) + r")\s*\(")
_GROUP_ARRAY = re.compile(r"\b(?:threadgroup|GROUP_SHARED|GRP)\s+\w+\s+(\w+)\s*\[")
_DECLARED = re.compile(r"\b(?:threadgroup|GROUP_SHARED|GRP)\s+\w+\s+$")


@dataclass(frozen=True)
class Mutant:
    """One change to a source: ``kind`` (:data:`KINDS`), the 1-based ``line``, the line
    ``before`` and ``after``, and the whole mutated ``source``."""

    kind: str
    line: int
    before: str
    after: str
    source: str = field(repr=False)

    @property
    def name(self) -> str:
        return f"{self.kind} @ line {self.line}"


def _close(text: str, open_at: int) -> int:
    """Index of the parenthesis closing the one at ``open_at`` (or -1)."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _line_of(text: str, i: int) -> tuple[int, str]:
    start = text.rfind("\n", 0, i) + 1
    end = text.find("\n", i)
    return text.count("\n", 0, i) + 1, text[start : end if end >= 0 else len(text)]


def _mutant(kind: str, text: str, start: int, end: int, replacement: str) -> Mutant:
    new = text[:start] + replacement + text[end:]
    line, before = _line_of(text, start)
    _, after = _line_of(new, start) if replacement.strip() else (line, "(removed)")
    return Mutant(kind, line, before.strip(), after.strip(), new)


def _operand_end(text: str, i: int, stop: int) -> int:
    """End of the right operand starting at ``i``: the next ``&&``, ``||``, ``;``, ``,`` or
    an unmatched ``)``, before ``stop``."""
    depth = 0
    j = i
    while j < stop:
        c = text[j]
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and (c in ";," or text.startswith("&&", j) or text.startswith("||", j)):
            break
        j += 1
    while j > i and text[j - 1].isspace():
        j -= 1
    return j


def _template_bracket(text: str, at: int, stop: int) -> bool:
    """Whether the ``<`` at ``at`` opens a template argument list (``name<F, U>(...)``): a name
    right before it and a ``>`` before the next ``&&``, ``||``, ``;`` or ``)``."""
    if at == 0 or not (text[at - 1].isalnum() or text[at - 1] == "_"):
        return False
    m = re.compile(r">|&&|\|\||;|\)").search(text, at + 1, stop)
    return m is not None and m.group() == ">"


def _bounds(text: str) -> list[Mutant]:
    out = []
    spans = []
    for m in _FOR.finditer(text):
        close = _close(text, m.end() - 1)
        first = text.find(";", m.end(), close)
        second = text.find(";", first + 1, close) if first >= 0 else -1
        if second > first >= 0:
            spans.append((first + 1, second))
    for m in _IF.finditer(text):
        close = _close(text, m.end() - 1)
        if close > 0:
            spans.append((m.end(), close))
    for lo, hi in spans:
        for c in _LESS.finditer(text, lo, hi):
            if _template_bracket(text, c.start(), hi):
                continue
            rhs = c.end()
            while rhs < hi and text[rhs].isspace():
                rhs += 1
            end = _operand_end(text, rhs, hi)
            if end <= rhs:
                continue
            operand = text[rhs:end]
            if c.group(1):  # <= B: one step tighter is < B, one looser < B + 1
                out.append(_mutant("bound -1", text, c.start(), end, f"< {operand}"))
                out.append(_mutant("bound +1", text, c.start(), end, f"<= ({operand}) + 1"))
            else:
                out.append(_mutant("bound +1", text, c.start(), end, f"<= {operand}"))
                out.append(_mutant("bound -1", text, c.start(), end, f"< ({operand}) - 1"))
    return out


def _lanes(text: str) -> list[Mutant]:
    out = []
    for m in _LANE_CALL.finditer(text):
        close = _close(text, m.end() - 1)
        args = text[m.end() : close]
        depth, comma = 0, -1
        for i, c in enumerate(args):
            depth += c == "("
            depth -= c == ")"
            if c == "," and depth == 0:
                comma = i
                break
        if close < 0 or comma < 0:
            continue
        start = m.end() + comma + 1
        lane = text[start:close].strip()
        if lane.startswith("(ushort)"):  # keep the cast outside, so the moved lane is still a ushort
            out.append(_mutant("wrong lane", text, start, close, f" (ushort)(({lane[8:]}) ^ 1)"))
        else:
            out.append(_mutant("wrong lane", text, start, close, f" ({lane}) ^ 1"))
    return out


def _indices(text: str) -> list[Mutant]:
    out = []
    names = {m.group(1) for m in _GROUP_ARRAY.finditer(text)}
    for name in sorted(names):
        for m in re.finditer(rf"\b{re.escape(name)}\s*\[", text):
            close = text.find("]", m.end())
            after = text[close + 1 : close + 4].lstrip() if close > 0 else ""
            declared = _DECLARED.search(text[max(0, m.start() - 60) : m.start()]) is not None
            if (
                close < 0
                or (after.startswith("=") and not after.startswith("=="))
                or after[:2] in ("+=", "-=")
                or declared
            ):
                continue  # a write, or the declaration: only reads are moved
            out.append(_mutant("wrong index", text, m.end(), close, f"({text[m.end() : close]}) + 1"))
    return out


def source_mutants(source: str, *, kinds: Sequence[str] = KINDS) -> list[Mutant]:
    """Every mutant of ``source`` of the ``kinds`` asked for (:data:`KINDS`), in source order
    within a kind. ``ValueError`` for an empty source or an unknown kind."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"source: must be kernel source text, got {validate.describe(source)}")
    for k in validate.sequence("kinds", kinds, what=f"names of {KINDS}"):
        validate.one_of("kinds", k, KINDS)
    found: list[Mutant] = []
    if "dropped barrier" in kinds:
        found += [_mutant("dropped barrier", source, m.start(), m.end(), "") for m in _BARRIER.finditer(source)]
    if "bound +1" in kinds or "bound -1" in kinds:
        found += [m for m in _bounds(source) if m.kind in kinds]
    if "wrong lane" in kinds:
        found += _lanes(source)
    if "wrong index" in kinds:
        found += _indices(source)
    return found


# ---------------------------------------------------------------------------------------
# Running them
# ---------------------------------------------------------------------------------------


def _digest(*values: Any) -> bytes | None:
    """The bits of a call's returned arrays (shape, dtype and bytes, as float32), hashed: two
    variants' outputs are compared by these, so a study keeps 16 bytes a call, not its arrays.
    None where a value is not an array."""
    h = hashlib.blake2b(digest_size=16)
    for v in values:
        try:
            a = np.ascontiguousarray(np.asarray(v, dtype=np.float32))
        except Exception:
            return None
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    return h.digest()


class _Recording:
    """A tail subject whose every output's bits are kept (case name and row -> digest, or None
    when the call gave no array), so a mutant's bits can be set beside the original's."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.kind = inner, inner.name, inner.kind
        self.outputs: dict[tuple[str, int], bytes | None] = {}

    def calls(self, sc: Any, w: Any) -> list:
        out = []
        for j, (call, want) in enumerate(self.inner.calls(sc, w)):
            key = (sc.case, j)
            self.outputs[key] = None

            def run(call: Callable = call, key: tuple = key) -> Any:
                v = call()
                self.outputs[key] = _digest(v)
                return v

            out.append((run, want))
        return out


class _RecordingStep:
    """A Gated DeltaNet step form whose every token's three returned tensors' bits are kept
    (case label and token -> digest), as :class:`_Recording` keeps a tail's."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.kind = inner, inner.name, inner.kind
        self.outputs: dict[tuple[str, int], bytes | None] = {}

    def layer(self, shape: Any, consts: Any, eps: float) -> Callable[[Any], Any]:
        call = self.inner.layer(shape, consts, eps)

        def run(step: Any) -> Any:
            key = (step.case, step.token)
            self.outputs[key] = None
            v = call(step)
            self.outputs[key] = _digest(*v) if isinstance(v, (tuple, list)) else None
            return v

        return run


def _same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and None not in a.values() and a == b


@dataclass
class MutantStudy:
    """What :func:`mutant_study` found: ``table`` (one row a mutant: kind, line, the change,
    ``status`` -- caught / missed / equivalent / does not compile -- and the first reason
    the check gave), ``original_same_bits`` (the original's bits in every schedule tried),
    ``original_passed``, and the ``orders`` run."""

    subject: str
    table: Any
    original_passed: bool
    original_same_bits: bool
    orders: tuple[str, ...]

    def counts(self) -> dict[str, int]:
        return {
            s: int((self.table["status"] == s).sum()) for s in ("caught", "missed", "equivalent", "does not compile")
        }

    def to_record(self) -> dict[str, Any]:
        """The study as a JSON record's ``mutants`` entry: counts, schedules and every row."""
        import json

        return {
            "counts": self.counts(),
            "original_passed": self.original_passed,
            "original_same_bits": self.original_same_bits,
            "orders": list(self.orders),
            "table": json.loads(self.table.to_json(orient="records")),
        }

    @property
    def missed(self) -> Any:
        return self.table[self.table["status"] == "missed"]

    def __str__(self) -> str:
        c = self.counts()
        head = (
            f"{self.subject}: {len(self.table)} mutants; caught {c['caught']}, missed {c['missed']}, "
            f"equivalent {c['equivalent']}, not compiling {c['does not compile']}; original "
            f"{'passes' if self.original_passed else 'FAILS'} the check, "
            f"{'the same bits' if self.original_same_bits else 'DIFFERENT bits'} in {len(self.orders)} schedules"
        )
        cols = ["kind", "line", "after", "status"]
        return head + "\n" + self.table[cols].to_string(index=False, max_colwidth=60)


def _run_all(
    make_subject: Callable[[str], Any], orders: Sequence[str], check: Callable[[Any], Any], recorder: type
) -> tuple[bool, dict, list[str], list[str]]:
    """One variant in every order: (passed in all, {order: outputs}, runs with no result, verdict reasons)."""
    passed, outs, errors, reasons = True, {}, [], []
    for o in orders:
        rec = recorder(make_subject(o))
        rep = check(rec)
        passed = passed and rep.passed
        outs[o] = rec.outputs
        errors += rep.problems
        reasons += [f"{o}: {r}" for r in rep.reasons]
    return passed, outs, errors, reasons


def _study(
    name: str,
    mutants: Sequence[tuple[str, Mutant]],
    make: Callable[[tuple[str, Mutant] | None, str], Any],
    orders: Sequence[str],
    check: Callable[[Any], Any],
    recorder: type = _Recording,
) -> MutantStudy:
    """The original (``make(None, order)``) and each ``(file, mutant)`` in every order, each
    judged by ``check`` (a recorded subject -> its report)."""
    import pandas as pd

    from workbench.kernels.metal_emulation import SCHEDULES

    orders = tuple(
        validate.one_of("orders", o, SCHEDULES) for o in validate.sequence("orders", orders, what="schedules")
    )
    ok, base, _, _ = _run_all(lambda o: make(None, o), orders, check, recorder)
    same = all(_same_bits(base[orders[0]], base[o]) for o in orders[1:])
    rows = []
    for where, m in mutants:
        passed, outs, errors, reasons = _run_all(lambda o, v=(where, m): make(v, o), orders, check, recorder)
        changed = bool(errors) or not all(_same_bits(base[o], outs[o]) for o in orders)
        if errors and all("MetalCompileError" in e for e in errors):
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
                "reason": (reasons or [""])[0],
            }
        )
    table = pd.DataFrame(rows, columns=["file", "kind", "line", "before", "after", "status", "reason"])
    return MutantStudy(name, table, ok, same, orders)


def _checker(
    part: str, seeds: Iterable[int], scales: Sequence[float] | None, tolerance: Any, time_limit: float, **more: Any
) -> tuple[Callable[[Any], Any], type]:
    """The check a study judges each variant by, and the recorder its subjects go through:
    the tail's :func:`~workbench.check.run.check_kernel` (``more``: ``folds``) or the step's
    :func:`~workbench.check.gdn_run.check_step` on short runs (``more``: ``tokens``), each token
    under ``time_limit``; no fault models (a study compares the subject's own bits)."""
    seeds = list(seeds)
    if part == "tail":
        args = {"seeds": seeds, "scales": DEFAULT_SCALES if scales is None else scales, "faults": ()}
        args |= {"folds": more["folds"], "tolerance": tolerance, "time_limit": time_limit}
        return (lambda subject: check_kernel(subject, **args)), _Recording
    from workbench.check.gdn_cases import DEFAULT_GEOMETRIES
    from workbench.check.gdn_run import STEP_SCALES, check_step

    # one geometry whose Hv/Hk > 1 (a wrong key head shows), every gate regime, a running state
    step = {"geometries": DEFAULT_GEOMETRIES[:1], "seeds": seeds, "tokens": more["tokens"], "state_scales": (1.0,)}
    step |= {"scales": STEP_SCALES if scales is None else scales, "tolerance": tolerance, "faults": ()}
    # on a thread of this process, so the recorder sees every call (a worker process would keep them)
    step |= {"time_limit": time_limit, "process": False}
    return (lambda subject: check_step(subject, **step)), _RecordingStep


def mutant_study(
    launch: Any,
    *,
    seeds: Iterable[int] = range(8),
    scales: Sequence[float] | None = None,
    tolerance: Any = None,
    orders: Sequence[str] = STUDY_ORDERS,
    kinds: Sequence[str] = KINDS,
    time_limit: float = 120.0,
    tokens: int = 16,
) -> MutantStudy:
    """Every mutant of ``launch``'s Metal source (:func:`source_mutants`) run on the CPU
    emulator, in each of ``orders``, beside the original on the same cases: a tail's
    ``SourceLaunch`` through :func:`~workbench.check.run.check_kernel` (dense, unfolded cases,
    as the source form takes them; ``scales`` default ``DEFAULT_SCALES``), a Gated DeltaNet
    step's ``StepSource`` through :func:`~workbench.check.gdn_run.check_step` on runs of
    ``tokens`` tokens, states fed back (``scales`` default ``STEP_SCALES``).
    ``time_limit``: seconds a case (a token) may take; the first of each variant also pays its
    compilation by clang, which on a busy machine can take tens of seconds."""
    from workbench.check.gdn_subjects import StepSource

    if isinstance(launch, StepSource):
        if launch.run_on != "emulator" or launch.language != "metal":
            raise ValueError(
                f"launch: a step's mutants run on the emulator (Metal), got {launch.language} on {launch.run_on}"
            )
        part = "gdn"
    elif isinstance(launch, SourceLaunch):
        part = "tail"
    else:
        raise ValueError(
            f"launch: must be a SourceLaunch (the tail) or a StepSource (the step), got {validate.describe(launch)}"
        )
    found = source_mutants(launch.source, kinds=kinds)

    def make(variant: tuple[str, Mutant] | None, order: str) -> Any:
        run = launch if variant is None else launch.with_source(variant[1].source, name=f"{launch.name}_mutant")
        return SourceSubject(run, order=order) if part == "tail" else replace(run, order=order)

    more = {"folds": (None,)} if part == "tail" else {"tokens": validate.integer("tokens", tokens, minimum=1)}
    check, recorder = _checker(part, seeds, scales, tolerance, time_limit, **more)
    return _study(launch.name, [("source", m) for m in found], make, orders, check, recorder)


def folder_mutant_study(
    folder: str | Path,
    *,
    part: str = "tail",
    files: Sequence[str] | None = None,
    seeds: Iterable[int] = range(8),
    scales: Sequence[float] | None = None,
    folds: Sequence[Any] = (16,),
    tolerance: Any = None,
    orders: Sequence[str] = STUDY_ORDERS,
    kinds: Sequence[str] = KINDS,
    time_limit: float = 120.0,
    tokens: int = 16,
) -> MutantStudy:
    """Mutants of a kernels folder's files (``files``: names in the folder; default every
    ``*.body`` and ``*.h`` for the tail, ``gdn_step.body`` for the step), each run as a copy of
    the folder with that one file changed, on the CPU emulator: ``part`` ``"tail"`` (the fused
    tail, ``folds``) or ``"gdn"`` (the step, runs of ``tokens`` tokens; see :func:`mutant_study`).
    The user's folder is only read."""
    from workbench.check.gdn_subjects import KernelsFolderStep

    validate.one_of("part", part, ("tail", "gdn"))
    src = Path(folder)
    if not src.is_dir():
        raise ValueError(f"folder: must be a folder shaped like kernels/, got {str(folder)!r} (not a folder)")
    if files is not None:
        names = list(files)
    elif part == "gdn":
        names = ["gdn_step.body"]
    else:
        names = sorted(p.name for p in src.iterdir() if p.suffix in (".body", ".h"))
    for n in names:
        if not (src / n).is_file():
            raise ValueError(
                f"files: {n!r} is not a file of {src.name}/ (it has {sorted(p.name for p in src.iterdir())})"
            )
    more = {"folds": folds} if part == "tail" else {"tokens": validate.integer("tokens", tokens, minimum=1)}
    check, recorder = _checker(part, seeds, scales, tolerance, time_limit, **more)
    form = KernelsFolderSubject if part == "tail" else KernelsFolderStep
    work = Path(tempfile.mkdtemp(prefix="workbench-mutants-"))
    try:
        original = work / "original"
        shutil.copytree(src, original)
        found = [(n, m) for n in names for m in source_mutants((src / n).read_text(), kinds=kinds)]
        made: dict[int, Path] = {}

        def make(variant: tuple[str, Mutant] | None, order: str) -> Any:
            if variant is None:
                return form(original, order=order, name=src.name)
            key = id(variant[1])
            if key not in made:
                d = work / f"mutant{len(made)}"
                shutil.copytree(original, d)
                (d / variant[0]).write_text(variant[1].source)
                made[key] = d
            return form(made[key], order=order, name=src.name)

        return _study(src.name, found, make, orders, check, recorder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
