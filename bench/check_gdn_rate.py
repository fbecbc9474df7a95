"""Speed of ``workbench.check.check_step`` at Bonsai-27B's recurrent geometry: the check's own
cost over a run of tokens beside the two things it must do anyway, in the same run.

The target: over 4,096 tokens (one sequence, state fed back), the check's own cost without
fault models (everything but the subject's calls: the float64 truth, the float32 reference,
the errors of both against the truth, the bookkeeping) at most 1.5x the sum of the float64
oracle alone (``kernels.gdn_step.recurrent_step_exact``, token by token) and the float32
ops step alone (``decode.layers.recurrent_step``) over the same tokens. The subject is
the float32 ops step itself; the time inside its calls is measured and taken out. The check
runs as a user runs it (its guards on: each token called twice and the bits compared, on a
worker thread under a time limit); the same check without the second call (``rerun=False``)
is measured beside it, so the guard's share is stated. The fault models' cost (all eight, each
its own float32 trajectory) is stated beside them.

Where the time goes, and what uses the second core: after the subject's calls (which run
alone), the check's work for a token runs on three threads: the float32 reference on a thread
of its own (``check.gdn_reference``; MLX evaluates it on its worker thread), the float64 truth
on the check's thread, and the comparison of each state trajectory with the truth on a third
(``check.gdn_errors.Errors.compare``, chunk by chunk as the truth's are made; its passes in C
where clang is here, numpy's bits). So on this 2-core CPU the reference, the truth and the
comparisons overlap, and the wall ratio is below the CPU ratio, which counts every thread; on
a machine whose other core is busy the overlap goes and the wall ratio moves up to the CPU
ratio: read the two side by side, with the load average recorded before each repeat. The
subject is never called while the check's work runs, so its calls' time (taken out, recorded
as ``subject_calls_s``) includes none of the check's.

On a CPU shared with other jobs a wall time moves with their load, so the three times are
measured together ``--repeats`` times (the oracle, the ops step, the check, one after the
other), each repeat's ratio and the load average before it recorded and the best one stated;
beside it the ratio of each quantity's best over the repeats (load only adds time, so each
best is the nearest to its unloaded cost). CPU times (``process_time``, every thread of the
process) are recorded beside the wall times.

    python -m bench.check_gdn_rate                 # 4,096 tokens
    python -m bench.check_gdn_rate --tokens 512 --repeats 1
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import mlx.core as mx
import numpy as np

from bench.common import cli, record
from workbench.check import GDN_FAULTS, CallableStep, check_step, token_run
from workbench.decode import geometry_of, recurrent_step
from workbench.kernels import GdnShape, recurrent_step_exact
from workbench.models import load_model


class TimedOpsStep:
    """The workbench's float32 ops step as the subject (MLX arrays), its time counted."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu_seconds = 0.0

    def __call__(self, s: Any) -> Any:
        t0, c0 = time.perf_counter(), time.process_time()
        ba = mx.concatenate([s.b, s.a])[None]
        o, c, st = recurrent_step(
            s.mixed[None],
            s.z[None],
            ba,
            s.conv_state[None],
            s.state[None],
            s.conv_w,
            s.a_log,
            s.dt_bias,
            s.o_norm,
            k_heads=s.k_heads,
            eps=s.eps,
        )
        # the batch axis dropped by reshape (a view; o[0] would be a copy) and evaluated here, so
        # that what the subject returns is ready when the check reads it: its cost is the subject's
        out = (o.reshape(o.shape[1:]), c.reshape(c.shape[1:]), st.reshape(st.shape[1:]))
        mx.eval(*out)
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.process_time() - c0
        return out


