"""workbench.reports.kernel_bodies: an older kernel text beside the current one, from the
committed ``bench.kernel_bodies`` record of the 4-bit codes' rewrite and from bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.reports import kernel_bodies as kv

BENCH = Path(__file__).resolve().parent.parent / "data" / "bench"


def test_the_rewrite_of_the_4bit_codes_kept_every_bit_and_took_less_time():
    rec = json.loads((BENCH / "kernel_bodies-nvidia-h200-20261201T150928Z.json").read_text())
    t = kv.versions_table(rec)
    assert list(t.columns) == ["tail affine4-g64", "tail mxfp4-g32", "tail nvfp4-g16"]
    assert (t.loc["same bits"] == "5120/5120").all()
    ratio = t.loc["device new / old"].astype(float)
    assert ratio.tolist() == pytest.approx((t.loc["device ms, new"] / t.loc["device ms, old"]).astype(float).tolist())
    assert (ratio < 1).all()


@pytest.mark.parametrize("bad", [None, {"bench": "one_launch"}, {"bench": "kernel_bodies", "cases": []},
                                 {"bench": "kernel_bodies", "cases": [{"case": "x"}]}])
def test_what_is_not_a_timed_kernel_bodies_record_is_refused(bad):
    with pytest.raises(ValueError, match="record must be a bench.kernel_bodies record"):
        kv.versions_table(bad)


def test_the_one_launch_rows_appear_where_the_record_ran_it():
    """bench.kernel_bodies also times the tail as one launch on CUDA: its rows come after
    the three launches', and a case without it leaves them blank."""
    rec = json.loads((BENCH / "kernel_bodies-nvidia-h200-20261201T165145Z.json").read_text())
    first, second = rec["cases"][0], rec["cases"][1]
    assert "one_launch" not in first  # recorded before the bench ran it
    timed = {"median_ms": 0.2}
    first["one_launch"] = {"check": {"new_vs_old": {"same_bits": 5120, "elements": 5120}},
                           "device_ms_per_tail": {"old": {"median_ms": 0.2}, "new": {"median_ms": 0.15}},
                           "one_wait_ms": {"old": timed, "new": {"median_ms": 0.25}}}
    t = kv.versions_table(rec)
    assert t.index[:5].tolist() == ["same bits", "device ms, old", "device ms, new", "device new / old",
                                    "one wait new / old"]
    col = t[first["case"]]
    assert col["one launch: same bits"] == "5120/5120"
    assert col["one launch: device new / old"] == pytest.approx(0.75)
    assert col["one launch: one wait new / old"] == pytest.approx(1.25)
    assert t[second["case"]].isna()["one launch: device new / old"]


def test_the_sass_counts_record_reads_into_one_row_a_launch_and_format():
    rec = json.loads((BENCH / "sass_counts-amd-epyc-20261201T172239Z.json").read_text())
    t = kv.sass_table(rec)
    assert len(t) == 3 * 5 and set(t["format"]) == {"bf16", "affine4", "affine8", "mxfp4", "nvfp4"}
    assert t["now / old"].tolist() == pytest.approx((t["loop now"] / t["loop old"]).tolist())
    fp4 = t[t["format"].isin(["mxfp4", "nvfp4"])]
    assert (fp4["int now"] < fp4["int old"]).all() and (t[t["format"] == "bf16"]["now / old"] == 1).all()


#: bench.sass_counts with the tail's one launch counted by phase (affine8, affine4; 65c56f3's
#: kernels as old).
ONE_LAUNCH_RECORD = "sass_counts-amd-epyc-20261201T184927Z.json"


