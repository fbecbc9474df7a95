"""bench.sass_counts: what nvcc makes of the kernels, read without a GPU. Its SASS reading
on a written-out listing; its template values against the launches' own; and, where nvcc,
cuobjdump and nvdisasm are installed (the test extra brings the last two), a real count."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from bench import sass_counts as sc
from bench.common import sass as machine_code
from workbench import tail
from workbench.fold.weights import QUANT_FORMATS
from workbench.kernels import launch as kernel_launch
from workbench.kernels import one_launch
from workbench.kernels import source as ks

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
    instrs = machine_code.parse_sass(LISTING)
    assert [i.opcode for i in instrs][:5] == ["MOV", "S2R", "BRA", "ULDC", "LDG"]
    assert instrs[2].text.startswith("@!P0 BRA")
    loop = machine_code.longest_loop(instrs)
    assert [i.address for i in loop] == list(range(0x40, 0xA1, 0x10))  # 0x40 .. the branch at 0xa0
    assert machine_code.classify(loop) == {"fma": 2, "int": 1, "memory": 1, "other": 3}
    assert machine_code.longest_loop(instrs[:4]) == []  # only a forward branch


@pytest.mark.parametrize("label", list(sc.FORMATS))
def test_the_template_values_are_the_launches_own(monkeypatch, label):
    """launch_templates writes out PreparedTail.templates: the same values for weights
    prepared in that format (a small shape: hidden 128, branch 512, ffn 1024, block 256)."""
    monkeypatch.setattr(kernel_launch, "compiled_kernel", lambda *a, **k: object())
    quant = None if label == "bf16" else QUANT_FORMATS[label].as_quantize()
    w = tail.TailWeights.random(128, 512, 1024, seed=3, fold_block=256, dtype="bfloat16", quantize=quant)
    prep = kernel_launch.prepare_tail(tail.tail_launch(w), "cuda")
    shape = {"hidden": 128, "branch": 512, "ffn": 1024, "m": prep.rot["M"], "logp": prep.rot["LOGP"]}
    assert sc.launch_templates(label, shape=shape) == prep.templates()


def _listing(lines: list[str]) -> str:
    """cuobjdump's layout for instructions at 0x00, 0x10, ...: address comment, text, ';'."""
    return "\n".join(f"        /*{16 * i:04x}*/                   {t} ;" for i, t in enumerate(lines))


#: A one launch in miniature: wo's loop (0x20-0x60) whose shuffle has a warp-divergent copy
#: after the EXIT (0x170-0x1a0, entered by BRA.DIV and jumping back to 0x50); a grid
#: barrier's wait (0x80-0x90, reading the global timer, skipped by all but one thread);
#: gate_up's loop (0xb0-0xc0); the second wait (0xe0-0xf0); down's loop (0x110-0x150) with
#: a unit loop inside (0x120-0x130); EXIT; the cold copy; the padding nvcc ends with.
ONE = _listing(
    [
        "S2R R0, SR_TID.X",
        "ISETP.NE.AND P0, PT, R0, RZ, PT",
        "LDG.E R2, desc[UR4][R4.64]",
        "BRA.DIV UR4, 0x170",
        "SHFL.BFLY PT, R3, R2, 0x10, 0x1f",
        "FFMA R8, R3, R9, R8",
        "@P1 BRA 0x20",
        "@P0 BRA 0xa0",
        "CS2R R6, SR_GLOBALTIMERLO",
        "@P2 BRA 0x80",
        "BAR.SYNC.DEFER_BLOCKING 0x0",
        "IADD3 R4, R4, 0x1, RZ",
        "@P3 BRA 0xb0",
        "@P0 BRA 0x100",
        "CS2R R6, SR_GLOBALTIMERLO",
        "@P2 BRA 0xe0",
        "BAR.SYNC.DEFER_BLOCKING 0x0",
        "LOP3.LUT R3, R2, 0xf, R6, 0xea, !PT",
        "HFMA2 R7, R7, R7, R7",
        "@P4 BRA 0x120",
        "STG.E desc[UR4][R4.64], R8",
        "@P5 BRA 0x110",
        "EXIT",
        "WARPSYNC.COLLECTIVE R5, 0x1a0",
        "SHFL.BFLY P0, R3, R2, R7, R6",
        "ENDCOLLECTIVE",
        "BRA 0x50",
        "BRA 0x1b0",
        "NOP",
    ]
)

