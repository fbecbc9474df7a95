"""One check of a Gated DeltaNet step: runs of T tokens with both states fed back, the float64
truth and the workbench's float32 reference on the same inputs, the fault models beside
them, per-token errors, and a verdict at each horizon (:class:`StepReport`).

A recurrent step's error is not one step's: what a token gets wrong stays in the state and
the next tokens build on it. So every trajectory keeps its own states (the truth's, the
reference's, each fault's, the subject's, each sequence's own), token after token, and the
error of token t is the output's and the states' scaled error ``|x - y| / max(|y|, 1)``
(worst element) against the truth at t (computed in float32 from the truth split hi + lo,
within 4e-7 of itself: :class:`Errors`). At a horizon h a run's error is its worst over
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
from workbench.check.gdn_errors import Errors
from workbench.check.gdn_faults import GDN_FAULTS, BlockStep
from workbench.check.gdn_lane import Lane, borrow, give_back
from workbench.check.gdn_reference import ReferenceRun
from workbench.check.gdn_report import StepReport, condition_frame
from workbench.check.gdn_subjects import CallableStep, StepInputs, checked_step
from workbench.check.replay import DEFAULT_MAX_BYTES, ReplayDir
from workbench.check.step_isolation import checked, close, guarded_step
from workbench.check.step_reproducer import check_fits, write_failing_runs
from workbench.check.subjects import SubjectError
from workbench.decode.layers import GDN_PATHS
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


class _Subject:
    """The subject's sequences of one condition: each its own states, call and life (a
    sequence whose call fails is reported once, naming part, case, token and tensor, and
    its later tokens count as NaN)."""

    def __init__(self, subject: Any, run: TokenRun, labels: list[str], problems: list[str]):
        self.run, self.labels, self.problems, self.subject = run, labels, problems, subject
        w, s, n = run.weights, run.shape, len(labels)
        self.conv = [c for c in run.conv_state]
        self.state = [s for s in run.state]
        # what step returns, written in place a token (a sequence's row is NaN once it has stopped)
        self.returned = (
            np.empty((n, s.vd), np.float32),
            np.empty((n, s.kw - 1, s.channels), np.float32),
            np.empty((n, s.hv, s.dv, s.dk), np.float32),
        )
        self.stopped: set[int] = set()
        # each sequence's last returned tensors, read again only where their error is not finite
        self.held: list[tuple[np.ndarray, ...] | None] = [None] * n
        self.calls: list[Callable | None] = []
        for i in range(n):
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

    def _stop(self, i: int) -> None:
        if i not in self.stopped:
            for a in self.returned:
                a[i] = np.nan
            self.stopped.add(i)

    def step(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The token's returns [S, ...] (buffers overwritten by the next call; with one
        sequence, the returned arrays themselves, read in place)."""
        r, w, s = self.run, self.run.weights, self.run.shape
        out, conv, state = self.returned
        active = []
        self.held = [None] * len(self.held)
        for i, call in enumerate(self.calls):
            if call is None:
                self._stop(i)
                continue
            inputs = StepInputs(
                r.mixed[i, t],
                r.z[i, t],
                r.b[i, t],
                r.a[i, t],
                self.conv[i],
                self.state[i],
                w.conv_w[i],
                w.a_log[i],
                w.dt_bias[i],
                w.o_norm[i],
                w.eps,
                w.k_heads,
                self.labels[i],
                t,
            )
            active.append((i, call, inputs))
        # a subject in a worker process takes the token's calls in one message (step_isolation)
        batch = getattr(self.subject, "call_all", None)
        results = batch([(c, x) for _, c, x in active]) if batch is not None and active else None
        for k, (i, call, inputs) in enumerate(active):
            try:
                value = call(inputs) if results is None else results[k]
                if isinstance(value, BaseException):
                    raise value
                o, c, st = checked_step(value, s)
            except SubjectError as e:
                self._fail(i, t, str(e))
                self._stop(i)
                continue
            except Exception as e:
                self._fail(i, t, f"raised {type(e).__name__}: {e}")
                self._stop(i)
                continue
            self.held[i] = (o, c, st)
            if len(self.calls) == 1:
                out, conv, state = o[None], c[None], st[None]
            else:
                out[i], conv[i], state[i] = o, c, st
            if self.calls[i] is not None:
                # fed back as returned: an MLX state goes back to the step uncopied (the same values)
                mlx_states = isinstance(value[1], mx.array) and isinstance(value[2], mx.array)
                self.conv[i], self.state[i] = (value[1], value[2]) if mlx_states else (c, st)
        return out, conv, state

    def not_finite(self, t: int, errors: Sequence[np.ndarray]) -> None:
        """After token ``t``'s errors (the subject's, per sequence): a sequence whose error is not
        finite is stopped, naming the first tensor it returned that is NaN or inf. Asked only
        there, so a finite run never pays a pass over its state for it (a NaN or inf returned
        makes the error NaN or inf; a finite return with a non-finite error is the truth's)."""
        bad = ~np.isfinite(errors[0])
        for e in errors[1:]:
            bad |= ~np.isfinite(e)
        for i in np.flatnonzero(bad):
            held = self.held[i]
            if held is None or self.calls[i] is None:
                continue
            for name, v in zip(("out", "conv_state", "state"), held):
                if not _finite(v):
                    self._fail(i, t, f"tensor {name}: not finite (NaN or inf)")
                    break


