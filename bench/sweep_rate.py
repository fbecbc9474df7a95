"""Throughput of ``workbench.studies.sweeps.sweep``: cases a second, against a 60 s budget.

    python -m bench.sweep_rate                     # 100,000 seeds, float32, no fold
    python -m bench.sweep_rate --seeds 20000 --configs f32,f32-b16,bf16-b16,nvfp4-b16

The target: ``sweep(shapes=[(64, 96, 80)], seeds=range(100_000))`` in at most 60 s on a 2-core machine, so a
tolerance can be calibrated on 100,000 cases in a notebook's run. Prints cases/s and the seconds 100,000 cases
would take, and writes ``data/bench/sweep_rate-<device>-<UTC time>.json``: speed is never asserted in a test;
the record is the evidence. ``--twins N`` also times each workbench path beside its plain numpy twin and the
machine's limit (``bench.common.twin_rates``); ``--bonsai N`` notebook 03's Bonsai-27B float64 path beside its
twin, each round in a fresh process (``--no-sweeps`` skips the sweeps); ``--calibrate`` records each
configuration's calibrated tolerance (flake rate 1e-6 a case); ``--mutations N`` adds every mutation's catch
rate on N fresh seeds.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bench.common import cli, record, twin_rates
from workbench.studies import CASE_BLOCK, REFERENCE_TOLERANCES, calibrate_tolerance, catch_rates, mutation_sweep, sweep

#: name -> (shape, dtype, fold, quantize); quantized ones need in-dims divisible by 64.
CONFIGS: dict[str, tuple[tuple[int, int, int], str, Any, Any]] = {
    "f32": ((64, 96, 80), "float32", None, None),
    "f32-b16": ((64, 96, 80), "float32", 16, None),
    "f16": ((64, 96, 80), "float16", None, None),
    "f16-b16": ((64, 96, 80), "float16", 16, None),
    "bf16": ((64, 96, 80), "bfloat16", None, None),
    "bf16-b16": ((64, 96, 80), "bfloat16", 16, None),
    "affine4-b16": ((64, 128, 128), "float32", 16, "affine4"),
    "affine8-b16": ((64, 128, 128), "float32", 16, "affine8"),
    "mxfp4-b16": ((64, 128, 128), "float32", 16, "mxfp4"),
    "nvfp4-b16": ((64, 128, 128), "float32", 16, "nvfp4"),
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = cli.parser("sweep_rate", __doc__)
    p.add_argument("--seeds", type=int, default=100_000, help="cases per configuration")
    p.add_argument("--configs", default="f32", help=f"comma-separated, of {sorted(CONFIGS)}")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bars (tqdm)")
    p.add_argument("--calibrate", action="store_true", help="calibrate a tolerance per configuration (1e-6/case)")
    p.add_argument("--mutations", type=int, default=0, help="catch rates on this many fresh seeds (0: none)")
    p.add_argument("--tag", default="", help="appended to the record's file name")
    p.add_argument(
        "--twins",
        type=int,
        default=0,
        help="also time each workbench path beside its plain numpy twin and the machine's limit, the "
        "sweep over this many blocks of 256 cases (0: none)",
    )
    p.add_argument(
        "--sweeps",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time the sweeps of --configs (--no-sweeps: only the --twins / --bonsai rows)",
    )
    p.add_argument(
        "--bonsai",
        type=int,
        default=0,
        help="also run notebook 03's Bonsai-27B float64 path beside its numpy twin, this many rounds, "
        "each in a fresh process (0: none)",
    )
    args = p.parse_args(argv)
    names = cli.comma_list(p, "--configs", args.configs, CONFIGS)
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    if args.bonsai < 0:
        p.error(f"--bonsai must be >= 0 (0: none); got {args.bonsai}")
    if args.twins < 0:
        p.error(f"--twins must be >= 0 (0: none); got {args.twins}")
    if args.mutations < 0:
        p.error(f"--mutations must be >= 0 (0: none); got {args.mutations}")

    if not args.sweeps:
        names = []
    else:
        sweep(shapes=[(64, 96, 80)], seeds=range(8), progress=False)  # warm up (imports, first graphs)
    rows = []
    if names:
        print(
            f"{'config':<12} {'shape':<14} {'cases':>8} {'seconds':>8} {'cases/s':>9} "
            f"{'s per 100k':>10} {'max worst':>11}"
        )
    for name in names:
        shape, dtype, fold, quant = CONFIGS[name]
        t0 = time.perf_counter()
        df = sweep(
            shapes=[shape],
            seeds=range(args.seeds),
            dtypes=(dtype,),
            folds=(fold,),
            quantize=(quant,),
            progress=args.progress,
        )
        dt = time.perf_counter() - t0
        rate = len(df) / dt
        row = {
            "config": name,
            "shape": list(shape),
            "dtype": dtype,
            "fold": fold,
            "quantize": quant,
            "cases": len(df),
            "seconds": dt,
            "cases_per_s": rate,
            "s_per_100k": 1e5 / rate,
            "max_worst": float(df.worst.max()),
        }
        if args.calibrate:
            t = calibrate_tolerance(df.worst.to_numpy(), flake_rate=1e-6)
            row["calibrated"] = {
                "value": t.value,
                "low": t.low,
                "high": t.high,
                "recommended": t.recommended,
                "xi": t.xi,
                "threshold": t.threshold,
                "n_tail": t.n_tail,
                "observed_max": t.observed_max,
                "flake_rate": t.flake_rate,
                "method": t.method,
                "degenerate": t.degenerate,
            }
        rows.append(row)
        print(
            f"{name:<12} {str(shape):<14} {len(df):>8} {dt:>8.2f} {rate:>9.0f} {1e5 / rate:>10.1f} "
            f"{row['max_worst']:>11.3g}",
            flush=True,
        )
        if args.calibrate:
            print(f"{'':<12} calibrated: {t}", flush=True)

    catch = None
    if args.mutations:
        tols = dict(REFERENCE_TOLERANCES)
        f32 = next((r for r in rows if r["config"] == "f32-b16" and "calibrated" in r), None)
        if f32 is not None:
            tols["calibrated f32-b16"] = ("worst", f32["calibrated"]["recommended"])
        mu = mutation_sweep(
            shapes=[(64, 96, 80)], seeds=range(10**7, 10**7 + args.mutations), folds=(None, 16), progress=args.progress
        )
        rates = catch_rates(mu, tols)
        print(rates.round(4).to_string())
        catch = {
            "seeds": f"range({10**7}, {10**7 + args.mutations})",
            "folds": ["none", "b16"],
            "rates": {m: {k: float(v) for k, v in r.items()} for m, r in rates.iterrows()},
            "tolerances": {k: list(v) for k, v in tols.items()},
        }

    rec = {
        **record.provenance("sweep_rate", argv),
        "target": "sweep(shapes=[(64, 96, 80)], seeds=range(100_000)) in <= 60 s on 2 cores",
        "notes": (
            "wall time of sweeps.sweep per configuration (graph backend, blocks of "
            f"{CASE_BLOCK} cases, float64 truth via tail.tail_np, fused via tail.tail_mx); "
            "the machine was shared with other developers' jobs (see load average)"
        ),
        "results": rows,
        "mutation_catch_rates": catch,
    }
    lim = None
    if args.twins:
        rec["twins"] = twin_rates.measure(args.twins)
        twin_rates.print_table(rec["twins"])
        lim = rec["twins"]["limits"]
    if args.bonsai:
        rec["bonsai"] = twin_rates.bonsai(args.bonsai, lim if lim is not None else twin_rates.limits())
        twin_rates.print_bonsai(rec["bonsai"])
    if not args.no_record:
        record.write(rec, args.out_dir, record.record_stem("sweep_rate", tag=args.tag), force=args.force)
    return rec


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.sweep_rate"))
