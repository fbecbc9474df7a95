"""The tail's check at the shapes users ship: seconds a seed beside this machine's floor,
with and without the fault models, and the peak memory of a run.

The subject is notebook 07's numpy tail (``bench.common.user_tail.my_tail``, its code
repeated there, importable: the check runs it in a worker process of its own; unfolded
cases). The floor is measured in the same run, by a plain loop (:func:`floor_seconds`) that
does the least a check of a seed must: draw the case's floats into reused buffers (numpy's
PCG64, float32, as the check's draw), the float64 truth at the three input scales (each
matrix copied into one reused float64 buffer, then ``x @ W^T``), the subject's calls (one an
input scale) and a float32 reference (the same five ops as the truth, in float32: the
products ``x @ W^T`` of three rows, the RMS norm, SwiGLU, the two adds). The check does more
than the floor by design: each call twice (the determinism re-run), guarded (fresh copies,
compared after), in a worker process of its own, and the MLX graph reference beside the
numpy one; all of it is timed.

Each measurement runs in a process of its own (``--one``), so its peak resident memory
(``ru_maxrss``, the check's process plus its worker's) is its own. The machine is shared with
other developers' jobs: each figure is the best of ``--repeats`` runs, and the load average
is in the record.

A run's first seeds pay for memory touched the first time (its buffers, the worker's start,
the imports): on this project's VM that memory costs about 0.39 GB/s against 4-5 GB/s
re-touched, several seconds at Bonsai-27B's shape, the floor's loop included. So each
measurement runs at two seed counts, and the figure a seed is the MARGINAL one,
``(T(n) - T(n_small)) / (n - n_small)``: what each further seed of a long run costs, the
figure the targets are stated in; the totals a seed (``T(n) / n``) are recorded beside it.

``--long SHAPE:SEEDS`` runs one whole check (default faults, the default memory budget) of
that many seeds in one call, as a user runs it, and records its seconds and the peak resident
memory of the check's process and of its worker process.

    python -m bench.check_shapes                        # the three shapes
    python -m bench.check_shapes --shapes 576,576,1536 --seeds 40:200 --repeats 2
    python -m bench.check_shapes --shapes none --long 2048,2048,8192:1000 --long 5120,6144,17408:100
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import numpy as np

from bench.common import cli, record
from bench.common.user_tail import my_tail
from workbench.check import CallableSubject, StoredCase, StoredMatrix, check_kernel

#: SmolLM2-135M's tail, a 2,048-wide layer, Bonsai-27B's (hidden, branch, ffn).
SHAPES = ((576, 576, 1536), (2048, 2048, 8192), (5120, 6144, 17408))

#: Seeds a measurement at each shape by default: ``(n_small, n)``, the marginal figure a seed
#: taken between the two (a few: the machine has 2 shared cores).
SEEDS = {576: (40, 200), 2048: (4, 16), 5120: (2, 6)}

#: The memory budget at each shape (bytes): the check's default, 4 GiB.
BUDGETS = {576: 4 * 2**30, 2048: 4 * 2**30, 5120: 4 * 2**30}

SCALES = (0.01, 1.0, 100.0)

#: One BLAS thread a process, for the floor and the check alike: on 2 cores shared with other
#: jobs, OpenBLAS's second thread spins on a busy core (the floor at 576 took 0.78 s a seed
#: with two threads, 0.07 s with one, at a load average of 10).
THREADS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def _tail(w: dict[str, np.ndarray], norm: np.ndarray, x: np.ndarray, r: np.ndarray, dt: Any, buf: Any = None):
    """The tail's five ops on rows ``x`` [n, branch], ``r`` [n, hidden] in ``dt``; each weight
    copied into ``buf`` (one reused buffer) first when given (the float64 truth)."""

    def mv(k: str, v: np.ndarray) -> np.ndarray:
        m = w[k]
        if buf is not None:
            m = buf[: m.size].reshape(m.shape)
            np.copyto(m, w[k])
        return v @ m.T

    h = r.astype(dt) + mv("wo", x.astype(dt))
    normed = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + dt(1e-6)) * norm.astype(dt)
    g = mv("gate", normed)
    return h + mv("down", g / (1 + np.exp(-g)) * mv("up", normed))


def floor_seconds(shape: tuple[int, int, int], seeds: int) -> float:
    """Seconds a seed of the plain loop (the module doc): draw, float64 truth, subject, float32 reference."""
    h, b, f = shape
    sizes = {"wo": (h, b), "gate": (f, h), "up": (f, h), "down": (h, f)}
    total = sum(p * q for p, q in sizes.values()) + 2 * h + b
    draw = np.empty(total, dtype=np.float32)
    f64 = np.empty(max(p * q for p, q in sizes.values()), dtype=np.float64)
    scales = np.asarray(SCALES, dtype=np.float32)[:, None]
    t0 = time.perf_counter()
    for s in range(seeds):
        np.random.default_rng(s).random(out=draw, dtype=np.float32)
        draw *= np.float32(0.2)
        draw -= np.float32(0.1)
        w, o = {}, 0
        for k, (p, q) in sizes.items():
            w[k] = draw[o : o + p * q].reshape(p, q)
            o += p * q
        norm, branch, resid = draw[o : o + h], draw[o + h : o + h + b], draw[o + h + b :]
        x, r = scales * branch, scales * resid
        _tail(w, norm, x, r, np.float64, f64)
        mats = {k: StoredMatrix(shape=v.shape, dtype="float32", values=v) for k, v in w.items()}
        for i in range(len(SCALES)):
            my_tail(StoredCase("floor", **mats, ffn_norm=norm, eps=1e-6, fold=None, branch=x[i], residual=r[i]))
        _tail(w, norm, x, r, np.float32)
    return (time.perf_counter() - t0) / seeds


def one(shape: tuple[int, int, int], seeds: int, faults: bool | None, budget: int) -> dict[str, Any]:
    """A measurement, in this process: the floor (``faults`` None: no check) or the check's
    seconds for ``seeds`` seeds, and the peak resident memory of this process and its worker."""
    t0 = time.perf_counter()
    if faults is None:
        floor_seconds(shape, seeds)
        rep = None
    else:
        rep = check_kernel(
            CallableSubject(my_tail, name="my_tail"),  # importable: run in a worker process of its own
            shapes=[shape],
            seeds=range(seeds),
            folds=(None,),
            scales=SCALES,
            memory_budget=budget,
            progress=False,
            **({} if faults else {"faults": ()}),
        )
    seconds = time.perf_counter() - t0
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {
        "seconds": seconds,
        "seeds": seeds,
        "peak_rss_bytes": own,
        "worker_peak_rss_bytes": kids,
        "passed": None if rep is None else rep.passed,
        "problems": None if rep is None else len(rep.problems),
    }


def _measure(shape, seeds: int, what: str, budget: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.check_shapes", "--one", ",".join(map(str, shape)), str(seeds), what]
    env = {**os.environ, **THREADS}
    got = subprocess.run([*argv, str(budget)], capture_output=True, text=True, check=False, env=env)
    if got.returncode != 0:
        raise RuntimeError(f"--one {shape} {what}: {got.stderr.strip()[-2000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def _pair(shape, counts: tuple[int, int], what: str, budget: int, repeats: int) -> dict[str, Any]:
    """``what`` at both seed counts, ``repeats`` times each; the best time of each count, the
    marginal seconds a seed between them and the total a seed at the larger count."""
    small, n = counts
    runs = {c: [_measure(shape, c, what, budget) for _ in range(repeats)] for c in (small, n)}
    best = {c: min(r, key=lambda x: x["seconds"]) for c, r in runs.items()}
    return {
        "marginal_s": (best[n]["seconds"] - best[small]["seconds"]) / (n - small),
        "total_a_seed_s": best[n]["seconds"] / n,
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in best.values()),
        "worker_peak_rss_bytes": max(r["worker_peak_rss_bytes"] for r in best.values()),
        "passed": all(r["passed"] is not False for r in best.values()),
        "runs": {str(c): r for c, r in runs.items()},
    }


def _shape_row(shape, counts: tuple[int, int], budget: int, repeats: int) -> dict[str, Any]:
    got = {w: _pair(shape, counts, w, budget, repeats) for w in ("floor", "faultless", "faults")}
    fl, ch, fa = (got[w] for w in ("floor", "faultless", "faults"))
    return {
        "shape": list(shape),
        "seeds": list(counts),
        "memory_budget": budget,
        "floor_s": fl["marginal_s"],
        "check_s": ch["marginal_s"],
        "check_faults_s": fa["marginal_s"],
        "check_over_floor": ch["marginal_s"] / fl["marginal_s"],
        "faults_over_faultless": fa["marginal_s"] / ch["marginal_s"],
        "totals_a_seed_s": {w: got[w]["total_a_seed_s"] for w in got},
        "check_over_floor_totals": ch["total_a_seed_s"] / fl["total_a_seed_s"],
        "faults_over_faultless_totals": fa["total_a_seed_s"] / ch["total_a_seed_s"],
        "peak_rss_bytes": max(ch["peak_rss_bytes"], fa["peak_rss_bytes"]),
        "worker_peak_rss_bytes": max(ch["worker_peak_rss_bytes"], fa["worker_peak_rss_bytes"]),
        "floor_peak_rss_bytes": fl["peak_rss_bytes"],
        "passed": ch["passed"] and fa["passed"],
        "measurements": got,
    }


def _long(spec: str) -> dict[str, Any]:
    """``SHAPE:SEEDS``: one whole check of that many seeds (default faults and budget)."""
    shape_text, _, seeds = spec.rpartition(":")
    shape = tuple(int(v) for v in shape_text.split(","))
    got = _measure(shape, int(seeds), "faults", BUDGETS.get(shape[0], 4 * 2**30))
    return {"shape": list(shape), **got, "seconds_a_seed": got["seconds"] / got["seeds"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--one"]:  # a measurement in a process of its own
        shape = tuple(int(v) for v in argv[1].split(","))
        faults = {"floor": None, "faultless": False, "faults": True}[argv[3]]
        print(json.dumps(one(shape, int(argv[2]), faults, int(argv[4]))))
        return {}
    p = cli.parser("check_shapes", __doc__)
    p.add_argument("--shapes", default=";".join(",".join(map(str, s)) for s in SHAPES), help="H,B,F;H,B,F;... or none")
    p.add_argument("--seeds", help="SMALL:N seeds a measurement (default: 40:200, 4:16, 2:6 by shape)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each measurement; the best is kept")
    p.add_argument("--long", action="append", default=[], help="SHAPE:SEEDS, one whole check in one call")
    p.add_argument("--tag", default="", help="appended to the record's file name")
    args = p.parse_args(argv)
    cli.at_least(p, "--repeats", args.repeats, 1)
    shapes = [] if args.shapes == "none" else [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")]
    counts = None
    if args.seeds:
        small, _, n = args.seeds.partition(":")
        counts = (int(small), int(n))
        if not 0 < counts[0] < counts[1]:
            p.error(f"--seeds: must be SMALL:N with 0 < SMALL < N, got {args.seeds!r}")
    results, long_runs = [], []
    for shape in shapes:
        pair = counts or SEEDS.get(shape[0], (2, 6))
        row = _shape_row(shape, pair, BUDGETS.get(shape[0], 4 * 2**30), args.repeats)
        results.append(row)
        print(
            f"{str(shape):<22} seeds {pair[0]}:{pair[1]}  a further seed: floor {row['floor_s']:7.3f} s  "
            f"check {row['check_s']:7.3f} s ({row['check_over_floor']:.2f}x)  faults {row['check_faults_s']:7.3f} s "
            f"({row['faults_over_faultless']:.2f}x); totals {row['check_over_floor_totals']:.2f}x, "
            f"{row['faults_over_faultless_totals']:.2f}x  peak {row['peak_rss_bytes'] / 2**30:.2f} GiB "
            f"+ worker {row['worker_peak_rss_bytes'] / 2**30:.2f} GiB",
            flush=True,
        )
    for spec in args.long:
        run = _long(spec)
        long_runs.append(run)
        print(
            f"one call: {run['seeds']} seeds at {tuple(run['shape'])} with faults: {run['seconds']:.0f} s "
            f"({run['seconds_a_seed']:.3f} s a seed), passed {run['passed']}, peak "
            f"{run['peak_rss_bytes'] / 2**30:.2f} GiB + worker {run['worker_peak_rss_bytes'] / 2**30:.2f} GiB",
            flush=True,
        )
    rec = {
        **record.provenance("check_shapes", argv),
        "target": "seconds a further seed <= 1.5x the floor without faults, <= 2x that with the default faults; "
        "1,000 seeds at (2048, 2048, 8192) in one call within 4 GB; 100 at Bonsai-27B's shape, peak stated",
        "notes": f"best of {args.repeats} run(s) a figure, each in a process of its own; figures a seed are marginal "
        "(T(n) - T(n_small)) / (n - n_small), totals a seed beside them; wall time on a machine shared with other "
        "developers' jobs (load average in the record); peak memory is ru_maxrss of the check's process and of "
        f"its worker process (the subject's own), each; environment {THREADS} for every measurement",
        "floor": {str(tuple(r["shape"])): r["floor_s"] for r in results},
        "results": results,
        "long_runs": long_runs,
    }
    if not args.no_record:
        record.write(rec, args.out_dir, record.record_stem("check_shapes", tag=args.tag), force=args.force)
    return rec


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.check_shapes"))
