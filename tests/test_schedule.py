"""The schedule makes exactly the waits the table predicts, and every stage computes the same token."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from bench.common.stages import run_stages
from workbench import tail
from workbench.decode import savings
from workbench.decode.geometry import Geometry, geometry_of
from workbench.decode.layers import fast_gdn_available, gated_delta_ops
from workbench.decode.savings import MEASURED_SPLITS, compare_savings, fit_price
from workbench.decode.schedule import Schedule, in_token_probes
from workbench.decode.state import HybridWeights, new_state
from workbench.models.config import replace_layer
from workbench.models.loader import load_model
from workbench.reports import schedule_run as schedule_report
from workbench.tail.comparison import compare
from workbench.waits import ledger as wait_ledger
from workbench.waits import plan as waits
from workbench.waits.measurement import count_waits

#: Bonsai's 64-layer pattern at toy widths: the waits a token are Bonsai's, the work tiny.
TINY = Geometry(
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


@pytest.fixture(scope="module")
def bonsai():
    return load_model("bonsai-27b")


@pytest.fixture(scope="module")
def tiny(bonsai):
    w = HybridWeights(bonsai, TINY, seed=3)
    return Schedule(bonsai, w)


@pytest.fixture(scope="module")
def decoded(tiny):
    """Three tokens at every stage, each from the same start."""
    out = {}
    for n in range(1, 7):
        st = new_state(tiny.w, context=4, max_new=8)
        out[n] = [tiny.step(st, n) for _ in range(3)]
    return out


def test_the_schedule_makes_the_predicted_waits(bonsai, decoded):
    for n, results in decoded.items():
        assert [r.waits for r in results] == [waits.waits_per_token(bonsai, n)] * 3


@pytest.mark.parametrize("stage", range(1, 7))
def test_count_waits_sees_the_same(tiny, bonsai, stage):
    """An independent count: count_waits sees every evaluation and host read MLX does."""
    st = new_state(tiny.w, context=4, max_new=4)
    tiny.step(st, stage)  # the first token builds caches; count the second
    with count_waits() as wc:
        res = tiny.step(st, stage)
    assert wc.n == res.waits == waits.waits_per_token(bonsai, stage)


def test_every_stage_computes_the_same_tokens(decoded):
    ref = decoded[1]
    for n in range(2, 6):  # the same ops on the same values, only the waits move: bit for bit
        for a, b in zip(ref, decoded[n]):
            assert a.next_token == b.next_token
            np.testing.assert_array_equal(a.logits, b.logits)
    # The device floor runs the attention in MLX rather than numpy: float32 rounding apart.
    # Metric: max |difference| over the logits, against 1e-4 x their scale.
    for a, b in zip(ref, decoded[6]):
        assert np.abs(a.logits - b.logits).max() <= 1e-4 * max(1.0, np.abs(a.logits).max())


def test_a_refused_layer_is_scheduled_as_counted(bonsai):
    cfg = replace_layer(bonsai, 7, o_bias=True)
    sched = Schedule(cfg, HybridWeights(cfg, TINY, seed=3))
    assert 7 not in sched.eligible
    for n in range(1, 7):
        st = new_state(sched.w, context=4, max_new=2)
        assert sched.step(st, n).waits == waits.waits_per_token(cfg, n)


def test_the_schedules_tail_is_the_oracles(tiny):
    """Stage 2's fused tail piece against tail.host_tail (float64), frink-models' criterion."""
    lw = tiny.w.layers[3].w
    assert tiny.w.layers[3].kind == "attention"
    tw = tail.TailWeights.from_arrays(
        np.array(lw["wo"]),
        np.array(lw["ffn_norm"]),
        np.array(lw["gate"]),
        np.array(lw["up"]),
        np.array(lw["down"]),
        eps=TINY.eps,
    )
    rng = np.random.default_rng(0)
    branch = rng.uniform(-1, 1, TINY.branch).astype(np.float32)
    residual = rng.uniform(-1, 1, TINY.hidden).astype(np.float32)
    x = tiny.mv.out_add(lw, "wo", mx.array(branch), mx.array(residual))
    got = np.array(tiny.mv.ffn(lw, x))
    want = tail.host_tail(tw, branch, residual)
    # |x - y| <= 2e-4 max(|y|, 1): float32 device against the float64 host (frink-models' test).
    assert compare(got, want).passed


def test_gated_delta_ops_is_the_fast_op():
    rng = np.random.default_rng(1)
    hk, hv, dk, dv = 2, 6, 8, 4
    a = lambda *s: mx.array(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    q, k, v = a(1, 1, hk, dk), a(1, 1, hk, dk), a(1, 1, hv, dv)
    g = mx.array(rng.uniform(0.5, 1, (1, 1, hv)).astype(np.float32))
    b = mx.array(rng.uniform(0, 1, (1, 1, hv)).astype(np.float32))
    s0 = a(1, hv, dv, dk)
    o1, s1 = mx.fast.gated_delta_update(q, k, v, g, b, initial_state=s0)
    o2, s2 = gated_delta_ops(q, k, v, g, b, s0)
    # Same float32 arithmetic in a different order: max abs difference within 1e-5.
    np.testing.assert_allclose(np.array(o2), np.array(o1), atol=1e-5)
    np.testing.assert_allclose(np.array(s2), np.array(s1), atol=1e-5)
    assert fast_gdn_available()[0]


def test_ops_recurrence_decodes_the_same_tokens(tiny, decoded):
    ops = Schedule(tiny.cfg, tiny.w, gdn="ops")
    st = new_state(tiny.w, context=4, max_new=8)
    res = [ops.step(st, 5) for _ in range(3)]
    assert [r.next_token for r in res] == [r.next_token for r in decoded[5]]
    with pytest.raises(ValueError, match="gdn"):
        Schedule(tiny.cfg, tiny.w, gdn="nope")


def test_every_round_starts_from_the_same_state(tiny, monkeypatch):
    # Each round is the same work: its first token sees the start's context, not the
    # rounds before (the host's attention would cost more round by round otherwise).
    seen: list[tuple[int, int]] = []
    step = Schedule.step

    def spy(self, state, stage, **kw):
        seen.append((stage, state.length))
        return step(self, state, stage, **kw)

    monkeypatch.setattr(Schedule, "step", spy)
    run_stages(tiny, stages=[1, 6], tokens=3, rounds=4, warmup=2, context=4)
    timed = seen[4:]  # after two warm-up tokens a stage
    assert [length for _, length in timed] == [4, 5, 6] * 8
    assert [stage for stage, _ in timed] == ([1] * 3 + [6] * 3) * 4


def test_run_stages_record(tiny):
    rec = run_stages(tiny, stages=[1, 2, 5], tokens=1, rounds=2, warmup=1, context=4, price_ms=0.05)
    assert [r["stage"] for r in rec["stages"]] == [1, 2, 5] and rec["rounds_run"] == 2
    short = run_stages(tiny, stages=[1, 5], tokens=1, rounds=50, warmup=0, context=4, time_budget_s=0.0)
    assert short["rounds_run"] == 1  # the budget stops it after the first round
    assert all(r["waits_match"] and r["tokens"] == 2 for r in rec["stages"])
    comp = {(c["from"], c["to"]): c for c in rec["comparisons"]}
    assert comp[(1, 2)]["waits_saved"] == 16 and comp[(1, 2)]["ms_saved_predicted"] == pytest.approx(0.8)
    assert comp[(1, 5)]["waits_saved"] == 80
    fit = fit_price([{"waits_predicted": w, "ms_median": 1 + 0.02 * w} for w in (97, 49, 17)])
    assert fit["ms_per_wait"] == pytest.approx(0.02) and fit["intercept_ms"] == pytest.approx(1)


def test_the_measured_splits_are_the_kinds_the_stage_pairs_remove(bonsai):
    """The price model prices a pair of stages by the split kinds it removes: MEASURED_SPLITS names them all."""
    nums = [s.number for s in waits.load_plan().stages]
    removed = set()
    for a, b in zip(nums, nums[1:]):
        removed |= set(waits.model_saving(bonsai, a, b, {}, 1.0)["removed"])
    assert removed == set(MEASURED_SPLITS)


def test_geometry(bonsai):
    g = geometry_of(bonsai)
    assert (g.hidden, g.ffn, g.n_q, g.n_kv, g.head_dim, g.vocab) == (5120, 17408, 24, 4, 256, 248320)
    assert (g.gdn_k_heads, g.gdn_v_heads, g.gdn_k_dim, g.gdn_v_dim) == (16, 48, 128, 128)
    # Weights a token streams: 48 recurrent + 16 attention layers, ~24.3 G parameters without the head.
    n = 48 * g.layer_params("recurrent") + 16 * g.layer_params("attention")
    assert 24e9 < n < 25e9
    with pytest.raises(ValueError, match="cfg"):
        geometry_of(load_model("granite-4.0-h-micro"))  # Mamba-2, not Gated DeltaNet
    with pytest.raises(ValueError, match="n_q"):
        Geometry(**{**TINY.__dict__, "n_q": 3, "n_kv": 2})


def test_the_committed_records():
    recs = schedule_report.load_records()
    assert any(schedule_report.covers_plan(r) for r in recs) and not schedule_report.covers_plan(
        next(r for r in recs if r["file"].startswith("schedule_run-nvidia-h200-20261202T151247Z"))
    )
    assert any(r["backend"] == "cpu" for r in recs), "the CPU schedule record is committed"
    for rec in recs:
        assert rec["all_waits_match"], f"{rec['file']}: the schedule made other waits than the table"
        stages, comps = schedule_report.record_tables(rec)
        assert stages["waits_match"].all()
        assert {"device", "date", "mlx_version", "command"} <= set(rec)
        if not schedule_report.covers_plan(rec):  # a --stages run: no pairs across the plan to weigh
            assert rec["fit"] is None and len(rec["stages"]) < 6
            continue
        assert set(comps.columns) >= {"from", "to", "ms_saved_predicted", "ms_saved_measured"}
        c = schedule_report.closeness(rec)
        assert c["ms_saved_predicted_1_to_floor"] == pytest.approx(80 * rec["price"]["ms"])
        assert c["median_ratio"] is not None


def test_the_schedule_bench(tmp_path):
    """The command the H200 runs, as it runs it (from the project root), at a tiny size."""
    import json
    import subprocess
    import sys

    root = wait_ledger.LEDGER_PATH.parent.parent.parent
    out = tmp_path / "rec.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.schedule_run",
            "--stages",
            "1,5",
            "--tokens",
            "1",
            "--rounds",
            "1",
            "--warmup",
            "0",
            "--price-n",
            "50",
            "--vocab",
            "256",
            "--out",
            str(out),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rec = json.loads(out.read_text())
    assert rec["all_waits_match"] and [r["waits_made"] for r in rec["stages"]] == [[97], [17]]
    assert rec["gdn"] == "mx.fast.gated_delta_update" and rec["eligible"] == list(range(3, 64, 4))


def test_bad_arguments_are_named(bonsai, tiny):
    with pytest.raises(ValueError, match="dtype: must be one of"):
        HybridWeights(bonsai, TINY, dtype="int8")
    with pytest.raises(ValueError, match="seed: must be an integer >= 0"):
        HybridWeights(bonsai, TINY, seed=-1)
    with pytest.raises(ValueError, match="geom: must be a Geometry"):
        HybridWeights(bonsai, {"hidden": 32})
    with pytest.raises(ValueError, match="weights: must be HybridWeights"):
        Schedule(bonsai, "w")
    with pytest.raises(ValueError, match="plan: must be None or a Plan"):
        Schedule(bonsai, tiny.w, plan="gdn-resident-state")
    with pytest.raises(ValueError, match="eligible: layers \\[0\\] are not attention layers"):
        Schedule(bonsai, tiny.w, eligible=[0])
    with pytest.raises(ValueError, match="context: must be an integer >= 1"):
        new_state(tiny.w, context=0)
    with pytest.raises(ValueError, match="wts: must be HybridWeights"):
        new_state("w")
    with pytest.raises(ValueError, match="sched: must be a Schedule"):
        run_stages("s")
    for kw, field in [
        ({"tokens": 0}, "tokens"),
        ({"rounds": 2.0}, "rounds"),
        ({"warmup": -1}, "warmup"),
        ({"price_ms": float("nan")}, "price_ms"),
        ({"progress": 3}, "progress"),
        ({"stages": [1, 1]}, "stages"),
        ({"stages": [9]}, "stage"),
    ]:
        with pytest.raises(ValueError, match=field):
            run_stages(tiny, **kw)


def test_foreign_records_and_rows_are_named():
    for bad in ({}, [], "schedule-cpu.json", {"stages": [], "comparisons": []}):
        with pytest.raises(ValueError, match="rec"):
            schedule_report.record_tables(bad)
        with pytest.raises(ValueError, match="rec"):
            schedule_report.closeness(bad)
    with pytest.raises(ValueError, match=r"rows\[0\]: lacks \['ms_median'\]"):
        fit_price([{"waits_predicted": 3}])
    with pytest.raises(ValueError, match="rows: must be a non-empty list"):
        compare_savings([], 0.1)
    with pytest.raises(ValueError, match="price_ms"):
        compare_savings([{"stage": 1, "waits_predicted": 3, "ms_median": 1.0}], -1)


def test_compiled_layers_decode_the_same_tokens(tiny, decoded):
    """mx.compile changes how the graph is built (and may fuse float ops), not the waits or the token."""
    comp = Schedule(tiny.cfg, tiny.w, compiled=True)
    st = new_state(tiny.w, context=4, max_new=8)
    res = [comp.step(st, 5) for _ in range(3)]
    assert [r.waits for r in res] == [waits.waits_per_token(tiny.cfg, 5)] * 3
    assert [r.next_token for r in res] == [r.next_token for r in decoded[5]]
    # Fused elementwise ops round differently: on MLX's CPU float32 rounding apart over the
    # tiny model's 64 layers. MLX's GPU kernels round apart from its CPU's by more (on an H200
    # the uncompiled step was 2.9e-4 from the CPU's, the compiled one 1.1e-3, scaled by the
    # largest logit); there the claim is the waits and the tokens, the logits held to 3e-3.
    tol = 1e-4 if mx.default_device().type == mx.cpu else 3e-3
    for a, b in zip(res, decoded[5]):
        assert np.abs(a.logits - b.logits).max() <= tol * max(1.0, np.abs(b.logits).max())
        assert 0 < a.eval_seconds <= a.seconds


def test_the_schedule_bench_prices_each_kind(tmp_path):
    """At 4-bit with compiled layers: the floor, the split prices by kind, the model beside the tiny price."""
    import json
    import subprocess
    import sys

    root = wait_ledger.LEDGER_PATH.parent.parent.parent
    out = tmp_path / "rec.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.schedule_run",
            "--stages",
            "1,2,5",
            "--tokens",
            "1",
            "--rounds",
            "1",
            "--warmup",
            "0",
            "--price-n",
            "50",
            "--vocab",
            "256",
            "--quant",
            "affine4",
            "--compiled",
            "--split-n",
            "5",
            "--out",
            str(out),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rec = json.loads(out.read_text())
    assert rec["quant"] == "affine4" and rec["compiled"] and rec["matvec"] == "mlx" and rec["check"] is None
    assert rec["floor_ms"] == pytest.approx(rec["weight_bytes_per_token"] / rec["copy_bandwidth_gbs"] / 1e6)
    assert [s["split"] for s in rec["splits"]] == list(MEASURED_SPLITS)
    comps = {(c["from"], c["to"]): c for c in rec["comparisons"]}
    prices = {s["split"]: s["ms"] for s in rec["splits"]}
    want = waits.model_saving(load_model("bonsai-27b"), 1, 2, prices, rec["price"]["ms"])["ms"]
    assert comps[(1, 2)]["ms_saved_model"] == pytest.approx(want)
    # the model's interval, from the split rounds the record keeps: ordered, and about a one-kind sum's median
    assert all(len(s["diffs_ms"]) == 5 for s in rec["splits"])
    assert comps[(1, 2)]["ms_saved_model_lo"] <= comps[(1, 2)]["ms_saved_model_hi"]
    one_kind = savings.model_interval({"layer|qkv": 16}, {s["split"]: s["diffs_ms"] for s in rec["splits"]})
    assert one_kind[0] <= 16 * prices["layer|qkv"] <= one_kind[1]
    assert all("ms_eval_median" in r and "x_floor" in r for r in rec["stages"])


def test_the_schedule_bench_profiles_every_stage(tmp_path, monkeypatch):
    """--profile times every stage's kernels (the price model assumes they do not change). The
    profiler needs CUDA; a stand-in that counts the tokens it is handed stands in for it here."""
    from bench import schedule_run
    from bench.common import step_profile

    seen = []

    def fake_profile(run, steps):
        out = run()
        seen.append((len(out), steps))
        return {
            "steps": steps,
            "kernels_per_step": 10.0 * len(seen),
            "device_us_per_step": 1000.0 * len(seen),
            "graph_launches_per_step": 1.0,
            "top_kernels": [],
            "host_api": [],
        }

    monkeypatch.setattr(step_profile, "check_available", lambda: None)
    monkeypatch.setattr(step_profile, "device_profile", fake_profile)
    rec = schedule_run.main(
        [
            "--stages",
            "1,4,5",
            "--tokens",
            "2",
            "--rounds",
            "1",
            "--warmup",
            "0",
            "--price-n",
            "20",
            "--vocab",
            "64",
            "--split-n",
            "0",
            "--profile",
            "--no-record",
        ]
    )
    assert seen == [(2, 2)] * 3
    assert [r["device_ms_per_token"] for r in rec["stages"]] == [1.0, 2.0, 3.0]
    assert [r["kernels_per_token"] for r in rec["stages"]] == [10.0, 20.0, 30.0]
    assert rec["device_profile"]["stage"] == 5 and rec["device_profile"]["device_us_per_step"] == 3000.0


@pytest.mark.parametrize("stage", [5, 6])
def test_overlapped_submissions_decode_the_same_bits_with_the_same_waits(tiny, decoded, bonsai, stage):
    """overlap hands the graph built so far to the device with mx.async_eval every few
    layers: the same ops on the same values (bit for bit), the same waits (the executor's
    count); count_waits sees each hand-over as an evaluation of its own, never a wait."""
    over = Schedule(tiny.cfg, tiny.w, overlap=4)
    st = new_state(tiny.w, context=4, max_new=8)
    res = [over.step(st, stage) for _ in range(3)]
    assert [r.waits for r in res] == [waits.waits_per_token(bonsai, stage)] * 3
    for a, b in zip(res, decoded[stage]):
        assert a.next_token == b.next_token
        np.testing.assert_array_equal(a.logits, b.logits)
    with count_waits() as wc:
        r = over.step(st, stage)
    assert r.waits == waits.waits_per_token(bonsai, stage)
    # stage 6 is one submission of all 64 layers: hand-overs seen; stage 5's runs of three
    # recurrent layers end at a wait before a fourth begins
    assert wc.n > r.waits if stage == 6 else wc.n == r.waits


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_overlap_must_be_a_count_of_layers(tiny, bad):
    with pytest.raises(ValueError, match="overlap"):
        Schedule(tiny.cfg, tiny.w, overlap=bad)


def test_the_device_profile_table_reads_a_profiled_record():
    recs = {r["file"]: r for r in schedule_report.load_records()}
    rec = recs["schedule_run-nvidia-h200-20261202T151442Z.json"]
    top, summary = schedule_report.device_profile_table(rec, top=3)
    prof = rec["device_profile"]
    assert len(top) == 3 and list(top.columns) == ["kernel", "launches", "ms"]
    assert top["ms"].tolist() == [k["us_per_step"] / 1e3 for k in prof["top_kernels"][:3]]
    assert not any(k.startswith("mlx::") or "(" in k for k in top["kernel"])  # names without MLX's prefix, no arguments
    assert summary["device_x_floor"] == pytest.approx(prof["device_us_per_step"] / 1e3 / rec["floor_ms"])
    assert summary["stage"] == 6 and summary["kernels"] == prof["kernels_per_step"]
    unprofiled = recs["schedule_run-nvidia-h200-20261202T151247Z.json"]
    with pytest.raises(ValueError, match="no device profile"):
        schedule_report.device_profile_table(unprofiled)


@pytest.mark.parametrize("stage,kind,count", [(1, "layer|layer", 8), (1, "wo>host|ffn", 4), (2, "ffn|layer", 5)])
def test_a_token_with_some_waits_joined_decodes_the_same_bits(tiny, decoded, bonsai, stage, kind, count):
    """Other groupings of the same pieces (a share of one kind of wait joined): the same
    logits bit for bit on MLX's CPU, as many waits fewer as were joined."""
    subs = waits.join_splits(tiny.submissions(stage), kind, count)
    st = new_state(tiny.w, context=4, max_new=8)
    res = [tiny.step(st, stage, submissions=subs) for _ in range(3)]
    assert [r.waits for r in res] == [waits.waits_per_token(bonsai, stage) - count] * 3
    for a, b in zip(res, decoded[stage]):
        if mx.default_device().type == mx.cpu:
            np.testing.assert_array_equal(a.logits, b.logits)
        assert a.next_token == b.next_token


