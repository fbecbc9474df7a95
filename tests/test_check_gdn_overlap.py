"""The recurrent step's check on two threads gives the bits of the same check on one.

``gdn_run.run_condition`` steps the float32 reference on a thread of its own and compares its
state there, chunk by chunk, as the float64 truth's chunks are made on the check's thread
(``gdn_reference``, ``Errors.follow``). Here every error it gives is held, bit for bit, to a
plain serial run written as the check ran before: each trajectory stepped in turn on one
thread, each tensor compared whole after the truth's step. Chunks are made small so the
follower waits for rows, and one sequence returns NaN part way so the float64 recount of a
non-finite error is compared too.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.test_check_gdn import numpy_step
from workbench.check import CallableStep, gdn_cases, gdn_errors
from workbench.check import gdn_faults as faults_mod
from workbench.check.gdn_cases import token_run
from workbench.check.gdn_errors import Errors
from workbench.check.gdn_faults import step_block
from workbench.check.gdn_run import run_condition
from workbench.decode.layers import recurrent_step
from workbench.kernels.gdn_step import GdnShape

FAULTS = ("state_bfloat16", "key_head_modulo")


def nan_late(s):
    """A float32 step whose state turns NaN at token 5 of every sequence (a non-finite error; the
    check stops the sequence there and counts its later tokens NaN, as this step returns them)."""
    o, c, st = numpy_step(s)
    if s.token >= 4:
        st = np.full_like(st, np.nan)
    if s.token >= 5:
        o, c = np.full_like(o, np.nan), np.full_like(c, np.nan)
    return o, c, st


def _compared(y, xs):
    """The old way: every trajectory of a tensor compared after the truth's step, on one thread."""
    n = len(y)
    rows, cols = (n * y.shape[1], y.shape[2] * y.shape[3]) if y.ndim == 4 else (n, y[0].size)
    e = Errors(n, rows, cols)
    e.lib = None  # numpy's form, as the check compared before its C form
    e.start(y, xs)
    e.take_all()
    return e.finish()


def serial_errors(fn, run, faults, reference="ops"):
    """Per-token errors of ``fn``'s run as ``run_condition`` names them, made serially."""
    n, T, w = len(run.seeds), run.tokens, run.weights
    w64 = w.astype(np.float64)
    tc, ts = run.conv_state.astype(np.float64), run.state.astype(np.float64)
    rc, rs = mx.array(run.conv_state), mx.array(run.state)
    wmx = [mx.array(a) for a in (w.conv_w, w.a_log, w.dt_bias, w.o_norm)]
    fs = {f: (run.conv_state, run.state) for f in faults}
    sub = [(run.conv_state[i], run.state[i]) for i in range(n)]
    err = {k: np.full((n, T), np.nan) for k in ("out", "state", "ref_out", "ref_state")}
    err |= {f"{k} {f}": np.full((n, T), np.nan) for f in faults for k in ("fault", "fault_out")}
    for t in range(T):
        x32 = (run.mixed[:, t], run.z[:, t], run.b[:, t], run.a[:, t])
        got = []
        for i in range(n):
            inputs = CallableStep(fn).layer(run.shape, _consts(w, i), w.eps)
            got.append(inputs(_inputs(run, w, i, t, *sub[i])))
            sub[i] = (got[i][1], got[i][2])
        mine = tuple(np.stack([g[k] for g in got]) for k in range(3))
        ba = mx.array(np.concatenate([x32[2], x32[3]], axis=1))
        ro, rc, rs = recurrent_step(
            mx.array(x32[0]), mx.array(x32[1]), ba, rc, rs, *wmx, k_heads=w.k_heads, eps=w.eps, gdn=reference
        )
        mx.eval(ro, rc, rs)
        to, tc, ts = step_block(w64, *(a.astype(np.float64) for a in x32), tc, ts)
        traj = [(np.asarray(ro), np.asarray(rc), np.asarray(rs)), mine]
        for f in faults:
            traj.append(step_block(w, *x32, *fs[f], fault=f))
            fs[f] = traj[-1][1:]
        eo, ec, est = (_compared(y, [x[k] for x in traj]) for k, y in enumerate((to, tc, ts)))
        st_err = [np.maximum(c, x) for c, x in zip(ec, est)]
        err["ref_out"][:, t], err["ref_state"][:, t] = eo[0], st_err[0]
        err["out"][:, t], err["state"][:, t] = eo[1], st_err[1]
        for j, f in enumerate(faults, 2):
            err[f"fault_out {f}"][:, t] = eo[j]
            err[f"fault {f}"][:, t] = np.maximum(eo[j], st_err[j])
    return err


