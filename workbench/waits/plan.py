"""The resident-state plan: what a decoded token waits for, stage by stage, and its price.

A *wait* is one GPU submission whose result the host waits for. frink-models' fused attention
tail saves one a token for every attention layer it fuses (its own price of a wait is the
ledger's ``seed`` entry); the plan it cites (``gdn-resident-state``, reconstructed in
``data/plans/gdn-resident-state.json``) carries those savings down to a floor. Here:
:func:`load_plan` reads the stages (what each changes, its grouping rules, the submissions each
kind of layer costs under them), checked field by field (:func:`parse_plan`), afresh each call;
:func:`submissions` groups the GPU pieces of one token of a ``ModelConfig`` the way a stage does
and :func:`waits_per_token` counts the groups (``workbench.decode.schedule`` executes the same
grouping, so the count and the clock check one thing); :func:`split_kinds` names each wait by the
submissions on either side and :func:`priced_waits` prices it by that kind; :func:`wait_table`
prices every stage from the ledger (``workbench.waits.ledger``, ``data/ledger/wait_prices.json``).
Which attention layers fuse is decided ONLY by ``workbench.models.refusals.eligible``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench import files
from workbench.models.config import ModelConfig
from workbench.models.loader import list_models
from workbench.models.refusals import format_reason_counts, layer_refusals, reason_counts
from workbench.validate import describe, flag, integer, number
from workbench.waits.ledger import ledger_entries, ledger_price
from workbench.waits.schema import (
    FINAL_SPLIT,
    HOST_READ,
    check_split_kind,
    read_json,
    strict_object,
    text,
    texts,
    where,
)

PLAN_PATH = files.DATA_DIR / "plans" / "gdn-resident-state.json"

#: The ledger entry priced when no price is asked for: frink-models' own figure.
SEED_PRICE_ID = "seed-metal"

#: The GPU pieces of one token. ``layer``: a whole non-attention layer (its FFN included);
#: ``qkv``/``wo``/``ffn``: an attention layer's three pieces; ``tail``: wo + FFN fused;
#: ``attention``: the softmax itself, a piece only when attention runs on the device;
#: ``logits``: final norm and LM head.
PIECE_KINDS = ("layer", "qkv", "attention", "wo", "ffn", "tail", "logits")

_RULES = ("fuse_tail", "qkv_into_previous", "tail_into_next", "resident_runs", "attention_on_device")
_COST_KINDS = ("non_attention", "attention", "attention_refused", "logits")


@dataclass(frozen=True)
class Stage:
    """One row of the plan: what it changes and how it groups a token's GPU pieces."""

    number: int
    key: str
    name: str
    changes: str
    fuse_tail: bool
    qkv_into_previous: bool
    tail_into_next: bool
    resident_runs: bool
    attention_on_device: bool
    #: Submissions each kind of layer costs under this stage, as the plan states the rule
    #: (for an attention layer with an FFN and recurrent neighbours); :func:`submissions`
    #: is the executable form and agrees with it on every such pattern (tested).
    costs: Mapping[str, int]
    floor: bool = False


@dataclass(frozen=True)
class Plan:
    name: str
    title: str
    source: str
    assumptions: tuple[str, ...]
    stages: tuple[Stage, ...]

    def stage(self, which: int | str | Stage) -> Stage:
        """A stage by number (1-based), key or itself."""
        if isinstance(which, Stage):
            return which
        if isinstance(which, (bool, np.bool_)):
            raise ValueError(f"stage: must be a stage number or key, got {which!r}")
        for s in self.stages:
            if which == s.number or which == s.key:
                return s
        allowed = [s.number for s in self.stages] + [s.key for s in self.stages]
        raise ValueError(f"stage: {which!r} is not a stage of plan {self.name!r}; allowed: {allowed}")


@dataclass(frozen=True)
class Piece:
    """One GPU piece of a token: ``kind`` (see PIECE_KINDS) of layer ``layer``."""

    kind: str
    layer: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in PIECE_KINDS:
            raise ValueError(f"kind: must be one of {PIECE_KINDS}, got {self.kind!r}")
        if (self.layer is None) != (self.kind == "logits"):
            raise ValueError(f"layer: the logits have none, every other piece has one; got {self.kind}, {self.layer!r}")

    def __str__(self) -> str:
        return self.kind if self.layer is None else f"{self.kind}{self.layer}"


