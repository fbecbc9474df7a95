"""The kernel tail's benchmark: kernels against the MLX graph, the unfused tail and PyTorch.

What ``python -m bench.kernel_bench`` prints and ``python -m bench.gpu_check`` records (its
``bench`` section), at Bonsai-27B's tail in bf16 and every quantized format the kernels
read; the command's help says what is measured. :func:`run` sweeps the tunings
(:data:`TUNINGS` for bf16, :data:`QUANT_TUNINGS` for each quantized format), then times
every variant of each case (:func:`bench_case`) against its floor; :func:`print_table`
prints it. Every function takes the dialect (``cuda`` / ``metal``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from bench.common.kernels import (
    BENCH_FORMATS,
    BONSAI,
    batched_ms,
    build_eval_split,
    floor_bandwidth,
    launch_bytes,
    per_launch_ms,
    torch_peer,
)
from bench.common.timing import summaries, time_rounds
from workbench import tail
from workbench.fold import QUANT_FORMATS
from workbench.kernels import KernelTuning, prepared
from workbench.studies import host_tail_exact
from workbench.tail import compare, seed_case

#: The 4-bit format benchmarked: MLX affine, group 64 (mlx-lm's default).
Q4 = {"mode": "affine", "bits": 4, "group_size": 64}


def sweep(
    w: tail.TailWeights,
    dialect: str,
    tunings: dict[str, KernelTuning],
    b: mx.array,
    r: mx.array,
    repeats: int,
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The kernel tail under each tuning: resident time of one wait (interleaved) and
    device time a tail (``batched_ms``). A tuning the device cannot launch (registers,
    shared memory) is dropped, said why, not fatal."""
    launch = tail.tail_launch(w)
    fns, device = {}, {}
    for k, t in tunings.items():
        try:
            p = prepared(launch, dialect, t)
            mx.eval(p(b, r))
            fns[k] = lambda p=p: mx.eval(p(b, r))
            device[k] = batched_ms(lambda p=p: p(b, r))
        except Exception as e:
            print(f"tuning {k} failed: {e}")
    return summaries(time_rounds(fns, repeats)), device


