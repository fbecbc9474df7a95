"""The checker checked: deliberately broken copies of ``kernels/``, each of which the
Metal-on-CPU check must catch.

Each mutant edits the text of one file of a copy of ``kernels/`` (the text it replaces
must be there exactly as often as stated, so a mutant cannot silently stop mutating when
the kernels change) and names how it must be caught: ``compile`` (clang against the
stand-in header refuses it, as Metal's compiler would), ``emulator`` (the emulator stops
the launch: divergent barrier, guard-page fault, threadgroup memory over 32 KB), or
``result`` (the emulator's schedules -- three thread orders with the SIMD-groups in step,
three with them running apart -- give different bits, or the result misses the float64
oracle). An unmutated copy passes, so a catch is the mutant's doing.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from workbench import tail as T
from workbench.kernels import emulated as KE
from workbench.kernels import metal_emulation as ME
from workbench.kernels import source as ks
from workbench.studies.exact_oracle import host_tail_exact
from workbench.tail.comparison import compare

pytestmark = pytest.mark.skipif(ME.clang() is None, reason="clang++ is not installed (apt-get install clang)")


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    edits: tuple[tuple[str, str], ...]  # (old text, new text), each old text found exactly once
    caught: str  # "compile" | "emulator" | "result"
    match: str = ""  # what the compile or emulator message must say
    wide: bool = False  # run at hidden 8192 (the 32 KB boundary) instead of the small folded case
    quantized: bool = False  # the small folded case in affine 8-bit weights (x tiled: common.h, tile_x)


_SCATTER = tuple((f"xs[d.{c} >> 1] =", f"xs[(d.{c} >> 1) + 1] =") for c in "xyzw")

MUTANTS = [
    Mutant(
        "dropped-barrier-after-scatter",
        "common.h",
        (
            (
                "        xs4[i4] = v;\n      }\n    }\n  }\n  GROUP_BARRIER();\n}",
                "        xs4[i4] = v;\n      }\n    }\n  }\n}",
            ),
        ),
        "result",
    ),
    Mutant(
        "dropped-barrier-after-warp-butterflies",
        "common.h",
        (
            (
                "        x[i] = v[c];\n      }\n    }\n  }\n  GROUP_BARRIER();\n}",
                "        x[i] = v[c];\n      }\n    }\n  }\n}",
            ),
        ),
        "result",
    ),
    Mutant(
        "lane-butterfly-difference-reversed",
        "common.h",
        (("v[c] = (lane & h) ? p - v[c] : v[c] + p;", "v[c] = (lane & h) ? v[c] - p : v[c] + p;"),),
        "result",
    ),
    Mutant(
        "barrier-inside-if-lane-0",
        "common.h",
        (
            (
                "  if (lane == 0) {\n    red[warp] = v;\n  }\n  GROUP_BARRIER();",
                "  if (lane == 0) {\n    red[warp] = v;\n    GROUP_BARRIER();\n  }",
            ),
        ),
        "emulator",
        "divergent barrier",
    ),
    Mutant(
        "early-exit-before-group-sum",
        "ffn_down.body",
        (
            (
                "  const RowSums<DR> acc = group_sums<NT>(",
                "  if (lid >= 32) return;\n  const RowSums<DR> acc = group_sums<NT>(",
            ),
        ),
        "emulator",
        "divergent barrier.*finished",
    ),
    Mutant(
        "scatter-one-past-the-end",
        "common.h",
        _SCATTER,
        "emulator",
        "memory fault.*past the end of threadgroup array 'xs4'",
    ),
    Mutant(
        "threadgroup-pointer-passed-as-device",
        "wo_residual.body",
        (("DevVec((const DEV float4*)x)", "DevVec(xs4)"),),
        "compile",
        "DevVec",
    ),
    Mutant(
        "device-pointer-passed-as-threadgroup",
        "ffn_down.body",
        (("group_sums<NT>(part, red, lane, warp)", "group_sums<NT>(part, out, lane, warp)"),),
        "compile",
        "address space",
    ),
    Mutant(
        "as-type-of-the-wrong-size",
        "prelude_metal.h",
        (("#define BITS_F32(u) as_type<float>(u)", "#define BITS_F32(u) as_type<float>((u16)(u))"),),
        "compile",
        "same size",
    ),
    Mutant(
        "three-component-uint4",
        "prelude_metal.h",
        (("uint4((a), (b), (c), (d))", "uint4((a), (b), (c))"),),
        "compile",
        "exactly as many components",
    ),
    Mutant(
        "double-accumulator",
        "common.h",
        (
            (
                "  float t = 0.0f;\n  for (int i = 0; i < NT / 32; ++i) {",
                "  double t = 0.0;\n  for (int i = 0; i < NT / 32; ++i) {",
            ),
        ),
        "compile",
        "metal_has_no_double_type",
    ),
    Mutant(
        "last-row-never-written",
        "wo_residual.body",
        (("for (; r < ROWS; r += ngroups * NW)", "for (; r < ROWS - 1; r += ngroups * NW)"),),
        "result",
    ),
    Mutant(
        "norm-read-before-staged",
        "common.h",
        (("const float inv = rms_inv<W, NT, true>(", "const float inv = rms_inv<W, NT, false>("),),
        "result",
    ),
    Mutant(
        "wrong-simd-lane",
        "prelude_metal.h",
        (
            (
                "const int lane = (int)thread_index_in_simdgroup;",
                "const int lane = (int)thread_index_in_simdgroup & 15;",
            ),
        ),
        "result",
    ),
    Mutant(
        "gate-up-scratch-beside-n-at-8192",
        "ffn_gate_up.body",  # the layout before the 32 KB fix
        (
            (
                "  GROUP_SHARED float4 xs4[F::XL4 + (STAGE ? RED4 : 0) + (SUMS ? F::SUM4 : 0)];\n"
                "  GRP float* red = (GRP float*)(STAGE ? xs4 + F::XL4 : xs4);",
                "  GROUP_SHARED float4 xs4[F::XL4 + (SUMS ? F::SUM4 : 0)];\n  GROUP_SHARED float red[NT / 32];",
            ),
        ),
        "emulator",
        "threadgroup memory over the limit.*32800",
        wide=True,
    ),
    Mutant(
        "dropped-barrier-after-tile-x",
        "common.h",
        (
            (
                "      xs4[8 * line + (j ^ (line & 7))] = v[j];\n    }\n  }\n  GROUP_BARRIER();\n}",
                "      xs4[8 * line + (j ^ (line & 7))] = v[j];\n    }\n  }\n}",
            ),
        ),
        "result",
        quantized=True,
    ),
    Mutant(
        "tiled-x-read-unswizzled",
        "common.h",
        (("      xu.v[j] = line[(lo + j) ^ m];", "      xu.v[j] = line[lo + j];"),),
        "result",
        quantized=True,
    ),
    Mutant(
        "x-sums-of-a-line-all-its-first",
        "common.h",
        (("          xsum[i] = block_sum<F::SB>(v + b * (F::SB / 4));", "          xsum[i] = block_sum<F::SB>(v);"),),
        "result",
        quantized=True,
    ),
]


def _case(wide: bool, quantized: bool = False) -> tuple[T.TailWeights, np.ndarray, np.ndarray]:
    # m = 12 x 2^4 with a permutation: the scatter, the butterflies and the table mix all run.
    quant = {"mode": "affine", "bits": 8, "group_size": 64} if quantized else None
    w = (
        T.TailWeights.random(8192, 64, 64, seed=9)
        if wide
        else T.TailWeights.random(
            64,
            192,
            128,
            seed=2,
            fold_block=192,
            fold_permute=True,
            dtype="bfloat16" if quantized else "float32",
            quantize=quant,
        )
    )
    br, res = T.random_inputs(w, seed=2)
    return w, br, res


def _mutate(root: Path, m: Mutant) -> Path:
    d = root / m.id
    shutil.copytree(ks.KERNEL_DIR, d, ignore=shutil.ignore_patterns("metal_emulation"))
    path = d / m.file
    text = path.read_text()
    for old, new in m.edits:
        assert text.count(old) == 1, f"{m.id}: {old!r} is in {m.file} {text.count(old)} times, not once"
        text = text.replace(old, new)
    path.write_text(text)
    return d


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Every mutant's copy of kernels/ (and an unmutated one), their kernels compiled two at a time."""
    root = tmp_path_factory.mktemp("mutants")
    out = {m.id: _mutate(root, m) for m in MUTANTS}
    out["unmutated"] = _mutate(root, Mutant("unmutated", "common.h", (), "result"))
    sources = []
    for m in MUTANTS:
        sources += KE.emulated_tail_sources(T.tail_launch(_case(m.wide, m.quantized)[0]), kernel_dir=out[m.id])
    sources += KE.emulated_tail_sources(T.tail_launch(_case(False)[0]), kernel_dir=out["unmutated"])

    def attempt(src: str) -> None:
        try:
            ME.compile_source(src)
        except ME.MetalCompileError:
            pass  # the test asserts it

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(attempt, sources))
    return out


