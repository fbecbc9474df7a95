"""Each workbench path beside its plain numpy twin and the machine's limit, timed in one run.

What ``bench.sweep_rate --twins N`` prints and records. Every figure is a ratio taken in the same run, variants
interleaved round by round so a shared machine's load hits each alike, in wall time and in the process's
processor time (which the load inflates less); the absolute times say how loaded the machine was. Rows (twins
in ``bench.common.numpy_twins``): ``host tail`` (``tail.host_tail`` on frink-models' case), ``sweep`` (N blocks of
256 cases), the sweep's float32 tail on one block (MLX's graph against numpy: what bounds the sweep), ``block
transform`` (block 1024) and ``copy`` (the CPU floor's method, ``timing.copy_method``).

:func:`bonsai` (``--bonsai N``) times notebook 03's Bonsai-27B path beside ``numpy_twins.bonsai_truth``, each in a
fresh process so its peak memory (``ru_maxrss``) is its own; the truths' SHA-256 say whether the bits agree.
The limit beside each row is the larger of its bytes over the copy rate and its flops over a large float64
matrix product's rate, both measured in the run (``limits``); for the sweep, the generator's raw rate.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from bench.common import bounded_run, numpy_twins, timing
from workbench import files, validate
from workbench.fold import block_transform
from workbench.models import BONSAI_SHAPE
from workbench.studies import CASE_BLOCK, SWEEP_SALT, case_floats, sweep
from workbench.tail import SEED_EPS, SEED_SHAPE, TailWeights, host_tail, random_inputs, seed_case, tail_mx

SHAPE = SEED_SHAPE


def _median_ms(fns: dict[str, Callable[[], Any]], repeats: int, inner: int = 1) -> dict[str, float]:
    """Ms of one call of each, ``inner`` calls a timing, rounds interleaved (each round runs
    each once, in turn): under each name the median wall time, under ``name + " cpu"`` the
    median processor time of this process (all its threads). On a shared machine the wall
    time counts the minutes other jobs held the cores; the processor time counts only the
    work, so its ratio is the one that holds from run to run."""
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(repeats + 1):
        for k, f in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(inner):
                f()
            if i:  # the first round warms up
                wall[k].append((time.perf_counter() - w0) * 1e3 / inner)
                cpu[k].append((time.process_time() - c0) * 1e3 / inner)
    out = {k: statistics.median(v) for k, v in wall.items()}
    out.update({k + " cpu": statistics.median(v) for k, v in cpu.items()})
    return out


def _row(path: str, unit: str, ms: dict[str, float], scale: float, **extra: Any) -> dict[str, Any]:
    """A table row: the workbench's and the twin's figure (wall and processor time) in ``unit``."""
    return {
        "path": path,
        "unit": unit,
        "workbench": ms["workbench"] * scale,
        "twin": ms["twin"] * scale,
        "workbench_cpu": ms["workbench cpu"] * scale,
        "twin_cpu": ms["twin cpu"] * scale,
        **extra,
    }


def limits(copy_bytes: int = 1 << 28, gemm_n: int = 2048) -> dict[str, float]:
    """The machine's rates, measured now: ``copy_Bps`` (numpy copyto, read + write),
    ``dgemm_flops`` (a ``gemm_n``^3 float64 product), ``draw_Bps`` (the sweep's generator, raw bits)."""
    n = gemm_n
    a = np.ones((n, n))
    t = min(_timed(lambda: a @ a) for _ in range(3))
    raw = np.random.default_rng(0).bit_generator
    words = 1 << 22
    tr = min(_timed(lambda: raw.random_raw(words)) for _ in range(3))
    return {
        "copy_Bps": timing.copy_bandwidth(copy_bytes, repeats=5),
        "dgemm_flops": 2 * n**3 / t,
        "draw_Bps": 8 * words / tr,
    }


def _timed(f: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def _floor_ms(lim: dict[str, float], nbytes: float, flops: float) -> float:
    return 1e3 * max(nbytes / lim["copy_Bps"], flops / lim["dgemm_flops"])


def host_tail_row(lim: dict[str, float], repeats: int, calls: int = 200) -> dict[str, Any]:
    """``host_tail`` on the test case against its twin (same bits: checked here too)."""
    c = seed_case()
    w, b, r = c.weights, c.branch, c.residual
    wo, norm, gate, up, down = w.host_arrays(np.float64)
    fold = w.wo.fold
    signs, h_t = fold.signs.astype(np.float64), numpy_twins.orthonormal_t(fold.block)

    def twin() -> np.ndarray:
        return numpy_twins.host_tail(wo, signs, h_t, norm, gate, up, down, w.eps, b, r)

    same = bool(np.array_equal(host_tail(w, b, r), twin()))
    ms = _median_ms({"workbench": lambda: host_tail(w, b, r), "twin": twin}, 20 * repeats, inner=calls)
    hidden, branch, ffn = w.shape
    macs = hidden * branch + 3 * hidden * ffn
    return _row(
        "host tail (float64, one call)", "us", ms, 1e3, limit=1e3 * _floor_ms(lim, 8 * macs, 2 * macs), same_bits=same
    )


def sweep_row(lim: dict[str, float], blocks: int, repeats: int) -> dict[str, Any]:
    """``sweep`` over ``blocks`` blocks of cases (float32, no fold) against its twin."""
    eps = SEED_EPS
    seeds = range(blocks * CASE_BLOCK)

    def twin() -> list:
        return [numpy_twins.sweep_block(SHAPE, k, eps) for k in range(blocks)]

    ms = _median_ms(
        {"workbench": lambda: sweep(shapes=[SHAPE], seeds=seeds, eps=eps, progress=False), "twin": twin}, repeats
    )
    per_100k = 1e5 / (blocks * CASE_BLOCK)
    draw_bytes = 4 * case_floats(SHAPE) * 1e5  # float32 uniforms: 32 raw bits each
    return _row(
        f"sweep, {blocks * CASE_BLOCK} cases (s per 100,000)",
        "s",
        ms,
        per_100k / 1e3,
        limit=draw_bytes / lim["draw_Bps"],
        same_bits=None,
    )


def graph_row(lim: dict[str, float], repeats: int) -> dict[str, Any]:
    """What bounds the sweep against its twin: the fused tail on one block of cases, MLX's
    graph (``tail_mx``, the weights copied into MLX, one evaluation) against the same float32
    tail in numpy. The rest of a sweep (draws, float64 truth, metrics) is the same work in both."""
    eps = SEED_EPS
    c = numpy_twins.draw_cases(SHAPE, 0)
    names = ("wo", "ffn_norm", "gate", "up", "down")

    def graph() -> np.ndarray:
        wo, norm, gate, up, down = (mx.array(c[k]) for k in names)
        out = tail_mx(wo, None, norm, gate, up, down, eps, mx.array(c["branch"]), mx.array(c["residual"]))
        mx.eval(out)
        return np.array(out)

    def twin() -> np.ndarray:
        return numpy_twins.tail_batched(*(c[k] for k in names), eps, c["branch"], c["residual"])

    ms = _median_ms({"workbench": graph, "twin": twin}, 4 * repeats)
    hidden, branch, ffn = SHAPE
    macs = CASE_BLOCK * (hidden * branch + 3 * hidden * ffn)
    return _row(
        f"sweep's float32 tail, {CASE_BLOCK} cases, MLX",
        "ms",
        ms,
        1.0,
        limit=_floor_ms(lim, 4 * macs, 2 * macs),
        same_bits=None,
    )


def transform_row(lim: dict[str, float], rows: int, repeats: int, block: int = 1024) -> dict[str, Any]:
    """``hadamard.block_transform`` of a (rows, 6 * block) float64 matrix against one product."""
    x = np.random.default_rng(SWEEP_SALT).standard_normal((rows, 6 * block))
    h_t = numpy_twins.orthonormal_t(block)
    same = bool(np.array_equal(block_transform(x, block), numpy_twins.block_transform(x, h_t)))
    ms = _median_ms(
        {"workbench": lambda: block_transform(x, block), "twin": lambda: numpy_twins.block_transform(x, h_t)},
        repeats,
    )
    return _row(
        f"block transform, {rows} x {6 * block}, b {block}",
        "ms",
        ms,
        1.0,
        limit=_floor_ms(lim, 2 * x.nbytes, 2 * x.size * block),
        same_bits=same,
    )


def copy_row(lim: dict[str, float], nbytes: int, repeats: int) -> dict[str, Any]:
    """MLX's ``x + 1`` (the CPU floor's method before) beside numpy's ``copyto``, GB/s."""
    x = mx.zeros((nbytes // 4,), dtype=mx.float32)
    mx.eval(x)
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    ms = _median_ms({"workbench": lambda: mx.eval(x + 1), "twin": lambda: np.copyto(dst, src)}, repeats)
    rate = {k: 2 * nbytes / v / 1e6 if v > 0 else math.nan for k, v in ms.items()}  # ms -> GB/s
    return _row(
        f"copy, {nbytes >> 20} MiB (read + write)",
        "GB/s",
        rate,
        1.0,
        limit=lim["copy_Bps"] / 1e9,
        same_bits=None,
        floor_method=timing.copy_method(),
    )


def measure(
    blocks: int,
    *,
    transform_rows: int = 2048,
    copy_bytes: int = 1 << 28,
    repeats: int = 5,
    gemm_n: int = 2048,
    host_calls: int = 200,
) -> dict[str, Any]:
    """Every row above, the limits first; ``ratio`` is workbench over twin (for the copy,
    twin over workbench: a rate), ``of_limit`` the same against the limit."""
    lim = limits(copy_bytes, gemm_n)
    rows = [
        host_tail_row(lim, repeats, host_calls),
        sweep_row(lim, blocks, repeats),
        graph_row(lim, repeats),
        transform_row(lim, transform_rows, repeats),
        copy_row(lim, copy_bytes, repeats),
    ]
    for r in rows:
        rate = r["unit"] == "GB/s"
        r["ratio"] = r["twin"] / r["workbench"] if rate else r["workbench"] / r["twin"]
        r["ratio_cpu"] = r["twin_cpu"] / r["workbench_cpu"] if rate else r["workbench_cpu"] / r["twin_cpu"]
        r["of_limit"] = r["limit"] / r["workbench"] if rate else r["workbench"] / r["limit"]
    return {
        "limits": lim,
        "rows": rows,
        "repeats": repeats,
        "gemm_n": gemm_n,
        "copy_bytes": copy_bytes,
        "notes": "ratio: workbench time over its numpy twin's, median wall times (ratio_cpu: median processor "
        "times of the process, which a shared machine's load does not inflate; for the copy: "
        "numpy's rate over MLX's); "
        "of_limit: the same against the limit (bytes over the copy rate or flops over the dgemm "
        "rate, whichever is larger; the sweep: its raw random bits at the generator's rate)",
    }


def print_table(res: dict[str, Any]) -> None:
    """The rows as a table: workbench, twin, limit, and the two ratios."""
    lim = res["limits"]
    print(
        f"\nlimits: copy {lim['copy_Bps'] / 1e9:.1f} GB/s (read + write), float64 product "
        f"{lim['dgemm_flops'] / 1e9:.1f} GFLOP/s, generator {lim['draw_Bps'] / 1e9:.2f} GB/s of raw bits"
    )
    print(
        f"{'path':<40}{'unit':>5}{'workbench':>10}{'twin':>10}{'limit':>9}{'ratio':>6}{'(cpu)':>6}"
        f"{'x limit':>8}{'same':>6}"
    )
    for r in res["rows"]:
        same = "" if r["same_bits"] is None else ("yes" if r["same_bits"] else "NO")
        print(
            f"{r['path']:<40}{r['unit']:>5}{r['workbench']:>10.3g}{r['twin']:>10.3g}{r['limit']:>9.3g}"
            f"{r['ratio']:>6.2f}{r['ratio_cpu']:>6.2f}{r['of_limit']:>8.2f}{same:>6}"
        )
    print("twin: plain numpy, the same work; ratio: workbench / twin (copy: twin / MLX), wall time and")
    print("(cpu) processor time; x limit: workbench / the machine's limit; same: the twin's bits")
    if not math.isfinite(sum(r["ratio"] for r in res["rows"])):
        print("(a ratio is not finite: a timing was zero)")


#: Notebook 03's Bonsai-27B case: the shape, wo's fold block, the weights' seed, the inputs' seed.
BONSAI_CASE = (BONSAI_SHAPE, 1024, 27, 28)

#: The seconds one process of :func:`bonsai` may take (minutes on a loaded 2-core machine).
BONSAI_TIMEOUT_S = 900.0


def bonsai_child(kind: str) -> dict[str, Any]:
    """One run of the Bonsai-27B path in THIS process: ``"workbench"`` runs notebook 03's cell
    (``TailWeights.random``, ``random_inputs``, ``three_way_table``), ``"twin"`` its plain numpy
    float64 twin; the wall and processor seconds, the process's peak resident bytes, and the
    SHA-256 of the float64 truth (the workbench's read after the timing, from its cached copies)."""
    validate.one_of("kind", kind, ("workbench", "twin"))
    (shape, block, seed, input_seed) = BONSAI_CASE
    w0, c0 = time.perf_counter(), time.process_time()
    if kind == "twin":
        truth = numpy_twins.bonsai_truth(shape, block, seed, input_seed, 1e-6)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        table = None
    else:
        from workbench.studies import three_way_table  # tables need pandas; the twin does not

        w = TailWeights.random(*shape, seed=seed, fold_block=block, dtype="bfloat16")
        br, res = random_inputs(w, seed=input_seed)
        table = three_way_table([("bonsai27b", w, br, res)])
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        truth = host_tail(w, br, res)
    return {
        "kind": kind,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "truth_sha256": hashlib.sha256(np.ascontiguousarray(truth).tobytes()).hexdigest(),
        "verdict": None if table is None else str(table["verdict"].iloc[0]),
    }


def bonsai(rounds: int, lim: dict[str, float] | None = None) -> dict[str, Any]:
    """Notebook 03's Bonsai-27B path beside its twin, ``rounds`` rounds, each kind in its own
    process (``python -m bench.common.twin_rates --bonsai-child KIND``) in turn: the medians
    of wall time, processor time and peak memory, and whether the truths' bits agree. The
    limit: the recipe's float64 draws at the generator's raw rate plus the fold's product at
    the float64 matrix product's rate (``limits``)."""
    runs: dict[str, list[dict[str, Any]]] = {"workbench": [], "twin": []}
    for _ in range(rounds):
        for kind in runs:
            p = bounded_run.run_bounded(
                [sys.executable, "-m", "bench.common.twin_rates", "--bonsai-child", kind],
                timeout=BONSAI_TIMEOUT_S,
                cwd=files.PROJECT_ROOT,
            )
            if p.returncode != 0:
                raise RuntimeError(f"the Bonsai-27B {kind} run failed (exit {p.returncode}): {p.stderr[-2000:]}")
            runs[kind].append(json.loads(p.stdout.strip().splitlines()[-1]))

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    (hidden, branch, ffn), block = BONSAI_CASE[:2]
    limit = None
    if lim is not None:
        values = hidden * branch + 3 * hidden * ffn + hidden
        limit = 8 * values / lim["draw_Bps"] + 2 * hidden * branch * block / lim["dgemm_flops"]
    shas = {r["truth_sha256"] for rs in runs.values() for r in rs}
    time_row = {
        "path": "Bonsai-27B float64 path, notebook 03",
        "unit": "s",
        "workbench": med("workbench", "wall_s"),
        "twin": med("twin", "wall_s"),
        "workbench_cpu": med("workbench", "cpu_s"),
        "twin_cpu": med("twin", "cpu_s"),
        "limit": limit,
        "same_bits": len(shas) == 1,
    }
    mem_row = {
        "path": "Bonsai-27B float64 path, peak memory",
        "unit": "GB",
        "workbench": med("workbench", "peak_rss_bytes") / 1e9,
        "twin": med("twin", "peak_rss_bytes") / 1e9,
        "limit": 8 * (hidden * branch + 3 * hidden * ffn) / 1e9,
        "same_bits": len(shas) == 1,
    }
    for r in (time_row, mem_row):
        r["ratio"] = r["workbench"] / r["twin"]
        r["ratio_cpu"] = r["workbench_cpu"] / r["twin_cpu"] if "workbench_cpu" in r else None
        r["of_limit"] = r["workbench"] / r["limit"] if r["limit"] else None
    return {
        "rows": [time_row, mem_row],
        "runs": runs,
        "rounds": rounds,
        "case": {
            "shape": [hidden, branch, ffn],
            "fold_block": block,
            "seed": BONSAI_CASE[2],
            "input_seed": BONSAI_CASE[3],
            "dtype": "bfloat16",
        },
        "notes": "each run a fresh process (python -m bench.common.twin_rates --bonsai-child KIND), the kinds "
        "alternating; seconds from the first draw to the table (workbench) or the truth (twin); peak "
        "memory: the process's ru_maxrss; limit (s): the float64 draws at the generator's raw rate plus "
        "the fold's product at the float64 product rate; limit (GB): the four matrices in float64",
    }


def print_bonsai(res: dict[str, Any]) -> None:
    """The Bonsai-27B rows: workbench, twin, their ratio (wall and processor time), the limit."""
    print(
        f"\n{'path':<40}{'unit':>5}{'workbench':>10}{'twin':>10}{'limit':>9}{'ratio':>6}{'(cpu)':>6}"
        f"{'x limit':>8}{'same':>6}"
    )
    for r in res["rows"]:
        cpu = "" if r["ratio_cpu"] is None else f"{r['ratio_cpu']:.2f}"
        lim = "" if r["limit"] is None else f"{r['limit']:.3g}"
        of = "" if r["of_limit"] is None else f"{r['of_limit']:.2f}"
        print(
            f"{r['path']:<40}{r['unit']:>5}{r['workbench']:>10.3g}{r['twin']:>10.3g}{lim:>9}{r['ratio']:>6.2f}"
            f"{cpu:>6}{of:>8}{'yes' if r['same_bits'] else 'NO':>6}"
        )
    print(
        f"median of {res['rounds']} round(s), each kind in a fresh process; twin: plain numpy, the same draws, "
        "the float64 truth only"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        prog="python -m bench.common.twin_rates",
        description="one run of the Bonsai-27B path, its figures as one JSON line",
    )
    ap.add_argument("--bonsai-child", required=True, choices=("workbench", "twin"))
    print(json.dumps(bonsai_child(ap.parse_args().bonsai_child)))
