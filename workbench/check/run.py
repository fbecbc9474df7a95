"""One check of an implementation under test: seeded cases at several input scales, the
float64 truth of the same stored weights, the workbench's graph tail beside it, the fault
models on the same cases, a tolerance calibrated from the implementation's own errors,
and the verdict (:mod:`workbench.check.verdict`), gathered in a :class:`CheckReport`.

Input scale multiplies both the branch and the residual: a bug such as eps outside the
square root shows only when the activations are small (eps is then no longer negligible
beside the mean square), and hides when they are large.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from workbench import validate
from workbench.check import blocks, columns, shards
from workbench.check import budget as budget_mod
from workbench.check.calls import callers, in_process, rerun_difference, run_block, where_it_ran
from workbench.check.draws import Draws
from workbench.check.faults import FAULTS, applies, faulty_tail
from workbench.check.graph_stage import GraphStage
from workbench.check.progress import Progress
from workbench.check.replay import DEFAULT_MAX_BYTES, ReplayDir, case_failures, case_metrics, write_reproducer
from workbench.check.report import CheckReport, build_report
from workbench.check.stored import stored_case
from workbench.check.subjects import CallableSubject
from workbench.fold.weights import DENSE_DTYPES
from workbench.studies.cases import (
    CASE_BLOCK,
    case_arrays,
    check_fold,
    check_quant_fits,
    check_seeds,
    check_shape,
    quant_spec,
)
from workbench.tail.comparison import max_abs_error, nmse, worst_scaled_error
from workbench.tail.frink_case import SEED_TOL
from workbench.tail.paths import fused_tail, host_tail
from workbench.tail.weights import DEFAULT_EPS

#: The input scales a check sweeps by default: small activations (where eps shows) to large.
DEFAULT_SCALES: tuple[float, ...] = (0.01, 1.0, 100.0)

#: The metrics a user's tolerance may be on (columns of the case table).
METRICS: tuple[str, ...] = ("worst", "max_abs", "nmse")


def _user_tolerance(tolerance: Any) -> tuple[str, float] | None:
    if tolerance is None:
        return None
    if isinstance(tolerance, (tuple, list)) and len(tolerance) == 2:
        metric, limit = tolerance
        validate.one_of("tolerance metric", metric, METRICS)
        return str(metric), validate.number("tolerance limit", limit, minimum=0)
    return "worst", validate.number("tolerance", tolerance, minimum=0)


def _faults(faults: Any) -> tuple[str, ...]:
    """``faults`` as a tuple of fault names (empty: none run); a bare name or a non-sequence
    is refused rather than iterated (``"abc"`` is not three faults)."""
    out = validate.sequence("faults", faults, what=f"fault names of {tuple(FAULTS)}", non_empty=False)
    for f in out:
        validate.one_of("faults", f, tuple(FAULTS))
    return out


def _flake_rate(flake_rate: Any) -> float:
    """Checked here, not only by the calibration: there a bad rate would end as a note
    ("not calibrated") on a report that otherwise looks complete."""
    return validate.number("flake_rate", flake_rate, minimum=0, exclusive_minimum=True, maximum=0.5)


def as_subject(subject: Any) -> Any:
    """``subject`` as a form with ``calls`` (a plain callable becomes a :class:`CallableSubject`)."""
    if hasattr(subject, "calls"):
        return subject
    if not callable(subject):
        hint = " (an import path is for `python -m workbench.check`)" if isinstance(subject, str) else ""
        raise ValueError(
            f"subject: must be a callable (case -> output array) or a CallableSubject, "
            f"KernelsFolderSubject or SourceSubject, got {validate.describe(subject)}{hint}"
        )
    return CallableSubject(subject)


def _metric_columns(out: np.ndarray, truth: np.ndarray, ref: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The per-row metrics of ``out`` against ``truth`` (``worst``, ``max_abs``, ``nmse``), and,
    given the graph reference ``ref``, its own (``ref_worst``, ...): the one place every table's columns come from."""
    cols = {"worst": worst_scaled_error(out, truth), "max_abs": max_abs_error(out, truth), "nmse": nmse(out, truth)}
    if ref is not None:
        cols.update({f"ref_{k}": v for k, v in _metric_columns(ref, truth).items()})
    return cols


