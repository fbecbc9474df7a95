"""The resident-state plan: what a decoded token waits for, stage by stage, and its price.

A *wait* is one GPU submission whose result the host waits for. frink-models' fused
attention tail saves one a token for every attention layer it fuses, and its doc comment
prices a wait at about 0.17 ms; the plan it cites (``gdn-resident-state``,
reconstructed in ``data/plans/gdn-resident-state.json``) carries those savings down to a
floor. This module turns the plan into numbers for any ``ModelConfig``:

- :func:`load_plan` reads the stages (name, what each changes, its grouping rules and the
  submissions each kind of layer costs under them);
- :func:`submissions` walks a model's layers and groups the GPU pieces of one token the
  way a stage groups them; :func:`waits_per_token` is the number of groups. The same
  grouping is what ``workbench.schedule`` executes, so the count and the clock check one
  thing;
- :func:`wait_table` prices every stage from the ledger (``data/ledger/wait_prices.json``),
  whose measured entries ``workbench.wait_measurement`` makes.

Which attention layers fuse is decided ONLY by ``workbench.refusals.eligible``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from workbench.moved_names import forwarder
from workbench.refusals import format_reason_counts, reason_counts, refusals

_ROOT = Path(__file__).resolve().parent.parent
PLAN_PATH = _ROOT / "data" / "plans" / "gdn-resident-state.json"
LEDGER_PATH = _ROOT / "data" / "ledger" / "wait_prices.json"

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


_PLAN_CACHE: dict[Path, Plan] = {}


def load_plan(path: str | Path | None = None) -> Plan:
    """Read the plan's stages from JSON (default ``data/plans/gdn-resident-state.json``)."""
    p = Path(path) if path is not None else PLAN_PATH
    if p in _PLAN_CACHE:
        return _PLAN_CACHE[p]
    raw = json.loads(p.read_text())
    stages = []
    for s in raw["stages"]:
        rules = s["rules"]
        missing = [r for r in _RULES if r not in rules] + [c for c in _COST_KINDS if c not in s["costs"]]
        if missing:
            raise ValueError(f"path: stage {s.get('key')!r} of {p} lacks {missing}")
        stages.append(
            Stage(
                number=int(s["stage"]),
                key=s["key"],
                name=s["name"],
                changes=s["changes"],
                costs=dict(s["costs"]),
                floor=bool(s.get("floor", False)),
                **{r: bool(rules[r]) for r in _RULES},
            )
        )
    plan = Plan(raw["name"], raw["title"], raw["source"], tuple(raw["assumptions"]), tuple(stages))
    _PLAN_CACHE[p] = plan
    return plan


def _stage(stage: int | str | Stage, plan: Plan | None) -> Stage:
    return (plan or load_plan()).stage(stage)


def _attention_indices(cfg) -> set[int]:
    # attention_layers() may hand back indices or LayerConfigs; accept both.
    return {a if isinstance(a, int) else a.index for a in cfg.attention_layers()}


def _has_ffn(cfg, l: int) -> bool:
    return int(getattr(cfg.layer(l), "ffn_dim", 0) or 0) > 0


