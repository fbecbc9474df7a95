"""The resident-state plan: what a decoded token waits for, stage by stage, and its price.

A *wait* is one GPU submission whose result the host waits for. The seed (the fused
attention tail of a hybrid decoder engine) saves one a token for every attention layer it
fuses, and prices a wait at about 0.17 ms; the plan it cites (``gdn-resident-state``,
reconstructed in ``data/plans/gdn-resident-state.json``) carries those savings down to a
floor. This module turns the plan into numbers for any ``ModelConfig``:

- :func:`load_plan` reads the stages (name, what each changes, its grouping rules and the
  submissions each kind of layer costs under them);
- :func:`submissions` walks a model's layers and groups the GPU pieces of one token the
  way a stage groups them; :func:`waits_per_token` is the number of groups. The same
  grouping is what ``workbench.schedule`` executes, so the count and the clock check one
  thing;
- :func:`wait_table` prices every stage from the ledger (``data/ledger/wait_prices.json``);
- :func:`measure_wait_price` measures one wait on an MLX device, for the ledger.

Which attention layers fuse is decided ONLY by ``workbench.refusals.eligible``.
"""

from __future__ import annotations

import datetime as _dt
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

_ROOT = Path(__file__).resolve().parent.parent
PLAN_PATH = _ROOT / "data" / "plans" / "gdn-resident-state.json"
LEDGER_PATH = _ROOT / "data" / "ledger" / "wait_prices.json"

#: The ledger entry priced when no price is asked for: the seed's own figure.
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
    from workbench.refusals import refusals

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
    ``ms_saved_total``, ``floor``. The price is ``price_ms`` if given, else the seed's
    entry of the ledger. When ``ledger`` is given, one more column ``ms@<id>`` for each of
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


# ---------------------------------------------------------------------------------------
# Measuring a wait


def _as_device(device):
    """``None`` (MLX's default), a ``mx.Device`` or a ``mx.DeviceType`` (``mx.cpu``) as a ``mx.Device``."""
    import mlx.core as mx

    if device is None:
        return mx.default_device()
    if isinstance(device, mx.DeviceType):
        return mx.Device(device)
    if isinstance(device, mx.Device):
        return device
    raise ValueError(f"device: must be None, an mx.Device or mx.cpu / mx.gpu; got {device!r}")


def device_description(device=None) -> dict:
    """Which MLX device ``device`` is (default: MLX's default), for the ledger and records.

    ``backends.device_description`` (the one description every record carries) plus the
    two keys the ledger files by: ``backend`` (cpu / cuda / metal) and ``device`` (its name).
    """
    import mlx.core as mx

    from workbench import backends

    dev = _as_device(device)
    info: dict[str, Any] = dict(backends.device_description(dev))
    if dev.type == mx.cpu:
        backend = "cpu"
    else:
        backend = "cuda" if backends.cuda_available() else "metal"
    info.update({"backend": backend, "device": info.get("device_name", backend), "python": sys.version.split()[0]})
    return info


WAIT_METHOD = (
    "One wait = the smallest submission and its round trip to the host: on the device, "
    "y = x + 1 of a resident float32 scalar x (a fresh graph of one op), then y.item(), "
    "which evaluates it, waits for the device and reads the value back. Timed one by one "
    "with time.perf_counter_ns after {warmup} warm-up waits; the price is the median of "
    "{n}; spread: 10th-90th percentile and IQR. Beside it, interleaved, mx.eval(x + 1) "
    "without the read-back (eval_only_ms)."
)