def _frame(base: dict[str, Any], seeds: np.ndarray, scales: list[float], metrics: Mapping[str, np.ndarray]):
    """One DataFrame for a block: a row per case and input scale, case-major (as the
    per-case loop wrote them), the ``base`` columns first."""
    import pandas as pd

    n = len(scales)
    cols: dict[str, Any] = {k: [v] * (len(seeds) * n) for k, v in base.items()}
    cols["seed"] = np.repeat(seeds.astype(np.int64), n)
    cols["scale"] = np.tile(np.asarray(scales, dtype=np.float64), len(seeds))
    cols.update({k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in metrics.items()})
    return pd.DataFrame(cols)


def check_kernel(
    subject: Any,
    *,
    shapes: Sequence[Sequence[int]] = ((64, 96, 80),),
    seeds: Iterable[int] = range(100),
    scales: Sequence[float] = DEFAULT_SCALES,
    dtypes: Sequence[str] = ("float32",),
    folds: Sequence[Any] = (16,),
    quantize: Sequence[Any] = (None,),
    tolerance: Any = None,
    flake_rate: float = 1e-4,
    faults: Sequence[str] = tuple(FAULTS),
    time_limit: float = 30.0,
    eps: float = DEFAULT_EPS,
    rerun: bool = True,
    replay_dir: Any = None,
    replay_max_bytes: int = DEFAULT_MAX_BYTES,
    memory_budget: int | None = None,
    journal: Any = None,
    progress: bool | None = None,
    client: Any = None,
    shard_seeds: int | None = None,
) -> CheckReport:
    """Check ``subject`` (a callable, or a form of :mod:`workbench.check.subjects`) on every
    combination of ``shapes`` x ``dtypes`` x ``folds`` x ``quantize`` x ``seeds``, each at every
    input scale. ``tolerance``: the user's own (a limit on ``worst``, or ``(metric, limit)``);
    ``flake_rate``: the per-case rate the calibrated tolerance is set at; ``time_limit``: seconds
    a call may take before its case is reported as hanging; ``rerun``: run every case a second
    time, in the reverse order, and compare the bits (the report's ``determinism``); ``replay_dir``:
    a folder where each failing case is written as a reproducer (:mod:`workbench.check.replay`),
    each at most ``replay_max_bytes`` (checked before any case runs).

    The implementation runs one case a call; the truth and the graph reference run a block
    of cases at a time (:mod:`workbench.check.blocks`: the same bits as case by case), as many
    as fit ``memory_budget`` bytes (:mod:`workbench.check.budget`; ``None``: its default, 4 GiB
    or half this machine's memory if less), so any number of seeds runs in one call; a shape
    whose single case does not fit is refused before any work. ``journal``: a folder where each
    finished block is written, and from which a run interrupted with the same arguments
    resumes (:class:`workbench.check.shards.Journal`); ``progress``: a bar of cases done, their
    rate and the time left (tqdm, on stderr or in a notebook; ``None``: where stderr is a
    terminal). A run over ``seeds=range(a, b)`` is a shard:
    :func:`workbench.check.shards.merge_reports` merges disjoint shards into the report of their
    union, the same bits as one run. ``folds``: ``None`` or block sizes (each case folds
    ``wo``'s input with its own random signs).

    ``client``: a ``dask.distributed.Client`` (:func:`workbench.check.cluster_client`): the seeds
    run as shards of ``shard_seeds`` (default: two shards a worker) on its workers, merged into
    one report, the same bits (:mod:`workbench.check.cluster`); ``progress``: Dask's progress
    bar over the shards (``None``: where stderr is a terminal); ``journal``: not with a client."""
    import pandas as pd

    subject = as_subject(subject)
    user = _user_tolerance(tolerance)
    flake_rate = _flake_rate(flake_rate)
    # The inputs are multiplied in float32; the rows are labelled with the scales as given
    # (0.01, not float32's 0.009999999776...), so a table is indexed by what was asked for.
    scale_labels = [
        float(validate.number("scales", s, minimum=0, exclusive_minimum=True))
        for s in validate.sequence("scales", scales, what="positive numbers")
    ]
    faults = _faults(faults)
    seconds = validate.number("time_limit", time_limit, minimum=0, exclusive_minimum=True)
    rerun = validate.flag("rerun", rerun)
    if isinstance(seeds, range):  # a typo'd count must be refused before its seeds are allocated
        validate.within_memory("seeds", len(seeds) * 8, f"{len(seeds)} seeds")
    seed_arr = check_seeds(seeds)
    eps = validate.number("eps", eps, minimum=0, exclusive_minimum=True)
    where = ReplayDir.of(replay_dir, replay_max_bytes)
    budget = budget_mod.check_budget(memory_budget)
    show = sys.stderr.isatty() if progress is None else validate.flag("progress", progress)
    problems: list[str] = []
    configs: list[tuple] = []
    sizes: list[tuple[int, bool]] = []
    for shp in validate.sequence("shapes", shapes, what="(hidden, branch, ffn) triples"):
        shp = check_shape(shp)
        for dtype in validate.sequence("dtypes", dtypes, what=f"dtypes in {tuple(DENSE_DTYPES)}"):
            validate.one_of("dtypes", dtype, tuple(DENSE_DTYPES))
            for fold in validate.sequence("folds", folds, what="None or block sizes"):
                check_fold(fold, shp)
                for q in validate.sequence("quantize", quantize, what="None, format names or dicts"):
                    qlabel, spec = quant_spec(q)
                    check_quant_fits(spec, shp)
                    if where is not None:
                        where.check_fits(shp, len(scale_labels), fold)
                    sizes.append(budget_mod.block_plan(shp, budget))
                    configs.append((shp, dtype, fold, qlabel, spec, q))
    if client is not None:  # shards of seeds as tasks on a Dask cluster, merged into one report
        from workbench.check.cluster import check_on_cluster

        if journal is not None:
            raise ValueError("journal: a run on a Dask cluster is not journaled (give journal=None, or no client)")
        opts = {"scales": scale_labels, "faults": faults, "time_limit": seconds, "eps": eps, "rerun": rerun}
        opts.update(
            tolerance=tolerance, flake_rate=flake_rate, replay_dir=replay_dir, replay_max_bytes=replay_max_bytes
        )
        opts["memory_budget"] = memory_budget
        dask_args = {"shard_seeds": shard_seeds, "progress": progress}
        return check_on_cluster(
            client, check_kernel, subject, configs, seed_arr, opts, user=user, flake_rate=flake_rate, **dask_args
        )
    log = None
    if journal is not None:
        tag = {
            "subject": [getattr(subject, "name", "?"), getattr(subject, "kind", "callable")],
            "configs": [[list(c[0]), c[1], str(c[2]), c[3]] for c in configs],
            "seeds": [len(seed_arr), shards.seeds_digest(seed_arr)],
            "scales": scale_labels,
            "faults": list(faults),
            "eps": eps,
            "rerun": rerun,
        }
        log = shards.Journal(journal, tag)
    bar = Progress(len(configs) * len(seed_arr), show=show)
    calls = callers(subject, seconds)
    writer = None if where is None else _Reproducers(where, subject, user, scale_labels)
    try:
        frames, fframes = _blocks(
            subject, calls, configs, sizes, seed_arr, scale_labels, faults, eps, rerun, problems, writer, log, bar
        )
    finally:
        calls.close()
        bar.close()
    cases = pd.concat(frames, ignore_index=True)
    fault_df = pd.concat(fframes, ignore_index=True) if fframes else None
    report = build_report(
        cases,
        fault_df,
        problems,
        user,
        flake_rate,
        getattr(subject, "name", "?"),
        getattr(subject, "kind", "callable"),
        checked=_checked(subject, rerun),
    )
    report.reproducers = [] if writer is None else [str(p) for p in writer.written]
    if log is not None and log.failed:
        report.notes.append(log.failed)
    return report


