"""What nvcc makes of the tail's kernels: registers, spills and instructions, no GPU needed.

    python -m bench.sass_counts                  # the kernels as they are
    python -m bench.sass_counts --old DIR        # an older kernels/ folder beside them

For each launch of the tail (wo_residual, ffn_gate_up, ffn_down) in each weight format,
at Bonsai-27B's shape with the template values the launches take by default
(:func:`launch_templates`: what ``kernel_launch.PreparedTail.templates`` gives for
``KernelTuning()``, checked against it in the tests; making Bonsai's weights here would
take minutes of CPU), the CUDA translation unit MLX would compile
(``kernel_source.cuda_translation_unit``) is compiled with ``nvcc -arch=sm_90 -cubin``.
ptxas says the registers a thread and the bytes spilled; ``cuobjdump -sass`` gives the
machine code, read here (:func:`parse_sass`): every instruction, and those of the row loop
-- the longest span a backward branch closes, which in these bodies is the loop over a
warp's rows, the row dot's unit loop inside it counted once -- by class (:data:`CLASSES`).

These are static counts: what one pass through the loop issues, not what a launch
executes (``bench.launch_profile`` measures that under Nsight Compute on a GPU). They
answer "did this edit of the kernel text cut instructions, and which" in seconds, before
any device time is spent: the 4-bit formats' launches were bound by the integer pipe
(kernels/README.md, "What bounds the 4-bit launches"), whose share the classes show.

Needs nvcc (CUDA 12 or 13), cuobjdump and nvdisasm: on PATH, or NVIDIA's
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels (the ``test`` extra installs
them on x86-64 Linux). A table on stdout, the record
through ``bench.record`` to ``data/bench/sass_counts-<host>-<date>.json`` (the compiler's
versions in it). Exit status: 0; 2 without those tools, or with a DIR that is not a kernels
folder.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import kernel_bench, record
from workbench import kernel_launch, kernel_source
from workbench.hadamard import factor_block
from workbench.weights import QUANT_FORMATS

def _bonsai() -> dict[str, int]:
    """Bonsai-27B's tail as ``bench.kernel_bench.BONSAI`` gives it (hidden, branch: wo's
    input, ffn; wo's fold block), the block factored as the rotation applies it
    (``hadamard.factor_block``: block = m 2^logp)."""
    (hidden, branch, ffn), block = kernel_bench.BONSAI
    m, logp = factor_block(block)
    return {"hidden": hidden, "branch": branch, "ffn": ffn, "m": m, "logp": logp}


#: The shape counted.
BONSAI = _bonsai()

#: The launches counted: the tail's three.
LAUNCHES: tuple[str, ...] = kernel_source.TAIL_KERNELS

#: The scale format of each quantization mode, as the launches see MLX's arrays made from
#: bfloat16 weights (``kernel_launch._matrix``: affine scales and biases are bfloat16).
_SCALES = {"affine": kernel_source.SF_BF16, "mxfp4": kernel_source.SF_E8M0, "nvfp4": kernel_source.SF_E4M3}

#: Weight formats: label -> (FMT, SFMT, group size, bits).
FORMATS: dict[str, tuple[int, int, int, int]] = {
    "bf16": (kernel_source.WF_BF16, kernel_source.SF_F32, 32, 16),
    **{name: (kernel_source.KERNEL_QUANT[(q.mode, q.bits)], _SCALES[q.mode], q.group_size, q.bits)
       for name, q in ((n, QUANT_FORMATS[n]) for n in ("affine4", "affine8", "mxfp4", "nvfp4"))},
}

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
    "memory": frozenset({"LDG", "LDS", "STS", "STG", "LDC", "LD", "ST", "ATOM", "ATOMS", "RED", "LDSM"}),
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


def classify(instrs: list[Instruction]) -> dict[str, int]:
    """How many of ``instrs`` fall in each of :data:`CLASSES` and ``other``."""
    counts = Counter()
    for ins in instrs:
        counts[next((c for c, ops in CLASSES.items() if ins.opcode in ops), "other")] += 1
    return {c: counts.get(c, 0) for c in (*CLASSES, "other")}


def launch_templates(fmt_label: str, tuning: kernel_launch.KernelTuning | None = None,
                     shape: dict[str, int] | None = None) -> dict[str, list[tuple[str, Any]]]:
    """The three launches' template values for ``fmt_label`` at ``shape`` (default:
    :data:`BONSAI`) with ``tuning`` (default ``KernelTuning()``), written out as
    ``PreparedTail.templates`` builds them from prepared weights (every matrix in one
    format; interleaved words where a row is a multiple of 128 words)."""
    if fmt_label not in FORMATS:
        raise ValueError(f"fmt_label must be one of {tuple(FORMATS)}; got {fmt_label!r}")
    t = tuning or kernel_launch.KernelTuning()
    sh = dict(BONSAI if shape is None else shape)
    fmt, sfmt, gs, bits = FORMATS[fmt_label]
    u = kernel_launch._units

    def qi(cols: int) -> bool:  # as kernel_launch._matrix decides it
        return fmt >= kernel_source.WF_Q4 and (cols // (32 // bits)) % 128 == 0

    def base(cols: int) -> list[tuple[str, Any]]:
        return [("FMT", fmt), ("SFMT", sfmt), ("GS", gs), ("QI", qi(cols))]

    h, b, f = sh["hidden"], sh["branch"], sh["ffn"]
    return {
        "wo_residual": [("NT", t.wo_nt), *base(b), ("WIDTH", b), ("ROWS", h), ("ROT", True), ("M", sh["m"]),
                        ("LOGP", sh["logp"]), ("U", u(fmt, t.u_wo)), ("PRE", bool(t.pre_wo))],
        "ffn_gate_up": [("NT", t.rows_nt), *base(h), ("HID", h), ("FFN", f), ("U", u(fmt, t.u_gate_up)),
                        ("PRE", bool(t.pre_gate_up))],
        "ffn_down": [("NT", t.down_nt), *base(f), ("HID", h), ("FFN", f),
                     ("U", max(1, u(fmt, t.u_down) // t.down_rows)), ("DR", t.down_rows)],
    }


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


def count_launch(source: str, workdir: Path, stem: str, *, nvcc: str, cuobjdump: str, nvdisasm: str,
                 arch: str) -> dict[str, Any]:
    """Compile one translation unit; its registers, spills and instruction counts."""
    src = workdir / f"{stem}.cu"
    src.write_text(source)
    cubin = src.with_suffix(".cubin")
    done = subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-o", str(cubin), "-Xptxas", "-v", str(src)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed on {stem}: {done.stderr[-2000:]}")
    regs = re.search(r"Used (\d+) registers", done.stderr)
    spill = re.search(r"(\d+) bytes spill stores", done.stderr)
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=False,
                          env={**os.environ, "NVDISASM_PATH": str(Path(nvdisasm).parent)})
    if sass.returncode != 0:
        raise RuntimeError(f"cuobjdump failed on {stem}: {sass.stderr[-2000:]}")
    instrs = parse_sass(sass.stdout)
    loop = longest_loop(instrs)
    return {"registers": int(regs.group(1)) if regs else None, "spill_bytes": int(spill.group(1)) if spill else None,
            "instructions": len(instrs), "loop_instructions": len(loop), "loop_classes": classify(loop),
            "loop_opcodes": dict(Counter(i.opcode for i in loop).most_common())}


def run(formats: tuple[str, ...], *, old_dir: Path | None, nvcc: str, cuobjdump: str, nvdisasm: str, arch: str,
        jobs: int = 2) -> list[dict[str, Any]]:
    """Every launch and format (and each side, with ``old_dir``): one row each."""
    sides = {"new": None} if old_dir is None else {"old": old_dir, "new": None}
    work = []
    for label in formats:
        fmt, sfmt = FORMATS[label][:2]
        for kernel, template in launch_templates(label).items():
            dtypes = kernel_source.input_dtypes(kernel_source.KERNELS[kernel].inputs, fmt, sfmt)
            for side, folder in sides.items():
                text = kernel_source.cuda_translation_unit(kernel, dtypes, dict(template), kernel_dir=folder)
                work.append(({"launch": kernel, "format": label, "side": side, "template": dict(template)}, text))
    with tempfile.TemporaryDirectory(prefix="sass_counts-") as tmp, ThreadPoolExecutor(max(1, jobs)) as pool:
        counted = pool.map(lambda w: count_launch(w[1], Path(tmp), f"{w[0]['side']}-{w[0]['launch']}-{w[0]['format']}",
                                                  nvcc=nvcc, cuobjdump=cuobjdump, nvdisasm=nvdisasm, arch=arch),
                           work)
        return [{**key, **res} for (key, _), res in zip(work, counted)]


def print_table(rows: list[dict[str, Any]]) -> None:
    """One line a launch and format: registers, instructions, the loop's and its classes,
    and with two sides the loop's new / old."""
    by = {(r["launch"], r["format"], r["side"]): r for r in rows}
    two = any(r["side"] == "old" for r in rows)
    head = f"{'launch':<12}{'format':<9}{'regs':>5}{'spill':>6}{'instr':>7}{'loop':>6}"
    head += "".join(f"{c:>8}" for c in (*CLASSES, "other")) + (f"{'old loop':>10}{'new/old':>9}" if two else "")
    print(head)
    for (launch, fmt, side), r in by.items():
        if side != "new":
            continue
        cls = r["loop_classes"]
        line = (f"{launch.replace('ffn_', ''):<12}{fmt:<9}{r['registers']!s:>5}{r['spill_bytes']!s:>6}"
                f"{r['instructions']:>7}{r['loop_instructions']:>6}" + "".join(f"{cls[c]:>8}" for c in cls))
        if two:
            old = by[(launch, fmt, "old")]["loop_instructions"]
            line += f"{old:>10}{r['loop_instructions'] / old:>9.3f}" if old else f"{'-':>10}{'-':>9}"
        print(line)