def _consts(w, i):
    return {"conv_w": w.conv_w[i], "a_log": w.a_log[i], "dt_bias": w.dt_bias[i], "o_norm": w.o_norm[i]}


def _inputs(run, w, i, t, conv, state):
    from workbench.check.gdn_subjects import StepInputs

    return StepInputs(
        run.mixed[i, t],
        run.z[i, t],
        run.b[i, t],
        run.a[i, t],
        conv,
        state,
        w.conv_w[i],
        w.a_log[i],
        w.dt_bias[i],
        w.o_norm[i],
        w.eps,
        w.k_heads,
        "",
        t,
    )


@pytest.mark.parametrize("form", ["c", "numpy"])
@pytest.mark.parametrize("chunk", [faults_mod.CHUNK, 2 * 32 * 32])
@pytest.mark.parametrize("fn,faults", [(numpy_step, FAULTS), (nan_late, ())])
def test_the_threaded_run_is_the_serial_run_bit_for_bit(monkeypatch, form, chunk, fn, faults):
    if form == "c" and gdn_errors.compiled() is None:
        pytest.skip("clang is not here: the errors' C form does not build (numpy's runs)")
    if form == "numpy":
        monkeypatch.setattr(gdn_errors, "compiled", lambda: None)
    monkeypatch.setattr(faults_mod, "CHUNK", chunk)  # 2 heads a chunk: the comparison waits for rows
    run = token_run(GdnShape(2, 6, 32, 32, 4), np.array([3, 4, 5]), 8, scale=1.0, gate="typical", state_scale=1.0)
    problems: list[str] = []
    got = run_condition(CallableStep(fn), run, ["a", "b", "c"], faults, problems)
    want = serial_errors(fn, run, faults)
    assert set(got) == set(want)
    for k in want:
        assert got[k].tobytes() == want[k].tobytes(), k
    assert np.isnan(got["state"][:, 4:]).all() == (fn is nan_late)


def _awkward(rng, rows, cols):
    """A truth and trajectories with what a comparison can trip on: rows of exact zeros of both
    signs, NaN, infinities, an overflow of ``x - hi``, subnormals, a truth past float32's range."""
    y = rng.standard_normal((rows, cols)) * np.exp(rng.uniform(-30, 30, (rows, cols)))
    y[0] = 0.0
    y[1, ::3] = 1e300  # hi is inf there
    y[2] = rng.standard_normal(cols) * 1e-42  # float32 subnormals
    with np.errstate(over="ignore"):
        xs = [(y * (1 + 1e-6 * rng.standard_normal(y.shape))).astype(np.float32) for _ in range(3)]
    xs[0][0] = np.where(rng.random(cols) < 0.5, -0.0, 0.0)  # a zero row with zeros of both signs
    xs[1][3, 7] = np.nan
    xs[1][4, 9] = np.inf
    xs[2][5, 11] = -3e38
    y[5, 11] = 3e38  # x - hi overflows
    xs[2][6] = y[6].astype(np.float32)  # x == hi: the error is -lo
    return y, xs


