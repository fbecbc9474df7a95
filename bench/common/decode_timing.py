"""The price of a wait by its kind, measured between the decode step's own submissions.

``bench.schedule_run`` measures it in the run it serves, beside the clock of
``bench.common.stages.run_stages``: the step's submissions as callables
(:func:`split_pieces`) and the price of a wait of each kind between them
(:func:`measure_splits`, for the price model of ``workbench.waits.plan.model_saving``),
with each side's device time (``timing.piece_device_ms``). They time the device; nothing
in the package calls them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from bench.common.timing import piece_device_ms
from workbench.decode import MEASURED_SPLITS, DecodeState, Schedule, attend_mx, attend_np, new_state, recurrent_layer
from workbench.waits import HOST_READ, check_split_kind, measure_split_between


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
        return lambda x: (
            recurrent_layer(g, layers[i].w, x, state, i, sched.gdn, sched.mv),
            state.ssm[i],
            state.conv[i],
        )

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
    "layer": lambda out: (),
    "wo": lambda out: out[:1],
    "ffn": lambda out: out[:1],
    "qkv": lambda out: out[1:],
    "logits": lambda out: out[1:],
}


def _nothing(out: Any) -> tuple:
    """What the host reads after a piece no wait follows: nothing."""
    return ()


def measure_splits(
    sched: Schedule, kinds: Sequence[str] = MEASURED_SPLITS, *, n: int = 30, warmup: int = 3, context: int = 32
) -> list[dict]:
    """The price of a wait of each kind in ``kinds``, measured between the step's own
    submissions (``wait_measurement.measure_split_between``): ``"wo>host|ffn"`` times wo then
    the FFN split against joined, ``"layer|layer"`` two recurrent layers, and so on."""
    state = new_state(sched.w, context=context, max_new=2)
    pieces = split_pieces(sched, state)
    x = mx.array(sched.w.embed[0])
    mx.eval(x)
    out = []
    for kind in kinds:
        check_split_kind("kinds[]", kind)
        a, b = kind.split("|")
        reads = a.endswith(HOST_READ)
        a = a[: -len(HOST_READ)] if reads else a
        if kind not in MEASURED_SPLITS:
            raise ValueError(f"kinds: {kind!r} cannot be built from the step's pieces; allowed: {MEASURED_SPLITS}")
        first = pieces[a]
        if kind == "qkv>host|wo":
            # Stage 5 against stage 6 at one attention layer: split, the host reads Q/K/V,
            # attends in numpy and uploads the branch; joined, the device attends. The
            # difference is what one such wait costs the step, the host's attention and
            # the device's idle time while it runs included.
            res = measure_split_between(
                first,
                pieces["attend_wo"],
                x,
                n=n,
                warmup=warmup,
                read_first=HOST_READS["qkv"],
                read_second=HOST_READS["wo"],
                second_split=pieces["host_attend_wo"],
            )
            dev = {
                "first": piece_device_ms(first, x),
                "second": piece_device_ms(lambda y, f=first: pieces["attend_wo"](f(y)), x) - piece_device_ms(first, x),
            }
        else:
            second_piece = pieces["layer2" if (a, b) == ("layer", "layer") else b]
            res = measure_split_between(
                first,
                lambda t, f=second_piece: f(t[0]),
                x,
                n=n,
                warmup=warmup,
                read_first=HOST_READS[a] if reads else _nothing,
                read_second=HOST_READS[b],
            )
            dev = {"first": piece_device_ms(first, x), "second": piece_device_ms(second_piece, x)}
        # The device's idle time in the split round: its wall time less the two submissions' work.
        out.append(
            {
                "split": kind,
                **res,
                "device_ms": dev,
                "split_idle_ms": res["split_ms"] - dev["first"] - dev["second"],
                "joined_idle_ms": res["joined_ms"] - dev["first"] - dev["second"],
            }
        )
    return out
