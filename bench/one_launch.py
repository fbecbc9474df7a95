"""The tail as ONE CUDA launch against its three launches: checked, then timed, one record.

    python -m bench.one_launch                         # checks, the bf16 sweep, every format
    python -m bench.one_launch --formats bfloat16 --no-sweep   # bf16, in the shape fused_tail(backend="cuda") runs

Whether the one-launch tail (``workbench.kernels.one_launch``: the three bodies as phases between grid barriers)
removes what a tail's evaluation costs beyond its device time (MLX's cost a custom kernel evaluated), in one run:

1. **Checks first** (nothing is timed that has not passed), in ``one_launch.shape_for``'s shape: small tails in
   every format against the float64 oracle at ``bench.gpu_check``'s tolerance; Bonsai-27B's against the three
   launches (and in bf16 the oracle), the same bits twice; and a grid twice the SMs must raise
   ``GridBarrierTimeout`` and leave the next launch right (``--no-timeout-check`` skips it).
2. **A sweep** of the launch's shape and loads (``VARIANTS``) on the first format or each of
   ``--sweep-formats``; a variant is chosen only where it beats the default by more than ``CHOICE_MARGIN``.
3. **Per format**, interleaved round by round: one evaluation with its wait (three launches and one, plain and
   compiled; PyTorch's CUDA-graph replay in bf16; a tiny evaluation), device time a tail, and the floor.

Writes ``data/bench/one_launch-<device>-<UTC time>.json``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import sys
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from bench.common import cli, kernels, record, timing
from workbench import backends, tail
from workbench.decode import worst_scaled_error
from workbench.fold import QUANT_FORMATS
from workbench.kernels import (
    CHOICE_MARGIN,
    DEFAULT_TUNING,
    GridBarrierTimeout,
    KernelTuning,
    OneLaunchShape,
    OneLaunchTail,
    PreparedTail,
    prepared,
    shape_for,
)
from workbench.studies import host_tail_exact, tolerance_for
from workbench.tail import SEED_TOL, compare, seed_case

#: Weight formats: bfloat16 and the quantized ones the kernels read.
FORMATS: tuple[str, ...] = ("bfloat16", "affine4", "affine8", "mxfp4", "nvfp4")

#: The one launch's variants tried by the sweep: (changes to the three launches'
#: tuning, which set each phase's loads; the one launch's shape). At one group an SM the
#: registers a thread may use go up to 128, so more loads in flight cost no occupancy.
VARIANTS: dict[str, tuple[dict[str, Any], OneLaunchShape]] = {
    "default": ({}, OneLaunchShape()),
    "u8": ({"u_wo": 8, "u_gate_up": 8}, OneLaunchShape()),
    "u8_down_u32": ({"u_wo": 8, "u_gate_up": 8, "u_down": 32}, OneLaunchShape()),
    "down_r2": ({}, OneLaunchShape(down_rows=2)),
    "down_r8_u32": ({"u_down": 32}, OneLaunchShape(down_rows=8)),
    "gu_pre": ({"pre_gate_up": True}, OneLaunchShape()),
    "nt1024": ({}, OneLaunchShape(nt=1024)),
    # 24 and 20 warps an SM instead of 16: 70-80 registers a thread still fit one group an
    # SM (the bodies at 768 threads a group: tests/test_one_launch.py, emulated, against float64)
    "nt768": ({}, OneLaunchShape(nt=768)),
    "nt640": ({}, OneLaunchShape(nt=640)),
    # tried when the quantized formats were bound by instructions, not bytes (docs/JOURNAL.md,
    # "What bounds the 4-bit launches"): more 4-bit units in flight a lane (u / 4: 4 units at
    # u 16) and more warps an SM
    "u16": ({"u_wo": 16, "u_gate_up": 16}, OneLaunchShape()),
    "u8_nt640": ({"u_wo": 8, "u_gate_up": 8}, OneLaunchShape(nt=640)),
    # since the 4-bit loops lost a fifth to a third of their instructions, every launch
    # waits on its loads most while streaming at under half the copy bandwidth
    # (launch_profile-…181221Z): more loads in flight, from the shape chosen before (nvcc,
    # Bonsai's shape: 62-80 registers a thread in affine4 and nvfp4, no spills, all under
    # the 102 that one 640-thread group an SM leaves a thread)
    "u8_nt640_down_u32": ({"u_wo": 8, "u_gate_up": 8, "u_down": 32}, OneLaunchShape(nt=640)),
    "u8_nt640_down_r8_u32": ({"u_wo": 8, "u_gate_up": 8, "u_down": 32}, OneLaunchShape(nt=640, down_rows=8)),
    "u16_nt640": ({"u_wo": 16, "u_gate_up": 16}, OneLaunchShape(nt=640)),
    # two 512-thread groups an SM (32 warps, twice the default's 16): only where a thread
    # needs at most 64 registers (nvcc, Bonsai's shape: affine4 44, affine8 56, mxfp4 64;
    # bf16 70 and nvfp4 80 do not fit). Where they do not, half
    # the groups cannot be resident: the barriers give up after their limit and the
    # variant is recorded as failed (GridBarrierTimeout), as the safety-net check shows.
    "gps2": ({}, OneLaunchShape(groups_per_sm=2)),
}


#: The variant name a ``--no-sweep`` record gives each format: the shape and tuning
#: ``fused_tail(backend="cuda")`` runs (``one_launch.shape_for``, the default tuning).
FUSED_TAIL = "fused_tail"


#: How far the one launch's output may be from another float32 evaluation of the same
#: tail (the three launches, or the sweep's default variant), as
#: ``decode_matvec.worst_scaled_error``: frink-models' criterion, since the two differ only
#: in the order their sums run.
AGREE_TOL = SEED_TOL


# CHOICE_MARGIN (imported above): how much faster than the default a variant must be to be chosen
# over it (its reason: ``workbench.kernels.one_launch.CHOICE_MARGIN``, where the records' readers find it too).


def chosen_variants(
    formats: list[str], sweeps: dict[str, dict[str, Any]], margin: float = CHOICE_MARGIN
) -> dict[str, str]:
    """The variant each format is timed with: the fastest of its own sweep (device time a
    tail) where it was swept, else the first swept format's choice. The fastest replaces
    ``"default"`` only when it beats the default's time by more than ``margin`` (a
    fraction), and ``"default"`` stands where no variant of a sweep launched. Pure, so
    testable without a GPU."""

    def fastest(results: dict[str, Any]) -> str:
        ok = {k: v["device_ms"] for k, v in results.items() if "device_ms" in v}
        if not ok:
            return "default"
        best = min(ok, key=ok.__getitem__)
        if "default" in ok and ok[best] > ok["default"] * (1 - margin):
            return "default"
        return best

    first = fastest(next(iter(sweeps.values()))) if sweeps else "default"
    return {fmt: fastest(sweeps[fmt]) if fmt in sweeps else first for fmt in formats}


def _weights(fmt: str, shape: tuple[int, int, int], block: int, seed: int) -> tail.TailWeights:
    q = QUANT_FORMATS.get(fmt)
    spec = q.as_quantize() if q else None
    return tail.TailWeights.random(
        *shape, seed=seed, fold_block=block, dtype=fmt if q is None else "bfloat16", quantize=spec
    )


def _one(
    w: tail.TailWeights,
    tuning: KernelTuning | None = None,
    shape: OneLaunchShape | None = None,
) -> tuple[PreparedTail, OneLaunchTail]:
    """The prepared three launches and the one launch for ``w``; ``shape`` None: the shape
    ``fused_tail(backend="cuda")`` runs (``one_launch.shape_for``), which the checks check."""
    prep = prepared(tail.tail_launch(w), "cuda", tuning)
    return prep, OneLaunchTail(prep, shape or shape_for(prep))


def _check(
    name: str,
    w: tail.TailWeights,
    br: np.ndarray,
    res: np.ndarray,
    oracle: bool,
    tuning: KernelTuning | None = None,
    shape: OneLaunchShape | None = None,
) -> dict[str, Any]:
    """One case: the one launch against the three and (``oracle``) the float64 oracle."""
    prep, one = _one(w, tuning, shape)
    got = one.run(br, res)
    again = one.run(br, res)
    three = np.array(prep(mx.array(br), mx.array(res)))
    entry: dict[str, Any] = {
        "case": name,
        "shape": list(w.shape),
        "format": w.wo.dtype if w.wo.quantization is None else str(w.wo.quantization),
        "groups": one.groups,
        "nt": one.shape.nt,
        "row_units": one.shape.row_units,
        "vs_three_launches_worst_scaled": worst_scaled_error(got, three),
        "bits_equal_three_launches": int(np.sum(got.view(np.uint32) == three.view(np.uint32))),
        "outputs": int(got.size),
        "deterministic": bool(np.array_equal(got.view(np.uint32), again.view(np.uint32))),
        "finite": bool(np.isfinite(got).all()),
    }
    passed = entry["deterministic"] and entry["finite"]
    if oracle:
        truth = host_tail_exact(w, br, res)
        tol, f32 = tolerance_for(w, br, res, truth)
        c = compare(got, truth, tol=tol)
        entry.update(tolerance=tol, float32_oracle_worst=f32, vs_float64=str(c), worst=c.worst)
        passed = passed and c.passed
    else:  # the three launches are checked against float64 by bench.gpu_check: here, agreement with them
        entry["tolerance_vs_three"] = AGREE_TOL
        passed = passed and entry["vs_three_launches_worst_scaled"] <= AGREE_TOL
    entry["passed"] = bool(passed)
    print(
        f"check {name}: {'PASS' if passed else 'FAIL'}; "
        + (f"{entry['vs_float64']}; " if oracle else "")
        + f"vs three launches {entry['vs_three_launches_worst_scaled']:.3g} scaled, bits equal "
        f"{entry['bits_equal_three_launches']}/{entry['outputs']}, deterministic {entry['deterministic']}",
        flush=True,
    )
    return entry


def timeout_check(w: tail.TailWeights, br: np.ndarray, res: np.ndarray) -> dict[str, Any]:
    """The grid sized for twice the SMs (half its groups cannot be resident): the launch
    must raise GridBarrierTimeout, not hang and not return numbers; the next launch of a
    correctly sized grid must be right."""
    from workbench.kernels import multiprocessor_count

    sms = multiprocessor_count()
    prep, bad = _one(w, shape=OneLaunchShape(sm_count=2 * sms))
    t0 = time.perf_counter()
    try:
        bad.run(br, res)
        raised = None
    except GridBarrierTimeout as e:
        raised = str(e)
    seconds = time.perf_counter() - t0
    good = OneLaunchTail(prep, shape_for(prep)).run(br, res)
    three = np.array(prep(mx.array(br), mx.array(res)))
    ok_after = worst_scaled_error(good, three) <= AGREE_TOL
    out = {
        "sm_count": sms,
        "groups_launched": 2 * sms,
        "raised": raised,
        "seconds": seconds,
        "right_after": ok_after,
        "passed": raised is not None and ok_after,
    }
    print(
        f"check barrier timeout: {'PASS' if out['passed'] else 'FAIL'}: raised after {seconds:.1f} s: {raised}; "
        f"the next launch right: {ok_after}",
        flush=True,
    )
    return out


def chained_ms(one: OneLaunchTail, b: mx.array, r: mx.array, n: int = 10, repeats: int = 5) -> float:
    """Device time a tail of the one launch: ``n`` launches in one evaluation
    (``bench.common.kernels.batched_ms``), each naming the previous one's output (``after``), so
    they run one after the other as a decoder's layers would."""
    return kernels.batched_ms(lambda: one(b, r), n, repeats)


