"""workbench.reports.real_model: the real_model records read back as the notebooks' tables."""

from __future__ import annotations

import copy
import math

import pytest

from workbench.reports import real_model as R
from workbench.reports.records import RecordError


def _records() -> list[dict]:
    return [r for r in R.load_records() if r.get("tails")]


def test_every_committed_record_with_tails_reads_as_both_tables():
    recs = _records()
    assert recs, "the project commits at least one real_model record with its per-shape tails"
    for rec in recs:
        dec = R.decode_table(rec)
        assert dec.variant.iloc[0] == "reference" and dec.vs_reference.iloc[0] == 1.0
        assert (dec.tokens_per_s > 0).all() and dec.same_tokens.dtype == bool
        tails = R.tail_table(rec)
        assert len(tails) == len(rec["tails"]) and (tails.reference_ms > 0).all()
        row = rec["tails"][0]
        assert math.isclose(
            tails.graph_vs_ref.iloc[0],
            row["variants"]["reference"]["median_ms"] / row["variants"]["graph"]["median_ms"],
        )
        assert ("graph_chain_ms" in tails) == R.chain_comparable(rec)


def test_chains_written_before_the_fix_are_left_out():
    """The record of 2026-12-02 06:22 timed a reference chain that evaluated only its last
    tail (it has no 'graph-ops' variant); the one of 11:16 is clear of it."""
    by_stamp = {r["file"]: r for r in _records()}
    old = by_stamp["real_model-nvidia-h200-20261202T062208Z.json"]
    new = by_stamp["real_model-nvidia-h200-20261202T111633Z.json"]
    assert not R.chain_comparable(old) and R.chain_comparable(new)
    assert "reference_chain_ms" not in R.tail_table(old) and "reference_chain_ms" in R.tail_table(new)


def test_best_cuda_picks_the_least_time_and_none_without_cuda():
    row = {
        "variants": {
            "reference": {"median_ms": 1.0},
            "graph": {"median_ms": 0.9},
            "cuda-3": {"median_ms": 0.8},
            "cuda-1:full": {"median_ms": 0.7},
        }
    }
    assert R.best_cuda(row) == "cuda-1:full"
    assert R.best_cuda({"variants": {"reference": {"median_ms": 1.0}}}) is None
    with pytest.raises(ValueError, match="row: must be one shape"):
        R.best_cuda({"label": "x"})


def test_bad_records_are_refused_naming_what_is_wrong():
    rec = copy.deepcopy(_records()[-1])
    with pytest.raises(RecordError):
        R.decode_table({"bench": "one_launch"})
    broken = copy.deepcopy(rec)
    del broken["decode"]["reference"]
    with pytest.raises(ValueError, match=r"rec\['decode'\]: must map variants"):
        R.decode_table(broken)
    broken = copy.deepcopy(rec)
    broken["tails"] = []
    with pytest.raises(ValueError, match=r"rec\['tails'\]: must be a non-empty list"):
        R.tail_table(broken)
    broken = copy.deepcopy(rec)
    del broken["tails"][0]["variants"]["graph"]
    with pytest.raises(ValueError, match="must have the variant 'graph'"):
        R.tail_table(broken)


def test_a_profiled_record_says_what_share_of_a_step_the_device_ran():
    """Records made with --profile carry kernels and device time a step; the share is the
    device's kernel time over the step's wall time (ms a step = 1000 / tokens a second)."""
    profiled = [r for r in R.load_records() if "device_profile" in r["decode"]["reference"]]
    assert profiled, "the project commits at least one real_model record made with --profile"
    for rec in profiled:
        dec = R.decode_table(rec).set_index("variant")
        for name, d in rec["decode"].items():
            us = d["device_profile"]["device_us_per_step"]
            assert math.isclose(dec.device_share[name], us / 1e3 / (1e3 / d["tokens_per_s_median"]))
            assert dec.kernels_per_step[name] == d["device_profile"]["kernels_per_step"]
    old = next(r for r in R.load_records() if "device_profile" not in r["decode"]["reference"])
    assert R.decode_table(old).device_share.isna().all()  # a record without the profile: NaN, not an error


