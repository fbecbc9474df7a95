"""A check cut into shards: disjoint shards merge into the report of one run over their union,
bit for bit (in memory and through the command's records with their Parquet tables); an
interrupted run resumes from its journal to the same report; blocks are sized to a memory
budget, and a shape whose one case does not fit is refused naming the shape and the bytes."""

import json

import numpy as np
import pandas as pd
import pytest

from tests.check_user_tails import correct, eps_outside
from workbench.check import blocks, check_kernel, merge_reports, read_report
from workbench.check.__main__ import main
from workbench.check.budget import block_size, case_bytes
from workbench.studies.cases import case_floats

FEW = {"scales": (0.01, 1.0), "folds": (16, None)}


def _same(a, b):
    pd.testing.assert_frame_equal(a.cases, b.cases, check_exact=True)
    pd.testing.assert_frame_equal(a.faults, b.faults, check_exact=True)
    assert str(a) == str(b)
    assert a.passed == b.passed and a.problems == b.problems


def test_two_shards_merge_into_one_runs_report_bit_for_bit():
    one = check_kernel(correct, seeds=range(0, 110), **FEW)
    a = check_kernel(correct, seeds=range(0, 45), **FEW)
    per_case, first = case_bytes((64, 96, 80))
    b = check_kernel(correct, seeds=range(45, 110), memory_budget=first + 4 * per_case, **FEW)  # blocks of 5
    _same(merge_reports([b, a]), one)
    assert one.calibrated is not None  # the union calibrates where neither shard alone could be trusted to


def test_a_failing_subjects_shards_merge_to_its_failing_verdict():
    one = check_kernel(eps_outside, seeds=range(0, 60), **FEW)
    merged = merge_reports([check_kernel(eps_outside, seeds=range(k, k + 20), **FEW) for k in (0, 20, 40)])
    _same(merged, one)
    assert not merged.passed


def test_overlapping_or_mismatched_shards_are_refused():
    a = check_kernel(correct, seeds=range(0, 30), **FEW)
    with pytest.raises(ValueError, match="reports: the shards overlap \\(seed 20 "):
        merge_reports([a, check_kernel(correct, seeds=range(20, 40), **FEW)])
    with pytest.raises(ValueError, match="reports: shard 1 differs .* user's tolerance"):
        merge_reports([a, check_kernel(correct, seeds=range(30, 40), tolerance=1e-4, **FEW)])
    with pytest.raises(ValueError, match="reports: must be a non-empty sequence"):
        merge_reports([])


