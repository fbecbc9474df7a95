"""Rate of ``check_kernel`` on a Dask ``LocalCluster`` of two single-threaded workers on this
machine, beside one serial process at one thread and at its default threads, at (2048, 2048,
8192), the same results bit for bit; and the wall time 10,000 Bonsai-27B seeds would take, here
and on N such machines, projected from the measured rates.

The subject is a plain numpy float32 tail (as a user writes one; importable, so it runs in a
process of its own in every variant). Each serial variant runs in a fresh child process whose
BLAS and OpenMP pools are set by the environment before numpy loads (``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` = 1, or unset: the library's default, every
core); the cluster's workers are ``cluster_client``'s (spawned, one thread, the same variables
at 1). Each variant is warmed up on a small check first (imports, the subject's process), and
its time is the check call alone; best of ``--repeats``, interleaved, with the load average
before each run (the machine is shared: the note says how loaded it was).

    python -m bench.check_cluster                          # 8 seeds, best of 2, 1 Bonsai seed
    python -m bench.check_cluster --seeds 4 --repeats 1 --bonsai-seeds 0
"""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import cli, record
from workbench.check import check_kernel, cluster_client

SHAPE = (2048, 2048, 8192)
BONSAI = (5120, 6144, 17408)
WARM = {"shapes": [(64, 96, 80)], "seeds": range(2), "scales": (1.0,), "faults": ()}
THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
PROJECTED_SEEDS = 10_000


def numpy_tail(case):
    """A plain numpy float32 tail, written here as a user would (the callable under test)."""
    x = np.asarray(case.branch, np.float32)
    if case.fold is not None:
        x = case.fold.rotate(x).astype(np.float32)
    h = case.residual + case.wo.dense() @ x
    n = h / np.sqrt(np.float32(np.dot(h, h) / h.size) + np.float32(case.eps)) * case.ffn_norm
    g, u = case.gate.dense() @ n, case.up.dense() @ n
    return h + case.down.dense() @ (g / (1 + np.exp(-g)) * u)


#: The memory budget of a Bonsai-27B case's check (one case needs about 5.5 GiB, past the
#: check's 4 GiB default).
BONSAI_BUDGET = 8 * 2**30


def _child(out: str, shape: tuple[int, int, int], seeds: int, budget: int, calls: int) -> None:
    """The serial check ``calls`` times in this process (the first in fresh memory, the next in
    memory the process has touched), their times and the last one's rows pickled to ``out``."""
    check_kernel(numpy_tail, **WARM)
    took = []
    for _ in range(calls):
        t0 = time.perf_counter()
        rep = check_kernel(numpy_tail, shapes=[shape], seeds=range(seeds), memory_budget=budget or None)
        took.append(time.perf_counter() - t0)
    got = {"seconds": took, "cases": rep.cases, "faults": rep.faults, "passed": rep.passed}
    Path(out).write_bytes(pickle.dumps(got))


def serial(
    shape: tuple[int, int, int], seeds: int, one_thread: bool, budget: int = 0, calls: int = 2
) -> dict[str, Any]:
    """The serial check in a fresh child process, its BLAS threads 1 or the default."""
    env = {k: v for k, v in os.environ.items() if k not in THREADS}
    if one_thread:
        env.update(dict.fromkeys(THREADS, "1"))
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "serial.pkl")
        code = "import sys; from bench.check_cluster import _child; a = sys.argv; "
        code += "_child(a[1], (*map(int, a[2:5]),), int(a[5]), int(a[6]), int(a[7]))"
        argv = [out, *map(str, shape), str(seeds), str(budget), str(calls)]
        subprocess.run([sys.executable, "-c", code, *argv], env=env, check=True)
        return pickle.loads(Path(out).read_bytes())


def on_cluster(client: Any, seeds: int, workers: int, calls: int = 2) -> dict[str, Any]:
    """The same check on ``client``'s workers, one shard of seeds a worker, ``calls`` times in
    freshly restarted worker processes (as the serial child: the first call in fresh memory)."""
    client.restart()
    check_kernel(numpy_tail, **WARM, client=client, shard_seeds=1)  # every worker imports once
    took = []
    for _ in range(calls):
        t0 = time.perf_counter()
        rep = check_kernel(
            numpy_tail, shapes=[SHAPE], seeds=range(seeds), client=client, shard_seeds=math.ceil(seeds / workers)
        )
        took.append(time.perf_counter() - t0)
    return {"seconds": took, "cases": rep.cases, "faults": rep.faults, "passed": rep.passed}


