"""workbench.reports.gpu_check and .kernel_bench: the tables of ``bench.gpu_check`` and ``bench.kernel_bench``
records, on the committed H200 records (notebooks 03 and 07 print them) and on records
made up here."""

from __future__ import annotations

import copy

import pandas as pd
import pytest

from workbench.reports import gpu_check, kernel_bench, records
from workbench.reports.sanitize import FORMATS

#: The gpu_check run of the kernel text notebook 08 is about (every format, Bonsai's shape
#: included, the one launch and the three launches both checked).
CHECKS = "gpu_check-nvidia-h200-20261201T181553Z.json"
#: A run from before the one launch was the CUDA path: no three-launch column, and its
#: Bonsai-27B cases named "random" (the table names them by their shape).
EARLIER_CHECKS = "gpu_check-nvidia-h200-20261201T053720Z.json"
#: The benchmark notebook 08 shows against the floor.
BENCH = "kernel_bench-nvidia-h200-20261201T060559Z.json"


def test_gpu_check_table_on_the_kernel_texts_run():
    rec = records.load("gpu_check", CHECKS)
    t = gpu_check.gpu_check_table(rec)
    assert list(t.columns) == list(gpu_check.CHECK_COLUMNS) and len(t) == len(rec["checks"]) == 29
    assert t["pass"].all() and set(t["tol"]) == {2e-4}
    assert t.iloc[0]["launch"] == "test case" and t.iloc[0]["fold"] == "16"
    bonsai = t[t["launch"] == "Bonsai-27B"]
    assert set(bonsai["weights"].str.split("-").str[0]) == set(FORMATS) and (bonsai["shape"] == "5120x6144x17408").all()
    heads = t[t["launch"] == "head"]
    assert len(heads) == 6 and (heads["3 launches worst"] == "-").all()  # the head is one launch of its own
    assert (t[t["launch"] != "head"]["3 launches worst"] != "-").all()


def test_gpu_check_table_names_bonsai_by_its_shape_in_earlier_records():
    t = gpu_check.gpu_check_table(records.load("gpu_check", EARLIER_CHECKS))
    assert (t[t["shape"] == "5120x6144x17408"]["launch"] == "Bonsai-27B").all()
    assert (t["3 launches worst"] == "-").all()  # checked apart only since the one launch runs on CUDA


def test_format_summary_folds_every_case_into_its_format():
    rec = records.load("gpu_check", CHECKS)
    s = gpu_check.format_summary(rec)
    assert list(s.columns) == list(gpu_check.SUMMARY_COLUMNS)
    assert list(s["weights"]) == list(FORMATS)  # the record's order, which is the kernels' formats'
    assert s["cases"].sum() == len(rec["checks"]) and s["pass"].all() and set(s["tol"]) == {"2e-04"}
    assert "Bonsai-27B" in s.set_index("weights").loc["affine4", "launches"]
    worst = max(c["worst"] for c in rec["checks"] if c["weights"] == "float32")
    assert s.set_index("weights").loc["float32", "kernel worst"] == f"{worst:.1e}"


def test_a_failed_case_shows_in_both_tables():
    rec = copy.deepcopy(records.load("gpu_check", CHECKS))
    rec["checks"][3]["passed"] = False
    assert not gpu_check.gpu_check_table(rec)["pass"].iloc[3]
    assert not gpu_check.format_summary(rec).set_index("weights").loc["float32", "pass"]


@pytest.mark.parametrize(
    "fold, label",
    [
        (None, "none"),
        ("None", "none"),
        ("HadamardFold(block=16 (= 1 x 2^4), dim=96, signs=yes, perm=none, site=INPUT)", "16"),
        ("HadamardFold(block=192 (= 12 x 2^4), dim=192, signs=yes, perm=yes, site=INPUT)", "192 perm"),
    ],
)
def test_fold_label(fold, label):
    assert gpu_check.fold_label(fold) == label


@pytest.mark.parametrize("bad", ["HadamardFold()", 16])
def test_fold_label_refuses_what_is_not_a_fold(bad):
    with pytest.raises(ValueError, match="fold: must be a HadamardFold's repr"):
        gpu_check.fold_label(bad)


