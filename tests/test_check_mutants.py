"""Source-level mutants generated from a user's kernel text: each family is generated where
the source has its form, and every generated mutant of the test kernels that changes a
result is caught by the check (equivalent mutants are named as such)."""

import shutil

import pytest

from tests.test_check_source import LAUNCH, TAIL_SOURCE
from workbench.check import SourceLaunch
from workbench.check.mutants import KINDS, folder_mutant_study, mutant_study, source_mutants

#: A tail of one SIMD-group whose sum of squares is a shuffle butterfly (the wrong-lane family).
SHUFFLE_TAIL = """
uint t = thread_position_in_threadgroup.x;
threadgroup float h[HIDDEN];
threadgroup float act[FFN];
float ss = 0.0f;
for (uint i = t; i < HIDDEN; i += 32) {
  float s = 0.0f;
  for (uint j = 0; j < BRANCH; ++j) s += float(wo[i * BRANCH + j]) * branch[j];
  h[i] = residual[i] + s;
  ss += h[i] * h[i];
}
for (ushort o = 16; o > 0; o /= 2) ss += metal::simd_shuffle_xor(ss, o);
float inv = metal::rsqrt(ss / float(HIDDEN) + eps[0]);
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
for (uint f = t; f < FFN; f += 32) {
  float g = 0.0f, u = 0.0f;
  for (uint i = 0; i < HIDDEN; ++i) {
    float x = h[i] * inv * ffn_norm[i];
    g += float(gate[f * HIDDEN + i]) * x;
    u += float(up[f * HIDDEN + i]) * x;
  }
  act[f] = g / (1.0f + metal::exp(-g)) * u;
}
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
for (uint i = t; i < HIDDEN; i += 32) {
  float s = 0.0f;
  for (uint f = 0; f < FFN; ++f) s += float(down[i * FFN + f]) * act[f];
  out[i] = h[i] + s;
}
"""
SHUFFLE_LAUNCH = SourceLaunch(
    SHUFFLE_TAIL,
    LAUNCH.inputs,
    grid=(32, 1, 1),
    threadgroup=(32, 1, 1),
    template={"HIDDEN": "hidden", "BRANCH": "branch", "FFN": "ffn"},
    name="shuffle_tail",
)

FAST = {"seeds": range(4), "scales": (0.01, 1.0), "orders": ("ascending", "simd-groups-random"), "tolerance": 1e-4}


def test_each_family_is_generated_where_the_source_has_its_form():
    ms = source_mutants(SHUFFLE_TAIL)
    kinds = {k: [m for m in ms if m.kind == k] for k in KINDS}
    assert len(kinds["dropped barrier"]) == 2 and all(m.after == "(removed)" for m in kinds["dropped barrier"])
    assert len(kinds["bound +1"]) == len(kinds["bound -1"]) == 6  # the six `<` loops, not `o > 0`
    (lane,) = kinds["wrong lane"]
    assert "simd_shuffle_xor(ss, (o) ^ 1)" in lane.source and lane.line == 12
    assert all("h[(i) + 1]" in m.after or "act[(f) + 1]" in m.after for m in kinds["wrong index"])
    for m in ms:
        assert m.source != SHUFFLE_TAIL and m.source.count("\n") == SHUFFLE_TAIL.count("\n")
    assert source_mutants("x[i] = 1;") == []


def test_bad_input_is_refused_naming_the_parameter():
    with pytest.raises(ValueError, match="source"):
        source_mutants("  ")
    with pytest.raises(ValueError, match="kinds"):
        source_mutants(TAIL_SOURCE, kinds=("typo",))
    with pytest.raises(ValueError, match="launch"):
        mutant_study(TAIL_SOURCE)


@pytest.mark.parametrize("launch", [LAUNCH, SHUFFLE_LAUNCH], ids=["test_tail", "shuffle_tail"])
def test_every_mutant_that_changes_results_is_caught(emulator, launch):
    study = mutant_study(launch, **FAST)
    assert study.original_passed and study.original_same_bits, str(study)
    assert study.missed.empty, str(study)
    counts = study.counts()
    assert counts["caught"] >= 18 and counts["does not compile"] == 0, str(study)
    # One barrier of each guards nothing under the emulator: in test_tail each thread reads
    # back only rows it wrote itself; in shuffle_tail the one SIMD-group has met at the
    # shuffle, after every write to h[]. Named equivalent, not counted as misses.
    eq = study.table[study.table.status == "equivalent"]
    assert list(eq.kind) == ["dropped barrier"] and list(eq.line) == [11 if launch is LAUNCH else 14]


def test_a_kernels_folder_file_is_mutated_in_a_copy(emulator, tmp_path):
    folder = tmp_path / "my_kernels"
    from workbench.kernels.source import KERNEL_DIR

    shutil.copytree(KERNEL_DIR, folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    study = folder_mutant_study(
        folder, files=["wo_residual.body"], seeds=range(3), scales=(1.0,), orders=("ascending",), tolerance=1e-4
    )
    assert study.original_passed and len(study.table) >= 2 and study.missed.empty, str(study)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before  # only read
    with pytest.raises(ValueError, match="files"):
        folder_mutant_study(folder, files=["absent.body"])


def _step_source():
    from tests.check_user_steps import METAL_BODY, METAL_HEADER
    from workbench.check import StepSource

    tpl = {"HK": "HK", "HV": "HV", "DK": "DK", "DV": "DV", "K": "K", "C": "C"}
    return StepSource(METAL_BODY, grid=(6, 1, 1), threadgroup=(6, 1, 1), template=tpl, header=METAL_HEADER)


def test_every_mutant_of_a_steps_metal_source_that_changes_results_is_caught(emulator):
    study = mutant_study(_step_source(), seeds=range(2), tokens=8, orders=("ascending", "simd-groups-random"))
    assert study.original_passed and study.original_same_bits, str(study)
    assert study.missed.empty and study.counts()["does not compile"] == 0, str(study)
    # the body's nine loops, each bound one looser and one tighter; no barrier, shuffle or group array
    assert study.counts()["caught"] == 18 and set(study.table.kind) == {"bound +1", "bound -1"}, str(study)
    assert study.to_record()["counts"]["caught"] == 18


def test_the_kernels_folders_gdn_step_body_is_mutated_in_a_copy(emulator, tmp_path):
    from workbench.kernels.source import KERNEL_DIR

    folder = tmp_path / "my_kernels"
    shutil.copytree(KERNEL_DIR, folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    study = folder_mutant_study(
        folder, part="gdn", kinds=("dropped barrier",), seeds=range(2), tokens=4, orders=("simd-groups-random",)
    )
    assert set(study.table.file) == {"gdn_step.body"} and len(study.table) == 3, str(study)
    assert study.original_passed and study.missed.empty, str(study)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before  # only read
    with pytest.raises(ValueError, match="^part: must be one of 'tail', 'gdn', got 'step'"):
        folder_mutant_study(folder, part="step")
    with pytest.raises(ValueError, match="^launch: must be a SourceLaunch"):
        mutant_study(_step_source().source)