# ---------------------------------------------------------------------------------------
# The plan's file, read strictly (``workbench.waits.schema``): a typo is an error, not a number


_PLAN_KEYS = ("name", "title", "source", "assumptions", "stages")
_STAGE_KEYS = ("stage", "key", "name", "changes", "rules", "costs")


def parse_plan(raw: Any, source: str = "plan") -> Plan:
    """A :class:`Plan` from the plan's parsed JSON, checked field by field.

    Refused, with a ValueError naming ``source``, the stage and the field: a missing or
    unknown key (top level, stage, rules, costs), a rule that is not a JSON bool (the
    string ``"false"`` is not false), a cost that is not an integer >= 0, stage numbers
    other than 1, 2, ... in order, and a repeated key.
    """
    top = strict_object(source, raw, _PLAN_KEYS)
    stages_raw = top["stages"]
    if not isinstance(stages_raw, list) or not stages_raw:
        raise ValueError(f"{where(source, 'stages')}: must be a non-empty list of stages, got {describe(stages_raw)}")
    stages: list[Stage] = []
    seen_keys: dict[str, int] = {}
    for i, s in enumerate(stages_raw):
        label = f"stages[{i}]"
        if isinstance(s, Mapping) and isinstance(s.get("key"), str):
            label += f" ({s['key']!r})"
        here = where(source, label)
        strict_object(here, s, _STAGE_KEYS, ("floor",))
        number = integer(f"{here}: stage", s["stage"], minimum=1)
        if number != i + 1:
            raise ValueError(
                f"{here}: stage: stages must be numbered 1, 2, ... in order; got {number} at position {i + 1}"
            )
        key = text(f"{here}: key", s["key"])
        if key in seen_keys:
            raise ValueError(f"{here}: key: {key!r} is already the key of stage {seen_keys[key]}; keys must be unique")
        seen_keys[key] = number
        rules = strict_object(f"{here}: rules", s["rules"], _RULES)
        costs = strict_object(f"{here}: costs", s["costs"], _COST_KINDS)
        stages.append(
            Stage(
                number=number,
                key=key,
                name=text(f"{here}: name", s["name"]),
                changes=text(f"{here}: changes", s["changes"]),
                costs={c: integer(f"{here}: costs: {c}", costs[c], minimum=0) for c in _COST_KINDS},
                floor=flag(f"{here}: floor", s.get("floor", False)),
                **{r: flag(f"{here}: rules: {r}", rules[r]) for r in _RULES},
            )
        )
    return Plan(
        text(where(source, "name"), top["name"]),
        text(where(source, "title"), top["title"]),
        text(where(source, "source"), top["source"]),
        texts(where(source, "assumptions"), top["assumptions"]),
        tuple(stages),
    )


def load_plan(path: str | Path | None = None) -> Plan:
    """Read the plan's stages from JSON (default ``data/plans/gdn-resident-state.json``).

    Checked by :func:`parse_plan`; errors name the file. Read afresh on every call (it
    takes well under a millisecond), so an edited file is never answered from a stale
    copy, and every caller gets its own :class:`Plan`.
    """
    if path is not None and not isinstance(path, (str, Path)):
        raise ValueError(f"path: must be None or a plan file's path, got {describe(path)}")
    p = Path(path) if path is not None else PLAN_PATH
    return parse_plan(read_json(p, "plan"), str(p))


def as_plan(plan: Any) -> Plan:
    """``plan`` itself, or the default plan for None; anything else is a ValueError."""
    if plan is None:
        return load_plan()
    if not isinstance(plan, Plan):
        raise ValueError(f"plan: must be None or a Plan (from load_plan), got {describe(plan)}")
    return plan


def _stage(stage: int | str | Stage, plan: Plan | None) -> Stage:
    return as_plan(plan).stage(stage)


