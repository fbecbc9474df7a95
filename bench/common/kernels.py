"""What the kernel benchmarks share: Bonsai-27B's shape, the floor's bandwidth, and device time.

Every CUDA or Metal bench of the kernels times the same way (``bench.common.timing``) and
divides by the same floor, so their figures compare across records:

* :data:`BONSAI` is the shape they run at, and :data:`BENCH_FORMATS` the quantized weight
  formats they run after bf16;
* :func:`floor_bandwidth` measures the copy bandwidth a floor divides weight bytes by;
* :func:`batched_ms` is device time a call (``n`` calls in one evaluation, MLX's
  per-evaluation cost amortised away), :func:`per_launch_ms` the same for each of a tail's
  three launches, and :func:`build_eval_split` where one evaluation's time goes;
* :func:`torch_peer` is PyTorch's tail on the same weights, the peer a bench sets beside
  the kernels where PyTorch and CUDA are here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from bench.common import timing
from workbench import tail
from workbench.fold import hadamard_matrix
from workbench.kernels import PreparedTail
from workbench.models import BONSAI_SHAPE

#: Bonsai-27B's tail and wo's fold block (bench/tail_bench.py uses the same).
BONSAI = (BONSAI_SHAPE, 1024)

#: The quantized formats benchmarked after bf16 (names in ``workbench.fold.weights.QUANT_FORMATS``).
BENCH_FORMATS: tuple[str, ...] = ("affine4", "affine8", "mxfp4", "nvfp4")


def _torch() -> Any:
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


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
    PyTorch), ``mlx_x_plus_1`` (``timing.copy_bandwidth``, measured as ``timing.copy_method``
    says) and ``used_for_floor``, the first where there is one. Every bench that writes a
    floor takes it from here, so floors from different benches divide by the same measure."""
    bw_torch = copy_bandwidth_torch()
    bw_mlx = timing.copy_bandwidth(1 << 30, repeats=10)
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
    hbt = (
        torch.from_numpy((hadamard_matrix(blk).T / np.sqrt(blk)).astype(np.float32)).to(dev)
        if fold is not None
        else None
    )
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

    return {
        "eager": eager,
        "graph": replay,
        "out": lambda: replay().cpu().numpy(),
        "graph_device_ms": lambda: device_ms(g.replay),
        "torch": torch.__version__,
    }


def per_launch_ms(prep: PreparedTail, b: mx.array, r: mx.array, n: int = 20) -> dict[str, float]:
    """Device time of each launch alone: ``n`` copies in one evaluation, per copy."""
    h = prep.launch_wo(b, r)
    act = prep.launch_gate_up(h)
    mx.eval(h, act)
    runs = {
        "wo_residual": lambda: [prep.launch_wo(b, r) for _ in range(n)],
        "ffn_gate_up": lambda: [prep.launch_gate_up(h) for _ in range(n)],
        "ffn_down": lambda: [prep.launch_down(act, h) for _ in range(n)],
    }
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
    return {
        "build_graph": statistics.median(p[0] for p in split),
        "eval_and_wait": statistics.median(p[1] for p in split),
    }


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


def launch_bytes(prep: PreparedTail) -> dict[str, int]:
    def nb(m: Any) -> int:
        return m.nbytes

    return {"wo_residual": nb(prep.wo), "ffn_gate_up": nb(prep.gate) + nb(prep.up), "ffn_down": nb(prep.down)}
