"""Time the unfused tail (two waits) against the fused graph (one wait), side by side.

    python -m bench.tail_bench                      # seed shape and Bonsai-27B, bf16
    python -m bench.tail_bench --shapes seed        # just frink-models' shape (seconds)

For each shape, interleaved round by round (so a shared machine's drift hits every variant alike):
``unfused`` (:func:`workbench.tail.unfused_tail`, numpy in and out: wo, then add and norm on the host, then the
FFN: two waits), ``fused`` (:func:`workbench.tail.fused_tail`, ``backend="graph"``: one wait) and
``fused_resident`` (the same graph, inputs already MLX arrays, the launch built once: what a kernel launch
inside an engine costs). Prints medians, unfused / fused, the weight bytes and the floor (weight bytes over
this device's measured copy bandwidth); waits are counted with :func:`workbench.count_waits` outside the timed
loop. Writes ``data/bench/tail_bench-<device>-<UTC time>.json`` unless ``--no-record``. Needs only numpy and
MLX (``PYTHONPATH=.`` from a checkout where the project is not installed).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from bench.common import cli, record, timing
from workbench import backends, tail
from workbench.models import BONSAI_SHAPE
from workbench.tail import SEED_SHAPE, compare
from workbench.waits import count_waits

#: (name, (hidden, branch, ffn), fold block): Bonsai folds wo's input with block 1024
#: (after Layr-Labs' Bonsai-27B port notes, docs/bonsai2-27b-port-notes.md of
#: Layr-Labs/mlxfast-bonsai2-27b-engine); frink-models' test case with block 16.
SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    "seed": (SEED_SHAPE, 16),
    "bonsai27b": (BONSAI_SHAPE, 1024),
}

VARIANTS = ("unfused", "fused", "fused_resident")


def bench_shape(name: str, dtype: str, repeats: int, warmup: int, seed: int, bandwidth: float) -> dict[str, Any]:
    (hidden, branch, ffn), block = SHAPES[name]
    w = tail.TailWeights.random(hidden, branch, ffn, seed=seed, fold_block=block, dtype=dtype)
    br, res = tail.random_inputs(w, seed=seed + 1)

    launch = tail.tail_launch(w)
    br_mx, res_mx = mx.array(br), mx.array(res)
    mx.eval(br_mx, res_mx)

    fns: dict[str, Callable[[], Any]] = {
        "unfused": lambda: tail.unfused_tail(w, br, res),
        "fused": lambda: tail.fused_tail(w, br, res, backend="graph"),
        "fused_resident": lambda: mx.eval(tail.tail_graph(launch, br_mx, res_mx)),
    }
    waits = {}
    for k, fn in fns.items():
        with count_waits() as n:
            fn()
        waits[k] = n.n
    agreement = compare(tail.fused_tail(w, br, res, backend="graph"), tail.unfused_tail(w, br, res))

    times = timing.time_rounds(fns, repeats, warmup, desc=f"{name} rounds")
    variants = {k: {**timing.summarize(ts), "waits": waits[k]} for k, ts in times.items()}
    floor_ms = w.nbytes / bandwidth * 1e3
    return {
        "shape": name,
        "hidden": hidden,
        "branch": branch,
        "ffn": ffn,
        "dtype": dtype,
        "fold_block": block,
        "weight_bytes": int(w.nbytes),
        "floor_ms": floor_ms,
        "variants": variants,
        "ratio_unfused_over_fused": variants["unfused"]["median_ms"] / variants["fused"]["median_ms"],
        # the ratio of the fastest runs: less hurt by other load on a shared machine
        "ratio_unfused_over_fused_min": variants["unfused"]["min_ms"] / variants["fused"]["min_ms"],
        "saved_ms": variants["unfused"]["median_ms"] - variants["fused"]["median_ms"],
        "fused_resident_over_floor": variants["fused_resident"]["median_ms"] / floor_ms,
        "fused_vs_unfused": str(agreement),
        "fused_vs_unfused_passed": bool(agreement.passed),
    }


def print_table(rows: list[dict[str, Any]], bandwidth: float) -> None:
    print(
        f"copy bandwidth here: {bandwidth / 1e9:.1f} GB/s (floor = weight bytes / this); "
        "times are medians in ms, (min) = the ratio of the fastest runs"
    )
    head = (
        f"{'shape':<10} {'dtype':<9} {'weights':>10} {'floor ms':>9} {'unfused ms':>11} {'fused ms':>9} "
        f"{'resident ms':>12} {'unf/fused':>9} {'(min)':>6} {'waits':>7}  agree"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        v = r["variants"]
        waits = f"{v['unfused']['waits']}/{v['fused']['waits']}"
        print(
            f"{r['shape']:<10} {r['dtype']:<9} {r['weight_bytes'] / 1e6:>8.2f}MB {r['floor_ms']:>9.4f} "
            f"{v['unfused']['median_ms']:>11.4f} {v['fused']['median_ms']:>9.4f} "
            f"{v['fused_resident']['median_ms']:>12.4f} {r['ratio_unfused_over_fused']:>9.2f} "
            f"{r['ratio_unfused_over_fused_min']:>6.2f} {waits:>7}  "
            f"{'PASS' if r['fused_vs_unfused_passed'] else 'FAIL'}"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = cli.parser("tail_bench", __doc__)
    p.add_argument("--shapes", default="seed,bonsai27b", help=f"comma-separated, of {sorted(SHAPES)}")
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["float32", "float16", "bfloat16"],
        help="the weights' dtype (activations are float32 always)",
    )
    p.add_argument("--repeats", type=int, default=100, help="timed rounds for small shapes")
    p.add_argument(
        "--large-repeats",
        type=int,
        default=None,
        help="timed rounds for Bonsai-size shapes (None: 100 on a GPU, 5 on a CPU)",
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    p.add_argument(
        "--bandwidth-gbps",
        type=float,
        default=None,
        help="use this bandwidth for the floor instead of measuring a copy (None: measure)",
    )
    args = p.parse_args(argv)

    shapes = cli.comma_list(p, "--shapes", args.shapes, SHAPES)
    for flag in ("repeats", "warmup"):
        if getattr(args, flag) < (1 if flag == "repeats" else 0):
            p.error(f"--{flag} must be >= {1 if flag == 'repeats' else 0}")
    cli.at_least(p, "--seed", args.seed, 0)
    on_gpu = backends.cuda_available() or backends.metal_available()
    large_repeats = args.large_repeats if args.large_repeats is not None else (100 if on_gpu else 5)
    if large_repeats < 1:
        p.error("--large-repeats must be >= 1")

    if args.bandwidth_gbps is not None and not (math.isfinite(args.bandwidth_gbps) and args.bandwidth_gbps > 0):
        p.error(f"--bandwidth-gbps must be a finite number > 0, got {args.bandwidth_gbps}")
    bandwidth = args.bandwidth_gbps * 1e9 if args.bandwidth_gbps is not None else timing.copy_bandwidth()
    rows = []
    for name in shapes:
        large = SHAPES[name][0][0] >= 1024
        reps = large_repeats if large else args.repeats
        print(f"[{name}] building weights and inputs, then {reps} rounds", file=sys.stderr, flush=True)
        rows.append(bench_shape(name, args.dtype, reps, args.warmup, args.seed, bandwidth))
        print(f"[{name}] done", file=sys.stderr, flush=True)
    print_table(rows, bandwidth)

    rec = {
        **record.provenance("tail_bench", argv),
        "backends_available": backends.available_backends(),
        "copy_bandwidth_GBps": bandwidth / 1e9,
        "bandwidth_measured": args.bandwidth_gbps is None,
        "copy_method": timing.copy_method() if args.bandwidth_gbps is None else "given as --bandwidth-gbps",
        "notes": (
            "medians over interleaved rounds; unfused = wo submission + host add/norm + FFN submission "
            "(numpy in/out); fused = one MLX graph evaluated once (numpy in/out); fused_resident = the graph "
            "alone, inputs already MLX arrays; floor = weight bytes / copy bandwidth; waits counted by "
            "workbench.count_waits"
        ),
        "results": rows,
    }
    if not args.no_record:
        record.write(rec, args.out_dir, record.record_stem("tail_bench"), force=args.force)
    return rec


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.tail_bench"))
