"""The wait-price ledger's schema: every valid ledger loads as written, every invalid one is
a ValueError naming the file, the entry and the field, and nothing else escapes.

Property tests build ledgers from the schema (valid), then break one field of one entry
in one of the ways a hand edit or a bad record can (invalid). The reference for a valid
ledger is the JSON itself: what loads must be exactly the entries written.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.waits import ledger as wait_ledger
from workbench.waits import plan as waits

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

text = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
finite_pos = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def entries(draw, i: int) -> dict:
    kind = draw(st.sampled_from(wait_ledger.ENTRY_KINDS))
    ms = draw(finite_pos)
    e = {
        "id": f"e{i}-{draw(text)}",
        "kind": kind,
        "ms": ms,
        "device": draw(text),
        "backend": draw(st.sampled_from(wait_ledger.LEDGER_BACKENDS)),
        "method": draw(text),
        "source": draw(text),
    }
    if kind == "measured" or draw(st.booleans()):
        e["date"] = f"2026-{draw(st.integers(1, 12)):02d}-{draw(st.integers(1, 28)):02d}"
        e["mlx_version"] = "0.32.4"
        e["n"] = draw(st.integers(1, 10**6))
    if draw(st.booleans()):
        e["p10_ms"] = ms * draw(st.floats(0, 1))
        e["p90_ms"] = ms * draw(st.floats(1, 10))
        e["warmup"] = draw(st.integers(0, 1000))
    return e


@st.composite
def ledgers(draw) -> dict:
    n = draw(st.integers(0, 6))
    return {"about": draw(text), "prices": [draw(entries(i)) for i in range(n)]}


#: One way to break an entry, the field the error must name, and the breakage.
BREAKS = {
    "ms as a string": ("ms", lambda e: e.update(ms="abc")),
    "ms NaN": ("ms", lambda e: e.update(ms=math.nan)),
    "ms infinite": ("ms", lambda e: e.update(ms=math.inf)),
    "ms negative": ("ms", lambda e: e.update(ms=-0.1)),
    "ms zero": ("ms", lambda e: e.update(ms=0)),
    "ms a bool": ("ms", lambda e: e.update(ms=True)),
    "ms a numeric string": ("ms", lambda e: e.update(ms="0.17")),
    "no ms": ("ms", lambda e: e.pop("ms")),
    "no id": ("id", lambda e: e.pop("id")),
    "id empty": ("id", lambda e: e.update(id="")),
    "id a number": ("id", lambda e: e.update(id=3)),
    "kind unknown": ("kind", lambda e: e.update(kind="guessed")),
    "backend unknown": ("backend", lambda e: e.update(backend="tpu")),
    "device null": ("device", lambda e: e.update(device=None)),
    "method a list": ("method", lambda e: e.update(method=["m"])),
    "unknown key": ("unknown keys", lambda e: e.update(mss=0.2)),
    "date not a date": ("date", lambda e: e.update(date="yesterday")),
    "n a float": ("n", lambda e: e.update(n=3.0)),
    "n zero": ("n", lambda e: e.update(n=0)),
    "warmup negative": ("warmup", lambda e: e.update(warmup=-1)),
    "p10 above the median": ("ms", lambda e: e.update(p10_ms=e["ms"] * 2)),
    "p90 NaN": ("p90_ms", lambda e: e.update(p90_ms=math.nan)),
    "measured without a date": ("date", lambda e: e.update(kind="measured", date=None, mlx_version="0.32.4", n=5)),
    "not an object": ("must be a JSON object", lambda e: None),
}


@given(ledgers())
@SETTINGS
def test_a_valid_ledger_loads_exactly_as_written(tmp_path: Path, raw: dict) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps(raw))
    assert wait_ledger.load_ledger(path) == raw["prices"]
    assert wait_ledger.check_ledger(raw) == raw["prices"]
    for e in raw["prices"]:
        assert wait_ledger.ledger_price(e["id"], path) == e["ms"]


@given(ledgers(), st.data(), st.sampled_from(sorted(BREAKS)))
@SETTINGS
def test_a_broken_entry_is_named_on_load_and_on_add(tmp_path: Path, raw: dict, data, which: str) -> None:
    if not raw["prices"]:
        raw["prices"].append(data.draw(entries(0)))
    i = data.draw(st.integers(0, len(raw["prices"]) - 1))
    field, brk = BREAKS[which]
    if which == "not an object":
        raw["prices"][i] = "seed-metal 0.17"
    else:
        brk(raw["prices"][i])
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError) as err:
        wait_ledger.load_ledger(path)
    msg = str(err.value)
    assert str(path) in msg and f"prices[{i}]" in msg and field in msg, msg
    # The same entry offered to add_price is refused before the file is touched.
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"about": "a", "prices": []}))
    with pytest.raises(ValueError, match=field if which != "not an object" else "JSON object"):
        wait_ledger.add_price(raw["prices"][i], good)
    assert json.loads(good.read_text()) == {"about": "a", "prices": []}


@pytest.mark.parametrize(
    "content, field",
    [
        ("", "not valid JSON"),  # what a killed truncating write left
        ('{"about": "a", "prices": [', "not valid JSON"),  # what a full disk left
        ('{"about": "a"}', "lacks ['prices']"),
        ('{"about": "a", "prices": {}}', "prices: must be a list"),
        ('{"about": "a", "prices": [], "extra": 1}', "unknown keys ['extra']"),
        ("[]", "must be a JSON object"),
    ],
)
def test_a_broken_file_is_named(tmp_path: Path, content: str, field: str) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="ledger") as err:
        wait_ledger.load_ledger(path)
    assert field in str(err.value) and str(path) in str(err.value)


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    raw = json.loads(wait_ledger.LEDGER_PATH.read_text())
    last = len(raw["prices"])  # the copy's position: the ledger grows as prices are measured
    raw["prices"].append(dict(raw["prices"][0]))
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=rf"prices\[{last}\].*id: 'seed-metal' is already the id of prices\[0\]"):
        wait_ledger.load_ledger(path)


def test_the_regressions_of_the_ledger(tmp_path: Path) -> None:
    """ms "abc" and NaN were written and broke every later table; a replace was silent."""
    path = tmp_path / "ledger.json"
    shutil.copy(wait_ledger.LEDGER_PATH, path)
    before = path.read_bytes()
    entry = {"id": "x", "kind": "published", "ms": 0.5, "device": "d", "backend": "cpu", "method": "m", "source": "s"}
    for bad in ("abc", math.nan):
        with pytest.raises(ValueError, match=r"entry \('x'\): ms: must be a finite number > 0"):
            wait_ledger.add_price({**entry, "ms": bad}, path)
    assert path.read_bytes() == before
    wait_ledger.add_price(entry, path)
    with pytest.raises(ValueError, match="'x' is already in .*replace=True"):
        wait_ledger.add_price({**entry, "ms": 0.25}, path)
    assert wait_ledger.add_price({**entry, "ms": 0.25}, path, replace=True)["ms"] == 0.5
    with pytest.raises(ValueError, match="replace: must be True or False"):
        wait_ledger.add_price(entry, path, replace="yes")
    with pytest.raises(ValueError, match="does not exist"):
        wait_ledger.add_price(entry, tmp_path / "none.json")
    # An in-memory ledger handed to a table is checked the same way.
    with pytest.raises(ValueError, match=r"ledger: prices\[0\] \('x'\): ms"):
        waits.wait_table(_bonsai(), ledger=[{**entry, "ms": "abc"}])
    with pytest.raises(ValueError, match="ledger: must be None, a path or a sequence"):
        wait_ledger.ledger_price("x", ledger=3)
    with pytest.raises(ValueError, match="price_ms: must be a finite number > 0"):
        waits.wait_table(_bonsai(), price_ms=math.nan)


def test_the_committed_ledger_names_no_path_outside_the_project() -> None:
    for e in wait_ledger.load_ledger():
        for k in ("source", "command", "method"):
            assert "../" not in str(e.get(k, "")) and "/root/" not in str(e.get(k, "")), (e["id"], k)


def _bonsai():
    from workbench.models.loader import load_model

    return load_model("bonsai-27b")
