"""What nvcc makes of the tail's kernels: registers, spills and instructions, no GPU needed.

    python -m bench.sass_counts                  # the kernels as they are
    python -m bench.sass_counts --old DIR        # an older kernels/ folder beside them
    python -m bench.sass_counts --launches one_launch --formats affine8   # a part of it

Compiles each launch of the tail (wo_residual, ffn_gate_up, ffn_down) and the tail as one
launch (one_launch) in each weight format, at Bonsai-27B's shape with the template values
the launches take by default, as the CUDA file MLX would compile (``nvcc -arch=sm_90
-cubin``), and reads the machine code (``cuobjdump -sass``). It prints, in at most 100
columns: for each of the three launches, its registers, bytes spilled, instructions, and
its row loop's instructions by class (:data:`CLASSES`: fma, int, memory, other); for the
one launch, a line a phase (its outer loops' instructions by class, the loops inside them,
the registers of the phase compiled alone) and its registers and spills in all. With
``--old``, each row also gives the old folder's count and new / old. These are static
counts, what one pass through a loop issues, not what a launch executes
(``bench.launch_profile`` measures that on a GPU): they say in seconds whether an edit of
the kernel text cut instructions, and which.

Needs nvcc (CUDA 12 or 13), cuobjdump and nvdisasm: on PATH, or NVIDIA's
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels (the ``test`` extra installs
them on x86-64 Linux). Writes the record through ``bench.common.record`` to
``data/bench/sass_counts-<host>-<date>.json``, with the compilers' versions
(``workbench.reports.kernel_bodies.sass_table`` reads it). Exit status: 0; 2 without those
tools, with a DIR that is not a kernels folder, or (a usage error) for a ``--formats`` or
``--launches`` item it does not know.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench.common import kernels, record
from workbench.fold import formats as weight_formats
from workbench.fold.formats import Format
from workbench.fold.hadamard import factor_block
from workbench.kernels import one_launch
from workbench.kernels import source as kernel_source
from workbench.kernels.matrices import DENSE_GS, interleaved, units_for
from workbench.kernels.tuning import KernelTuning
from workbench.reports import kernel_bodies as kernel_versions


def _bonsai() -> dict[str, int]:
    """Bonsai-27B's tail as ``bench.common.kernels.BONSAI`` gives it (hidden, branch: wo's
    input, ffn; wo's fold block), the block factored as the rotation applies it
    (``hadamard.factor_block``: block = m 2^logp)."""
    (hidden, branch, ffn), block = kernels.BONSAI
    m, logp = factor_block(block)
    return {"hidden": hidden, "branch": branch, "ffn": ffn, "m": m, "logp": logp}


#: The shape counted.
BONSAI = _bonsai()

#: The tail as ONE launch (``kernels/tail_one_launch.body``, ``workbench.kernels.one_launch``), as
#: the record and ``--launches`` name it.
ONE_LAUNCH = kernel_versions.SASS_ONE_LAUNCH

#: The launches counted: the tail's three, then the tail as one launch.
LAUNCHES: tuple[str, ...] = (*kernel_source.TAIL_KERNELS, ONE_LAUNCH)

#: The weight formats counted, by the label records and ``--formats`` give them (dense
#: bfloat16 is "bf16"), each at its default group size.
FORMATS: dict[str, Format] = {
    "bf16": weight_formats.BFLOAT16,
    **{f.name: f for f in (weight_formats.AFFINE4, weight_formats.AFFINE8, weight_formats.MXFP4, weight_formats.NVFP4)},
}


def format_codes(fmt_label: str) -> tuple[int, int]:
    """The template values ``FMT`` and ``SFMT`` of ``fmt_label``'s matrices as the launches
    see MLX's arrays made from bfloat16 weights (affine scales and biases then bfloat16)."""
    fmt = FORMATS[fmt_label]
    assert fmt.code is not None  # every counted format is one the kernels read
    return fmt.code, fmt.scale_code("bfloat16")