def test_other_submissions_are_checked(tiny):
    own = tiny.submissions(1)
    with pytest.raises(ValueError, match="must hold stage 1's pieces in its order"):
        tiny.check_submissions(1, own[1:])
    qkv_at = next(i for i, s in enumerate(own) if s[-1].kind == "qkv")
    with pytest.raises(ValueError, match=f"submissions\\[{qkv_at}\\]: goes on past a layer's Q/K/V"):
        tiny.check_submissions(1, own[:qkv_at] + [own[qkv_at] + own[qkv_at + 1]] + own[qkv_at + 2 :])
    with pytest.raises(ValueError, match="submissions: must be a non-empty list"):
        tiny.step(new_state(tiny.w, context=4, max_new=2), 1, submissions=[])


def test_probes_are_timed_beside_the_stages_and_price_a_wait_inside_the_token(tiny):
    subs = waits.join_splits(tiny.submissions(1), "layer|layer", 8)
    rec = run_stages(
        tiny, stages=[1, 4], tokens=2, rounds=2, warmup=1, context=4, price_ms=0.03, probes={"eight joined": (1, subs)}
    )
    (probe,) = rec["probes"]
    assert probe["waits_match"] and probe["waits_predicted"] == len(subs) and probe["tokens"] == 4
    prices = savings.in_token_prices(rec["stages"], rec["probes"], {"eight joined": ("layer|layer", 8)})
    p = prices["layer|layer"]
    base = next(r for r in rec["stages"] if r["stage"] == 1)
    assert p["ms"] == pytest.approx(float(np.median((np.asarray(base["ms_each"]) - probe["ms_each"]) / 8)))
    assert p["lo_ms"] <= p["hi_ms"] and p["stage"] == 1 and p["count"] == 8 and p["tokens"] == 4
    with pytest.raises(ValueError, match="probes\\['x'\\]: must be \\(stage, submissions\\)"):
        run_stages(tiny, stages=[1], tokens=1, rounds=1, probes={"x": subs})
    probes, joined = in_token_probes(tiny, [2, 1], 4)
    assert joined["stage 1, 8 of 32 layer|layer joined"] == ("layer|layer", 8)
    # each kind at the first of the stages that has four of it: ffn|layer first appears at stage 2
    assert {name: probes[name][0] for name in joined}["stage 2, 3 of 15 ffn|layer joined"] == 2
    assert ("ffn|layer", 3) in joined.values() and "qkv>host|wo" not in {k for k, _ in joined.values()}
    with pytest.raises(ValueError, match="share"):
        in_token_probes(tiny, [1], 0)
    with pytest.raises(ValueError, match="joined: probe 'y' is not among the probes timed"):
        savings.in_token_prices(rec["stages"], rec["probes"], {"y": ("layer|layer", 8)})


