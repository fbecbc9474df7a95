"""SASS, NVIDIA's machine code, read back: instructions by class, the control-flow graph,
its loops, and the tail's one launch cut into its phases.

``bench.sass_counts`` and the row-dot experiments compile a kernel with nvcc and read its
listing (``cuobjdump -sass``) through here. The counts are static: what one pass through a
loop issues, not what a launch executes (``bench.launch_profile`` measures that on a GPU),
so they say in seconds, without a GPU, whether an edit of the kernel text cut
instructions, and which.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

#: Instruction classes, by opcode (the mnemonic before its first dot). ``fma`` is what
#: issues to the FMA pipes (float multiply-adds and adds, half-precision pairs, integer
#: multiply-adds); ``int`` the integer and logic pipe's (logic, shifts, byte permutes,
#: adds, compares, selects, moves), which issues at half the FMA pipes' rate; ``memory``
#: loads and stores; everything else (branches, shuffles, barriers, special functions)
#: is ``other``.
CLASSES: dict[str, frozenset[str]] = {
    "fma": frozenset({"FFMA", "FADD", "FMUL", "HADD2", "HFMA2", "HMUL2", "IMAD", "IMUL"}),
    "int": frozenset(
        {
            "LOP3",
            "SHF",
            "PRMT",
            "IADD3",
            "LEA",
            "ISETP",
            "FSETP",
            "SEL",
            "FSEL",
            "MOV",
            "VIADD",
            "IABS",
            "IMNMX",
            "FMNMX",
            "BMSK",
            "SGXT",
            "POPC",
            "FLO",
            "I2FP",
            "F2FP",
        }
    ),
    "memory": frozenset({"LDG", "LDS", "STS", "STG", "LDC", "LD", "ST", "ATOM", "ATOMG", "ATOMS", "RED", "LDSM"}),
}


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: its address in bytes, opcode (``LOP3``) and full text."""

    address: int
    opcode: str
    text: str


_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*(?:/\*.*)?$")
_TARGET = re.compile(r"0x([0-9a-f]+)")


