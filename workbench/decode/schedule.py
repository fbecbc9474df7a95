"""A hybrid model's decode token executed as a stage of the resident-state plan groups it.

``workbench.waits.plan`` COUNTS the waits a token costs at each stage of the plan; this module
RUNS one token that way, so the table can be checked against a clock: the token's GPU pieces
are grouped into submissions exactly as ``waits.submissions`` groups them, each built lazily
and evaluated by ONE ``mx.eval``, which is one wait. The executor counts its ``mx.eval`` calls
(``TokenResult.waits``); tests check that against ``waits.waits_per_token`` and against
``workbench.waits.measurement.count_waits``, which sees every evaluation and host read MLX
does. Grouping changes where the waits fall, never the arithmetic: every stage computes the
same ops on the same values (checked in tests).

:class:`Schedule` holds a model and its plan; :func:`check_step` checks the kernels' token
against the MLX-ops one; :func:`in_token_probes` builds the tokens that price a wait inside a
token. Timing the stages is a benchmark's (``bench.common.stages.run_stages``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from workbench.decode import matvec as decode_matvec
from workbench.decode.layers import GDN_PATHS, attend_mx, attend_np, recurrent_layer
from workbench.decode.savings import MEASURED_SPLITS
from workbench.decode.state import DecodeState, HybridWeights, check_state, new_state
from workbench.validate import describe, flag, integer, number, one_of
from workbench.waits import plan as waits

if TYPE_CHECKING:
    from workbench.kernels.tuning import KernelTuning
    from workbench.models.config import ModelConfig


@dataclass
class TokenResult:
    """One decoded token: its logits, the waits (``mx.eval`` calls) it made, its wall time, the next token."""

    logits: np.ndarray
    waits: int
    seconds: float
    next_token: int
    eval_seconds: float = 0.0  # of ``seconds``, inside mx.eval (encoding, submitting, waiting)


class Schedule:
    """One model's weights and the plan's grouping of its token, ready to decode.

    Where a token's pieces run:

    - recurrent layers (Gated DeltaNet, :mod:`workbench.decode.layers`) on the device, their
      state (and the short convolution's) kept between tokens;
    - attention on the host: numpy, with a KV cache, as frink-models' engine runs it (or, at the
      device floor, as MLX ops with the cache on the device);
    - the attention tail as two pieces (wo; FFN) or fused (one), on the device.

    Every weight's product goes through ``workbench.decode.matvec``: MLX ops (``matvec="mlx"``)
    or the project's kernels (``matvec="kernels"``, weights read in their stored format,
    float32 activations), so a stage can split the tail (wo and the FFN in two submissions at
    stage 1) or join it to the next recurrent run (stage 4 and the floor) on either path.

    ``eligible``: the attention layers whose tail fuses; default ``waits.eligible_layers``
    (``workbench.models.refusals``). ``gdn``: ``"fast"`` runs the recurrence through
    ``mx.fast.gated_delta_update``, ``"ops"`` through ``layers.gated_delta_ops``, each with
    the conv, norms, gates and z gate as MLX ops around it; ``"kernel"`` runs all of that
    as ONE launch (``workbench.kernels.gdn_step``, ``kernels/gdn_step.body``), so a recurrent
    layer is four launches: gdn_in, gdn_step, out_add, the FFN's two (only with
    ``matvec="kernels"``: it is one of the project's kernels).
    ``matvec``: every weight's product as MLX ops (``"mlx"``) or through the project's
    kernels (``"kernels"``: ``BackendUnavailable`` where no kernel backend exists); see
    :mod:`workbench.decode.matvec`. ``activations``: the ``"mlx"`` path's (``"weights"``:
    x cast to the weights' dtype, as the schedule always ran; ``"float32"``: the kernels'
    arithmetic, for checking them). ``compiled``: each recurrent layer traced once per
    layer weights by ``mx.compile`` (MLX fuses its elementwise ops, and a token's graph is
    built with one call a layer instead of ~30 ops: Python's graph building is work the
    device waits for, on every path); the waits are the same. ``overlap``: every ``overlap``
    layers of a submission, what is built so far is handed to the device with
    ``mx.async_eval``, which does not wait, so the device runs those layers while the host
    builds the next (0: the submission goes to the device whole, at its one ``mx.eval``).
    The waits, the ops and the values are the same; only when the device starts changes.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        weights: HybridWeights,
        *,
        eligible: Sequence[int] | None = None,
        plan: waits.Plan | None = None,
        gdn: str = "fast",
        matvec: str = "mlx",
        activations: str = "weights",
        tuning: KernelTuning | None = None,
        compiled: bool = False,
        overlap: int = 0,
    ) -> None:
        one_of("activations", activations, decode_matvec.ACTIVATIONS)
        if gdn not in GDN_PATHS:
            raise ValueError(
                f"gdn: must be 'fast' (mx.fast.gated_delta_update), 'ops' (gated_delta_ops) or 'kernel' "
                f"(the gdn_step kernel, with matvec='kernels'), got {gdn!r}"
            )
        if gdn == "kernel":
            one_of("matvec", matvec, decode_matvec.MATVEC_PATHS)
            if matvec != "kernels":
                raise ValueError(
                    f"gdn: 'kernel' (the gdn_step kernel) runs with the project's kernels only "
                    f"(matvec='kernels'), got matvec={matvec!r}; use gdn='fast' or 'ops' with MLX ops"
                )
        if not isinstance(weights, HybridWeights):
            raise ValueError(f"weights: must be HybridWeights, got {describe(weights)}")
        self.gdn = gdn
        self.cfg, self.w, self.geom = cfg, weights, weights.geom
        self.mv = decode_matvec.make_matvecs(matvec, weights.geom.eps, activations=activations, tuning=tuning)
        self.matvec = self.mv.path
        self.compiled = flag("compiled", compiled)
        self.overlap = integer("overlap", overlap, minimum=0)
        self._layer_fns: dict[int, Any] = {}
        self._layer_keep: list = []  # the weight dicts keyed by id in _layer_fns, kept alive
        self.plan = waits.as_plan(plan)
        self.eligible = tuple(waits.eligible_layers(cfg) if eligible is None else eligible)
        waits.submissions(cfg, self.plan.stages[0], plan=self.plan, eligible=self.eligible)  # checks eligible
        self._subs: dict[int, list] = {}
        self._checked: dict[int, tuple[Any, list]] = {}  # per stage, the last list given to step and its check

    def submissions(self, stage) -> list:
        st = self.plan.stage(stage)
        if st.number not in self._subs:
            self._subs[st.number] = waits.submissions(self.cfg, st, plan=self.plan, eligible=self.eligible)
        return self._subs[st.number]

    def _recurrent_fn(self, lw: Mapping[str, Any]):
        """``(x, conv, ssm) -> (x, conv, ssm)`` for one recurrent layer's weights (traced
        once per weights by ``mx.compile`` with ``compiled``)."""
        fn = self._layer_fns.get(id(lw))
        if fn is None:
            g, gdn, mv = self.geom, self.gdn, self.mv

            def layer(x, conv, ssm):
                st = DecodeState({0: ssm}, {0: conv}, {}, {}, {}, {}, 0)
                y = recurrent_layer(g, lw, x, st, 0, gdn, mv)
                return y, st.conv[0], st.ssm[0]

            fn = mx.compile(layer) if self.compiled else layer
            self._layer_fns[id(lw)] = fn
            self._layer_keep.append(lw)
        return fn

    def check_submissions(self, stage, subs: Sequence) -> list:
        """``subs`` as a list of submissions ``step`` can run at ``stage`` in place of the
        stage's own: the stage's pieces in the same order, only grouped otherwise (e.g.
        ``waits.join_splits`` of them), and no submission going on past Q/K/V that the host
        attends with (a stage that attends on the host). ValueError naming what differs."""
        st = self.plan.stage(stage)
        if isinstance(subs, (str, bytes)) or not isinstance(subs, Sequence) or not subs:
            raise ValueError(f"submissions: must be a non-empty list of tuples of pieces, got {describe(subs)}")
        subs = [tuple(sub) for sub in subs]
        own = [p for sub in self.submissions(st) for p in sub]
        if [p for sub in subs for p in sub] != own:
            raise ValueError(f"submissions: must hold stage {st.number}'s pieces in its order, grouped otherwise")
        if not st.attention_on_device:
            for i, sub in enumerate(subs):
                if any(p.kind == "qkv" for p in sub[:-1]):
                    raise ValueError(
                        f"submissions[{i}]: goes on past a layer's Q/K/V, which the host attends with "
                        f"at stage {st.number}; end the submission there"
                    )
        return subs

    def step(self, state: DecodeState, stage, *, submissions: Sequence | None = None) -> TokenResult:
        """Decode one token at ``stage``: build each submission lazily, evaluate it once.

        The next token's input is a row of a small host table picked by the argmax of the
        logits (the embedding lookup is host work).

        ``submissions``: the token's submissions in place of the stage's own, checked by
        :meth:`check_submissions` (once for a list passed again): the same pieces with some
        waits joined, to price a kind of wait inside a token. ValueError when ``state`` is
        not a ``DecodeState``, was made for other weights (``state.check_state``) or its KV
        caches are full (it was made by ``new_state`` for fewer tokens than it is asked for).
        """
        g, layers = self.geom, self.w.layers
        if not isinstance(state, DecodeState):
            raise ValueError(f"state: must be a DecodeState (new_state), got {describe(state)}")
        check_state(state, self.w)
        if submissions is None:
            subs = self.submissions(stage)
        else:
            n = self.plan.stage(stage).number
            if self._checked.get(n, (None,))[0] is not submissions:  # the last list checked, per stage
                self._checked[n] = (submissions, self.check_submissions(n, submissions))
            subs = self._checked[n][1]
        caps = {int(c.shape[0]) for c in state.host_k.values()}
        if caps and state.length >= min(caps):
            raise ValueError(
                f"state: its KV caches hold {min(caps)} tokens and all are used (length "
                f"{state.length}); make it with new_state(..., max_new=) for more tokens"
            )
        t0 = time.perf_counter()
        x = mx.array(self.w.embed[state.token % self.w.embed.shape[0]])
        pos = state.length
        n_waits = 0
        t_eval = 0.0
        qkv: dict[int, tuple] = {}
        branch: dict[int, mx.array] = {}
        logits = None
        for sub in subs:
            outs: list[mx.array] = []
            handed = 0  # outs already handed to the device by mx.async_eval
            begun = 0  # layers begun in this submission
            for piece in sub:
                if piece.kind in ("layer", "qkv"):  # a layer begins here
                    if self.overlap and begun and begun % self.overlap == 0:
                        # x and the states so far go to the device, no wait
                        mx.async_eval(x, *outs[handed:])
                        handed = len(outs)
                    begun += 1
                li = piece.layer
                if piece.kind == "layer":
                    x, state.conv[li], state.ssm[li] = self._recurrent_fn(layers[li].w)(
                        x, state.conv[li], state.ssm[li]
                    )
                    outs += [state.ssm[li], state.conv[li]]
                elif piece.kind == "qkv":
                    qkv[li] = self.mv.attn_qkv(layers[li].w, x)
                    outs += list(qkv[li])
                elif piece.kind == "attention":  # the device floor: cache and softmax on the device
                    q, k, v = qkv.pop(li)
                    state.dev_k[li] = mx.concatenate([state.dev_k[li], k.reshape(1, g.n_kv, g.head_dim)])
                    state.dev_v[li] = mx.concatenate([state.dev_v[li], v.reshape(1, g.n_kv, g.head_dim)])
                    branch[li] = attend_mx(g, q, state.dev_k[li], state.dev_v[li])
                    outs += [state.dev_k[li], state.dev_v[li]]
                elif piece.kind in ("tail", "wo"):
                    x = self.mv.out_add(layers[li].w, "wo", branch[li], x)
                    if piece.kind == "tail":
                        x = self.mv.ffn(layers[li].w, x)
                elif piece.kind == "ffn":
                    x = self.mv.ffn(layers[li].w, x)
                elif piece.kind == "logits":
                    logits = self.mv.logits(self.w.lm_head, self.w.final_norm, x)
                    outs.append(logits)
            te = time.perf_counter()
            mx.eval(x, *outs)  # the submission, and its one wait
            t_eval += time.perf_counter() - te
            n_waits += 1
            last = sub[-1]
            if last.kind in ("wo", "ffn"):  # unfused or refused: the host takes the result back
                np.asarray(x)
            elif last.kind == "qkv":  # the host needs this layer's Q/K/V: attention on the host
                li = last.layer
                q, k, v = (np.asarray(a) for a in qkv.pop(li))
                state.host_k[li][pos] = k.reshape(g.n_kv, g.head_dim)
                state.host_v[li][pos] = v.reshape(g.n_kv, g.head_dim)
                branch[li] = mx.array(attend_np(g, q, state.host_k[li][: pos + 1], state.host_v[li][: pos + 1]))
        assert logits is not None
        out = np.asarray(logits)
        nxt = int(np.argmax(out))  # sampling is host work
        seconds = time.perf_counter() - t0
        state.length = pos + 1
        state.token = nxt
        return TokenResult(out, n_waits, seconds, nxt, t_eval)


