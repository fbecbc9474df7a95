"""The Metal emulator's cost a launch: the project's fused tail (three Metal launches) run on
the CPU by the emulator, at the test shape (frink-models' seed case), beside the graph tail.

The target is <= 3 ms an emulated tail; the table gives the median, minimum and 90th
percentile of each, timed in interleaved rounds (``bench.common.record.time_rounds``), and
the emulated tail's ratio to the graph tail. The first emulated call (which generates and
compiles the sources, or verifies and loads them from the compile cache) is reported apart
as the cold cost.
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
import numpy as np

from bench.common import record
from workbench import fused_tail, seed_case
from workbench.kernels import metal_emulation
from workbench.kernels.emulated import emulated_tail
from workbench.tail.paths import tail_launch

TARGET_MS = 3.0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = record.parser("emulator_cost", __doc__)
    p.add_argument("--n", type=int, default=20, help="timed rounds")
    p.add_argument("--order", default="ascending", choices=metal_emulation.ORDERS, help="the emulator's thread order")
    args = p.parse_args(argv)
    if args.n < 3:
        p.error(f"--n must be >= 3, got {args.n}")
    c = seed_case()
    launch = tail_launch(c.weights)

    def emulated() -> None:
        emulated_tail(launch, c.branch, c.residual, order=args.order)

    def graph() -> None:
        mx.eval(fused_tail(c.weights, c.branch, c.residual, backend="graph"))

    t0 = time.perf_counter()
    emulated()
    cold = (time.perf_counter() - t0) * 1e3
    times = record.time_rounds({"metal-emulated": emulated, "graph": graph}, args.n, warmup=2)
    rows = [{"path": k, **record.summarize(v)} for k, v in times.items()]
    ratio = rows[0]["median_ms"] / rows[1]["median_ms"]
    print(f"{'path':<16} {'median ms':>10} {'min ms':>8} {'p90 ms':>8}")
    for r in rows:
        print(f"{r['path']:<16} {r['median_ms']:>10.3f} {r['min_ms']:>8.3f} {r['p90_ms']:>8.3f}")
    print(f"emulated / graph: {ratio:.1f}x; target {TARGET_MS} ms a tail: "
          f"{'met' if rows[0]['median_ms'] <= TARGET_MS else 'NOT met'}; first call {cold:.1f} ms")
    rec = {**record.provenance("emulator_cost", argv), "what": "the fused tail emulated on the CPU vs the graph tail, "
           "frink-models' seed case", "target_ms": TARGET_MS, "cold_ms": cold, "ratio": ratio, "results": rows}
    if not args.no_record:
        record.write(rec, args.out_dir, record.record_stem("emulator_cost"), force=args.force)
    return rec


if __name__ == "__main__":
    main()