PHASES = tuple(k for k, _ in ks.ONE_LAUNCH_PHASES)


def test_the_one_launchs_loops_are_natural_loops_not_backward_spans():
    """The cold copy's jump back is the longest backward span (0x50-0x1a0), which is no
    loop; the control-flow graph finds the five loops, the unit loop inside down's."""
    instrs = machine_code.parse_sass(ONE)
    assert [i.address for i in machine_code.longest_loop(instrs)][::21] == [0x50, 0x1A0]
    flow = machine_code.control_flow(instrs)
    headers = [flow.blocks[lp.header][0].address for lp in machine_code.natural_loops(flow)]
    assert headers == [0x20, 0x80, 0xB0, 0xE0, 0x110, 0x120]
    assert [flow.blocks[lp.header][0].address for lp in machine_code.outer_loops(flow)] == [
        0x20,
        0x80,
        0xB0,
        0xE0,
        0x110,
    ]
    assert sorted(flow.blocks[b][0].address for b in flow.cold) == [0x170]
    assert all(flow.idom[b] < 0 for b, blk in enumerate(flow.blocks) if blk[0].address >= 0x1B0)  # padding
    wo = machine_code.loop_counts(flow, machine_code.outer_loops(flow)[0])
    assert (wo["header"], wo["instructions"], wo["cold_instructions"]) == (0x20, 5, 4)
    assert wo["classes"] == {"fma": 1, "int": 0, "memory": 1, "other": 3}


def test_the_one_launch_is_split_into_phases_at_its_grid_barriers():
    counts = machine_code.sass_counts(machine_code.parse_sass(ONE), PHASES)
    ph = counts["phases"]
    assert list(ph) == [*PHASES, "barriers"]
    # wo: the entry, its loop, the skip before the wait and the cold copy; the padding in no phase
    assert {k: v["instructions"] for k, v in ph.items()} == {
        "wo_residual": 12,
        "ffn_gate_up": 4,
        "ffn_down": 7,
        "barriers": 4,
    }
    assert sum(v["instructions"] for v in ph.values()) + 2 == counts["instructions"] == 29
    assert (ph["wo_residual"]["loop_instructions"], ph["wo_residual"]["loop_cold"]) == (5, 4)
    down = ph["ffn_down"]
    assert (down["loop_instructions"], down["inner_instructions"]) == (5, 2)
    assert down["loop_classes"] == {"fma": 1, "int": 1, "memory": 1, "other": 2}
    assert down["inner_classes"] == {"fma": 1, "int": 0, "memory": 0, "other": 1}
    assert [lp["header"] for lp in down["loops"]] == [0x110] and down["loops"][0]["inner"][0]["header"] == 0x120
    assert ph["barriers"]["loop_instructions"] == 4 and "loop_instructions" not in counts
    assert [lp["header"] for lp in counts["outer_loops"]] == [0x20, 0x80, 0xB0, 0xE0, 0x110]


def test_a_launch_of_its_own_keeps_the_longest_span_as_its_row_loop():
    counts = machine_code.sass_counts(machine_code.parse_sass(LISTING))
    assert counts["loop_instructions"] == 7 and counts["loop_classes"] == {"fma": 2, "int": 1, "memory": 1, "other": 3}
    # the written listing enters its outer loop twice (0x20 jumps to its branch at 0xa0): no
    # natural loop, so only the inner one is found (nvcc's loops have one entry, the header)
    assert "phases" not in counts and [lp["header"] for lp in counts["outer_loops"]] == [0x60]


def test_what_the_control_flow_cannot_read_is_refused():
    with pytest.raises(ValueError, match="should wait at 2 grid barriers"):
        machine_code.sass_counts(machine_code.parse_sass(LISTING), PHASES)
    with pytest.raises(ValueError, match="indirect jump at 0x10"):
        machine_code.control_flow(machine_code.parse_sass(_listing(["MOV R1, R2", "BRX R4 -0x10", "EXIT"])))
    with pytest.raises(ValueError, match="one function's listing"):
        machine_code.control_flow(machine_code.parse_sass(_listing(["MOV R1, R2"]) + "\n" + _listing(["EXIT"])))


