"""What a ``python -m bench.real_model`` record says: a real model's decode with the fused
tail in every layer, and one tail beside the ops it replaces, shape by shape.

A record holds ``decode`` (per variant: tokens a second over the rounds, their median,
whether its greedy tokens equal the reference's; newer records also tokens per CPU second)
and ``tails`` (per shape and weight format: each variant's one-evaluation time, its time a
tail inside a chain of tails in one evaluation, its worst error against float64, and the
floor: the tail's weight bytes over the device's copy rate). These functions turn a record
into the notebooks' tables; each refuses a dict that is not such a record
(``records.RecordError``) or lacks what it reads (``ValueError`` naming it).

Records that do not time the ``graph-ops`` variant come from a bench whose chained reference
ignored the residual handed to it, so their chain figure is not a tail's cost:
:func:`chain_comparable` says which records are clear of it, and :func:`tail_table` leaves
the others' chain columns out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from workbench.reports.records import check as check_record
from workbench.reports.records import load_all
from workbench.validate import describe

__all__ = [
    "load_records",
    "chain_comparable",
    "decode_table",
    "decode_runs",
    "paired_ratio",
    "paired_interval",
    "paired_interval_table",
    "paired_table",
    "paired_across",
    "host_api_table",
    "graph_call_ms",
    "mlx_settings",
    "tail_table",
    "chain_split_table",
    "build_profile_table",
    "own_us_per_call",
    "best_cuda",
    "STORED_GRAPH",
    "UNJUDGED",
]

nan = float("nan")


def _record(rec: Any, name: str = "rec") -> Mapping:
    return check_record(rec, "real_model", name=name)


def load_records(folder: str | os.PathLike | None = None) -> list[dict]:
    """Every real_model record in ``folder`` (default the project's ``data/bench``), sorted by
    file name, each checked and with its ``file`` name added (``records.load_all``)."""
    return load_all("real_model", folder)


def _tails(rec: Mapping) -> list[Mapping]:
    tails = rec.get("tails")
    if tails is None:  # the first records held the real layer alone, as "tail"
        tails = [rec["tail"]]
    if not isinstance(tails, list) or not tails or not all(isinstance(t, Mapping) and "variants" in t for t in tails):
        raise ValueError(
            f"rec['tails']: must be a non-empty list of shapes, each with its 'variants', got {describe(tails)}"
        )
    return tails


def chain_comparable(rec: Mapping) -> bool:
    """Whether the record's chain figures compare the reference with the fused variants (see
    the module docstring): true for records that time ``graph-ops`` (written after the fix)."""
    rec = _record(rec)
    return "graph-ops" in _tails(rec)[0]["variants"]


def decode_table(rec: Mapping) -> Any:
    """A ``pandas.DataFrame``, one row a decode variant: ``variant``, ``tokens_per_s`` (median
    over the rounds), ``vs_reference`` (its ratio to mlx-lm's own layers), ``tokens_per_cpu_s``
    and its ratio (NaN in records that lack them), ``same_tokens``, ``ops_per_step`` (the ops
    in one step's graph: host work on every device) and, from a ``--profile`` run,
    ``kernels_per_step``, ``device_ms_per_step``, ``graph_launches_per_step`` (the CUDA graphs
    MLX handed the device a step: one every ``MLX_MAX_OPS_PER_BUFFER`` ops or so, each a
    launch the host pays for) and ``device_share`` (the device's kernel
    time over a step's wall time: how little of a step the device is busy; NaN where the
    record lacks them). Newer records add ``paired`` (the median over rounds of the ratio to
    the reference in the same round: a round's load hits both alike), the step split into
    ``build_ms`` (Python and MLX making the step's ops), ``encode_ms`` (MLX turning them into
    device work) and ``wait_ms`` (the read), and ``pipelined_tokens_per_s`` with its ratios
    ``pipelined_vs_reference`` and ``pipelined_paired`` (mlx-lm's own generation loop:
    the next step built while the device runs this one); NaN where absent."""
    import pandas as pd

    rec = _record(rec)
    decode = rec["decode"]
    if not isinstance(decode, Mapping) or "reference" not in decode:
        raise ValueError(
            f"rec['decode']: must map variants to their rates, 'reference' among them, got {describe(decode)}"
        )
    ref = decode["reference"]
    rows = []
    for name, d in decode.items():
        for key in ("tokens_per_s_median", "same_tokens"):
            if key not in d:
                raise ValueError(f"rec['decode'][{name!r}]: must have {key!r}, got keys {sorted(d)}")
        cpu = d.get("tokens_per_cpu_s_median")
        ref_cpu = ref.get("tokens_per_cpu_s_median")
        rows.append(
            {
                "variant": name,
                "tokens_per_s": float(d["tokens_per_s_median"]),
                "vs_reference": float(d["tokens_per_s_median"]) / float(ref["tokens_per_s_median"]),
                "tokens_per_cpu_s": nan if cpu is None else float(cpu),
                "cpu_vs_reference": nan if cpu is None or ref_cpu is None else float(cpu) / float(ref_cpu),
                "same_tokens": bool(d["same_tokens"]),
                "ops_per_step": float(d.get("ops_per_step", nan)),
                "kernels_per_step": float(d.get("device_profile", {}).get("kernels_per_step", nan)),
                "device_ms_per_step": float(d.get("device_profile", {}).get("device_us_per_step", nan)) / 1e3,
                "graph_launches_per_step": float(d.get("device_profile", {}).get("graph_launches_per_step", nan)),
            }
        )
        rows[-1]["device_share"] = rows[-1]["device_ms_per_step"] * rows[-1]["tokens_per_s"] / 1e3
        split = d.get("step_split_ms", {})
        piped, ref_piped = d.get("pipelined_tokens_per_s_median"), ref.get("pipelined_tokens_per_s_median")
        rows[-1].update(
            {
                "paired": float(d.get("vs_reference_paired", nan)),
                "build_ms": float(split.get("build_ms", nan)),
                "encode_ms": float(split.get("encode_ms", nan)),
                "wait_ms": float(split.get("wait_ms", nan)),
                "pipelined_tokens_per_s": nan if piped is None else float(piped),
                "pipelined_vs_reference": nan
                if piped is None or ref_piped is None
                else float(piped) / float(ref_piped),
                "pipelined_paired": float(d.get("pipelined_vs_reference_paired", nan)),
                "pipelined_same_tokens": bool(d.get("pipelined_same_tokens", d["same_tokens"])),
            }
        )
    return pd.DataFrame(rows)


def decode_runs(runs: Mapping[str, Mapping]) -> Any:
    """Several runs' :func:`decode_table` in one ``pandas.DataFrame`` indexed by ``(run,
    variant)``: ``runs`` maps a label to a real_model record, in the order to show them.
    Ratios of one run are comparable with another's; rates are each machine's own."""
    import pandas as pd

    if not isinstance(runs, Mapping) or not runs:
        raise ValueError(f"runs: must map labels to real_model records, at least one, got {describe(runs)}")
    return pd.concat(
        {str(label): decode_table(rec).set_index("variant") for label, rec in runs.items()}, names=["run", "variant"]
    )


def _round_ratios(rec: Mapping, variant: str, against: str, pipelined: bool):
    """The per-round ratios of ``variant``'s decode rate to ``against``'s, as a float64 array."""
    import numpy as np

    rec = _record(rec)
    decode = rec["decode"]
    key = "pipelined_tokens_per_s" if pipelined else "tokens_per_s"
    rates = []
    for name, arg in ((variant, "variant"), (against, "against")):
        if not isinstance(name, str) or name not in decode:
            raise ValueError(
                f"{arg}: must be one of the record's decode variants {sorted(decode)}, got {describe(name)}"
            )
        got = decode[name].get(key)
        if not isinstance(got, list) or not got:
            raise ValueError(f"rec['decode'][{name!r}]: has no per-round {key!r} list (an older record)")
        rates.append(np.asarray(got, dtype=float))
    if rates[0].shape != rates[1].shape:
        raise ValueError(
            f"rec['decode']: {variant!r} and {against!r} ran different numbers of rounds "
            f"({rates[0].size} and {rates[1].size})"
        )
    return rates[0] / rates[1]


def paired_ratio(rec: Mapping, variant: str, against: str, *, pipelined: bool = False) -> float:
    """The decode rate of ``variant`` over that of ``against``, paired: the median over the
    record's rounds of the two rates' ratio in the same round (a round's load hits both
    alike), step after step or (``pipelined``) in mlx-lm's loop. What :func:`decode_table`'s
    ``paired`` is against the reference, for any two variants of one run (a fused variant
    with stacked q, k, v against ``reference-qkv``: what the tails earn beside that change)."""
    import numpy as np

    return float(np.median(_round_ratios(rec, variant, against, pipelined)))


def _check_level(level: Any) -> None:
    """ValueError unless ``level`` (an interval's coverage) is a number strictly between 0 and 1."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level: must be a number strictly between 0 and 1, got {describe(level)}")


def paired_interval(
    rec: Mapping, variant: str, against: str, *, pipelined: bool = False, level: float = 0.95
) -> tuple[float, float]:
    """A ``level`` interval for :func:`paired_ratio`: the percentile bootstrap over the
    record's rounds (``decode.savings.resampled_medians``, seeded, so the same interval every
    time). A claim such as "at least 1.2x mlx-lm's layers" is settled by a run only where the
    interval's low end clears it; a median past the mark with the low end under it says the
    run had too few rounds for its noise."""
    from workbench.decode.savings import percentile_interval, resampled_medians

    _check_level(level)
    return percentile_interval(resampled_medians(_round_ratios(rec, variant, against, pipelined)), float(level))


def paired_interval_table(rec: Mapping, variants: Sequence[str], against: str, *, level: float = 0.95) -> Any:
    """A ``pandas.DataFrame`` of :func:`paired_ratio` and :func:`paired_interval` of each of
    ``variants`` against ``against``, one row a (loop, variant) with the loops of
    :data:`LOOPS`: ``paired``, ``lo``, ``hi`` and ``rounds``."""
    import pandas as pd

    if isinstance(variants, str) or not isinstance(variants, Sequence) or not variants:
        raise ValueError(f"variants: must be a non-empty list of decode variant names, got {describe(variants)}")
    import numpy as np

    from workbench.decode.savings import percentile_interval, resampled_medians

    _check_level(level)
    rows = []
    for loop, piped in LOOPS.items():
        for v in variants:
            r = _round_ratios(rec, v, against, piped)  # once a row: the median and its interval from the same rounds
            lo, hi = percentile_interval(resampled_medians(r), float(level))
            rows.append(
                {"loop": loop, "variant": v, "paired": float(np.median(r)), "lo": lo, "hi": hi, "rounds": int(r.size)}
            )
    return pd.DataFrame(rows).set_index(["loop", "variant"])


def paired_table(rec: Mapping, variants: Sequence[str], against: Sequence[str]) -> Any:
    """A ``pandas.DataFrame`` of :func:`paired_ratio`: one row a variant of ``variants``, one
    column a (loop, variant of ``against``) pair, the loops ``"step after step"`` and
    ``"pipelined"`` (:data:`LOOPS`): for instance the fused tails with stacked q, k, v against
    mlx-lm's layers and against mlx-lm's layers with the same stacking, in one table."""
    import pandas as pd

    for name, given in (("variants", variants), ("against", against)):
        if isinstance(given, str) or not isinstance(given, Sequence) or not given:
            raise ValueError(f"{name}: must be a non-empty list of decode variant names, got {describe(given)}")
    return pd.DataFrame(
        {
            (loop, b): {a: paired_ratio(rec, a, b, pipelined=piped) for a in variants}
            for loop, piped in LOOPS.items()
            for b in against
        }
    )


#: The two decode loops a record times, by the name the tables give them: whether the loop is
#: mlx-lm's pipelined one.
LOOPS = {"step after step": False, "pipelined": True}


def paired_across(recs: Sequence[Mapping], variant: str, against: str, loop: str) -> list[float]:
    """:func:`paired_ratio` of ``variant`` against ``against`` in ``loop`` (:data:`LOOPS`),
    one figure a record of ``recs``, in their order: one comparison run by run."""
    if loop not in LOOPS:
        raise ValueError(f"loop: must be one of {list(LOOPS)}, got {describe(loop)}")
    if isinstance(recs, (str, Mapping)) or not isinstance(recs, Sequence) or not recs:
        raise ValueError(f"recs: must be a non-empty list of real_model records, got {describe(recs)}")
    return [paired_ratio(rec, variant, against, pipelined=LOOPS[loop]) for rec in recs]


def host_api_table(rec: Mapping) -> Any:
    """A ``pandas.DataFrame`` of the CUDA runtime calls a decode step made from the host, from
    a ``--profile`` run: one row a call, ``call``, then per variant its host us a step (the
    eight calls with the most host time in each variant; 0 where a variant's list lacks a
    call). Empty where the record has no profile with host calls."""
    import pandas as pd

    rec = _record(rec)
    cols: dict[str, dict[str, float]] = {}
    for name, d in rec["decode"].items():
        calls = d.get("device_profile", {}).get("host_api")
        if calls:
            cols[name] = {c["name"]: float(c["us_per_step"]) for c in calls}
    if not cols:
        return pd.DataFrame()
    names = sorted({k for v in cols.values() for k in v}, key=lambda k: -max(v.get(k, 0.0) for v in cols.values()))
    return pd.DataFrame([{"call": k, **{v: cols[v].get(k, 0.0) for v in cols}} for k in names])


def graph_call_ms(rec: Mapping) -> dict[str, float]:
    """Per variant of a ``--profile`` run, the host's ms a step in CUDA graph calls (every call
    of :func:`host_api_table` named ``cudaGraph...``: adding nodes, updating the cached
    graph, launching it, destroying the built one): what MLX's graph encoding costs a step.
    Empty where the record has no profile with host calls."""
    t = host_api_table(rec)
    if t.empty:
        return {}
    graph = t[t["call"].str.startswith("cudaGraph")]
    return {v: float(graph[v].sum()) / 1e3 for v in t.columns if v != "call"}


def mlx_settings(rec: Mapping) -> dict[str, str]:
    """The MLX settings from the environment the record's run had (``MLX_USE_CUDA_GRAPHS``
    and the like; ``bench.common.record.provenance``): empty for MLX's defaults, and for
    records older than the field."""
    rec = _record(rec)
    env = rec.get("mlx_environment", {})
    if not isinstance(env, Mapping):
        raise ValueError(f"rec['mlx_environment']: must map names to values, got {describe(env)}")
    return {str(k): str(v) for k, v in env.items()}


def best_cuda(row: Mapping, key: str = "median_ms") -> str | None:
    """The CUDA variant (``cuda-3`` or a ``cuda-1:<shape>``) with the least ``key`` in one
    shape's row of a record; ``None`` where the record has no CUDA variant."""
    variants = row.get("variants") if isinstance(row, Mapping) else None
    if not isinstance(variants, Mapping):
        raise ValueError(f"row: must be one shape of a real_model record (with 'variants'), got {describe(row)}")
    cands = {k: float(v[key]) for k, v in variants.items() if k.startswith("cuda-")}
    return min(cands, key=cands.get) if cands else None


#: The per-tail variant of the fused graph with half-precision activations (``bench.real_model``).
STORED_GRAPH = "graph-stored"

#: The per-tail variants reported but not judged against float64 (their activations round).
UNJUDGED = ("reference", STORED_GRAPH)


def tail_table(rec: Mapping) -> Any:
    """A ``pandas.DataFrame``, one row a shape and weight format: ``shape``, ``weights``,
    ``weight_mb``, ``floor_ms``; then, one evaluation each, ``reference_ms`` (the ops mlx-lm
    runs), ``graph_ms`` (the fused graph as ``fused_tails`` runs it), ``cuda`` (the fastest
    CUDA variant, by one evaluation) and ``cuda_ms``, and each one's ratio to the reference
    (``graph_vs_ref``, ``cuda_vs_ref``: above 1 is faster); where the record's chains compare
    (:func:`chain_comparable`), the same a tail inside a chain (``*_chain_ms``,
    ``*_chain_vs_ref``; ``cuda_chain``: the fastest CUDA variant in a chain). Every fused variant
    shown passed the float64 check (the bench stops
    otherwise); ``worst`` is the largest of their worst scaled errors; ``reference_worst``
    the reference's own (reported, not judged: in half-precision activations its rounding is
    mlx-lm's). Where the record has it (half-precision weights, records since
    ``graph_tail``'s ``activations="stored"``): ``graph_stored_ms``, ``graph_stored_vs_ref``
    (and ``graph_stored_chain_*``) and ``graph_stored_worst``, the fused graph with the
    activations in the weights' dtype, reported, not judged, as the reference is; NaN elsewhere.
    ``activations`` is the dtype the model keeps its activations in (the reference's), and
    ``graph_kept_vs_ref`` (``graph_kept_chain_vs_ref``) the ratio of the graph tail that keeps
    them so: the float32 tail for float32, the stored-activation tail for half precision (NaN
    where the record lacks it)."""
    import pandas as pd

    rec = _record(rec)
    chained = chain_comparable(rec)
    rows = []
    for t in _tails(rec):
        v = t["variants"]
        for name in ("reference", "graph"):
            if name not in v:
                raise ValueError(f"rec['tails'] {t.get('label')!r}: must have the variant {name!r}, got {sorted(v)}")
        ref, graph = v["reference"], v["graph"]
        cuda = best_cuda(t)
        row: dict[str, Any] = {
            "shape": t["label"],
            "weights": t["weights"],
            "weight_mb": t["weight_bytes"] / 1e6,
            "floor_ms": float(t["floor_ms"]),
            "reference_ms": float(ref["median_ms"]),
            "graph_ms": float(graph["median_ms"]),
            "graph_vs_ref": ref["median_ms"] / graph["median_ms"],
            "cuda": cuda,
            "cuda_ms": nan if cuda is None else float(v[cuda]["median_ms"]),
            "cuda_vs_ref": nan if cuda is None else ref["median_ms"] / v[cuda]["median_ms"],
        }
        if chained:
            cc = best_cuda(t, "chain_ms_per_tail")
            row.update(
                {
                    "reference_chain_ms": float(ref["chain_ms_per_tail"]),
                    "graph_chain_ms": float(graph["chain_ms_per_tail"]),
                    "graph_chain_vs_ref": ref["chain_ms_per_tail"] / graph["chain_ms_per_tail"],
                    "cuda_chain": cc,
                    "cuda_chain_ms": nan if cc is None else float(v[cc]["chain_ms_per_tail"]),
                    "cuda_chain_vs_ref": nan if cc is None else ref["chain_ms_per_tail"] / v[cc]["chain_ms_per_tail"],
                }
            )
        stored = v.get(STORED_GRAPH)
        row["graph_stored_ms"] = nan if stored is None else float(stored["median_ms"])
        row["graph_stored_vs_ref"] = nan if stored is None else ref["median_ms"] / stored["median_ms"]
        if chained:
            row["graph_stored_chain_ms"] = nan if stored is None else float(stored["chain_ms_per_tail"])
            row["graph_stored_chain_vs_ref"] = (
                nan if stored is None else ref["chain_ms_per_tail"] / stored["chain_ms_per_tail"]
            )
        row["graph_stored_worst"] = nan if stored is None else float(stored["worst_vs_float64"])
        # the graph tail with the activations in the dtype the model keeps them in: the float32
        # tail where the model computes in float32, the stored-activation one where it is half
        row["activations"] = str(t.get("activations", "float32"))
        kept = graph if row["activations"] == "float32" else stored
        row["graph_kept_vs_ref"] = nan if kept is None else ref["median_ms"] / kept["median_ms"]
        if chained:
            row["graph_kept_chain_vs_ref"] = (
                nan if kept is None else ref["chain_ms_per_tail"] / kept["chain_ms_per_tail"]
            )
        row["worst"] = max(float(x["worst_vs_float64"]) for k, x in v.items() if k not in UNJUDGED)
        row["reference_worst"] = float(v["reference"]["worst_vs_float64"])
        rows.append(row)
    return pd.DataFrame(rows)


#: The per-tail split of a chain (``bench.real_model.chain_split``), host us a tail.
CHAIN_SPLIT = ("chain_build_us", "chain_encode_us", "chain_wait_us")


def chain_split_table(rec: Mapping) -> Any:
    """A ``pandas.DataFrame``, one row a shape and variant whose record has the split of a
    chain as a decode step splits (``bench.real_model.chain_split``): ``shape``, ``variant``,
    ``build_us`` (making a tail's ops, Python and MLX), ``encode_us`` (MLX turning them into
    device work), ``wait_us`` and ``host_us`` (build and encode: what a tail costs the host
    where a decode is the host's), each a tail's share of the chain. Empty for records made
    before the bench split its chains."""
    import pandas as pd

    rec = _record(rec)
    rows = []
    for t in _tails(rec):
        for name, v in t["variants"].items():
            if not all(k in v for k in CHAIN_SPLIT):
                continue
            build, encode, wait = (float(v[k]) for k in CHAIN_SPLIT)
            rows.append(
                {
                    "shape": t["label"],
                    "variant": name,
                    "build_us": build,
                    "encode_us": encode,
                    "wait_us": wait,
                    "host_us": build + encode,
                }
            )
    return pd.DataFrame(rows, columns=["shape", "variant", "build_us", "encode_us", "wait_us", "host_us"])


def build_profile_table(rec: Mapping) -> Any:
    """A ``pandas.DataFrame``, one row a decode variant and function, from a run with
    ``--host-profile``: ``variant``, ``function`` (``folder/file.py:line(name)``),
    ``calls_per_step``, ``own_us_per_step`` and ``cum_us_per_step`` (under Python's
    profiler, which slows every call alike: figures to compare variants by, not a step's
    time). Empty for a record made without it."""
    import pandas as pd

    rec = _record(rec)
    rows = [{"variant": name, **f} for name, d in rec["decode"].items() for f in d.get("build_profile", ())]
    return pd.DataFrame(rows, columns=["variant", "function", "calls_per_step", "own_us_per_step", "cum_us_per_step"])


def own_us_per_call(rec: Mapping, variant: str, where: str) -> float:
    """The host time a call of the profiled function at ``where`` (the start of a
    :func:`build_profile_table` ``function``, such as ``"kernels/one_launch.py"``) spends in
    itself, in us, in ``variant``'s decode step: its own time a step over its calls a step.
    ValueError unless exactly one function of that variant starts so."""
    table = build_profile_table(rec)
    hits = table[(table.variant == variant) & table.function.str.startswith(where)]
    if len(hits) != 1:
        raise ValueError(f"where: must name one profiled function of {variant!r}, got {len(hits)} matching {where!r}")
    return float(hits.own_us_per_step.iloc[0] / hits.calls_per_step.iloc[0])
