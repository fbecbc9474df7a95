"""workbench.kernel_versions: an older kernel text beside the current one, from the
committed ``bench.kernel_bodies`` record of the 4-bit codes' rewrite and from bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench import kernel_versions as kv

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
