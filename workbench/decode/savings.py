"""The savings a stage makes against the one before, measured and as the wait table predicts them.

A stage of the plan saves waits; the table predicts the time that saves as waits saved x
one price (the tiny round trip), the price model of ``workbench.waits.plan`` as each removed
wait priced by its kind (``waits.model_saving``, from prices measured between the step's own
submissions). :func:`compare_savings` sets both beside the clock's saving for each pair of
stages, :func:`fit_price` the price a least-squares line through (waits, ms a token) implies,
and :func:`check_rows` names what a record from an older or foreign run lacks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.validate import describe, integer, number
from workbench.waits import plan as waits

#: The split kinds the plan's consecutive stage pairs remove from Bonsai's token (``waits.model_saving``;
#: checked in tests/test_schedule.py): the kinds the price model needs a measured price for, and those the
#: split timing (``bench/common/decode_timing.py``) builds from the step's pieces. All but ``"qkv>host|wo"``
#: are removed by same-work pairs; that one only by 5 -> 6, which also moves the attention to the device.
MEASURED_SPLITS: tuple[str, ...] = (
    "wo>host|ffn",
    "ffn>host|layer",
    "ffn>host|logits",
    "layer|qkv",
    "ffn|layer",
    "ffn|logits",
    "layer|layer",
    "qkv>host|wo",
)


def check_rows(name: str, rows: Any, keys: Sequence[str]) -> list[Mapping]:
    """``rows`` as a non-empty list of mappings that each hold ``keys``, or a ValueError
    naming ``name``, the row and the missing keys (a record from an older or foreign run)."""
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence) or not rows:
        raise ValueError(f"{name}: must be a non-empty list of rows, got {describe(rows)}")
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping):
            raise ValueError(f"{name}[{i}]: must be a mapping, got {describe(r)}")
        missing = [k for k in keys if k not in r]
        if missing:
            raise ValueError(f"{name}[{i}]: lacks {missing}")
    return list(rows)


#: Resamples of the percentile bootstraps below (a median's interval, a sum of medians'), and
#: their seed: an interval is the same every time it is computed from the same numbers.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def resampled_medians(d: Any, rng: np.random.Generator | None = None) -> np.ndarray:
    """:data:`BOOTSTRAP_RESAMPLES` medians of ``d`` resampled with replacement (a fresh
    seeded generator unless ``rng`` is given): what every interval here is read from."""
    d = np.asarray(d, dtype=np.float64)
    rng = np.random.default_rng(BOOTSTRAP_SEED) if rng is None else rng
    return np.median(d[rng.integers(0, d.size, size=(BOOTSTRAP_RESAMPLES, d.size))], axis=1)


def percentile_interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` share of ``samples``: the percentile bootstrap's interval."""
    tail = (1 - level) / 2 * 100
    return float(np.percentile(samples, tail)), float(np.percentile(samples, 100 - tail))