def same_bits(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same case and fault rows, bit for bit (NaN equal to NaN)."""
    import pandas as pd

    try:
        pd.testing.assert_frame_equal(a["cases"], b["cases"], check_exact=True)
        pd.testing.assert_frame_equal(a["faults"], b["faults"], check_exact=True)
    except AssertionError:
        return False
    return True


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = cli.parser("check_cluster", __doc__)
    p.add_argument("--seeds", type=int, default=8, help="seeds at (2048, 2048, 8192) a run (default 8)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each variant; the best is kept (default 2)")
    p.add_argument("--workers", type=int, default=2, help="single-threaded workers of the LocalCluster (default 2)")
    p.add_argument(
        "--bonsai-seeds", type=int, default=1, help="serial one-thread seeds at Bonsai-27B's shape (0: none)"
    )
    p.add_argument("--tag", default="", help="appended to the record's file name")
    args = p.parse_args(argv)
    for name in ("seeds", "repeats", "workers"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.bonsai_seeds < 0:
        p.error(f"--bonsai-seeds must be >= 0, got {args.bonsai_seeds}")
    t0 = time.perf_counter()
    client = cluster_client(workers=args.workers)
    started = time.perf_counter() - t0
    runs: dict[str, list[dict[str, Any]]] = {"serial_1_thread": [], "serial_default_threads": [], "cluster": []}
    try:
        for _ in range(args.repeats):
            for name, run in (
                ("serial_1_thread", lambda: serial(SHAPE, args.seeds, True)),
                ("serial_default_threads", lambda: serial(SHAPE, args.seeds, False)),
                ("cluster", lambda: on_cluster(client, args.seeds, args.workers)),
            ):
                load = os.getloadavg()[0]
                got = run()
                got["load_before"] = load
                runs[name].append(got)
                said = "  ".join(f"{t:7.2f} s {args.seeds / t:.3f} seeds/s" for t in got["seconds"])
                print(f"{name:<24} {said}  load {load:.2f}")
    finally:
        client.close()
    bits = all(same_bits(runs["serial_1_thread"][0], r) for rs in runs.values() for r in rs)
    # first calls (fresh memory) and later calls (memory touched before), each the best of the repeats
    rate = {k: args.seeds / min(r["seconds"][0] for r in v) for k, v in runs.items()}
    warm = {k: args.seeds / min(t for r in v for t in r["seconds"][1:]) for k, v in runs.items()}
    speedup = rate["cluster"] / rate["serial_1_thread"]
    results: dict[str, Any] = {
        "shape": list(SHAPE),
        "seeds": args.seeds,
        "repeats": args.repeats,
        "workers": args.workers,
        "cluster_start_s": started,
        "seconds": {k: [r["seconds"] for r in v] for k, v in runs.items()},
        "load_before": {k: [r["load_before"] for r in v] for k, v in runs.items()},
        "seeds_per_s": rate,
        "cluster_vs_serial_1_thread": speedup,
        "cluster_vs_serial_default_threads": rate["cluster"] / rate["serial_default_threads"],
        "warm_seeds_per_s": warm,
        "warm_cluster_vs_serial_1_thread": warm["cluster"] / warm["serial_1_thread"],
        "warm_cluster_vs_serial_default_threads": warm["cluster"] / warm["serial_default_threads"],
        "same_bits": bits,
        "verdicts": {k: all(r["passed"] for r in v) for k, v in runs.items()},
    }
    print(
        f"cluster / serial at 1 thread: {speedup:.2f}x; / serial at its default threads: "
        f"{results['cluster_vs_serial_default_threads']:.2f}x (first calls); "
        f"{results['warm_cluster_vs_serial_1_thread']:.2f}x, {results['warm_cluster_vs_serial_default_threads']:.2f}x "
        f"(second calls); same bits: {bits}"
    )
    if args.bonsai_seeds:
        load = os.getloadavg()[0]
        b = serial(BONSAI, args.bonsai_seeds, True, BONSAI_BUDGET, calls=1)
        per_seed = b["seconds"][0] / args.bonsai_seeds
        here = PROJECTED_SEEDS * per_seed / speedup
        results["bonsai"] = {
            "shape": list(BONSAI),
            "seeds": args.bonsai_seeds,
            "serial_1_thread_s_a_seed": per_seed,
            "load_before": load,
            "projected_seeds": PROJECTED_SEEDS,
            "projected_hours_serial_1_thread": PROJECTED_SEEDS * per_seed / 3600,
            "projected_hours_this_machine": here / 3600,
            "projected_hours_on_n_machines": {str(n): here / n / 3600 for n in (1, 2, 4, 8, 16, 32, 64)},
        }
        print(
            f"Bonsai-27B: {per_seed:.1f} s a seed serial at 1 thread; 10,000 seeds: {here / 3600:.1f} h here, "
            f"{here / 3600 / 16:.2f} h on 16 such machines"
        )
    rec = {
        **record.provenance("check_cluster", argv),
        "target": "2 single-threaded workers >= 1.7x one single-threaded serial process, the same bits",
        "notes": (
            "wall time of the check call alone (cluster start and warm-up apart), best of the repeats, "
            "interleaved; each variant called twice in the same processes (serial: a fresh child; the "
            "cluster: restarted workers): seeds_per_s from the first calls (fresh memory, which this VM "
            "maps at about 0.4 GB/s), warm_* from the second (memory already touched); "
            "the machine's 2 cores were shared with other developers' jobs (load_before: "
            "the 1-minute load average before each run). Projection: 10,000 seeds x the measured Bonsai "
            "seconds a seed (serial, one thread, a first call) / the cluster's first-call speedup at "
            "(2048, 2048, 8192); "
            "N machines: divided by N (shards are independent; a shard's scheduling costs milliseconds "
            "beside a seed's tens of seconds)"
        ),
        "results": results,
    }
    if not args.no_record:
        record.write(rec, args.out_dir, record.record_stem("check_cluster", tag=args.tag), force=args.force)
    return rec


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.check_cluster"))