def test_floor_table_and_figures():
    rec = records.load("kernel_bench", BENCH)
    t = kernel_bench.floor_table(rec)
    assert list(t.columns) == ["bfloat16", "affine4-g64", "affine8-g64", "mxfp4-g32", "nvfp4-g16"]
    assert t.index[0] == "floor" and "kernels, device" in t.index and "torch_cuda_graph, one wait" in t.index
    assert t.loc["torch_cuda_graph, device"].drop("bfloat16").isna().all()  # PyTorch ran bf16 only
    fig = kernel_bench.floor_figures(rec)
    assert fig["bf16_device_x"] == pytest.approx(t.loc["kernels, device", "bfloat16"] / t.loc["floor", "bfloat16"])
    assert fig["bf16_device_x"] < fig["bf16_torch_graph_x"]
    assert list(fig["quant_device_x"]) == list(t.columns[1:]) and list(fig["graph_over_kernels"]) == list(t.columns)
    assert round(fig["copy_TBps"], 2) == 4.21 and fig["bf16_wait_extra_ms"] > 0


def test_floor_figures_need_bf16_first():
    rec = copy.deepcopy(records.load("kernel_bench", BENCH))
    rec["bench"]["cases"].reverse()
    with pytest.raises(ValueError, match="its first case must be bf16"):
        kernel_bench.floor_figures(rec)


def test_records_of_another_kind_are_refused():
    bench = records.load("kernel_bench", BENCH)
    checks = records.load("gpu_check", CHECKS)
    with pytest.raises(records.RecordError, match="expected 'gpu_check'"):
        gpu_check.gpu_check_table(bench)
    with pytest.raises(records.RecordError, match="expected 'kernel_bench'"):
        kernel_bench.floor_table(checks)
    with pytest.raises(ValueError):
        gpu_check.gpu_check_table({"bench": "gpu_check"})  # no checks, no header
    empty = dict(checks, checks=[])
    with pytest.raises(ValueError, match="with its checks"):
        gpu_check.gpu_check_table(empty)
    no_cases = copy.deepcopy(bench)
    no_cases["bench"]["cases"] = []
    with pytest.raises(ValueError, match="with their cases"):
        kernel_bench.floor_table(no_cases)
    assert isinstance(kernel_bench.floor_table(bench), pd.DataFrame)


# -- the same checks run again ---------------------------------------------------------

#: The checks of kernel text c60431e0a55f, and the same command rerun with that record's
#: seed after the package was regrouped by role: the evidence that the move changed no result.
CHECKS_BEFORE = "gpu_check-nvidia-h200-20261201T181553Z.json"
CHECKS_AFTER = "gpu_check-nvidia-h200-20261202T014126Z.json"


def test_the_rerun_reproduces_every_figure_bit_for_bit():
    before, after = records.load("gpu_check", CHECKS_BEFORE), records.load("gpu_check", CHECKS_AFTER)
    assert before["seed"] == after["seed"] and before["kernel_text"] == after["kernel_text"]
    table = gpu_check.reproduced(before, after)
    assert len(table) == len(before["checks"]) == 29 and table["same"].all() and (table["figures"] >= 7).all()


def test_reproduced_names_a_figure_that_moved_and_refuses_other_seeds_or_cases():
    import copy

    before = records.load("gpu_check", CHECKS_BEFORE)
    moved = copy.deepcopy(before)
    moved["checks"][3]["worst"] *= 1 + 2**-20
    table = gpu_check.reproduced(before, moved)
    assert not table["same"][3] and table["differ"][3] == "worst" and table["same"].drop(3).all()
    with pytest.raises(ValueError, match="second: must have run first's seed"):
        gpu_check.reproduced(before, {**moved, "seed": 1})
    with pytest.raises(ValueError, match="second: must check the same cases"):
        gpu_check.reproduced(before, {**moved, "checks": moved["checks"][:-1]})
    with pytest.raises(ValueError, match="expected 'gpu_check'"):
        gpu_check.reproduced(before, records.load("one_launch", "one_launch-nvidia-h200-20261201T165653Z.json"))