def sweep(w: tail.TailWeights, b: mx.array, r: mx.array, br: np.ndarray, res: np.ndarray) -> dict[str, Any]:
    """Device time a tail of each variant. A variant that fails to launch, or whose output
    is over ``AGREE_TOL`` from the first one's (the default), is recorded as failed, with
    no time, and the sweep goes on."""
    out: dict[str, Any] = {}
    base = DEFAULT_TUNING
    ref = None
    for name, (changes, shape) in VARIANTS.items():
        try:
            prep, one = _one(w, dataclasses.replace(base, **changes), shape)
            got = one.run(br, res)
            ref = got if ref is None else ref
            agree = worst_scaled_error(got, ref)
            if not agree <= AGREE_TOL:  # a variant that computes another tail is never chosen
                out[name] = {
                    "error": f"disagrees with the default variant: worst scaled {agree:.3g} > {AGREE_TOL:g}",
                    "vs_default_worst_scaled": agree,
                }
                print(f"variant {name} failed: {out[name]['error']}", flush=True)
                continue
            out[name] = {
                "device_ms": chained_ms(one, b, r),
                "vs_default_worst_scaled": agree,
                "changes": changes,
                "shape": dataclasses.asdict(shape),
            }
            print(
                f"variant {name}: {out[name]['device_ms']:.4f} ms a tail (agrees with default to {agree:.2g})",
                flush=True,
            )
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"variant {name} failed: {out[name]['error']}", flush=True)
    return out