def _timed(fn: Any) -> tuple[float, float]:
    """Wall and CPU seconds of ``fn()``."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def baselines(geo: tuple[int, ...], tokens: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """(wall, CPU) seconds of the float64 oracle alone and of the float32 ops step alone over ``tokens`` tokens."""

    run = token_run(GdnShape(*geo), [0], tokens, scale=1.0, gate="typical", state_scale=1.0)
    w = run.weights
    ba = np.concatenate([run.b[0], run.a[0]], axis=1)

    def oracle() -> None:
        conv, st = run.conv_state[0].astype(np.float64), run.state[0].astype(np.float64)
        for t in range(tokens):
            _, conv, st = recurrent_step_exact(
                run.mixed[0, t],
                run.z[0, t],
                ba[t],
                conv,
                w.conv_w[0],
                w.a_log[0],
                w.dt_bias[0],
                w.o_norm[0],
                st,
                k_heads=w.k_heads,
                eps=w.eps,
            )

    def ops() -> None:
        cw, al, dt, on = (mx.array(a[0]) for a in (w.conv_w, w.a_log, w.dt_bias, w.o_norm))
        conv, st = mx.array(run.conv_state), mx.array(run.state)
        for t in range(tokens):
            o, conv, st = recurrent_step(
                mx.array(run.mixed[:, t]),
                mx.array(run.z[:, t]),
                mx.array(ba[t][None]),
                conv,
                st,
                cw,
                al,
                dt,
                on,
                k_heads=w.k_heads,
                eps=w.eps,
            )
            mx.eval(o, conv, st)

    return _timed(oracle), _timed(ops)


def _own(one: dict[str, Any], **kw: Any) -> tuple[float, float, bool, float]:
    """Wall and CPU seconds of one check on the ops step, the subject's calls taken out; its verdict;
    the wall seconds inside the subject's calls."""
    subject = TimedOpsStep()
    box: dict[str, Any] = {}

    def check() -> None:
        box["rep"] = check_step(CallableStep(subject, arrays="mlx", name="float32 ops step"), **one, faults=(), **kw)

    wall, cpu = _timed(check)
    return wall - subject.seconds, cpu - subject.cpu_seconds, box["rep"].passed, subject.seconds


def measure(geo: tuple[int, ...], one: dict[str, Any]) -> dict[str, Any]:
    """One repeat: the oracle alone, the ops step alone, the check without fault models (the
    subject's calls taken out) as a user runs it and without its second call, wall and CPU seconds."""
    load = list(os.getloadavg())
    (t64, c64), (t32, c32) = baselines(geo, one["tokens"])
    own, own_cpu, verdict, calls = _own(one)
    once, once_cpu, verdict_once, calls_once = _own(one, rerun=False)
    return {
        "oracle_s": t64,
        "ops_step_s": t32,
        "check_own_s": own,
        "ratio": own / (t64 + t32),
        "check_own_no_rerun_s": once,
        "ratio_no_rerun": once / (t64 + t32),
        "oracle_cpu_s": c64,
        "ops_step_cpu_s": c32,
        "check_own_cpu_s": own_cpu,
        "cpu_ratio": own_cpu / (c64 + c32),
        "check_own_no_rerun_cpu_s": once_cpu,
        "cpu_ratio_no_rerun": once_cpu / (c64 + c32),
        "verdict": verdict and verdict_once,
        "subject_calls_s": calls,
        "subject_calls_no_rerun_s": calls_once,
        "load_average_before": load,
    }