def test_a_record_with_the_step_split_reads_its_parts_and_the_pipelined_loop():
    from workbench.reports import records

    rec = records.load("real_model", "real_model-nvidia-h200-20261202T180549Z")
    d = R.decode_table(rec).set_index("variant")
    assert d.loc["reference", "paired"] == 1.0 and d.loc["reference", "pipelined_vs_reference"] == 1.0
    assert (d[["build_ms", "encode_ms", "wait_ms"]] > 0).all().all() and d.pipelined_same_tokens.all()
    # the paired ratio is the median of the rounds' ratios, read from the record
    raw = rec["decode"]["fused-cuda"]
    assert d.loc["fused-cuda", "pipelined_paired"] == raw["pipelined_vs_reference_paired"]
    assert R.mlx_settings(rec) == {}
    off = records.load("real_model", "real_model-nvidia-h200-20261202T175659Z")
    assert R.mlx_settings(off) == {"MLX_USE_CUDA_GRAPHS": "0"}
    old = R.decode_table(records.load("real_model", "real_model-nvidia-h200-20261202T150948Z"))
    assert old.build_ms.isna().all() and old.pipelined_tokens_per_s.isna().all()
    with pytest.raises(ValueError, match="mlx_environment"):
        R.mlx_settings({**rec, "mlx_environment": ["MLX_USE_CUDA_GRAPHS"]})


def test_the_launch_cost_record_as_a_table():
    from workbench.reports import launch_host_cost as L
    from workbench.reports import records

    rec = records.load("launch_host_cost", "launch_host_cost-nvidia-h200-20261202T174355Z")
    t = L.cost_table(rec).set_index("variant")
    assert t.loc["ops", "x_op"] == 1.0 and t.exact.all()
    assert t.loc["k2-pad57k", "host_us"] > t.loc["k2-pad25k", "host_us"] > t.loc["k2", "host_us"]
    assert 0 < L.us_per_kb(rec) < 1
    with pytest.raises(RecordError):
        L.cost_table({"variants": {}})


def test_the_host_calls_of_a_profiled_step():
    from workbench.reports import records

    t = R.host_api_table(records.load("real_model", "real_model-nvidia-h200-20261202T180549Z")).set_index("call")
    assert "cudaGraphLaunch" in t.index and list(t.columns)[0] == "reference"
    assert t.loc["cudaGraphAddKernelNode", "fused-cuda"] < t.loc["cudaGraphAddKernelNode", "reference"]
    assert R.host_api_table(records.load("real_model", "real_model-nvidia-h200-20261202T175659Z")).empty


def test_the_graph_calls_of_a_step_in_ms():
    from workbench.reports import records

    rec = records.load("real_model", "real_model-nvidia-h200-20261202T180549Z")
    ms = R.graph_call_ms(rec)
    t = R.host_api_table(rec).set_index("call")
    graph = [c for c in t.index if c.startswith("cudaGraph")]
    assert len(graph) == 4 and ms["reference"] == pytest.approx(t.loc[graph, "reference"].sum() / 1e3)
    assert ms["fused-cuda"] < ms["reference"]
    assert R.graph_call_ms(records.load("real_model", "real_model-nvidia-h200-20261202T175659Z")) == {}


def test_runs_stack_into_one_table_by_run_and_variant():
    recs = {r["file"] if "file" in r else str(i): r for i, r in enumerate(_records()[-2:])}
    both = R.decode_runs(recs)
    assert both.index.names == ["run", "variant"]
    for label, rec in recs.items():
        one = R.decode_table(rec).set_index("variant")
        assert list(both.loc[label].index) == list(one.index)
        assert both.loc[label].tokens_per_s.equals(one.tokens_per_s)
    with pytest.raises(ValueError, match="runs: must map labels to real_model records"):
        R.decode_runs({})


def test_the_chain_split_reads_where_a_record_has_it_and_is_empty_where_not():
    old = _records()[-1]
    assert R.chain_split_table(old).empty or "chain_build_us" in old["tails"][0]["variants"]["reference"]
    rec = copy.deepcopy(old)
    for t in rec["tails"]:
        for i, v in enumerate(t["variants"].values()):
            v.update(chain_build_us=1.0 + i, chain_encode_us=2.0, chain_wait_us=3.0)
    split = R.chain_split_table(rec)
    assert len(split) == sum(len(t["variants"]) for t in rec["tails"])
    first = split.iloc[0]
    assert (first.variant, first.build_us, first.host_us, first.wait_us) == ("reference", 1.0, 3.0, 3.0)


def test_the_build_profile_reads_where_a_record_has_it():
    from workbench.reports import records

    profiled = R.build_profile_table(records.load("real_model", "real_model-nvidia-h200-20261203T090055Z"))
    assert set(profiled.variant) >= {"reference", "fused-cuda", "fused-graph"} and (profiled.own_us_per_step > 0).all()
    rec = copy.deepcopy(records.load("real_model", "real_model-nvidia-h200-20261203T064802Z"))
    assert R.build_profile_table(rec).empty
    rec["decode"]["reference"]["build_profile"] = [
        {
            "function": "models/llama.py:74(__call__)",
            "calls_per_step": 30.0,
            "own_us_per_step": 400.0,
            "cum_us_per_step": 2500.0,
        }
    ]
    table = R.build_profile_table(rec)
    assert list(table.variant) == ["reference"] and table.own_us_per_step.iloc[0] == 400.0