# ---------------------------------------------------------------------------------------
# The kernels checked against MLX ops

#: The check of a step against the reference step: ``decode_matvec.worst_scaled_error`` of
#: the logits (max |difference| / max(max |reference logit|, 1)) at most this. Both compute
#: every product in float32 from the same stored weights, in another summation order; over
#: 64 layers that stays within float32 rounding (the MLX attention on the device against the
#: host's numpy is held to the same bound in tests/test_schedule.py).
CHECK_TOL = 1e-4


def check_step(
    sched: Schedule, ref: Schedule, *, stages: Sequence[int] = (5, 6), context: int = 32, tol: float = CHECK_TOL
) -> dict:
    """One token of ``sched`` against one of ``ref`` (same weights, same start, same token)
    at each of ``stages``: the logits' worst scaled error and whether it is within ``tol``."""
    for name, v in (("sched", sched), ("ref", ref)):
        if not isinstance(v, Schedule):
            raise ValueError(f"{name}: must be a Schedule, got {describe(v)}")
    if ref.w is not sched.w:
        raise ValueError("ref: must decode the same HybridWeights object as sched")
    tol = number("tol", tol, minimum=0, exclusive_minimum=True)
    rows = []
    for n in stages:
        a = sched.step(new_state(sched.w, context=context, max_new=2), n)
        b = ref.step(new_state(ref.w, context=context, max_new=2), n)
        err = decode_matvec.worst_scaled_error(a.logits, b.logits)
        rows.append(
            {
                "stage": int(n),
                "worst_scaled_error": err,
                "same_next_token": a.next_token == b.next_token,
                "passed": bool(err <= tol),
            }
        )
    return {
        "metric": "max |logits - reference logits| / max(max |reference logits|, 1), one token",
        "tol": tol,
        "matvec": sched.mv.describe(),
        "reference": ref.mv.describe(),
        "stages": rows,
        "passed": all(r["passed"] for r in rows),
    }


