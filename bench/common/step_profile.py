"""What one decode step asks of the device: the ops in its graph, and, where PyTorch is
installed beside a CUDA device, the kernels that ran and their device time.

A small model's decode on a fast GPU is bound by the host: every op in a step's graph is
Python building a node and MLX encoding it, whatever the device then spends. So the first
thing to count for a variant of the step is its ops (:func:`graph_ops`, from MLX's own
graph export; any device). The second is what the device ran (:func:`device_profile`):
PyTorch's profiler reads the CUDA driver's activity records (CUPTI) for the whole
process, so it sees MLX's kernels, and the CUDA API calls that launched them, as it sees
its own. PyTorch is not a dependency of the workbench; without it (or without a CUDA
device) :func:`device_profile` raises, naming what is missing.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable
from typing import Any

import mlx.core as mx

__all__ = ["graph_ops", "build_profile", "device_profile", "check_available", "ProfileUnavailable"]

_PRIMITIVE = re.compile(r'\[label ="([^"]+)", shape=rectangle\]')


class ProfileUnavailable(RuntimeError):
    """The device profile needs PyTorch with CUDA in this environment."""


def graph_ops(*outputs: mx.array) -> dict[str, int]:
    """The ops (MLX primitives) in the lazy graph that computes ``outputs``, by name, most
    frequent first: what evaluating them will encode (a compiled function counts as one
    op, named after the ops it fused). Call before evaluating: an evaluated array has no
    graph behind it."""
    fd, path = tempfile.mkstemp(suffix=".dot")
    os.close(fd)
    try:
        mx.export_to_dot(path, *outputs)
        with open(path, encoding="utf-8") as f:
            counts = Counter(_PRIMITIVE.findall(f.read()))
    finally:
        os.unlink(path)
    return dict(counts.most_common())


def _where(filename: str, line: int, name: str) -> str:
    """A profiled function as ``folder/file.py:line(name)``: the last two parts of its path,
    so a record names the code (``models/llama.py``, ``real_models/graph_tail.py``), not the
    machine's folders."""
    parts = filename.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{line}({name})"


def build_profile(
    build: Callable[[], Any], take: Callable[[Any], None], steps: int, top: int = 20
) -> list[dict[str, Any]]:
    """Where the host's time goes while it builds a decode step's graph: ``steps`` steps, each
    ``build()`` (the lazy step) run under Python's profiler and ``take(result)`` (the read, the
    next token) outside it. The ``top`` functions by their own time, each with its calls and
    its own and cumulative time a step (us). The profiler slows every Python call alike, so
    the figures compare variants; they are not the step's unprofiled time."""
    import cProfile
    import pstats

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: must be an integer >= 1, got {steps!r}")
    prof = cProfile.Profile()
    for _ in range(steps):
        prof.enable()
        got = build()
        prof.disable()
        take(got)
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, calls, tottime, cumtime, callers)
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [
        {
            "function": _where(*fn),
            "calls_per_step": s[1] / steps,
            "own_us_per_step": s[2] / steps * 1e6,
            "cum_us_per_step": s[3] / steps * 1e6,
        }
        for fn, s in ranked
    ]


def check_available() -> None:
    """Raise :class:`ProfileUnavailable` unless :func:`device_profile` can run here (so a
    command can refuse its option before a long run, not after)."""
    try:
        import torch
    except ImportError as e:
        raise ProfileUnavailable(
            f"the device profile reads CUDA's activity records through PyTorch's profiler; "
            f"PyTorch is not importable here ({e})"
        ) from None
    if not torch.cuda.is_available():
        raise ProfileUnavailable("the device profile needs a CUDA device; torch.cuda.is_available() is False")


def device_profile(run: Callable[[], Any], steps: int) -> dict[str, Any]:
    """Run ``run()`` (which decodes ``steps`` tokens) under PyTorch's profiler and return,
    a step: kernels launched, their summed device time (us), CUDA graph launches; the
    ten kernels with the most device time (name, launches a step, us a step); and the
    eight CUDA runtime or driver calls with the most host time (``host_api``: name,
    calls a step, host us a step), what the host spends handing the step to the device.

    Raises :class:`ProfileUnavailable` without PyTorch or a CUDA device."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps: must be an integer >= 1, got {steps!r}")
    check_available()
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
    kernels: dict[str, list[float]] = {}
    api: dict[str, list[float]] = {}
    graph_launches = 0
    for e in prof.key_averages():
        device_us = float(getattr(e, "device_time_total", 0.0) or getattr(e, "cuda_time_total", 0.0))
        if e.key == "cudaGraphLaunch":
            graph_launches += int(e.count)
        if e.key.startswith("cu") and not device_us:  # a CUDA runtime or driver call: host time
            api[e.key] = [int(e.count), float(e.cpu_time_total)]
        elif device_us > 0 and not e.key.startswith(("cuda", "Memcpy", "Memset")):
            kernels[e.key] = [int(e.count), device_us]
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:10]
    top_api = sorted(api.items(), key=lambda kv: -kv[1][1])[:8]
    return {
        "steps": steps,
        "kernels_per_step": sum(c for c, _ in kernels.values()) / steps,
        "device_us_per_step": sum(us for _, us in kernels.values()) / steps,
        "graph_launches_per_step": graph_launches / steps,
        "top_kernels": [{"name": k[:120], "per_step": c / steps, "us_per_step": us / steps} for k, (c, us) in top],
        "host_api": [{"name": k, "per_step": c / steps, "us_per_step": us / steps} for k, (c, us) in top_api],
    }
