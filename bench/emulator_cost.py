"""The Metal emulator's cost a launch: the project's fused tail (three Metal launches) run on
the CPU by the emulator, at the test shape (frink-models' seed case), beside the graph tail:
in the backend's default (``order="default"``: two schedules (SIMD-groups in step, and apart), each
launch's bits compared, which catches races) and in one schedule alone (``--order``).

The target is <= 3 ms an emulated tail; the table gives the median, minimum and 90th
percentile of each, timed in interleaved rounds (``bench.common.timing.time_rounds``), and
the emulated tail's ratio to the graph tail. On a machine others share, wall time mostly
measures the others: the CPU time this process spends a tail (``time.process_time``, every
thread of it, over ``--n`` more calls of each) is given beside it, and the emulated tail's
CPU time per emulated GPU thread (the three launches' grids). The first emulated call (which generates and
compiles the sources, or verifies and loads them from the compile cache) is reported apart
as the cold cost, and the device buffers mapped during the timed rounds are counted (the
emulator keeps them from launch to launch: none once the first tails have run).

The cost of rounding half arithmetic at every operation (the stand-in header's native half:
each operation a float operation and a software rounding, runtime.c's ``__gnu_f2h_ieee``)
is timed beside it: a user-style kernel of 32 dependent half multiply-adds a thread over
4,096 threads through ``workbench.metal_kernel`` (one schedule), against the same kernel
text with ``float`` for ``half`` (``half_vs_float_cpu``; the tail itself does no half
arithmetic, it only converts halves, so its cost does not move with it).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import mlx.core as mx

from bench.common import cli, record, timing
from workbench import fused_tail, metal_kernel, seed_case
from workbench.kernels import DEFAULT_ORDER, DEFAULT_SCHEDULES, SCHEDULES, buffers_mapped, emulated_tail, prepared
from workbench.tail import tail_launch

TARGET_MS = 3.0

#: The half-arithmetic kernel (T: half, or float for the baseline): 32 dependent multiply-adds
#: a thread, each two roundings in half.
CHAIN = """
uint i = thread_position_in_grid.x;
T a = T(x[i]), b = T(0.999f);
for (int k = 0; k < 32; ++k) a = a * b + T(0.001f);
out[i] = float(a);
"""
CHAIN_THREADS = 4096


def _chain(kind: str):
    """A call of the chain kernel computing in ``kind`` (``half`` or ``float``)."""
    kernel = metal_kernel(name=f"chain_{kind}", input_names=["x"], output_names=["out"], source=CHAIN)
    x = mx.arange(CHAIN_THREADS, dtype=mx.float32) / CHAIN_THREADS

    def call() -> None:
        kernel(
            inputs=[x],
            template=[("T", mx.float16 if kind == "half" else mx.float32)],
            grid=(CHAIN_THREADS, 1, 1),
            threadgroup=(256, 1, 1),
            output_shapes=[(CHAIN_THREADS,)],
            output_dtypes=[mx.float32],
            order="ascending",
        )

    return call


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = cli.parser("emulator_cost", __doc__)
    p.add_argument("--n", type=int, default=20, help="timed rounds")
    p.add_argument(
        "--order",
        default="ascending",
        choices=SCHEDULES,
        help="the one schedule timed beside the default pair (thread order; SIMD-groups in step or apart)",
    )
    args = p.parse_args(argv)
    if args.n < 3:
        p.error(f"--n must be >= 3, got {args.n}")
    c = seed_case()
    launch = tail_launch(c.weights)

    def emulated() -> None:
        emulated_tail(launch, c.branch, c.residual, order=DEFAULT_ORDER)

    def one_schedule() -> None:
        emulated_tail(launch, c.branch, c.residual, order=args.order)

    def graph() -> None:
        mx.eval(fused_tail(c.weights, c.branch, c.residual, backend="graph"))

    t0 = time.perf_counter()
    emulated()
    cold = (time.perf_counter() - t0) * 1e3
    one = f"emulated {args.order}"
    paths = {"metal-emulated": emulated, one: one_schedule, "graph": graph}
    paths |= {"half chain (per-op rounding)": _chain("half"), "float chain": _chain("float")}
    for k in ("half chain (per-op rounding)", "float chain"):
        paths[k]()  # compiled and its buffers mapped before the count below, as the tail's were
    mapped = buffers_mapped()
    times = timing.time_rounds(paths, args.n, warmup=2)
    mapped = buffers_mapped() - mapped  # after the warm-up's first tails: 0 expected
    rows = [{"path": k, **timing.summarize(v)} for k, v in times.items()]
    for r in rows:
        c0 = time.process_time()
        for _ in range(args.n):
            paths[r["path"]]()
        r["cpu_ms"] = (time.process_time() - c0) * 1e3 / args.n
    threads = sum(int(call.kw["grid"][0]) for call in prepared(launch, "metal", None).calls().values())
    ratio = rows[0]["median_ms"] / rows[2]["median_ms"]
    cpu_ratio = rows[0]["cpu_ms"] / rows[2]["cpu_ms"]
    default_cost = rows[0]["cpu_ms"] / rows[1]["cpu_ms"]
    print(f"{'path':<28} {'median ms':>10} {'min ms':>8} {'p90 ms':>8} {'CPU ms':>8}")
    for r in rows:
        print(f"{r['path']:<28} {r['median_ms']:>10.3f} {r['min_ms']:>8.3f} {r['p90_ms']:>8.3f} {r['cpu_ms']:>8.3f}")
    print(
        f"default ({' + '.join(DEFAULT_SCHEDULES)}, compared) / one schedule ({args.order}): "
        f"{default_cost:.2f}x CPU, {rows[0]['median_ms'] / rows[1]['median_ms']:.2f}x wall"
    )
    print(
        f"emulated / graph: {ratio:.1f}x wall, {cpu_ratio:.1f}x CPU; target {TARGET_MS} ms a tail: "
        f"{'met' if rows[0]['median_ms'] <= TARGET_MS else 'NOT met'}; first call {cold:.1f} ms"
    )
    half_cost = rows[3]["cpu_ms"] / rows[4]["cpu_ms"]
    print(f"half arithmetic rounded at every operation / the same kernel in float: {half_cost:.2f}x CPU")
    print(
        f"{threads} emulated GPU threads a tail: {rows[0]['cpu_ms'] * 1e3 / threads:.2f} us of CPU a thread; "
        f"device buffers mapped over the timed tails: {mapped}"
    )
    rec = {
        **record.provenance("emulator_cost", argv),
        "what": "the fused tail emulated on the CPU (default schedules and one) vs the graph tail, "
        "frink-models' seed case; and a half-arithmetic kernel vs the same in float",
        "target_ms": TARGET_MS,
        "cold_ms": cold,
        "ratio": ratio,
        "cpu_ratio": cpu_ratio,
        "default_schedules": list(DEFAULT_SCHEDULES),
        "one_schedule": args.order,
        "default_vs_one_cpu": default_cost,
        "half_vs_float_cpu": half_cost,
        "chain_threads": CHAIN_THREADS,
        "threads_per_tail": threads,
        "buffers_mapped_timed": mapped,
        "results": rows,
    }
    if not args.no_record:
        record.write(rec, args.out_dir, record.record_stem("emulator_cost"), force=args.force)
    return rec


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.emulator_cost"))