def test_the_paired_ratio_of_any_two_variants_is_the_median_of_their_rounds():
    from workbench.reports import records

    rec = records.load("real_model", "real_model-nvidia-h200-20261203T090055Z")
    d = R.decode_table(rec).set_index("variant")
    # against the reference it is the record's own paired figure, both loops
    assert R.paired_ratio(rec, "fused-cuda", "reference") == pytest.approx(d.loc["fused-cuda", "paired"], rel=1e-12)
    assert R.paired_ratio(rec, "fused-cuda", "reference", pipelined=True) == pytest.approx(
        d.loc["fused-cuda", "pipelined_paired"], rel=1e-12
    )
    # between two fused variants, the median of the per-round ratios
    made = copy.deepcopy(rec)
    made["decode"]["fused-graph"]["tokens_per_s"] = [2.0, 4.0, 9.0]
    made["decode"]["fused-cuda"]["tokens_per_s"] = [1.0, 1.0, 3.0]
    assert R.paired_ratio(made, "fused-graph", "fused-cuda") == 3.0
    with pytest.raises(ValueError, match=r"against: must be one of the record's decode variants"):
        R.paired_ratio(rec, "fused-cuda", "nothing")
    with pytest.raises(ValueError, match="ran different numbers of rounds"):
        R.paired_ratio(made, "fused-graph", "reference")
    old = records.load("real_model", "real_model-nvidia-h200-20261202T062208Z")
    if not isinstance(old["decode"]["reference"].get("pipelined_tokens_per_s"), list):
        with pytest.raises(ValueError, match="no per-round"):
            R.paired_ratio(old, "reference", "reference", pipelined=True)


def test_the_paired_table_puts_each_variant_against_each_baseline_in_both_loops():
    from workbench.reports import records

    rec = records.load("real_model", "real_model-nvidia-h200-20261203T093147Z")
    table = R.paired_table(rec, ["fused-cuda-qkv", "fused-graph-qkv"], ["reference", "reference-qkv"])
    assert list(table.index) == ["fused-cuda-qkv", "fused-graph-qkv"]
    assert list(table.columns) == [
        (loop, b) for loop in ("step after step", "pipelined") for b in ("reference", "reference-qkv")
    ]
    assert table.loc["fused-graph-qkv", ("pipelined", "reference-qkv")] == R.paired_ratio(
        rec, "fused-graph-qkv", "reference-qkv", pipelined=True
    )
    with pytest.raises(ValueError, match="against: must be a non-empty list"):
        R.paired_table(rec, ["fused-cuda-qkv"], "reference")


def test_the_stored_activation_graph_is_shown_where_a_record_has_it_and_not_judged():
    """``graph-stored`` (half-precision activations): its time and ratio where a shape has it,
    NaN where not (older records, float32 weights); its error is reported in its own column
    and kept out of ``worst``, the judged variants' figure."""
    from workbench.reports import records

    rec = copy.deepcopy(records.load("real_model", "real_model-nvidia-h200-20261203T064802Z"))
    assert R.tail_table(rec).graph_stored_ms.isna().all()  # made before the variant existed
    row = rec["tails"][1]
    stored = dict(
        row["variants"]["graph"],
        median_ms=row["variants"]["reference"]["median_ms"] / 2,
        worst_vs_float64=0.5,
        passed=False,
    )
    row["variants"]["graph-stored"] = stored
    t = R.tail_table(rec)
    assert t.graph_stored_vs_ref.iloc[1] == 2.0 and t.graph_stored_worst.iloc[1] == 0.5
    assert t.graph_stored_ms.drop(index=1).isna().all()
    assert t.worst.iloc[1] < 0.5 and t.worst.iloc[1] <= rec["tolerance"]