def parse_sass(text: str) -> list[Instruction]:
    """The instructions of ``cuobjdump -sass`` output, in address order (predicates such
    as ``@!P0`` are dropped from the opcode, kept in the text)."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        body = m.group(2).strip()
        op = re.sub(r"^@!?U?P\w+\s+", "", body).split()[0].split(".")[0] if body else ""
        out.append(Instruction(int(m.group(1), 16), op, body))
    return out


def longest_loop(instrs: list[Instruction]) -> list[Instruction]:
    """The instructions from the target of the backward branch that spans the most
    bytes to that branch, inclusive; empty when no branch jumps backwards."""
    best: tuple[int, int, int] | None = None
    for ins in instrs:
        targets = _TARGET.findall(ins.text) if ins.opcode == "BRA" else []
        if targets:
            target = int(targets[-1], 16)  # the branch's target is its last operand
            if target < ins.address and (best is None or ins.address - target > best[0]):
                best = (ins.address - target, target, ins.address)
    if best is None:
        return []
    _, lo, hi = best
    return [i for i in instrs if lo <= i.address <= hi]


#: The opcodes that end a basic block: they may send the warp somewhere other than the
#: next instruction (or nowhere).
_JUMPS = frozenset({"BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "KILL"})

#: Jumps whose target is in a register, not an operand: their successors cannot be read.
_INDIRECT = frozenset({"BRX", "JMX"})

_PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def _mnemonic(ins: Instruction) -> str:
    """The full mnemonic of ``ins`` (``BRA.DIV``, ``EXIT``), its predicate dropped."""
    rest = _PREDICATE.sub("", ins.text)
    return rest.split()[0] if rest else ""


def _predicated(ins: Instruction) -> bool:
    """Whether ``ins`` runs under a predicate that may be false (``@P0``, ``@!UP1``; not ``@PT``)."""
    return ins.text.startswith("@") and not ins.text.startswith("@PT ")


@dataclass(frozen=True)
class ControlFlow:
    """A listing's basic blocks and the edges between them (:func:`control_flow`).

    ``blocks[i]``: block i's instructions, address order (block 0 is the entry);
    ``succ[i]``: the blocks control may pass to from block i; ``idom[i]``: its immediate
    dominator (the entry's is itself, -1 where the entry never reaches it: the padding
    after the last EXIT); ``cold``: the blocks only a warp that diverged reaches (see
    :func:`control_flow`)."""

    blocks: tuple[tuple[Instruction, ...], ...]
    succ: tuple[tuple[int, ...], ...]
    idom: tuple[int, ...]
    cold: frozenset[int]

    def dominates(self, d: int, b: int) -> bool:
        """Whether every path from the entry to block ``b`` passes block ``d``."""
        if self.idom[b] < 0:
            return False
        while b != d:
            if self.idom[b] == b:
                return False
            b = self.idom[b]
        return True


def _postorder(succ: list[list[int]], entry: int) -> list[int]:
    """The blocks the entry reaches, in depth-first postorder (iterative: thousands of
    blocks would overflow Python's recursion)."""
    seen, order = {entry}, []
    stack = [(entry, iter(succ[entry]))]
    while stack:
        b, it = stack[-1]
        for s in it:
            if s not in seen:
                seen.add(s)
                stack.append((s, iter(succ[s])))
                break
        else:
            stack.pop()
            order.append(b)
    return order


def _immediate_dominators(succ: list[list[int]]) -> list[int]:
    """Each block's immediate dominator, from block 0 (Cooper, Harvey and Kennedy's
    iteration over reverse postorder); -1 for blocks block 0 does not reach."""
    rpo = _postorder(succ, 0)[::-1]
    number = {b: i for i, b in enumerate(rpo)}
    preds: list[list[int]] = [[] for _ in succ]
    for u in rpo:
        for v in succ[u]:
            preds[v].append(u)
    idom = [-1] * len(succ)
    idom[0] = 0

    def meet(a: int, b: int) -> int:
        while a != b:
            while number[a] > number[b]:
                a = idom[a]
            while number[b] > number[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            done = [p for p in preds[b] if idom[p] >= 0]
            new = done[0]
            for p in done[1:]:
                new = meet(p, new)
            if idom[b] != new:
                idom[b], changed = new, True
    return idom


def control_flow(instrs: list[Instruction]) -> ControlFlow:
    """The basic blocks of one function's listing and the edges between them.

    A block ends at a jump (:data:`_JUMPS`) or before a jump's target. A branch (``BRA``)
    goes to its target, and also falls through when it is predicated or carries any
    operand besides the target (``BRA.DIV UR4, 0x..`` jumps only for a diverged warp,
    ``BRA.U !UP0, 0x..`` only on its uniform predicate); ``CALL`` goes to its target and
    falls through (the callee's ``RET`` ends there); ``EXIT``/``RET``/``KILL`` end the
    path unless predicated.

    ``cold``: nvcc lays out the warp-synchronous code (shuffles) twice: inline for a
    converged warp, and out of line after the last ``EXIT`` (``WARPSYNC.COLLECTIVE`` ...
    ``ENDCOLLECTIVE`` a shuffle) for a diverged one, entered by ``BRA.DIV`` and jumping
    back into the inline code where they rejoin. Those blocks (every block the
    ``BRA.DIV``'s target dominates) are cold: the kernels' warps reach their shuffles
    converged. Raises ``ValueError`` for an indirect jump (its targets cannot be read) or
    for addresses that do not rise (two functions in one listing)."""
    if any(b.address <= a.address for a, b in pairwise(instrs)):
        raise ValueError("instrs must be one function's listing, addresses rising")
    at = {ins.address: i for i, ins in enumerate(instrs)}

    def target(ins: Instruction) -> int | None:
        found = _TARGET.findall(ins.text) if ins.opcode in ("BRA", "JMP", "CALL") else []
        return at.get(int(found[-1], 16)) if found else None  # the target is the last operand

    leaders = {0} if instrs else set()
    for i, ins in enumerate(instrs):
        if ins.opcode in _INDIRECT:
            raise ValueError(f"an indirect jump at {ins.address:#x} ({ins.text!r}): its targets cannot be read")
        if ins.opcode in _JUMPS:
            leaders.add(i + 1)
            t = target(ins)
            if t is not None:
                leaders.add(t)
    starts = sorted(s for s in leaders if s < len(instrs))
    block_of = {s: b for b, s in enumerate(starts)}
    bounds = list(zip(starts, [*starts[1:], len(instrs)]))
    succ: list[list[int]] = []
    div_targets = []
    for b, (_lo, hi) in enumerate(bounds):
        last = instrs[hi - 1]
        nxt = [b + 1] if hi < len(instrs) else []
        if last.opcode in ("BRA", "JMP", "CALL"):
            t = target(last)
            operands = _PREDICATE.sub("", last.text).split(None, 1)[1:]
            only_target = bool(operands) and re.fullmatch(r"0x[0-9a-f]+", operands[0].strip()) is not None
            falls = last.opcode == "CALL" or _predicated(last) or not only_target
            succ.append(sorted({*([block_of[t]] if t is not None else []), *(nxt if falls else [])}))
            if _mnemonic(last) == "BRA.DIV" and t is not None and block_of[t] not in nxt:
                div_targets.append(block_of[t])
        elif last.opcode in _JUMPS:  # EXIT, RET, KILL
            succ.append(nxt if _predicated(last) else [])
        else:
            succ.append(nxt)
    idom = _immediate_dominators(succ) if succ else []
    flow = ControlFlow(
        tuple(tuple(instrs[lo:hi]) for lo, hi in bounds), tuple(tuple(s) for s in succ), tuple(idom), frozenset()
    )
    cold = frozenset(b for b in range(len(bounds)) if any(flow.dominates(t, b) for t in div_targets))
    return ControlFlow(flow.blocks, flow.succ, flow.idom, cold)


@dataclass(frozen=True)
class Loop:
    """A natural loop of a :class:`ControlFlow`: its header block and every block of it
    (the blocks that reach a back edge into the header without passing the header)."""

    header: int
    blocks: frozenset[int]


def natural_loops(flow: ControlFlow) -> list[Loop]:
    """Every natural loop, one a header (back edges into one header merged), header
    address order. A back edge is an edge into a block that dominates its source: a
    branch backwards that is not a loop's (an out-of-line block jumping back into the
    code it left) is not one, nor is the branch of a loop entered other than through its
    header (irreducible; nvcc's loops have one entry)."""
    preds: list[list[int]] = [[] for _ in flow.blocks]
    for u, ss in enumerate(flow.succ):
        for v in ss:
            preds[v].append(u)
    bodies: dict[int, set[int]] = {}
    for u, ss in enumerate(flow.succ):
        for v in ss:
            if flow.idom[u] >= 0 and flow.dominates(v, u):
                body = bodies.setdefault(v, {v})
                stack = [u]
                while stack:
                    x = stack.pop()
                    if x not in body:
                        body.add(x)
                        stack.extend(preds[x])
    return [Loop(h, frozenset(bodies[h])) for h in sorted(bodies)]


def _inside(loops: list[Loop], outer: Loop | None) -> list[Loop]:
    """The loops directly inside ``outer`` (None: those in no other loop), header order.
    Natural loops with different headers are nested or apart, so a loop's depth is how
    many loops hold its header."""

    def depth(lp: Loop) -> int:
        return sum(lp.header in o.blocks for o in loops if o.header != lp.header)

    if outer is None:
        return [lp for lp in loops if depth(lp) == 0]
    return [
        lp for lp in loops if lp.header != outer.header and lp.header in outer.blocks and depth(lp) == depth(outer) + 1
    ]


def outer_loops(flow: ControlFlow) -> list[Loop]:
    """The natural loops in no other loop (header address order): a launch's row loop, the
    loops of its prologue, a grid barrier's wait."""
    return _inside(natural_loops(flow), None)


def loop_counts(flow: ControlFlow, loop: Loop, loops: list[Loop] | None = None) -> dict[str, Any]:
    """One loop's counts: its header's address, its instructions off the cold path (what a
    converged warp's pass through it may issue: the loops inside it counted once) by class
    and by opcode, and those on the cold path (:attr:`ControlFlow.cold`). Given every loop
    (``loops``), also ``inner``: the same for each loop directly inside it (a row loop's
    unit loops, which run several times a row)."""
    hot = [i for b in sorted(loop.blocks - flow.cold) for i in flow.blocks[b]]
    cold = sum(len(flow.blocks[b]) for b in loop.blocks & flow.cold)
    out = {
        "header": flow.blocks[loop.header][0].address,
        "instructions": len(hot),
        "cold_instructions": cold,
        "classes": classify(hot),
        "opcodes": dict(Counter(i.opcode for i in hot).most_common()),
    }
    if loops is not None:
        out["inner"] = [loop_counts(flow, lp, loops) for lp in _inside(loops, loop)]
    return out


#: What marks a grid barrier's wait in the one launch's machine code: it reads the global
#: timer every pass (``grid_barrier`` in ``kernels/prelude_cuda.h`` gives up after a limit).
BARRIER_MARK = "SR_GLOBALTIMER"


def one_launch_phases(flow: ControlFlow, phases: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The one launch's machine code by phase: ``phases`` (its launches, in order) and
    ``barriers``.

    The grid barriers' waits are the outer loops that read the global timer
    (:data:`BARRIER_MARK`); a block the entry reaches belongs to the phase numbered by how
    many of those waits reach it (none: the first phase; after the first barrier: the
    second; ...), a block of a wait to ``barriers``. Reachability, not address, decides,
    because a phase's cold blocks lie after the kernel's last ``EXIT``. Each phase: its
    ``instructions`` (all, cold ones too), its outer loops (:func:`outer_loops`, a loop
    going where its header goes; :func:`loop_counts` each), and their off-cold-path
    instructions summed (``loop_instructions``, ``loop_classes``), cold ones
    (``loop_cold``), and the loops directly inside those summed the same way
    (``inner_instructions``, ``inner_classes``: the unit loops, which run several times a
    row, so a change there weighs more). :func:`run` adds ``alone``: the phase compiled as
    a launch of its own. Raises ``ValueError`` unless there is one wait between each two
    phases."""
    every = natural_loops(flow)
    loops = _inside(every, None)
    waits = [lp for lp in loops if any(BARRIER_MARK in i.text for b in lp.blocks for i in flow.blocks[b])]
    if len(waits) != len(phases) - 1:
        raise ValueError(
            f"the one launch should wait at {len(phases) - 1} grid barriers (outer loops reading "
            f"{BARRIER_MARK}); found {len(waits)}"
        )
    reach = []
    for w in waits:
        seen, stack = {w.header}, [w.header]
        while stack:
            for s in flow.succ[stack.pop()]:
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        reach.append(seen)
    in_wait = set().union(*(w.blocks for w in waits))
    names = (*phases, "barriers")
    owner = {
        b: "barriers" if b in in_wait else phases[sum(b in r for r in reach)]
        for b in range(len(flow.blocks))
        if flow.idom[b] >= 0
    }
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        own = [lp for lp in loops if owner.get(lp.header) == name]
        counted = [loop_counts(flow, lp, every) for lp in own]
        inner = [i for c in counted for i in c["inner"]]
        out[name] = {
            "instructions": sum(len(flow.blocks[b]) for b, o in owner.items() if o == name),
            "loop_instructions": sum(c["instructions"] for c in counted),
            "loop_cold": sum(c["cold_instructions"] for c in counted),
            "loop_classes": _summed(c["classes"] for c in counted),
            "inner_instructions": sum(i["instructions"] for i in inner),
            "inner_classes": _summed(i["classes"] for i in inner),
            "loops": counted,
        }
    return out


def _summed(class_counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Class counts (:func:`classify`'s) added up, every class present."""
    total: Counter[str] = Counter()
    for c in class_counts:
        total.update(c)
    return {c: total.get(c, 0) for c in (*CLASSES, "other")}


def classify(instrs: list[Instruction]) -> dict[str, int]:
    """How many of ``instrs`` fall in each of :data:`CLASSES` and ``other``."""
    counts = Counter()
    for ins in instrs:
        counts[next((c for c, ops in CLASSES.items() if ins.opcode in ops), "other")] += 1
    return {c: counts.get(c, 0) for c in (*CLASSES, "other")}


def find_tool(name: str) -> str | None:
    """``name`` (cuobjdump, nvdisasm) on PATH, else where NVIDIA's wheel of it
    (``nvidia-cuda-cuobjdump``, ``nvidia-cuda-nvdisasm``) installs it."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for candidate in sorted(Path(root).glob(f"cu*/bin/{name}")):
            if candidate.is_file():
                return str(candidate)
    return None


def tool_version(tool: str) -> str:
    """The last line ``tool --version`` prints (the release and build)."""
    done = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else f"(no version: exit {done.returncode})"


def sass_counts(instrs: list[Instruction], phases: tuple[str, ...] | None = None) -> dict[str, Any]:
    """What the record says of one listing. Every launch: ``instructions`` (all) and
    ``outer_loops`` (:func:`outer_loops`, :func:`loop_counts` each, their inner loops
    with them). A launch of its own (``phases`` None) also: the row loop as
    :func:`longest_loop` reads it (``loop_instructions``, ``loop_classes``,
    ``loop_opcodes``: the rows of records before the one launch was counted, kept so the
    two compare). The one launch (``phases``: its launches in order) instead: ``phases``
    (:func:`one_launch_phases`), because its longest backward span is no phase's loop
    (an out-of-line block jumping back from after the last ``EXIT`` spans most of it).
    For wo_residual the longest span runs from its rotation loop to the cold copies after
    its last ``EXIT``: its row loop is the one in ``outer_loops``."""
    flow = control_flow(instrs)
    every = natural_loops(flow)
    out: dict[str, Any] = {
        "instructions": len(instrs),
        "outer_loops": [loop_counts(flow, lp, every) for lp in _inside(every, None)],
    }
    if phases is None:
        loop = longest_loop(instrs)
        out.update(
            loop_instructions=len(loop),
            loop_classes=classify(loop),
            loop_opcodes=dict(Counter(i.opcode for i in loop).most_common()),
        )
    else:
        out["phases"] = one_launch_phases(flow, phases)
    return out


def compile_sass(
    source: str,
    workdir: Path,
    stem: str,
    *,
    nvcc: str,
    cuobjdump: str,
    nvdisasm: str | None = None,
    arch: str = "sm_90",
) -> tuple[str, str]:
    """Compile one translation unit (``workdir/stem.cu``) to a cubin; ptxas's report (``-v``:
    registers, spills) and the cubin's SASS listing. RuntimeError naming ``stem`` if a tool fails."""
    src = workdir / f"{stem}.cu"
    src.write_text(source)
    cubin = src.with_suffix(".cubin")
    done = subprocess.run(
        [nvcc, f"-arch={arch}", "-cubin", "-o", str(cubin), "-Xptxas", "-v", str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed on {stem}: {done.stderr[-2000:]}")
    env = {**os.environ, **({"NVDISASM_PATH": str(Path(nvdisasm).parent)} if nvdisasm else {})}
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=False, env=env)
    if sass.returncode != 0:
        raise RuntimeError(f"cuobjdump failed on {stem}: {sass.stderr[-2000:]}")
    return done.stderr, sass.stdout


def outer_loop_counts(sass: str) -> list[dict[str, Any]]:
    """Each outer loop of a SASS listing, counted (:func:`loop_counts`, its inner loops too)."""
    flow = control_flow(parse_sass(sass))
    every = natural_loops(flow)
    return [loop_counts(flow, lp, every) for lp in outer_loops(flow)]