def of_bests(repeats: list[dict[str, Any]], own: str, cpu: bool = False) -> float:
    """The check's own cost ``own`` (a key) over the oracle plus the ops step, each its best over the repeats."""
    o, s = ("oracle_cpu_s", "ops_step_cpu_s") if cpu else ("oracle_s", "ops_step_s")
    return min(r[own] for r in repeats) / (min(r[o] for r in repeats) + min(r[s] for r in repeats))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = cli.parser("check_gdn_rate", __doc__)
    p.add_argument("--tokens", type=int, default=4096, help="tokens of the run (default 4096)")
    p.add_argument("--tag", default="", help="appended to the record's file name")
    p.add_argument("--repeats", type=int, default=2, help="times the three are measured together (default 2)")
    args = p.parse_args(argv)
    cli.at_least(p, "--tokens", args.tokens, 1)
    cli.at_least(p, "--repeats", args.repeats, 1)
    g = geometry_of(load_model("bonsai-27b"))
    geo = (g.gdn_k_heads, g.gdn_v_heads, g.gdn_k_dim, g.gdn_v_dim, g.conv_kernel)
    one = {"geometries": [geo], "seeds": [0], "tokens": args.tokens, "scales": [1.0], "gates": ["typical"]}
    one["state_scales"] = [1.0]
    repeats = [measure(geo, one) for _ in range(args.repeats)]
    best = min(repeats, key=lambda r: r["ratio"])
    t_faults_run, c_faults_run = _timed(lambda: check_step(None, **one, faults=tuple(GDN_FAULTS)))
    n = args.tokens
    print(f"Bonsai-27B recurrent geometry Hk/Hv/Dk/Dv/K {'/'.join(map(str, geo))}, {n} tokens")
    print(f"{'what':<44} {'ms/token, each repeat (wall)':>30}")
    rows = [
        ("float64 oracle alone", "oracle_s"),
        ("float32 ops step alone", "ops_step_s"),
        ("check's own cost, no fault models", "check_own_s"),
        ("  the same without the second call (rerun)", "check_own_no_rerun_s"),
    ]
    for name, key in rows:
        print(f"{name:<44} {'  '.join(f'{1e3 * r[key] / n:8.3f}' for r in repeats):>30}")
    print(f"{'check with the 8 fault models, no subject':<44} {1e3 * t_faults_run / n:>30.3f}")
    wall = ", ".join(f"{r['ratio']:.2f}" for r in repeats)
    cpu = ", ".join(f"{r['cpu_ratio']:.2f}" for r in repeats)
    print(f"ratio: check's own cost / (oracle + ops step), each repeat: {wall}; best {best['ratio']:.2f} (<= 1.5)")
    print(f"  the same in CPU time: {cpu}")
    bests = {
        "ratio_of_bests": of_bests(repeats, "check_own_s"),
        "cpu_ratio_of_bests": of_bests(repeats, "check_own_cpu_s", cpu=True),
        "ratio_of_bests_no_rerun": of_bests(repeats, "check_own_no_rerun_s"),
        "cpu_ratio_of_bests_no_rerun": of_bests(repeats, "check_own_no_rerun_cpu_s", cpu=True),
    }
    print(
        f"  each quantity's best over the repeats: {bests['ratio_of_bests']:.2f} wall, "
        f"{bests['cpu_ratio_of_bests']:.2f} CPU; rerun=False {bests['ratio_of_bests_no_rerun']:.2f} wall, "
        f"{bests['cpu_ratio_of_bests_no_rerun']:.2f} CPU"
    )
    loads = ", ".join(f"{r['load_average_before'][0]:.1f}" for r in repeats)
    print(f"  load average (1 min) before each repeat: {loads} on {os.cpu_count()} CPUs")
    once = ", ".join(f"{r['ratio_no_rerun']:.2f} (CPU {r['cpu_ratio_no_rerun']:.2f})" for r in repeats)
    print(f"  without the check's second call of each token (rerun=False): {once}")
    print(f"verdict on the ops step: {'PASS' if all(r['verdict'] for r in repeats) else 'FAIL'}")
    rec = {
        **record.provenance("check_gdn_rate", argv),
        "target": "check's own cost over 4,096 tokens <= 1.5x (float64 oracle alone + float32 ops step alone)",
        "notes": (
            "wall time on a CPU shared with other jobs; each repeat measures the oracle, the ops step, the "
            "check (guards on, as a user runs it) and the check with rerun=False, one after the other; the "
            "results are the repeat with the best ratio (every repeat is under 'repeats', with the load average "
            "before it), beside the ratios of each quantity's best over the repeats; CPU times are "
            "process_time (all threads); the fault models' run has no subject; the check uses the second core "
            "(its reference on a thread of its own, the truth on the check's thread, the state's comparisons on a "
            "third, in C where clang is found, else numpy's form, the same bits), so the wall ratio is under the "
            "CPU ratio only while that core is free; subject_calls_s is the time inside the subject's calls that "
            "was taken out (both calls of a token with the rerun)"
        ),
        "results": {
            "geometry": list(geo),
            "tokens": n,
            **best,
            **bests,
            "faults_run_s": t_faults_run,
            "faults_run_cpu_s": c_faults_run,
            "repeats": repeats,
            "verdict": all(r["verdict"] for r in repeats),
        },
    }
    if not args.no_record:
        record.write(rec, args.out_dir, record.record_stem("check_gdn_rate", tag=args.tag), force=args.force)
    return rec


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.check_gdn_rate"))
