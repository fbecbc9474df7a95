"""Older kernel sources against the current ones, on one GPU in one run: same answers, and how fast.

    python -m bench.kernel_bodies --old DIR     # DIR: a copy of an older kernels/ folder
    git archive HEAD~1 kernels | tar -x -C /tmp/old && python -m bench.kernel_bodies --old /tmp/old/kernels

At Bonsai-27B's tail, in bf16 and each quantized format (``--formats``), and its head launch in bf16, each
launch is prepared twice from the same weights and tuning, composed from DIR ("old") and from ``kernels/``
("new") (``kernel_launch.prepare_tail(..., kernel_dir=...)``; MLX caches compiled kernels by name, so another
folder's are named apart). Correctness first: both against the float64 oracle at ``bench.gpu_check``'s
tolerance, and against each other; nothing is timed unless both pass. Then, old and new alternating round by
round, medians: device time a tail (``bench.common.kernels.batched_ms``) and a launch, one evaluation with its
wait, and on CUDA the tail as one launch where the old folder has its body; beside the copy-bandwidth floor.

Writes ``data/bench/kernel_bodies-<device>-<UTC time>.json``. Exit status: 0; 1 when a check fails (nothing
timed); 2 without a GPU back-end or with a DIR that is not a kernels folder.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from bench.common import cli, kernels, record, timing
from bench.common.timing import interleaved
from workbench import backends, tail
from workbench.fold import QUANT_FORMATS, HadamardFold, WeightMatrix
from workbench.kernels import (
    DEFAULT_TUNING,
    DIALECTS,
    KERNELS,
    ONE_LAUNCH_BODY,
    TAIL_KERNELS,
    KernelTuning,
    OneLaunchTail,
    PreparedTail,
    compose,
    fits,
    head_launch,
    mlx_name,
    prepare_tail,
    shape_for,
)
from workbench.studies import host_tail_exact, oracle_tolerance, tolerance_for
from workbench.tail import compare

ROOT = Path(__file__).resolve().parent.parent

#: The two sources compared, in the order the tables print them.
SIDES: tuple[str, ...] = ("old", "new")

#: Weight formats benchmarked: label -> TailWeights.random's ``quantize`` (None: dense bf16);
#: the quantized ones are ``kernels.BENCH_FORMATS``, labelled as kernel_bench labels them.
FORMATS: dict[str, dict[str, Any] | None] = {
    "bf16": None,
    **{
        f"{n}-g{QUANT_FORMATS[n].group_size}": {
            "mode": QUANT_FORMATS[n].mode,
            "bits": QUANT_FORMATS[n].bits,
            "group_size": QUANT_FORMATS[n].group_size,
        }
        for n in kernels.BENCH_FORMATS
    },
}


def gpu_dialect() -> str | None:
    """``cuda`` or ``metal``: the kernel dialect this machine's MLX runs; None without a GPU back-end."""
    if backends.cuda_available():
        return "cuda"
    if backends.metal_available():
        return "metal"
    return None


#: The kernels compared (the tail's and the head launch); an older folder need not hold
#: the bodies added since (gdn_step).
COMPARED: tuple[str, ...] = TAIL_KERNELS + ("head_qkv",)


def kernel_folder(path: str | Path) -> Path:
    """``path`` resolved, once it holds every file the kernels are composed from."""
    folder = Path(path).resolve()
    needed = ["common.h"] + [f"prelude_{d}.h" for d in DIALECTS]
    needed += sorted({KERNELS[k].body for k in COMPARED})
    missing = [n for n in needed if not (folder / n).is_file()]
    if missing:
        raise ValueError(f"--old must be a kernels folder (with {', '.join(needed)}); {folder} lacks {missing}")
    return folder


def fresh_ptx_cache() -> str:
    """Point MLX's on-disk cache of compiled CUDA kernels at an empty folder, unless set.

    MLX's CUDA back-end keeps each compiled kernel on disk under its name and template
    values (``$MLX_PTX_CACHE_DIR``, by default a folder of the system's temporary one):
    on a machine that already ran older sources under the plain names, the "new" side
    would load their binary. Must run before the first kernel is compiled.
    """
    if not os.environ.get("MLX_PTX_CACHE_DIR"):
        os.environ["MLX_PTX_CACHE_DIR"] = tempfile.mkdtemp(prefix="kernel_bodies-ptx-")
    return os.environ["MLX_PTX_CACHE_DIR"]


