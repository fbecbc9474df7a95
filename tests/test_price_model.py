"""The price model: waits named by their kind, priced by kind, checked against the records."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest

from bench import split_price
from bench.common import decode_timing, timing
from workbench.decode import geometry, savings, schedule, state
from workbench.models.config import replace_layer
from workbench.models.loader import load_model
from workbench.reports import records
from workbench.reports import schedule_run as schedule_report
from workbench.waits import ledger as wait_ledger
from workbench.waits import plan as waits
from workbench.waits.measurement import JOINED_PHASES, SPLIT_PHASES, measure_split_between

BENCH = records.RECORD_DIR
#: The H200 records of the kernels step with compiled layers and split prices marked by read-back:
#: bf16's, whose clock the price model is held against here,
BF16 = BENCH / "schedule_run-nvidia-h200-20261201T030402Z.json"
#: and affine 4-bit's, the source of the ledger's bfloat16-affine4 split prices.
Q4 = BENCH / "schedule_run-nvidia-h200-20261201T030500Z.json"


@pytest.fixture(scope="module")
def bonsai():
    return load_model("bonsai-27b")


def test_the_kinds_of_a_token_sum_to_its_waits(bonsai):
    for name in ("bonsai-27b", "qwen3.5-9b", "qwen3-next-80b-a3b", "nemotron-h-8b"):
        cfg = load_model(name)
        for st in waits.load_plan().stages:
            kinds = waits.split_kinds(cfg, st)
            assert sum(kinds.values()) == waits.waits_per_token(cfg, st)
            assert kinds[waits.FINAL_SPLIT] == 1
            for k in kinds:
                assert waits.check_split_kind("k", k) == k


def test_each_pair_removes_the_kinds_the_plan_says(bonsai):
    s = lambda a, b: waits.model_saving(bonsai, a, b, {}, 1.0)  # noqa: E731
    # The fusion: the unfused tail's own wait, and the host's read of x after its FFN.
    assert s(1, 2)["removed"] == {"wo>host|ffn": 16, "ffn>host|layer": 15, "ffn>host|logits": 1}
    assert s(1, 2)["added"] == {"ffn|layer": 15, "ffn|logits": 1}
    assert s(2, 3)["removed"] == {"layer|qkv": 16} and not s(2, 3)["added"]
    assert s(3, 4)["removed"] == {"ffn|layer": 15, "ffn|logits": 1}
    assert s(4, 5)["removed"] == {"layer|layer": 32}
    assert s(5, 6)["removed"] == {"qkv>host|wo": 16}
    # With every kind at one price the model is the flat table: waits saved x price.
    for a, b in ((1, 2), (2, 3), (1, 5)):
        assert s(a, b)["ms"] == pytest.approx(waits.waits_per_token(bonsai, a) - waits.waits_per_token(bonsai, b))


def test_a_refused_layer_keeps_its_kinds():
    cfg = replace_layer(load_model("bonsai-27b"), 7, o_bias=True)
    kinds = waits.split_kinds(cfg, 2)
    assert kinds["wo>host|ffn"] == 1 and sum(kinds.values()) == waits.waits_per_token(cfg, 2)


def test_priced_waits_and_the_table_column(bonsai):
    prices = {"layer|layer": 0.3, "wo>host|ffn": 0.1}
    p = waits.priced_waits(bonsai, 1, prices, 0.02)
    assert p["by_kind"]["layer|layer"] == (32, 0.3) and p["by_kind"]["layer|qkv"] == (16, 0.02)
    assert "layer|qkv" in p["unpriced"] and "layer|layer" not in p["unpriced"]
    assert p["ms"] == pytest.approx(32 * 0.3 + 16 * 0.1 + (97 - 48) * 0.02)
    table = waits.wait_table(bonsai, price_ms=0.02, split_prices=prices)
    assert table["ms_split"].iloc[0] == pytest.approx(p["ms"])
    assert table["ms_saved_split"].iloc[4] == pytest.approx(32 * 0.3)  # 4 -> 5 removes the layer|layer waits
    assert table["ms"].tolist() == pytest.approx([w * 0.02 for w in (97, 81, 65, 49, 17, 1)])  # beside, unchanged
    assert "ms_split" not in waits.wait_table(bonsai).columns


def test_bad_split_kinds_and_prices(bonsai):
    for bad in ("wo", "wo|", "tail|layer", "layer>gpu|qkv", 3, None):
        with pytest.raises(ValueError, match="must be a split kind"):
            waits.check_split_kind("kind", bad)
    with pytest.raises(ValueError, match=r"split_prices\['layer\|layer'\]"):
        waits.priced_waits(bonsai, 1, {"layer|layer": "0.3"}, 0.02)
    with pytest.raises(ValueError, match="split_prices: must be a mapping"):
        waits.priced_waits(bonsai, 1, [0.3], 0.02)
    entry = dict(wait_ledger.load_ledger()[0], split="nope")
    with pytest.raises(ValueError, match="split: must be a split kind"):
        wait_ledger.check_entry(entry)


def test_the_ledger_holds_the_h200_split_prices():
    for dtype in ("bfloat16", "bfloat16-affine4"):
        prices = wait_ledger.ledger_split_prices("NVIDIA H200", "cuda", matvec="kernels", dtype=dtype)
        # every kind measured then (records before "qkv>host|wo" was measurable lack it)
        assert set(savings.MEASURED_SPLITS) - {"qkv>host|wo"} <= set(prices) <= set(savings.MEASURED_SPLITS)
        assert all(0 < v < 5 for v in prices.values())
    assert wait_ledger.ledger_split_prices("NVIDIA H200", "cuda", matvec="mlx") == {}


def test_split_entries_from_a_record(tmp_path):
    rec = records.load("schedule_run", BF16.name)
    entries = split_price.split_entries(rec, "data/bench/x.json")
    assert [e["split"] for e in entries] == [s["split"] for s in rec["splits"]]
    for e in entries:
        wait_ledger.check_entry(e)
        assert "--out" not in e["command"] and e["id"].startswith("split-cuda-nvidia-h200-kernels-bfloat16-")
    bad = records.load("schedule_run", BF16.name)
    bad["splits"][0]["ms"] = -0.01
    with pytest.raises(ValueError, match="'wo>host|ffn': its measured price is -0.0100 ms"):
        split_price.split_entries(bad, "x")
    with pytest.raises(ValueError, match="bench.schedule_run record"):
        split_price.split_entries({"bench": "wait_price"}, "x")
    # --add into a copy: every kind, then refused again without --force.
    ledger = tmp_path / "ledger.json"
    shutil.copy(wait_ledger.LEDGER_PATH, ledger)
    raw = json.loads(ledger.read_text())
    raw["prices"] = [e for e in raw["prices"] if "split" not in e]
    ledger.write_text(json.dumps(raw))
    split_price.main(["--add", str(Q4), "--ledger", str(ledger)])
    assert len(wait_ledger.ledger_split_prices("NVIDIA H200", "cuda", ledger, dtype="bfloat16-affine4")) == 7
    with pytest.raises(SystemExit):
        split_price.main(["--add", str(Q4), "--ledger", str(ledger)])


def test_measure_split_between_on_the_cpu():
    x = mx.ones((64,))
    mx.eval(x)
    r = measure_split_between(
        lambda a: (a * 2.0, a + 1), lambda t: t[0] - 1.0, x, n=6, warmup=1, read_first=lambda out: out[:1]
    )
    assert set(r["phases_ms"]) == set(SPLIT_PHASES + JOINED_PHASES)
    assert r["split_ms"] > 0 and r["joined_ms"] > 0 and r["n"] == 6 and "median over 6 rounds" in r["method"]
    with pytest.raises(ValueError, match="second: must be a callable"):
        measure_split_between(lambda a: a, None, x)
    with pytest.raises(ValueError, match="n: must be"):
        measure_split_between(lambda a: a, lambda a: a, x, n=2)


def test_the_kernels_records_as_tables():
    recs = schedule_report.kernel_records(schedule_report.load_records())
    assert len(recs) >= 2 and all(r["check"]["passed"] and r["all_waits_match"] for r in recs)
    rec = records.load("schedule_run", BF16.name)
    clock = schedule_report.clock_table(rec)
    assert clock["waits"].tolist() == [97, 81, 65, 49, 17, 1]
    assert (clock["x_floor"] == clock["ms"] / rec["floor_ms"]).all()
    assert (clock["in_eval_ms"] + clock["host_ms"] > 0).all()
    pairs = schedule_report.pair_table(rec)
    same = pairs[pairs["same_work"]]
    assert len(same) == 7 and same["model_ms"].notna().all()
    splits = schedule_report.split_table(rec)
    assert splits["split"].tolist() == [s["split"] for s in rec["splits"]]
    # the first CPU schedule record: made before the bench measured a floor or split prices
    first = records.load("schedule_run", "schedule-cpu.json")
    with pytest.raises(ValueError, match="with a floor"):
        schedule_report.clock_table(first)
    with pytest.raises(ValueError, match="with split prices"):
        schedule_report.split_table(first)
    with pytest.raises(records.RecordError, match="rec: names no kind"):
        schedule_report.clock_table({"stages": []})


def test_a_pairs_measured_saving_comes_with_its_interval():
    rng = np.random.default_rng(4)
    a = 10 + rng.normal(0, 1, 400)
    b = a - 2 + rng.normal(0, 0.2, 400)  # each pair ran together: the saving is 2, the noise small
    lo, hi = schedule_report.paired_interval(a.tolist(), b.tolist())
    med = float(np.median(a - b))
    assert lo <= med <= hi and hi - lo < 0.1 and abs(med - 2) < 0.05
    assert schedule_report.paired_interval(a.tolist(), b.tolist()) == (lo, hi)  # seeded: the same every time
    assert schedule_report.paired_interval(None, b.tolist()) == (None, None)
    assert schedule_report.paired_interval(a[:3].tolist(), b.tolist()) == (None, None)
    wide = schedule_report.paired_interval(a[:8].tolist(), (a[:8] - 2 + rng.normal(0, 3, 8)).tolist())
    assert wide[1] - wide[0] > 1  # eight noisy tokens: the interval says the noise decides
    # In a record: the interval sits beside the measured saving, and says whether it settles the verdict
    rec = records.load("schedule_run", "schedule_run-nvidia-h200-20261202T174651Z.json")
    pairs = schedule_report.pair_table(rec).set_index(["from", "to"])
    assert (pairs["measured_lo_ms"] <= pairs["measured_ms"]).all() and (
        pairs["measured_ms"] <= pairs["measured_hi_ms"]
    ).all()
    assert pairs.loc[(1, 2), "noise_decided"] and not pairs.loc[(1, 2), "model_within"]
    assert not pairs.loc[(2, 3), "noise_decided"]
    verdict = schedule_report.pair_verdicts(rec)
    assert verdict["pairs"] == 4 and verdict["settled"] == 3 and verdict["settled_within"] == 0
    assert verdict["settled_ratio_min"] == pytest.approx(pairs.loc[(3, 4), "ratio_model"])
    assert verdict["settled_ratio_max"] == pytest.approx(pairs.loc[(1, 2), "ratio_model"])


def test_a_saving_splits_into_the_kernels_change_and_the_idle_time():
    """With every stage's device time a token in the record, each saving is the kernels'
    change plus the idle time the removed waits took; the model is judged on the latter."""
    import copy

    rec = copy.deepcopy(records.load("schedule_run", "schedule_run-nvidia-h200-20261202T174651Z.json"))
    base = schedule_report.pair_table(rec).set_index(["from", "to"])
    assert base["idle_saved_ms"].isna().all() and base["device_saved_ms"].isna().all()
    with pytest.raises(ValueError, match="saving: 'idle' needs a record profiled at every stage"):
        schedule_report.pair_verdicts(rec, saving="idle")
    with pytest.raises(ValueError, match="saving"):
        schedule_report.pair_verdicts(rec, saving="wall")
    # kernels 2 ms a token slower at every later stage: each adjacent saving's idle part is 2 ms larger
    for i, r in enumerate(rec["stages"]):
        r["device_ms_per_token"] = 15.0 + 2 * i
    t = schedule_report.pair_table(rec).set_index(["from", "to"])
    assert (t["measured_ms"] == base["measured_ms"]).all()
    assert t.loc[(4, 5), "device_saved_ms"] == pytest.approx(-2.0)
    assert t.loc[(1, 4), "device_saved_ms"] == pytest.approx(-6.0)
    assert (t["idle_saved_ms"] == t["measured_ms"] - t["device_saved_ms"]).all()
    assert t.loc[(3, 4), "ratio_model_idle"] == pytest.approx(
        t.loc[(3, 4), "idle_saved_ms"] / t.loc[(3, 4), "model_ms"]
    )
    # the model's saving at 3 -> 4 is 1.61 ms, the clock's 0.93 (0.72-1.18): with 2 ms of kernel time added
    # the idle part is 2.93 (2.72-3.18): settled, and outside the band the other way
    assert not t.loc[(3, 4), "model_within"] and t.loc[(3, 4), "ratio_model_idle"] > 1.2
    assert t.loc[(3, 4), "idle_noise_decided"]
    v = schedule_report.pair_verdicts(rec, saving="idle")
    assert v["pairs"] == 4 and v["settled"] <= 4


def test_the_models_interval_resamples_each_kinds_rounds():
    steady = {"a": [0.1] * 30, "b": [0.2] * 30}
    assert savings.model_interval({"a": 16, "b": -15}, steady) == pytest.approx((16 * 0.1 - 15 * 0.2,) * 2)
    assert savings.model_interval({"a": 2}, steady, fixed_ms=1.0) == pytest.approx((1.2, 1.2))
    rng = np.random.default_rng(1)
    noisy = {"a": (0.1 + rng.normal(0, 0.1, 30)).tolist()}
    lo, hi = savings.model_interval({"a": 16}, noisy)
    assert lo < 16 * np.median(noisy["a"]) < hi and hi - lo > 0.2  # sixteen noisy prices: a wide interval
    assert savings.model_interval({"a": 16}, noisy) == (lo, hi)  # seeded
    assert savings.model_interval({"c": 1}, noisy) is None  # a kind without rounds: no interval
    # a record from before the rounds were kept: the pair table says nothing about the model's interval
    t = schedule_report.pair_table(records.load("schedule_run", "schedule_run-nvidia-h200-20261203T171315Z.json"))
    assert t["model_lo_ms"].isna().all() and t["both_decided"].isna().all()


def test_measure_splits_on_a_small_step(bonsai):
    geom = geometry.Geometry(
        hidden=32,
        ffn=48,
        n_q=4,
        n_kv=1,
        head_dim=8,
        attn_output_gate=True,
        gdn_k_heads=2,
        gdn_v_heads=4,
        gdn_k_dim=8,
        gdn_v_dim=8,
        conv_kernel=4,
        vocab=64,
    )
    sched = schedule.Schedule(bonsai, state.HybridWeights(bonsai, geom, seed=3, share=True))
    rows = decode_timing.measure_splits(sched, n=5, warmup=1, context=4)
    assert [r["split"] for r in rows] == list(savings.MEASURED_SPLITS)
    assert all(r["device_ms"]["first"] is not None and "phases_ms" in r for r in rows)
    with pytest.raises(ValueError, match="cannot be built"):
        decode_timing.measure_splits(sched, ["qkv>host|layer"], n=5)
    assert timing.copy_bandwidth(1 << 24, repeats=3, chain=4) > 0  # 16 MB: each copy well above a loaded clock's noise


def test_one_stage_of_several_records_side_by_side():
    rec = records.load("schedule_run", BF16.name)
    other = records.load("schedule_run", BF16.name)
    other["stages"] = [dict(s, ms_median=2 * s["ms_median"]) for s in other["stages"]]
    table = schedule_report.stage_comparison({"as run": rec, "twice as slow": other}, stage=6)
    assert table["run"].tolist() == ["as run", "twice as slow"]
    six = schedule_report.clock_table(rec).set_index("stage").loc[6]
    assert table["stage 6 ms"].tolist() == [six["ms"], 2 * six["ms"]]
    assert table["check"][0] == max(c["worst_scaled_error"] for c in rec["check"]["stages"])
    assert table["passed"].all()
    with pytest.raises(ValueError, match="has no stage 7"):
        schedule_report.stage_comparison({"as run": rec}, stage=7)
    with pytest.raises(ValueError, match="runs: must be a non-empty mapping"):
        schedule_report.stage_comparison({})


def test_the_in_token_prices_sit_beside_the_prices_alone():
    rec = records.load("schedule_run", "schedule_run-nvidia-h200-20261203T191426Z.json")
    t = schedule_report.in_token_table(rec)
    assert list(t.index) == list(rec["in_token_prices"])
    alone = {s["split"]: s["ms"] for s in rec["splits"]}
    for kind, row in t.iterrows():
        p = rec["in_token_prices"][kind]
        assert row["alone_ms"] == alone[kind] and row["in_token_ms"] == p["ms"]
        assert row["lo_ms"] <= row["in_token_ms"] <= row["hi_ms"] and row["count"] >= 1
    with pytest.raises(ValueError, match="has no in-token prices"):
        schedule_report.in_token_table(records.load("schedule_run", "schedule_run-nvidia-h200-20261203T171315Z.json"))
