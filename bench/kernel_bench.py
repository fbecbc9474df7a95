"""The kernel tail's benchmark: kernels against the MLX graph, the unfused tail and PyTorch.

    python -m bench.kernel_bench                 # Bonsai-27B, bf16 and every quantized format, on this GPU
    python -m bench.gpu_check                    # the checks AND this benchmark, one record

At Bonsai-27B's tail (hidden 5120, branch 6144, ffn 17408; wo folded with block 1024),
side by side in one run and interleaved round by round:

* resident (inputs already on the device, one evaluation = one wait, timed from submit
  to result): the MLX graph (``tail.tail_graph``), the kernel tail (three launches in one
  evaluation), PyTorch eager and PyTorch replaying a CUDA graph of the same five ops
  (bf16 weights; PyTorch's matvec needs its vector in the weights' dtype, so its
  activations are bf16: its error against the float64 oracle is recorded beside it);
* end to end, as the engine runs a layer (branch and residual from the host, the result
  back to the host): the unfused tail (two waits), the graph and the kernels through
  ``tail.fused_tail``, and the kernels' path split into its parts (making the inputs,
  the evaluation, the read back);
* device time: 10 tails in one evaluation, per tail (no per-wait overhead), and each
  launch alone the same way, with its bandwidth;

against the floor: weight bytes over the copy bandwidth measured in the same run
(PyTorch's device-to-device copy, bytes read plus written; MLX's ``x + 1`` beside it).
The same again with each quantized format the kernels read (:data:`BENCH_FORMATS`:
affine 4- and 8-bit group 64, mxfp4, nvfp4; MLX's layouts), where PyTorch has no
matching matvec and is left out; each against its own floor (codes + scales bytes).

Every function here takes the dialect (``cuda`` / ``metal``); ``gpu_check`` calls
:func:`run` and writes the record.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import numpy as np

from bench.common import record
from workbench import backends, tail
from workbench.fold import hadamard
from workbench.kernels import launch as kernel_launch
from workbench.tail.comparison import compare
from workbench.studies.exact_oracle import host_tail_exact
from workbench.tail.frink_case import seed_case
from workbench.models.config import BONSAI_SHAPE
from workbench.fold.weights import QUANT_FORMATS

#: Bonsai-27B's tail and wo's fold block (bench/tail_bench.py uses the same).
BONSAI = (BONSAI_SHAPE, 1024)

#: The 4-bit format benchmarked: MLX affine, group 64 (mlx-lm's default).
Q4 = {"mode": "affine", "bits": 4, "group_size": 64}


def _torch() -> Any:
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 -- no PyTorch, or a broken one: the peer is left out
        return None


def time_rounds(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 3) -> dict[str, dict[str, float]]:
    """Each callable's wall-time summary (ms), interleaved round by round (``bench.common.record``)."""
    return {k: record.summarize(v) for k, v in record.time_rounds(fns, repeats, warmup).items()}


def copy_bandwidth_torch(nbytes: int = 1 << 30, repeats: int = 20) -> float | None:
    """Bytes/s of a device-to-device ``copy_`` (read + write), timed with CUDA events."""
    torch = _torch()
    if torch is None:
        return None
    src = torch.rand(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ts = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(ts)


def floor_bandwidth() -> dict[str, float | None]:
    """The copy bandwidths a CUDA bench divides bytes by for its floor, measured now:
    ``torch_copy`` (:func:`copy_bandwidth_torch`, device time by CUDA events; None without
    PyTorch), ``mlx_x_plus_1`` (``record.copy_bandwidth``: host time around one MLX
    evaluation, which on the H200 read about half the device's rate, 2.1 against 4.1 TB/s in
    ``tensor_core_rowdot-…195337Z`` and ``one_launch-…200209Z``) and ``used_for_floor``, the
    first where there is one. Every bench that writes a floor takes it from here, so
    floors from different benches divide by the same measure."""
    bw_torch = copy_bandwidth_torch()
    bw_mlx = record.copy_bandwidth(1 << 30, repeats=10)
    return {"torch_copy": bw_torch, "mlx_x_plus_1": bw_mlx, "used_for_floor": bw_torch or bw_mlx}


def _np32(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32))


