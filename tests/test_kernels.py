"""The tail's kernels: one source for two dialects, checked where the hardware is.

On the CPU (CI): the sources are composed as documented (each algorithm once, a thin
prelude per dialect); the Metal source MLX generates is checked (kernel names, inputs and
outputs with their address spaces, template values); the CUDA translation unit MLX would
compile is compiled with nvcc when nvcc is here; the kernels' index arithmetic (the
inverse-permutation scatter, the block Walsh-Hadamard with the m-tables, the interleaved
4-bit words) is replayed in numpy against the oracle's rotation; and what the launch
builder refuses raises. On a GPU: the kernels against the float64 oracle (``cuda`` /
``metal`` marks, skipped with the reason elsewhere); ``python -m bench.gpu_check`` runs
the full set and the benchmark.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends as B
from workbench import tail as T
from workbench.fold import formats as F
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.fold.weights import WeightMatrix
from workbench.kernels import emulated as KE
from workbench.kernels import head as KH
from workbench.kernels import launch as KL
from workbench.kernels import matrices as KM
from workbench.kernels import source as ks
from workbench.kernels import tuning as KT
from workbench.models.config import BONSAI_SHAPE
from workbench.tail.comparison import compare
from workbench.tail.frink_case import SEED_TOL, seed_case

#: Text that belongs to one dialect only; the bodies and common.h must hold none of it.
DIALECT_TOKENS = (
    "__syncthreads",
    "__shfl",
    "threadIdx",
    "blockIdx",
    "gridDim",
    "__global__",
    "__device__",
    "__shared__",
    "__ldcs",
    "make_uint4",
    "threadgroup",
    "simd_",
    "metal::",
    "as_type",
    "thread_position",
    "device ",
    "[[",
)


#: The kernels built on common.h's row dot (the tail's three and the head launch), which
#: the checks of weight loads and formats below cover; gdn_step reads no weights
#: (tests/test_gdn_kernel.py checks it, its CUDA unit included).
ROW_KERNELS: tuple[str, ...] = ks.TAIL_KERNELS + ("head_qkv",)


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


# -- the sources ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["common.h"] + sorted({s.body for s in ks.KERNELS.values()}))
def test_the_algorithms_are_written_once_without_dialect_text(name):
    code = _strip_comments(ks.read(name))
    found = [t for t in DIALECT_TOKENS + tuple(CUDA_ONLY) if t in code]
    assert not found, f"{name} holds dialect-specific text {found}; it belongs in a prelude"


def _interface(dialect: str) -> set[str]:
    head, body = ks.prelude(dialect)
    code = _strip_comments(head)
    names = set(re.findall(r"#define\s+(\w+)", code))
    names |= set(re.findall(r"typedef\s+[\w\s]+?\s(\w+)\s*;", code))
    names |= set(re.findall(r"KFN\s+\w+\s+(\w+)\s*\(", code))
    names |= set(re.findall(r"const int (\w+) =", _strip_comments(body)))
    return names


#: The CUDA prelude's names with no Metal twin: the grid barrier of the one-launch tail
#: (kernels/tail_one_launch.body), which Metal cannot promise (no forward progress between
#: threadgroups). No body both dialects compile may use them.
CUDA_ONLY = {"grid_barrier", "load_acquire", "global_ns"}


def test_the_two_preludes_define_the_same_names():
    metal, cuda = _interface("metal"), _interface("cuda")
    assert metal == cuda - CUDA_ONLY, f"only Metal: {metal - cuda}; only CUDA: {cuda - CUDA_ONLY - metal}"
    assert {
        "KFN",
        "DEV",
        "GRP",
        "GROUP_SHARED",
        "GROUP_BARRIER",
        "warp_sum",
        "lid",
        "gid",
        "ngroups",
        "lane",
        "warp",
    } <= metal


#: What only common.h's primitives may spell out: the weight loads and per-unit dot
#: products (the row dot's tuned load pattern lives in lane_dot alone), the sign-bit test
#: of the signed scatter, the rms scale.
_PRIMITIVE_INTERNALS = (
    "LOAD_STREAM",
    "LOAD_UNIT(",
    "UNIT_DOT(",
    "load_unit",
    "unit_dot",
    "q4_word_dot",
    "q8_word_dot",
    "fp4_word_dot",
    "dot_bf16x8",
    "dot_f32x4",
    "dot_q4x8",
    "dot_q8x4",
    "dot_fp4x8",
    "fp4_pair",
    "half_lo",
    "half_hi",
    "Q_WORD",
    "& 1)",
    "RSQRTF",
    "sumsq4",
)


@pytest.mark.parametrize("kernel", ROW_KERNELS)
def test_each_body_is_written_in_the_primitives(kernel):
    body = _strip_comments(ks.read(ks.KERNELS[kernel].body))
    assert re.search(r"\b(warp_dot|lane_dot<\w+>)\(", body), f"{kernel} does not call the row dot"
    found = [t for t in _PRIMITIVE_INTERNALS if t in body]
    assert not found, f"{kernel} spells out {found} itself; call common.h's primitive instead"
    if "sdest" in ks.KERNELS[kernel].inputs:
        assert "scatter_signed<" in body
    if "nw" in ks.KERNELS[kernel].inputs:
        assert re.search(r"\b(rms_prologue|rms_inv)<", body)
    # The loads a warp keeps in flight are the row dot's: nothing else loads weights.
    common = _strip_comments(ks.read("common.h"))
    assert common.count("load_unit<F>(") == 1 and common.count("load_batch<U, STRIDE>(") == 1


def test_compose_puts_the_prelude_in_header_and_body():
    for dialect, other in (("metal", "cuda"), ("cuda", "metal")):
        for kernel in ks.KERNELS:
            header, source = ks.compose(dialect, kernel)
            assert f"prelude ({dialect})" in header and "common.h" in header
            assert ks.BODY_MARK not in _strip_comments(header) + _strip_comments(source)
            assert "const int lid" in source and ks.read(ks.KERNELS[kernel].body) in source
            assert f"prelude ({other})" not in header
    assert "metal::simd_sum" in ks.compose("metal", "wo_residual")[0]
    assert "__shfl_xor_sync" in ks.compose("cuda", "wo_residual")[0]
    assert "thread_index_in_simdgroup" in ks.compose("metal", "wo_residual")[1]  # read in the body: MLX passes it


def _c_tokens(text: str) -> list[str]:
    """C tokens of ``text`` by a character-by-character scan (independent of the regular
    expression ``ks.compact`` uses): comments dropped, whitespace separating, string and
    character literals whole, every other non-word character its own token."""
    toks: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i) if "\n" in text[i:] else n
        elif text.startswith("/*", i):
            i = text.index("*/", i + 2) + 2
        elif c in "\"'":
            j = i + 1
            while text[j] != c:
                j += 2 if text[j] == "\\" else 1
            toks.append(text[i : j + 1])
            i = j + 1
        elif c.isalnum() or c == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] in "_."):
                j += 1
            toks.append(text[i:j])
            i = j
        elif c.isspace():
            i += 1
        else:
            toks.append(c)
            i += 1
    return toks


def _directives(text: str) -> list[str]:
    return [" ".join(_c_tokens(line)) for line in text.splitlines() if line.strip().startswith("#")]


def test_compact_keeps_every_token_and_directive_line():
    # What the CUDA launches hand MLX: the composed text without comments, the same code.
    texts = [t for d in ks.DIALECTS for k in ks.KERNELS for t in ks.compose(d, k)] + list(ks.compose_one_launch())
    for text in texts:
        small = ks.compact(text)
        assert _c_tokens(small) == _c_tokens(text)
        assert _directives(small) == _directives(text)
        assert "//" not in small.replace('"//', "") and "/*" not in small
        assert "\n\n" not in small and not any(line != line.strip() for line in small.splitlines())
    header, source = ks.compose_one_launch()
    assert len(ks.compact(header) + ks.compact(source)) < 0.6 * len(header + source)


def test_compact_edge_cases():
    text = (
        '  const char* s = "a // b /* c */";  // gone\n'
        "  char q = '/'; int d = a / b; /* one\n two */ int e = 1;\n"
        "#define M(x) \\\n  (x) // tail\n\n\n  int f = M(2);\n"
        "#define N 1 \\\n\nint g = N;\n"
    )
    assert ks.compact(text) == (
        'const char* s = "a // b /* c */";\n'
        "char q = '/'; int d = a / b;\nint e = 1;\n"
        "#define M(x) \\\n(x)\nint f = M(2);\n"
        "#define N 1 \\\n\nint g = N;\n"
    )
    assert ks.compact("") == "\n" and ks.compact("// only a comment\n") == "\n"


def test_cuda_launch_text_puts_the_header_in_a_file_named_by_its_text(tmp_path, monkeypatch):
    monkeypatch.setattr(ks, "header_folder", lambda: tmp_path / "headers")
    header, source = ks.compose("cuda", "wo_residual")
    line, small = ks.cuda_launch_text(header, source)
    m = re.fullmatch(r'#include "(.+)"\n', line)
    assert m is not None and small == ks.compact(source)
    path = Path(m.group(1))
    assert path.parent == tmp_path / "headers" and path.read_text() == ks.compact(header)
    assert _c_tokens(path.read_text() + small) == _c_tokens(header + source)
    stamp = path.stat().st_mtime_ns
    assert ks.cuda_launch_text(header, source) == (line, small) and path.stat().st_mtime_ns == stamp  # kept
    path.write_text("damaged")
    assert ks.cuda_launch_text(header, source)[0] == line and path.read_text() == ks.compact(header)  # rewritten
    other = ks.cuda_launch_text(header + "\nKFN int extra() { return 1; }\n", source)[0]
    assert other != line and len(list((tmp_path / "headers").iterdir())) == 2
    monkeypatch.setattr(ks, "header_folder", lambda: tmp_path / 'we"ird')
    with pytest.raises(ValueError, match="TMPDIR"):
        ks.cuda_launch_text(header, source)


def test_source_lookup_errors():
    with pytest.raises(ValueError, match="dialect must be one of"):
        ks.compose("opencl", "wo_residual")
    with pytest.raises(ValueError, match="kernel must be one of"):
        ks.compose("metal", "attention")


# -- the Metal source MLX generates, without a GPU ------------------------------------


@pytest.fixture(scope="module")
def seed_launch():
    return T.tail_launch(seed_case().weights)


@pytest.fixture(scope="module")
def seed_metal(seed_launch):
    return KE.metal_tail_source(seed_launch)


def _signature(src: str) -> list[str]:
    sig = src.split("[[kernel]] void", 1)[1].split(") {", 1)[0]
    return [line.strip().rstrip(",") for line in sig.splitlines()[1:] if line.strip()]


def test_metal_tail_is_three_kernels_named_in_order(seed_metal):
    names = list(seed_metal)
    assert names == [ks.KERNELS[k].name for k in ks.TAIL_KERNELS]
    for n, src in seed_metal.items():
        assert f"[[kernel]] void custom_kernel_{n}__" in src  # MLX's name: ours + the template values


def test_metal_inputs_and_outputs_in_device_memory(seed_metal):
    for kernel, src in zip(ks.TAIL_KERNELS, seed_metal.values()):
        spec = ks.KERNELS[kernel]
        sig = _signature(src)
        params = [re.search(r"(\w+) \[\[buffer\((\d+)\)\]\]", p) for p in sig]
        buffers = [(m.group(1), int(m.group(2))) for m in params if m]
        assert buffers == [(n, i) for i, n in enumerate(spec.inputs + spec.outputs)], kernel
        for p in sig:
            if "[[buffer(" in p:
                name = p.split("*")[1].split()[0]
                # every array is in device memory (none under 8 elements, which MLX puts in `constant`)
                want = "device float*" if name in spec.outputs else "const device"
                assert p.startswith(want), p
        for attr in (
            "thread_position_in_threadgroup",
            "threadgroup_position_in_grid",
            "threadgroups_per_grid",
            "thread_index_in_simdgroup",
            "simdgroup_index_in_threadgroup",
        ):
            assert f"[[{attr}]]" in src, (kernel, attr)


def test_metal_template_values_are_the_launch_values(seed_launch, seed_metal):
    prep = KL.prepared(seed_launch, "metal")
    for kernel, src in zip(ks.TAIL_KERNELS, seed_metal.values()):
        tmpl = prep.templates()[kernel]
        assert [n for n, _ in tmpl] == list(ks.KERNELS[kernel].template)
        decl = re.search(r"template <([^>]*)>\s*\[\[kernel\]\]", src).group(1)
        assert [d.split()[-1] for d in decl.split(",")] == [n for n, _ in tmpl]
        inst = re.search(r"decltype\(\w+<([^>]*)>\)", src).group(1)
        assert [v.strip() for v in inst.split(",")] == [str(int(v)) for _, v in tmpl], kernel
    wo = dict(prep.templates()["wo_residual"])
    assert (wo["WIDTH"], wo["ROWS"], wo["ROT"], wo["M"], wo["LOGP"], wo["FMT"]) == (96, 64, True, 1, 4, F.FLOAT32.code)


def test_metal_source_holds_the_metal_prelude_only(seed_metal):
    for src in seed_metal.values():
        assert "#define GROUP_BARRIER() metal::threadgroup_barrier" in src
        assert "threadgroup float4 xs4" in src or "GROUP_SHARED float" in src
        code = _strip_comments(src)
        assert "__syncthreads" not in code and "__shfl" not in code and "threadIdx" not in code


def _metal_for(w: T.TailWeights) -> dict[str, str]:
    return KE.metal_tail_source(T.tail_launch(w))


def test_metal_types_follow_the_weight_format():
    w16 = T.TailWeights.random(64, 128, 96, seed=1, fold_block=128, dtype="bfloat16")
    src = list(_metal_for(w16).values())[0]
    iw = ks.KERNELS["wo_residual"].inputs.index("w")
    assert f"const device bfloat16_t* w [[buffer({iw})]]" in src
    q = T.TailWeights.random(
        64,
        1024,
        128,
        seed=2,
        fold_block=1024,
        dtype="bfloat16",
        quantize={"mode": "affine", "bits": 4, "group_size": 64},
    )
    prep = KL.prepared(T.tail_launch(q), "metal")
    src = list(_metal_for(q).values())[0]
    assert f"const device uint32_t* w [[buffer({iw})]]" in src and "const device bfloat16_t* ws" in src
    wo = dict(prep.templates()["wo_residual"])
    assert (wo["FMT"], wo["SFMT"], wo["GS"], wo["QI"]) == (F.AFFINE4.code, 1, 64, True)  # 128 words a row: interleaved
    assert dict(prep.templates()["ffn_gate_up"])["QI"] is False  # 64-wide rows: 8 words, contiguous


def test_metal_head_launch_source():
    fold = HadamardFold.random(1280, 1280, seed=3, permute=True)  # m = 20, k = 6
    mats = [
        WeightMatrix(np.random.default_rng(i).standard_normal((r, 1280)).astype(np.float32)).fold_hadamard(fold)
        for i, r in enumerate((256, 64, 64))
    ]
    src = KE.generated_source(
        lambda x: KH.head_launch(x, np.ones(1280, np.float32), 1e-6, *mats, "metal", verbose=True)[0], mx.zeros((1280,))
    )
    ((name, text),) = src.items()
    assert name == "fat_head_qkv" and "void custom_kernel_fat_head_qkv__" in text
    assert [p.split("[[")[0].split("*")[1].strip() for p in _signature(text) if "[[buffer(" in p] == list(
        ks.KERNELS["head_qkv"].inputs + ks.KERNELS["head_qkv"].outputs
    )
    inst = re.search(r"decltype\(\w+<([^>]*)>\)", text).group(1).replace(" ", "").split(",")
    t = dict(zip(ks.KERNELS["head_qkv"].template, inst))
    assert (t["HID"], t["NQ"], t["NK"], t["NV"], t["ROT"], t["M"], t["LOGP"]) == (
        "1280",
        "256",
        "64",
        "64",
        "1",
        "20",
        "6",
    )


# -- the CUDA source, compiled here when nvcc is --------------------------------------


def _dtypes(kernel: str, fmt: int, sfmt: int = 1) -> dict[str, str]:
    return ks.input_dtypes(ks.KERNELS[kernel].inputs, fmt, sfmt)


_BONSAI_T = {
    "wo_residual": dict(WIDTH=6144, ROWS=5120, ROT=True, M=1, LOGP=10, U=8, PRE=True),
    "ffn_gate_up": dict(HID=5120, FFN=17408, U=4, PRE=True),
    "ffn_down": dict(HID=5120, FFN=17408, U=16, DR=4),
    "head_qkv": dict(HID=5120, NQ=12288, NK=1024, NV=1024, ROT=True, M=20, LOGP=8, U=8, PRE=True),
}


#: (FMT, SFMT, GS, QI, PRE) compiled for every kernel: each weight format, every scale
#: format and both quantized word orders, and a first batch loaded early or not (the row
#: dot's two forms), so every branch of common.h's templates is instantiated somewhere.
_SF = F.SCALE_CODES
_FORMATS = [
    (F.FLOAT32.code, 0, 32, False, True),
    (F.BFLOAT16.code, 0, 32, False, True),
    (F.AFFINE4.code, _SF["bfloat16"], 64, True, True),
    (F.AFFINE4.code, _SF["float32"], 64, False, False),
    (F.AFFINE8.code, _SF["bfloat16"], 64, True, True),
    (F.AFFINE8.code, _SF["float32"], 32, False, False),
    (F.MXFP4.code, _SF["e8m0"], 32, True, True),
    (F.NVFP4.code, _SF["e4m3"], 16, True, False),
]


#: The tiled rows' variants compiled too: the formats TILED_X leaves out, in a copy of
#: kernels/ that tiles them (measured, not kept: the kernels README), so the next
#: measurement can compare that copy with kernels/ (bench.kernel_bodies --old).
_TILED = [
    (k, f, s, g)
    for f, s, g in [(F.AFFINE4.code, _SF["bfloat16"], 64), (F.NVFP4.code, _SF["e4m3"], 16)]
    for k in ("wo_residual", "ffn_gate_up", "head_qkv")
]
_TILED_IDS = [f"{k}-{'affine4' if f == F.AFFINE4.code else 'nvfp4'}" for k, f, _, _ in _TILED]


def _nvcc(src: Path) -> subprocess.CompletedProcess:
    # Device code only (-cubin), as MLX compiles a kernel (NVRTC): the host pass (gcc over
    # CUDA's headers) took two thirds of a unit's time and gives nothing these tests read.
    return subprocess.run(
        ["nvcc", "-arch=sm_90", "-cubin", "-o", str(src.with_suffix(".cubin")), "-Xptxas", "-v", str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def nvcc_results(tmp_path_factory) -> dict:
    """Every translation unit below, compiled once, as many at a time as the machine has
    cores (nvcc takes ~8 s a unit and uses one core: 38 units one after another were
    ~5 minutes of CI); each test then checks its own unit's result."""
    root = tmp_path_factory.mktemp("nvcc")
    tiled_dir = root / "kernels-tiled"
    shutil.copytree(ks.KERNEL_DIR, tiled_dir, ignore=shutil.ignore_patterns("metal_emulation"))
    text = (tiled_dir / "common.h").read_text()
    assert text.count("#define TILED_X(FMT) ((FMT) == WF_Q8)") == 1
    (tiled_dir / "common.h").write_text(
        text.replace("#define TILED_X(FMT) ((FMT) == WF_Q8)", "#define TILED_X(FMT) ((FMT) >= WF_Q4)")
    )
    sources = {}
    for kernel in ROW_KERNELS:
        for fmt, sfmt, gs, qi, pre in _FORMATS:
            t = dict(NT=64 if kernel == "ffn_down" else 256, FMT=fmt, SFMT=sfmt, GS=gs, QI=qi, **_BONSAI_T[kernel])
            if "PRE" in t:
                t["PRE"] = pre
            t["U"] = max(1, KM.units_for(fmt, t["U"]) // t.get("DR", 1))  # as PreparedTail.templates
            src = root / f"{kernel}-{fmt}-{sfmt}-{gs}-{int(qi)}-{int(pre)}.cu"
            src.write_text(ks.cuda_translation_unit(kernel, _dtypes(kernel, fmt, sfmt), t))
            sources[("plain", kernel, fmt, sfmt, gs, qi, pre)] = src
    for kernel, fmt, sfmt, gs in _TILED:
        t = dict(NT=256, FMT=fmt, SFMT=sfmt, GS=gs, QI=True, **_BONSAI_T[kernel])
        t["U"] = KM.units_for(fmt, t["U"])
        src = root / f"tiled-{kernel}-{fmt}-{sfmt}-{gs}.cu"
        src.write_text(ks.cuda_translation_unit(kernel, _dtypes(kernel, fmt, sfmt), t, kernel_dir=tiled_dir))
        sources[("tiled", kernel, fmt, sfmt, gs)] = src
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        done = dict(zip(sources, pool.map(_nvcc, sources.values())))
    return done


def _compiled_without_spills(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stderr[-3000:]
    assert "0 bytes spill stores" in r.stderr and "error" not in r.stderr.lower(), r.stderr[-2000:]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
@pytest.mark.parametrize("fmt,sfmt,gs,qi,pre", _FORMATS)
@pytest.mark.parametrize("kernel", ROW_KERNELS)
def test_cuda_translation_unit_compiles_without_spills(nvcc_results, kernel, fmt, sfmt, gs, qi, pre):
    _compiled_without_spills(nvcc_results[("plain", kernel, fmt, sfmt, gs, qi, pre)])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
@pytest.mark.parametrize("kernel,fmt,sfmt,gs", _TILED, ids=_TILED_IDS)
def test_4bit_rows_read_tiled_compile_without_spills(nvcc_results, kernel, fmt, sfmt, gs):
    """common.h's tiled rows for the formats TILED_X leaves out, compiled from a copy of
    kernels/ that tiles them (see _TILED)."""
    _compiled_without_spills(nvcc_results[("tiled", kernel, fmt, sfmt, gs)])


def test_cuda_translation_unit_writes_mlx_signature():
    tu = ks.cuda_translation_unit(
        "ffn_down",
        _dtypes("ffn_down", F.BFLOAT16.code),
        dict(NT=64, FMT=1, SFMT=0, GS=32, QI=False, HID=64, FFN=80, U=16, DR=1),
    )
    assert "__global__ void custom_kernel_fat_ffn_down(" in tu
    assert "const __nv_bfloat16* wd" in tu and "float* out) {" in tu
    assert "constexpr int FFN = 80;" in tu and "constexpr bool QI = false;" in tu
    with pytest.raises(ValueError, match="must name every input"):
        ks.cuda_translation_unit("ffn_down", {"act": "float32"}, {})


# -- the kernels' arithmetic, replayed in numpy ----------------------------------------


def _kernel_rotation(plan, x: np.ndarray) -> np.ndarray:
    """R x as the kernels compute it (common.h: scatter_signed by sdest, then group_hadamard: butterflies, the
    m-table mix), then the scale."""
    width = plan.width
    sd = KL.sdest(plan)  # what the kernels get: 2 dest[p] + (signs[p] < 0)
    xs = np.full(width, np.nan)
    xs[sd >> 1] = np.where(sd & 1, -x, x)  # xs[dest[p]] = signs[p] * x[p]
    assert not np.isnan(xs).any()  # dest is a permutation: every slot written
    p_len = 1 << plan.k
    h = 1
    while h < p_len:  # group_hadamard's butterflies, pair index j -> i
        j = np.arange(width // 2)
        i = ((j & ~(h - 1)) << 1) | (j & (h - 1))
        a, b = xs[i].copy(), xs[i + h].copy()
        xs[i], xs[i + h] = a + b, a - b
        h <<= 1
    if plan.m > 1:
        c = np.arange(width // plan.m)
        base = (c >> plan.k) * (plan.m * p_len) + (c & (p_len - 1))
        v = xs[base[:, None] + np.arange(plan.m)[None, :] * p_len]  # [columns, m]
        xs[base[:, None] + np.arange(plan.m)[None, :] * p_len] = v @ plan.table.astype(np.float64).T
    return xs * plan.scale


def _butterflies_stage_by_stage(xs: np.ndarray, logp: int) -> np.ndarray:
    """Every run of 2^logp elements through the butterflies, one stage (h = 1, 2, ..) at a time."""
    xs = xs.copy()
    for s in range(logp):
        h = 1 << s
        j = np.arange(xs.size // 2)
        i = ((j & ~(h - 1)) << 1) | (j & (h - 1))
        a, b = xs[i].copy(), xs[i + h].copy()
        xs[i], xs[i + h] = a + b, a - b
    return xs


def _butterflies_as_group_hadamard(xs: np.ndarray, logp: int) -> np.ndarray:
    """The same stages as common.h's group_hadamard schedules them: warp_butterflies (a warp
    a chunk of 32 C elements, lane l holding l + 32 c: stages h < 32 between lanes, then
    h = 32 .. 16 C between registers), then radix_butterflies passes of up to three stages,
    each thread's set base + k h0."""
    xs = xs.copy()
    width = xs.size
    lc = 3 if logp >= 8 else (logp - 5 if logp > 5 else 0)
    ch = 32 << lc
    n_chunks = -(-width // ch)
    v = np.zeros(n_chunks * ch, xs.dtype)
    v[:width] = xs
    v = v.reshape(n_chunks, 1 << lc, 32)  # [chunk, c, lane]
    lane = np.arange(32)
    for t in range(min(logp, 5)):  # lane_xor(v, h): the partner's value
        h = 1 << t
        p = v[:, :, lane ^ h]
        v = np.where((lane & h) != 0, p - v, v + p)
    for t in range(lc):
        k = 1 << t
        c = np.array([c for c in range(1 << lc) if not c & k], dtype=int)
        a, b = v[:, c].copy(), v[:, c + k].copy()
        v[:, c], v[:, c + k] = a + b, a - b
    xs = v.reshape(-1)[:width].copy()
    done, h0 = 5 + lc, 1 << (5 + lc)
    left = logp - done
    while left > 0:
        s = min(3, left)
        g = np.arange(width >> s)
        base = ((g & ~(h0 - 1)) << s) | (g & (h0 - 1))
        idx = base[:, None] + h0 * np.arange(1 << s)[None, :]
        r = xs[idx]
        for t in range(s):
            k = 1 << t
            c = np.array([c for c in range(1 << s) if not c & k], dtype=int)
            a, b = r[:, c].copy(), r[:, c + k].copy()
            r[:, c], r[:, c + k] = a + b, a - b
        xs[idx] = r
        h0 <<= s
        left -= s
    return xs


@pytest.mark.parametrize("logp", range(14))
@pytest.mark.parametrize("runs", [1, 3])
def test_group_hadamards_schedule_gives_the_stage_by_stage_bits(logp, runs):
    """group_hadamard does most stages in registers (warp_butterflies) and the rest in radix
    passes; each pair still becomes (a + b, a - b) in stage order, so in float32 the result
    has exactly the bits of one pass a stage (which the kernels did before), at every run
    length up to 8192 and with a partial last chunk (three runs of 2^logp)."""
    x = np.random.default_rng(logp).standard_normal(runs << logp).astype(np.float32)
    want = _butterflies_stage_by_stage(x, logp)
    got = _butterflies_as_group_hadamard(x, logp)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize(
    "block,width,permute",
    [
        (16, 96, False),
        (12, 48, True),
        (192, 384, True),
        (20, 40, True),
        (320, 640, False),
        (28, 56, True),
        (448, 896, True),
        (1024, 2048, True),
        (1, 8, True),
    ],
)
def test_the_kernels_rotation_is_the_folds(block, width, permute):
    fold = HadamardFold.random(width, block, seed=block + width, permute=permute)
    x = np.random.default_rng(block).standard_normal(width)
    np.testing.assert_allclose(_kernel_rotation(fold.plan(width), x), fold.rotate(x), rtol=1e-12, atol=1e-12)


def test_interleaved_4bit_words_cover_each_word_once():
    """Q_WORD with QI: units 32c..32c+31 take words 128c + lane + 32k; a bijection per row."""
    for units in (32, 64, 160, 544):
        u = np.arange(units)
        words = np.stack([((u >> 5) << 7) + (u & 31) + 32 * k for k in range(4)], 1)
        assert sorted(words.ravel().tolist()) == list(range(4 * units))
        assert (np.diff(words[:32, 0]) == 1).all()  # one warp's k-th load: 32 consecutive words


def _xswz(f):
    """common.h's XSWZ: float4 f of x at this slot of group memory (within its 128-byte line)."""
    return f ^ ((f >> 3) & 7)


@pytest.mark.parametrize("unit_float4s", [8, 4], ids=["4-bit units", "8-bit units"])
@pytest.mark.parametrize("stride", [32, 64, 256])
def test_tiled_x_reads_what_tile_x_wrote_without_bank_conflicts(unit_float4s, stride):
    """XReader<TiledX> reads unit u's float4 j at line + ((lo + j) ^ m), lo and m taken from
    the lane's first unit: that is XSWZ(f) for every unit the lane visits (units 16 apart or
    a multiple), XSWZ is a bijection on each line, and each quarter-warp's 16-byte reads
    (8 lanes, neighbouring units) hit 8 different 16-byte bank groups: no conflict, where
    the same reads unswizzled collide 8-way (4-bit) or 4-way (8-bit)."""
    f = np.arange(4096)
    assert sorted(_xswz(f).tolist()) == f.tolist() and (_xswz(f) >> 3 == f >> 3).all()
    for first in range(stride):
        lo, m = (first * unit_float4s) & 7, ((first * unit_float4s) >> 3) & 7
        for u in first + stride * np.arange(8):
            for j in range(unit_float4s):
                assert ((u * unit_float4s) & ~7) + ((lo + j) ^ m) == _xswz(u * unit_float4s + j)
    for c in range(4):
        for q in range(4):
            units = 32 * c + 8 * q + np.arange(8)  # a quarter-warp of lane_dot<32>
            for j in range(unit_float4s):
                f = units * unit_float4s + j
                assert len(set((_xswz(f) & 7).tolist())) == 8
                assert len(set((f & 7).tolist())) == 8 // unit_float4s  # the conflict the swizzle removes


def test_the_two_nibble_dequant_is_exact():
    """dot_q4x8's trick: nibbles n and n + 4 -> the bf16 pair 1 + q/16, exactly."""
    rng = np.random.default_rng(0)
    v = rng.integers(0, 2**32, size=1000, dtype=np.uint64).astype(np.uint32)
    q = np.stack([(v >> (4 * i)) & 15 for i in range(8)], 1).astype(np.float64)
    got = np.empty_like(q)
    for n, shift in enumerate((-3, 1, 5, 9)):
        sh = (v << np.uint32(3)) if shift < 0 else (v >> np.uint32(shift))
        p = (sh & np.uint32(0x00780078)) | np.uint32(0x3F803F80)
        lo = (p << np.uint32(16)).view(np.float32)
        hi = (p & np.uint32(0xFFFF0000)).view(np.float32)
        got[:, n], got[:, n + 4] = lo, hi
    np.testing.assert_array_equal(got, 1 + q / 16)


def test_mlx_affine_layout_is_low_nibble_first():
    w = mx.random.normal((4, 128), key=mx.random.key(0))
    q, s, b = mx.quantize(w, group_size=64, bits=4)
    words = np.array(q).view(np.uint32)
    codes = np.stack([(words >> (4 * i)) & 15 for i in range(8)], -1).reshape(4, 128)
    deq = np.array(s).repeat(64, 1) * codes + np.array(b).repeat(64, 1)
    np.testing.assert_allclose(deq, np.array(mx.dequantize(q, s, b, group_size=64, bits=4)), atol=1e-6)


# -- what the launch builder refuses ----------------------------------------------------


def test_unserved_formats_and_shapes_raise():
    w = T.TailWeights.random(64, 96, 80, seed=0, dtype="float16")
    with pytest.raises(ValueError, match="the kernels serve float32, bfloat16, affine 4- and 8-bit"):
        KL.prepare_tail(T.tail_launch(w), "metal")
    w = T.TailWeights.random(64, 96, 80, seed=0, fold_block=16, fold_site=FoldSite.OUTPUT)
    with pytest.raises(ValueError, match="INPUT site"):
        KL.prepare_tail(T.tail_launch(w), "metal")
    w = T.TailWeights.random(64, 8200, 80, seed=0)
    with pytest.raises(ValueError, match="at most 8192"):
        KL.prepare_tail(T.tail_launch(w), "metal")
    w = T.TailWeights.random(64, 96, 96, seed=0, quantize={"mode": "mxfp8", "bits": 8, "group_size": 32})
    with pytest.raises(ValueError, match="mxfp4 and nvfp4 weights; got mxfp8-g32"):
        KL.prepare_tail(T.tail_launch(w), "metal")
    with pytest.raises(ValueError, match="dialect must be one of"):
        KL.prepare_tail(T.tail_launch(seed_case().weights), "vulkan")


def test_head_launch_refuses_folds_that_differ():
    f1, f2 = (HadamardFold.random(256, 256, seed=s) for s in (1, 2))
    base = np.ones((32, 256), np.float32)
    q, k, v = WeightMatrix(base).fold_hadamard(f1), WeightMatrix(base).fold_hadamard(f1), WeightMatrix(base)
    assert [r.name for r in KH.head_refusals(q, k, v)] == ["FOLDS_DIFFER"]
    with pytest.raises(ValueError, match="FOLDS_DIFFER"):
        KH.head_launch(mx.zeros((256,)), np.ones(256, np.float32), 1e-6, q, k, v, "metal")
    k2 = WeightMatrix(base).fold_hadamard(f2)
    assert "FOLDS_DIFFER" in [r.name for r in KH.head_refusals(q, k2, k2)]
    assert KH.head_refusals(q, k, WeightMatrix(base).fold_hadamard(f1)) == []


def test_grid_fills_the_device_and_no_more():
    t = KT.KernelTuning(sm_count=132)
    assert KT.grid_size(5120, 256, t, 0) == 640 * 256  # one warp a row
    assert KT.grid_size(17408, 256, t, 4) == 528 * 256  # capped at 4 groups an SM
    assert KT.grid_size(3, 256, t, 4) == 256
    with pytest.raises(ValueError, match="KernelTuning"):
        c = seed_case()
        T.fused_tail(c.weights, c.branch, c.residual, backend="graph", tuning="fast")


def test_prepared_tails_are_made_once(seed_launch):
    assert KL.prepared(seed_launch, "metal") is KL.prepared(seed_launch, "metal")
    assert KL.prepared(seed_launch, "metal", KT.KernelTuning(rows_nt=128)) is not KL.prepared(seed_launch, "metal")


def test_a_launch_composes_the_bodies_of_its_kernel_dir(tmp_path, seed_launch, seed_metal):
    # A benchmark compares two source folders in one process: each folder's kernels must be
    # its own (MLX would otherwise reuse whichever source compiled first under one name).
    other = tmp_path / "kernels"
    shutil.copytree(ks.KERNEL_DIR, other)
    body = other / ks.KERNELS["ffn_down"].body
    body.write_text("// the other folder's ffn_down\n" + body.read_text())
    prep = KL.prepared(seed_launch, "metal", kernel_dir=other)
    assert prep is not KL.prepared(seed_launch, "metal") and prep is KL.prepared(seed_launch, "metal", kernel_dir=other)
    src = KE.generated_source(lambda b, r: prep(b, r, verbose=True), mx.zeros((96,)), mx.zeros((64,)))
    assert [n.rsplit("_", 1)[0] for n in src] == list(seed_metal)  # our names, each with the folder's digest
    assert not set(src) & set(seed_metal)
    assert "the other folder's ffn_down" in list(src.values())[2]
    assert not any("the other folder's" in s for s in seed_metal.values())


# -- on a GPU ---------------------------------------------------------------------------


def _gpu_case(dialect: str, w: T.TailWeights, seed: int, tol: float = SEED_TOL) -> None:
    br, res = T.random_inputs(w, seed=seed)
    c = compare(T.fused_tail(w, br, res, backend=dialect), T.host_tail(w, br, res), tol=tol)
    assert c.passed, str(c)


_GPU_DIALECTS = [
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(
                not B.cuda_available(), reason="needs an NVIDIA GPU with MLX's CUDA back-end (mlx[cuda13])"
            ),
        ],
    ),
    pytest.param(
        "metal",
        marks=[
            pytest.mark.metal,
            pytest.mark.skipif(not B.metal_available(), reason="needs an Apple GPU with MLX's Metal back-end"),
        ],
    ),
]


@pytest.mark.parametrize("dialect", _GPU_DIALECTS)
def test_seed_case_and_random_folds_match_the_float64_oracle(dialect: str):
    c = seed_case()
    r = compare(
        T.fused_tail(c.weights, c.branch, c.residual, backend=dialect), T.host_tail(c.weights, c.branch, c.residual)
    )
    assert r.passed, str(r)
    for i, (blk, dt) in enumerate(((192, "float32"), (320, "bfloat16"), (448, "float32"))):
        _gpu_case(dialect, T.TailWeights.random(128, blk, 256, seed=i, fold_block=blk, fold_permute=True, dtype=dt), i)


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(not B.cuda_available(), reason="needs an NVIDIA GPU with MLX's CUDA back-end (mlx[cuda13])")
def test_cuda_bonsai_bf16_matches_the_float64_oracle():
    (h, b, f) = BONSAI_SHAPE
    _gpu_case("cuda", T.TailWeights.random(h, b, f, seed=5, fold_block=1024, dtype="bfloat16"), 6)
