"""The three-way comparison: fused vs host vs truth, its verdicts, its faults and its table."""

from __future__ import annotations

import pytest

from workbench import tail as T
from workbench.studies.three_way import (
    FAULTS,
    VERDICTS,
    faulty_fused_tail,
    three_way,
    three_way_table,
    verdict,
)
from workbench.tail.comparison import compare
from workbench.tail.frink_case import seed_case


def test_three_way_on_the_seed_case():
    c = seed_case()
    r = three_way(c.weights, c.branch, c.residual)
    assert r.fused_vs_truth.passed and r.host_vs_truth.passed and r.fused_vs_host.passed
    assert r.waits == {"unfused": 2, "fused": 1, "host": 0, "truth": 0}
    assert r.verdict == VERDICTS[(True, True)]


@pytest.mark.parametrize("fault", FAULTS)
def test_three_way_tells_a_wrong_kernel_apart(fault):
    w = T.TailWeights.random(256, 256, 512, seed=7, fold_block=64)
    br, res = T.random_inputs(w, seed=8)
    r = three_way(w, br, res, fault=fault)
    assert not r.fused_vs_truth.passed and r.host_vs_truth.passed
    assert "WRONG" in r.verdict
    assert r.waits["fused"] == 1


def test_verdicts_cover_every_case():
    ok, bad = compare([1.0], [1.0]), compare([2.0], [1.0])
    assert verdict(ok, ok) == VERDICTS[(True, True)]
    assert "WRONG" in verdict(bad, ok)
    assert "float32 itself" in verdict(bad, bad)
    assert verdict(ok, bad) == VERDICTS[(True, False)]
    with pytest.raises(ValueError, match="fault: must be one of"):
        c = seed_case()
        faulty_fused_tail(c.weights, c.branch, c.residual, "typo")


def test_three_way_table_columns():
    c = seed_case()
    df = three_way_table([("seed", c.weights, c.branch, c.residual)], figures=False)
    assert list(df.columns) == [
        "case",
        "shape",
        "weights",
        "fold",
        "fused~truth",
        "host~truth",
        "fused~host",
        "waits unfused/fused/oracle",
        "verdict",
    ]
    assert df.iloc[0]["shape"] == "64x96x80" and df.iloc[0]["fold"] == "16/input"
    assert df.iloc[0]["waits unfused/fused/oracle"] == "2/1/0"
    full = three_way_table([("seed", c.weights, c.branch, c.residual)])
    assert "fused-truth worst" in full.columns
