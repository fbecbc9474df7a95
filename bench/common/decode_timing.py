"""Micro-benchmarks of the decode step's pieces: copy bandwidth, one piece's device time, a wait by its kind.

``bench.schedule_run`` measures these in the run they serve, beside the clock of
``workbench.decode.schedule.run_stages``: the device's streaming bandwidth
(:func:`copy_bandwidth`, for the weight-bytes floor of a token) and the price of a wait of
each kind between the step's own submissions (:func:`measure_splits`, for the price model
of ``workbench.waits.plan.model_saving``), with each side's device time
(:func:`piece_device_ms`). They time the device; nothing in the package calls them.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from bench.common import record
from workbench.decode.layers import attend_mx, attend_np, recurrent_layer
from workbench.decode.savings import MEASURED_SPLITS
from workbench.decode.schedule import Schedule
from workbench.decode.state import DecodeState, new_state
from workbench.validate import integer
from workbench.waits import measurement as wait_measurement
from workbench.waits import plan as waits


def copy_bandwidth(nbytes: int = 1 << 30, *, k: int = 8, n: int = 5) -> float:
    """The device's streaming bandwidth (bytes/s): ``k`` chained ``y + 1`` over ``nbytes``
    of float32 in ONE evaluation against one, each op a read and a write of ``nbytes``;
    the marginal time, so the wait and the allocation drop out (one ``x + 1`` with its
    wait read 2.8 TB/s on the H200 where the kernels stream at 4 TB/s). On the CPU it is
    ``record.copy_bandwidth``'s numpy copy, ``n`` times: MLX's CPU ``x + 1`` moves a tenth of
    the machine's rate, and a floor divided by it would flatter every CPU path tenfold."""
    nbytes = integer("nbytes", nbytes, minimum=1024)
    if record.device_kind() == "cpu":
        return record.copy_bandwidth(nbytes, repeats=integer("n", n, minimum=1))
    x = mx.zeros((nbytes // 4,), dtype=mx.float32)
    mx.eval(x)
    ms = piece_device_ms(lambda y: (y + 1.0,), x, k=k, n=n)
    del x
    if ms <= 0:
        # k copies measured no slower than one: the clock's noise is larger than the copy
        # (a loaded host, or nbytes too small for this device). A bandwidth would be a lie.
        raise RuntimeError(f"copy_bandwidth: {k} chained copies of {nbytes} bytes took no longer than one "
                           f"(marginal {ms:.4f} ms): the clock is noisier than the copy; use more nbytes or n")
    return 2 * nbytes / (ms / 1e3)


def piece_device_ms(piece, x: mx.array, *, k: int = 8, n: int = 5) -> float:
    """What one more copy of submission ``piece`` (a callable of :func:`split_pieces`) adds
    to ONE evaluation: ``k`` copies chained against one, ``(t_k - t_1) / (k - 1)``, the
    median of ``n`` (the wait and the fixed costs are in both, so they drop out). That is
    the device's time for it, or MLX's time to encode and launch it where that is longer
    (a recurrent layer's ~20 launches on the H200: the same in bf16 and 4-bit)."""
    k = integer("k", k, minimum=2)
    n = integer("n", n, minimum=1)

    def run(m: int) -> float:
        y, outs = x, []
        t0 = time.perf_counter()
        for _ in range(m):
            o = piece(y)
            y, outs = o[0], outs + list(o[1:])
        mx.eval(y, *outs)
        return time.perf_counter() - t0

    run(k)  # warm
    diffs = sorted((run(k) - run(1)) / (k - 1) * 1e3 for _ in range(n))
    return float(diffs[len(diffs) // 2])


def split_pieces(sched: Schedule, state: DecodeState) -> dict[str, Any]:
    """The step's submissions as callables ``x -> outputs`` (a tuple, the hidden first),
    built on ``sched``'s weights and matvecs, for timing splits between them:
    ``layer`` (a recurrent layer; its state advances), ``layer2`` (the next one), ``qkv``,
    ``wo`` (with a fixed attention branch), ``ffn`` and ``logits``; and, taking ``qkv``'s
    output, ``attend_wo`` (the cache and softmax on the device, then wo: stage 6's way)
    and ``host_attend_wo`` (Q/K/V read back, attention in numpy, the branch uploaded, then
    wo: stage 5's way), both against a copy of the KV cache ``state`` holds."""
    g, layers = sched.geom, sched.w.layers
    rec = [i for i, lay in enumerate(layers) if lay.kind == "recurrent"][:2]
    att = next(i for i, lay in enumerate(layers) if lay.kind == "attention")
    branch = mx.array(np.random.default_rng(5).uniform(-1, 1, g.branch).astype(np.float32))
    mx.eval(branch)

    def layer(i: int):
        return lambda x: (recurrent_layer(g, layers[i].w, x, state, i, sched.gdn, sched.mv), state.ssm[i],
                          state.conv[i])

    pos = state.length

    def attend_wo(t):
        x, q, k, v = t
        kc = mx.concatenate([state.dev_k[att], k.reshape(1, g.n_kv, g.head_dim)])
        vc = mx.concatenate([state.dev_v[att], v.reshape(1, g.n_kv, g.head_dim)])
        return (sched.mv.out_add(layers[att].w, "wo", attend_mx(g, q, kc, vc), x),)

    def host_attend_wo(t):
        x, q, k, v = t
        kc = np.concatenate([state.host_k[att][:pos], np.asarray(k).reshape(1, g.n_kv, g.head_dim)])
        vc = np.concatenate([state.host_v[att][:pos], np.asarray(v).reshape(1, g.n_kv, g.head_dim)])
        b = mx.array(attend_np(g, np.asarray(q), kc, vc))
        return (sched.mv.out_add(layers[att].w, "wo", b, x),)

    return {
        "attend_wo": attend_wo,
        "host_attend_wo": host_attend_wo,
        "layer": layer(rec[0]),
        "layer2": layer(rec[1]),
        "qkv": lambda x: (x, *sched.mv.attn_qkv(layers[att].w, x)),
        "wo": lambda x: (sched.mv.out_add(layers[att].w, "wo", branch, x),),
        "ffn": lambda x: (sched.mv.ffn(layers[att].w, x),),
        "logits": lambda x: (x, sched.mv.logits(sched.w.lm_head, sched.w.final_norm, x)),
    }


#: What the step's host reads after each piece when a wait follows it (``Schedule.step``):
#: nothing after a recurrent layer, x after wo or the FFN (the unfused tail), Q/K/V
#: (attention on the host), the logits.
HOST_READS: dict[str, Any] = {
    "layer": lambda out: (), "wo": lambda out: out[:1], "ffn": lambda out: out[:1], "qkv": lambda out: out[1:],
    "logits": lambda out: out[1:],
}


def _NOTHING(out) -> tuple:  # noqa: N802 -- a constant's role: the host reads nothing
    return ()


def measure_splits(sched: Schedule, kinds: Sequence[str] = MEASURED_SPLITS, *, n: int = 30, warmup: int = 3,
                   context: int = 32) -> list[dict]:
    """The price of a wait of each kind in ``kinds``, measured between the step's own
    submissions (``wait_measurement.measure_split_between``): ``"wo>host|ffn"`` times wo then
    the FFN split against joined, ``"layer|layer"`` two recurrent layers, and so on."""
    state = new_state(sched.w, context=context, max_new=2)
    pieces = split_pieces(sched, state)
    x = mx.array(sched.w.embed[0])
    mx.eval(x)
    out = []
    for kind in kinds:
        waits.check_split_kind("kinds[]", kind)
        a, b = kind.split("|")
        reads = a.endswith(waits.HOST_READ)
        a = a[: -len(waits.HOST_READ)] if reads else a
        if kind not in MEASURED_SPLITS:
            raise ValueError(f"kinds: {kind!r} cannot be built from the step's pieces; allowed: {MEASURED_SPLITS}")
        first = pieces[a]
        if kind == "qkv>host|wo":
            # Stage 5 against stage 6 at one attention layer: split, the host reads Q/K/V,
            # attends in numpy and uploads the branch; joined, the device attends. The
            # difference is what one such wait costs the step, the host's attention and
            # the device's idle time while it runs included.
            res = wait_measurement.measure_split_between(first, pieces["attend_wo"], x, n=n, warmup=warmup,
                                                         read_first=HOST_READS["qkv"], read_second=HOST_READS["wo"],
                                                         second_split=pieces["host_attend_wo"])
            dev = {"first": piece_device_ms(first, x),
                   "second": piece_device_ms(lambda y: pieces["attend_wo"](first(y)), x) - piece_device_ms(first, x)}
        else:
            second_piece = pieces["layer2" if (a, b) == ("layer", "layer") else b]
            res = wait_measurement.measure_split_between(first, lambda t, f=second_piece: f(t[0]), x, n=n,
                                                         warmup=warmup, read_first=HOST_READS[a] if reads else _NOTHING,
                                                         read_second=HOST_READS[b])
            dev = {"first": piece_device_ms(first, x), "second": piece_device_ms(second_piece, x)}
        # The device's idle time in the split round: its wall time less the two submissions' work.
        out.append({"split": kind, **res, "device_ms": dev,
                    "split_idle_ms": res["split_ms"] - dev["first"] - dev["second"],
                    "joined_idle_ms": res["joined_ms"] - dev["first"] - dev["second"]})
    return out