@pytest.mark.parametrize("label", list(sc.FORMATS))
def test_the_one_launch_template_values_are_one_launch_tails_own(monkeypatch, label):
    """one_launch_templates writes out what OneLaunchTail builds in the shape shape_for gives
    a prepared tail of that format (the small shape of the test above; 4-bit: 640 threads,
    8 row units)."""
    monkeypatch.setattr(kernel_launch, "compiled_kernel", lambda *a, **k: object())
    quant = None if label == "bf16" else QUANT_FORMATS[label].as_quantize()
    w = tail.TailWeights.random(128, 512, 1024, seed=3, fold_block=256, dtype="bfloat16", quantize=quant)
    prep = kernel_launch.prepare_tail(tail.tail_launch(w), "cuda")
    chosen = one_launch.shape_for(prep)
    # the grid's group count is the tail's own (one_launch.groups_for: how many groups its
    # rows keep busy), not the format's, and no template value depends on it
    assert sc.one_launch_shape(label) == dataclasses.replace(chosen, groups=None)
    one = one_launch.OneLaunchTail(prep, dataclasses.replace(chosen, sm_count=1))
    shape = {"hidden": 128, "branch": 512, "ffn": 1024, "m": prep.rot["M"], "logp": prep.rot["LOGP"]}
    assert sc.one_launch_templates(label, shape=shape) == one.template
    assert [k for k, _ in one.template] == list(ks.one_launch_template())
    # each phase alone: its own launch's names, the one launch's values
    alone = sc.phase_templates(dict(one.template))
    for kernel, prefix in ks.ONE_LAUNCH_PHASES:
        assert list(alone[kernel]) == list(ks.KERNELS[kernel].template)
        assert alone[kernel]["NT"] == chosen.nt and alone[kernel]["FMT"] == dict(one.template)[prefix + "FMT"]


def test_an_unknown_format_is_refused_by_name():
    with pytest.raises(ValueError, match="fmt_label must be one of"):
        sc.launch_templates("int3")
    with pytest.raises(ValueError, match="fmt_label must be one of"):
        sc.one_launch_templates("int3")


def test_bad_arguments_exit_2(tmp_path, capsys):
    """Each bad argument: argparse's one line on stderr and exit status 2, before any compile."""
    for args, message in (
        (["--arch", "ampere"], "--arch must name a GPU architecture"),
        (["--old", str(tmp_path)], "--old must be a kernels folder"),
        (["--launches", "wo_residual,one_lunch"], "--launches must be a comma-separated list"),
    ):
        with pytest.raises(SystemExit) as stop:
            sc.main(["--no-record", *args])
        assert stop.value.code == 2 and message in capsys.readouterr().err, args


def test_a_text_both_sides_share_is_compiled_once(tmp_path, monkeypatch):
    """A copy of kernels/ as the old side gives the same texts: each distinct one is compiled
    once (of the 14 units of one format, 7 texts), and every row still gets its own counts."""
    copy = tmp_path / "kernels"
    shutil.copytree(ks.KERNEL_DIR, copy, ignore=shutil.ignore_patterns("metal_emulation"))
    compiled = []

    def fake_count(source, workdir, stem, *, phases=None, **tools):
        compiled.append(source)
        n = len(compiled)
        if phases is None:
            return {"registers": n, "spill_bytes": 0, "instructions": 10 * n}
        return {
            "registers": n,
            "spill_bytes": 0,
            "instructions": 10 * n,
            "phases": {p: {"instructions": n} for p in (*phases, "barriers")},
        }

    monkeypatch.setattr(sc, "count_launch", fake_count)
    rows = sc.run(("nvfp4",), old_dir=copy, nvcc="nvcc", cuobjdump="cuobjdump", nvdisasm="nvdisasm", arch="sm_90")
    assert len(compiled) == len(set(compiled)) == 7
    by = {(r["launch"], r["side"]): r for r in rows}
    assert sorted(by) == sorted((k, s) for k in sc.LAUNCHES for s in ("old", "new"))
    for launch in sc.LAUNCHES:
        new, old = by[(launch, "new")], by[(launch, "old")]
        assert {k: v for k, v in new.items() if k != "side"} == {k: v for k, v in old.items() if k != "side"}
    one_new, one_old = by[(sc.ONE_LAUNCH, "new")], by[(sc.ONE_LAUNCH, "old")]
    assert one_new["phases"] is not one_old["phases"]  # each side's "alone" counts are its own
    assert all("alone" in one_new["phases"][p] for p in ks.TAIL_KERNELS)
    # a changed text on one side is compiled for that side alone (a new folder: texts are read once a path)
    changed = tmp_path / "changed"
    shutil.copytree(copy, changed)
    body = changed / ks.KERNELS["ffn_down"].body
    body.write_text(body.read_text() + "\n// changed\n")
    compiled.clear()
    sc.run(("nvfp4",), old_dir=changed, nvcc="nvcc", cuobjdump="cuobjdump", nvdisasm="nvdisasm", arch="sm_90")
    # 7 + 3: ffn_down, the one launch (it holds that body too) and its down phase alone
    assert len(compiled) == len(set(compiled)) == 10