def test_a_record_with_the_one_launch_reads_into_a_row_a_phase_after_the_three_launches():
    rec = json.loads((BENCH / ONE_LAUNCH_RECORD).read_text())
    t = kv.sass_table(rec)
    phases = [f"one_launch/{p}" for p in kv.SASS_PHASES]
    assert t["launch"].tolist() == [*(["wo_residual", "ffn_gate_up", "ffn_down"] * 2), *phases, "one_launch",
                                    *phases, "one_launch"]
    assert t["format"].tolist()[6:] == ["affine8"] * 5 + ["affine4"] * 5
    one = t[t["launch"].str.startswith("one_launch")].set_index(["launch", "format"])
    rows = {(r["launch"], r["format"], r["side"]): r for r in rec["rows"]}
    for fmt in ("affine8", "affine4"):
        new, old = rows[("one_launch", fmt, "new")], rows[("one_launch", fmt, "old")]
        whole = one.loc[("one_launch", fmt)]
        assert (whole["regs old"], whole["regs now"]) == (old["registers"], new["registers"])
        assert whole["loop now"] == sum(new["phases"][p]["loop_instructions"] for p in kv.SASS_PHASES)
        down = one.loc[("one_launch/ffn_down", fmt)]
        assert down["loop old"] == old["phases"]["ffn_down"]["loop_instructions"]
        assert down["int now"] == new["phases"]["ffn_down"]["loop_classes"]["int"]
        assert down["regs now"] == new["phases"]["ffn_down"]["alone"]["registers"]  # that phase compiled alone
        assert one.loc[("one_launch/barriers", fmt)].isna()[["regs old", "regs now"]].all()
    assert t["now / old"].tolist() == pytest.approx((t["loop now"] / t["loop old"]).tolist())
    # what the record says of the affine8 one launch: 56 registers then 68, its down phase's loops shorter
    a8 = one.xs("affine8", level="format")
    assert (a8.loc["one_launch", "regs old"], a8.loc["one_launch", "regs now"]) == (56, 68)
    assert a8.loc["one_launch/ffn_down", "now / old"] < 1


def test_a_one_launch_the_older_text_lacked_has_blank_old_columns():
    rec = json.loads((BENCH / ONE_LAUNCH_RECORD).read_text())
    rec["rows"] = [r for r in rec["rows"] if not (r["launch"] == "one_launch" and r["side"] == "old")]
    t = kv.sass_table(rec)
    one = t[t["launch"].str.startswith("one_launch")]
    assert len(one) == 2 * 5 and one["loop old"].isna().all() and one["now / old"].isna().all()
    assert one["loop now"].notna().all() and (t[~t.index.isin(one.index)]["loop old"] > 0).all()


def test_a_launch_of_its_own_without_its_old_row_is_refused():
    rec = json.loads((BENCH / ONE_LAUNCH_RECORD).read_text())
    rec["rows"] = [r for r in rec["rows"] if not (r["launch"] == "ffn_down" and r["side"] == "old")]
    with pytest.raises(ValueError, match="ffn_down affine8 has no old row"):
        kv.sass_table(rec)


@pytest.mark.parametrize("bad", [None, {"bench": "kernel_bodies"}, {"bench": "sass_counts", "rows": []},
                                 {"bench": "sass_counts", "rows": [{"side": "new"}]}])
def test_what_is_not_a_sass_counts_record_with_two_sides_is_refused(bad):
    with pytest.raises(ValueError, match="record must be a bench.sass_counts record run with --old"):
        kv.sass_table(bad)


def test_kernel_bodies_prints_the_one_launch_rows_and_counts_its_check(capsys):
    """bench.kernel_bodies' table (no GPU needed to print a record): the one launch's
    check line and its two timed rows; a failed one-launch check fails the case."""
    from bench import kernel_bodies

    rec = json.loads((BENCH / "kernel_bodies-nvidia-h200-20261201T165145Z.json").read_text())
    case = rec["cases"][0]
    check = {s: {"worst": 1e-6, "passed": True} for s in ("old", "new")}
    case["one_launch"] = {"nt": 640, "row_units": 8, "groups": 132,
                          "check": {**check, "passed": True,
                                    "new_vs_old": {"same_bits": 5120, "elements": 5120, "max_abs_diff": 0.0}},
                          "device_ms_per_tail": {"old": {"median_ms": 0.2}, "new": {"median_ms": 0.15}},
                          "one_wait_ms": {"old": {"median_ms": 0.2}, "new": {"median_ms": 0.25}}}
    kernel_bodies.print_table(rec)
    out = capsys.readouterr().out
    assert "one launch check" in out and "5120 of 5120 same bits" in out
    assert "one launch (640)" in out and "its one wait" in out
    assert kernel_bodies.case_passed(case)
    case["one_launch"]["check"]["passed"] = False
    assert not kernel_bodies.case_passed(case) and kernel_bodies.case_passed(rec["cases"][1])


def test_the_one_launch_phases_are_kernel_sources() -> None:
    from workbench.kernels import source as kernel_source

    assert kv.SASS_PHASES == (*(k for k, _ in kernel_source.ONE_LAUNCH_PHASES), "barriers")