def _attention_indices(cfg) -> set[int]:
    """The attention layers' indices of ``cfg``, checked to be a ``ModelConfig`` first: every
    public call that takes a config reads this before anything else of it, so a model's name
    or any other object is refused here by name, not by an AttributeError deep inside."""
    if not isinstance(cfg, ModelConfig):
        hint = (
            f" (a shipped model's name: load_model({cfg!r}))" if isinstance(cfg, str) and cfg in list_models() else ""
        )
        raise ValueError(f"cfg: must be a ModelConfig (e.g. load_model('bonsai-27b')), got {describe(cfg)}{hint}")
    # attention_layers() may hand back indices or LayerConfigs; accept both.
    return {a if isinstance(a, int) else a.index for a in cfg.attention_layers()}


def _has_ffn(cfg, li: int) -> bool:
    return int(getattr(cfg.layer(li), "ffn_dim", 0) or 0) > 0


def eligible_layers(cfg, *, kernels_enabled: bool = True) -> tuple[int, ...]:
    """The attention layers whose tail fuses, by ``workbench.models.refusals`` alone."""
    return tuple(
        sorted(li for li in _attention_indices(cfg) if not layer_refusals(cfg, li, kernels_enabled=kernels_enabled))
    )


def submissions(
    cfg,
    stage: int | str | Stage,
    *,
    plan: Plan | None = None,
    eligible: Iterable[int] | None = None,
) -> list[tuple[Piece, ...]]:
    """The GPU submissions of one decoded token under ``stage``, in order.

    Each tuple is one submission, ended by one wait. ``eligible`` (attention layers whose
    tail fuses) defaults to :func:`eligible_layers`. The grouping, per the stage's rules:

    - ``fuse_tail``: an eligible layer's wo and FFN are one ``tail`` piece;
    - ``qkv_into_previous``: an eligible layer's QKV joins the submission before it when
      that one ends with a non-attention layer;
    - ``tail_into_next``: an eligible layer's tail starts the next submission when that
      one starts with a non-attention layer or the logits, else it stands alone;
    - ``resident_runs`` (the floor): a submission ends only where the host needs data:
      every QKV (refused or not), a refused layer's wo and FFN, and the logits;
    - ``attention_on_device``: nothing needs the host before the logits: one submission.
    """
    st = _stage(stage, plan)
    attn = _attention_indices(cfg)
    if eligible is None:
        ok = set(eligible_layers(cfg))
    elif isinstance(eligible, (str, bytes)) or not isinstance(eligible, Iterable):
        raise ValueError(f"eligible: must be layer indices (integers), got {describe(eligible)}")
    else:
        ok = {integer("eligible[]", li, minimum=0) for li in eligible}
    bad = ok - attn
    if bad:
        raise ValueError(f"eligible: layers {sorted(bad)} are not attention layers of {cfg.name}")

    # The token's pieces in order, each marked with whether the host needs its result.
    pieces: list[tuple[Piece, bool]] = []
    for layer in cfg.layers:
        li = layer.index
        if li not in attn:
            pieces.append((Piece("layer", li), False))
            continue
        fused = st.fuse_tail and li in ok and _has_ffn(cfg, li)
        pieces.append((Piece("qkv", li), not st.attention_on_device))
        if st.attention_on_device:
            pieces.append((Piece("attention", li), False))
        if fused:
            pieces.append((Piece("tail", li), False))
        else:
            # Unfused or refused: the host takes wo's result (and the FFN's) back.
            refused_need = not st.attention_on_device
            pieces.append((Piece("wo", li), refused_need))
            if _has_ffn(cfg, li):
                pieces.append((Piece("ffn", li), refused_need))
    pieces.append((Piece("logits"), True))

    if st.resident_runs:
        out: list[tuple[Piece, ...]] = []
        cur: list[Piece] = []
        for piece, needed in pieces:
            cur.append(piece)
            if needed:
                out.append(tuple(cur))
                cur = []
        assert not cur, "the logits end every token"
        return out

    out = []
    pending_tail: Piece | None = None  # a tail waiting for the head of the next submission
    for piece, _ in pieces:
        if pending_tail is not None:
            if piece.kind in ("layer", "logits"):
                out.append((pending_tail, piece))
                pending_tail = None
                continue
            out.append((pending_tail,))
            pending_tail = None
        if piece.kind == "qkv" and st.qkv_into_previous and piece.layer in ok and out and out[-1][-1].kind == "layer":
            out[-1] = out[-1] + (piece,)
        elif piece.kind == "tail" and st.tail_into_next:
            pending_tail = piece
        else:
            out.append((piece,))
    assert pending_tail is None, "the logits follow every tail"
    return out


