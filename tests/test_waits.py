"""The resident-state plan's wait counts, the table, the ledger and the wait price."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.models.config import LayerConfig, Mixer, ModelConfig, replace_layer
from workbench.models.loader import load_model
from workbench.reports import schedule_run as schedule_report
from workbench.waits import ledger as wait_ledger
from workbench.waits import plan as waits
from workbench.waits.measurement import count_waits, measure_split_price, measure_wait_price

BONSAI = [97, 81, 65, 49, 17, 1]  # design.md: 97, 81, 65, 49, 17; the device floor 1
BONSAI_MS = [16.49, 13.77, 11.05, 8.33, 2.89, 0.17]  # at frink-models' 0.17 ms


@pytest.fixture(scope="module")
def bonsai():
    return load_model("bonsai-27b")


def test_bonsai_waits_per_stage(bonsai):
    assert [waits.waits_per_token(bonsai, s) for s in range(1, 7)] == BONSAI
    assert waits.eligible_layers(bonsai) == tuple(range(3, 64, 4))


def test_qwen35_9b_by_hand():
    cfg = load_model("qwen3.5-9b")
    attn = cfg.attention_layers()
    assert cfg.num_layers == 32 and attn == list(range(3, 32, 4))
    n_attn, n_rec = 8, 24
    logits = 1
    by_hand = [
        n_rec * 1 + n_attn * 3 + logits,  # 1: QKV, wo, FFN each a submission: 49
        n_rec * 1 + n_attn * 2 + logits,  # 2: QKV; wo + FFN: 41
        n_rec * 1 + n_attn * 1 + logits,  # 3: QKV rides on the recurrent layer before: 33
        n_rec * 1 + n_attn * 0 + logits,  # 4: the tail rides on the one after: 25
        n_attn * 1 + logits,  # 5: runs of three recurrent layers, each ending in a QKV: 9
        1,  # 6: everything on the device: 1
    ]
    assert by_hand == [49, 41, 33, 25, 9, 1]
    assert [waits.waits_per_token(cfg, s) for s in range(1, 7)] == by_hand


def test_a_refused_layer_keeps_its_waits(bonsai):
    # An output bias on layer 7's wo: frink-models refuses it (O_BIAS).
    cfg = replace_layer(bonsai, 7, o_bias=True)
    assert 7 not in waits.eligible_layers(cfg)
    got = [waits.waits_per_token(cfg, s) for s in range(1, 7)]
    # Stage 1 is unchanged; from stage 2 on, layer 7 costs 3 where an eligible layer costs
    # 2, 1, 0, and at the floor 3 (QKV at the run's end, wo, FFN) where eligible costs 1.
    assert got == [97, 81 + 1, 65 + 2, 49 + 3, 17 + 2, 1]
    for s in range(2, 6):
        subs = waits.submissions(cfg, s)
        assert (waits.Piece("wo", 7),) in subs and (waits.Piece("ffn", 7),) in subs
    assert (waits.Piece("qkv", 7),) in waits.submissions(cfg, 4)


def test_every_layer_refused_changes_nothing_before_the_floor():
    cfg = load_model("qwen3-next-80b-a3b")  # routed experts at every attention layer: NO_DENSE_FFN
    assert waits.eligible_layers(cfg) == ()
    got = [waits.waits_per_token(cfg, s) for s in range(1, 7)]
    assert got[:4] == [36 + 12 * 3 + 1] * 4
    assert got[4] == 12 * 3 + 1 and got[5] == 1


@pytest.mark.parametrize(
    "name", ["bonsai-27b", "qwen3.5-9b", "qwen3-next-80b-a3b", "granite-4.0-h-micro", "jamba-v0.1"]
)
@pytest.mark.parametrize("stage", range(1, 7))
def test_the_walk_says_what_the_rule_says(name, stage):
    """Every shipped hybrid whose attention layers have FFNs and recurrent neighbours."""
    cfg = load_model(name)
    assert waits.waits_per_token(cfg, stage) == waits.waits_by_rule(cfg, stage)


def test_nemotron_attention_without_ffn_costs_two():
    cfg = load_model("nemotron-h-8b")  # 52 blocks, 4 attention blocks with no FFN (refused: NO_FFN)
    assert len(cfg.attention_layers()) == 4
    assert waits.waits_per_token(cfg, 1) == 48 + 4 * 2 + 1
    assert waits.waits_per_token(cfg, 5) == 4 * 2 + 1


@pytest.mark.parametrize("name", ["bonsai-27b", "jamba-v0.1", "nemotron-h-8b", "llama-3.1-8b", "granite-4.0-h-micro"])
@pytest.mark.parametrize("stage", range(1, 7))
def test_every_piece_once_in_order(name, stage):
    cfg = load_model(name)
    flat = [p for sub in waits.submissions(cfg, stage) for p in sub]
    assert len(flat) == len(set(flat))
    layers = [p.layer for p in flat if p.layer is not None]
    assert layers == sorted(layers)  # the token's order is kept
    assert flat[-1] == waits.Piece("logits")


def _pattern_cfg(kinds: list[bool]) -> ModelConfig:
    layers = tuple(
        LayerConfig(i, Mixer.ATTENTION, 4, 1, 8, 16, "dense", "swiglu")
        if a
        else LayerConfig(i, Mixer.LINEAR_ATTENTION, ffn_dim=16, ffn_kind="dense", ffn_act="swiglu")
        for i, a in enumerate(kinds)
    )
    return ModelConfig("pattern", "synthetic", 32, len(layers), 1e-6, layers)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=24), st.data())
def test_stages_only_ever_save(kinds, data):
    cfg = _pattern_cfg(kinds)
    attn = cfg.attention_layers()
    ok = data.draw(st.sets(st.sampled_from(attn))) if attn else set()
    counts = [waits.waits_per_token(cfg, s, eligible=ok) for s in range(1, 7)]
    assert counts == sorted(counts, reverse=True)
    n_attn, n_rec = len(attn), len(kinds) - len(attn)
    assert counts[0] == n_rec + 3 * n_attn + 1
    assert counts[1] == n_rec + 3 * n_attn - len(ok) + 1
    assert counts[4] == len(ok) + 3 * (n_attn - len(ok)) + 1  # the floor: one per host need
    assert counts[5] == 1


def test_table_bonsai_at_the_seed_price(bonsai):
    df = waits.wait_table(bonsai)
    assert df["waits"].tolist() == BONSAI
    assert df["ms"].round(2).tolist() == BONSAI_MS
    assert df["saved"].tolist() == [0, 16, 16, 16, 32, 16]
    assert df["saved_total"].tolist() == [0, 16, 32, 48, 80, 96]
    assert df["ms_saved"].round(2).tolist() == [0.0, 2.72, 2.72, 2.72, 5.44, 2.72]
    assert df["floor"].tolist() == [False] * 4 + [True] * 2


def test_table_with_a_price_and_the_ledger(bonsai):
    df = waits.wait_table(bonsai, price_ms=0.03, ledger=wait_ledger.LEDGER_PATH)
    assert df["ms"].round(2).tolist() == [round(w * 0.03, 2) for w in BONSAI]
    assert df["ms@seed-metal"].round(2).tolist() == BONSAI_MS
    with pytest.raises(ValueError, match="price_ms"):
        waits.wait_table(bonsai, price_ms=0)


def test_unknown_stage_and_bad_eligible(bonsai):
    with pytest.raises(ValueError, match="stage"):
        waits.waits_per_token(bonsai, 9)
    with pytest.raises(ValueError, match="eligible"):
        waits.waits_per_token(bonsai, 2, eligible=[0])
    assert waits.load_plan().stage("fused_tail").number == 2


def test_plan_states_its_rules():
    plan = waits.load_plan()
    assert [s.costs["attention"] for s in plan.stages] == [3, 2, 1, 0, 1, 0]
    assert all(s.costs["attention_refused"] == 3 for s in plan.stages[:5])
    assert all(s.costs["logits"] == 1 for s in plan.stages)
    assert plan.assumptions and all(s.changes for s in plan.stages)


def test_ledger(tmp_path):
    entries = wait_ledger.load_ledger()
    assert wait_ledger.ledger_price("seed-metal") == 0.17
    measured = [e for e in entries if e["kind"] == "measured"]
    assert any(e["backend"] == "cpu" for e in measured), "the CPU price is measured into the ledger"
    for e in measured:
        assert {"device", "date", "mlx_version", "method", "ms"} <= set(e)
    for e in entries:
        assert e["method"] and ("source" in e)
    with pytest.raises(ValueError, match="entry_id"):
        wait_ledger.ledger_price("nope")
    path = tmp_path / "ledger.json"
    shutil.copy(wait_ledger.LEDGER_PATH, path)
    entry = {"id": "x", "kind": "published", "ms": 0.5, "device": "d", "backend": "cpu", "method": "m", "source": "s"}
    assert wait_ledger.add_price(entry, path) is None
    with pytest.raises(ValueError, match="already in"):  # a price is never replaced unasked
        wait_ledger.add_price({**entry, "ms": 0.25}, path)
    assert wait_ledger.ledger_price("x", path) == 0.5
    assert wait_ledger.add_price({**entry, "ms": 0.25}, path, replace=True) == entry  # the replaced entry, to report
    assert wait_ledger.ledger_price("x", path) == 0.25
    assert len(json.loads(path.read_text())["prices"]) == len(entries) + 1
    with pytest.raises(ValueError, match="entry"):
        wait_ledger.add_price({"id": "y"}, path)


def test_measure_wait_price_on_this_cpu():
    import mlx.core as mx

    rec = measure_wait_price(mx.cpu, n=50, warmup=5)
    assert rec["backend"] == "cpu" and rec["n"] == 50
    assert 0 < rec["p10_ms"] <= rec["ms"] <= rec["p90_ms"]
    assert rec["mlx_version"] == mx.__version__ and rec["method"]
    with pytest.raises(ValueError, match="n"):
        measure_wait_price(n=1)


def test_wait_share():
    # 17 waits at 0.17 ms against 1 GB at 1000 GB/s (1 ms): 2.89 / 3.89.
    assert waits.wait_share(17, 0.17, 1e9, 1000) == pytest.approx(2.89 / 3.89)
    assert waits.wait_share(0, 0.17, 1e9, 1000) == 0
    with pytest.raises(ValueError, match="bandwidth"):
        waits.wait_share(1, 0.1, 1e9, 0)


def test_waits_by_model_shows_refusals():
    names = ["bonsai-27b", "qwen3.5-9b", "qwen3-next-80b-a3b", "granite-4.0-h-micro", "nemotron-h-8b", "jamba-v0.1"]
    df = waits.waits_by_model(load_model(n) for n in names).set_index("model")
    assert df.loc["bonsai-27b", [str(s) for s in range(1, 7)]].tolist() == BONSAI
    assert df.loc["qwen3.5-9b", "refused"] == 0 and df.loc["qwen3.5-9b", "reasons"] == "-"
    assert df.loc["qwen3-next-80b-a3b", "refused"] == 12 and "NO_DENSE_FFN" in df.loc["qwen3-next-80b-a3b", "reasons"]
    assert "RESIDUAL_SCALE" in df.loc["granite-4.0-h-micro", "reasons"]
    assert "NO_FFN" in df.loc["nemotron-h-8b", "reasons"]
    assert df.loc["jamba-v0.1", "fused"] == 4


def test_figures_draw():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workbench.reports import plots

    cfg = load_model("bonsai-27b")
    for fig in (
        plots.plot_stage_ms(cfg, {"seed": 0.17}),
        plots.plot_wait_share(cfg, prices_ms=[0.01, 0.1]),
        plots.plot_schedule_runs(schedule_report.load_records()),
    ):
        assert fig.axes
        plt.close(fig)
    with pytest.raises(ValueError, match="prices"):
        plots.plot_stage_ms(cfg, {})


def test_the_wait_price_bench(tmp_path):
    """The command the H200 runs, as it runs it (from the project root), at a tiny size."""
    import subprocess
    import sys

    root = wait_ledger.LEDGER_PATH.parent.parent.parent
    out, ledger = tmp_path / "rec.json", tmp_path / "ledger.json"
    shutil.copy(wait_ledger.LEDGER_PATH, ledger)

    def run(*args):
        done = subprocess.run(
            [sys.executable, "-m", "bench.wait_price", *args], cwd=root, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr

    run("--n", "20", "--warmup", "2", "--device", "cpu", "--out", str(out))
    rec = json.loads(out.read_text())
    assert rec["ms"] > 0 and rec["command"].startswith("python -m bench.wait_price")
    run("--add", str(out), "--ledger", str(ledger), "--force")  # this machine may already have an entry
    # The entry this record became, by the id the bench derives from it (the committed
    # ledger already holds other machines' CPU entries; this machine's may be one of them).
    from bench.wait_price import ledger_entry

    entry_id = ledger_entry(rec)["id"]
    entry = next(e for e in wait_ledger.load_ledger(ledger) if e["id"] == entry_id)
    assert entry["ms"] == rec["ms"] and entry["method"] and entry["command"]


def test_piece_validates():
    assert str(waits.Piece("qkv", 3)) == "qkv3" and str(waits.Piece("logits")) == "logits"
    with pytest.raises(ValueError, match="kind"):
        waits.Piece("softmax", 1)
    with pytest.raises(ValueError, match="layer"):
        waits.Piece("qkv")


def test_split_price_counts_one_wait_more_and_prices_it() -> None:
    import mlx.core as mx

    x = mx.ones((64,))
    with count_waits() as split_waits:
        np.asarray(mx.array(np.asarray(x + 1)) + 1)
    with count_waits() as joined_waits:
        np.asarray((x + 1) + 1)
    assert (split_waits.n, joined_waits.n) == (2, 1)  # what the two halves of the measure cost

    r = measure_split_price(lambda a: a * 0.5 + 1.0, x, n=20, warmup=2)
    assert set(r) >= {"ms", "p10_ms", "p90_ms", "split_ms", "joined_ms", "n"}
    assert r["split_ms"] > 0 and r["joined_ms"] > 0 and r["p10_ms"] <= r["ms"] <= r["p90_ms"]
    with pytest.raises(ValueError, match="n: must be an integer >= 5"):
        measure_split_price(lambda a: a, x, n=2)


def test_split_price_bench_runs_small(tmp_path) -> None:
    from bench import split_price

    rec = split_price.main(["--n", "5", "--out-dir", str(tmp_path)])
    steps = [r["step"] for r in rec["results"]]
    assert steps[:3] == ["tiny wait (measure_wait_price)", "tiny", "tail-graph"]
    assert rec["command"].startswith("python -m bench.split_price --n 5")
    (path,) = tmp_path.glob("split_price-*.json")  # split_price-<device>-<UTC time>.json
    assert json.loads(path.read_text())["command"] == rec["command"]


@pytest.mark.parametrize(
    "stage,kind,count",
    [
        (1, "layer|layer", 8),
        (1, "wo>host|ffn", 4),
        (1, "ffn>host|layer", 3),
        (2, "ffn|layer", 5),
        (4, "layer|layer", 32),
    ],
)
def test_joining_a_share_of_one_kind_of_wait(bonsai, stage, kind, count):
    """join_splits removes exactly ``count`` waits of ``kind``, spread over the token, and
    changes nothing else: the same pieces in order, every other kind of wait as many."""
    subs = waits.submissions(bonsai, stage)
    joined = waits.join_splits(subs, kind, count)
    assert [p for s in joined for p in s] == [p for s in subs for p in s]
    assert len(joined) == len(subs) - count
    before = waits.split_kinds(bonsai, stage)
    after: dict[str, int] = {}
    for a, b in zip(joined, joined[1:]):
        k = waits.split_kind(a[-1], b[0])
        after[k] = after.get(k, 0) + 1
    assert after.get(kind, 0) == before[kind] - count
    assert {k: v for k, v in after.items() if k != kind} == {
        k: v for k, v in before.items() if k not in (kind, "logits|host")
    }
    # spread: the joined waits fall in the first and the last half of the token alike
    gone = [i for i, s in enumerate(joined) if len(s) > max(len(t) for t in subs)] if stage == 1 else []
    if len(gone) >= 2:
        assert gone[0] < len(joined) // 2 <= gone[-1]


def test_joining_refuses_what_a_token_cannot_join(bonsai):
    subs = waits.submissions(bonsai, 1)
    with pytest.raises(ValueError, match="cannot be joined: the host attends"):
        waits.join_splits(subs, "qkv>host|wo", 1)
    with pytest.raises(ValueError, match="count: the token has 16 waits of kind 'layer\\|qkv', got 17"):
        waits.join_splits(subs, "layer|qkv", 17)
    with pytest.raises(ValueError, match="count"):
        waits.join_splits(subs, "layer|qkv", 0)
    with pytest.raises(ValueError, match="kind"):
        waits.join_splits(subs, "layer-layer", 1)