def torch_peer(w: tail.TailWeights, branch: np.ndarray, residual: np.ndarray) -> dict[str, Any] | None:
    """PyTorch's five ops on the same (bf16) weights, eager and as a CUDA graph.

    Returns ``{"eager": fn, "graph": fn, "out": fn -> numpy}`` (each call waits on its
    result), or ``None`` without PyTorch/CUDA or for a quantized tail.
    """
    torch = _torch()
    if torch is None or w.wo.quantization is not None:
        return None
    import torch.nn.functional as F

    dev = "cuda"
    dt = torch.bfloat16 if w.wo.dtype == "bfloat16" else torch.float32

    def mat(m: Any) -> Any:
        return torch.from_numpy(_np32(m.launch_parts()[0])).to(dev).to(dt)

    wo, gate, up, down = mat(w.wo), mat(w.gate), mat(w.up), mat(w.down)
    nw = torch.from_numpy(w.ffn_norm).to(dev)
    fold = w.wo.fold
    blk = fold.block if fold is not None else 1
    signs = torch.from_numpy(fold.plan(w.shape[1]).signs).to(dev) if fold is not None else None
    perm = torch.from_numpy(fold.plan(w.shape[1]).perm.astype(np.int64)).to(dev) if fold is not None else None
    hbt = (torch.from_numpy((hadamard.hadamard_matrix(blk).T / np.sqrt(blk)).astype(np.float32)).to(dev)
           if fold is not None else None)
    eps = w.eps
    b_in = torch.from_numpy(branch).to(dev)
    r_in = torch.from_numpy(residual).to(dev)

    def five(b: Any, r: Any) -> Any:
        x = b
        if fold is not None:
            x = ((x * signs)[perm].view(-1, blk) @ hbt).view(-1)
        h = r + F.linear(x.to(dt), wo).float()
        n = (h * torch.rsqrt((h * h).mean() + eps) * nw).to(dt)
        return h + F.linear(F.silu(F.linear(n, gate)) * F.linear(n, up), down).float()

    def eager() -> Any:
        out = five(b_in, r_in)
        torch.cuda.synchronize()
        return out

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            five(b_in, r_in)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = five(b_in, r_in)

    def replay() -> Any:
        g.replay()
        torch.cuda.synchronize()
        return static_out

    def device_ms(fn: Callable[[], Any], n: int = 20) -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / n

    return {"eager": eager, "graph": replay, "out": lambda: replay().cpu().numpy(),
            "graph_device_ms": lambda: device_ms(g.replay), "torch": torch.__version__}


def per_launch_ms(prep: kernel_launch.PreparedTail, b: mx.array, r: mx.array, n: int = 20) -> dict[str, float]:
    """Device time of each launch alone: ``n`` copies in one evaluation, per copy."""
    h = prep.launch_wo(b, r)
    act = prep.launch_gate_up(h)
    mx.eval(h, act)
    runs = {"wo_residual": lambda: [prep.launch_wo(b, r) for _ in range(n)],
            "ffn_gate_up": lambda: [prep.launch_gate_up(h) for _ in range(n)],
            "ffn_down": lambda: [prep.launch_down(act, h) for _ in range(n)]}
    out = {}
    for k, mk in runs.items():
        mx.eval(mk())
        ts = []
        for _ in range(5):
            outs = mk()
            t0 = time.perf_counter()
            mx.eval(outs)
            ts.append((time.perf_counter() - t0) * 1e3 / n)
        out[k] = statistics.median(ts)
    return out


def build_eval_split(make: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Where a resident call's time goes (median ms): building the lazy graph (``make()``:
    Python and MLX's primitives) versus evaluating it (MLX's encoding, the launches, the wait)."""
    split: list[tuple[float, float]] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        o = make()
        t1 = time.perf_counter()
        mx.eval(o)
        split.append(((t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3))
    return {"build_graph": statistics.median(p[0] for p in split),
            "eval_and_wait": statistics.median(p[1] for p in split)}


def batched_ms(make: Callable[[], Any], n: int = 10, repeats: int = 5) -> float:
    """Per-tail time of ``n`` tails encoded in one evaluation (the per-wait cost amortised)."""
    mx.eval(make())
    ts = []
    for _ in range(repeats):
        outs = [make() for _ in range(n)]
        t0 = time.perf_counter()
        mx.eval(outs)
        ts.append((time.perf_counter() - t0) * 1e3 / n)
    return statistics.median(ts)


def launch_bytes(prep: kernel_launch.PreparedTail) -> dict[str, int]:
    def nb(m: Any) -> int:
        return m.nbytes

    return {"wo_residual": nb(prep.wo), "ffn_gate_up": nb(prep.gate) + nb(prep.up), "ffn_down": nb(prep.down)}


def sweep(w: tail.TailWeights, dialect: str, tunings: dict[str, kernel_launch.KernelTuning], b: mx.array, r: mx.array,
          repeats: int) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The kernel tail under each tuning: resident time of one wait (interleaved) and
    device time a tail (``batched_ms``). A tuning the device cannot launch (registers,
    shared memory) is dropped, said why, not fatal."""
    launch = tail.tail_launch(w)
    fns, device = {}, {}
    for k, t in tunings.items():
        try:
            p = kernel_launch.prepared(launch, dialect, t)
            mx.eval(p(b, r))
            fns[k] = lambda p=p: mx.eval(p(b, r))
            device[k] = batched_ms(lambda p=p: p(b, r))
        except Exception as e:  # noqa: BLE001
            print(f"tuning {k} failed: {e}")
    return time_rounds(fns, repeats), device