def waits_per_token(cfg, stage: int | str | Stage, *, plan: Plan | None = None, eligible=None) -> int:
    """Waits one decoded token of ``cfg`` costs under ``stage`` (the logits' one included)."""
    return len(submissions(cfg, stage, plan=plan, eligible=eligible))


# A fused tail ends with the FFN's launch and starts with wo's; the host reads back what
# an unfused tail's wo and FFN and a layer's Q/K/V make (the split kinds' words: workbench.waits.schema).
_SPLIT_ENDS = {"tail": "ffn", "wo": "wo" + HOST_READ, "ffn": "ffn" + HOST_READ, "qkv": "qkv" + HOST_READ}
_SPLIT_STARTS = {"tail": "wo"}


def split_kind(before: Piece, after: Piece) -> str:
    """The kind of the wait between a submission ending with ``before`` and one starting
    with ``after``: ``"<end>|<start>"``. A fused tail counts as ``ffn`` at its end and
    ``wo`` at its start (its last and first launches); an end the host reads back is
    marked ``>host`` (an unfused tail's wo and FFN, whose x the host takes back, and
    Q/K/V, which the host attends with). E.g. ``"layer|layer"``, ``"wo>host|ffn"`` (the
    unfused tail's own wait), ``"ffn>host|layer"`` (its second), ``"ffn|layer"`` (after a
    fused tail), ``"qkv>host|wo"`` (the host attends between)."""
    return f"{_SPLIT_ENDS.get(before.kind, before.kind)}|{_SPLIT_STARTS.get(after.kind, after.kind)}"


def split_kinds(cfg, stage: int | str | Stage, *, plan: Plan | None = None, eligible=None) -> dict[str, int]:
    """How many waits of each kind (:func:`split_kind`) one token makes under ``stage``;
    the counts sum to :func:`waits_per_token` (the last wait is :data:`FINAL_SPLIT`)."""
    subs = submissions(cfg, stage, plan=plan, eligible=eligible)
    out: dict[str, int] = {}
    for a, b in zip(subs, subs[1:]):
        k = split_kind(a[-1], b[0])
        out[k] = out.get(k, 0) + 1
    out[FINAL_SPLIT] = 1
    return out


def join_splits(subs: Sequence[tuple[Piece, ...]], kind: str, count: int) -> list[tuple[Piece, ...]]:
    """``subs`` (a token's submissions, :func:`submissions`) with ``count`` of its waits of
    ``kind`` (:func:`split_kind`) removed: at each, the two submissions become one.

    The joined splits are spread evenly over the token's splits of that kind, so a token
    with a share of them joined samples the whole token (its early and late layers alike).
    What it is for: pricing a kind of wait inside the token (the token against itself with
    a few of those waits gone) rather than between two submissions alone. A wait after
    Q/K/V the host reads for its attention (``qkv>host|...``) cannot be joined: the next
    submission needs what the host computes between them.
    """
    kind = check_split_kind("kind", kind)
    if kind.startswith("qkv" + HOST_READ):
        raise ValueError(f"kind: {kind!r} cannot be joined: the host attends between the two submissions")
    bounds = [i for i, (a, b) in enumerate(zip(subs, subs[1:])) if split_kind(a[-1], b[0]) == kind]
    count = integer("count", count, minimum=1)
    if count > len(bounds):
        raise ValueError(f"count: the token has {len(bounds)} waits of kind {kind!r}, got {count}")
    joined = {bounds[int((j + 0.5) * len(bounds) / count)] for j in range(count)}
    out: list[tuple[Piece, ...]] = [tuple(subs[0])]
    for i, sub in enumerate(subs[1:]):
        if i in joined:  # the split between subs[i] and subs[i + 1] is gone
            out[-1] = out[-1] + tuple(sub)
        else:
            out.append(tuple(sub))
    return out