class _Reproducers:
    """Writes each failing case of a check as a reproducer (:mod:`workbench.check.replay`)."""

    def __init__(self, where: ReplayDir, subject: Any, user: tuple[str, float] | None, scales: list[float]):
        self.where, self.scales = where, scales
        self.subject = (getattr(subject, "name", "?"), getattr(subject, "kind", "callable"))
        self.tolerances = {"frink-models 2e-4": ("worst", SEED_TOL), **({"user's": user} if user else {})}
        self.written: list[Any] = []

    def block(self, config: tuple, c: Any, names: list[str], B: Any, R: Any, out: Any, truth: Any, eps: float) -> None:
        shp, dtype, fold, qlabel, _, q = config
        for i, seed in enumerate(c.seeds):
            failures = case_failures(case_metrics(out[i], truth[i]), self.tolerances, self.scales)
            if not failures:
                continue
            case = {
                "seed": int(seed),
                "shape": [int(v) for v in shp],
                "dtype": dtype,
                "fold": None if fold is None else int(fold),
                "quantize": q,
                "quant_label": qlabel,
                "eps": float(eps),
                "scales": self.scales,
                "tolerances": {k: [m, float(v)] for k, (m, v) in self.tolerances.items()},
                "subject": self.subject[0],
                "form": self.subject[1],
                "name": names[i],
                "failures": failures,
            }
            self.written.append(write_reproducer(self.where, case, B[i], R[i], out[i], truth[i]))


