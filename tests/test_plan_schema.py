"""The plan's schema: a valid plan JSON loads as the Plan it states, an invalid one is a
ValueError naming the file, the stage and the field, and an edited file is never answered
from a stale copy.

Property tests build plans from the schema (any number of stages, any rules, any costs)
and compare what loads with the Plan built field by field from the same JSON (the
reference); then they break one field of one stage the ways a hand edit can.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.models.loader import load_model
from workbench.waits import plan as waits

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
RULES = ("fuse_tail", "qkv_into_previous", "tail_into_next", "resident_runs", "attention_on_device")
COSTS = ("non_attention", "attention", "attention_refused", "logits")


@st.composite
def plans(draw) -> dict:
    n = draw(st.integers(1, 6))
    keys = draw(st.permutations(["baseline", "fused", "qkv", "tail", "floor", "device", "extra", "other"]))[:n]
    stages = []
    for i in range(n):
        s = {
            "stage": i + 1,
            "key": keys[i],
            "name": f"stage {keys[i]}",
            "changes": "something",
            "rules": {r: draw(st.booleans()) for r in RULES},
            "costs": {c: draw(st.integers(0, 5)) for c in COSTS},
        }
        if draw(st.booleans()):
            s["floor"] = draw(st.booleans())
        stages.append(s)
    return {"name": "p", "title": "t", "source": "s", "assumptions": ["a"] * draw(st.integers(0, 3)), "stages": stages}


def reference(raw: dict) -> waits.Plan:
    """The Plan a JSON states, built directly from it."""
    return waits.Plan(
        raw["name"],
        raw["title"],
        raw["source"],
        tuple(raw["assumptions"]),
        tuple(
            waits.Stage(
                number=s["stage"],
                key=s["key"],
                name=s["name"],
                changes=s["changes"],
                costs=dict(s["costs"]),
                floor=s.get("floor", False),
                **s["rules"],
            )
            for s in raw["stages"]
        ),
    )


#: One way to break a stage (given the plan and the stage's index), and what the error names.
BREAKS = {
    "a rule as the string 'false'": (
        "rules: fuse_tail",
        lambda p, i: p["stages"][i]["rules"].update(fuse_tail="false"),
    ),
    "a rule as 0": ("rules: resident_runs", lambda p, i: p["stages"][i]["rules"].update(resident_runs=0)),
    "a rule missing": ("rules: lacks ['tail_into_next']", lambda p, i: p["stages"][i]["rules"].pop("tail_into_next")),
    "an unknown rule": (
        "rules: unknown keys ['fuse_head']",
        lambda p, i: p["stages"][i]["rules"].update(fuse_head=True),
    ),
    "a negative cost": ("costs: attention", lambda p, i: p["stages"][i]["costs"].update(attention=-1)),
    "a fractional cost": ("costs: logits", lambda p, i: p["stages"][i]["costs"].update(logits=1.5)),
    "a cost as a string": ("costs: non_attention", lambda p, i: p["stages"][i]["costs"].update(non_attention="1")),
    "a cost missing": (
        "costs: lacks ['attention_refused']",
        lambda p, i: p["stages"][i]["costs"].pop("attention_refused"),
    ),
    "rules missing": ("lacks ['rules']", lambda p, i: p["stages"][i].pop("rules")),
    "costs missing": ("lacks ['costs']", lambda p, i: p["stages"][i].pop("costs")),
    "an unknown stage key": ("unknown keys ['waits']", lambda p, i: p["stages"][i].update(waits=3)),
    "floor as a string": ("floor", lambda p, i: p["stages"][i].update(floor="true")),
    "a stage number out of order": (
        "stage: stages must be numbered 1, 2, ...",
        lambda p, i: p["stages"][i].update(stage=i + 2),
    ),
    "a stage number as a string": ("stage: must be an integer", lambda p, i: p["stages"][i].update(stage=str(i + 1))),
    "a duplicate stage number": ("stage", lambda p, i: p["stages"].insert(i, copy.deepcopy(p["stages"][i]))),
    "an empty name": ("name: must be a non-empty string", lambda p, i: p["stages"][i].update(name="")),
    "a stage that is not an object": ("must be a JSON object", lambda p, i: p["stages"].__setitem__(i, [1, 2])),
}


@given(plans())
@SETTINGS
def test_a_valid_plan_loads_as_it_states(tmp_path: Path, raw: dict) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    plan = waits.load_plan(path)
    assert plan == reference(raw)
    assert all(type(getattr(s, r)) is bool for s in plan.stages for r in RULES)
    for s in raw["stages"]:
        assert plan.stage(s["key"]).number == s["stage"]


def test_any_valid_plan_prices_bonsai() -> None:
    bonsai = load_model("bonsai-27b")

    @given(plans())
    @settings(max_examples=15, deadline=None)
    def check(raw: dict) -> None:
        plan = waits.parse_plan(raw)
        df = waits.wait_table(bonsai, plan=plan, price_ms=0.1)
        assert df["stage"].tolist() == list(range(1, len(raw["stages"]) + 1))
        assert (df["waits"] >= 1).all()  # the logits' wait is in every row

    check()


@given(plans(), st.data(), st.sampled_from(sorted(BREAKS)))
@SETTINGS
def test_a_broken_stage_is_named(tmp_path: Path, raw: dict, data, which: str) -> None:
    i = data.draw(st.integers(0, len(raw["stages"]) - 1))
    field, brk = BREAKS[which]
    brk(raw, i)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError) as err:
        waits.load_plan(path)
    msg = str(err.value)
    assert str(path) in msg and "stages[" in msg and field in msg, msg


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda p: p.pop("stages"), "lacks ['stages']"),
        (lambda p: p.update(stages=[]), "stages: must be a non-empty list"),
        (lambda p: p.update(assumptions="one"), "assumptions: must be a list of strings"),
        (lambda p: p.update(notes="x"), "unknown keys ['notes']"),
        (lambda p: p.update(name=None), "name: must be a non-empty string"),
    ],
)
def test_a_broken_top_level_is_named(tmp_path: Path, change, field: str) -> None:
    raw = json.loads(waits.PLAN_PATH.read_text())
    change(raw)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="plan.json") as err:
        waits.load_plan(path)
    assert field in str(err.value)


def test_the_regressions_of_the_plan(tmp_path: Path) -> None:
    """'fuse_tail': 'false' read as true (Bonsai's stage 2: 81 waits instead of 97), negative
    costs and duplicate stages accepted, a missing section a bare KeyError, a stale cache."""
    bonsai = load_model("bonsai-27b")
    raw = json.loads(waits.PLAN_PATH.read_text())
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    assert waits.waits_per_token(bonsai, 2, plan=waits.load_plan(path)) == 81

    raw["stages"][1]["rules"]["fuse_tail"] = "false"
    path.write_text(json.dumps(raw))
    with pytest.raises(
        ValueError, match=r"stages\[1\] \('fused_tail'\): rules: fuse_tail: must be True or False, got 'false'"
    ):
        waits.load_plan(path)

    # An edit to the same file, even within the same second and at the same size, is seen.
    raw["stages"][1]["rules"]["fuse_tail"] = False
    unfused = json.dumps(raw)
    path.write_text(unfused)
    st = path.stat()
    assert waits.waits_per_token(bonsai, 2, plan=waits.load_plan(path)) == 97
    at = unfused.index('"fuse_tail": false', unfused.index('"fused_tail"'))  # stage 2's rule
    fused = unfused[:at] + '"fuse_tail":  true' + unfused[at + len('"fuse_tail": false') :]
    assert len(fused) == len(unfused)
    path.write_text(fused)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: only the content tells
    assert waits.waits_per_token(bonsai, 2, plan=waits.load_plan(path)) == 81

    for stage in (0, 2):
        bad = copy.deepcopy(raw)
        bad["stages"][stage]["costs"]["attention"] = -1
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=rf"stages\[{stage}\].*costs: attention: must be an integer >= 0, got -1"):
            waits.load_plan(path)
    bad = copy.deepcopy(raw)
    bad["stages"][3]["stage"] = 3
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"stages\[3\].*stage: stages must be numbered 1, 2, ... in order; got 3"):
        waits.load_plan(path)
    bad = copy.deepcopy(raw)
    del bad["stages"][0]["costs"]
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"stages\[0\] \('baseline'\): lacks \['costs'\]"):
        waits.load_plan(path)
    with pytest.raises(ValueError, match="does not exist"):
        waits.load_plan(tmp_path / "none.json")
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="not UTF-8"):
        waits.load_plan(path)


def test_loaded_plans_are_not_shared() -> None:
    # Each call reads the file afresh: a caller that changes its copy cannot change another's.
    a, b = waits.load_plan(), waits.load_plan()
    assert a == b and a is not b
    a.stages[0].costs["attention"] = 99
    assert waits.load_plan().stages[0].costs["attention"] == 3


def test_the_committed_plan_names_no_path_outside_the_project() -> None:
    assert "../" not in waits.PLAN_PATH.read_text()


def test_a_bool_is_not_a_stage() -> None:
    import numpy as np

    plan = waits.load_plan()
    assert plan.stage(np.int64(2)).key == "fused_tail"
    for bad in (True, np.bool_(True), 2.5, None):
        with pytest.raises(ValueError, match="stage"):
            plan.stage(bad)