def test_one_comparison_run_by_run_and_a_profiled_calls_own_time():
    """``paired_across`` is ``paired_ratio`` record by record, in order; ``own_us_per_call``
    divides a profiled function's own time a step by its calls a step, and names what is
    wrong where the function is not one of the variant's."""
    from workbench.reports import records

    recs = [records.load("real_model", f"real_model-nvidia-h200-20261203T{t}") for t in ("123708Z", "124438Z")]
    got = R.paired_across(recs, "fused-cuda-qkv", "reference-qkv", "pipelined")
    assert got == [R.paired_ratio(r, "fused-cuda-qkv", "reference-qkv", pipelined=True) for r in recs]
    assert R.paired_across(recs[:1], "fused-cuda-qkv", "reference", "step after step") == [
        R.paired_ratio(recs[0], "fused-cuda-qkv", "reference")
    ]
    with pytest.raises(ValueError, match="loop: must be one of"):
        R.paired_across(recs, "fused-cuda-qkv", "reference", "piped")
    with pytest.raises(ValueError, match="recs: must be a non-empty list"):
        R.paired_across(recs[0], "fused-cuda-qkv", "reference", "pipelined")
    f = next(
        x
        for x in recs[0]["decode"]["fused-cuda-qkv"]["build_profile"]
        if x["function"].startswith("kernels/one_launch.py")
    )
    assert (
        R.own_us_per_call(recs[0], "fused-cuda-qkv", "kernels/one_launch.py")
        == f["own_us_per_step"] / f["calls_per_step"]
    )
    with pytest.raises(ValueError, match="where: must name one profiled function of 'fused-cuda-qkv', got 0"):
        R.own_us_per_call(recs[0], "fused-cuda-qkv", "no/such.py")
    with pytest.raises(ValueError, match="got 0 matching"):
        R.own_us_per_call(recs[1], "fused-cuda-qkv", "kernels/one_launch.py")  # made without --host-profile


def test_the_graph_tail_as_the_model_keeps_its_activations_and_the_graphs_a_step():
    """``graph_kept_vs_ref`` is the float32 graph tail's ratio where the model's activations
    are float32 and the stored-activation tail's where they are half precision; a profiled
    record gives the CUDA graphs a step, NaN where it has no profile."""
    from workbench.reports import records

    rec = records.load("real_model", "real_model-nvidia-h200-20261203T142214Z")
    t = R.tail_table(rec)
    wide = t.activations == "float32"
    assert wide.sum() == 1 and (t.activations[~wide] != "float32").all()  # the real layer alone is float32
    assert (t.graph_kept_vs_ref[wide] == t.graph_vs_ref[wide]).all()
    assert (t.graph_kept_vs_ref[~wide] == t.graph_stored_vs_ref[~wide]).all()
    assert (t.graph_kept_chain_vs_ref[~wide] == t.graph_stored_chain_vs_ref[~wide]).all()
    old = R.tail_table(records.load("real_model", "real_model-nvidia-h200-20261203T064802Z"))
    assert old.graph_kept_vs_ref[old.activations != "float32"].isna().all()  # no stored tail then

    profiled = records.load("real_model", "real_model-nvidia-h200-20261203T142000Z")
    dec = R.decode_table(profiled).set_index("variant")
    for name, d in profiled["decode"].items():
        assert dec.graph_launches_per_step[name] == d["device_profile"]["graph_launches_per_step"]
    assert R.decode_table(rec).graph_launches_per_step.isna().all()
    assert R.mlx_settings(profiled) == {"MLX_MAX_OPS_PER_BUFFER": "200"}


def test_the_paired_interval_is_a_seeded_bootstrap_of_the_rounds_ratios():
    from workbench.reports import records

    rec = records.load("real_model", "real_model-nvidia-h200-20261203T141632Z")
    lo, hi = R.paired_interval(rec, "fused-cuda-qkv", "reference")
    med = R.paired_ratio(rec, "fused-cuda-qkv", "reference")
    assert lo < med < hi and R.paired_interval(rec, "fused-cuda-qkv", "reference") == (lo, hi)
    assert R.paired_interval(rec, "fused-cuda-qkv", "reference", level=0.5)[0] > lo  # a narrower level, inside
    made = copy.deepcopy(rec)
    n = len(made["decode"]["reference"]["tokens_per_s"])
    made["decode"]["fused-cuda"]["tokens_per_s"] = [3.0 * r for r in made["decode"]["reference"]["tokens_per_s"]]
    assert R.paired_interval(made, "fused-cuda", "reference") == pytest.approx((3.0, 3.0), rel=1e-12)  # no noise
    table = R.paired_interval_table(rec, ["fused-cuda-qkv", "fused-graph"], "reference")
    assert list(table.index) == [(loop, v) for loop in R.LOOPS for v in ("fused-cuda-qkv", "fused-graph")]
    assert table.loc[("step after step", "fused-cuda-qkv"), "lo"] == lo and (table.rounds == n).all()
    assert table.loc[("pipelined", "fused-graph"), "paired"] == R.paired_ratio(
        rec, "fused-graph", "reference", pipelined=True
    )
    with pytest.raises(ValueError, match="level: must be a number strictly between 0 and 1"):
        R.paired_interval(rec, "fused-cuda", "reference", level=95)
    with pytest.raises(ValueError, match="variants: must be a non-empty list"):
        R.paired_interval_table(rec, "fused-cuda", "reference")
    with pytest.raises(ValueError, match="level: must be a number strictly between 0 and 1"):
        R.paired_interval_table(rec, ["fused-cuda"], "reference", level=1.0)
