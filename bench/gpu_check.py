"""Every GPU check of the kernel tail and its benchmark, in one command, one record.

    python -m bench.gpu_check                  # from the project's root, on a machine with a GPU
    python -m bench.gpu_check --quick          # the checks and a short benchmark (no tuning sweep)
    python -m bench.gpu_check --checks-only    # no benchmark

Runs the CUDA kernels on an NVIDIA GPU, the Metal ones on an Apple GPU (on CUDA, both the one-launch tail
``fused_tail(backend="cuda")`` runs and the three launches). Checks, each against the float64 oracle
(``workbench.studies.exact_oracle``): frink-models' test case; random shapes and folds, float32 and bf16; every
quantized format the kernels read; Bonsai-27B's tail; the head launch; and determinism (the same inputs twice
give the same bits: a race would not). Each case's tolerance is ``max(2e-4, 2 x`` the float32 oracle's own error
there) (``exact_oracle.tolerance_for``): frink-models' 2e-4 wherever float32 itself is inside it.

Then ``bench.common.kernel_tail.run``'s benchmark (``bench.kernel_bench``). Writes
``data/bench/gpu_check-<device>-<UTC time>.json``; exit status 1 if any check fails.
"""

from __future__ import annotations

import datetime as _dt
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from bench.common import cli, kernel_tail, record
from bench.common.kernels import BONSAI
from workbench import backends, tail
from workbench.fold import QUANT_FORMATS, HadamardFold, WeightMatrix
from workbench.kernels import head_launch, run_kernel_tail
from workbench.studies import dequantize_exact, host_tail_exact, oracle_tolerance, tolerance_for
from workbench.tail import compare, seed_case

ROOT = Path(__file__).resolve().parent.parent


def _tail_case(
    name: str, w: tail.TailWeights, br: np.ndarray, res: np.ndarray, dialect: str, *, twice: bool = False
) -> dict[str, Any]:
    truth = host_tail_exact(w, br, res)
    tol, f32 = tolerance_for(w, br, res, truth)
    t0 = time.perf_counter()
    out = tail.fused_tail(w, br, res, backend=dialect)
    ms = (time.perf_counter() - t0) * 1e3
    c = compare(out, truth, tol=tol)
    entry = {
        "case": name,
        "shape": list(w.shape),
        "batch": list(np.shape(br)[:-1]),
        "weights": w.wo.dtype,
        "oracle": "host_tail float64" + (" (weights dequantized exactly)" if w.wo.quantization else ""),
        "fold": repr(w.wo.fold),
        "tol": tol,
        "f32_oracle_worst": f32,
        "worst": c.worst,
        "nmse": c.nmse,
        "max_abs": c.max_abs,
        "passed": bool(c.passed),
        "result": str(c),
        "first_call_ms": ms,
    }
    if dialect == "cuda":  # fused_tail ran the one launch; the three launches answer to the same oracle
        three = compare(run_kernel_tail("cuda", tail.tail_launch(w), br, res), truth, tol=tol)
        entry["three_launches_worst"], entry["three_launches_passed"] = three.worst, bool(three.passed)
        entry["passed"] = entry["passed"] and entry["three_launches_passed"]
    if w.wo.quantization is not None:  # what the mx.dequantize-based oracle says, for the record
        entry["vs_host_tail_mx_dequantize"] = compare(out, tail.host_tail(w, br, res), tol=tol).worst
    if twice:
        again = tail.fused_tail(w, br, res, backend=dialect)
        entry["deterministic"] = bool(
            np.array_equal(np.asarray(out).view(np.uint32), np.asarray(again).view(np.uint32))
        )
        entry["passed"] = entry["passed"] and entry["deterministic"]
    return entry