def _orders(w, br, res, d) -> dict[str, np.ndarray]:
    return {o: KE.emulated_tail(T.tail_launch(w), br, res, order=o, seed=11, kernel_dir=d) for o in ME.SCHEDULES}


def test_the_unmutated_copy_passes(folders):
    w, br, res = _case(False)
    outs = _orders(w, br, res, folders["unmutated"])
    assert len({o.tobytes() for o in outs.values()}) == 1
    assert compare(outs["ascending"], host_tail_exact(w, br, res)).passed


def test_there_are_at_least_ten_mutants_of_bodies_and_prelude():
    assert len(MUTANTS) >= 10 and len({m.id for m in MUTANTS}) == len(MUTANTS)
    files = {m.file for m in MUTANTS}
    assert "prelude_metal.h" in files and "common.h" in files and files & {s.body for s in ks.KERNELS.values()}


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_the_mutant_is_caught(folders, mutant: Mutant):
    w, br, res = _case(mutant.wide, mutant.quantized)
    d = folders[mutant.id]
    if mutant.caught == "compile":
        with pytest.raises(ME.MetalCompileError, match=mutant.match):
            KE.emulated_tail(T.tail_launch(w), br, res, kernel_dir=d)
    elif mutant.caught == "emulator":
        with pytest.raises(ME.EmulationError, match=mutant.match):
            for o in ME.SCHEDULES:
                KE.emulated_tail(T.tail_launch(w), br, res, order=o, seed=11, kernel_dir=d)
    else:
        outs = _orders(w, br, res, d)
        races = len({o.tobytes() for o in outs.values()}) > 1
        wrong = not compare(outs["ascending"], host_tail_exact(w, br, res)).passed
        assert races or wrong, f"{mutant.id} was not caught: same bits in every order and within tolerance"