def _finite(v: np.ndarray) -> bool:
    """Whether every element of ``v`` is finite: its sum is finite only then (NaN and inf
    carry into it), and where the sum overflows the elements are looked at one by one."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = v.sum()
    return bool(np.isfinite(total)) or bool(np.isfinite(v).all())


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
    ``fault <name>`` the worst of a fault's output and states, ``fault_out <name>`` its output's).

    A token runs the subject on its own; then three threads of the check's: the float32
    reference on its own (:class:`~workbench.check.gdn_reference.ReferenceRun`), the faults and
    the float64 truth a chunk of value heads at a time on this one, and the comparison of every
    state with the truth's on a third (:meth:`Errors.compare`), each chunk as soon as the truth
    has made it, the reference's once its thread hands it over; the output's and the conv
    state's (small) here once all are made. On two free cores the three overlap; the bits are
    those of the same steps and comparisons made one after another. Each numpy state lives in
    one buffer for the run, the step writing the next token's over it."""
    n, s = len(run.seeds), run.shape
    errors = Errors(n, n, s.vd), Errors(n, n, (s.kw - 1) * s.channels, c=False), Errors(n, n * s.hv, s.dv * s.dk)
    lanes = borrow(), borrow()  # the reference's thread, the state comparisons' thread
    try:
        ref = ReferenceRun(run, reference, lanes[0])
        return _run(subject, run, labels, faults, problems, ref, lanes[1], errors)
    finally:
        errors[2].cancel()
        for lane in lanes:
            give_back(lane)