def main(argv: list[str] | None = None) -> int:
    ap = record.parser("sass_counts", __doc__)
    ap.add_argument("--old", default=None, help="a copy of an older kernels/ folder to count beside kernels/")
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma list of {tuple(FORMATS)}")
    ap.add_argument("--arch", default="sm_90", help="the GPU architecture nvcc compiles for")
    ap.add_argument("--jobs", type=int, default=2, help="compilations at once")
    a = ap.parse_args(argv)
    formats = tuple(record.comma_list(ap, "--formats", a.formats, tuple(FORMATS)))
    if not re.fullmatch(r"sm_\d{2,3}a?", a.arch):
        print(f"--arch must name a GPU architecture such as sm_90; got {a.arch!r}")
        return 2
    if a.jobs < 1:
        print(f"--jobs must be at least 1; got {a.jobs}")
        return 2
    old_dir = None
    if a.old is not None:
        old_dir = Path(a.old).resolve()
        needed = ["common.h", "prelude_cuda.h", *sorted({kernel_source.KERNELS[k].body for k in LAUNCHES})]
        missing = [n for n in needed if not (old_dir / n).is_file()]
        if missing:
            print(f"--old must be a kernels folder holding {', '.join(needed)}; {old_dir} lacks {missing}")
            return 2
    nvcc, cuobjdump, nvdisasm = shutil.which("nvcc"), find_tool("cuobjdump"), find_tool("nvdisasm")
    if nvcc is None or cuobjdump is None or nvdisasm is None:
        print("needs nvcc (the CUDA toolkit), cuobjdump and nvdisasm (on PATH, or `pip install nvidia-cuda-cuobjdump "
              f"nvidia-cuda-nvdisasm`); found nvcc: {nvcc}, cuobjdump: {cuobjdump}, nvdisasm: {nvdisasm}")
        return 2
    prov = record.provenance("sass_counts", argv)
    started = _dt.datetime.fromisoformat(prov["date"])
    versions = {"nvcc": tool_version(nvcc), "cuobjdump": tool_version(cuobjdump)}
    print(f"nvcc {versions['nvcc']}; cuobjdump {versions['cuobjdump']}; {a.arch}; "
          f"kernels/ ({prov['kernel_text']})" + (f" against {old_dir} ({kernel_source.fingerprint(kernel_dir=old_dir)})"
                                                 if old_dir else ""))
    rows = run(formats, old_dir=old_dir, nvcc=nvcc, cuobjdump=cuobjdump, nvdisasm=nvdisasm, arch=a.arch, jobs=a.jobs)
    print_table(rows)
    rec = {"what": "registers, spills and static instruction counts of the tail's kernels as nvcc compiles them",
           **prov,
           **versions, "arch": a.arch, "shape": BONSAI,
           "old_dir": a.old,  # as given: the fingerprint below says which text it held
           "old_kernel_text": kernel_source.fingerprint(kernel_dir=old_dir) if old_dir else None,
           "classes": {c: sorted(ops) for c, ops in CLASSES.items()}, "rows": rows}
    if not a.no_record:
        print()
        record.write(rec, a.out_dir, record.record_stem("sass_counts"), force=a.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