def _checked(subject: Any, rerun: bool) -> list[str]:
    """What the check verified, in words, for the report."""
    callable_form = isinstance(subject, CallableSubject)
    out = [f"ran {where_it_ran(subject)}"]
    if callable_form and in_process(subject):
        out.append(
            "each case's calls handed fresh copies of the inputs (its weights one copy for all of its calls, "
            "its activations one a call), verified unchanged after them"
        )
    elif callable_form:
        out.append("each call handed fresh copies of the inputs, verified unchanged after it")
    if callable_form:
        out.append("an output sharing memory with an input or a buffer the check holds refused")
    else:
        out.append("the branch and residual verified unchanged after each block")
    out.append(
        "each case run a second time in the reverse order and the bits compared"
        + (" (with fresh copies: a cache keyed by input identity shows)" if callable_form else "")
        if rerun
        else "no second run (rerun=False)"
    )
    return out


def _blocks(
    subject: Any,
    calls: Any,
    configs: list,
    sizes: list[tuple[int, bool]],
    seed_arr: np.ndarray,
    scale_labels: list[float],
    faults: Sequence[str],
    eps: float,
    rerun: bool,
    problems: list[str],
    writer: _Reproducers | None,
    log: Any,
    bar: Progress,
) -> tuple[list, list]:
    """Every configuration and block of seeds (a journal's blocks taken as done): the case
    and fault tables, one of each a configuration in a run's row order (:func:`shards.canonical`);
    what went wrong appended to ``problems``."""
    order: dict[int, int] = {}
    for i, s in enumerate(seed_arr.tolist()):
        order.setdefault(int(s), i)
    frames, fframes = [], []
    for ci, (config, (size, prefetch)) in enumerate(zip(configs, sizes, strict=True)):
        shp, dtype, fold, qlabel, _, _ = config
        base = {"hidden": shp[0], "branch": shp[1], "ffn": shp[2], "dtype": dtype, "fold": str(fold), "quant": qlabel}
        cdfs, fdfs = [], []
        todo = seed_arr
        if log is not None and log.blocks.get(ci):
            for _, cdf, fdf, probs in log.blocks[ci]:
                cdfs.append(cdf)
                fdfs += [fdf] if len(fdf) else []
                problems += probs
            todo = seed_arr[~np.isin(seed_arr, np.fromiter(log.done(ci), dtype=np.int64))]
            bar.add(len(seed_arr) - len(todo))
        chunks = _chunks(todo, size)
        buffers = [Draws(shp, min(size, len(todo))) for _ in range(2 if prefetch and len(chunks) > 1 else 1)]
        stage = GraphStage()  # the reference's dense weights, written case after case
        scratch: dict = {}  # the truth's float64 buffer, kept block after block
        for chunk, cases in _drawn(shp, chunks, buffers):
            said: list[str] = []
            job = (config, base, chunk, cases, stage, scratch)
            cdf, fdf = _block(subject, calls, job, scale_labels, faults, eps, rerun, said, writer)
            problems += said
            cdfs.append(cdf)
            fdfs += [fdf] if fdf is not None else []
            if log is not None:
                log.add(ci, chunk, cdf, fdf if fdf is not None else cdf.iloc[:0], said)
            bar.add(len(chunk))
        stage.clear()
        import pandas as pd

        cat = pd.concat(cdfs, ignore_index=True)
        fcat = pd.concat(fdfs, ignore_index=True) if fdfs else None
        cat, fcat = shards.canonical(cat, fcat, order)
        frames.append(cat)
        fframes += [fcat] if fcat is not None else []
    return frames, fframes