def test_an_interrupted_run_resumes_from_its_journal(tmp_path, monkeypatch):
    one = check_kernel(correct, seeds=range(0, 40), **FEW)
    per_case, first = case_bytes((64, 96, 80))
    budget = first + 3 * per_case  # blocks of four cases: several a run
    real, calls = blocks.reference, []

    def dies(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(blocks, "reference", dies)
    with pytest.raises(RuntimeError, match="killed"):
        check_kernel(correct, seeds=range(0, 40), memory_budget=budget, journal=tmp_path / "j", **FEW)
    monkeypatch.setattr(blocks, "reference", real)
    markers = list((tmp_path / "j").glob("block-*.json"))
    assert len(markers) == 3  # three blocks finished before the kill
    done = sum(len(json.loads(m.read_text())["seeds"]) for m in markers)
    assert 0 < done < 2 * 40
    _same(check_kernel(correct, seeds=range(0, 40), memory_budget=budget, journal=tmp_path / "j", **FEW), one)
    with pytest.raises(ValueError, match="journal: .* holds a run with another seeds"):
        check_kernel(correct, seeds=range(0, 41), journal=tmp_path / "j", **FEW)


def test_blocks_are_sized_to_the_budget_and_a_case_too_large_is_refused():
    per_case, first = case_bytes((2048, 2048, 8192))
    assert block_size((2048, 2048, 8192), 4 * 2**30) == 1 + (4 * 2**30 - first) // per_case == 3
    assert per_case == 22 * case_floats((2048, 2048, 8192))
    assert block_size((5120, 6144, 17408), 4 * 2**30) == 1  # Bonsai-27B's shape: one case a block in 4 GiB
    with pytest.raises(
        ValueError, match=r"memory_budget: one case at shape \(5120, 6144, 17408\) needs .* GiB \(\d+ bytes\)"
    ):
        check_kernel(correct, shapes=[(5120, 6144, 17408)], seeds=range(2), memory_budget=3 * 2**30)
    with pytest.raises(ValueError, match="memory_budget: must be a positive int"):
        check_kernel(correct, seeds=range(2), memory_budget=-1)


def test_progress_counts_cases_on_stderr(capsys):
    check_kernel(correct, seeds=range(0, 12), scales=(1.0,), faults=(), progress=True)
    err = capsys.readouterr().err
    assert "12/12" in err and "cases" in err


def test_the_command_checks_shards_and_merges_their_records(tmp_path, capsys):
    common = ["--scales", "0.01,1", "--shape", "64,32,48", "--fold", "0", "--quiet"]
    assert (
        main(["tests.check_user_tails:correct", "--seeds", "0:35", *common, "--record", str(tmp_path / "a.json")]) == 0
    )
    assert (
        main(["tests.check_user_tails:correct", "--seeds", "35:100", *common, "--record", str(tmp_path / "b.json")])
        == 0
    )
    assert not list(tmp_path.glob("*.partial"))  # the journal is gone once the record is written
    assert (
        main(["--merge", str(tmp_path / "b.json"), str(tmp_path / "a.json"), "--record", str(tmp_path / "m.json")]) == 0
    )
    one = check_kernel(correct, seeds=range(100), shapes=[(64, 32, 48)], folds=(None,), scales=(0.01, 1.0))
    _same(read_report(tmp_path / "m.json"), one)
    _same(
        read_report(tmp_path / "a.json"),
        check_kernel(correct, seeds=range(35), shapes=[(64, 32, 48)], folds=(None,), scales=(0.01, 1.0)),
    )
    rec = json.loads((tmp_path / "m.json").read_text())
    assert rec["tables"] == {"cases": "m.cases.parquet", "faults": "m.faults.parquet"}
    assert len(pd.read_parquet(tmp_path / "m.cases.parquet")) == 200
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["tests.check_user_tails:correct", "--seeds", "5:5"])
    assert e.value.code == 2 and "A < B" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["tests.check_user_tails:correct", "--memory-budget", "lots"])
    assert e.value.code == 2 and "--memory-budget" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["tests.check_user_tails:correct", "--shape", "5120,6144,17408", "--memory-budget", "3G", "--quiet"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--memory-budget: one case at shape (5120, 6144, 17408)" in err


def test_the_seeds_of_a_shard_are_the_same_cases_as_in_the_whole():
    whole = check_kernel(correct, seeds=range(0, 20), scales=(1.0,), faults=())
    part = check_kernel(correct, seeds=range(7, 13), scales=(1.0,), faults=())
    got = whole.cases[whole.cases.seed.between(7, 12)].reset_index(drop=True)
    np.testing.assert_array_equal(got[["worst", "ref_worst"]].to_numpy(), part.cases[["worst", "ref_worst"]].to_numpy())


def test_the_check_beside_a_worker_process_is_the_sequential_checks_bits():
    """With the implementation in its worker process, the truth and faults run on a thread of their
    own and the reference beside the worker's calls: the same rows as the check run in order."""
    from workbench.check import CallableSubject

    kw = {"shapes": [(64, 32, 48)], "seeds": range(6), **FEW}
    a = check_kernel(CallableSubject(correct), **kw)
    b = check_kernel(CallableSubject(correct, process=False), **kw)
    assert "worker process" in a.checked[0] and "worker process" not in b.checked[0]
    pd.testing.assert_frame_equal(a.cases, b.cases, check_exact=True)
    pd.testing.assert_frame_equal(a.faults, b.faults, check_exact=True)


def test_the_columns_of_the_cases_are_computed_once_whatever_the_implementation(monkeypatch):
    """A second implementation checked on the same cases reads the truth, the reference and the
    fault rows kept from the first (workbench.check.columns): the same report as computed afresh."""
    from workbench.check import columns

    kw = {"shapes": [(64, 32, 48)], "seeds": range(7), **FEW}
    columns.COLUMNS.clear()
    fresh = check_kernel(eps_outside, **kw)
    check_kernel(correct, **kw)  # keeps the columns of these cases
    calls = []
    faulty, truth = blocks.faulty, blocks.truth
    monkeypatch.setattr(blocks, "faulty", lambda *a, **k: calls.append("faulty") or faulty(*a, **k))
    monkeypatch.setattr(blocks, "truth", lambda *a, **k: calls.append("truth") or truth(*a, **k))
    _same(check_kernel(eps_outside, **kw), fresh)
    assert not calls
    other = check_kernel(eps_outside, **{**kw, "scales": (1.0,)})  # other scales: other cases
    assert "truth" in calls and "faulty" in calls and len(other.cases) == 2 * 7  # two folds