def _split_prices(split_prices: Any) -> dict[str, float]:
    if not isinstance(split_prices, Mapping):
        raise ValueError(f"split_prices: must be a mapping of split kind to ms, got {describe(split_prices)}")
    return {check_split_kind("split_prices", k): number(f"split_prices[{k!r}]", v) for k, v in split_prices.items()}


def priced_waits(
    cfg,
    stage: int | str | Stage,
    split_prices: Mapping[str, float],
    default_ms: float,
    *,
    plan: Plan | None = None,
    eligible=None,
) -> dict:
    """The price model: a token's waits at ``stage``, each priced by its kind.

    ``split_prices`` maps a split kind to its measured price (ms); a kind it lacks is
    priced at ``default_ms`` (the tiny round trip) and listed in ``unpriced``. Returns
    ``ms`` (the sum), ``by_kind`` ({kind: (count, ms each)}) and ``unpriced``.
    """
    prices = _split_prices(split_prices)
    default_ms = number("default_ms", default_ms, minimum=0)
    kinds = split_kinds(cfg, stage, plan=plan, eligible=eligible)
    by = {k: (c, prices.get(k, default_ms)) for k, c in kinds.items()}
    return {
        "ms": float(sum(c * p for c, p in by.values())),
        "by_kind": by,
        "unpriced": sorted(k for k in kinds if k not in prices),
    }


def model_saving(
    cfg,
    a: int | str | Stage,
    b: int | str | Stage,
    split_prices: Mapping[str, float],
    default_ms: float,
    *,
    plan: Plan | None = None,
    eligible=None,
) -> dict:
    """The price model's saving from stage ``a`` to stage ``b``: the waits each makes,
    kind by kind, priced (:func:`priced_waits`). ``removed`` / ``added``: the kinds whose
    counts differ; ``priced``: whether every one of those has a measured price (else the
    prediction leans on ``default_ms`` for some)."""
    pa = priced_waits(cfg, a, split_prices, default_ms, plan=plan, eligible=eligible)
    pb = priced_waits(cfg, b, split_prices, default_ms, plan=plan, eligible=eligible)
    kinds = list(pa["by_kind"]) + [k for k in pb["by_kind"] if k not in pa["by_kind"]]  # token order: stable output
    diff = {k: pa["by_kind"].get(k, (0, 0))[0] - pb["by_kind"].get(k, (0, 0))[0] for k in kinds}
    prices = _split_prices(split_prices)
    moved = [k for k, d in diff.items() if d]
    return {
        "ms": pa["ms"] - pb["ms"],
        "removed": {k: d for k, d in diff.items() if d > 0},
        "added": {k: -d for k, d in diff.items() if d < 0},
        "priced": all(k in prices for k in moved),
    }


def waits_by_rule(cfg, stage: int | str | Stage, *, plan: Plan | None = None) -> int:
    """The plan's per-kind rule summed over the layers: the count as the plan states it.

    Equal to :func:`waits_per_token` whenever every attention layer has an FFN and
    non-attention neighbours on both sides (or the logits after it); kept to test that
    the executable grouping says what the plan says.
    """
    st = _stage(stage, plan)
    attn = _attention_indices(cfg)
    ok = set(eligible_layers(cfg))
    n = st.costs["logits"]
    for layer in cfg.layers:
        li = layer.index
        if li not in attn:
            n += st.costs["non_attention"]
        else:
            n += st.costs["attention" if li in ok else "attention_refused"]
    return n


# ---------------------------------------------------------------------------------------
# The table