def time_case(
    label: str,
    w: tail.TailWeights,
    tuning: KernelTuning,
    shape: OneLaunchShape,
    bandwidth: float,
    repeats: int,
    seed: int,
) -> dict[str, Any]:
    br, res = tail.random_inputs(w, seed=seed)
    b, r = mx.array(br), mx.array(res)
    mx.eval(b, r)
    prep, one = _one(w, tuning, shape)
    compiled3 = prep.compiled()
    compiled1 = one.compiled()
    tiny = mx.array(np.ones(8, np.float32))
    fns: dict[str, Callable[[], Any]] = {
        "three_launches": lambda: mx.eval(prep(b, r)),
        "three_launches_compiled": lambda: mx.eval(compiled3(b, r)),
        "one_launch": lambda: mx.eval(one(b, r)),
        "one_launch_compiled": lambda: mx.eval(compiled1(b, r)),
        "one_tiny_eval": lambda: mx.eval(tiny + 1),
    }
    peer = kernels.torch_peer(w, br, res)
    if peer is not None:
        fns["torch_cuda_graph"] = peer["graph"]
        fns["torch_eager"] = peer["eager"]
    resident = timing.summaries(timing.time_rounds(fns, repeats))
    device = {"three_launches": kernels.batched_ms(lambda: prep(b, r)), "one_launch": chained_ms(one, b, r)}
    if peer is not None:
        device["torch_cuda_graph"] = peer["graph_device_ms"]()
    split = kernels.build_eval_split(lambda: one(b, r), repeats)
    if one.barrier_failed():
        raise GridBarrierTimeout(f"{label}: a barrier timed out during the timing")
    floor = prep.weight_bytes() / bandwidth * 1e3
    med = {k: v["median_ms"] for k, v in resident.items()}
    entry = {
        "case": label,
        "weight_bytes": prep.weight_bytes(),
        "floor_ms": floor,
        "resident_ms": resident,
        "device_ms_per_tail": device,
        "one_launch_split_ms": split,
        "one_launch_compiled_over_three_compiled": med["one_launch_compiled"] / med["three_launches_compiled"],
        "device_one_over_three": device["one_launch"] / device["three_launches"],
        "device_over_floor": {k: v / floor for k, v in device.items()},
        "groups": one.groups,
        "nt": one.shape.nt,
        "row_units": one.shape.row_units,
    }
    if peer is not None:
        entry["one_launch_compiled_over_torch_graph"] = med["one_launch_compiled"] / med["torch_cuda_graph"]
    return entry


