"""bench.sass_counts: what nvcc makes of the kernels, read without a GPU. Its SASS reading
on a written-out listing; its template values against the launches' own; and, where nvcc,
cuobjdump and nvdisasm are installed (the test extra brings the last two), a real count."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import sass_counts as sc
from workbench import kernel_launch, kernel_source as ks, tail
from workbench.weights import QUANT_FORMATS

#: A row loop as cuobjdump prints one: a backward branch to 0x0040 closes a span holding
#: a shorter loop (0x0060-0x0080); a forward branch and a predicated one do not count.
LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                  /* 0x00000a0000017a02 */
        /*0010*/                   S2R R0, SR_TID.X ;                      /* 0x0000000000007919 */
        /*0020*/              @!P0 BRA 0xa0 ;                              /* 0x0000000000008947 */
        /*0030*/                   ULDC.64 UR4, c[0x0][0x118] ;            /* 0x0000460000047ab9 */
        /*0040*/                   LDG.E.EF R2, desc[UR4][R4.64] ;         /* 0x0000000404027981 */
        /*0050*/                   LOP3.LUT R3, R2, 0xf, R6, 0xea, !PT ;   /* 0x0000000f02037812 */
        /*0060*/                   FADD R3, R3, -8388608 ;                 /* 0x4b00000003037421 */
        /*0070*/                   FFMA R8, R3, R9, R8 ;                   /* 0x0000000903087223 */
        /*0080*/              @!P1 BRA 0x60 ;                              /* 0x0000000000009947 */
        /*0090*/                   SHFL.BFLY PT, R0, R8, 0x10, 0x1f ;      /* 0x0e001f0008007f89 */
        /*00a0*/               @P2 BRA 0x40 ;                              /* 0x0000000000002947 */
        /*00b0*/                   EXIT ;                                  /* 0x000000000000794d */
"""


def test_the_listing_is_read_into_opcodes_and_the_longest_loop():
    instrs = sc.parse_sass(LISTING)
    assert [i.opcode for i in instrs][:5] == ["MOV", "S2R", "BRA", "ULDC", "LDG"]
    assert instrs[2].text.startswith("@!P0 BRA")
    loop = sc.longest_loop(instrs)
    assert [i.address for i in loop] == list(range(0x40, 0xA1, 0x10))  # 0x40 .. the branch at 0xa0
    assert sc.classify(loop) == {"fma": 2, "int": 1, "memory": 1, "other": 3}
    assert sc.longest_loop(instrs[:4]) == []  # only a forward branch


@pytest.mark.parametrize("label", list(sc.FORMATS))
def test_the_template_values_are_the_launches_own(monkeypatch, label):
    """launch_templates writes out PreparedTail.templates: the same values for weights
    prepared in that format (a small shape: hidden 128, branch 512, ffn 1024, block 256)."""
    monkeypatch.setattr(kernel_launch, "_kernel", lambda *a, **k: object())
    quant = None if label == "bf16" else QUANT_FORMATS[label].as_quantize()
    w = tail.TailWeights.random(128, 512, 1024, seed=3, fold_block=256, dtype="bfloat16", quantize=quant)
    prep = kernel_launch.prepare_tail(tail.tail_launch(w), "cuda")
    shape = {"hidden": 128, "branch": 512, "ffn": 1024, "m": prep.rot["M"], "logp": prep.rot["LOGP"]}
    assert sc.launch_templates(label, shape=shape) == prep.templates()


def test_an_unknown_format_is_refused_by_name():
    with pytest.raises(ValueError, match="fmt_label must be one of"):
        sc.launch_templates("int3")


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert sc.main(["--no-record", "--arch", "ampere"]) == 2
    assert "--arch must name a GPU architecture" in capsys.readouterr().out
    assert sc.main(["--no-record", "--old", str(tmp_path)]) == 2
    assert "--old must be a kernels folder" in capsys.readouterr().out


_TOOLS = shutil.which("nvcc") and sc.find_tool("cuobjdump") and sc.find_tool("nvdisasm")


@pytest.mark.skipif(not _TOOLS, reason="nvcc, cuobjdump or nvdisasm is not installed here")
def test_a_copy_of_the_kernels_counts_the_same_and_nothing_spills(tmp_path, capsys):
    copy = tmp_path / "kernels"
    shutil.copytree(ks.KERNEL_DIR, copy, ignore=shutil.ignore_patterns("metal_emulation"))
    assert sc.main(["--out-dir", str(tmp_path), "--formats", "nvfp4", "--old", str(copy)]) == 0
    rec = json.loads(next(Path(tmp_path).glob("sass_counts-*.json")).read_text())
    rows = {(r["launch"], r["side"]): r for r in rec["rows"]}
    assert sorted({k for k, _ in rows}) == sorted(ks.TAIL_KERNELS)
    for launch in ks.TAIL_KERNELS:
        new, old = rows[(launch, "new")], rows[(launch, "old")]
        assert new["spill_bytes"] == 0 and new["registers"] > 0
        assert new["loop_instructions"] == old["loop_instructions"] > 0
        assert sum(new["loop_classes"].values()) == new["loop_instructions"]
    assert rec["old_kernel_text"] == rec["kernel_text"]
    assert "new/old" in capsys.readouterr().out