def bench_case(
    label: str,
    w: tail.TailWeights,
    dialect: str,
    tuning: KernelTuning,
    bandwidth: float,
    repeats: int,
    seed: int,
) -> dict[str, Any]:
    """Every variant at one case; returns the record's entry (times in ms)."""
    br, res = tail.random_inputs(w, seed=seed)
    launch = tail.tail_launch(w)
    prep = prepared(launch, dialect, tuning)
    b, r = mx.array(br), mx.array(res)
    mx.eval(b, r)
    truth = host_tail_exact(w, br, res)
    # MLX's CUDA quantized_matmul refuses a 1-D vector (docs/JOURNAL.md); with a batch axis
    # of one it runs, so the graph gets that shape.
    lead = (1,) if w.wo.quantization is not None else ()
    bg, rg = b.reshape(*lead, -1), r.reshape(*lead, -1)
    brg, resg = br.reshape(*lead, -1), res.reshape(*lead, -1)

    resident: dict[str, Callable[[], Any]] = {"kernels": lambda: mx.eval(prep(b, r))}
    graph_ok = True
    try:  # MLX's quantized_matmul may not serve every format on every back-end: recorded, not fatal
        mx.eval(tail.tail_graph(launch, bg, rg))
        resident["mlx_graph"] = lambda: mx.eval(tail.tail_graph(launch, bg, rg))
    except Exception as e:
        graph_ok = False
        print(f"{label}: the MLX graph failed: {type(e).__name__}: {e}")
    try:  # the same three launches traced once by mx.compile (less Python per call)
        compiled = mx.compile(lambda x, y: prep(x, y))
        mx.eval(compiled(b, r))
        resident["kernels_compiled"] = lambda: mx.eval(compiled(b, r))
    except Exception as e:
        compiled = None
        print(f"mx.compile of the kernel tail failed: {e}")
    peer = torch_peer(w, br, res)
    if peer is not None:
        resident["torch_eager"] = peer["eager"]
        resident["torch_cuda_graph"] = peer["graph"]
    t_res = summaries(time_rounds(resident, repeats))

    def e2e_parts() -> None:
        t0 = time.perf_counter()
        bi, ri = mx.array(br), mx.array(res)
        out = prep(bi, ri)
        t1 = time.perf_counter()
        mx.eval(out)
        t2 = time.perf_counter()
        np.array(out)
        t3 = time.perf_counter()
        parts.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))

    parts: list[tuple[float, float, float]] = []
    e2e = {
        "kernels": lambda: tail.fused_tail(w, br, res, backend=dialect, tuning=tuning),
        "kernels_parts": e2e_parts,
    }
    if graph_ok:
        e2e["unfused_two_waits"] = lambda: tail.unfused_tail(w, brg, resg)
        e2e["mlx_graph"] = lambda: tail.fused_tail(w, brg, resg, backend="graph")
    t_e2e = summaries(time_rounds(e2e, max(10, repeats // 2)))
    parts = parts[-max(10, repeats // 2) :]
    e2e_split = {k: statistics.median(p[i] for p in parts) for i, k in enumerate(("make_inputs", "eval", "read_back"))}
    resident_split = build_eval_split(lambda: prep(b, r), repeats)
    tiny = mx.array(np.ones(8, np.float32))
    t_wait = summaries(time_rounds({"tiny_eval": lambda: mx.eval(tiny + 1)}, repeats))["tiny_eval"]

    dev = {"kernels": batched_ms(lambda: prep(b, r))}
    if graph_ok:
        dev["mlx_graph"] = batched_ms(lambda: tail.tail_graph(launch, bg, rg))
    if peer is not None:
        dev["torch_cuda_graph"] = peer["graph_device_ms"]()
    launches = per_launch_ms(prep, b, r)
    lb = launch_bytes(prep)

    errs = {"kernels": compare(np.array(prep(b, r)), truth)}
    if graph_ok:
        errs["mlx_graph"] = compare(np.array(tail.tail_graph(launch, bg, rg)).reshape(-1), truth)
    if peer is not None:
        errs["torch"] = compare(peer["out"](), truth)
    wbytes = prep.weight_bytes()
    floor = wbytes / bandwidth * 1e3
    k_ms = t_res["kernels"]["median_ms"]
    entry = {
        "case": label,
        "shape": list(w.shape),
        "weights": w.wo.dtype,
        "fold_block": w.wo.fold.block if w.wo.fold is not None else None,
        "weight_bytes": wbytes,
        "floor_ms": floor,
        "target_ms": (2.0 if w.wo.quantization is not None else 1.5) * floor,
        "resident_ms": t_res,
        "end_to_end_ms": t_e2e,
        "end_to_end_kernel_split_ms": e2e_split,
        "one_tiny_eval_ms": t_wait,
        "resident_kernel_split_ms": resident_split,
        "device_ms_per_tail": dev,
        "launch_device_ms": launches,
        "launch_bandwidth_GBps": {k: lb[k] / (v * 1e-3) / 1e9 for k, v in launches.items()},
        "kernels_over_floor": k_ms / floor,
        "kernels_device_over_floor": dev["kernels"] / floor,
        "kernels_vs": {k: v["median_ms"] / k_ms for k, v in t_res.items() if k != "kernels"},
        "error_vs_float64": {
            k: {"worst": v.worst, "nmse": v.nmse, "max_abs": v.max_abs, "str": str(v)} for k, v in errs.items()
        },
        "tuning": vars(tuning)
        if not hasattr(tuning, "__dataclass_fields__")
        else {f: getattr(tuning, f) for f in tuning.__dataclass_fields__},
        "torch": peer["torch"] if peer is not None else None,
    }
    return entry


_T = KernelTuning
#: Tunings tried on the bf16 Bonsai tail before the main table (the best is used).
TUNINGS: dict[str, KernelTuning] = {
    "default": _T(),
    "wo1024": _T(wo_nt=1024, wo_groups_per_sm=1, head_nt=1024, head_groups_per_sm=1),
    "wo_u8_nopre": _T(u_wo=8, pre_wo=False),
    "wo256_small_groups": _T(wo_nt=256, wo_groups_per_sm=0, u_wo=8, pre_wo=False),
    "gu_gps4": _T(gu_groups_per_sm=4),
    "gu_pre": _T(pre_gate_up=True),
    "gu_u8": _T(u_gate_up=8),
    "down128": _T(down_nt=128, u_down=8),
    "down_r2": _T(down_rows=2),
    "down_r4": _T(down_rows=4),
    "down_r8": _T(down_rows=8, down_nt=128, u_down=32),
    "wo_gps3": _T(wo_groups_per_sm=3),
    "wo_gps3_down_r4": _T(wo_groups_per_sm=3, down_rows=4),
    "gu_gps4_down_r4": _T(gu_groups_per_sm=4, down_rows=4),
}


#: Tunings tried on each quantized tail before its row of the table, as changes to the bf16
#: sweep's choice (the best device time a tail is used). A quantized lane loads U =
#: u / 4 units a batch for 4-bit rows (u / 2 for 8-bit: ``workbench.kernels.matrices.units_for``), so the
#: bf16 defaults leave a 4-bit row 16 bytes in flight a lane; these try 2 and 4 units
#: (the memory-level parallelism a 4.2 TB/s stream needs), with and without an early batch;
#: and the launches' cached reads, which weigh more beside 4-bit weights: gate_up's groups
#: capped (each group reads h and the norm weights, 40 KB, for its rms_norm: 87 MB from L2
#: uncapped at Bonsai's shape, as much as affine 4-bit gate and up themselves) and down's
#: rows a group (each group reads all of act).
QUANT_TUNINGS: dict[str, dict[str, Any]] = {
    "as_bf16": {},
    "u2": {"u_wo": 8, "u_gate_up": 8, "u_head": 8},
    "u4": {"u_wo": 16, "u_gate_up": 16, "u_head": 16},
    "u2_gu_pre": {"u_wo": 8, "u_gate_up": 8, "u_head": 8, "pre_gate_up": True},
    "u4_down8": {"u_wo": 16, "u_gate_up": 16, "u_head": 16, "u_down": 32},
    "u2_gu512": {"u_wo": 8, "u_gate_up": 8, "u_head": 8, "rows_nt": 512},
    "gu_gps4": {"gu_groups_per_sm": 4},
    "u2_gu_gps4": {"u_wo": 8, "u_gate_up": 8, "u_head": 8, "gu_groups_per_sm": 4},
    "down_r4": {"down_rows": 4},
    "down_r4_u32": {"down_rows": 4, "u_down": 32},
    "u2_gu_gps4_down_r4": {"u_wo": 8, "u_gate_up": 8, "u_head": 8, "gu_groups_per_sm": 4, "down_rows": 4, "u_down": 32},
}


def quant_sweep(
    w: tail.TailWeights,
    dialect: str,
    base: KernelTuning,
    b: mx.array,
    r: mx.array,
    log: Callable[[str], None] = print,
) -> tuple[str, dict[str, float]]:
    """Device time a tail (``batched_ms``) under each of :data:`QUANT_TUNINGS`; the best's
    name and every time (a tuning that fails to build or launch is left out, said why)."""
    launch = tail.tail_launch(w)
    times: dict[str, float] = {}
    for name, change in QUANT_TUNINGS.items():
        try:
            p = prepared(launch, dialect, dataclasses.replace(base, **change))
            times[name] = batched_ms(lambda p=p: p(b, r))
        except Exception as e:
            log(f"  quantized tuning {name} failed: {type(e).__name__}: {e}")
    best = min(times, key=times.__getitem__) if times else "as_bf16"
    return best, times


def run(
    dialect: str,
    *,
    repeats: int = 50,
    seed: int = 0,
    quick: bool = False,
    shapes: tuple[tuple[int, int, int], int] = BONSAI,
    log: Callable[[str], None] = print,
    formats: tuple[str, ...] = BENCH_FORMATS,
) -> dict[str, Any]:
    """The whole benchmark; returns the record's ``bench`` section."""
    (hidden, branch, ffn), block = shapes
    bws = floor_bandwidth()
    bandwidth = bws["used_for_floor"]
    tb = "n/a" if bws["torch_copy"] is None else f"{bws['torch_copy'] / 1e12:.3f}"
    log(f"copy bandwidth: torch {tb} TB/s, mlx {bws['mlx_x_plus_1'] / 1e12:.3f} TB/s")
    out: dict[str, Any] = {"copy_bandwidth_Bps": bws, "cases": []}

    # The fixed cost: the same launches at frink-models' test size (no bytes to speak of).
    c = seed_case()
    sl = tail.tail_launch(c.weights)
    sp = prepared(sl, dialect)
    sb, sr = mx.array(c.branch), mx.array(c.residual)
    fixed = summaries(
        time_rounds(
            {
                "kernels": lambda: mx.eval(sp(sb, sr)),
                "mlx_graph": lambda: mx.eval(tail.tail_graph(sl, sb, sr)),
                "one_tiny_eval": lambda: mx.eval(sb + 1),
            },
            repeats,
        )
    )
    out["seed_size_resident_ms"] = {k: v["median_ms"] for k, v in fixed.items()}
    log(
        "fixed cost at frink-models' test size (resident, median ms): "
        + ", ".join(f"{k} {v:.4f}" for k, v in out["seed_size_resident_ms"].items())
    )

    w16 = tail.TailWeights.random(hidden, branch, ffn, seed=seed, fold_block=block, dtype="bfloat16")
    b16, r16 = (mx.array(a) for a in tail.random_inputs(w16, seed=seed + 1))
    mx.eval(b16, r16)
    tunings = {"default": TUNINGS["default"]} if quick else TUNINGS
    sw, sw_device = sweep(w16, dialect, tunings, b16, r16, max(10, repeats // 2))
    # Chosen by device time: what a tuning changes is the launches' work; the one-wait
    # figure adds MLX's per-evaluation cost, the same for every tuning and noisier than the
    # differences between them.
    best = min(sw_device, key=sw_device.__getitem__) if sw_device else "default"
    out["tuning_sweep_ms"] = {k: v["median_ms"] for k, v in sw.items()}
    out["tuning_sweep_device_ms"] = sw_device
    out["tuning_chosen"] = best
    log(
        "tuning sweep (kernel tail; one wait resident / device a tail, median ms): "
        + ", ".join(f"{k} {sw[k]['median_ms']:.3f}/{sw_device[k]:.3f}" for k in sw_device)
        + f" -> {best}"
    )
    tuning = tunings[best]

    def case(label: str, make: Callable[[], tail.TailWeights], s: int) -> None:
        try:
            w = make()
            t = tuning
            if w.wo.quantization is not None and not quick:
                b, r = (mx.array(a) for a in tail.random_inputs(w, seed=s))
                best_q, times = quant_sweep(w, dialect, tuning, b, r, log)
                out.setdefault("quant_tuning_sweep_device_ms", {})[label] = times
                out.setdefault("quant_tuning_chosen", {})[label] = best_q
                log(
                    f"{label} tuning sweep (device ms a tail): "
                    + ", ".join(f"{k} {v:.3f}" for k, v in times.items())
                    + f" -> {best_q}"
                )
                t = dataclasses.replace(tuning, **QUANT_TUNINGS[best_q])
            out["cases"].append(bench_case(label, w, dialect, t, bandwidth, repeats, s))
        except Exception as e:
            import traceback

            traceback.print_exc()
            out.setdefault("errors", {})[label] = f"{type(e).__name__}: {e}"

    case("bonsai27b-bf16", lambda w=w16: w, seed + 2)
    del w16
    for i, name in enumerate(formats):
        q = QUANT_FORMATS[name]
        spec = q.as_quantize()
        case(
            f"bonsai27b-{name}-g{q.group_size}",
            lambda spec=spec, i=i: tail.TailWeights.random(
                hidden, branch, ffn, seed=seed + 3 + 2 * i, fold_block=block, dtype="bfloat16", quantize=spec
            ),
            seed + 4 + 2 * i,
        )
    return out


def print_table(bench: dict[str, Any]) -> None:
    bw = bench["copy_bandwidth_Bps"]["used_for_floor"]
    print(f"\nfloor = weight bytes / {bw / 1e12:.2f} TB/s (device copy, this run)")
    for label, times in bench.get("quant_tuning_sweep_device_ms", {}).items():
        print(
            f"{label}: tuning sweep, device ms a tail: "
            + ", ".join(f"{k} {v:.3f}" for k, v in times.items())
            + f" -> {bench['quant_tuning_chosen'][label]}"
        )
    for c in bench["cases"]:
        print(
            f"\n{c['case']}: {c['weight_bytes'] / 1e6:.1f} MB, floor {c['floor_ms']:.3f} ms, "
            f"target {c['target_ms']:.3f} ms; kernels' device time {c['device_ms_per_tail']['kernels']:.3f} ms "
            f"= {c['device_ms_per_tail']['kernels'] / c['floor_ms']:.2f}x floor"
        )
        print(f"  {'resident (one wait)':<26}{'median ms':>10}{'x floor':>9}{'/ kernels':>10}")
        k = c["resident_ms"]["kernels"]["median_ms"]
        for name, v in c["resident_ms"].items():
            m = v["median_ms"]
            print(f"  {name:<26}{m:>10.3f}{m / c['floor_ms']:>9.2f}{m / k:>10.2f}")
        rs = c.get("resident_kernel_split_ms", {})
        print("  kernels resident split: " + ", ".join(f"{n} {v:.3f}" for n, v in rs.items()))
        print(f"  {'device time per tail':<26}" + ", ".join(f"{n} {v:.3f}" for n, v in c["device_ms_per_tail"].items()))
        print(
            "  launches alone: "
            + ", ".join(
                f"{n} {v:.3f} ms ({c['launch_bandwidth_GBps'][n] / 1e3:.2f} TB/s)"
                for n, v in c["launch_device_ms"].items()
            )
        )
        print(f"  {'end to end':<26}" + ", ".join(f"{n} {v['median_ms']:.3f}" for n, v in c["end_to_end_ms"].items()))
        print(
            "  kernel e2e split: "
            + ", ".join(f"{n} {v:.3f}" for n, v in c["end_to_end_kernel_split_ms"].items())
            + f"; one tiny eval {c['one_tiny_eval_ms']['median_ms']:.3f}"
        )
        for n, e in c["error_vs_float64"].items():
            print(f"  error vs float64, {n}: worst {e['worst']:.3g}, NMSE {e['nmse']:.3g}")