def test_in_token_prices_pair_each_token_with_its_stage():
    stage = [{"stage": 1, "ms_each": [10.0, 11.0, 12.0, 10.5]}]
    probe = [{"name": "p", "stage": 1, "ms_each": [9.0, 10.0, 11.0, 9.5]}]
    prices = savings.in_token_prices(stage, probe, {"p": ("layer|layer", 4)})
    assert prices["layer|layer"]["ms"] == pytest.approx(0.25) and prices["layer|layer"]["lo_ms"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="do not pair"):
        savings.in_token_prices(stage, [{**probe[0], "ms_each": [9.0]}], {"p": ("layer|layer", 4)})
    with pytest.raises(ValueError, match="its stage 2 was not timed"):
        savings.in_token_prices(stage, [{**probe[0], "stage": 2}], {"p": ("layer|layer", 4)})


def test_the_schedule_bench_prices_waits_inside_the_token():
    from bench import schedule_run

    rec = schedule_run.main(
        [
            "--stages",
            "1,2,4,5",
            "--tokens",
            "1",
            "--rounds",
            "2",
            "--warmup",
            "0",
            "--price-n",
            "20",
            "--vocab",
            "64",
            "--split-n",
            "5",
            "--in-token-share",
            "4",
            "--no-record",
        ]
    )
    kinds = rec["in_token_prices"]
    # each joinable kind at the first timed stage with four or more of it
    assert {k: (v["stage"], v["count"]) for k, v in kinds.items()} == {
        "wo>host|ffn": (1, 4),
        "ffn>host|layer": (1, 3),
        "layer|qkv": (1, 4),
        "ffn|layer": (2, 3),
        "layer|layer": (1, 8),
    }
    assert all(p["waits_match"] for p in rec["probes"]) and len(rec["probes"]) == 5
    prices = {s["split"]: s["ms"] for s in rec["splits"]} | {k: v["ms"] for k, v in kinds.items()}
    c45 = next(c for c in rec["comparisons"] if (c["from"], c["to"]) == (4, 5))
    assert c45["ms_saved_model_in_token"] == pytest.approx(32 * prices["layer|layer"])
    t = schedule_report.pair_table(rec).set_index(["from", "to"])
    assert t.loc[(4, 5), "in_token_model_ms"] == pytest.approx(c45["ms_saved_model_in_token"])
