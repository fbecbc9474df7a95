"""What a ``python -m bench.schedule_run`` record says: its stages, the clock beside the
price model, and one stage of several runs side by side.

A record holds, stage by stage of the plan, the waits a token made against those
predicted and the ms a token (``stages``), the savings between stages measured against
those the price model predicts (``comparisons``) and, where measured, the price of a wait
by its kind (``splits``). These functions turn records into the notebooks' tables; each
refuses a dict that is not such a record with a ``ValueError`` naming what it lacks
(``records.RecordError`` where it is not a schedule_run record at all).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.decode.savings import check_rows, percentile_interval, resampled_medians
from workbench.reports.records import check as check_record
from workbench.reports.records import load_all
from workbench.validate import describe, integer, one_of, sequence
from workbench.waits import plan as waits


def _record(rec: Any, name: str = "rec") -> Mapping:
    """``rec`` if it is a schedule_run record (its stages and comparisons are keys every
    such record has), else ``records.RecordError`` naming ``name``."""
    return check_record(rec, "schedule_run", name=name)


def load_records(folder: str | os.PathLike | None = None) -> list[dict]:
    """The schedule records in ``folder`` (default the project's ``data/bench``), under both
    names they have had (``schedule_run-*.json``, the first ``schedule-*.json``), sorted by
    file name, each checked and with its ``file`` name added (``records.load_all``): a
    missing folder, or a file that is not such a record, is a ValueError naming it."""
    return load_all("schedule_run", folder)


def record_tables(rec: Mapping) -> tuple[Any, Any]:
    """A record as two ``pandas.DataFrame``s: its stages (waits predicted and made, ms a
    token) and its comparisons (predicted saving, measured, paired, ratios)."""
    import pandas as pd

    rec = _record(rec)
    check_rows(
        "rec['stages']",
        rec["stages"],
        ("stage", "waits_predicted", "waits_made", "waits_match", "ms_median", "ms_p10", "ms_p90", "tokens"),
    )
    stages = pd.DataFrame(rec["stages"])[
        ["stage", "waits_predicted", "waits_made", "waits_match", "ms_median", "ms_p10", "ms_p90", "tokens"]
    ]
    comps = pd.DataFrame(rec["comparisons"])
    cols = [
        c
        for c in (
            "from",
            "to",
            "waits_saved",
            "same_work",
            "ms_saved_predicted",
            "ms_saved_measured",
            "ratio",
            "ms_saved_paired",
            "ratio_paired",
        )
        if c in comps
    ]
    return stages, comps[cols]


def closeness(rec: Mapping) -> dict:
    """How close a record's clock came to the table, in two numbers.

    ``ratio_1_to_floor``: measured over predicted saving from stage 1 to the host floor
    (the largest saving that keeps the work the same; paired by round when the record
    has each token's time); ``median_ratio``: the median of that ratio over every pair
    of stages that does the same work. 1.0 is the table exactly; the goal is within 20%.
    """
    rec = _record(rec)
    check_rows(
        "rec['comparisons']", rec["comparisons"], ("from", "to", "ratio", "ms_saved_predicted", "ms_saved_measured")
    )
    plan = waits.load_plan()
    floor = next((s.number for s in plan.stages if s.floor and not s.attention_on_device), None)
    comps = [c for c in rec["comparisons"] if c.get("same_work", True)]

    def ratio(c: Mapping) -> float | None:
        return c.get("ratio_paired", c["ratio"])

    main = next((c for c in comps if c["from"] == 1 and c["to"] == floor), None)
    ratios = [r for r in (ratio(c) for c in comps) if r is not None]
    return {
        "ratio_1_to_floor": None if main is None else ratio(main),
        "ms_saved_predicted_1_to_floor": None if main is None else main["ms_saved_predicted"],
        "ms_saved_measured_1_to_floor": None
        if main is None
        else main.get("ms_saved_paired", main["ms_saved_measured"]),
        "median_ratio": float(np.median(ratios)) if ratios else None,
    }


# ---------------------------------------------------------------------------------------
# A kernels record as tables (notebook 05)


def covers_plan(rec: Mapping) -> bool:
    """Whether ``rec`` timed every stage of the plan (``bench.schedule_run --stages`` times
    some only: such a record has no stage-to-stage savings to weigh, no price to fit)."""
    numbers = {s.number for s in waits.load_plan().stages}
    return numbers <= {int(r["stage"]) for r in check_rows("rec['stages']", _record(rec)["stages"], ("stage",))}


def kernel_records(records: Sequence[Mapping]) -> list[Mapping]:
    """The records of ``records`` whose step ran on the project's kernels and was checked."""
    records = sequence("records", records, what="schedule records (load_records())", non_empty=False)
    return [
        r
        for i, r in enumerate(records)
        if _record(r, f"records[{i}]").get("matvec") == "kernels" and r.get("check") is not None
    ]


def clock_table(rec: Mapping):
    """A record's stages against its floor: ms a token (median), the floor (weight bytes a
    token / the copy bandwidth of the same run), their ratio, what the price model says
    the waits cost and that cost's share of the token, and the time inside ``mx.eval``
    against the host's (graph building, attention, reads), and, in a record profiled at
    every stage, the kernels' own time a token (``kernel_ms``; None otherwise). A
    ``pandas.DataFrame``."""
    import pandas as pd

    if "floor_ms" not in _record(rec):
        raise ValueError(f"rec: must be a schedule record with a floor (bench.schedule_run's own), got {describe(rec)}")
    rows = check_rows("rec['stages']", rec["stages"], ("stage", "waits_predicted", "ms_median"))
    df = pd.DataFrame(
        [
            {
                "stage": r["stage"],
                "waits": r["waits_predicted"],
                "ms": r["ms_median"],
                "floor_ms": rec["floor_ms"],
                "x_floor": r["ms_median"] / rec["floor_ms"],
                "waits_ms_model": r.get("ms_waits_model"),
                "wait_share": r.get("wait_share_model"),
                "in_eval_ms": r.get("ms_eval_median"),
                "host_ms": r.get("ms_host_median"),
                "kernel_ms": r.get("device_ms_per_token"),
            }
            for r in rows
        ]
    )
    return df


def split_prices_across(recs: Sequence[Mapping]):
    """The split prices by kind (ms, the median of each run's rounds) of several records side by
    side: one column a record (its file name), one row a kind. How far the price model's inputs
    move from run to run. A ``pandas.DataFrame``."""
    import pandas as pd

    if isinstance(recs, Mapping) or not isinstance(recs, Sequence) or not recs:
        raise ValueError(f"recs: must be a non-empty list of schedule records, got {describe(recs)}")
    cols = {}
    for i, rec in enumerate(recs):
        if not _record(rec, f"recs[{i}]").get("splits"):
            raise ValueError(f"recs[{i}]: has no split prices ('splits'), got {describe(rec)}")
        rows = check_rows(f"recs[{i}]['splits']", rec["splits"], ("split", "ms"))
        cols[rec.get("file", f"recs[{i}]")] = {r["split"]: r["ms"] for r in rows}
    return pd.DataFrame(cols)


def stage_comparison(runs: Mapping[str, Mapping], stage: int = 6):
    """One stage of several schedule records side by side, one row a record (``runs``:
    label -> record, e.g. the same command with and without ``--gdn kernel``): ms a token,
    its ratio to the floor, the time inside ``mx.eval`` and on the host, the worst scaled
    error of the record's check against its reference step, whether the check passed
    and every stage made its predicted waits, and the record's ``overlap`` (layers a
    submission hands to the device at a time without waiting; 0 in records before the
    option). A ``pandas.DataFrame``; ``ValueError`` for a record without that stage."""
    import pandas as pd

    if not isinstance(runs, Mapping) or not runs:
        raise ValueError(f"runs: must be a non-empty mapping of label -> schedule record, got {describe(runs)}")
    stage = integer("stage", stage, minimum=1)
    rows = []
    for label, rec in runs.items():
        _record(rec, f"runs[{label!r}]")
        clock = clock_table(rec).set_index("stage")
        if stage not in clock.index:
            raise ValueError(f"runs[{label!r}]: has no stage {stage} (its stages: {list(clock.index)})")
        s = clock.loc[stage]
        checks = rec.get("check", {}).get("stages", [])
        rows.append(
            {
                "run": label,
                f"stage {stage} ms": s["ms"],
                "x floor": s["x_floor"],
                "in eval ms": s["in_eval_ms"],
                "host ms": s["host_ms"],
                "check": max((c["worst_scaled_error"] for c in checks), default=float("nan")),
                "passed": bool(rec.get("check", {}).get("passed")) and bool(rec.get("all_waits_match")),
                "overlap": int(rec.get("overlap", 0)),
            }
        )
    return pd.DataFrame(rows)


#: The prefix MLX gives a custom kernel's name (``custom_kernel_<name>_<template values>``).
_CUSTOM_KERNEL = "mlx::core::cu::custom_kernel_"


def device_profile_table(rec: Mapping, top: int = 6):
    """What the device ran a token at the profiled stage of a ``--profile`` record: the
    ``top`` kernels by device time (``kernel``: the name without its arguments, a custom
    kernel's without MLX's prefix; ``launches``, ``ms`` a token), and in ``summary`` the
    stage, kernels a token, their device time and its ratio to the record's floor (what the
    clock's ``x_floor`` would be with no host time at all). A ``(pandas.DataFrame, dict)``;
    ``ValueError`` for a record made without ``--profile``."""
    import pandas as pd

    prof = _record(rec).get("device_profile")
    if not isinstance(prof, Mapping):
        raise ValueError(f"rec: has no device profile (bench.schedule_run --profile makes one), got {describe(prof)}")
    top = integer("top", top, minimum=1)
    rows = [
        {
            "kernel": k["name"].split("(")[0].removeprefix(_CUSTOM_KERNEL),
            "launches": k["per_step"],
            "ms": k["us_per_step"] / 1e3,
        }
        for k in prof["top_kernels"][:top]
    ]
    device_ms = prof["device_us_per_step"] / 1e3
    summary = {
        "stage": int(prof["stage"]),
        "kernels": prof["kernels_per_step"],
        "device_ms": device_ms,
        "floor_ms": rec["floor_ms"],
        "device_x_floor": device_ms / rec["floor_ms"],
    }
    return pd.DataFrame(rows), summary


def _settles(lo: float | None, hi: float | None, band: Sequence[float] | None) -> bool | None:
    """Whether the interval [lo, hi] settles a verdict against ``band`` (low, high): wholly
    inside it or wholly outside it, so more tokens would not change the verdict. None when
    either is missing."""
    if lo is None or hi is None or band is None:
        return None
    return (band[0] <= lo and hi <= band[1]) or hi < band[0] or lo > band[1]


def pair_table(rec: Mapping, *, within: float = 0.2):
    """A record's stage pairs: waits saved, the saving the flat tiny price predicts, the
    price model's, the measured one (paired by round when the record has it) with its 95%
    interval (:func:`paired_interval`), the two ratios, whether the model's is within
    ``within`` (20%), and whether the interval settles that (``noise_decided``: wholly
    inside the band or wholly outside it; False means more tokens are needed to say).

    A record profiled at every stage (``bench.schedule_run --profile``) also splits each
    measured saving in two: ``device_saved_ms``, the change in the kernels' own time a
    token (the model assumes none: every stage runs the same kernels), and
    ``idle_saved_ms``, the rest, the device's idle time the removed waits took with them:
    what the price model prices. ``ratio_model_idle``, ``idle_within`` and
    ``idle_noise_decided`` judge the model on that part; the interval is the measured one
    shifted by the device change (a profile of a few tokens, taken as exact). Without the
    profiles these columns are None.

    The model's saving is a sum of split prices, each a median of a few dozen rounds, so it
    has an interval too (``model_lo_ms``, ``model_hi_ms``; a record that kept the split
    rounds). ``ratio_lo`` / ``ratio_hi`` bound the measured over the model's saving by both
    intervals, and ``both_decided`` says whether that range is wholly inside the band or
    wholly outside it: the verdict neither the clock's noise nor the model's can move.

    A record with in-token prices (``bench.schedule_run --in-token-share N``) also carries
    the model with those prices in place of the split prices where it has them
    (``in_token_model_ms``), its ratio (``ratio_in_token``) and whether that is within
    ``within`` (``in_token_within``); None otherwise."""
    import pandas as pd

    rec = _record(rec)
    comps = check_rows(
        "rec['comparisons']",
        rec["comparisons"],
        ("from", "to", "waits_saved", "ms_saved_predicted", "ms_saved_measured", "same_work"),
    )
    each = {r.get("stage"): r.get("ms_each") for r in rec.get("stages", [])}
    device = {r.get("stage"): r.get("device_ms_per_token") for r in rec.get("stages", [])}
    out = []
    for c in comps:
        measured = c.get("ms_saved_paired", c["ms_saved_measured"])
        model = c.get("ms_saved_model")
        ratio = measured / model if model else None
        lo, hi = paired_interval(each.get(c["from"]), each.get(c["to"]))
        # the measured interval against the band around the model's saving
        band = sorted((model * (1 - within), model * (1 + within))) if model else None
        decided = _settles(lo, hi, band)
        da, db = device.get(c["from"]), device.get(c["to"])
        dev_saved = da - db if da is not None and db is not None else None
        idle = idle_ratio = idle_decided = None
        if dev_saved is not None:
            idle = measured - dev_saved
            idle_ratio = idle / model if model else None
            idle_decided = _settles(
                None if lo is None else lo - dev_saved, None if hi is None else hi - dev_saved, band
            )
        mlo, mhi = c.get("ms_saved_model_lo"), c.get("ms_saved_model_hi")
        rlo = rhi = both = None
        if lo is not None and mlo is not None and mlo > 0:
            rlo, rhi = lo / mhi, hi / mlo
            both = _settles(rlo, rhi, (1 - within, 1 + within))
        in_token = c.get("ms_saved_model_in_token")
        ratio_in_token = measured / in_token if in_token else None
        out.append(
            {
                "from": c["from"],
                "to": c["to"],
                "waits_saved": c["waits_saved"],
                "same_work": c["same_work"],
                "tiny_ms": c["ms_saved_predicted"],
                "model_ms": model,
                "measured_ms": measured,
                "measured_lo_ms": lo,
                "measured_hi_ms": hi,
                "ratio_tiny": measured / c["ms_saved_predicted"] if c["ms_saved_predicted"] else None,
                "ratio_model": ratio,
                "model_within": None if ratio is None else abs(ratio - 1) <= within,
                "noise_decided": decided,
                "device_saved_ms": dev_saved,
                "idle_saved_ms": idle,
                "ratio_model_idle": idle_ratio,
                "idle_within": None if idle_ratio is None else abs(idle_ratio - 1) <= within,
                "idle_noise_decided": idle_decided,
                "model_lo_ms": mlo,
                "model_hi_ms": mhi,
                "ratio_lo": rlo,
                "ratio_hi": rhi,
                "both_decided": both,
                "in_token_model_ms": in_token,
                "ratio_in_token": ratio_in_token,
                "in_token_within": None if ratio_in_token is None else abs(ratio_in_token - 1) <= within,
            }
        )
    return pd.DataFrame(out)


def pair_verdicts(rec: Mapping, *, within: float = 0.2, saving: str = "clock") -> dict[str, Any]:
    """The adjacent same-work stage pairs of :func:`pair_table` in a few numbers: how many
    there are (``pairs``), how many the interval settles (``settled``), how many of those
    are within ``within`` of the price model (``settled_within``), and the measured over the
    model's saving among the settled ones (``settled_ratio_min``, ``settled_ratio_max``;
    None when none is settled). ``saving``: ``"clock"`` judges the whole measured saving,
    ``"idle"`` the part left after the kernels' own change (a record profiled at every
    stage; ValueError without it)."""
    one_of("saving", saving, ("clock", "idle"))
    t = pair_table(rec, within=within)
    adjacent = t[t["same_work"] & (t["to"] == t["from"] + 1)]
    ratio_col, within_col, decided_col = (
        ("ratio_model", "model_within", "noise_decided")
        if saving == "clock"
        else ("ratio_model_idle", "idle_within", "idle_noise_decided")
    )
    if saving == "idle" and adjacent["idle_saved_ms"].isna().any():
        raise ValueError(
            "saving: 'idle' needs a record profiled at every stage (bench.schedule_run --profile, "
            "device_ms_per_token in each stage's row); this one is not"
        )
    settled = adjacent[adjacent[decided_col].fillna(False).astype(bool)]
    ratios = settled[ratio_col].astype(float)
    return {
        "pairs": len(adjacent),
        "settled": len(settled),
        "settled_within": int(settled[within_col].astype(bool).sum()),
        "settled_ratio_min": float(ratios.min()) if len(settled) else None,
        "settled_ratio_max": float(ratios.max()) if len(settled) else None,
    }


def paired_interval(
    a: Sequence[float] | None, b: Sequence[float] | None, level: float = 0.95
) -> tuple[float | None, float | None]:
    """A ``level`` interval for the paired saving ``median(a_i - b_i)`` of two stages'
    per-token times (token i of each ran in the same round), by the percentile bootstrap
    over the token pairs (``savings.resampled_medians``, seeded: the same interval every
    time the table is made): how far the measured saving could move with other tokens of
    the same run. ``(None, None)`` without per-token times of equal length (older records)."""
    if not a or not b or len(a) != len(b):
        return None, None
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return percentile_interval(resampled_medians(d), level)


def split_table(rec: Mapping):
    """A record's split prices by kind: the price (median split - joined) and its spread,
    the split and joined rounds, each side's device time and the device's idle time in
    each round (wall time less the two submissions' device time)."""
    import pandas as pd

    if not _record(rec).get("splits"):
        raise ValueError(f"rec: must be a schedule record with split prices ('splits'), got {describe(rec)}")
    rows = check_rows("rec['splits']", rec["splits"], ("split", "ms", "p10_ms", "p90_ms", "split_ms", "joined_ms"))
    return pd.DataFrame(
        [
            {
                "split": r["split"],
                "price_ms": r["ms"],
                "p10_ms": r["p10_ms"],
                "p90_ms": r["p90_ms"],
                "split_ms": r["split_ms"],
                "joined_ms": r["joined_ms"],
                # The first records did not time each side's device work.
                "device_first_ms": r.get("device_ms", {}).get("first"),
                "device_second_ms": r.get("device_ms", {}).get("second"),
                "idle_split_ms": r.get("split_idle_ms"),
                "idle_joined_ms": r.get("joined_idle_ms"),
            }
            for r in rows
        ]
    )


def in_token_table(rec: Mapping):
    """A record's waits priced inside the token beside their prices alone, one row a kind
    (``bench.schedule_run --in-token-share N``): ``alone_ms`` (the split price, two
    submissions alone), ``in_token_ms`` and its 95% interval (``lo_ms``, ``hi_ms``: the paired
    median of a stage's token less the same token with ``count`` of the kind's waits joined,
    over ``count``), the ``stage`` it was joined in and the ``count``. A kind's price moving
    between the two columns is what an additive price model cannot hold. A
    ``pandas.DataFrame`` indexed by kind; ``ValueError`` for a record without in-token prices."""
    import pandas as pd

    prices = _record(rec).get("in_token_prices")
    if not isinstance(prices, Mapping) or not prices:
        raise ValueError(
            f"rec: has no in-token prices (bench.schedule_run --in-token-share N makes them), got {describe(prices)}"
        )
    alone = {r["split"]: r["ms"] for r in check_rows("rec['splits']", rec.get("splits") or [], ("split", "ms"))}
    return pd.DataFrame(
        [
            {
                "kind": kind,
                "alone_ms": alone.get(kind),
                "in_token_ms": p["ms"],
                "lo_ms": p["lo_ms"],
                "hi_ms": p["hi_ms"],
                "stage": p["stage"],
                "count": p["count"],
            }
            for kind, p in prices.items()
        ]
    ).set_index("kind")
