"""Every kernel and weight format under NVIDIA's compute-sanitizer, one record.

    python -m bench.sanitize                      # memcheck, racecheck, synccheck, initcheck
    python -m bench.sanitize --tools memcheck --shapes small --parts head   # a part of it

Each run is ``python -m bench.sanitize --child`` under ``compute-sanitizer --tool T --kernel-name kns=fat_``
(only the workbench's kernels, whose MLX names start ``fat_``, are instrumented). The child runs the parts
asked for (``--parts``) in every weight format the kernels read, at a small shape and at Bonsai-27B's, and
checks each small tail against the float64 oracle at ``bench.gpu_check``'s tolerance (a sanitizer that changed
results would show), each Bonsai output for being finite. A tool passes when its summary reports no error
(racecheck: no hazard) and the child exits 0; a run stopped at ``--timeout`` (with every process it started,
``bench.common.bounded_run``) has no verdict. ``--jobs N`` runs one a tool, shape, format and part group
(``part_groups``), N at a time; keep 1 on a single GPU: runs at once slowed each other several-fold.

Writes ``data/bench/sanitize-<device>-<UTC time>.json``: per run, the command, exit status, summary lines,
seconds, reports counted by kernel, the first reports whole and the output's tail.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import bounded_run, cli, record
from workbench.reports import sanitize as sanitizer_coverage

ROOT = Path(__file__).resolve().parent.parent

TOOLS = sanitizer_coverage.TOOLS

#: (hidden, branch, ffn), wo's fold block, head rows (q, k, v).
SHAPES: dict[str, tuple[tuple[int, int, int], int, tuple[int, int, int]]] = {
    "small": ((256, 1024, 2048), 256, (1024, 256, 256)),
    "bonsai": ((5120, 6144, 17408), 1024, (12288, 1024, 1024)),
}

#: Weight formats: float32 / bfloat16 dense, else a name in QUANT_FORMATS.
FORMATS = sanitizer_coverage.FORMATS


#: What the child can run: the tail's three launches, the tail as one launch, the same one
#: launch carrying the next layer's input norm (``kernels/next_norm.body``), the head launch.
PARTS: tuple[str, ...] = ("tail", "one-launch", "next-norm", "head")


def part_groups(parts: list[str]) -> list[list[str]]:
    """``parts`` (as :func:`parts_to_run` gives them) split into the groups that run as
    separate children with ``--jobs``: the tail with its one launch, and the head apart.

    Why apart: a run's verdict is all or nothing (the sanitizer's summary comes when its
    child exits), so a head stopped at its limit would take a finished tail's verdict with
    it. Apart, the tail's verdict does not wait on the head's."""
    tail = [p for p in parts if p != "head"]
    return [g for g in (tail, [p for p in parts if p == "head"]) if g]


def parts_to_run(parts: list[str]) -> list[str]:
    """``parts`` in PARTS order, with the tail added where a one launch is asked for (a one
    launch, carrying the next norm or not, is checked against the three launches' output, so
    they run with it)."""
    wanted = set(parts) | ({"tail"} if {"one-launch", "next-norm"} & set(parts) else set())
    return [p for p in PARTS if p in wanted]


#: The copy kernel of ``--device-written``: its name starts ``fat_`` so that the sanitizer
#: instruments it (``--kernel-name kns=fat_``) and so sees its writes as initializing.
DEVICE_COPY_NAME = "fat_device_copy"


#: 16 bytes a thread where both ends are 16-byte aligned (MLX's buffers are), else a byte
#: a thread: initcheck reports each read of memory it saw no write to, so wide reads keep
#: any such count (and the log) a sixteenth of a byte-wise copy's.
_DEVICE_COPY_SOURCE = """
const unsigned long i = blockIdx.x * (unsigned long)blockDim.x + threadIdx.x;
const unsigned long threads = gridDim.x * (unsigned long)blockDim.x;
const unsigned char* s = reinterpret_cast<const unsigned char*>(src);
unsigned char* d = reinterpret_cast<unsigned char*>(dst);
const bool aligned = ((reinterpret_cast<unsigned long>(s) | reinterpret_cast<unsigned long>(d)) % 16) == 0;
const unsigned long words = aligned ? (unsigned long)NBYTES / 16 : 0;
if (i < words) reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
for (unsigned long b = words * 16 + i; b < (unsigned long)NBYTES; b += threads) d[b] = s[b];
"""


@lru_cache(maxsize=1)
def _device_copy_kernel() -> Any:
    import mlx.core as mx

    return mx.fast.cuda_kernel(
        name=DEVICE_COPY_NAME, input_names=["src"], output_names=["dst"], source=_DEVICE_COPY_SOURCE
    )


def device_copy(a: Any) -> Any:
    """``a`` (an ``mx.array``, any dtype) copied by :data:`DEVICE_COPY_NAME`, a kernel the
    sanitizer instruments: the same values, last written by a GPU kernel it watched."""
    if a.size == 0:
        return a
    nt = 256
    threads = max(a.nbytes // 16, 1)
    return _device_copy_kernel()(
        inputs=[a],
        template=[("NBYTES", a.nbytes)],
        grid=(-(-threads // nt) * nt, 1, 1),
        threadgroup=(nt, 1, 1),
        output_shapes=[a.shape],
        output_dtypes=[a.dtype],
    )[0]


def device_written(prep: Any) -> Any:
    """A copy of the prepared tail ``prep`` whose every array was last written by
    :func:`device_copy`: the same values, so the same launches and results.

    Why: initcheck reported uninitialized reads of the weights at the small shape, and
    681,235 of them when every array had just been re-made by MLX's own multiply kernel,
    which ``kns=fat_`` leaves uninstrumented: initcheck does not see writes of kernels it
    does not instrument. Re-made by :func:`device_copy` instead, every array the tail
    kernels read was last written by a kernel initcheck watches, so a report inside a tail
    kernel is a real uninitialized read; reports inside the copy itself (of memory written
    where initcheck does not look) are counted apart, by kernel. Measured: none of either,
    at both shapes (docs/JOURNAL.md, "What was left open", names the records).
    """
    import dataclasses

    import mlx.core as mx

    def mat(m: Any) -> Any:
        return dataclasses.replace(m, w=device_copy(m.w), s=device_copy(m.s), b=device_copy(m.b))

    rot = dict(prep.rot, sdest=device_copy(prep.rot["sdest"]), table=device_copy(prep.rot["table"]))
    copy = dataclasses.replace(
        prep,
        wo=mat(prep.wo),
        gate=mat(prep.gate),
        up=mat(prep.up),
        down=mat(prep.down),
        rot=rot,
        norm=device_copy(prep.norm),
        params=device_copy(prep.params),
    )
    mx.eval(
        [
            copy.norm,
            copy.params,
            rot["sdest"],
            rot["table"],
            *[a for m in (copy.wo, copy.gate, copy.up, copy.down) for a in (m.w, m.s, m.b)],
        ]
    )
    return copy


def _child(
    shapes: list[str],
    formats: list[str],
    parts: list[str] | None = None,
    device_inputs: bool = False,
    one_launch_nt: int | None = None,
) -> int:
    """Run every kernel of ``parts`` once per (shape, format); 1 if an output misses its check.
    ``device_inputs``: the tail's arrays and inputs written by GPU kernels (:func:`device_written`);
    ``one_launch_nt``: the one launch's threads a group (None: ``one_launch.shape_for``'s, as fused_tail)."""
    parts = parts_to_run(list(PARTS) if parts is None else parts)
    bad = 0
    for sname in shapes:
        for i, fmt in enumerate(formats):
            if "tail" in parts:
                bad += _tail_parts(
                    sname, fmt, i, "one-launch" in parts, device_inputs, one_launch_nt, carried="next-norm" in parts
                )
            if "head" in parts:
                bad += _head_part(sname, fmt, i)
    return 1 if bad else 0


#: When this module was imported: in a child (``python -m bench.sanitize --child``, a
#: process of its own), when the child started; for :func:`_elapsed`.
_CHILD_T0 = time.perf_counter()


def _elapsed() -> str:
    """The case lines' suffix: seconds since the child started (host preparation, the
    instrumented kernels and the checks, all included)."""
    return f" [{time.perf_counter() - _CHILD_T0:.0f} s]"


def _tail_parts(
    sname: str, fmt: str, i: int, one: bool, device_inputs: bool, one_nt: int | None = None, carried: bool = False
) -> int:
    """The tail's three launches at shape ``sname`` in ``fmt`` (the small shape checked
    against the float64 oracle, Bonsai's for finite outputs), and with ``one`` the same tail
    as one launch (``one_nt`` threads a group; None: fused_tail's for the format) checked against them;
    with ``carried`` the one launch that also writes the next layer's input norm, its ``out``
    checked against the three launches and its norm against the float64 norm of that ``out``;
    prints a line each (a one launch's names its threads a group), returns the number failed."""
    import mlx.core as mx

    from workbench import tail
    from workbench.decode import worst_scaled_error
    from workbench.fold import QUANT_FORMATS
    from workbench.kernels import (
        SANITIZER_BARRIER_LIMIT_MS,
        NextNorm,
        OneLaunchShape,
        OneLaunchTail,
        prepared,
        shape_for,
    )
    from workbench.studies import host_tail_exact, tolerance_for
    from workbench.tail import SEED_TOL, compare

    (hidden, branch, ffn), block, _ = SHAPES[sname]
    q = QUANT_FORMATS.get(fmt)
    dtype = fmt if q is None else "bfloat16"
    w = tail.TailWeights.random(
        hidden, branch, ffn, seed=7 + i, fold_block=block, dtype=dtype, quantize=q.as_quantize() if q else None
    )
    br, res = tail.random_inputs(w, seed=8 + i)
    prep = prepared(tail.tail_launch(w), "cuda")  # the three launches
    b_in, r_in = mx.array(br), mx.array(res)
    if device_inputs:
        prep = device_written(prep)
        b_in, r_in = device_copy(b_in), device_copy(r_in)
        mx.eval(b_in, r_in)
    out = np.array(prep(b_in, r_in))
    bad = 0
    if sname == "small":  # the float64 oracle at Bonsai's shape is bench.gpu_check's (minutes of CPU)
        truth = host_tail_exact(w, br, res)
        tol, _ = tolerance_for(w, br, res, truth)
        c = compare(out, truth, tol=tol)
        bad += not c.passed
        print(f"tail {sname} {fmt}: {c}{_elapsed()}", flush=True)
    else:
        finite = bool(np.isfinite(out).all())
        bad += not finite
        print(f"tail {sname} {fmt}: outputs {'finite' if finite else 'NOT FINITE'}{_elapsed()}", flush=True)
    # a one launch's shape: fused_tail's for this format (one_launch.shape_for), unless --one-launch-nt says
    shape = shape_for(prep) if one_nt is None else OneLaunchShape(nt=one_nt)
    if one:  # the same tail as ONE launch (its phases between grid barriers), against the three
        # instrumented groups run many times slower: a barrier's default 4 s limit was
        # exceeded under initcheck (one_launch.SANITIZER_BARRIER_LIMIT_MS)
        tail1 = OneLaunchTail(prep, shape, barrier_limit_ms=SANITIZER_BARRIER_LIMIT_MS)
        if device_inputs:
            tail1.copy_constants(device_copy)  # its zeros and constants were written by MLX's own kernels
        worst = worst_scaled_error(tail1.run(b_in, r_in), out)
        agrees = worst <= SEED_TOL  # frink-models' criterion: the sums only run in another order
        bad += not agrees
        print(
            f"one-launch {sname} {fmt} ({shape.nt} threads a group): {'agrees' if agrees else 'DISAGREES'} "
            f"with the three launches (worst scaled {worst:.3g}){_elapsed()}",
            flush=True,
        )
    if carried:  # the one launch with the next norm's epilogue (its last group writes rms_norm(out) * w)
        norm = NextNorm(np.random.default_rng(9 + i).uniform(0.5, 1.5, prep.hidden), 1e-5)
        tailn = OneLaunchTail(prep, shape, barrier_limit_ms=SANITIZER_BARRIER_LIMIT_MS, next_norm=norm)
        if device_inputs:
            tailn.copy_constants(device_copy)
        got, normed = tailn.run_carried(b_in, r_in)
        worst_out = worst_scaled_error(got, out)
        worst_norm = worst_scaled_error(normed, norm.oracle(got))
        agrees = max(worst_out, worst_norm) <= SEED_TOL
        bad += not agrees
        print(
            f"next-norm {sname} {fmt} ({shape.nt} threads a group): {'agrees' if agrees else 'DISAGREES'} "
            f"(out against the three launches: worst scaled {worst_out:.3g}; the norm against float64: "
            f"{worst_norm:.3g}){_elapsed()}",
            flush=True,
        )
    return bad


def _head_part(sname: str, fmt: str, i: int) -> int:
    """The head launch (Q, K, V of the rotated, normed hidden state) at shape ``sname`` in
    ``fmt``, its three matrices folded with one shared rotation; prints whether every output
    is finite (its oracle check is bench.gpu_check's), returns 1 if not."""
    import mlx.core as mx

    from workbench.fold import QUANT_FORMATS, HadamardFold, WeightMatrix
    from workbench.kernels import head_launch

    (hidden, _, _), block, (nq, nk, nv) = SHAPES[sname]
    q = QUANT_FORMATS.get(fmt)
    fold = HadamardFold.random(hidden, block, seed=9 + i, permute=True)
    rng = np.random.default_rng(10 + i)
    a = math.sqrt(3.0 / hidden)
    mats = []
    for rows in (nq, nk, nv):
        dense = mx.array(rng.uniform(-a, a, (rows, hidden)).astype(np.float32)).astype(
            mx.float32 if fmt == "float32" else mx.bfloat16
        )
        mats.append(
            WeightMatrix.quantize(dense, **q.as_quantize(), fold=fold) if q else WeightMatrix(dense).fold_hadamard(fold)
        )
    x = mx.array(rng.uniform(-1, 1, hidden).astype(np.float32))
    got = head_launch(x, np.ones(hidden, np.float32), 1e-6, *mats, "cuda")
    mx.eval(*got)
    finite = all(bool(mx.all(mx.isfinite(g)).item()) for g in got)
    print(f"head {sname} {fmt}: outputs {'finite' if finite else 'NOT FINITE'}{_elapsed()}", flush=True)
    return 0 if finite else 1


_SUMMARY = re.compile(r"^=+ (ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY).*$", re.M)

#: A report's "at" line names the kernel: ``at mlx::core::cu::custom_kernel_fat_<name>_<template values>(...)+0x..``.
_AT_KERNEL = re.compile(r"^=+\s+at (?:[\w:]*::)?(?:custom_kernel_)?(\w+?)(?:_\d\w*)?\(")

_HEADER = re.compile(r"^=+ \S")
_BANNER = re.compile(r"^=+ COMPUTE-SANITIZER")

#: How many reports the sanitizer prints (to its log file, backtraces off): all of them,
#: so they can be counted by kernel (initcheck made 681,235 at the small shape).
PRINT_LIMIT = 10_000_000

#: The first reports kept whole in the record.
KEPT_REPORTS = 12


def _errors(tool: str, text: str) -> int | None:
    """Errors (racecheck: hazards) in the sanitizer's summary, or None if it printed none."""
    m = re.search(r"ERROR SUMMARY: (\d+) error", text)
    if tool == "racecheck":
        r = re.search(r"RACECHECK SUMMARY: (\d+) hazard", text)
        if r:
            return int(r.group(1)) + (int(m.group(1)) if m else 0)
    return int(m.group(1)) if m else None


def read_log(path: Path) -> tuple[dict[str, int], list[str], list[str]]:
    """The sanitizer's log file, read a line at a time (it can hold hundreds of MB):
    ``(reports a kernel, the first KEPT_REPORTS reports whole, the summary lines)``. A
    report starts at an unindented line ``========= <what>`` (its details are indented); its
    kernel is its first ``at`` line's (MLX's ``custom_kernel_`` prefix and the template
    values' suffix dropped: ``fat_wo_residual``)."""
    by_kernel: dict[str, int] = {}
    kept: list[str] = []
    summary: list[str] = []
    current: list[str] = []
    counted = False

    def close() -> None:
        if current and len(kept) < KEPT_REPORTS:
            kept.append("\n".join(current))
        current.clear()

    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if _SUMMARY.match(line):
                summary.append(line)
            elif line.strip("= ") == "" or _BANNER.match(line):  # a report's end, or the tool's banner
                close()
            elif _HEADER.match(line):  # a report's first line (its detail lines are indented)
                close()
                current.append(line)
                counted = False
            elif current:
                current.append(line)
                m = _AT_KERNEL.match(line)
                if m and not counted:
                    by_kernel[m.group(1)] = by_kernel.get(m.group(1), 0) + 1
                    counted = True
    close()
    return by_kernel, kept, summary


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser("sanitize", __doc__)
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"comma list of {TOOLS}")
    ap.add_argument("--shapes", default="small,bonsai", help=f"comma list of {tuple(SHAPES)}")
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma list of {FORMATS}")
    ap.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma list of {PARTS}: tail the three launches, one-launch the same tail as one "
        "launch (checked against the three, so they run with it), next-norm that launch also "
        "writing the next layer's input norm, head the head launch",
    )
    ap.add_argument(
        "--device-written",
        action="store_true",
        help="the tail's weights and inputs copied by a GPU kernel first (initcheck: tells host-written "
        "memory apart from a real uninitialized read)",
    )
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds allowed each sanitizer run")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="sanitizer runs at once: 1 runs one a tool over every shape and format; N > 1 runs one a "
        "tool, shape and format, N at a time (one record either way). On one GPU, 1 is fastest: "
        "runs at once slowed each other several-fold on the H200 (the module's doc)",
    )
    ap.add_argument(
        "--one-launch-nt",
        type=int,
        default=None,
        help="the one launch's threads a group, a multiple of 32 up to 1024 (default: what "
        "fused_tail(backend='cuda') runs for the format, workbench.kernels.one_launch.shape_for)",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    tools = cli.comma_list(ap, "--tools", a.tools, TOOLS)
    shapes = cli.comma_list(ap, "--shapes", a.shapes, SHAPES)
    formats = cli.comma_list(ap, "--formats", a.formats, FORMATS)
    parts = parts_to_run(cli.comma_list(ap, "--parts", a.parts, PARTS))
    if a.jobs < 1:
        ap.error(f"--jobs must be >= 1; got {a.jobs}")
    cli.finite_positive(ap, "--timeout", a.timeout)
    if a.one_launch_nt is not None and (a.one_launch_nt % 32 or not 32 <= a.one_launch_nt <= 1024):
        ap.error(f"--one-launch-nt must be a multiple of 32 from 32 to 1024 (whole warps); got {a.one_launch_nt}")
    if a.child:
        return _child(shapes, formats, parts, a.device_written, a.one_launch_nt)
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        print("compute-sanitizer is not on PATH: it comes with the CUDA toolkit")
        return 2
    prov = record.provenance("sanitize", argv)
    started = _dt.datetime.fromisoformat(prov["date"])
    # one child a tool over every shape and format, or (--jobs N > 1) one a tool, shape
    # and format, and part group (part_groups), N at a time: the GPU is shared, so each runs
    # slower, but the host's folding and the sanitizer's own CPU work run side by side
    units = (
        [(tool, shapes, formats, parts) for tool in tools]
        if a.jobs == 1
        else [(tool, [s], [f], g) for tool in tools for s in shapes for f in formats for g in part_groups(parts)]
    )
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        runs = list(
            pool.map(
                lambda u: sanitize_run(exe, u[0], u[1], u[2], u[3], a.device_written, a.timeout, a.one_launch_nt), units
            )
        )
    rec = {
        "what": "compute-sanitizer on every kernel and weight format",
        **prov,
        "shapes": {s: SHAPES[s] for s in shapes},
        "formats": formats,
        "parts": parts,
        "device_written": a.device_written,
        "one_launch_nt": a.one_launch_nt,
        "jobs": a.jobs,
        "runs": runs,
        "all_clean": all(r["passed"] for r in runs),
    }
    if not a.no_record:
        device = prov["device"].get("device_name", "gpu")
        record.write(rec, a.out_dir, record.record_stem("sanitize", device, started), force=a.force)
    return 0 if rec["all_clean"] else 1


def sanitize_run(
    exe: str,
    tool: str,
    shapes: list[str],
    formats: list[str],
    parts: list[str],
    device_written: bool,
    timeout: float,
    one_launch_nt: int | None = None,
) -> dict[str, Any]:
    """One child (``--child``: every kernel of ``parts`` at ``shapes`` x ``formats``) under
    ``compute-sanitizer --tool TOOL``: the record's entry for it, also printed as one line."""
    child = [
        sys.executable,
        "-m",
        "bench.sanitize",
        "--child",
        "--shapes",
        ",".join(shapes),
        "--formats",
        ",".join(formats),
        "--parts",
        ",".join(parts),
    ]
    child += ["--device-written"] if device_written else []
    child += [] if one_launch_nt is None else ["--one-launch-nt", str(one_launch_nt)]
    # initcheck also checks host API copies by default, and MLX's allocator copies whole
    # buffers (slack beyond an array's end included) when numpy reads an array: those
    # reports are MLX's, not the kernels', so initcheck checks device accesses only.
    api = ["--check-api-memory-access", "no"] if tool == "initcheck" else []
    log = Path(tempfile.mkdtemp(prefix="sanitize-")) / f"{tool}.log"
    head = [
        exe,
        "--tool",
        tool,
        *api,
        "--kernel-name",
        "kns=fat_",
        "--print-limit",
        str(PRINT_LIMIT),
        "--show-backtrace",
        "no",
    ]
    t0 = time.perf_counter()
    try:
        # run_bounded, not subprocess.run: at the limit the sanitizer's Python child must
        # stop too (bench/common/bounded_run.py says what an orphaned one cost).
        p = bounded_run.run_bounded(
            [*head, "--log-file", str(log), *child],
            timeout=timeout,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = None
    by_kernel, first, summary = read_log(log) if log.exists() else ({}, [], [])
    shutil.rmtree(log.parent, ignore_errors=True)
    errors = _errors(tool, "\n".join(summary))
    run = {
        "tool": tool,
        "shapes": shapes,
        "formats": formats,
        "parts": parts,
        "command": " ".join(head + child),
        "returncode": rc,
        "seconds": time.perf_counter() - t0,
        "errors": errors,
        "summary": summary,
        "reports_by_kernel": by_kernel,
        "first_reports": first,
        "cases": [ln for ln in text.splitlines() if ln.split(" ", 1)[0] in sanitizer_coverage.PART_LETTERS],
        "passed": rc == 0 and errors == 0,
        "timed_out": rc is None,
        "output_tail": text[-4000:],
    }
    # A run killed at its time limit found nothing either way: say so, rather than "not
    # clean", which would read as a finding (its cases show how far it got).
    verdict = (
        "TIMED OUT (no verdict; got as far as: " + ("; ".join(run["cases"]) or "nothing") + ")"
        if rc is None
        else "clean"
        if run["passed"]
        else "NOT CLEAN"
    )
    print(
        f"{tool:<10} {','.join(shapes)} {','.join(formats)} {'+'.join(parts)}: {verdict}: "
        f"errors {errors}, exit {rc}, {run['seconds']:.0f} s; reports by kernel {by_kernel or 'none'}",
        flush=True,
    )
    return run


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.sanitize"))