def _head_case(
    name: str,
    hidden: int,
    nq: int,
    nk: int,
    nv: int,
    block: int | None,
    dtype: str,
    seed: int,
    dialect: str,
    quant: str | None = None,
) -> dict[str, Any]:
    """The head launch against float64; ``quant`` (a name in ``QUANT_FORMATS``): the three
    matrices folded, then quantized (the oracle dequantizes their codes exactly)."""
    rng = np.random.default_rng(seed)
    fold = HadamardFold.random(hidden, block, seed=seed + 1, permute=True) if block else None
    mdt = {"float32": mx.float32, "bfloat16": mx.bfloat16}[dtype]

    def mat(rows: int) -> WeightMatrix:
        a = math.sqrt(3.0 / hidden)
        dense = mx.array(rng.uniform(-a, a, (rows, hidden)).astype(np.float32)).astype(mdt)
        if quant is not None:
            q = QUANT_FORMATS[quant]
            return WeightMatrix.quantize(dense, **q.as_quantize(), fold=fold)
        m = WeightMatrix(dense)
        return m.fold_hadamard(fold) if fold is not None else m

    def apply(m: WeightMatrix, n: np.ndarray) -> np.ndarray:
        """m's map on n in n's dtype, the stored base from its codes (dequantize_exact)."""
        xr = m.fold.rotate(n) if m.fold is not None else n
        return xr @ dequantize_exact(m, n.dtype).T

    q, k, v = mat(nq), mat(nk), mat(nv)
    x = rng.uniform(-1, 1, hidden).astype(np.float32)
    nw = (1 + rng.uniform(-0.25, 0.25, hidden)).astype(np.float32)
    eps = 1e-6

    def oracle(dt: Any) -> list[np.ndarray]:
        xd = x.astype(dt)
        n = tail.rms_norm_np(xd, nw.astype(dt), eps)
        return [apply(m, n) for m in (q, k, v)]  # computed in n's dtype

    truth = oracle(np.float64)
    f32 = oracle(np.float32)
    got = head_launch(mx.array(x), nw, eps, q, k, v, dialect)
    mx.eval(*got)
    t = np.concatenate(truth)
    worst32 = compare(np.concatenate(f32), t).worst
    tol = oracle_tolerance(worst32)
    c = compare(np.concatenate([np.array(g) for g in got]), t, tol=tol)
    return {
        "case": name,
        "shape": [hidden, nq, nk, nv],
        "weights": q.dtype,
        "fold": repr(fold),
        "tol": tol,
        "f32_oracle_worst": worst32,
        "worst": c.worst,
        "nmse": c.nmse,
        "max_abs": c.max_abs,
        "passed": bool(c.passed),
        "result": str(c),
    }


def _guarded(name: str, fn: Callable[..., dict[str, Any]], *args: Any, **kw: Any) -> dict[str, Any]:
    """``fn(*args)``, or a failed entry carrying the exception (so one broken case keeps the rest)."""
    try:
        return fn(*args, **kw)
    except Exception as e:
        import traceback

        traceback.print_exc()
        label = args[0] if args and isinstance(args[0], str) else name
        return {"case": label, "passed": False, "error": f"{type(e).__name__}: {e}"[:2000]}


