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