def _run(
    subject: Any,
    run: TokenRun,
    labels: list[str],
    faults: Sequence[str],
    problems: list[str],
    ref: ReferenceRun,
    lane: Lane,
    errors: tuple[Errors, Errors, Errors],
) -> dict[str, np.ndarray]:
    n, T, w = len(run.seeds), run.tokens, run.weights
    w64 = w.astype(np.float64)
    tc, ts = run.conv_state.astype(np.float64), run.state.astype(np.float64)
    e_out, e_conv, e_state = errors
    fs = {f: (run.conv_state, run.state.copy()) for f in faults}
    sub = None if subject is None else _Subject(subject, run, labels, problems)
    names = (["out", "state"] if sub else []) + ["ref_out", "ref_state"]
    names += [f"{k} {f}" for f in faults for k in ("fault", "fault_out")]
    err = {k: np.full((n, T), np.nan) for k in names}
    for t in range(T):
        x32 = (run.mixed[:, t], run.z[:, t], run.b[:, t], run.a[:, t])
        # the subject first, on its own: nothing of the check's runs while it is called
        got = None if sub is None else sub.step(t)
        mine = [] if got is None else [got]
        fault_states = [fs[f][1] for f in faults]  # (each fault's step writes its next state over it)
        # the state's comparisons on a thread of their own, each chunk as soon as the truth's is made
        # here, the reference's state once its thread hands it over (Errors.compare)
        e_state.start(ts, [x[2] for x in mine] + fault_states, later=1)
        ref.step(t, then=lambda o, c, st: e_state.give(0, st))
        lane.run(e_state.compare)
        # the truth and the faults a chunk of heads at a time
        truth = BlockStep(w64, *(a.astype(np.float64) for a in x32), tc, ts, out=ts)
        steps = [BlockStep(w, *x32, *fs[f], fault=f, out=fs[f][1]) for f in faults]
        for (_, h1), *_ in zip(truth.chunks(), *(f.chunks() for f in steps)):
            e_state.made_final(h1)
        to, tc, ts = truth.result()
        traj = [ref.result(), *mine]
        for f, step in zip(faults, steps):
            traj.append(step.result())
            fs[f] = traj[-1][1:]
        e_out.start(to, [x[0] for x in traj])
        e_out.take_all()
        e_conv.start(tc, [x[1] for x in traj])
        e_conv.take_all()
        lane.result()
        eo, ec, est = e_out.finish(), e_conv.finish(), e_state.finish()
        st_err = [np.maximum(c, x) for c, x in zip(ec, est)]
        err["ref_out"][:, t], err["ref_state"][:, t] = eo[0], st_err[0]
        if sub is not None:
            err["out"][:, t], err["state"][:, t] = eo[1], st_err[1]
            sub.not_finite(t, (eo[1], st_err[1]))
        for j, f in enumerate(faults, len(traj) - len(faults)):
            err[f"fault_out {f}"][:, t] = eo[j]
            err[f"fault {f}"][:, t] = np.maximum(eo[j], st_err[j])
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
    rerun: bool = True,
    process: bool | None = None,
    time_limit: float = 30.0,
    replay_dir: Any = None,
    replay_max_bytes: int = DEFAULT_MAX_BYTES,
) -> StepReport:
    """Check ``subject`` (a callable ``StepInputs -> (out, conv_state, state)``, or a form of
    :mod:`workbench.check.gdn_subjects`) on runs of ``tokens`` tokens, one per seed and
    condition (``geometries`` x ``scales`` x ``gates`` x ``state_scales``), both states fed back.
    ``horizons``: the token counts the verdict and the tables are given at (``tokens``
    always among them); ``tolerance``: the user's own limit on the worst scaled error at
    the last horizon; ``reference``: the float32 reference's delta rule (``"ops"`` or ``"fast"``).
    The subject runs guarded (:mod:`workbench.check.step_isolation`): ``rerun`` each token called
    twice, the bits compared; ``process`` in a worker process of its own (None: where it can);
    ``time_limit`` seconds a call may take. ``replay_dir``: a folder where each failing run is
    written as a reproducer (:mod:`workbench.check.step_reproducer`), each at most
    ``replay_max_bytes`` (checked before any run)."""
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
    where = ReplayDir.of(replay_dir, replay_max_bytes)
    if where is not None:
        for shp, *_ in conds:
            check_fits(where, shp, tokens)
    frames, problems = [], []
    guarded = None if subject is None else guarded_step(subject, rerun=rerun, process=process, time_limit=time_limit)
    try:
        _condition_frames(guarded, conds, seed_arr, tokens, flt, reference, frames, problems)
    finally:
        close(guarded)
    name = "" if subject is None else getattr(subject, "name", "?")
    kind = "" if subject is None else getattr(subject, "kind", "callable")
    rep = StepReport.build(name, kind, frames, hs, problems, user, flake_rate)
    rep.checked = [] if guarded is None else checked(guarded)
    settings = {"tokens": tokens, "tolerance": user, "reference": reference, "rerun": rerun}
    written = [] if where is None or guarded is None else write_failing_runs(where, rep, settings)
    rep.reproducers = [str(p) for p in written]
    return rep


def _condition_frames(
    subject: Any,
    conds: list[tuple],
    seed_arr: np.ndarray,
    tokens: int,
    flt: Sequence[str],
    reference: str,
    frames: list,
    problems: list[str],
) -> None:
    """Every condition's runs (:func:`run_condition`), a frame each appended to ``frames``."""
    for shp, scale, gate, st in conds:
        run = token_run(shp, seed_arr, tokens, scale=scale, gate=gate, state_scale=st)
        geo = f"{shp.hk}/{shp.hv}/{shp.dk}/{shp.dv}/{shp.kw}"
        labels = [f"case geometry {geo} scale {scale:g} gate {gate} state {st:g} seed {int(s)}" for s in seed_arr]
        err = run_condition(subject, run, labels, flt, problems, reference=reference)
        base = {"geometry": geo, "scale": scale, "gate": gate, "state_scale": st}
        frames.append(condition_frame(base, seed_arr, err))
