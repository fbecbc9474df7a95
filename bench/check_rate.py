"""Speed of ``workbench.check.check_kernel``: 10,000 cases at the test shape through a numpy
callable, beside the workbench's own graph sweep of the same cases in the same run.

The target: 10,000 cases at (64, 96, 80), fold block 16, input scale 1, in <= 30 s on 2
cores. The user's callable runs one case a call (one weight set a call, as a kernel
takes it); the check's own work (stored weights, float64 truth, graph reference) runs a
block of cases at a time (``workbench.check.blocks``), as ``sweeps.sweep`` does for the
same cases, so the ratio is what checking a foreign implementation costs over the
workbench's batched study of its own.

    python -m bench.check_rate                 # 10,000 cases, no fault models
    python -m bench.check_rate --cases 2000 --faults
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from bench.common import cli, record
from workbench.check import check_kernel
from workbench.studies import sweep

SHAPE = (64, 96, 80)


def numpy_tail(case):
    """A plain numpy float32 tail, written here as a user would (the callable under test)."""
    x = np.asarray(case.branch, np.float32)
    if case.fold is not None:
        x = case.fold.rotate(x).astype(np.float32)
    h = case.residual + case.wo.dense() @ x
    n = h / np.sqrt(np.float32(np.dot(h, h) / h.size) + np.float32(case.eps)) * case.ffn_norm
    g, u = case.gate.dense() @ n, case.up.dense() @ n
    return h + case.down.dense() @ (g / (1 + np.exp(-g)) * u)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = cli.parser("check_rate", __doc__)
    p.add_argument("--cases", type=int, default=10_000, help="cases (seeds) to check")
    p.add_argument("--faults", action="store_true", help="also run every fault model on every case")
    p.add_argument("--tag", default="", help="appended to the record's file name")
    args = p.parse_args(argv)
    if args.cases < 100:
        p.error("--cases must be >= 100 (the calibration needs 100 errors)")
    seeds = range(args.cases)
    check_kernel(numpy_tail, seeds=range(100), scales=(1.0,), faults=())  # warm up
    t0 = time.perf_counter()
    rep = check_kernel(numpy_tail, seeds=seeds, scales=(1.0,), folds=(16,), **({} if args.faults else {"faults": ()}))
    t_check = time.perf_counter() - t0
    t0 = time.perf_counter()
    sweep(shapes=[SHAPE], seeds=seeds, folds=(16,), progress=False)
    t_sweep = time.perf_counter() - t0
    print(f"{'variant':<34} {'cases':>7} {'seconds':>8} {'cases/s':>8} {'ratio':>6}")
    print(
        f"{'check_kernel(numpy callable)':<34} {args.cases:>7} {t_check:>8.2f} {args.cases / t_check:>8.0f} "
        f"{t_check / t_sweep:>6.1f}"
    )
    print(
        f"{'sweeps.sweep (graph, batched)':<34} {args.cases:>7} {t_sweep:>8.2f} {args.cases / t_sweep:>8.0f} "
        f"{1.0:>6.1f}"
    )
    print(f"verdict: {'PASS' if rep.passed else 'FAIL'}")
    rec = {
        **record.provenance("check_rate", argv),
        "target": "10,000 cases at (64, 96, 80) through a numpy callable in <= 30 s on 2 cores",
        "notes": "wall time; the machine was shared with other developers' jobs",
        "results": {
            "cases": args.cases,
            "faults": bool(args.faults),
            "check_s": t_check,
            "sweep_s": t_sweep,
            "ratio": t_check / t_sweep,
            "verdict": rep.passed,
        },
    }
    if not args.no_record:
        record.write(rec, args.out_dir, record.record_stem("check_rate", tag=args.tag), force=args.force)
    return rec


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.check_rate"))
