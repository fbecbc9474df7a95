"""The check on a Dask cluster: ``check_kernel(..., client=)`` cuts the seeds into shards, runs
each shard as a task (the serial check on those seeds, :func:`workbench.check.cluster_worker.run_shard`)
and merges the shards' reports into the report of their union, the same bits as one serial run
(a case depends only on its seed and configuration; the tests hold it).

:func:`cluster_client` makes the client: a scheduler address for a cluster, Dask's own config
or environment (``DASK_SCHEDULER_ADDRESS``, so a JupyterHub deployment can pre-wire it), else a
``LocalCluster`` on this machine whose workers start by spawn, one thread each, with the BLAS
and OpenMP pools capped at one thread (so N workers use N cores, not N x cores).

A worker that dies (a kernel form crashing its process: a callable runs in a process of its
own, :mod:`workbench.check.cluster_worker`) costs its shard once: the shard is run again seed
by seed, and a seed whose worker dies again is reported as that case's problem, never run a
third time. ``LocalCluster``\\ s made here set Dask's ``allowed-failures`` to 0 so a death is
not retried behind the check's back; a cluster's own scheduler keeps its setting (Dask's
default retries a task three times).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from typing import Any

import numpy as np

from workbench import validate
from workbench.check.cluster_worker import THREAD_VARIABLES, ShardResult, run_shard, ship

#: Threads a worker of :func:`cluster_client`'s ``LocalCluster`` runs tasks on: one, as MLX
#: wants one context a process and the check's own work is single-threaded numpy and MLX.
WORKER_THREADS = 1

#: Shards a worker gets by default: more balance the load when shards take unequal time;
#: fewer spend less on each shard's start (its subject's process, its report).
SHARDS_A_WORKER = 2


def _local_config() -> dict[str, Any]:
    import dask

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
    environ.update(dict.fromkeys(THREAD_VARIABLES, 1))
    return {
        "distributed.worker.multiprocessing-method": "spawn",
        "distributed.nanny.pre-spawn-environ": environ,
        "distributed.scheduler.allowed-failures": 0,
        # one task on a worker at a time, none queued behind it: a worker's death then fails
        # only the task that killed it (Dask's default 1.1 sends a single-threaded worker two)
        "distributed.scheduler.worker-saturation": 1.0,
    }


def cluster_client(workers: int | None = None, scheduler: str | None = None) -> Any:
    """A ``dask.distributed.Client``: on the cluster at ``scheduler`` (an address,
    ``"tcp://host:8786"``); else on the one Dask's config or environment names
    (``DASK_SCHEDULER_ADDRESS``) when ``workers`` is not given; else on a new ``LocalCluster`` of
    ``workers`` processes (default: this machine's cores), each single-threaded with capped BLAS
    threads, started by spawn. Closing the client closes a cluster it started."""
    import dask
    from distributed import Client

    if workers is not None and scheduler is not None:
        raise ValueError(
            f"workers: a scheduler's cluster has its own workers; give workers or scheduler, not both "
            f"(got workers={workers!r}, scheduler={scheduler!r})"
        )
    if scheduler is not None:
        if not isinstance(scheduler, str) or not scheduler.strip():
            raise ValueError(
                f"scheduler: must be an address such as 'tcp://host:8786', got {validate.describe(scheduler)}"
            )
        try:
            return Client(scheduler, timeout="20s")
        except (OSError, TimeoutError) as e:
            raise ValueError(
                f"scheduler: no Dask scheduler answered at {scheduler!r} ({type(e).__name__}: {e})"
            ) from None
    if workers is None and dask.config.get("scheduler-address", None):
        return Client(timeout="20s")
    n = validate.integer("workers", (os.cpu_count() or 1) if workers is None else workers, minimum=1, maximum=4096)
    with dask.config.set(_local_config()):  # silence_logs: Dask's own notices are not the check's output
        return Client(
            n_workers=n,
            threads_per_worker=WORKER_THREADS,
            processes=True,
            dashboard_address=":0",  # a free port: no clash with another cluster on this machine
            set_as_default=False,
            silence_logs=logging.ERROR,
        )


def checked_client(client: Any) -> Any:
    """``client`` if it is a ``dask.distributed.Client`` that is running, else ``ValueError`` naming ``client``."""
    from distributed import Client

    if not isinstance(client, Client):
        raise ValueError(
            "client: must be a dask.distributed.Client (workbench.check.cluster_client() makes one), "
            f"got {validate.describe(client)}"
        )
    if client.status != "running":
        raise ValueError(f"client: must be running, got a client whose status is {client.status!r}")
    return client


def shards(seeds: np.ndarray, workers: int, size: int | None = None) -> list[np.ndarray]:
    """``seeds`` cut in order into shards of ``size`` (default: about :data:`SHARDS_A_WORKER`
    shards a worker)."""
    if size is None:
        size = max(1, math.ceil(len(seeds) / (SHARDS_A_WORKER * max(1, workers))))
    size = validate.integer("shard_seeds", size, minimum=1)
    return [seeds[k : k + size] for k in range(0, len(seeds), size)]


def show_progress(client: Any, futures: list, progress: bool | None) -> None:
    """``distributed.progress`` over ``futures``: a widget in a notebook (it returns at once), a
    text bar on stderr in a terminal (it returns when they are done); ``None``: only where stderr
    is a terminal."""
    if not (sys.stderr.isatty() if progress is None else validate.flag("progress", progress)):
        return
    from distributed import progress as dask_progress

    with contextlib.redirect_stdout(sys.stderr):  # the report is stdout's; the bar is not
        dask_progress(futures, scheduler=client.scheduler.address)


def _workers(client: Any) -> int:
    return max(1, len(client.scheduler_info(n_workers=-1).get("workers", {})))


def gather_shards(futures: list, again: Any) -> tuple[list[ShardResult], list[str]]:
    """Each future's result, in order; a shard whose worker died is run again seed by seed
    (``again(k)``: ``(label, future)`` a seed of shard ``k``), its seeds' results in its place,
    and a seed whose worker dies again is a problem naming its case (the results, the problems)."""
    from distributed import KilledWorker

    out: list[list[Any]] = []
    for k, f in enumerate(futures):
        try:
            out.append([f.result()])
        except KilledWorker:
            out.append(again(k))
    results, problems = [], []
    for group in out:
        for x in group:
            if not isinstance(x, tuple):
                results.append(x)
                continue
            label, f = x
            try:
                results.append(f.result())
            except KilledWorker:
                problems.append(
                    f"{label}: the Dask worker running it died (the subject crashed its process?); "
                    "the case was run once alone and not again"
                )
    return results, problems


def merged_report(
    reports: list[Any], problems: list[str], checked: list[str], seeds: np.ndarray, *, user: Any, flake_rate: float
) -> Any:
    """The report of the union of disjoint shards' ``reports``: their case and fault rows put in
    the order one run over ``seeds`` writes them (``check.shards.canonical``), their problems
    concatenated, then judged once (the calibration, the sign tests and the verdict need every
    case), so the same bits as one run. Unlike ``shards.merge_reports`` (shards run apart,
    seeds ascending) it keeps the caller's seed order and adds what the cluster saw:
    ``problems`` (cases whose worker died) and ``checked``."""
    import pandas as pd

    from workbench.check.report import build_report
    from workbench.check.shards import canonical

    order: dict[int, int] = {}
    for i, s in enumerate(seeds.tolist()):
        order.setdefault(int(s), i)
    cases = pd.concat([r.cases for r in reports], ignore_index=True)
    faults = [r.faults for r in reports if r.faults is not None and len(r.faults)]
    cases, fault_df = canonical(cases, pd.concat(faults, ignore_index=True) if faults else None, order)
    every = [p for r in reports for p in r.problems] + list(problems)
    first = reports[0]
    out = build_report(cases, fault_df, every, user, flake_rate, first.subject, first.kind, checked=checked)
    out.reproducers = [p for r in reports for p in r.reproducers]
    return out


def check_on_cluster(
    client: Any,
    check: Any,
    subject: Any,
    configs: list[tuple],
    seeds: np.ndarray,
    options: dict[str, Any],
    *,
    user: Any,
    flake_rate: float,
    shard_seeds: int | None = None,
    progress: bool | None = None,
) -> Any:
    """The check of ``subject`` over ``configs`` (as ``check_kernel`` expanded them: shape,
    dtype, fold, quant label, spec, quantize) and ``seeds``, shard by shard on ``client``'s
    workers: ``check`` (the serial check) with ``options`` on each, the reports merged
    (:func:`merged_report`; ``user``, ``flake_rate``: the tolerance and flake rate judged)."""
    client = checked_client(client)
    shipped = ship(subject)  # sent with each task: a scattered copy dies with the worker holding it
    jobs, futures = [], []
    workers = _workers(client)
    for shp, dtype, fold, qlabel, _, q in configs:
        one = {**options, "shapes": [shp], "dtypes": [dtype], "folds": [fold], "quantize": [q]}
        for part in shards(seeds, workers, shard_seeds):
            s = [int(v) for v in part]
            jobs.append((one, s, f"shape {shp} {dtype} fold {fold} quant {qlabel}"))
            futures.append(client.submit(run_shard, check, shipped, s, one, pure=False, retries=0))
    show_progress(client, futures, progress)

    def again(k: int) -> list[tuple[str, Any]]:
        one, s, label = jobs[k]
        return [
            (f"{label} seed {v}", client.submit(run_shard, check, shipped, [v], one, pure=False, retries=0)) for v in s
        ]

    done, problems = gather_shards(futures, again)
    if not done:
        raise RuntimeError(f"subject: every shard's Dask worker died; first: {problems[0] if problems else '?'}")
    threads = sorted({", ".join(f"{k}={v}" for k, v in r.threads.items()) for r in done})
    pids = {r.pid for r in done}
    line = (
        f"run on a Dask cluster ({client.scheduler.address}): {len(futures)} shard(s) of seeds in "
        f"{len(pids)} worker process(es), one shard at a time a process; their threads: {'; '.join(threads)}"
    )
    checked = [*done[0].result.checked, line]
    return merged_report([r.result for r in done], problems, checked, seeds, user=user, flake_rate=flake_rate)
