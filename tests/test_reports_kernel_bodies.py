"""workbench.reports.kernel_bodies: an older kernel text beside the current one, from the
committed ``bench.kernel_bodies`` and ``bench.sass_counts`` records (read through
``workbench.reports.records``) and from bad input."""

from __future__ import annotations

import pytest

from workbench.reports import kernel_bodies as kv
from workbench.reports import records

#: The H200 run of commit 65c56f3's kernels against the text with fewer instructions a
#: weight: every bit kept, 0.83-0.89 of the time. Its cases predate the one launch's rows,
#: which the tests below add.
FEWER_RECORD = "kernel_bodies-nvidia-h200-20261201T165145Z.json"


def _made_up(kind: str, **fields) -> dict:
    """A record of ``kind`` with every key its kind promises (None but the bench and ``fields``)."""
    return {key: None for key in records.KINDS[kind].keys} | {"bench": kind} | fields


def test_the_rewrite_of_the_4bit_codes_kept_every_bit_and_took_less_time():
    # the H200 run of the 4-bit codes placed by one mask-and-or: the proof it kept every bit
    rec = records.load("kernel_bodies", "kernel_bodies-nvidia-h200-20261201T150928Z.json")
    t = kv.versions_table(rec)
    assert list(t.columns) == ["tail affine4-g64", "tail mxfp4-g32", "tail nvfp4-g16"]
    assert (t.loc["same bits"] == "5120/5120").all()
    ratio = t.loc["device new / old"].astype(float)
    assert ratio.tolist() == pytest.approx((t.loc["device ms, new"] / t.loc["device ms, old"]).astype(float).tolist())
    assert (ratio < 1).all()


@pytest.mark.parametrize("bad", [_made_up("kernel_bodies", cases=[]), _made_up("kernel_bodies", cases=[{"case": "x"}])])
def test_what_is_not_a_timed_kernel_bodies_record_is_refused(bad):
    with pytest.raises(ValueError, match="record must be a bench.kernel_bodies record with its timed cases"):
        kv.versions_table(bad)


@pytest.mark.parametrize(
    "bad, says",
    [
        (None, "record: must be a 'kernel_bodies' record"),
        ({"bench": "one_launch"}, "record: is a 'one_launch' record, expected 'kernel_bodies'"),
        ({"bench": "kernel_bodies", "cases": []}, "a 'kernel_bodies' record must have"),
    ],
)
def test_what_is_not_a_kernel_bodies_record_is_refused(bad, says):
    with pytest.raises(records.RecordError, match=says):
        kv.versions_table(bad)


def test_the_one_launch_rows_appear_where_the_record_ran_it():
    """bench.kernel_bodies also times the tail as one launch on CUDA: its rows come after
    the three launches', and a case without it leaves them blank."""
    rec = records.load("kernel_bodies", FEWER_RECORD)
    first, second = rec["cases"][0], rec["cases"][1]
    assert "one_launch" not in first  # recorded before the bench ran it
    timed = {"median_ms": 0.2}
    first["one_launch"] = {
        "check": {"new_vs_old": {"same_bits": 5120, "elements": 5120}},
        "device_ms_per_tail": {"old": {"median_ms": 0.2}, "new": {"median_ms": 0.15}},
        "one_wait_ms": {"old": timed, "new": {"median_ms": 0.25}},
    }
    t = kv.versions_table(rec)
    assert t.index[:5].tolist() == [
        "same bits",
        "device ms, old",
        "device ms, new",
        "device new / old",
        "one wait new / old",
    ]
    col = t[first["case"]]
    assert col["one launch: same bits"] == "5120/5120"
    assert col["one launch: device new / old"] == pytest.approx(0.75)
    assert col["one launch: one wait new / old"] == pytest.approx(1.25)
    assert t[second["case"]].isna()["one launch: device new / old"]