# ---------------------------------------------------------------------------------------
# Tokens that price a wait inside a token


def in_token_probes(sched: Schedule, stages: Sequence[int], share: int) -> tuple[dict, dict]:
    """Tokens that price each kind of wait inside a token, for ``bench.common.stages.run_stages``' ``probes``.

    For each kind the price model needs (``savings.MEASURED_SPLITS``) but the one after Q/K/V
    read for the host's attention (which no grouping can join), the first of ``stages``
    with at least ``share`` waits of that kind: its token with every ``share``-th of them
    joined (``waits.join_splits``). Returns ``(probes, joined)``: name -> (stage,
    submissions), and name -> (kind, count) for ``savings.in_token_prices``.
    """
    share = integer("share", share, minimum=1)
    numbers = sorted(sched.plan.stage(n).number for n in stages)
    probes: dict[str, tuple[int, list]] = {}
    joined: dict[str, tuple[str, int]] = {}
    for kind in MEASURED_SPLITS:
        if kind.startswith("qkv" + waits.HOST_READ):
            continue
        for n in numbers:
            have = waits.split_kinds(sched.cfg, n, plan=sched.plan, eligible=sched.eligible).get(kind, 0)
            if have >= share:
                count = have // share
                name = f"stage {n}, {count} of {have} {kind} joined"
                probes[name] = (n, waits.join_splits(sched.submissions(n), kind, count))
                joined[name] = (kind, count)
                break
    return probes, joined