def model_interval(
    counts: Mapping[str, int],
    split_rounds: Mapping[str, Sequence[float]],
    *,
    fixed_ms: float = 0.0,
    level: float = 0.95,
) -> tuple[float, float] | None:
    """A ``level`` interval for a price-model saving ``fixed_ms + sum(counts[k] * price[k])``,
    each kind's price the median of its measured rounds (``split_rounds[k]``: every round's
    split - joined, ``measure_split_between``'s ``diffs_ms``): the percentile bootstrap, each
    kind's rounds resampled on their own. None when a kind in ``counts`` has no rounds (a
    record from before the rounds were kept). ``counts``: waits removed (positive) or added
    (negative) of each kind; ``fixed_ms``: the part priced at a flat price."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    total = np.full(BOOTSTRAP_RESAMPLES, float(fixed_ms))
    for kind, count in counts.items():
        rounds = split_rounds.get(kind)
        if not rounds:
            return None
        total += count * resampled_medians(rounds, rng)
    return percentile_interval(total, level)


def in_token_prices(
    stage_rows: Sequence[Mapping],
    probe_rows: Sequence[Mapping],
    joined: Mapping[str, tuple[str, int]],
    *,
    level: float = 0.95,
) -> dict[str, dict]:
    """The price of a wait of each kind inside a token, from probes timed beside the stages.

    A probe (``run_stages``' ``probes``) decodes the tokens of one stage with ``count`` of
    its waits of ``kind`` joined (``joined[probe name] = (kind, count)``); token i of the
    probe and token i of its stage ran in the same round, so the paired median of
    ``(stage - probe) / count`` is that kind's price where the token pays it, with the
    host's work and the device's overlap around it as they are. Returns, a kind: ``ms``,
    ``lo_ms`` / ``hi_ms`` (a ``level`` bootstrap interval over the token pairs), ``stage``,
    ``count`` and ``tokens``. ValueError naming a probe whose stage was not timed or whose
    tokens do not pair with the stage's.
    """
    by_stage = {r["stage"]: r for r in check_rows("stage_rows", stage_rows, ("stage", "ms_each"))}
    by_name = {r["name"]: r for r in check_rows("probe_rows", probe_rows, ("name", "stage", "ms_each"))}
    out: dict[str, dict] = {}
    for name, (kind, count) in joined.items():
        if name not in by_name:
            raise ValueError(f"joined: probe {name!r} is not among the probes timed ({sorted(by_name)})")
        probe = by_name[name]
        base = by_stage.get(probe["stage"])
        if base is None:
            raise ValueError(f"probe_rows[{name!r}]: its stage {probe['stage']} was not timed")
        a, b = np.asarray(base["ms_each"], dtype=np.float64), np.asarray(probe["ms_each"], dtype=np.float64)
        if a.size != b.size or a.size == 0:
            raise ValueError(
                f"probe_rows[{name!r}]: {b.size} tokens do not pair with stage {probe['stage']}'s {a.size}"
            )
        d = (a - b) / integer("count", count, minimum=1)
        lo, hi = percentile_interval(resampled_medians(d), level)
        out[kind] = {
            "ms": float(np.median(d)),
            "lo_ms": lo,
            "hi_ms": hi,
            "stage": int(probe["stage"]),
            "count": int(count),
            "tokens": int(d.size),
        }
    return out


def compare_savings(
    rows: Sequence[Mapping],
    price_ms: float,
    *,
    split_prices: Mapping[str, float] | None = None,
    cfg=None,
    eligible: Sequence[int] | None = None,
    split_rounds: Mapping[str, Sequence[float]] | None = None,
) -> list[dict]:
    """Measured against predicted savings: each stage against the one before, and against stage 1.

    ``same_work`` is False for a pair of which one stage runs the attention on the device
    (the device floor) and the other on the host: there the arithmetic differs as well as
    the waits, so the pair does not test the table.

    With ``split_prices`` (and ``cfg``, the model decoded) each pair also carries the price
    model's prediction (``waits.model_saving``): ``ms_saved_model``, ``model_priced``
    (every split kind the pair removes has a measured price), ``ratio_model`` and, when
    paired times exist, ``ratio_model_paired``. With ``split_rounds`` (each kind's measured
    rounds) also ``ms_saved_model_lo`` / ``ms_saved_model_hi``: the model's own 95% interval
    (:func:`model_interval`), which a check of the model against the clock needs beside the
    clock's.
    """
    rows = check_rows("rows", rows, ("stage", "waits_predicted", "ms_median"))
    price_ms = number("price_ms", price_ms, minimum=0, exclusive_minimum=True)
    by = {r["stage"]: r for r in rows}
    nums = sorted(by)
    plan = waits.load_plan()
    device_attention = {s.number for s in plan.stages if s.attention_on_device}
    pairs = [(a, b) for a, b in zip(nums, nums[1:])] + [(nums[0], b) for b in nums[2:]]
    out = []
    for a, b in pairs:
        saved = by[a]["waits_predicted"] - by[b]["waits_predicted"]
        measured = by[a]["ms_median"] - by[b]["ms_median"]
        predicted = saved * price_ms
        row = {
            "from": a,
            "to": b,
            "waits_saved": saved,
            "ms_saved_measured": measured,
            "ms_saved_predicted": predicted,
            "ratio": measured / predicted if predicted else None,
            # False where one side runs the attention on the device and the other on the
            # host: then more than the waits differ, and the ratio is not the table's check.
            "same_work": (a in device_attention) == (b in device_attention),
        }
        ea, eb = by[a].get("ms_each"), by[b].get("ms_each")
        if ea and eb and len(ea) == len(eb):
            # Token i of stage a and token i of stage b ran in the same round, close in
            # time: the median of their differences cancels slow drift in a shared load.
            paired = float(np.median(np.asarray(ea) - np.asarray(eb)))
            row["ms_saved_paired"] = paired
            row["ratio_paired"] = paired / predicted if predicted else None
        if split_prices is not None:
            if cfg is None:
                raise ValueError("cfg: the price model needs the model decoded (cfg) beside split_prices")
            m = waits.model_saving(cfg, a, b, split_prices, price_ms, plan=plan, eligible=eligible)
            row["ms_saved_model"] = m["ms"]
            row["model_priced"] = m["priced"]
            if split_rounds is not None and m["priced"]:
                counts = {**m["removed"], **{k: -c for k, c in m["added"].items()}}
                iv = model_interval(counts, split_rounds)
                if iv is not None:
                    row["ms_saved_model_lo"], row["ms_saved_model_hi"] = iv
            row["ratio_model"] = measured / m["ms"] if m["ms"] else None
            if "ms_saved_paired" in row:
                row["ratio_model_paired"] = row["ms_saved_paired"] / m["ms"] if m["ms"] else None
        out.append(row)
    return out


def fit_price(rows: Sequence[Mapping]) -> dict:
    """The price of a wait the clock implies: a least-squares line through (waits, ms a token).

    Every stage computes the same arithmetic, so ``ms = intercept + waits x price`` if a
    wait costs the same wherever it falls; the slope is that price, fitted from all the
    stages at once (steadier than any one difference on a noisy machine).
    """
    rows = check_rows("rows", rows, ("waits_predicted", "ms_median"))
    w = np.array([r["waits_predicted"] for r in rows], dtype=float)
    t = np.array([r["ms_median"] for r in rows], dtype=float)
    if len(set(w.tolist())) < 2:
        raise ValueError("rows: need stages with at least two different wait counts to fit a price")
    slope, intercept = np.polyfit(w, t, 1)
    return {"ms_per_wait": float(slope), "intercept_ms": float(intercept)}