def bench_case(label: str, w: tail.TailWeights, dialect: str, tuning: kernel_launch.KernelTuning, bandwidth: float,
               repeats: int, seed: int) -> dict[str, Any]:
    """Every variant at one case; returns the record's entry (times in ms)."""
    br, res = tail.random_inputs(w, seed=seed)
    launch = tail.tail_launch(w)
    prep = kernel_launch.prepared(launch, dialect, tuning)
    b, r = mx.array(br), mx.array(res)
    mx.eval(b, r)
    truth = host_tail_exact(w, br, res)
    # MLX 0.32.4's CUDA quantized_matmul raised "SmallVector out of range" on a 1-D vector
    # (seen on the H200); with a batch axis of one it runs, so the graph gets that shape.
    lead = (1,) if w.wo.quantization is not None else ()
    bg, rg = b.reshape(*lead, -1), r.reshape(*lead, -1)
    brg, resg = br.reshape(*lead, -1), res.reshape(*lead, -1)

    resident: dict[str, Callable[[], Any]] = {"kernels": lambda: mx.eval(prep(b, r))}
    graph_ok = True
    try:  # MLX's quantized_matmul may not serve every format on every back-end: recorded, not fatal
        mx.eval(tail.tail_graph(launch, bg, rg))
        resident["mlx_graph"] = lambda: mx.eval(tail.tail_graph(launch, bg, rg))
    except Exception as e:  # noqa: BLE001
        graph_ok = False
        print(f"{label}: the MLX graph failed: {type(e).__name__}: {e}")
    try:  # the same three launches traced once by mx.compile (less Python per call)
        compiled = mx.compile(lambda x, y: prep(x, y))
        mx.eval(compiled(b, r))
        resident["kernels_compiled"] = lambda: mx.eval(compiled(b, r))
    except Exception as e:  # noqa: BLE001
        compiled = None
        print(f"mx.compile of the kernel tail failed: {e}")
    peer = torch_peer(w, br, res)
    if peer is not None:
        resident["torch_eager"] = peer["eager"]
        resident["torch_cuda_graph"] = peer["graph"]
    t_res = time_rounds(resident, repeats)

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
        "kernels": lambda: tail.fused_tail(w, br, res, backend=dialect),
        "kernels_parts": e2e_parts,
    }
    if graph_ok:
        e2e["unfused_two_waits"] = lambda: tail.unfused_tail(w, brg, resg)
        e2e["mlx_graph"] = lambda: tail.fused_tail(w, brg, resg, backend="graph")
    t_e2e = time_rounds(e2e, max(10, repeats // 2))
    parts = parts[-max(10, repeats // 2):]
    e2e_split = {k: statistics.median(p[i] for p in parts) for i, k in enumerate(("make_inputs", "eval", "read_back"))}
    resident_split = build_eval_split(lambda: prep(b, r), repeats)
    tiny = mx.array(np.ones(8, np.float32))
    t_wait = time_rounds({"tiny_eval": lambda: mx.eval(tiny + 1)}, repeats)["tiny_eval"]

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
        "error_vs_float64": {k: {"worst": v.worst, "nmse": v.nmse, "max_abs": v.max_abs, "str": str(v)}
                             for k, v in errs.items()},
        "tuning": vars(tuning) if not hasattr(tuning, "__dataclass_fields__") else
        {f: getattr(tuning, f) for f in tuning.__dataclass_fields__},
        "torch": peer["torch"] if peer is not None else None,
    }
    return entry


_T = kernel_launch.KernelTuning
#: Tunings tried on the bf16 Bonsai tail before the main table (the best is used).
TUNINGS: dict[str, kernel_launch.KernelTuning] = {
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
#: u / 4 units a batch for 4-bit rows (u / 2 for 8-bit: ``kernel_launch.units_for``), so the
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
    "u2_gu_gps4_down_r4": {"u_wo": 8, "u_gate_up": 8, "u_head": 8, "gu_groups_per_sm": 4, "down_rows": 4,
                           "u_down": 32},
}


def quant_sweep(w: tail.TailWeights, dialect: str, base: kernel_launch.KernelTuning, b: mx.array, r: mx.array,
                log: Callable[[str], None] = print) -> tuple[str, dict[str, float]]:
    """Device time a tail (``batched_ms``) under each of :data:`QUANT_TUNINGS`; the best's
    name and every time (a tuning that fails to build or launch is left out, said why)."""
    launch = tail.tail_launch(w)
    times: dict[str, float] = {}
    for name, change in QUANT_TUNINGS.items():
        try:
            p = kernel_launch.prepared(launch, dialect, dataclasses.replace(base, **change))
            times[name] = batched_ms(lambda p=p: p(b, r))
        except Exception as e:  # noqa: BLE001 -- registers or group memory over a limit: recorded, not fatal
            log(f"  quantized tuning {name} failed: {type(e).__name__}: {e}")
    best = min(times, key=times.__getitem__) if times else "as_bf16"
    return best, times


#: The quantized formats benchmarked after bf16 (names in ``workbench.fold.weights.QUANT_FORMATS``).
BENCH_FORMATS: tuple[str, ...] = ("affine4", "affine8", "mxfp4", "nvfp4")


def run(dialect: str, *, repeats: int = 50, seed: int = 0, quick: bool = False,
        shapes: tuple[tuple[int, int, int], int] = BONSAI, log: Callable[[str], None] = print,
        formats: tuple[str, ...] = BENCH_FORMATS) -> dict[str, Any]:
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
    sp = kernel_launch.prepared(sl, dialect)
    sb, sr = mx.array(c.branch), mx.array(c.residual)
    fixed = time_rounds({"kernels": lambda: mx.eval(sp(sb, sr)),
                         "mlx_graph": lambda: mx.eval(tail.tail_graph(sl, sb, sr)),
                         "one_tiny_eval": lambda: mx.eval(sb + 1)}, repeats)
    out["seed_size_resident_ms"] = {k: v["median_ms"] for k, v in fixed.items()}
    log("fixed cost at frink-models' test size (resident, median ms): "
        + ", ".join(f"{k} {v:.4f}" for k, v in out["seed_size_resident_ms"].items()))

    w16 = tail.TailWeights.random(hidden, branch, ffn, seed=seed, fold_block=block, dtype="bfloat16")
    b16, r16 = (mx.array(a) for a in tail.random_inputs(w16, seed=seed + 1))
    mx.eval(b16, r16)
    tunings = {"default": TUNINGS["default"]} if quick else TUNINGS
    sw, sw_device = sweep(w16, dialect, tunings, b16, r16, max(10, repeats // 2))
    # Chosen by device time: what a tuning changes is the launches' work; the one-wait
    # figure adds MLX's per-evaluation cost, the same for every tuning and noisier than the
    # differences between them (one sweep: 0.400-0.426 ms for eight tunings).
    best = min(sw_device, key=sw_device.__getitem__) if sw_device else "default"
    out["tuning_sweep_ms"] = {k: v["median_ms"] for k, v in sw.items()}
    out["tuning_sweep_device_ms"] = sw_device
    out["tuning_chosen"] = best
    log("tuning sweep (kernel tail; one wait resident / device a tail, median ms): "
        + ", ".join(f"{k} {sw[k]['median_ms']:.3f}/{sw_device[k]:.3f}" for k in sw_device) + f" -> {best}")
    tuning = tunings[best]
    kernel_launch.set_default_tuning(tuning)  # fused_tail(backend=...) below uses it too

    def case(label: str, make: Callable[[], tail.TailWeights], s: int) -> None:
        try:
            w = make()
            t = tuning
            if w.wo.quantization is not None and not quick:
                b, r = (mx.array(a) for a in tail.random_inputs(w, seed=s))
                best_q, times = quant_sweep(w, dialect, tuning, b, r, log)
                out.setdefault("quant_tuning_sweep_device_ms", {})[label] = times
                out.setdefault("quant_tuning_chosen", {})[label] = best_q
                log(f"{label} tuning sweep (device ms a tail): "
                    + ", ".join(f"{k} {v:.3f}" for k, v in times.items()) + f" -> {best_q}")
                t = dataclasses.replace(tuning, **QUANT_TUNINGS[best_q])
            kernel_launch.set_default_tuning(t)  # fused_tail(backend=...) in the case uses it too
            out["cases"].append(bench_case(label, w, dialect, t, bandwidth, repeats, s))
        except Exception as e:  # noqa: BLE001 -- record it and go on to the next case
            import traceback

            traceback.print_exc()
            out.setdefault("errors", {})[label] = f"{type(e).__name__}: {e}"
        finally:
            kernel_launch.set_default_tuning(tuning)

    case("bonsai27b-bf16", lambda: w16, seed + 2)
    del w16
    for i, name in enumerate(formats):
        q = QUANT_FORMATS[name]
        spec = q.as_quantize()
        case(f"bonsai27b-{name}-g{q.group_size}", lambda spec=spec, i=i: tail.TailWeights.random(
            hidden, branch, ffn, seed=seed + 3 + 2 * i, fold_block=block, dtype="bfloat16", quantize=spec),
            seed + 4 + 2 * i)
    return out


def print_table(bench: dict[str, Any]) -> None:
    bw = bench["copy_bandwidth_Bps"]["used_for_floor"]
    print(f"\nfloor = weight bytes / {bw / 1e12:.2f} TB/s (device copy, this run)")
    for label, times in bench.get("quant_tuning_sweep_device_ms", {}).items():
        print(f"{label}: tuning sweep, device ms a tail: " + ", ".join(f"{k} {v:.3f}" for k, v in times.items())
              + f" -> {bench['quant_tuning_chosen'][label]}")
    for c in bench["cases"]:
        print(f"\n{c['case']}: {c['weight_bytes'] / 1e6:.1f} MB, floor {c['floor_ms']:.3f} ms, "
              f"target {c['target_ms']:.3f} ms; kernels' device time {c['device_ms_per_tail']['kernels']:.3f} ms "
              f"= {c['device_ms_per_tail']['kernels'] / c['floor_ms']:.2f}x floor")
        print(f"  {'resident (one wait)':<26}{'median ms':>10}{'x floor':>9}{'/ kernels':>10}")
        k = c["resident_ms"]["kernels"]["median_ms"]
        for name, v in c["resident_ms"].items():
            m = v["median_ms"]
            print(f"  {name:<26}{m:>10.3f}{m / c['floor_ms']:>9.2f}{m / k:>10.2f}")
        rs = c.get("resident_kernel_split_ms", {})
        print("  kernels resident split: " + ", ".join(f"{n} {v:.3f}" for n, v in rs.items()))
        print(f"  {'device time per tail':<26}" + ", ".join(f"{n} {v:.3f}" for n, v in c["device_ms_per_tail"].items()))
        print("  launches alone: " + ", ".join(
            f"{n} {v:.3f} ms ({c['launch_bandwidth_GBps'][n] / 1e3:.2f} TB/s)" for n, v in c["launch_device_ms"].items()))
        print(f"  {'end to end':<26}" + ", ".join(f"{n} {v['median_ms']:.3f}" for n, v in c["end_to_end_ms"].items()))
        print("  kernel e2e split: " + ", ".join(f"{n} {v:.3f}" for n, v in c["end_to_end_kernel_split_ms"].items())
              + f"; one tiny eval {c['one_tiny_eval_ms']['median_ms']:.3f}")
        for n, e in c["error_vs_float64"].items():
            print(f"  error vs float64, {n}: worst {e['worst']:.3g}, NMSE {e['nmse']:.3g}")


def main(argv: list[str] | None = None) -> int:
    ap = record.parser("kernel_bench", __doc__, record_options=False,
                       writes="prints its tables and writes no record (bench.gpu_check runs it and writes one)")
    ap.add_argument("--repeats", type=int, default=50, help="timed rounds per variant")
    ap.add_argument("--quick", action="store_true", help="no tuning sweep")
    ap.add_argument("--formats", default=",".join(BENCH_FORMATS),
                    help=f"comma list of quantized formats after bf16 (default {','.join(BENCH_FORMATS)})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent.parent / "data" / "bench"),
                    help="where the JSON record goes")
    a = ap.parse_args(argv)
    formats = tuple(record.comma_list(ap, "--formats", a.formats, BENCH_FORMATS))
    dialect = "cuda" if backends.cuda_available() else ("metal" if backends.metal_available() else None)
    if dialect is None:
        print("no GPU: the kernel benchmark needs MLX's CUDA or Metal back-end")
        return 2
    prov = record.provenance("kernel_bench", argv)
    started = _dt.datetime.fromisoformat(prov["date"])
    bench = run(dialect, repeats=a.repeats, seed=a.seed, quick=a.quick, formats=formats)
    print_table(bench)
    device = prov["device"].get("device_name", f"{dialect} GPU")
    record.write({"what": "kernel tail benchmark: every weight format against its floor", **prov, "dialect": dialect,
                  "bench": bench}, a.out_dir, f"kernel_bench-{record.slug(device)}-{started.strftime('%Y%m%dT%H%M%SZ')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
