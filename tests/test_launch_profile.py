"""bench.launch_profile's scheduler summary (``--stalls``), without a GPU: ncu's rows in,
the figures a reader compares out."""

from __future__ import annotations

from bench import launch_profile


def _launch(**stalls: float) -> dict:
    e = {
        "kernel": "custom_kernel_fat_ffn_gate_up",
        "smsp__issue_active.avg.pct_of_peak_sustained_active": 61.5,
        "smsp__average_warp_latency_per_inst_issued.ratio": 7.25,
        "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": 40.0,
        "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active": 30.0,
        "smsp__inst_executed.sum": 1.0e6,
    }
    e.update({launch_profile.STALL_METRIC.format(r): v for r, v in stalls.items()})
    return e


def test_stall_summary_orders_reasons_largest_first_and_keeps_top() -> None:
    s = launch_profile.stall_summary(
        _launch(long_scoreboard=3.5, wait=1.0, selected=1.0, not_selected=0.25, math_pipe_throttle=2.0), top=3
    )
    assert s["top_stalls"] == [["long_scoreboard", 3.5], ["math_pipe_throttle", 2.0], ["wait", 1.0]]
    assert (s["issue_active_pct"], s["cycles_per_issue"], s["fma_pipe_pct"], s["alu_pipe_pct"]) == (
        61.5,
        7.25,
        40.0,
        30.0,
    )
    assert s["instructions"] == 1.0e6
    assert s["instructions_by_pipe"] == dict.fromkeys(launch_profile.PIPES)  # not in this row: None, not 0


def test_stall_summary_skips_reasons_ncu_did_not_report_as_numbers() -> None:
    e = _launch(long_scoreboard=3.5)
    e[launch_profile.STALL_METRIC.format("barrier")] = "n/a"  # ncu prints text where a metric is not collected
    assert launch_profile.stall_summary(e)["top_stalls"] == [["long_scoreboard", 3.5]]
    assert launch_profile.stall_summary({"kernel": "k"})["top_stalls"] == []


def test_every_stall_metric_is_a_documented_ncu_name() -> None:
    # The names ncu's WarpStateStats section uses; a misspelt one makes ncu profile nothing.
    for m in launch_profile.STALL_METRICS[: len(launch_profile.STALL_REASONS)]:
        assert m.startswith("smsp__average_warps_issue_stalled_") and m.endswith("_per_issue_active.ratio")
    assert len(set(launch_profile.STALL_METRICS)) == len(launch_profile.STALL_METRICS)


def test_pipe_counts_are_read_where_profiled() -> None:
    e = _launch(long_scoreboard=1.0)
    e[launch_profile.PIPE_METRIC.format("alu")] = 3.0e6
    e[launch_profile.LOAD_METRICS["shared_ld"]] = 5.0e5
    s = launch_profile.stall_summary(e)
    assert s["instructions_by_pipe"]["alu"] == 3.0e6 and s["instructions_by_pipe"]["fma"] is None
    assert s["loads"] == {"global_ld": None, "shared_ld": 5.0e5}
    assert set(launch_profile.STALL_METRICS) >= {"smsp__inst_executed_pipe_alu.sum", "smsp__inst_executed_pipe_fma.sum"}


def test_ncu_stopped_at_its_limit_says_so_and_writes_no_record(tmp_path, monkeypatch, capsys) -> None:
    """ncu past --timeout: stopped with its child (bench.common.bounded_run), a plain message and
    exit 1 rather than a traceback, and no record."""
    import subprocess

    from bench.common import bounded_run

    monkeypatch.setattr(launch_profile.shutil, "which", lambda name: "/usr/bin/ncu")

    def slow(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"], output="==PROF== Profiling custom_kernel_fat_wo\n")

    monkeypatch.setattr(bounded_run, "run_bounded", slow)
    assert launch_profile.main(["--formats", "affine4", "--timeout", "7", "--out-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "ncu did not finish within --timeout 7 s" in out and "Profiling custom_kernel_fat_wo" in out
    assert not list(tmp_path.iterdir())
