"""workbench.reports.launch_profile: the bound each launch's scheduler figures show, by its rule,
on made-up rows and on the committed H200 records (read through ``workbench.reports.records``)."""

from __future__ import annotations

import pytest

from workbench.reports import launch_profile as lb
from workbench.reports import records

#: The first --stalls profile of every launch: the record that showed the 4-bit formats'
#: launches bound by the ALU pipe, not by memory (notebook 08 shows its table).
STALLS_RECORD = "launch_profile-nvidia-h200-20261201T131614Z.json"


def _profile(table: list) -> dict:
    """A launch_profile record with every key its kind promises (None but the bench) and ``table``."""
    return {key: None for key in records.KINDS["launch_profile"].keys} | {"bench": "launch_profile", "table": table}


def _row(
    fma: float,
    alu: float,
    top: str = "long_scoreboard",
    fmt: str = "affine4",
    kernel: str = "custom_kernel_fat_ffn_gate_up_256_2_1_64",
) -> dict:
    return {
        "format": fmt,
        "kernel": kernel,
        "ms": 0.1,
        "read_TBps": 1.0,
        "scheduler": {
            "issue_active_pct": 60.0,
            "fma_pipe_pct": fma,
            "alu_pipe_pct": alu,
            "instructions": 2.0e6,
            "top_stalls": [[top, 3.0], ["wait", 1.0]],
        },
    }


@pytest.mark.parametrize(
    "fma,alu,top,bound",
    [
        (28.0, 63.0, "not_selected", "ALU pipe"),  # affine4's gate_up on the H200
        (70.0, 20.0, "math_pipe_throttle", "FMA pipe"),
        (12.0, 20.0, "long_scoreboard", "memory"),  # bf16's gate_up
        (45.0, 60.0, "not_selected", "unclear"),  # ALU busy but not 1.5x the FMA pipe
        (24.0, 49.6, "barrier", "unclear"),  # neither pipe over half busy, not waiting on loads
        (10.0, 30.0, "barrier", "unclear"),
    ],
)
def test_bound_of_follows_its_rule(fma, alu, top, bound):
    assert lb.bound_of(_row(fma, alu, top)) == bound


def test_bound_table_names_launches_and_counts_millions():
    t = lb.bound_table(
        _profile([_row(28.0, 63.0), _row(12.0, 20.0, fmt="bfloat16", kernel="custom_kernel_fat_tail_one_launch_512_5")])
    )
    assert list(t.columns) == list(lb.COLUMNS)
    assert t["launch"].tolist() == ["ffn_gate_up", "one launch"]
    assert t["M instr."].tolist() == [2.0, 2.0] and t["top stall"].tolist()[0] == "long_scoreboard 3.0"


@pytest.mark.parametrize("bad", [_profile([{"format": "bfloat16", "ms": 0.1}]), _profile([])])
def test_a_record_without_scheduler_figures_is_refused(bad):
    with pytest.raises(ValueError, match="profile must be a bench.launch_profile record made with --stalls"):
        lb.bound_table(bad)


@pytest.mark.parametrize(
    "bad, says",
    [
        (None, "profile: must be a 'launch_profile' record"),
        ({"bench": "kernel_bench", "table": []}, "profile: is a 'kernel_bench' record, expected 'launch_profile'"),
        ({"bench": "launch_profile", "table": []}, "profile: a 'launch_profile' record must have"),
    ],
)
def test_what_is_not_a_launch_profile_record_is_refused(bad, says):
    with pytest.raises(records.RecordError, match=says):
        lb.bound_table(bad)


def test_the_committed_record():
    """On the H200 (notebook 08 shows this table): every bf16 launch waits on memory, every
    one of the 4-bit formats' three launches is bound by the ALU pipe."""
    t = lb.bound_table(records.load("launch_profile", STALLS_RECORD))
    three = t[t["launch"] != "one launch"]
    assert (three[three["format"] == "bfloat16"]["bound"] == "memory").all()
    assert (three[three["format"].isin(["affine4", "nvfp4"])]["bound"] == "ALU pipe").all()
    assert len(three) == 9