def _median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _same_bits(a: np.ndarray, b: np.ndarray) -> int:
    a32, b32 = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return int(np.count_nonzero(a32.view(np.uint32) == b32.view(np.uint32)))


def _agreement(outs: dict[str, np.ndarray], truth: np.ndarray, tol: float) -> dict[str, Any]:
    """Each side against the oracle, and old against new."""
    res: dict[str, Any] = {}
    for side, out in outs.items():
        c = compare(out, truth, tol=tol)
        res[side] = {"worst": c.worst, "nmse": c.nmse, "max_abs": c.max_abs, "passed": bool(c.passed), "result": str(c)}
    old, new = (outs[s].reshape(-1) for s in SIDES)
    res["new_vs_old"] = {
        "max_abs_diff": float(np.max(np.abs(new.astype(np.float64) - old))),
        "same_bits": _same_bits(new, old),
        "elements": int(new.size),
    }
    res["passed"] = all(res[s]["passed"] for s in SIDES)
    return res


def tail_case(
    label: str,
    w: tail.TailWeights,
    dialect: str,
    tuning: KernelTuning,
    old_dir: Path,
    bandwidth: float,
    *,
    seed: int,
    rounds: int,
    n_tails: int,
) -> dict[str, Any]:
    """One tail, old and new: the checks, then (only if both pass) the timings (ms)."""
    br, res = tail.random_inputs(w, seed=seed)
    truth = host_tail_exact(w, br, res)
    tol, f32 = tolerance_for(w, br, res, truth)
    launch = tail.tail_launch(w)
    preps = {
        "old": prepare_tail(launch, dialect, tuning, kernel_dir=old_dir),
        "new": prepare_tail(launch, dialect, tuning),
    }
    b, r = mx.array(br), mx.array(res)
    mx.eval(b, r)
    outs = {s: np.array(p(b, r)) for s, p in preps.items()}
    wbytes = preps["new"].weight_bytes()
    entry: dict[str, Any] = {
        "case": label,
        "shape": list(w.shape),
        "weights": w.wo.dtype,
        "quantization": None if w.wo.quantization is None else str(w.wo.quantization),
        "fold_block": w.wo.fold.block if w.wo.fold is not None else None,
        "tol": tol,
        "f32_oracle_worst": f32,
        "check": _agreement(outs, truth, tol),
        "weight_bytes": wbytes,
        "floor_ms": wbytes / bandwidth * 1e3,
    }
    if not entry["check"]["passed"]:
        return entry

    per_tail = interleaved(
        {s: (lambda p=p: kernels.batched_ms(lambda: p(b, r), n=n_tails, repeats=1)) for s, p in preps.items()}, rounds
    )
    launches = interleaved(
        {s: (lambda p=p: kernels.per_launch_ms(p, b, r)) for s, p in preps.items()}, max(3, rounds // 3)
    )
    one_wait = timing.time_rounds({s: (lambda p=p: mx.eval(p(b, r))) for s, p in preps.items()}, rounds * 2, 3)
    lb = kernels.launch_bytes(preps["new"])
    entry["device_ms_per_tail"] = {s: timing.summarize(v) for s, v in per_tail.items()}
    entry["launch_device_ms"] = {s: _median_of(v) for s, v in launches.items()}
    entry["launch_bandwidth_GBps"] = {
        s: {k: lb[k] / (ms * 1e-3) / 1e9 for k, ms in v.items()} for s, v in entry["launch_device_ms"].items()
    }
    entry["one_wait_ms"] = {s: timing.summarize(v) for s, v in one_wait.items()}
    entry["n_tails_per_evaluation"] = n_tails
    if dialect == "cuda" and (old_dir / ONE_LAUNCH_BODY).is_file() and fits(preps["new"]):
        entry["one_launch"] = one_launch_case(preps, br, res, truth, tol, rounds=rounds, n_tails=n_tails)
    return entry


def one_launch_case(
    preps: dict[str, PreparedTail],
    br: np.ndarray,
    res: np.ndarray,
    truth: np.ndarray,
    tol: float,
    *,
    rounds: int,
    n_tails: int,
) -> dict[str, Any]:
    """The tail as one launch from each side's kernels (``preps``: the prepared tails,
    each with its folder), in ``one_launch.shape_for``'s shape: checked against the oracle
    and each other, then (only if both pass) device time a tail and one wait, alternating."""
    ones = {s: OneLaunchTail(p, shape_for(p)) for s, p in preps.items()}
    outs = {s: one.run(br, res) for s, one in ones.items()}
    shape = ones["new"].shape
    entry: dict[str, Any] = {
        "nt": shape.nt,
        "row_units": shape.row_units,
        "groups": ones["new"].groups,
        "check": _agreement(outs, truth, tol),
    }
    if not entry["check"]["passed"]:
        return entry
    b, r = mx.array(br), mx.array(res)
    mx.eval(b, r)
    per_tail = interleaved(
        {s: (lambda one=one: kernels.batched_ms(lambda: one(b, r), n=n_tails, repeats=1)) for s, one in ones.items()},
        rounds,
    )
    compiled = {s: one.compiled() for s, one in ones.items()}
    one_wait = timing.time_rounds({s: (lambda c=c: mx.eval(c(b, r))) for s, c in compiled.items()}, rounds * 2, 3)
    for one in ones.values():
        one.raise_if_barrier_failed()
    entry["device_ms_per_tail"] = {s: timing.summarize(v) for s, v in per_tail.items()}
    entry["one_wait_ms"] = {s: timing.summarize(v) for s, v in one_wait.items()}
    return entry


def head_case(
    label: str,
    hidden: int,
    rows: tuple[int, int, int],
    dialect: str,
    tuning: KernelTuning,
    old_dir: Path,
    bandwidth: float,
    *,
    seed: int,
    rounds: int,
    n_launches: int,
) -> dict[str, Any]:
    """The head launch (bf16 Q, K, V sharing one fold of block ``hidden``), old and new."""
    rng = np.random.default_rng(seed)
    fold = HadamardFold.random(hidden, hidden, seed=seed + 1, permute=True)
    a = math.sqrt(3.0 / hidden)
    q, k, v = (
        WeightMatrix(mx.array(rng.uniform(-a, a, (n, hidden)).astype(np.float32)).astype(mx.bfloat16)).fold_hadamard(
            fold
        )
        for n in rows
    )
    x = rng.uniform(-1, 1, hidden).astype(np.float32)
    nw = (1 + rng.uniform(-0.25, 0.25, hidden)).astype(np.float32)
    eps = 1e-6
    xm, nm = mx.array(x), mx.array(nw)

    def oracle(dt: Any) -> np.ndarray:  # the numpy head in dtype dt, as bench.gpu_check checks it
        n = tail.rms_norm_np(x.astype(dt), nw.astype(dt), eps)
        return np.concatenate([m.apply(n) for m in (q, k, v)])

    truth = oracle(np.float64)
    f32 = compare(oracle(np.float32), truth).worst
    tol = oracle_tolerance(f32)
    dirs = {"old": old_dir, "new": None}

    def launch(side: str) -> tuple[mx.array, mx.array, mx.array]:
        return head_launch(xm, nm, eps, q, k, v, dialect, tuning, kernel_dir=dirs[side])

    outs = {}
    for side in SIDES:
        got = launch(side)
        mx.eval(*got)
        outs[side] = np.concatenate([np.array(g) for g in got])
    wbytes = int(sum(m.launch_parts()[0].nbytes for m in (q, k, v)))
    entry: dict[str, Any] = {
        "case": label,
        "shape": [hidden, *rows],
        "weights": "bfloat16",
        "fold_block": hidden,
        "tol": tol,
        "f32_oracle_worst": f32,
        "check": _agreement(outs, truth, tol),
        "weight_bytes": wbytes,
        "floor_ms": wbytes / bandwidth * 1e3,
    }
    if entry["check"]["passed"]:
        per = interleaved(
            {s: (lambda s=s: kernels.batched_ms(lambda: launch(s), n=n_launches, repeats=1)) for s in SIDES}, rounds
        )
        entry["device_ms_per_launch"] = {s: timing.summarize(t) for s, t in per.items()}
        entry["n_launches_per_evaluation"] = n_launches
    return entry


def case_passed(entry: dict[str, Any]) -> bool:
    """Whether a case's checks passed: the launches', and the one launch's where it ran."""
    one = entry.get("one_launch")
    return bool(entry["check"]["passed"] and (one is None or one["check"]["passed"]))


def _ratio(entry: dict[str, Any], key: str) -> float | None:
    if key not in entry:
        return None
    return entry[key]["new"]["median_ms"] / entry[key]["old"]["median_ms"]


def print_table(rec: dict[str, Any]) -> None:
    bw = rec["copy_bandwidth_Bps"]["used_for_floor"]
    print(
        f"\nold = {rec['old_dir']}, new = kernels/; floor = weight bytes / {bw / 1e12:.2f} TB/s (device copy, this run)"
    )
    print(f"{'case':<22}{'what':<20}{'old ms':>9}{'new ms':>9}{'new/old':>9}{'floor ms':>10}{'new/floor':>10}")
    for c in rec["cases"]:
        chk = c["check"]
        d = chk["new_vs_old"]
        print(
            f"{c['case']:<22}{'check':<20}"
            + "  ".join(f"{s} worst {chk[s]['worst']:.3g}" for s in SIDES)
            + f" (tol {c['tol']:.3g}); new vs old: max |diff| {d['max_abs_diff']:.3g}, "
            f"{d['same_bits']} of {d['elements']} same bits" + ("" if chk["passed"] else "  FAILED: not timed")
        )
        rows: list[tuple[str, float, float, str]] = []
        for key, what in (("device_ms_per_tail", "device / tail"), ("device_ms_per_launch", "device / launch")):
            if key in c:
                n = c[key]["new"]["median_ms"]
                rows.append((what, c[key]["old"]["median_ms"], n, f"{c['floor_ms']:>10.3f}{n / c['floor_ms']:>10.2f}"))
        for name, n in c.get("launch_device_ms", {}).get("new", {}).items():
            tbps = c["launch_bandwidth_GBps"]["new"][name] / 1e3
            rows.append((f"  {name}", c["launch_device_ms"]["old"][name], n, f"   new at {tbps:.2f} TB/s"))
        if "one_wait_ms" in c:
            rows.append(("one wait", c["one_wait_ms"]["old"]["median_ms"], c["one_wait_ms"]["new"]["median_ms"], ""))
        one = c.get("one_launch")
        if one is not None:
            d1 = one["check"]["new_vs_old"]
            worst = "  ".join(f"{s} worst {one['check'][s]['worst']:.3g}" for s in SIDES)
            print(
                f"{'':<22}{'one launch check':<20}{worst}; new vs old: {d1['same_bits']} of {d1['elements']} same bits"
                + ("" if one["check"]["passed"] else "  FAILED: not timed")
            )
            if "device_ms_per_tail" in one:
                n = one["device_ms_per_tail"]["new"]["median_ms"]
                rows.append(
                    (
                        f"one launch ({one['nt']})",
                        one["device_ms_per_tail"]["old"]["median_ms"],
                        n,
                        f"{c['floor_ms']:>10.3f}{n / c['floor_ms']:>10.2f}",
                    )
                )
                rows.append(
                    (
                        "  its one wait",
                        one["one_wait_ms"]["old"]["median_ms"],
                        one["one_wait_ms"]["new"]["median_ms"],
                        "",
                    )
                )
        for what, o, n, extra in rows:
            print(f"{'':<22}{what:<20}{o:>9.4f}{n:>9.4f}{n / o:>9.3f}{extra}")


def run(
    dialect: str,
    old_dir: Path,
    *,
    rounds: int,
    n_tails: int,
    seed: int,
    head: bool,
    shape: tuple[tuple[int, int, int], int] = kernels.BONSAI,
    formats: tuple[str, ...] = tuple(FORMATS),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every case; returns the record's body (without the provenance)."""
    (hidden, branch, ffn), block = shape
    bws = kernels.floor_bandwidth()
    bandwidth = bws["used_for_floor"]
    tuning = DEFAULT_TUNING
    out: dict[str, Any] = {
        "old_dir": str(old_dir),
        "mlx_names": {k: {"old": mlx_name(k, kernel_dir=old_dir), "new": mlx_name(k)} for k in COMPARED},
        "same_text": {k: compose(dialect, k, kernel_dir=old_dir) == compose(dialect, k) for k in COMPARED},
        "copy_bandwidth_Bps": bws,
        "tuning": {f: getattr(tuning, f) for f in tuning.__dataclass_fields__},
        "shape": [hidden, branch, ffn],
        "fold_block": block,
        "rounds": rounds,
        "seed": seed,
        "cases": [],
    }
    log(
        f"copy bandwidth {bandwidth / 1e12:.3f} TB/s; kernels whose text differs: "
        + (", ".join(k for k, same in out["same_text"].items() if not same) or "none")
    )
    for i, (label, q) in enumerate(FORMATS.items()):
        if label not in formats:
            continue
        w = tail.TailWeights.random(
            hidden, branch, ffn, seed=seed + 10 * i, fold_block=block, dtype="bfloat16", quantize=q
        )
        log(f"tail {label} ...")
        out["cases"].append(
            tail_case(
                f"tail {label}",
                w,
                dialect,
                tuning,
                old_dir,
                bandwidth,
                seed=seed + 10 * i + 1,
                rounds=rounds,
                n_tails=n_tails,
            )
        )
        del w
    if head:
        # Bonsai's head: q_proj 24 heads x 256 x 2 (the output gate), k and v 4 x 256 (as bench.gpu_check).
        log("head bf16 ...")
        out["cases"].append(
            head_case(
                "head bf16",
                hidden,
                (2 * branch, 1024, 1024),
                dialect,
                tuning,
                old_dir,
                bandwidth,
                seed=seed + 50,
                rounds=rounds,
                n_launches=n_tails,
            )
        )
    out["checks_passed"] = all(case_passed(c) for c in out["cases"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser("kernel_bodies", __doc__)
    ap.add_argument("--old", required=True, help="a copy of an older kernels/ folder (e.g. from git archive)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds per timing")
    ap.add_argument("--tails", type=int, default=10, help="tails (head launches) in one timed evaluation")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    ap.add_argument("--no-head", action="store_true", help="leave the head launch out")
    ap.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help=f"comma list of the tails' weight formats (default {','.join(FORMATS)})",
    )
    ap.add_argument(
        "--shape",
        default=None,
        metavar="H,B,F,BLOCK",
        help="hidden, branch, ffn and wo's fold block instead of Bonsai-27B's 5120,6144,17408,1024",
    )
    a = ap.parse_args(argv)
    formats = tuple(cli.comma_list(ap, "--formats", a.formats, tuple(FORMATS)))
    cli.at_least(ap, "--rounds", a.rounds, 1)
    cli.at_least(ap, "--tails", a.tails, 1)
    cli.at_least(ap, "--seed", a.seed, 0)
    shape = kernels.BONSAI
    if a.shape is not None:  # an empty --shape is refused below, never read as Bonsai-27B's
        parts = a.shape.split(",")
        if len(parts) != 4 or not all(v.strip().isdigit() and int(v) > 0 for v in parts):
            ap.error(
                f"--shape must be four positive integers H,B,F,BLOCK (hidden, branch, ffn, fold block); got {a.shape!r}"
            )
        h, b, f, blk = (int(v) for v in parts)
        shape = ((h, b, f), blk)
    try:
        old_dir = kernel_folder(a.old)
    except ValueError as e:
        ap.error(str(e))
    dialect = gpu_dialect()
    if dialect is None:
        print(
            "no GPU here: mx.cuda.is_available() and mx.metal.is_available() are both False; comparing "
            "kernel sources needs MLX's CUDA back-end (mlx[cuda13]) or an Apple GPU"
        )
        return 2
    ptx = fresh_ptx_cache()
    prov = record.provenance("kernel_bodies", argv)
    started = _dt.datetime.fromisoformat(prov["date"])
    info = prov["device"]
    device = info.get("device_name", f"{dialect} GPU")
    print(f"{dialect} kernels on {device}, MLX {mx.__version__}: {old_dir} (old) against kernels/ (new)")
    body = run(
        dialect,
        old_dir,
        rounds=a.rounds,
        n_tails=a.tails,
        seed=a.seed,
        head=not a.no_head,
        shape=shape,
        formats=formats,
    )
    rec = {
        "what": "older kernel sources against the current ones: checks, then device time",
        **prov,
        "device": device,
        "device_info": info,
        "dialect": dialect,
        "mlx_ptx_cache_dir": ptx,
        **body,
    }
    print_table(rec)
    if not a.no_record:
        print()
        record.write(rec, a.out_dir, record.record_stem("kernel_bodies", device, started), force=a.force)
    failed = [c["case"] for c in rec["cases"] if not case_passed(c)]
    if failed:
        print(f"\nFAILED checks (not timed): {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.kernel_bodies"))
