"""Each launch of the kernel tail under Nsight Compute: its own device time and DRAM traffic.

    python -m bench.launch_profile                   # Bonsai-27B, bf16 and every quantized format
    python -m bench.launch_profile --one-launch --stalls   # also each tail as one launch, and why: stall reasons

Runs ``python -m bench.launch_profile --child`` under ``ncu --kernel-name regex:fat_`` (only the workbench's
kernels; the pattern is not anchored, as MLX's CUDA back-end names them ``custom_kernel_fat_...``). The child
evaluates each format's tail twice (a warm-up, then the measured one) as a decoder does, so ncu's figures are a
launch run ONCE, caches flushed before it, ramp-up and last partial wave included: the single-shot cost the
amortized device time (``bench.common.kernels.batched_ms``) hides. Per launch: device time, DRAM bytes read,
DRAM and SM throughput as % of peak, achieved occupancy, registers a thread, grid.

Prints per format and launch ms, TB/s read and % of peak, and writes
``data/bench/launch_profile-<device>-<UTC time>.json`` with the command and ncu's rows.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import io
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

FORMATS: tuple[str, ...] = ("bfloat16", "affine4", "affine8", "mxfp4", "nvfp4")

METRICS: tuple[str, ...] = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "lts__t_bytes.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__grid_size",
    "launch__block_size",
)

# Why a launch is slower than its bytes, from the warp scheduler's side (``--stalls``): each
# stall reason as ncu's "warp cycles a reason an issued instruction" (the WarpStateStats
# section's breakdown: the reasons add up to the cycles between two instructions a warp
# issues), how often a scheduler issued at all, and how busy the FMA and ALU pipes were.
# A launch bound by instructions shows issue slots near 100% or a pipe near its peak; one
# waiting on memory shows long_scoreboard on top; one short of warps, little of either.
STALL_REASONS: tuple[str, ...] = (
    "long_scoreboard",
    "short_scoreboard",
    "wait",
    "barrier",
    "mio_throttle",
    "lg_throttle",
    "math_pipe_throttle",
    "not_selected",
    "selected",
    "dispatch_stall",
    "no_instruction",
    "branch_resolving",
    "membar",
    "drain",
    "sleeping",
    "tex_throttle",
    "imc_miss",
    "misc",
)
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
SCHEDULER_METRICS: tuple[str, ...] = (
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__average_warp_latency_per_inst_issued.ratio",
    "smsp__inst_executed.sum",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
)
# Warp instructions executed by pipe (and the global and shared loads among them): with the
# weights a launch reads, how many ALU instructions a weight it runs, the count the 4-bit
# launches' bound was about (docs/JOURNAL.md, "What bounds the 4-bit launches").
PIPES: tuple[str, ...] = ("alu", "fma", "lsu", "xu", "adu", "cbu")
PIPE_METRIC = "smsp__inst_executed_pipe_{}.sum"
LOAD_METRICS: dict[str, str] = {
    "global_ld": "smsp__sass_inst_executed_op_global_ld.sum",
    "shared_ld": "smsp__sass_inst_executed_op_shared_ld.sum",
}
SCHEDULER_METRICS += tuple(PIPE_METRIC.format(pipe) for pipe in PIPES) + tuple(LOAD_METRICS.values())
STALL_METRICS: tuple[str, ...] = tuple(STALL_METRIC.format(r) for r in STALL_REASONS) + SCHEDULER_METRICS


def stall_summary(launch: dict[str, Any], top: int = 4) -> dict[str, Any]:
    """One launch's scheduler figures from its ncu metrics: issue slots busy (%), cycles a
    warp takes per instruction, FMA / ALU pipe busy (%), warp instructions executed (all,
    by pipe, and the global and shared loads; None where the record has no such metric),
    and the ``top`` stall reasons as (reason, cycles an issued instruction), largest first."""
    stalls = sorted(
        (
            (r, launch[STALL_METRIC.format(r)])
            for r in STALL_REASONS
            if isinstance(launch.get(STALL_METRIC.format(r)), float)
        ),
        key=lambda rv: -rv[1],
    )
    return {
        "issue_active_pct": launch.get("smsp__issue_active.avg.pct_of_peak_sustained_active"),
        "cycles_per_issue": launch.get("smsp__average_warp_latency_per_inst_issued.ratio"),
        "fma_pipe_pct": launch.get("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
        "alu_pipe_pct": launch.get("sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"),
        "instructions": launch.get("smsp__inst_executed.sum"),
        "instructions_by_pipe": {pipe: launch.get(PIPE_METRIC.format(pipe)) for pipe in PIPES},
        "loads": {k: launch.get(m) for k, m in LOAD_METRICS.items()},
        "top_stalls": [[r, v] for r, v in stalls[:top]],
    }


def tuning_of(text: str) -> Any:
    """``KernelTuning`` from ``"name=value,..."`` (integers, or true/false for the ``pre_*``
    flags); ValueError naming what is wrong."""
    from workbench.kernels import KernelTuning

    fields = KernelTuning.__dataclass_fields__
    kw: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        if not sep or name not in fields:
            raise ValueError(f"--tuning: each item must be name=value with name one of {sorted(fields)}; got {item!r}")
        low = value.strip().lower()
        if low in ("true", "false"):
            kw[name] = low == "true"
        elif low.isdigit():
            kw[name] = int(low)
        else:
            raise ValueError(f"--tuning: {name} must be an integer or true/false; got {value!r}")
    return KernelTuning(**kw)


def _child(formats: list[str], tuning_text: str, head: bool, one: bool = False) -> int:
    import math

    import mlx.core as mx
    import numpy as np

    from bench.common.kernels import BONSAI
    from workbench import tail
    from workbench.fold import QUANT_FORMATS, HadamardFold, WeightMatrix
    from workbench.kernels import OneLaunchTail, head_launch, prepared

    tuning = tuning_of(tuning_text)
    (hidden, branch, ffn), block = BONSAI
    for i, fmt in enumerate(formats):
        q = QUANT_FORMATS.get(fmt)
        spec = q.as_quantize() if q else None
        w = tail.TailWeights.random(hidden, branch, ffn, seed=3 + i, fold_block=block, dtype="bfloat16", quantize=spec)
        b, r = (mx.array(a) for a in tail.random_inputs(w, seed=4 + i))
        prep = prepared(tail.tail_launch(w), "cuda", tuning)
        for _ in range(2):  # warm-up, then the measured one: one evaluation each
            mx.eval(prep(b, r))
        if one:  # the same tail as one launch (workbench.kernels.one_launch), warm-up then measured
            tail_one = OneLaunchTail(prep)
            for _ in range(2):
                mx.eval(tail_one(b, r))
        print(f"profiled {fmt}", flush=True)
        del w, prep
    if head:  # Bonsai's attention head launch (q_proj with its gate, k, v), bf16, hidden's fold
        rng = np.random.default_rng(5)
        fold = HadamardFold.random(hidden, hidden, seed=6, permute=True)
        a = math.sqrt(3.0 / hidden)
        q, k, v = (
            WeightMatrix(
                mx.array(rng.uniform(-a, a, (rows, hidden)).astype(np.float32)).astype(mx.bfloat16)
            ).fold_hadamard(fold)
            for rows in (2 * branch, 1024, 1024)
        )
        x = mx.array(rng.uniform(-1, 1, hidden).astype(np.float32))
        nw = (1 + rng.uniform(-0.25, 0.25, hidden)).astype(np.float32)
        for _ in range(2):
            mx.eval(*head_launch(x, nw, 1e-6, q, k, v, "cuda", tuning))
        print("profiled head", flush=True)
    return 0


def _rows(text: str) -> list[dict[str, str]]:
    start = text.find('"ID"')
    return list(csv.DictReader(io.StringIO(text[start:]))) if start >= 0 else []


def main(argv: list[str] | None = None) -> int:
    from bench.common import bounded_run, cli, record

    ap = cli.parser("launch_profile", __doc__)
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma list of {FORMATS}")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds allowed the whole ncu run")
    ap.add_argument("--tuning", default="", help="KernelTuning fields as name=value,... (default: its defaults)")
    ap.add_argument("--head", action="store_true", help="also Bonsai-27B's head launch (bf16)")
    ap.add_argument(
        "--one-launch",
        action="store_true",
        help="also each format's tail as one launch (workbench.kernels.one_launch): its single-shot time",
    )
    ap.add_argument(
        "--stalls",
        action="store_true",
        help="also the warp scheduler's figures: stall reasons, issue slots busy, FMA/ALU pipes busy",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    formats = cli.comma_list(ap, "--formats", a.formats, FORMATS)
    try:
        tuning_of(a.tuning)
    except ValueError as e:
        ap.error(str(e))
    if not (math.isfinite(a.timeout) and a.timeout > 0):  # bench.common.cli is imported under __main__ only
        ap.error(f"--timeout must be a finite number > 0; got {a.timeout}")
    if a.child:
        return _child(formats, a.tuning, a.head, a.one_launch)
    exe = shutil.which("ncu")
    if exe is None:
        print("ncu (Nsight Compute) is not on PATH")
        return 2
    prov = record.provenance("launch_profile", argv)
    started = _dt.datetime.fromisoformat(prov["date"])
    metrics = METRICS + (STALL_METRICS if a.stalls else ())
    cmd = (
        [
            exe,
            "--kernel-name",
            "regex:fat_",
            "--metrics",
            ",".join(metrics),
            "--csv",
            "--print-units",
            "base",
            sys.executable,
            "-m",
            "bench.launch_profile",
            "--child",
            "--formats",
            ",".join(formats),
            "--tuning",
            a.tuning,
        ]
        + (["--head"] if a.head else [])
        + (["--one-launch"] if a.one_launch else [])
    )
    try:
        # run_bounded, not subprocess.run: at the limit ncu's Python child must stop too
        # (bench/common/bounded_run.py says what an orphaned one cost)
        p = bounded_run.run_bounded(cmd, timeout=a.timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        print(
            f"ncu did not finish within --timeout {a.timeout:g} s; it and its child were stopped, "
            f"no record written. Its output's tail:\n{(e.output or '')[-2000:]}"
        )
        return 1
    rows = _rows(p.stdout)
    per: dict[int, dict[str, Any]] = {}
    for row in rows:
        e = per.setdefault(int(row["ID"]), {"kernel": row["Kernel Name"].split("(")[0]})
        try:
            e[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
        except ValueError:
            e[row["Metric Name"]] = row["Metric Value"]
    launches = [per[k] for k in sorted(per)]
    table = []
    # Six launches a format (a warm-up tail, then the measured tail), in the child's order,
    # eight with --one-launch (then its warm-up and measured launch); then two head
    # launches (warm-up, measured) with --head.
    per_format = 8 if a.one_launch else 6
    picks = [
        (fmt, launches[per_format * i + 3 : per_format * i + (8 if a.one_launch else 6)])
        for i, fmt in enumerate(formats)
    ]
    picks = [(fmt, chosen[:3] + chosen[4:]) for fmt, chosen in picks]  # the one launch's warm-up left out
    if a.head:
        picks.append(("bfloat16", launches[per_format * len(formats) + 1 : per_format * len(formats) + 2]))
    for fmt, chosen in picks:
        for e in chosen:
            ns = e.get("gpu__time_duration.sum", float("nan"))
            rd = e.get("dram__bytes_read.sum", float("nan"))
            table.append(
                {
                    "format": fmt,
                    "kernel": e["kernel"],
                    "ms": ns / 1e6,
                    "dram_read_MB": rd / 1e6,
                    "l2_MB": e.get("lts__t_bytes.sum", float("nan")) / 1e6,
                    "read_TBps": rd / ns / 1e3 if ns else None,
                    "dram_pct_peak": e.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
                    "sm_pct_peak": e.get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
                    "occupancy_pct": e.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
                    "registers": e.get("launch__registers_per_thread"),
                    "grid": e.get("launch__grid_size"),
                    "block": e.get("launch__block_size"),
                    **({"scheduler": stall_summary(e)} if a.stalls else {}),
                }
            )
    print(
        f"{'format':<10}{'kernel':<34}{'ms':>8}{'MB read':>9}{'L2 MB':>8}{'TB/s':>7}{'DRAM%':>7}{'SM%':>6}"
        f"{'occ%':>6}{'regs':>6}"
    )
    for t in table:
        print(
            f"{t['format']:<10}{t['kernel'][:33]:<34}{t['ms']:>8.4f}{t['dram_read_MB']:>9.1f}{t['l2_MB']:>8.1f}"
            f"{(t['read_TBps'] or 0):>7.2f}{(t['dram_pct_peak'] or 0):>7.1f}{(t['sm_pct_peak'] or 0):>6.1f}"
            f"{(t['occupancy_pct'] or 0):>6.1f}{(t['registers'] or 0):>6.0f}"
        )
    if a.stalls:
        print(
            f"\n{'format':<10}{'kernel':<34}{'issue%':>7}{'cyc/ins':>8}{'FMA%':>6}{'ALU%':>6}{'M ALU':>7}"
            f"{'M FMA':>7}  top stalls (cycles an issued instruction)"
        )
        for t in table:
            sc = t["scheduler"]
            by_pipe = sc["instructions_by_pipe"]
            print(
                f"{t['format']:<10}{t['kernel'][:33]:<34}{(sc['issue_active_pct'] or 0):>7.1f}"
                f"{(sc['cycles_per_issue'] or 0):>8.2f}{(sc['fma_pipe_pct'] or 0):>6.1f}"
                f"{(sc['alu_pipe_pct'] or 0):>6.1f}{(by_pipe['alu'] or 0) / 1e6:>7.2f}"
                f"{(by_pipe['fma'] or 0) / 1e6:>7.2f}  " + ", ".join(f"{r} {v:.2f}" for r, v in sc["top_stalls"])
            )
    rec = {
        "what": "each tail launch once under Nsight Compute (single shot, caches flushed)",
        **prov,
        "ncu_command": " ".join(cmd),
        "returncode": p.returncode,
        "table": table,
        "launches": launches,
        "output_tail": (p.stdout + p.stderr)[-3000:] if not table else p.stderr[-1500:],
    }
    if not a.no_record:
        device = prov["device"].get("device_name", "gpu")
        record.write(rec, a.out_dir, record.record_stem("launch_profile", device, started), force=a.force)
    return 0 if table else 1


if __name__ == "__main__":
    from bench.common import cli

    sys.exit(cli.run(main, prog="python -m bench.launch_profile"))