def test_bound_change_pairs_the_launches_both_records_profiled():
    """The committed records before and after the 4-bit codes were placed by one
    mask-and-or (2026-12-01): affine4's ALU instructions fell in every launch and its wo and
    gate_up now wait on memory; nvfp4 stays bound by the ALU pipe."""
    # the profiles either side of that change: the proof it moved affine4's bound
    before = records.load("launch_profile", "launch_profile-nvidia-h200-20261201T145743Z.json")
    after = records.load("launch_profile", "launch_profile-nvidia-h200-20261201T151744Z.json")
    t = lb.bound_change(before, after)
    assert list(t.columns) == list(lb.CHANGE_COLUMNS)
    assert set(t["format"]) == {"affine4", "nvfp4"}  # bf16 was profiled before only
    a4 = t[t["format"] == "affine4"].set_index("launch")
    assert (a4["M ALU after"] < a4["M ALU before"]).all()
    assert a4.loc["ffn_gate_up", "bound before"] == "ALU pipe" and a4.loc["ffn_gate_up", "bound after"] == "memory"
    assert (t[t["format"] == "nvfp4"]["bound after"] == "ALU pipe").all()
    with pytest.raises(ValueError, match="share no launch"):
        lb.bound_change(before, {**after, "table": [dict(after["table"][0], format="float32")]})
    with pytest.raises(records.RecordError, match="before: is a 'one_launch' record, expected 'launch_profile'"):
        lb.bound_change({"bench": "one_launch"}, after)
    with pytest.raises(ValueError, match="after must be a bench.launch_profile record made with --stalls"):
        lb.bound_change(before, _profile([]))


def test_row_dot_table_reads_a_tensor_core_record():
    # the one tensor-core row dot run: tensor cores gained under a fifth over the kernels' row dot
    rec = records.load("tensor_core_rowdot", "tensor_core_rowdot-nvidia-h200-20261201T195337Z.json")
    own = lb.row_dot_table(rec)  # its own floor: MLX's host-timed copy
    device = lb.row_dot_table(rec, 4.13e12)
    assert list(own.columns) == ["device ms", "x floor", "/ CUDA cores", "worst scaled", "check"]
    assert (own["check"] == "pass").all()
    assert own.loc["kernels' row dot (CUDA cores)", "/ CUDA cores"] == 1.0
    # a floor half as long: each "x floor" about twice the record's own
    ratio = device["x floor"].astype(float) / own["x floor"].astype(float)
    assert (abs(ratio - rec["copy_bandwidth_Bps"] ** -1 * 4.13e12) < 1e-9).all()


def _row_dot(kind: str, **fields) -> dict:
    """A row-dot record of ``kind`` with every key its kind promises (None but these)."""
    return {key: None for key in records.KINDS[kind].keys} | {"bench": kind, "variants": {}} | fields


@pytest.mark.parametrize(
    "record, bw, word",
    [
        ({"variants": {}}, None, "record: names no kind"),
        ([], None, "record: must be a 'tensor_core_rowdot' record"),
        ({"bench": "one_launch"}, None, "record: is a 'one_launch' record, expected 'tensor_core_rowdot'"),
        (_row_dot("async_copy_rowdot", variants=[]), None, "record must be a row-dot bench record"),
        (_row_dot("tensor_core_rowdot", weight_bytes=1, copy_bandwidth_Bps=1.0), -1.0, "copy_bandwidth_Bps must"),
        (_row_dot("async_copy_rowdot", weight_bytes=1, copy_bandwidth_Bps=1.0), 0, "copy_bandwidth_Bps must"),
    ],
)
def test_row_dot_table_names_what_is_wrong(record, bw, word):
    with pytest.raises(ValueError, match=word):
        lb.row_dot_table(record, bw)