def measure_wait_price(device=None, *, n: int = 2000, warmup: int = 200) -> dict:
    """Measure one wait on an MLX device (default: MLX's default device).

    Returns a ledger-shaped dict: ``ms`` (the median), ``p10_ms``, ``p90_ms``, ``iqr_ms``,
    ``mean_ms``, ``eval_only_ms`` (the same submission waited for without reading it
    back), ``n``, the device (see :func:`device_description`), the date, and the method
    in words.
    """
    import mlx.core as mx

    if n < 10 or warmup < 0:
        raise ValueError(f"n, warmup: need n >= 10 and warmup >= 0, got {n}, {warmup}")
    dev = _as_device(device)
    times, eval_only = [], []
    with mx.stream(dev):
        x = mx.array(1.0, dtype=mx.float32)
        mx.eval(x)
        for i in range(warmup + n):
            t0 = time.perf_counter_ns()
            (x + 1).item()
            t1 = time.perf_counter_ns()
            mx.eval(x + 1)  # the same submission without reading the value back (a side figure)
            t2 = time.perf_counter_ns()
            if i >= warmup:
                times.append((t1 - t0) / 1e6)
                eval_only.append((t2 - t1) / 1e6)
    times.sort()
    q = statistics.quantiles(times, n=20)  # 5% steps: q[1] = p10, q[4] = p25, q[14] = p75, q[17] = p90
    info = device_description(dev)
    return {
        "ms": statistics.median(times),
        "p10_ms": q[1],
        "p90_ms": q[17],
        "iqr_ms": q[14] - q[4],
        "mean_ms": statistics.fmean(times),
        "eval_only_ms": statistics.median(eval_only),
        "n": n,
        "warmup": warmup,
        "kind": "measured",
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "method": WAIT_METHOD.format(n=n, warmup=warmup),
        **info,
    }


def measure_split_price(step, x, *, n: int = 50, warmup: int = 5) -> dict:
    """What one wait costs BETWEEN two real submissions, not after a trivial one.

    ``step`` maps an MLX array to one of the same shape (say, a layer's tail). Each round
    runs it twice, dependent, both ways, interleaved:

    * split (two waits): ``y = step(x)`` evaluated and read back to the host, then
      ``step`` on ``y`` uploaded again, evaluated and read back: what an engine does
      when the host sits between two submissions;
    * joined (one wait): ``step(step(x))`` built at once, evaluated and read back.

    The price is the median of the per-round differences ``split - joined``: the round
    trip itself PLUS whatever the device loses by waiting (it idles while the host reads,
    encodes and submits the second half). :func:`measure_wait_price` measures only the
    first part, with a one-op submission. Returns ``ms`` (that median), ``p10_ms``,
    ``p90_ms``, ``split_ms`` and ``joined_ms`` (medians), ``n``.
    """
    import mlx.core as mx
    import numpy as np

    if n < 5 or warmup < 0:
        raise ValueError(f"n, warmup: need n >= 5 and warmup >= 0, got {n}, {warmup}")

    def split() -> None:
        y = np.asarray(step(x))  # wait 1: evaluate, read back
        np.asarray(step(mx.array(y)))  # wait 2

    def joined() -> None:
        np.asarray(step(step(x)))  # the one wait

    diffs, ss, js = [], [], []
    for i in range(warmup + n):
        t0 = time.perf_counter_ns()
        split()
        t1 = time.perf_counter_ns()
        joined()
        t2 = time.perf_counter_ns()
        if i >= warmup:
            ss.append((t1 - t0) / 1e6)
            js.append((t2 - t1) / 1e6)
            diffs.append(ss[-1] - js[-1])
    q = statistics.quantiles(sorted(diffs), n=10)
    return {"ms": statistics.median(diffs), "p10_ms": q[0], "p90_ms": q[8],
            "split_ms": statistics.median(ss), "joined_ms": statistics.median(js), "n": n, "warmup": warmup}


def waits_by_model(cfgs: Iterable, *, plan: Plan | None = None):
    """One row per model: its attention layers, the refused ones (with the reasons), and
    its waits a token at every stage (columns ``1`` .. ``6``). A ``pandas.DataFrame``."""
    import pandas as pd

    from workbench.refusals import refusals

    plan = plan or load_plan()
    rows = []
    for cfg in cfgs:
        attn = sorted(_attention_indices(cfg))
        reasons: dict[str, int] = {}
        for l in attn:
            for r in refusals(cfg, l):
                reasons[r.name] = reasons.get(r.name, 0) + 1
        ok = eligible_layers(cfg)
        row = {"model": cfg.name, "layers": cfg.num_layers, "attention": len(attn), "fused": len(ok),
               "refused": len(attn) - len(ok),
               "reasons": ", ".join(f"{k} x{v}" for k, v in reasons.items()) or "-"}
        for st in plan.stages:
            row[str(st.number)] = waits_per_token(cfg, st, plan=plan, eligible=ok)
        rows.append(row)
    return pd.DataFrame(rows)