#: Instruction classes, by opcode (the mnemonic before its first dot). ``fma`` is what
#: issues to the FMA pipes (float multiply-adds and adds, half-precision pairs, integer
#: multiply-adds); ``int`` the integer and logic pipe's (logic, shifts, byte permutes,
#: adds, compares, selects, moves), which issues at half the FMA pipes' rate; ``memory``
#: loads and stores; everything else (branches, shuffles, barriers, special functions)
#: is ``other``.
CLASSES: dict[str, frozenset[str]] = {
    "fma": frozenset({"FFMA", "FADD", "FMUL", "HADD2", "HFMA2", "HMUL2", "IMAD", "IMUL"}),
    "int": frozenset({"LOP3", "SHF", "PRMT", "IADD3", "LEA", "ISETP", "FSETP", "SEL", "FSEL", "MOV", "VIADD",
                      "IABS", "IMNMX", "FMNMX", "BMSK", "SGXT", "POPC", "FLO", "I2FP", "F2FP"}),
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
    for b, (lo, hi) in enumerate(bounds):
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
    flow = ControlFlow(tuple(tuple(instrs[lo:hi]) for lo, hi in bounds), tuple(tuple(s) for s in succ),
                       tuple(idom), frozenset())
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
    return [lp for lp in loops if lp.header != outer.header and lp.header in outer.blocks
            and depth(lp) == depth(outer) + 1]


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
    out = {"header": flow.blocks[loop.header][0].address, "instructions": len(hot), "cold_instructions": cold,
           "classes": classify(hot), "opcodes": dict(Counter(i.opcode for i in hot).most_common())}
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
        raise ValueError(f"the one launch should wait at {len(phases) - 1} grid barriers (outer loops reading "
                         f"{BARRIER_MARK}); found {len(waits)}")
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
    owner = {b: "barriers" if b in in_wait else phases[sum(b in r for r in reach)]
             for b in range(len(flow.blocks)) if flow.idom[b] >= 0}
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        own = [lp for lp in loops if owner.get(lp.header) == name]
        counted = [loop_counts(flow, lp, every) for lp in own]
        inner = [i for c in counted for i in c["inner"]]
        out[name] = {"instructions": sum(len(flow.blocks[b]) for b, o in owner.items() if o == name),
                     "loop_instructions": sum(c["instructions"] for c in counted),
                     "loop_cold": sum(c["cold_instructions"] for c in counted),
                     "loop_classes": _summed(c["classes"] for c in counted),
                     "inner_instructions": sum(i["instructions"] for i in inner),
                     "inner_classes": _summed(i["classes"] for i in inner),
                     "loops": counted}
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


def launch_templates(fmt_label: str, tuning: KernelTuning | None = None,
                     shape: dict[str, int] | None = None) -> dict[str, list[tuple[str, Any]]]:
    """The three launches' template values for ``fmt_label`` at ``shape`` (default:
    :data:`BONSAI`) with ``tuning`` (default ``KernelTuning()``), written out as
    ``PreparedTail.templates`` builds them from prepared weights (every matrix in one
    format; interleaved words where a row is a multiple of 128 words), because making
    Bonsai-27B's weights to prepare would take minutes of CPU. The tests check the two agree."""
    if fmt_label not in FORMATS:
        raise ValueError(f"fmt_label must be one of {tuple(FORMATS)}; got {fmt_label!r}")
    t = tuning or KernelTuning()
    sh = dict(BONSAI if shape is None else shape)
    fmt, (code, sfmt) = FORMATS[fmt_label], format_codes(fmt_label)
    gs = fmt.group_size or DENSE_GS
    u = units_for

    def base(cols: int) -> list[tuple[str, Any]]:
        return [("FMT", code), ("SFMT", sfmt), ("GS", gs), ("QI", interleaved(fmt, cols))]

    h, b, f = sh["hidden"], sh["branch"], sh["ffn"]
    return {
        "wo_residual": [("NT", t.wo_nt), *base(b), ("WIDTH", b), ("ROWS", h), ("ROT", True), ("M", sh["m"]),
                        ("LOGP", sh["logp"]), ("U", u(code, t.u_wo)), ("PRE", bool(t.pre_wo))],
        "ffn_gate_up": [("NT", t.rows_nt), *base(h), ("HID", h), ("FFN", f), ("U", u(code, t.u_gate_up)),
                        ("PRE", bool(t.pre_gate_up))],
        "ffn_down": [("NT", t.down_nt), *base(f), ("HID", h), ("FFN", f),
                     ("U", max(1, u(code, t.u_down) // t.down_rows)), ("DR", t.down_rows)],
    }


def one_launch_shape(fmt_label: str) -> one_launch.OneLaunchShape:
    """The one launch's shape for a tail whose matrices are all ``fmt_label``, as
    ``one_launch.shape_for`` chooses it (the shape ``fused_tail(backend="cuda")`` and
    ``bench.kernel_bodies`` run; ``one_launch.shape_for_formats``)."""
    if fmt_label not in FORMATS:
        raise ValueError(f"fmt_label must be one of {tuple(FORMATS)}; got {fmt_label!r}")
    return one_launch.shape_for_formats([FORMATS[fmt_label]])


def one_launch_templates(fmt_label: str, tuning: KernelTuning | None = None,
                         shape: dict[str, int] | None = None,
                         launch_shape: one_launch.OneLaunchShape | None = None) -> list[tuple[str, Any]]:
    """The one launch's template values for ``fmt_label`` at ``shape`` (default:
    :data:`BONSAI`) with ``tuning`` (default ``KernelTuning()``) in ``launch_shape``
    (default :func:`one_launch_shape`'s), written out as ``one_launch.OneLaunchTail``
    builds them (``one_launch.launch_template``) from :func:`launch_templates`: each
    phase's values under its prefix (NT the one launch's; wo's and gate_up's U from the
    shape's ``row_units`` where it sets them; down's DR rows a group sharing ``u_down``),
    the barrier counter after h and act on a 128-byte line, the default barrier limit.
    Checked against ``OneLaunchTail(...).template`` in the tests."""
    t = tuning or KernelTuning()
    ls = launch_shape or one_launch_shape(fmt_label)
    sh = dict(BONSAI if shape is None else shape)
    fmt = format_codes(fmt_label)[0]
    phases = {k: dict(v, NT=ls.nt) for k, v in launch_templates(fmt_label, t, sh).items()}
    if ls.row_units is not None:
        for k in ("wo_residual", "ffn_gate_up"):
            phases[k]["U"] = units_for(fmt, ls.row_units)
    phases["ffn_down"].update(DR=ls.down_rows, U=max(1, units_for(fmt, t.u_down) // ls.down_rows))
    h, f = sh["hidden"], sh["ffn"]
    template: list[tuple[str, Any]] = [("NT", ls.nt), ("HID", h), ("FFN", f), ("SYNC_AT", -(-(h + f) // 32) * 32),
                                       ("BARRIER_LIMIT_MS", one_launch.BARRIER_LIMIT_MS)]
    for kernel, prefix in kernel_source.ONE_LAUNCH_PHASES:
        template += [(prefix + k, v) for k, v in phases[kernel].items() if k != "NT"]
    return template


def find_tool(name: str) -> str | None:
    """``name`` (cuobjdump, nvdisasm) on PATH, else where NVIDIA's wheel of it
    (``nvidia-cuda-cuobjdump``, ``nvidia-cuda-nvdisasm``) installs it."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia  # noqa: PLC0415 -- a namespace package, present only with NVIDIA's wheels
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
    out: dict[str, Any] = {"instructions": len(instrs),
                           "outer_loops": [loop_counts(flow, lp, every) for lp in _inside(every, None)]}
    if phases is None:
        loop = longest_loop(instrs)
        out.update(loop_instructions=len(loop), loop_classes=classify(loop),
                   loop_opcodes=dict(Counter(i.opcode for i in loop).most_common()))
    else:
        out["phases"] = one_launch_phases(flow, phases)
    return out


def compile_sass(source: str, workdir: Path, stem: str, *, nvcc: str, cuobjdump: str, nvdisasm: str | None = None,
                 arch: str = "sm_90") -> tuple[str, str]:
    """Compile one translation unit (``workdir/stem.cu``) to a cubin; ptxas's report (``-v``:
    registers, spills) and the cubin's SASS listing. RuntimeError naming ``stem`` if a tool fails."""
    src = workdir / f"{stem}.cu"
    src.write_text(source)
    cubin = src.with_suffix(".cubin")
    done = subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-o", str(cubin), "-Xptxas", "-v", str(src)],
                          capture_output=True, text=True, check=False)
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


def count_launch(source: str, workdir: Path, stem: str, *, nvcc: str, cuobjdump: str, nvdisasm: str,
                 arch: str, phases: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Compile one translation unit; its registers, spills and instruction counts
    (:func:`sass_counts`; ``phases`` for the one launch)."""
    report, sass = compile_sass(source, workdir, stem, nvcc=nvcc, cuobjdump=cuobjdump, nvdisasm=nvdisasm, arch=arch)
    regs = re.search(r"Used (\d+) registers", report)
    spill = re.search(r"(\d+) bytes spill stores", report)
    return {"registers": int(regs.group(1)) if regs else None, "spill_bytes": int(spill.group(1)) if spill else None,
            **sass_counts(parse_sass(sass), phases)}


def run(formats: tuple[str, ...], *, old_dir: Path | None, nvcc: str, cuobjdump: str, nvdisasm: str, arch: str,
        jobs: int = 2, launches: tuple[str, ...] = LAUNCHES) -> list[dict[str, Any]]:
    """Every launch of ``launches`` (default: the three and the one launch) and format,
    each side with ``old_dir``: one row each. The one launch's old side only where
    ``old_dir`` has its body (a folder from before it has none)."""
    sides = {"new": None} if old_dir is None else {"old": old_dir, "new": None}
    work = []
    for label in formats:
        fmt, sfmt = format_codes(label)
        for kernel, template in launch_templates(label).items():
            if kernel not in launches:
                continue
            dtypes = kernel_source.input_dtypes(kernel_source.KERNELS[kernel].inputs, fmt, sfmt)
            for side, folder in sides.items():
                text = kernel_source.cuda_translation_unit(kernel, dtypes, dict(template), kernel_dir=folder)
                work.append(({"launch": kernel, "format": label, "side": side, "template": dict(template)}, text))
        if ONE_LAUNCH in launches:
            template = dict(one_launch_templates(label))
            dtypes = kernel_source.input_dtypes(kernel_source.one_launch_inputs(), fmt, sfmt)
            for side, folder in sides.items():
                if folder is not None and not (folder / kernel_source.ONE_LAUNCH_BODY).is_file():
                    continue
                text = kernel_source.one_launch_translation_unit(dtypes, template, kernel_dir=folder)
                work.append(({"launch": ONE_LAUNCH, "format": label, "side": side, "template": template}, text))
                for kernel, values in phase_templates(template).items():  # each phase compiled alone
                    text = kernel_source.cuda_translation_unit(
                        kernel, kernel_source.input_dtypes(kernel_source.KERNELS[kernel].inputs, fmt, sfmt), values,
                        kernel_dir=folder)
                    work.append(({"launch": ONE_LAUNCH, "format": label, "side": side, "alone": kernel}, text))
    phases = tuple(k for k, _ in kernel_source.ONE_LAUNCH_PHASES)

    def count(w: tuple[dict[str, Any], str]) -> dict[str, Any]:
        key = w[0]
        stem = "-".join(str(key[k]) for k in ("side", "launch", "alone", "format") if k in key)
        one = key["launch"] == ONE_LAUNCH and "alone" not in key
        return count_launch(w[1], Path(tmp), stem, nvcc=nvcc, cuobjdump=cuobjdump, nvdisasm=nvdisasm, arch=arch,
                            phases=phases if one else None)

    with tempfile.TemporaryDirectory(prefix="sass_counts-") as tmp, ThreadPoolExecutor(max(1, jobs)) as pool:
        counted = list(pool.map(count, work))
    rows = [{**key, **res} for (key, _), res in zip(work, counted) if "alone" not in key]
    by = {(r["launch"], r["format"], r["side"]): r for r in rows}
    for (key, _), res in zip(work, counted):
        if "alone" in key:
            by[(key["launch"], key["format"], key["side"])]["phases"][key["alone"]]["alone"] = {
                "registers": res["registers"], "spill_bytes": res["spill_bytes"], "instructions": res["instructions"]}
    return rows


def phase_templates(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each phase of the one launch as a launch of its own with the one launch's values for
    it (its prefixed values unprefixed, NT the one launch's): compiled alone, ptxas says
    the registers that phase asks for; the one launch's count is one number for all three."""
    return {kernel: {t: template["NT"] if t == "NT" else template[prefix + t]
                     for t in kernel_source.KERNELS[kernel].template}
            for kernel, prefix in kernel_source.ONE_LAUNCH_PHASES}


#: How the one launch's phases are named in the table (and in ``kernel_versions.sass_table``).
_PHASE_SHORT = {"wo_residual": "wo", "ffn_gate_up": "gate_up", "ffn_down": "down", "barriers": "barriers"}


def print_table(rows: list[dict[str, Any]]) -> None:
    """The three launches: one line a launch and format (registers, instructions, the row
    loop's and its classes, and with two sides the loop's old count and new / old). The
    one launch, below: a line a phase, format and side (its instructions, its outer loops'
    and their classes, the loops inside those, and new / old of the outer loops), then its
    registers, spills and instructions in all. At most 100 columns."""
    by = {(r["launch"], r["format"], r["side"]): r for r in rows}
    two = any(r["side"] == "old" for r in rows)
    classes = (*CLASSES, "other")
    three = [k for k in by if k[0] != ONE_LAUNCH and k[2] == "new"]
    if three:
        head = f"{'launch':<12}{'format':<9}{'regs':>5}{'spill':>6}{'instr':>7}{'loop':>6}"
        head += "".join(f"{c:>8}" for c in classes) + (f"{'old loop':>10}{'new/old':>9}" if two else "")
        print(head)
    for launch, fmt, side in three:
        r = by[(launch, fmt, side)]
        cls = r["loop_classes"]
        line = (f"{launch.replace('ffn_', ''):<12}{fmt:<9}{r['registers']!s:>5}{r['spill_bytes']!s:>6}"
                f"{r['instructions']:>7}{r['loop_instructions']:>6}" + "".join(f"{cls[c]:>8}" for c in cls))
        if two:
            old = by[(launch, fmt, "old")]["loop_instructions"]
            line += f"{old:>10}{r['loop_instructions'] / old:>9.3f}" if old else f"{'-':>10}{'-':>9}"
        print(line)
    formats = list(dict.fromkeys(k[1] for k in by if k[0] == ONE_LAUNCH))
    if not formats:
        return
    print(("\n" if three else "") + "the one launch, a phase a line: instr = its instructions, loops = its outer "
          "loops'\n(cold paths out) by class, inner = the loops in those, alone = registers compiled alone")
    print(f"{'phase':<10}{'format':<9}{'side':<5}{'instr':>6}{'loops':>7}" + "".join(f"{c:>8}" for c in classes)
          + f"{'inner':>7}{'alone':>6}{'new/old':>9}")
    for fmt in formats:
        sides = [s for s in ("old", "new") if (ONE_LAUNCH, fmt, s) in by]
        for phase, short in _PHASE_SHORT.items():
            for side in sides:
                ph = by[(ONE_LAUNCH, fmt, side)]["phases"][phase]
                alone = ph.get("alone", {}).get("registers", "")
                line = (f"{short:<10}{fmt:<9}{side:<5}{ph['instructions']:>6}{ph['loop_instructions']:>7}"
                        + "".join(f"{ph['loop_classes'][c]:>8}" for c in classes)
                        + f"{ph['inner_instructions']:>7}{alone!s:>6}")
                old = by.get((ONE_LAUNCH, fmt, "old"))
                if side == "new" and old and old["phases"][phase]["loop_instructions"]:
                    line += f"{ph['loop_instructions'] / old['phases'][phase]['loop_instructions']:>9.3f}"
                print(line)
        for side in sides:
            r = by[(ONE_LAUNCH, fmt, side)]
            print(f"{'all':<10}{fmt:<9}{side:<5}{r['instructions']:>6}  registers {r['registers']}, "
                  f"spilled {r['spill_bytes']} bytes")


def main(argv: list[str] | None = None) -> int:
    ap = record.parser("sass_counts", __doc__)
    ap.add_argument("--old", default=None, help="a copy of an older kernels/ folder to count beside kernels/")
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma list of {tuple(FORMATS)}")
    ap.add_argument("--launches", default=",".join(LAUNCHES),
                    help=f"comma list of {LAUNCHES} ({ONE_LAUNCH}: the tail as one launch, by phase)")
    ap.add_argument("--arch", default="sm_90", help="the GPU architecture nvcc compiles for")
    ap.add_argument("--jobs", type=int, default=2, help="compilations at once")
    a = ap.parse_args(argv)
    formats = tuple(record.comma_list(ap, "--formats", a.formats, tuple(FORMATS)))
    launches = tuple(k for k in LAUNCHES if k in record.comma_list(ap, "--launches", a.launches, LAUNCHES))
    if not re.fullmatch(r"sm_\d{2,3}a?", a.arch):
        print(f"--arch must name a GPU architecture such as sm_90; got {a.arch!r}")
        return 2
    if a.jobs < 1:
        print(f"--jobs must be at least 1; got {a.jobs}")
        return 2
    old_dir = None
    if a.old is not None:
        old_dir = Path(a.old).resolve()
        needed = ["common.h", "prelude_cuda.h",
                  *sorted({kernel_source.KERNELS[k].body for k in launches if k != ONE_LAUNCH})]
        missing = [n for n in needed if not (old_dir / n).is_file()]
        if missing:
            print(f"--old must be a kernels folder holding {', '.join(needed)}; {old_dir} lacks {missing}")
            return 2
        if ONE_LAUNCH in launches and not (old_dir / kernel_source.ONE_LAUNCH_BODY).is_file():
            print(f"{old_dir} has no {kernel_source.ONE_LAUNCH_BODY} (older than the one launch): "
                  "the one launch is counted from kernels/ alone")
    nvcc, cuobjdump, nvdisasm = shutil.which("nvcc"), find_tool("cuobjdump"), find_tool("nvdisasm")
    if nvcc is None or cuobjdump is None or nvdisasm is None:
        print("needs nvcc (the CUDA toolkit), cuobjdump and nvdisasm (on PATH, or `pip install nvidia-cuda-cuobjdump "
              f"nvidia-cuda-nvdisasm`); found nvcc: {nvcc}, cuobjdump: {cuobjdump}, nvdisasm: {nvdisasm}")
        return 2
    prov = record.provenance("sass_counts", argv)
    versions = {"nvcc": tool_version(nvcc), "cuobjdump": tool_version(cuobjdump)}
    print(f"nvcc {versions['nvcc']}\ncuobjdump {versions['cuobjdump']}\n{a.arch}: kernels/ ({prov['kernel_text']})"
          + (f" against\n{old_dir} ({kernel_source.fingerprint(kernel_dir=old_dir)})" if old_dir else ""))
    rows = run(formats, old_dir=old_dir, nvcc=nvcc, cuobjdump=cuobjdump, nvdisasm=nvdisasm, arch=a.arch, jobs=a.jobs,
               launches=launches)
    print_table(rows)
    rec = {"what": "registers, spills and static instruction counts of the tail's kernels as nvcc compiles them",
           **prov,
           **versions, "arch": a.arch, "shape": BONSAI, "launches": list(launches),
           "old_dir": a.old,  # as given: the fingerprint below says which text it held
           "old_kernel_text": kernel_source.fingerprint(kernel_dir=old_dir) if old_dir else None,
           "classes": {c: sorted(ops) for c, ops in CLASSES.items()}, "rows": rows}
    if not a.no_record:
        print()
        record.write(rec, a.out_dir, record.record_stem("sass_counts"), force=a.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