@pytest.mark.parametrize("later", [0, 1])
def test_the_c_comparison_is_numpys_bit_for_bit(later):
    """Errors' C form against its numpy form on awkward values, in one pass and in compare's
    two-thread order (a later trajectory handed over while rows are made final)."""
    if gdn_errors.compiled() is None:
        pytest.skip("clang is not here: the errors' C form does not build (numpy's runs)")
    rng = np.random.default_rng(7)
    y, xs = _awkward(rng, 12, 4096)
    got = {}
    for form in ("c", "numpy"):
        e = Errors(3, 12, 4096)
        if form == "numpy":
            e.lib = None
        e.start(y, xs[later:], later=later)
        if later:
            import threading

            th = threading.Thread(target=e.compare)
            th.start()
            e.made_final(5)
            e.give(0, xs[0])
            e.made_final(12)
            th.join()
        else:
            e.take_all()
        got[form] = (e.worst.copy(), e.finish())
    (wc, rc), (wn, rn) = got["c"], got["numpy"]
    # every row's worst: the same bits where finite, non-finite at the same rows (a sequence
    # with a non-finite row is recounted in float64, so a NaN's payload is no result)
    assert np.array_equal(np.isfinite(wc), np.isfinite(wn)) and not np.isfinite(wn).all()
    assert wc[np.isfinite(wc)].tobytes() == wn[np.isfinite(wn)].tobytes()
    assert (wn == 0).any()  # the zero row (C hands it to numpy's form)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(rc, rn))


@pytest.mark.parametrize("scale", [None, 1.0, 0.01, 3.0])
@pytest.mark.parametrize("draw_bytes", [gdn_cases.DRAW_BYTES, 3 * 8 * 50])
def test_a_runs_token_inputs_drawn_in_parts_are_the_whole_draws_bits(monkeypatch, scale, draw_bytes):
    """``token_run`` draws its token inputs a few rows at a time into float32: the bits of one
    whole float64 draw, scaled, then narrowed, and the generator left where that leaves it (so
    every later draw of the run is as before)."""
    monkeypatch.setattr(gdn_cases, "DRAW_BYTES", draw_bytes)  # 3 rows a part: 17 rows in 6 parts
    whole, parts = np.random.default_rng([5, 53]), np.random.default_rng([5, 53])
    want = whole.standard_normal((17, 50))
    want = (want if scale is None else want * scale).astype(np.float32)
    got = np.empty((17, 50), np.float32)
    gdn_cases._draws_into(parts, got, scale)
    assert got.tobytes() == want.tobytes()
    assert parts.standard_normal(4).tobytes() == whole.standard_normal(4).tobytes()


def test_the_checks_threads_are_lent_not_left_behind_and_outlive_a_failed_run(monkeypatch):
    """A check's reference and comparison threads are the process's, lent to each run: repeated
    checks start none (MLX would keep a stream's worker thread for each new one), and a run that
    fails part way gives them back fit for the next."""
    import os

    from workbench.check import check_step, gdn_run

    if not os.path.isdir("/proc/self/task"):
        pytest.skip("threads are counted in /proc/self/task (Linux)")
    few = {"geometries": [(2, 6, 32, 32, 4)], "seeds": range(2), "tokens": 5, "faults": ("scale_missing",)}
    threads = lambda: len(os.listdir("/proc/self/task"))  # noqa: E731
    want = check_step(None, **few).curves["ref_worst"]
    before = threads()

    class Broken(gdn_run.BlockStep):
        def result(self):
            if self.w.conv_w.dtype == np.float64 and broken["calls"] == 3:
                raise RuntimeError("the truth broke at token 4")
            broken["calls"] += self.w.conv_w.dtype == np.float64
            return super().result()

    broken = {"calls": 0}
    monkeypatch.setattr(gdn_run, "BlockStep", Broken)
    with pytest.raises(RuntimeError, match="token 4"):
        check_step(None, **few)
    monkeypatch.undo()
    for _ in range(2):
        assert check_step(None, **few).curves["ref_worst"].tobytes() == want.tobytes()
    assert threads() == before