def test_the_sass_counts_record_reads_into_one_row_a_launch_and_format():
    # nvcc's counts of the same change as FEWER_RECORD: fp4's loops lost integer-pipe
    # instructions, bf16's did not move
    rec = records.load("sass_counts", "sass_counts-amd-epyc-20261201T172239Z.json")
    t = kv.sass_table(rec)
    assert len(t) == 3 * 5 and set(t["format"]) == {"bf16", "affine4", "affine8", "mxfp4", "nvfp4"}
    assert t["now / old"].tolist() == pytest.approx((t["loop now"] / t["loop old"]).tolist())
    fp4 = t[t["format"].isin(["mxfp4", "nvfp4"])]
    assert (fp4["int now"] < fp4["int old"]).all() and (t[t["format"] == "bf16"]["now / old"] == 1).all()


#: bench.sass_counts with the tail's one launch counted by phase (affine8, affine4; 65c56f3's
#: kernels as old): the record that showed the affine8 one launch needing more registers.
ONE_LAUNCH_RECORD = "sass_counts-amd-epyc-20261201T184927Z.json"


def test_a_record_with_the_one_launch_reads_into_a_row_a_phase_after_the_three_launches():
    rec = records.load("sass_counts", ONE_LAUNCH_RECORD)
    t = kv.sass_table(rec)
    phases = [f"one_launch/{p}" for p in kv.SASS_PHASES]
    assert t["launch"].tolist() == [
        *(["wo_residual", "ffn_gate_up", "ffn_down"] * 2),
        *phases,
        "one_launch",
        *phases,
        "one_launch",
    ]
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
    rec = records.load("sass_counts", ONE_LAUNCH_RECORD)
    rec["rows"] = [r for r in rec["rows"] if not (r["launch"] == "one_launch" and r["side"] == "old")]
    t = kv.sass_table(rec)
    one = t[t["launch"].str.startswith("one_launch")]
    assert len(one) == 2 * 5 and one["loop old"].isna().all() and one["now / old"].isna().all()
    assert one["loop now"].notna().all() and (t[~t.index.isin(one.index)]["loop old"] > 0).all()


def test_a_launch_of_its_own_without_its_old_row_is_refused():
    rec = records.load("sass_counts", ONE_LAUNCH_RECORD)
    rec["rows"] = [r for r in rec["rows"] if not (r["launch"] == "ffn_down" and r["side"] == "old")]
    with pytest.raises(ValueError, match="ffn_down affine8 has no old row"):
        kv.sass_table(rec)


@pytest.mark.parametrize(
    "bad",
    [
        _made_up("sass_counts", rows=[]),
        _made_up("sass_counts", rows=[{"side": "new"}]),
        _made_up("sass_counts", rows=[3]),
    ],
)
def test_what_is_not_a_sass_counts_record_with_two_sides_is_refused(bad):
    with pytest.raises(ValueError, match="record must be a bench.sass_counts record run with --old"):
        kv.sass_table(bad)


@pytest.mark.parametrize(
    "bad, says",
    [
        (None, "record: must be a 'sass_counts' record"),
        ({"bench": "kernel_bodies"}, "record: is a 'kernel_bodies' record, expected 'sass_counts'"),
        ({"bench": "sass_counts", "rows": []}, "a 'sass_counts' record must have"),
    ],
)
def test_what_is_not_a_sass_counts_record_is_refused(bad, says):
    with pytest.raises(records.RecordError, match=says):
        kv.sass_table(bad)


def test_kernel_bodies_prints_the_one_launch_rows_and_counts_its_check(capsys):
    """bench.kernel_bodies' table (no GPU needed to print a record): the one launch's
    check line and its two timed rows; a failed one-launch check fails the case."""
    from bench import kernel_bodies

    rec = records.load("kernel_bodies", FEWER_RECORD)
    case = rec["cases"][0]
    check = {s: {"worst": 1e-6, "passed": True} for s in ("old", "new")}
    case["one_launch"] = {
        "nt": 640,
        "row_units": 8,
        "groups": 132,
        "check": {**check, "passed": True, "new_vs_old": {"same_bits": 5120, "elements": 5120, "max_abs_diff": 0.0}},
        "device_ms_per_tail": {"old": {"median_ms": 0.2}, "new": {"median_ms": 0.15}},
        "one_wait_ms": {"old": {"median_ms": 0.2}, "new": {"median_ms": 0.25}},
    }
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