def fixed_cost(repeats: int) -> dict[str, float]:
    """One evaluation with its wait at frink-models' test size (nothing to stream): the
    three launches, the one launch (each plain and compiled), one tiny evaluation."""
    c = seed_case()
    prep, one = _one(c.weights, shape=OneLaunchShape())
    b, r = mx.array(c.branch), mx.array(c.residual)
    c3, c1 = prep.compiled(), one.compiled()
    tiny = mx.array(np.ones(8, np.float32))
    t = timing.summaries(
        timing.time_rounds(
            {
                "three_launches": lambda: mx.eval(prep(b, r)),
                "three_launches_compiled": lambda: mx.eval(c3(b, r)),
                "one_launch": lambda: mx.eval(one(b, r)),
                "one_launch_compiled": lambda: mx.eval(c1(b, r)),
                "one_tiny_eval": lambda: mx.eval(tiny + 1),
            },
            repeats,
        )
    )
    return {k: v["median_ms"] for k, v in t.items()}


def run(
    formats: list[str], repeats: int, seed: int, timeout: bool, sweep_formats: list[str] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"checks": [], "formats": formats}
    small = ((256, 1024, 2048), 256)
    c = seed_case()
    out["checks"].append(_check("frink-models test case", c.weights, c.branch, c.residual, oracle=True))
    for i, fmt in enumerate(formats):
        w = _weights(fmt, small[0], small[1], seed + i)
        br, res = tail.random_inputs(w, seed=seed + 50 + i)
        out["checks"].append(_check(f"small {fmt}", w, br, res, oracle=True))
    (hidden, branch, ffn), block = kernels.BONSAI
    bonsai: dict[str, tail.TailWeights] = {}
    for i, fmt in enumerate(formats):
        w = _weights(fmt, (hidden, branch, ffn), block, seed + 100 + i)
        br, res = tail.random_inputs(w, seed=seed + 150 + i)
        out["checks"].append(_check(f"bonsai27b {fmt}", w, br, res, oracle=fmt == "bfloat16"))
        bonsai[fmt] = w
    first = bonsai[formats[0]]
    if timeout:
        br, res = tail.random_inputs(first, seed=seed + 200)
        out["timeout_check"] = timeout_check(first, br, res)
    out["all_checks_passed"] = all(e["passed"] for e in out["checks"]) and (
        not timeout or out["timeout_check"]["passed"]
    )
    if not out["all_checks_passed"]:
        print("a check failed: nothing is timed")
        return out

    out["copy_bandwidth_Bps"] = kernels.floor_bandwidth()
    bandwidth = out["copy_bandwidth_Bps"]["used_for_floor"]
    out["seed_size_resident_ms"] = fixed_cost(repeats)
    print(
        "one evaluation at frink-models' test size (median ms): "
        + ", ".join(f"{k} {v:.4f}" for k, v in out["seed_size_resident_ms"].items()),
        flush=True,
    )

    # the sweep on each of sweep_formats (bf16 alone by default), each format timed with its
    # own sweep's fastest variant (or the first swept format's)
    out["sweeps"] = {}
    for fmt in [formats[0]] if sweep_formats is None else sweep_formats:
        br, res = tail.random_inputs(bonsai[fmt], seed=seed + 300)
        b, r = mx.array(br), mx.array(res)
        print(f"sweep, {fmt}:", flush=True)
        out["sweeps"][fmt] = sweep(bonsai[fmt], b, r, br, res)
    if out["sweeps"]:
        out["sweep"] = next(iter(out["sweeps"].values()))  # the first swept format's, as records before it had
        out["variant_chosen"] = chosen_variants(formats, out["sweeps"])
    else:  # --no-sweep
        out["variant_chosen"] = dict.fromkeys(formats, FUSED_TAIL)
    out["cases"] = []
    for i, fmt in enumerate(formats):
        if out["variant_chosen"][fmt] == FUSED_TAIL:
            tuning = DEFAULT_TUNING
            shape = shape_for(prepared(tail.tail_launch(bonsai[fmt]), "cuda", tuning))
        else:
            changes, shape = VARIANTS[out["variant_chosen"][fmt]]
            tuning = dataclasses.replace(DEFAULT_TUNING, **changes)
        try:
            out["cases"].append(
                time_case(f"bonsai27b-{fmt}", bonsai[fmt], tuning, shape, bandwidth, repeats, seed + 400 + i)
            )
            out["cases"][-1]["variant"] = out["variant_chosen"][fmt]
            print_case(out["cases"][-1])
        except Exception as e:
            out.setdefault("errors", {})[fmt] = f"{type(e).__name__}: {e}"
            print(f"{fmt}: {out['errors'][fmt]}", flush=True)
    return out