def _chunks(seeds: np.ndarray, size: int) -> list[np.ndarray]:
    """``seeds`` in runs of at most ``size``, a run never crossing a draw's block of
    :data:`~workbench.studies.cases.CASE_BLOCK` seeds (so a run is drawn from one stream, in place)."""
    if not len(seeds):
        return []
    cut = np.flatnonzero(np.diff(seeds // CASE_BLOCK) != 0) + 1
    return [run[k : k + size] for run in np.split(seeds, cut) for k in range(0, len(run), size)]


def _drawn(shape: tuple[int, int, int], chunks: list[np.ndarray], buffers: list[Draws]) -> Iterator[tuple]:
    """Each chunk of seeds with its cases (:func:`_draw`). With two buffers, the next chunk is
    drawn into the other one on a thread while the caller checks this one (the draw was a
    fifth of a check at a shipped shape, and nothing else ran beside it); a chunk's buffer is
    drawn into again only after the caller has come back for the chunk after next."""
    if len(buffers) < 2:
        for chunk in chunks:
            yield chunk, _draw(shape, chunk, buffers[0])
        return
    with ThreadPoolExecutor(1, thread_name_prefix="check-draw") as pool:
        ahead = pool.submit(_draw, shape, chunks[0], buffers[0])
        for k, chunk in enumerate(chunks):
            cases = ahead.result()
            if k + 1 < len(chunks):
                ahead = pool.submit(_draw, shape, chunks[k + 1], buffers[(k + 1) % 2])
            yield chunk, cases


def _draw(shape: tuple[int, int, int], chunk: np.ndarray, draws: Draws) -> Any:
    """The cases of ``chunk``: ascending seeds of one draw block are drawn into the
    configuration's reused buffer (:class:`~workbench.check.draws.Draws`: ``draw_block``'s
    bits, no concatenated and reordered copy); any others through ``case_arrays``."""
    blk = chunk // CASE_BLOCK
    if (blk == blk[0]).all() and (np.diff(chunk) > 0).all():
        return draws.block(int(blk[0]), chunk - blk[0] * CASE_BLOCK)
    return case_arrays(shape, chunk)


def _block(
    subject: Any,
    calls: Any,
    job: tuple,
    scale_labels: list[float],
    faults: Sequence[str],
    eps: float,
    rerun: bool,
    problems: list[str],
    writer: _Reproducers | None,
) -> tuple[Any, Any]:
    """One block of seeds of one configuration: the truth, the reference, the implementation's
    runs and the fault models, as its case table and fault table (None: no fault ran); ``job``:
    the configuration, its table columns, the block's seeds, its drawn cases, the
    reference's staged weights (:class:`~workbench.check.graph_stage.GraphStage`) and the
    truth's kept buffer."""
    import pandas as pd

    config, base, chunk, c, stage, scratch = job
    shp, dtype, fold, qlabel, spec, _ = config
    scale_arr = np.array(scale_labels, dtype=np.float32)
    st = blocks.stored_block(c, dtype=dtype, fold=fold, spec=spec, eps=eps)
    B = c.branch[:, None, :] * scale_arr[None, :, None]
    R = c.residual[:, None, :] * scale_arr[None, :, None]
    scs = [
        blocks.case(st, i, B[i], R[i], f"shape {shp} {dtype} fold {fold} quant {qlabel} seed {int(s)}")
        for i, s in enumerate(c.seeds)
    ]

    # a fold and a quantized wo are the same for every case of a block
    applied = [f for f in faults if applies(f, scs[0])]

    def tables(truth: np.ndarray, outs: list[np.ndarray]) -> list:
        """The fault models' tables, from their outputs and the truth."""
        return [
            _frame({**base, "fault": f}, c.seeds, scale_labels, _metric_columns(fo, truth))
            for f, fo in zip(applied, outs, strict=True)
        ]

    def own() -> tuple[np.ndarray, list]:
        """The check's own numpy side of the block: the truth, the fault models' tables."""
        truth = blocks.truth(st, B, R, scratch)
        return truth, tables(truth, [blocks.faulty(st, B, R, f) for f in applied])

    kept = (B.copy(), R.copy())
    config_args = {"rerun": rerun, "dtype": dtype, "fold": fold, "spec": spec, "eps": eps}
    key = columns.block_key(config, c.seeds, scale_labels, tuple(faults), eps)
    hit = columns.COLUMNS.get(key)
    if hit is not None:  # the same cases checked before, whatever the implementation
        truth, ref, fframes = hit
        held = [B, R, truth, ref]
        runs = run_block(subject, calls, scs, c, scales=scale_labels, problems=problems, held=held, **config_args)
    elif calls.process is not None:
        # The implementation runs in its worker process (its calls sent and waited for on a
        # thread of their own) while this process computes the truth and the faults on two
        # others and the MLX reference on this one (numpy, MLX and the pipes release the GIL; MLX's
        # streams are this thread's): the cores at work together. None of it is handed to the
        # worker, so no output of the worker's can alias it.
        with ThreadPoolExecutor(3, thread_name_prefix="check-own") as pool:
            sent = pool.submit(
                run_block, subject, calls, scs, c, scales=scale_labels, problems=problems, held=[B, R], **config_args
            )
            # the truth and each fault model a task of their own: two of them at a time beside
            # the calls, where one thread for all of them was the block's longest path
            side = pool.submit(blocks.truth, st, B, R, scratch)
            outs = [pool.submit(blocks.faulty, st, B, R, f) for f in applied]
            ref = blocks.reference(st, B, R, stage)
            runs = sent.result()
            truth = side.result()
            fframes = tables(truth, [o.result() for o in outs])
    else:
        (truth, fframes), ref = own(), blocks.reference(st, B, R, stage)
        held = [B, R, truth, ref]
        runs = run_block(subject, calls, scs, c, scales=scale_labels, problems=problems, held=held, **config_args)
    if hit is None:
        columns.COLUMNS.put(key, truth, ref, fframes)
    if not (np.array_equal(kept[0], B) and np.array_equal(kept[1], R)):
        problems.append(f"{scs[0].case} ..: the implementation changed the branch or residual in place")
    if writer is not None:
        writer.block(config, c, [sc.case for sc in scs], B, R, runs.first, truth, eps)
    metrics = _metric_columns(runs.first, truth, ref)
    if runs.again is not None:
        metrics["rerun_diff"] = rerun_difference(runs.first, runs.again, truth)
    fdf = pd.concat(fframes, ignore_index=True) if fframes else None
    return _frame(base, c.seeds, scale_labels, metrics), fdf


def check_dump(
    path: Any, *, tolerance: Any = None, flake_rate: float = 1e-4, faults: Sequence[str] = tuple(FAULTS)
) -> CheckReport:
    """Check the outputs an engine dumped (:mod:`workbench.check.dump`: a file, or a folder of
    them): each row of each file against the float64 truth of the file's stored weights,
    beside the workbench's graph tail and the fault models on the same rows (input scale 1:
    the engine's own activations). A file that does not follow the layout is reported by
    name and tensor; the others are still checked."""
    from workbench.check.dump import DumpError, dump_files, read_layer

    user = _user_tolerance(tolerance)
    flake_rate = _flake_rate(flake_rate)
    faults = _faults(faults)
    rows, frows, problems = [], [], []
    for file in dump_files(path):
        try:
            layer = read_layer(file)
        except DumpError as e:
            problems.append(str(e))
            continue
        w, B, R = layer.weights, layer.branch, layer.residual
        truth = host_tail(w, B, R)
        ref = fused_tail(w, B, R, backend="graph")
        out = layer.output
        h, b, f_ = w.shape
        base = {"hidden": h, "branch": b, "ffn": f_, "dtype": w.wo.dtype, "fold": repr(w.wo.fold), "file": file.name}
        metrics = _metric_columns(out, truth, ref)
        for j in range(len(B)):
            rows.append({**base, "seed": j, "scale": 1.0, **{k: float(v[j]) for k, v in metrics.items()}})
        sc = stored_case(w, B, R, file.name)
        for flt in faults:
            if not applies(flt, sc):
                continue
            fo = faulty_tail(sc, flt)
            fm = _metric_columns(fo, truth)
            for j in range(len(B)):
                frows.append({**base, "fault": flt, "seed": j, "scale": 1.0, **{k: float(v[j]) for k, v in fm.items()}})
    if not rows:
        raise ValueError(f"path: no dump file could be read: {'; '.join(problems) if problems else 'none found'}")
    import pandas as pd

    return build_report(
        pd.DataFrame(rows), pd.DataFrame(frows) if frows else None, problems, user, flake_rate, str(path), "dump"
    )
