"""One check of a Gated DeltaNet step: runs of T tokens with both states fed back, the float64
truth and the workbench's float32 reference on the same inputs, the fault models beside
them, per-token errors, and a verdict at each horizon (:class:`StepReport`).

A recurrent step's error is not one step's: what a token gets wrong stays in the state and
the next tokens build on it. So every trajectory keeps its own states (the truth's, the
reference's, each fault's, the subject's, each sequence's own), token after token, and the
error of token t is the output's and the states' scaled error ``|x - y| / max(|y|, 1)``
(worst element) against the truth at t. At a horizon h a run's error is its worst over
tokens 1..h, so a bug caught at h stays caught later; the paired sign test
(:mod:`workbench.check.verdict`) asks, at each horizon, whether the subject's errors are
those of a correct float32 step beside the reference's on the same runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.check.gdn_cases import DEFAULT_GEOMETRIES, GATES, TokenRun, geometry, token_run
from workbench.check.gdn_faults import GDN_FAULTS, step_block
from workbench.check.gdn_report import StepReport, condition_frame
from workbench.check.gdn_subjects import CallableStep, StepInputs, checked_step
from workbench.check.subjects import SubjectError
from workbench.decode.layers import GDN_PATHS, recurrent_step
from workbench.studies.cases import check_seeds

#: The horizons (tokens) reported by default, those past the run's length left out.
DEFAULT_HORIZONS: tuple[int, ...] = (1, 16, 256, 4096)

#: The input scales of the conv's inputs a check sweeps by default (eps shows at the small one).
STEP_SCALES: tuple[float, ...] = (0.01, 1.0)

#: The initial recurrent state's magnitudes swept by default (a fresh sequence, a running one).
STATE_SCALES: tuple[float, ...] = (0.0, 1.0)

#: The part's label in every message a check writes.
PART = "gdn"


def _subject(subject: Any) -> Any:
    if hasattr(subject, "layer"):
        return subject
    if not callable(subject):
        raise ValueError(
            f"subject: must be a callable (StepInputs -> (out, conv_state, state)) or a CallableStep, "
            f"KernelsFolderStep or StepSource, got {validate.describe(subject)}"
        )
    return CallableStep(subject)


def inverse_scale(truth: np.ndarray) -> np.ndarray:
    """``1 / max(|y|, 1)`` of the truth, flattened a sequence: computed once a token and shared
    by every trajectory's error against it (the check's own cost is mostly these passes)."""
    inv = np.abs(truth.reshape(len(truth), -1))
    np.maximum(inv, 1.0, out=inv)
    return np.reciprocal(inv, out=inv)


def scaled_worst(x: np.ndarray, truth: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """Per sequence, ``max |x - y| / max(|y|, 1)`` (``inv`` from :func:`inverse_scale`); NaN
    anywhere gives NaN. In place on one float64 buffer: four passes over the state a call."""
    n = len(truth)
    d = np.subtract(x.reshape(n, -1), truth.reshape(n, -1), dtype=np.float64)
    np.abs(d, out=d)
    np.multiply(d, inv, out=d)
    return d.max(axis=1)


class _Subject:
    """The subject's sequences of one condition: each its own states, call and life (a
    sequence whose call fails is reported once, naming part, case, token and tensor, and
    its later tokens count as NaN)."""

    def __init__(self, subject: Any, run: TokenRun, labels: list[str], problems: list[str]):
        self.run, self.labels, self.problems = run, labels, problems
        w = run.weights
        self.conv = [c for c in run.conv_state]
        self.state = [s for s in run.state]
        self.calls: list[Callable | None] = []
        for i in range(len(labels)):
            consts = {"conv_w": w.conv_w[i], "a_log": w.a_log[i], "dt_bias": w.dt_bias[i], "o_norm": w.o_norm[i]}
            try:
                self.calls.append(subject.layer(run.shape, consts, w.eps))
            except Exception as e:  # a kernel that does not compile is this case's verdict, not a crash
                self._fail(i, 0, f"could not be prepared: {type(e).__name__}: {e}")

    def _fail(self, i: int, t: int, why: str) -> None:
        self.problems.append(f"part {PART}, {self.labels[i]}, token {t + 1}: {why}")
        if i < len(self.calls):
            self.calls[i] = None
        else:
            self.calls.append(None)

    def step(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r, w, s = self.run, self.run.weights, self.run.shape
        n = len(self.labels)
        out = np.full((n, s.vd), np.nan, np.float32)
        conv = np.full((n, s.kw - 1, s.channels), np.nan, np.float32)
        state = np.full((n, s.hv, s.dv, s.dk), np.nan, np.float32)
        for i, call in enumerate(self.calls):
            if call is None:
                continue
            inputs = StepInputs(
                r.mixed[i, t], r.z[i, t], r.b[i, t], r.a[i, t], self.conv[i], self.state[i],
                w.conv_w[i], w.a_log[i], w.dt_bias[i], w.o_norm[i], w.eps, w.k_heads, self.labels[i], t,
            )  # fmt: skip
            try:
                o, c, st = checked_step(call(inputs), s)
            except SubjectError as e:
                self._fail(i, t, str(e))
                continue
            except Exception as e:
                self._fail(i, t, f"raised {type(e).__name__}: {e}")
                continue
            for name, v in (("out", o), ("conv_state", c), ("state", st)):
                if not np.isfinite(v).all():
                    self._fail(i, t, f"tensor {name}: not finite (NaN or inf)")
                    break
            out[i], conv[i], state[i] = o, c, st
            if self.calls[i] is not None:
                self.conv[i], self.state[i] = c, st
        return out, conv, state


def run_condition(
    subject: Any,
    run: TokenRun,
    labels: list[str],
    faults: Sequence[str],
    problems: list[str],
    *,
    reference: str = "ops",
) -> dict[str, np.ndarray]:
    """Every trajectory of one condition, token by token: name -> per-token errors [S, T]
    (``out``, ``state`` of the subject (None: not run), ``ref_out``, ``ref_state``,
    ``fault <name>`` the worst of a fault's output and states, ``fault_out <name>`` its output's)."""
    n, T, w = len(run.seeds), run.tokens, run.weights
    w64 = w.astype(np.float64)
    tc, ts = run.conv_state.astype(np.float64), run.state.astype(np.float64)
    rc, rs = mx.array(run.conv_state), mx.array(run.state)
    wmx = [mx.array(a) for a in (w.conv_w, w.a_log, w.dt_bias, w.o_norm)]
    fs = {f: (run.conv_state, run.state) for f in faults}
    sub = None if subject is None else _Subject(subject, run, labels, problems)
    names = (["out", "state"] if sub else []) + ["ref_out", "ref_state"]
    names += [f"{k} {f}" for f in faults for k in ("fault", "fault_out")]
    err = {k: np.full((n, T), np.nan) for k in names}
    for t in range(T):
        x32 = (run.mixed[:, t], run.z[:, t], run.b[:, t], run.a[:, t])
        to, tc, ts = step_block(w64, *(a.astype(np.float64) for a in x32), tc, ts)
        io, ic, its = inverse_scale(to), inverse_scale(tc), inverse_scale(ts)
        ba = mx.array(np.concatenate([x32[2], x32[3]], axis=1))
        ro, rc, rs = recurrent_step(
            mx.array(x32[0]), mx.array(x32[1]), ba, rc, rs, *wmx, k_heads=w.k_heads, eps=w.eps, gdn=reference
        )
        mx.eval(ro, rc, rs)
        err["ref_out"][:, t] = scaled_worst(np.array(ro), to, io)
        err["ref_state"][:, t] = np.maximum(scaled_worst(np.array(rc), tc, ic), scaled_worst(np.array(rs), ts, its))
        for f in faults:
            fo, fc, fst = step_block(w, *x32, *fs[f], fault=f)
            fs[f] = (fc, fst)
            st_err = np.maximum(scaled_worst(fc, tc, ic), scaled_worst(fst, ts, its))
            err[f"fault_out {f}"][:, t] = scaled_worst(fo, to, io)
            err[f"fault {f}"][:, t] = np.maximum(err[f"fault_out {f}"][:, t], st_err)
        if sub is not None:
            so, sc, sst = sub.step(t)
            err["out"][:, t] = scaled_worst(so, to, io)
            err["state"][:, t] = np.maximum(scaled_worst(sc, tc, ic), scaled_worst(sst, ts, its))
    return err


def _conditions(geometries: Any, scales: Any, gates: Any, state_scales: Any) -> list[tuple]:
    geoms = [geometry(g) for g in validate.sequence("geometries", geometries, what="(Hk, Hv, Dk, Dv, K) tuples")]
    sc = [
        float(validate.number("scales", s, minimum=0, exclusive_minimum=True))
        for s in validate.sequence("scales", scales, what="positive numbers")
    ]
    gs = validate.sequence("gates", gates, what=f"gate regimes of {tuple(GATES)}")
    for g in gs:
        validate.one_of("gates", g, tuple(GATES))
    ss = [
        float(validate.number("state_scales", s, minimum=0))
        for s in validate.sequence("state_scales", state_scales, what="numbers >= 0")
    ]
    return [(g, s, gate, st) for g in geoms for s in sc for gate in gs for st in ss]


def _horizons(horizons: Any, tokens: int) -> list[int]:
    hs = sorted({validate.integer("horizons", h, minimum=1) for h in validate.sequence("horizons", horizons)})
    hs = [h for h in hs if h <= tokens]
    return hs if hs and hs[-1] == tokens else [*hs, tokens]


def check_step(
    subject: Any,
    *,
    geometries: Iterable[Any] = DEFAULT_GEOMETRIES,
    seeds: Iterable[int] = range(20),
    tokens: int = 256,
    horizons: Sequence[int] = DEFAULT_HORIZONS,
    scales: Sequence[float] = STEP_SCALES,
    gates: Sequence[str] = tuple(GATES),
    state_scales: Sequence[float] = STATE_SCALES,
    tolerance: float | None = None,
    flake_rate: float = 1e-3,
    faults: Sequence[str] = tuple(GDN_FAULTS),
    reference: str = "ops",
) -> StepReport:
    """Check ``subject`` (a callable ``StepInputs -> (out, conv_state, state)``, or a form of
    :mod:`workbench.check.gdn_subjects`) on runs of ``tokens`` tokens, one per seed and
    condition (``geometries`` x ``scales`` x ``gates`` x ``state_scales``), both states fed back.
    ``horizons``: the token counts the verdict and the tables are given at (``tokens``
    always among them); ``tolerance``: the user's own limit on the worst scaled error at
    the last horizon; ``reference``: the float32 reference's delta rule (``"ops"`` or ``"fast"``)."""
    subject = None if subject is None else _subject(subject)
    tokens = validate.integer("tokens", tokens, minimum=1, maximum=1 << 20)
    hs = _horizons(horizons, tokens)
    conds = _conditions(geometries, scales, gates, state_scales)
    seed_arr = check_seeds(seeds)
    flt = validate.sequence("faults", faults, what=f"fault names of {tuple(GDN_FAULTS)}", non_empty=False)
    for f in flt:
        validate.one_of("faults", f, tuple(GDN_FAULTS))
    validate.one_of("reference", reference, GDN_PATHS[:2])
    user = None if tolerance is None else validate.number("tolerance", tolerance, minimum=0)
    flake_rate = validate.number("flake_rate", flake_rate, minimum=0, exclusive_minimum=True, maximum=0.5)
    frames, problems = [], []
    for shp, scale, gate, st in conds:
        run = token_run(shp, seed_arr, tokens, scale=scale, gate=gate, state_scale=st)
        geo = f"{shp.hk}/{shp.hv}/{shp.dk}/{shp.dv}/{shp.kw}"
        labels = [f"case geometry {geo} scale {scale:g} gate {gate} state {st:g} seed {int(s)}" for s in seed_arr]
        err = run_condition(subject, run, labels, flt, problems, reference=reference)
        base = {"geometry": geo, "scale": scale, "gate": gate, "state_scale": st}
        frames.append(condition_frame(base, seed_arr, err))
    name = "" if subject is None else getattr(subject, "name", "?")
    kind = "" if subject is None else getattr(subject, "kind", "callable")
    return StepReport.build(name, kind, frames, hs, problems, user, flake_rate)