def print_case(c: dict[str, Any]) -> None:
    print(
        f"\n{c['case']}: {c['weight_bytes'] / 1e6:.1f} MB, floor {c['floor_ms']:.3f} ms; grid {c['groups']} x {c['nt']}"
    )
    print(f"  {'one evaluation, resident':<28}{'median ms':>10}{'x floor':>9}")
    for name, v in c["resident_ms"].items():
        print(f"  {name:<28}{v['median_ms']:>10.3f}{v['median_ms'] / c['floor_ms']:>9.2f}")
    print(
        "  device ms a tail: "
        + ", ".join(f"{k} {v:.3f} ({c['device_over_floor'][k]:.2f}x floor)" for k, v in c["device_ms_per_tail"].items())
    )
    line = f"  one launch compiled / three compiled: {c['one_launch_compiled_over_three_compiled']:.2f}"
    if "one_launch_compiled_over_torch_graph" in c:
        line += f"; / PyTorch CUDA graph: {c['one_launch_compiled_over_torch_graph']:.2f}"
    print(
        line + f"; one launch's build / eval+wait: {c['one_launch_split_ms']['build_graph']:.3f} / "
        f"{c['one_launch_split_ms']['eval_and_wait']:.3f} ms",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser("one_launch", __doc__)
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma list of {FORMATS}")
    ap.add_argument("--repeats", type=int, default=40, help="timed rounds a variant")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-timeout-check", action="store_true", help="skip the barrier-timeout check (8 s)")
    ap.add_argument(
        "--no-sweep",
        action="store_true",
        help="no sweep: each format timed in the shape fused_tail(backend='cuda') runs it",
    )
    ap.add_argument(
        "--sweep-formats",
        default=None,
        help="comma list of the formats whose own sweep of the variants chooses their timing's "
        "variant (default: the first of --formats; the others take its choice)",
    )
    a = ap.parse_args(argv)
    formats = cli.comma_list(ap, "--formats", a.formats, FORMATS)
    sweep_formats = (
        cli.comma_list(ap, "--sweep-formats", a.sweep_formats, formats) if a.sweep_formats is not None else None
    )
    if a.no_sweep and sweep_formats is not None:
        ap.error("--no-sweep and --sweep-formats exclude each other")
    if a.no_sweep:
        sweep_formats = []
    if a.repeats < 1:
        ap.error("--repeats must be >= 1")
    if not backends.cuda_available():
        print("no NVIDIA GPU here: the one-launch tail is CUDA only (MLX's CUDA back-end)")
        return 2
    prov = record.provenance("one_launch", argv)
    started = _dt.datetime.fromisoformat(prov["date"])
    out = run(formats, a.repeats, a.seed, not a.no_timeout_check, sweep_formats)
    rec = {"what": "the tail as one CUDA launch against its three launches", **prov, **out}
    if not a.no_record:
        device = prov["device"].get("device_name", "gpu")
        record.write(rec, a.out_dir, record.record_stem("one_launch", device, started), force=a.force)
    return 0 if out["all_checks_passed"] and not out.get("errors") else 1


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.one_launch"))