def eligible_layers(cfg, *, kernels_enabled: bool = True) -> tuple[int, ...]:
    """The attention layers whose tail fuses, by ``workbench.refusals`` alone."""
    return tuple(
        sorted(l for l in _attention_indices(cfg) if not refusals(cfg, l, kernels_enabled=kernels_enabled))
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
    ok = set(eligible_layers(cfg) if eligible is None else eligible)
    bad = ok - attn
    if bad:
        raise ValueError(f"eligible: layers {sorted(bad)} are not attention layers of {cfg.name}")

    # The token's pieces in order, each marked with whether the host needs its result.
    pieces: list[tuple[Piece, bool]] = []
    for layer in cfg.layers:
        l = layer.index
        if l not in attn:
            pieces.append((Piece("layer", l), False))
            continue
        fused = st.fuse_tail and l in ok and _has_ffn(cfg, l)
        pieces.append((Piece("qkv", l), not st.attention_on_device))
        if st.attention_on_device:
            pieces.append((Piece("attention", l), False))
        if fused:
            pieces.append((Piece("tail", l), False))
        else:
            # Unfused or refused: the host takes wo's result (and the FFN's) back.
            refused_need = not st.attention_on_device
            pieces.append((Piece("wo", l), refused_need))
            if _has_ffn(cfg, l):
                pieces.append((Piece("ffn", l), refused_need))
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
        if (
            piece.kind == "qkv"
            and st.qkv_into_previous
            and piece.layer in ok
            and out
            and out[-1][-1].kind == "layer"
        ):
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
        l = layer.index
        if l not in attn:
            n += st.costs["non_attention"]
        else:
            n += st.costs["attention" if l in ok else "attention_refused"]
    return n


# ---------------------------------------------------------------------------------------
# The ledger


def load_ledger(path: str | Path | None = None) -> list[dict]:
    """The ledger's entries (each: id, kind, ms, device, backend, date, mlx_version, method, ...)."""
    p = Path(path) if path is not None else LEDGER_PATH
    return list(json.loads(p.read_text())["prices"])


def ledger_price(entry_id: str, ledger: str | Path | Sequence[Mapping] | None = None) -> float:
    """The price (ms) of the ledger entry ``entry_id``."""
    entries = _entries(ledger)
    for e in entries:
        if e["id"] == entry_id:
            return float(e["ms"])
    raise ValueError(f"entry_id: {entry_id!r} is not in the ledger; allowed: {[e['id'] for e in entries]}")


def _entries(ledger) -> list[Mapping]:
    if ledger is None or isinstance(ledger, (str, Path)):
        return load_ledger(ledger)
    return list(ledger)


def add_price(entry: Mapping[str, Any], path: str | Path | None = None) -> None:
    """Add (or replace, by id) one entry of the ledger file."""
    p = Path(path) if path is not None else LEDGER_PATH
    raw = json.loads(p.read_text())
    for key in ("id", "ms", "device", "method"):
        if key not in entry:
            raise ValueError(f"entry: needs {key!r}; got keys {sorted(entry)}")
    raw["prices"] = [e for e in raw["prices"] if e["id"] != entry["id"]] + [dict(entry)]
    p.write_text(json.dumps(raw, indent=2) + "\n")


# ---------------------------------------------------------------------------------------
# The table


def wait_table(
    cfg,
    *,
    price_ms: float | None = None,
    ledger: str | Path | Sequence[Mapping] | None = None,
    plan: Plan | None = None,
):
    """One row per stage of the plan: waits a token, ms a token, and what each stage saves.

    Columns: ``stage``, ``name``, ``waits``, ``saved`` (waits against the stage before),
    ``saved_total`` (against stage 1), ``ms`` (waits x price), ``ms_saved``,
    ``ms_saved_total``, ``floor``. The price is ``price_ms`` if given, else frink-models'
    entry of the ledger (``SEED_PRICE_ID``). When ``ledger`` is given, one more column ``ms@<id>`` for each of
    its entries prices the same waits at that entry.
    """
    import pandas as pd  # here, not at import: the device machine need not have pandas

    plan = plan or load_plan()
    if price_ms is None:
        price_ms = ledger_price(SEED_PRICE_ID, ledger)
    if not price_ms > 0:
        raise ValueError(f"price_ms: must be > 0 ms, got {price_ms!r}")
    eligible = eligible_layers(cfg)
    rows = []
    for st in plan.stages:
        rows.append({"stage": st.number, "name": st.name, "waits": waits_per_token(cfg, st, plan=plan, eligible=eligible), "floor": st.floor})
    df = pd.DataFrame(rows)
    df["saved"] = (-df["waits"].diff()).fillna(0).astype(int)
    df["saved_total"] = df["waits"].iloc[0] - df["waits"]
    df["ms"] = df["waits"] * price_ms
    df["ms_saved"] = df["saved"] * price_ms
    df["ms_saved_total"] = df["saved_total"] * price_ms
    if ledger is not None:
        for e in _entries(ledger):
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
    if not (waits >= 0 and price_ms >= 0 and weight_bytes >= 0 and bandwidth_gbs > 0):
        raise ValueError(
            "waits, price_ms, weight_bytes: must be >= 0 and bandwidth_gbs > 0; "
            f"got {waits}, {price_ms}, {weight_bytes}, {bandwidth_gbs}"
        )
    wait_ms = waits * price_ms
    stream_ms = weight_bytes / (bandwidth_gbs * 1e9) * 1e3
    total = wait_ms + stream_ms
    return wait_ms / total if total > 0 else 0.0


def waits_by_model(cfgs: Iterable, *, plan: Plan | None = None):
    """One row per model: its attention layers, the refused ones (with the reasons), and
    its waits a token at every stage (columns ``1`` .. ``6``). A ``pandas.DataFrame``."""
    import pandas as pd

    plan = plan or load_plan()
    rows = []
    for cfg in cfgs:
        attn = _attention_indices(cfg)
        ok = eligible_layers(cfg)
        row = {"model": cfg.name, "layers": cfg.num_layers, "attention": len(attn), "fused": len(ok),
               "refused": len(attn) - len(ok), "reasons": format_reason_counts(reason_counts(cfg)) or "-"}
        for st in plan.stages:
            row[str(st.number)] = waits_per_token(cfg, st, plan=plan, eligible=ok)
        rows.append(row)
    return pd.DataFrame(rows)


#: Where each name that used to live in this module lives now.
_MOVED: dict[str, str] = dict.fromkeys(("measure_wait_price", "measure_split_price", "WAIT_METHOD"),
                                       "workbench.wait_measurement")

__getattr__ = forwarder(__name__, _MOVED)