_TOOLS = shutil.which("nvcc") and machine_code.find_tool("cuobjdump") and machine_code.find_tool("nvdisasm")


@pytest.mark.skipif(not _TOOLS, reason="nvcc, cuobjdump or nvdisasm is not installed here")
def test_a_copy_of_the_kernels_counts_the_same_and_nothing_spills(tmp_path, capsys):
    copy = tmp_path / "kernels"
    shutil.copytree(ks.KERNEL_DIR, copy, ignore=shutil.ignore_patterns("metal_emulation"))
    assert sc.main(["--out-dir", str(tmp_path), "--formats", "nvfp4", "--old", str(copy)]) == 0
    rec = json.loads(next(Path(tmp_path).glob("sass_counts-*.json")).read_text())
    rows = {(r["launch"], r["side"]): r for r in rec["rows"]}
    assert sorted({k for k, _ in rows}) == sorted(sc.LAUNCHES) and rec["launches"] == list(sc.LAUNCHES)
    for launch in ks.TAIL_KERNELS:
        new, old = rows[(launch, "new")], rows[(launch, "old")]
        assert new["spill_bytes"] == 0 and new["registers"] > 0
        assert new["loop_instructions"] == old["loop_instructions"] > 0
        assert sum(new["loop_classes"].values()) == new["loop_instructions"]
        assert new["outer_loops"] == old["outer_loops"] and new["outer_loops"]
    one, one_old = rows[(sc.ONE_LAUNCH, "new")], rows[(sc.ONE_LAUNCH, "old")]
    assert one["spill_bytes"] == 0 and one["registers"] > 0 and one["phases"] == one_old["phases"]
    assert one["template"] == dict(sc.one_launch_templates("nvfp4")) and one["template"]["NT"] == 640
    for phase in (*ks.TAIL_KERNELS, "barriers"):
        ph = one["phases"][phase]
        assert ph["loops"] and sum(ph["loop_classes"].values()) == ph["loop_instructions"] > 0
    for phase in ks.TAIL_KERNELS:  # a row loop with unit loops in it; each phase compiled alone too
        assert one["phases"][phase]["inner_instructions"] > 0
        assert 0 < one["phases"][phase]["alone"]["registers"] <= 255
    assert sum(one["phases"][p]["instructions"] for p in one["phases"]) <= one["instructions"]
    assert rec["old_kernel_text"] == rec["kernel_text"]
    out = capsys.readouterr().out
    assert "new/old" in out and "the one launch, a phase a line" in out
    assert max(len(line) for line in out.splitlines() if not line.startswith("record:")) <= 100


@pytest.mark.skipif(not _TOOLS, reason="nvcc, cuobjdump or nvdisasm is not installed here")
def test_a_folder_from_before_the_one_launch_counts_it_from_kernels_alone(tmp_path, capsys):
    copy = tmp_path / "kernels"
    shutil.copytree(ks.KERNEL_DIR, copy, ignore=shutil.ignore_patterns("metal_emulation", ks.ONE_LAUNCH_BODY))
    assert sc.main(["--no-record", "--formats", "affine8", "--launches", "one_launch", "--old", str(copy)]) == 0
    out = capsys.readouterr().out
    assert "the one launch is counted from kernels/ alone" in out
    assert "affine8  new" in out and "affine8  old" not in out