def wait_table(
    cfg,
    *,
    price_ms: float | None = None,
    ledger: str | Path | Sequence[Mapping] | None = None,
    plan: Plan | None = None,
    split_prices: Mapping[str, float] | None = None,
):
    """One row per stage of the plan: waits a token, ms a token, and what each stage saves.

    Columns: ``stage``, ``name``, ``waits``, ``saved`` (waits against the stage before),
    ``saved_total`` (against stage 1), ``ms`` (waits x price), ``ms_saved``,
    ``ms_saved_total``, ``floor``. The price is ``price_ms`` if given, else frink-models'
    entry of the ledger (``SEED_PRICE_ID``). When ``ledger`` is given, one more column ``ms@<id>`` for each of
    its entries (split prices aside) prices the same waits at that entry. With
    ``split_prices`` (kind -> ms, e.g. from :func:`ledger_split_prices`), the price model's
    columns beside the flat price: ``ms_split`` (each wait priced by its kind,
    :func:`priced_waits`; kinds without a price at ``price_ms``) and ``ms_saved_split``.
    """
    import pandas as pd  # here, not at import: the device machine need not have pandas

    plan = as_plan(plan)
    if price_ms is None:
        price_ms = ledger_price(SEED_PRICE_ID, ledger)
    price_ms = number("price_ms", price_ms, minimum=0, exclusive_minimum=True)
    eligible = eligible_layers(cfg)
    rows = []
    for st in plan.stages:
        rows.append(
            {
                "stage": st.number,
                "name": st.name,
                "waits": waits_per_token(cfg, st, plan=plan, eligible=eligible),
                "floor": st.floor,
            }
        )
    df = pd.DataFrame(rows)
    df["saved"] = (-df["waits"].diff()).fillna(0).astype(int)
    df["saved_total"] = df["waits"].iloc[0] - df["waits"]
    df["ms"] = df["waits"] * price_ms
    df["ms_saved"] = df["saved"] * price_ms
    df["ms_saved_total"] = df["saved_total"] * price_ms
    if split_prices is not None:
        df["ms_split"] = [
            priced_waits(cfg, st, split_prices, price_ms, plan=plan, eligible=eligible)["ms"] for st in plan.stages
        ]
        df["ms_saved_split"] = (-df["ms_split"].diff()).fillna(0.0)
    if ledger is not None:
        for e in ledger_entries(ledger):
            if "split" not in e:
                df[f"ms@{e['id']}"] = df["waits"] * float(e["ms"])
    cols = ["stage", "name", "waits", "saved", "saved_total", "ms", "ms_saved", "ms_saved_total", "floor"]
    return df[cols + [c for c in df.columns if c not in cols]]


def wait_share(waits: int, price_ms: float, weight_bytes: float, bandwidth_gbs: float) -> float:
    """The share of a token's time that its waits take, for a memory-bound decode.

    A decode step streams every weight once, so its compute time is about
    ``weight_bytes / bandwidth``; the waits add ``waits x price`` on top (they do not
    overlap it: the device is idle while the host waits). Returns
    ``waits*price / (waits*price + weight_bytes/bandwidth)``.
    """
    waits = number("waits", waits, minimum=0)
    price_ms = number("price_ms", price_ms, minimum=0)
    weight_bytes = number("weight_bytes", weight_bytes, minimum=0)
    bandwidth_gbs = number("bandwidth_gbs", bandwidth_gbs, minimum=0, exclusive_minimum=True)
    wait_ms = waits * price_ms
    stream_ms = weight_bytes / (bandwidth_gbs * 1e9) * 1e3
    total = wait_ms + stream_ms
    return wait_ms / total if total > 0 else 0.0


def waits_by_model(cfgs: Iterable, *, plan: Plan | None = None):
    """One row per model: its attention layers, the refused ones (with the reasons), and
    its waits a token at every stage (columns ``1`` .. ``6``). A ``pandas.DataFrame``."""
    import pandas as pd

    plan = as_plan(plan)
    rows = []
    for cfg in cfgs:
        attn = _attention_indices(cfg)
        ok = eligible_layers(cfg)
        row = {
            "model": cfg.name,
            "layers": cfg.num_layers,
            "attention": len(attn),
            "fused": len(ok),
            "refused": len(attn) - len(ok),
            "reasons": format_reason_counts(reason_counts(cfg)) or "-",
        }
        for st in plan.stages:
            row[str(st.number)] = waits_per_token(cfg, st, plan=plan, eligible=ok)
        rows.append(row)
    return pd.DataFrame(rows)
