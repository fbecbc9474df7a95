"""The wait-price ledger: what one wait costs, measured or quoted, entry by entry.

``data/ledger/wait_prices.json`` holds the prices the wait table multiplies the plan's
waits by (``workbench.waits.plan.wait_table``): frink-models' own figure (``seed``),
others' (``published``, with their source) and those measured here (``measured``, which
``workbench.waits.measurement`` makes and the bench commands file). A *split* entry prices
one kind of wait (``workbench.waits.schema.check_split_kind``) for the price model.

The ledger is checked on every load and add (:func:`check_ledger`, :func:`check_entry`);
:func:`add_price` changes it under a lock and atomically (``workbench.files``), and
replaces an entry only when asked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench import files
from workbench.validate import describe, flag, integer, number, one_of
from workbench.waits.schema import check_split_kind, read_json, strict_object, text, where

LEDGER_PATH = files.DATA_DIR / "ledger" / "wait_prices.json"

#: The ledger's entry fields: required ones, then optional ones (the spread of a measured price).
_ENTRY_REQUIRED = ("id", "kind", "ms", "device", "backend", "method", "source")
_ENTRY_OPTIONAL = (
    "date",
    "mlx_version",
    "command",
    "n",
    "warmup",
    "p10_ms",
    "p90_ms",
    "iqr_ms",
    "mean_ms",
    "eval_only_ms",
    "split",
    "matvec",
    "dtype",
)
#: seed: frink-models' own figure; published: someone else's, with its source; measured: made here.
ENTRY_KINDS = ("seed", "published", "measured")
LEDGER_BACKENDS = ("cpu", "cuda", "metal")
_LEDGER_KEYS = ("about", "prices")


def check_entry(entry: Any, source: str = "entry") -> dict:
    """One ledger entry, checked: a plain dict of it, or a ValueError naming ``source`` and the field.

    Types are JSON's (``"0.17"`` is not a number), ``ms`` is a finite price > 0, the spread
    fields finite and >= 0 with ``p10_ms <= ms <= p90_ms``, ``backend`` one of
    :data:`LEDGER_BACKENDS`, ``kind`` one of :data:`ENTRY_KINDS`; a ``measured`` entry
    also says its ``date`` (YYYY-MM-DD), ``mlx_version`` and ``n``. Unknown keys are refused.
    """
    if isinstance(entry, Mapping) and isinstance(entry.get("id"), str):
        source = f"{source} ({entry['id']!r})"
    e = strict_object(source, entry, _ENTRY_REQUIRED, _ENTRY_OPTIONAL)
    out: dict[str, Any] = {
        "id": text(f"{source}: id", e["id"]),
        "kind": one_of(f"{source}: kind", e["kind"], ENTRY_KINDS),
        "ms": number(f"{source}: ms", e["ms"], minimum=0, exclusive_minimum=True),
    }
    for k in ("device", "method", "source"):
        out[k] = text(f"{source}: {k}", e[k])
    out["backend"] = one_of(f"{source}: backend", e["backend"], LEDGER_BACKENDS)
    for k in ("mlx_version", "command", "matvec", "dtype"):
        if k in e:
            out[k] = text(f"{source}: {k}", e[k], nullable=True)
    if "split" in e:  # a split price: the wait between two given kinds of submission
        out["split"] = check_split_kind(f"{source}: split", e["split"])
    if "date" in e:
        date = text(f"{source}: date", e["date"], nullable=True)
        if date is not None and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
            raise ValueError(f"{source}: date: must be a date YYYY-MM-DD or null, got {describe(date)}")
        out["date"] = date
    for k in ("p10_ms", "p90_ms", "iqr_ms", "mean_ms", "eval_only_ms"):
        if k in e:
            out[k] = number(f"{source}: {k}", e[k], minimum=0)
    if "n" in e:
        out["n"] = integer(f"{source}: n", e["n"], minimum=1)
    if "warmup" in e:
        out["warmup"] = integer(f"{source}: warmup", e["warmup"], minimum=0)
    if out.get("p10_ms", -math.inf) > out["ms"] or out.get("p90_ms", math.inf) < out["ms"]:
        raise ValueError(
            f"{source}: ms: the median must lie between p10_ms and p90_ms; got "
            f"{out.get('p10_ms')} <= {out['ms']} <= {out.get('p90_ms')}"
        )
    if out["kind"] == "measured":
        for k in ("date", "mlx_version", "n"):
            if out.get(k) is None:
                raise ValueError(f"{source}: {k}: a measured entry must say its {k}, got {describe(out.get(k))}")
    # The file's own order of keys, so a rewrite changes only what changed.
    return {k: out[k] for k in e}


def check_ledger(raw: Any, source: str = "ledger") -> list[dict]:
    """The ledger's parsed JSON, checked: its entries, or a ValueError naming ``source``,
    the entry (position and id) and the field. Ids must be unique."""
    top = strict_object(source, raw, _LEDGER_KEYS)
    text(where(source, "about"), top["about"])
    prices = top["prices"]
    if not isinstance(prices, list):
        raise ValueError(f"{where(source, 'prices')}: must be a list of entries, got {describe(prices)}")
    return _check_entries(prices, source)


def _check_entries(prices: Sequence[Any], source: str) -> list[dict]:
    entries: list[dict] = []
    seen: dict[str, int] = {}
    for i, e in enumerate(prices):
        entry = check_entry(e, where(source, f"prices[{i}]"))
        if entry["id"] in seen:
            raise ValueError(
                f"{where(source, f'prices[{i}]')}: id: {entry['id']!r} is already the id of "
                f"prices[{seen[entry['id']]}]; ids must be unique"
            )
        seen[entry["id"]] = i
        entries.append(entry)
    return entries


def ledger_split_prices(
    device: str,
    backend: str,
    ledger: str | Path | Sequence[Mapping] | None = None,
    *,
    matvec: str | None = None,
    dtype: str | None = None,
) -> dict[str, float]:
    """The split prices (kind -> ms) the ledger holds for ``device`` on ``backend``
    (and, when given, that ``matvec`` path and ``dtype``), for ``workbench.waits.plan.priced_waits``."""
    out = {}
    for e in ledger_entries(ledger):
        if "split" not in e or e["device"] != device or e["backend"] != backend:
            continue
        if (matvec is not None and e.get("matvec") != matvec) or (dtype is not None and e.get("dtype") != dtype):
            continue
        out[e["split"]] = float(e["ms"])
    return out


def load_ledger(path: str | Path | None = None) -> list[dict]:
    """The ledger's entries (each: id, kind, ms, device, backend, method, source, ...), checked
    by :func:`check_ledger`; read afresh on every call."""
    p = Path(path) if path is not None else LEDGER_PATH
    return check_ledger(read_json(p, "ledger"), str(p))


def ledger_price(entry_id: str, ledger: str | Path | Sequence[Mapping] | None = None) -> float:
    """The price (ms) of the ledger entry ``entry_id``."""
    found = ledger_entries(ledger)
    for e in found:
        if e["id"] == entry_id:
            return float(e["ms"])
    raise ValueError(f"entry_id: {entry_id!r} is not in the ledger; allowed: {[e['id'] for e in found]}")


def ledger_entries(ledger: str | Path | Sequence[Mapping] | None) -> list[dict]:
    """The ledger's entries, checked: read from the file (None: :data:`LEDGER_PATH`) or a path, or
    ``ledger`` itself when it is a sequence of entries; anything else is a ValueError naming ``ledger``."""
    if ledger is None or isinstance(ledger, (str, Path)):
        return load_ledger(ledger)
    if isinstance(ledger, (Mapping, bytes)) or not isinstance(ledger, Sequence):
        raise ValueError(f"ledger: must be None, a path or a sequence of entries, got {describe(ledger)}")
    return _check_entries(ledger, "ledger")


def add_price(entry: Mapping[str, Any], path: str | Path | None = None, *, replace: bool = False) -> dict | None:
    """Add one entry to the ledger file; returns the entry it replaced, or None.

    The entry is checked (:func:`check_entry`) before the file is touched. An entry whose
    id is already in the ledger is refused unless ``replace`` (a measured price is not
    silently lost); with ``replace`` the old entry is returned so the caller can say what
    it replaced. The file is read, changed and written under its lock and atomically
    (``workbench.files``): a kill, a full disk or a concurrent writer leaves the old
    ledger or the new one, with every entry either committed.
    """
    p = Path(path) if path is not None else LEDGER_PATH
    replace = flag("replace", replace)
    new = check_entry(entry, "entry")
    replaced: list[dict] = []

    def change(raw: Any) -> Any:
        entries = check_ledger(raw, str(p))
        old = [e for e in entries if e["id"] == new["id"]]
        if old and not replace:
            raise ValueError(
                f"entry: id {new['id']!r} is already in {p} (ms {old[0]['ms']}); pass replace=True to replace it"
            )
        replaced.extend(old)
        raw["prices"] = [e for e in raw["prices"] if e["id"] != new["id"]] + [new]
        return raw

    if not p.exists():
        raise ValueError(f"path: ledger file {p} does not exist")
    files.update_json(p, change)
    return replaced[0] if replaced else None