def run_checks(
    dialect: str, seed: int, quick: bool = False, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """Every correctness check; each entry says its tolerance and why it passed or not."""
    results: list[dict[str, Any]] = []

    def add(e: dict[str, Any]) -> None:
        results.append(e)
        if "error" in e:
            log(f"  FAIL {e['case']:<50} {e['error']}")
            return
        three = f"; three launches {e['three_launches_worst']:.3g}" if "three_launches_worst" in e else ""
        log(
            f"  {'ok  ' if e['passed'] else 'FAIL'} {e['case']:<50} tol {e['tol']:.0e} "
            f"worst {e['worst']:.3g}{three} (f32 oracle {e['f32_oracle_worst']:.3g})"
        )

    c = seed_case()
    add(
        _guarded(
            "tail", _tail_case, "seed (64, 96, 80), block 16", c.weights, c.branch, c.residual, dialect, twice=True
        )
    )

    small = [  # (hidden, branch, ffn, block, permute, dtype)
        (128, 192, 256, 192, True, "float32"),  # m = 12, k = 4
        (256, 320, 512, 320, True, "bfloat16"),  # m = 20, k = 4
        (96, 448, 200, 448, True, "float32"),  # m = 28, k = 4
        (160, 336, 88, 28, False, "bfloat16"),  # m = 28, k = 0, twelve blocks
        (512, 1024, 1536, 1024, False, "bfloat16"),  # m = 1, k = 10
        (64, 240, 120, 12, True, "float32"),  # m = 12, k = 0
        (72, 128, 104, None, False, "float32"),  # no fold
    ]
    for i, (h, b, f, blk, perm, dt) in enumerate(small):
        w = tail.TailWeights.random(h, b, f, seed=seed + 10 + i, fold_block=blk, fold_permute=perm, dtype=dt)
        br, res = tail.random_inputs(w, seed=seed + 100 + i)
        add(
            _guarded(
                "tail",
                _tail_case,
                f"random ({h}, {b}, {f}) block {blk}{' perm' if perm else ''} {dt}",
                w,
                br,
                res,
                dialect,
            )
        )
    w = tail.TailWeights.random(128, 256, 384, seed=seed + 30, fold_block=64, dtype="float32")
    br, res = tail.random_inputs(w, seed=seed + 31, batch=3)
    add(_guarded("tail", _tail_case, "batch of 3 (128, 256, 384) block 64", w, br, res, dialect))
    wq = tail.TailWeights.random(
        256,
        512,
        768,
        seed=seed + 40,
        fold_block=128,
        dtype="bfloat16",
        quantize={"mode": "affine", "bits": 4, "group_size": 64},
    )
    br, res = tail.random_inputs(wq, seed=seed + 41)
    add(_guarded("tail", _tail_case, "random (256, 512, 768) affine4 g64", wq, br, res, dialect))
    wq = tail.TailWeights.random(
        256,
        1024,
        2048,
        seed=seed + 42,
        fold_block=256,
        dtype="bfloat16",
        quantize={"mode": "affine", "bits": 4, "group_size": 32},
    )
    br, res = tail.random_inputs(wq, seed=seed + 43)  # wo and down rows interleave their words (Q4_WORD)
    add(_guarded("tail", _tail_case, "random (256, 1024, 2048) affine4 g32", wq, br, res, dialect))
    # The other quantized formats the kernels read: rows interleaved (128 words a row or a
    # multiple) and not, every scale format, group sizes 16 to 64.
    for i, (name, shape, blk) in enumerate(
        (
            ("affine8", (256, 512, 768), 128),
            ("affine8", (256, 1024, 2048), 256),
            ("mxfp4", (256, 512, 768), 128),
            ("mxfp4", (256, 1024, 2048), 256),
            ("nvfp4", (256, 512, 768), 128),
            ("nvfp4", (256, 1024, 2048), 256),
        )
    ):
        q = QUANT_FORMATS[name]
        wq = tail.TailWeights.random(
            *shape, seed=seed + 80 + i, fold_block=blk, dtype="bfloat16", quantize=q.as_quantize()
        )
        br, res = tail.random_inputs(wq, seed=seed + 90 + i)
        add(_guarded("tail", _tail_case, f"random {shape} {name} g{q.group_size}", wq, br, res, dialect))
    add(
        _guarded(
            "head",
            _head_case,
            "head (1280; 2048, 256, 256) block 20x64",
            1280,
            2048,
            256,
            256,
            1280,
            "float32",
            seed + 50,
            dialect,
        )
    )
    for i, name in enumerate(("affine8", "mxfp4", "nvfp4")):
        add(
            _guarded(
                "head",
                _head_case,
                f"head (1024; 1024, 256, 256) block 1024 {name}",
                1024,
                1024,
                256,
                256,
                1024,
                "bfloat16",
                seed + 52 + i,
                dialect,
                quant=name,
            )
        )
    add(
        _guarded(
            "head",
            _head_case,
            "head (512; 512, 128, 128) no fold bf16",
            512,
            512,
            128,
            128,
            None,
            "bfloat16",
            seed + 51,
            dialect,
        )
    )
    if not quick:
        (hidden, branch, ffn), block = BONSAI
        for dt, qname in (
            ("float32", None),
            ("bfloat16", None),
            ("bfloat16", "affine4"),
            ("bfloat16", "affine8"),
            ("bfloat16", "mxfp4"),
            ("bfloat16", "nvfp4"),
        ):
            qs = QUANT_FORMATS[qname] if qname else None
            q = qs.as_quantize() if qs else None
            w = tail.TailWeights.random(hidden, branch, ffn, seed=seed + 60, fold_block=block, dtype=dt, quantize=q)
            br, res = tail.random_inputs(w, seed=seed + 61)
            label = f"Bonsai-27B {qname or dt}"
            add(_guarded("tail", _tail_case, label, w, br, res, dialect, twice=True))
            del w
        # Bonsai's head: q_proj 24 heads x 256 x 2 (the output gate), k and v 4 x 256.
        add(
            _guarded(
                "head",
                _head_case,
                f"head Bonsai ({hidden}; {2 * branch}, 1024, 1024) bf16",
                hidden,
                2 * branch,
                1024,
                1024,
                hidden,
                "bfloat16",
                seed + 70,
                dialect,
            )
        )
    return results


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser("gpu_check", __doc__)
    ap.add_argument("--quick", action="store_true", help="small checks only and a short benchmark")
    ap.add_argument("--checks-only", action="store_true", help="no benchmark")
    ap.add_argument("--repeats", type=int, default=50, help="timed rounds per variant")
    ap.add_argument("--seed", type=int, default=None, help="base seed (None: from the clock; recorded)")
    a = ap.parse_args(argv)
    cli.at_least(ap, "--repeats", a.repeats, 1)
    cli.at_least(ap, "--seed", a.seed, 0)

    dialect = "cuda" if backends.cuda_available() else ("metal" if backends.metal_available() else None)
    if dialect is None:
        print(
            "no GPU here: mx.cuda.is_available() and mx.metal.is_available() are both False; "
            "the kernel checks need MLX's CUDA back-end (mlx[cuda13]) or an Apple GPU"
        )
        return 2
    seed = a.seed if a.seed is not None else int(time.time()) % 100_000
    prov = record.provenance("gpu_check", argv)
    started = _dt.datetime.fromisoformat(prov["date"])
    info = prov["device"]
    device = info.get("device_name", f"{dialect} GPU")
    print(f"{dialect} kernels on {device}, MLX {mx.__version__}, seed {seed}")
    print("checks against the float64 oracle:")
    checks = run_checks(dialect, seed, quick=a.quick)
    rec: dict[str, Any] = {
        "what": "kernel tail: GPU checks against the float64 oracle, and the benchmark",
        **prov,
        # The name alone under "device", the full description under "device_info": the
        # layout every gpu_check record has had, which notebook 03 reads.
        "device": device,
        "device_info": info,
        "dialect": dialect,
        "seed": seed,
        "checks": checks,
        "checks_passed": all(c["passed"] for c in checks),
    }
    if not a.checks_only:
        try:
            rec["bench"] = kernel_tail.run(
                dialect, repeats=max(10, a.repeats // (3 if a.quick else 1)), seed=seed, quick=a.quick
            )
            kernel_tail.print_table(rec["bench"])
        except Exception as e:
            import traceback

            traceback.print_exc()
            rec["bench_error"] = repr(e)
    rec["seconds"] = (_dt.datetime.now(_dt.UTC) - started).total_seconds()
    if not a.no_record:
        print()
        record.write(rec, a.out_dir, record.record_stem("gpu_check", device, started), force=a.force)
    failed = [c["case"] for c in checks if not c["passed"]]
    print(f"\nchecks: {len(checks) - len(failed)} of {len(checks)} passed" + (f"; FAILED: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.gpu_check"))
