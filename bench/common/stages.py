"""The decode step's stages timed against the resident-state plan's table: ``run_stages``.

``bench.schedule_run`` runs it: every stage of ``workbench.decode.schedule.Schedule`` decodes
the same tokens, rounds interleaved, and the savings between stages are set beside the
table's (``workbench.decode.savings.compare_savings``). It lives in ``bench/`` because it is
a benchmark harness (a clock, rounds, the garbage collector held off while a round runs);
the package executes the step, a benchmark times it, and ``workbench`` never imports
``bench``. Readers of what it measured read the record (``workbench.reports.schedule_run``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from workbench.decode import MAX_TOKENS, Schedule, compare_savings, new_state
from workbench.validate import describe, integer, number, sequence


def run_stages(
    sched: Schedule,
    *,
    stages: Sequence[int] | None = None,
    tokens: int = 8,
    rounds: int = 5,
    warmup: int = 2,
    context: int = 32,
    price_ms: float | None = None,
    progress: Callable[[int, int], Any] | None = None,
    time_budget_s: float | None = None,
    split_prices: Mapping[str, float] | None = None,
    split_rounds: Mapping[str, Sequence[float]] | None = None,
    probes: Mapping[str, tuple[int, Sequence]] | None = None,
) -> dict[str, Any]:
    """Time ``tokens`` tokens per round at every stage, rounds interleaved; compare with the table.

    Every stage decodes its own state from the same start, so all stages compute the
    same tokens; and every round starts again from that start (a new state, made between
    rounds, off the clock), so every round is the same work: were the states carried on,
    each round's tokens would attend over a longer context than the round before, and
    the stages that attend on the host would drift apart from round to round by more
    than a pair of stages differs. ``time_budget_s``: stop after the first round that ends
    past it (the record says how many rounds ran). ``split_prices`` / ``split_rounds``: the
    measured split prices by kind and their rounds, for the price model's prediction and its
    interval beside each pair (``savings.compare_savings``). ``probes``: name -> (stage,
    submissions), tokens decoded with other submissions than a stage's own
    (``Schedule.step``'s ``submissions``, e.g. a share of one kind of wait joined by
    ``waits.join_splits``), timed in the same rounds as the stages, each from the same
    start; their rows go to ``probes`` in the record. Returns a record: per stage, the waits
    the executor made a token (and whether they equal ``waits_per_token``) and the median ms
    a token; per pair of
    consecutive stages (and each stage against stage 1), the measured saving and the
    predicted one (waits saved x ``price_ms``) with their ratio.
    """
    if not isinstance(sched, Schedule):
        raise ValueError(f"sched: must be a Schedule, got {describe(sched)}")
    # A state's KV caches hold at most MAX_TOKENS new tokens, one more than a round decodes:
    # past that the count is refused here, under its own name, not as new_state's max_new.
    tokens = integer("tokens", tokens, minimum=1, maximum=MAX_TOKENS - 1)
    rounds = integer("rounds", rounds, minimum=1)
    warmup = integer("warmup", warmup, minimum=0, maximum=MAX_TOKENS - 1)
    context = integer("context", context, minimum=1, maximum=MAX_TOKENS)
    if stages is not None:
        stages = sequence("stages", stages, what="stage numbers or names of the plan")
    if price_ms is not None:
        price_ms = number("price_ms", price_ms, minimum=0, exclusive_minimum=True)
    if time_budget_s is not None:
        time_budget_s = number("time_budget_s", time_budget_s, minimum=0)
    if progress is not None and not callable(progress):
        raise ValueError(f"progress: must be None or a callable (round, rounds), got {describe(progress)}")
    plan = sched.plan
    numbers = [s.number for s in plan.stages]
    if stages is not None:
        numbers = []
        for i, s in enumerate(stages):
            try:
                numbers.append(plan.stage(s).number)
            except ValueError as e:  # the plan names its own parameter "stage": this one is an entry of stages
                raise ValueError(f"stages[{i}]: {str(e).removeprefix('stage: ')}") from None
    if not numbers or len(set(numbers)) != len(numbers):
        raise ValueError(f"stages: must name one or more distinct stages of the plan, got {describe(stages)}")
    if probes is not None and not isinstance(probes, Mapping):
        raise ValueError(f"probes: must be None or a mapping of name to (stage, submissions), got {describe(probes)}")
    probe_runs: dict[str, tuple[int, list]] = {}
    for name, probe in (probes or {}).items():
        if not isinstance(probe, (tuple, list)) or len(probe) != 2:
            raise ValueError(f"probes[{name!r}]: must be (stage, submissions), got {describe(probe)}")
        n = plan.stage(probe[0]).number
        probe_runs[str(name)] = (n, sched.check_submissions(n, probe[1]))
    # What a round decodes: every stage with its own submissions, then every probe with its.
    runs: list[tuple[Any, int, list | None]] = [(n, n, None) for n in numbers]
    runs += [(name, n, subs) for name, (n, subs) in probe_runs.items()]
    made: dict[Any, set] = {key: set() for key, _, _ in runs}
    times: dict[Any, list] = {key: [] for key, _, _ in runs}
    evals: dict[Any, list] = {key: [] for key, _, _ in runs}
    for key, n, subs in runs:  # warm-up: compile kernels, fault in the weights
        warm = new_state(sched.w, context=context, max_new=warmup + 1)
        for _ in range(warmup):
            made[key].add(sched.step(warm, n, submissions=subs).waits)
    start = time.perf_counter()
    done = 0
    gc_was = gc.isenabled()
    gc.disable()  # a collection inside a token is noise of a millisecond and more: collect between rounds
    try:
        for r in range(rounds):
            states = {key: new_state(sched.w, context=context, max_new=tokens + 1) for key, _, _ in runs}
            gc.collect()
            for key, n, subs in runs:
                for _ in range(tokens):
                    res = sched.step(states[key], n, submissions=subs)
                    made[key].add(res.waits)
                    times[key].append(res.seconds * 1e3)
                    evals[key].append(res.eval_seconds * 1e3)
            done = r + 1
            if progress is not None:
                progress(done, rounds)
            if time_budget_s is not None and time.perf_counter() - start > time_budget_s:
                break
    finally:
        if gc_was:
            gc.enable()
    rows = []
    for n in numbers:
        st = plan.stage(n)
        predicted = len(sched.submissions(n))
        t = np.asarray(times[n])
        rows.append(
            {
                "stage": n,
                "name": st.name,
                "waits_predicted": predicted,
                "waits_made": sorted(made[n]),
                "waits_match": made[n] == {predicted},
                "ms_median": float(np.median(t)),
                "ms_p10": float(np.percentile(t, 10)),
                "ms_p90": float(np.percentile(t, 90)),
                "tokens": int(t.size),
                # Inside mx.eval (encoding, submitting, waiting) against outside (building the
                # lazy graphs in Python, the host's attention, reads): the device idles for the latter.
                "ms_eval_median": float(np.median(evals[n])),
                "ms_host_median": float(np.median(t - np.asarray(evals[n]))),
                "ms_each": [round(float(v), 4) for v in t],  # in time order, round by round
            }
        )
    probe_rows = []
    for name, (n, subs) in probe_runs.items():
        t = np.asarray(times[name])
        probe_rows.append(
            {
                "name": name,
                "stage": n,
                "waits_predicted": len(subs),
                "waits_made": sorted(made[name]),
                "waits_match": made[name] == {len(subs)},
                "ms_median": float(np.median(t)),
                "tokens": int(t.size),
                "ms_each": [round(float(v), 4) for v in t],
            }
        )
    rec: dict[str, Any] = {"stages": rows, "rounds_run": done}
    if probe_rows:
        rec["probes"] = probe_rows
    if price_ms is not None:
        rec["comparisons"] = compare_savings(
            rows, price_ms, split_prices=split_prices, cfg=sched.cfg, eligible=sched.eligible, split_rounds=split_rounds
        )
    return rec
