"""The Metal kernels compiled by clang and executed on the CPU (backend "metal-emulated").

Every case: MLX's generated Metal source for the launch, compiled against the stand-in
``<metal_stdlib>``, run by the emulator in each of its schedules (``ME.SCHEDULES``: threads and groups in
ascending, descending and shuffled order with the SIMD-groups in step, and the SIMD-groups
running apart: one at a time in either order, or a seeded random thread at every step);
every schedule's result must be the same bits (a race between barriers would differ) and match the
float64 oracle (``exact_oracle.host_tail_exact``,
4-bit codes unpacked in numpy) at the tolerance the H200 check uses
(``exact_oracle.tolerance_for``: max(2e-4, 2 x the float32 oracle's own error)),
frink-models' case at its 2e-4. The kernels are compiled first, all at once, two clang
processes at a time (the compile is most of the cost).
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends as B
from workbench import tail as T
from workbench.fold import formats as F
from workbench.fold.rotation import HadamardFold
from workbench.fold.weights import WeightMatrix
from workbench.kernels import emulated as KE
from workbench.kernels import head as KH
from workbench.kernels import launch as KL
from workbench.kernels import matrices as KM
from workbench.kernels import metal_emulation as ME
from workbench.kernels import source as ks
from workbench.kernels import tuning as KT
from workbench.models import config as model
from workbench.models import loader
from workbench.studies.exact_oracle import host_tail_exact, oracle_tolerance, tolerance_for
from workbench.tail.comparison import compare
from workbench.tail.frink_case import SEED_TOL, seed_case

pytestmark = pytest.mark.skipif(ME.clang() is None, reason="clang++ is not installed (apt-get install clang)")

Q4_F32 = {"mode": "affine", "bits": 4, "group_size": 64}
Q8 = {"mode": "affine", "bits": 8, "group_size": 32}
MXFP4 = {"mode": "mxfp4", "bits": 4, "group_size": 32}
NVFP4 = {"mode": "nvfp4", "bits": 4, "group_size": 16}

#: (id, hidden, branch, ffn, fold block, permute, weight dtype, quantize). Folds m = 1, 12,
#: 20, 28 times 2^k (k = 6, 4, 3, 1, 10), with and without permutation; every format:
#: float32, bfloat16, affine 4-bit with float32 and bfloat16 scales, affine 8-bit, mxfp4
#: and nvfp4, contiguous words (rows of 64-320) and interleaved (rows of 1024: wo and
#: down, then gate/up and down); some layers unfolded.
TAIL_CASES = [
    ("f32-m1x64-perm", 64, 128, 128, 64, True, "float32", None),
    ("f32-m12x16", 64, 384, 128, 192, False, "float32", None),
    ("f32-m20x8-perm", 64, 320, 128, 160, True, "float32", None),
    ("f32-m28x2-perm", 64, 448, 128, 56, True, "float32", None),
    ("bf16-m12x16-perm", 64, 192, 128, 192, True, "bfloat16", None),
    ("bf16-unfolded", 64, 128, 128, None, False, "bfloat16", None),
    ("q4-f32scales-contiguous-m20x16", 64, 320, 128, 320, False, "float32", Q4_F32),
    ("q4-bf16scales-interleaved-m1x1024-perm", 128, 1024, 1024, 1024, True, "bfloat16", Q4_F32),
    ("q4-f32scales-interleaved-unfolded", 1024, 128, 1024, None, False, "float32", Q4_F32),
    ("q8-bf16scales-contiguous-m12x16", 64, 192, 128, 192, False, "bfloat16", Q8),
    ("q8-f32scales-interleaved-unfolded", 1024, 128, 1024, None, False, "float32", Q8),
    ("mxfp4-contiguous-m20x16-perm", 64, 320, 128, 320, True, "bfloat16", MXFP4),
    ("mxfp4-interleaved-unfolded", 1024, 128, 1024, None, False, "bfloat16", MXFP4),
    ("nvfp4-contiguous-m12x16", 64, 192, 128, 192, False, "bfloat16", NVFP4),
    ("nvfp4-interleaved-m1x1024-perm", 128, 1024, 1024, 1024, True, "bfloat16", NVFP4),
    # float16 scales (GGUF checkpoints): widened exactly to float32 by the launch builder
    ("q4-f16scales-contiguous-m12x16", 64, 192, 128, 192, False, "float16", Q4_F32),
]


def _weights(case) -> T.TailWeights:
    _, hidden, branch, ffn, block, permute, dtype, quant = case
    return T.TailWeights.random(
        hidden,
        branch,
        ffn,
        seed=hidden + branch + ffn,
        fold_block=block,
        fold_permute=permute,
        dtype=dtype,
        quantize=quant,
    )


@pytest.fixture(scope="module", autouse=True)
def compiled_first():
    """Every kernel this module runs, compiled in parallel before the first case."""
    sources = [s for case in TAIL_CASES for s in KE.emulated_tail_sources(T.tail_launch(_weights(case)))]
    sources += KE.emulated_tail_sources(T.tail_launch(seed_case().weights))
    ME.compile_all(sources)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _all_orders(run) -> np.ndarray:
    """``run(order, seed)`` in every order; asserts the same bits from each; returns one."""
    outs = {o: run(o, 7) for o in ME.SCHEDULES}
    first = outs[ME.SCHEDULES[0]]
    for o, out in outs.items():
        assert np.array_equal(_bits(out), _bits(first)), f"{o} order differs from ascending: a race"
    return first


# -- the backend ----------------------------------------------------------------------------


def test_the_backend_is_asked_for_by_name_only(monkeypatch):
    assert "metal-emulated" in B.BACKENDS
    assert B.resolve_backend("metal-emulated") == "metal-emulated"
    assert "metal-emulated" in B.available_backends()  # it runs here (this module needs clang++)
    assert "metal-emulated" not in B.auto_backends()  # "auto" never picks it
    assert B.resolve_backend("auto") != "metal-emulated"
    monkeypatch.setenv("WORKBENCH_CLANG", "no-such-clang++")
    with pytest.raises(B.BackendUnavailable, match="apt-get install clang"):
        B.resolve_backend("metal-emulated")
    c = seed_case()
    with pytest.raises(B.BackendUnavailable, match="needs clang"):
        T.fused_tail(c.weights, c.branch, c.residual, backend="metal-emulated")


def test_bad_arguments_name_the_parameter():
    kernel = ME.compile_source(KE.emulated_tail_sources(T.tail_launch(seed_case().weights))[2])
    with pytest.raises(ValueError, match="order: must be one of"):
        kernel.launch([], [], groups=1, threads=32, order="random")
    with pytest.raises(ValueError, match="threads"):
        kernel.launch([], [], groups=1, threads=0)
    with pytest.raises(ValueError, match="takes 6 buffers"):
        kernel.launch([np.zeros(8, np.float32)], [((64,), np.float32)], groups=64, threads=64)


def test_the_refusal_rules_apply_as_for_every_backend():
    w = T.TailWeights.random(64, 96, 96, seed=0, quantize={"mode": "mxfp8", "bits": 8, "group_size": 32})
    with pytest.raises(ValueError, match="mxfp4 and nvfp4"):
        T.fused_tail(w, *T.random_inputs(w, seed=0), backend="metal-emulated")
    w = T.TailWeights.random(64, 8200, 80, seed=0)
    with pytest.raises(ValueError, match="at most 8192"):
        T.fused_tail(w, *T.random_inputs(w, seed=0), backend="metal-emulated")


# -- the tail against the float64 oracle ------------------------------------------------------


def test_frink_models_case_at_2e_4():
    c = seed_case()
    out = _all_orders(lambda o, s: KE.emulated_tail(T.tail_launch(c.weights), c.branch, c.residual, order=o, seed=s))
    r = compare(out, host_tail_exact(c.weights, c.branch, c.residual), tol=SEED_TOL)
    assert r.passed, str(r)
    np.testing.assert_array_equal(T.fused_tail(c.weights, c.branch, c.residual, backend="metal-emulated"), out)


@pytest.mark.parametrize("case", TAIL_CASES, ids=[c[0] for c in TAIL_CASES])
def test_tail_matches_the_float64_oracle_in_every_thread_order(case):
    w = _weights(case)
    br, res = T.random_inputs(w, seed=3)
    out = _all_orders(lambda o, s: KE.emulated_tail(T.tail_launch(w), br, res, order=o, seed=s))
    truth = host_tail_exact(w, br, res)
    tol, _ = tolerance_for(w, br, res, truth)
    r = compare(out, truth, tol=tol)
    assert r.passed, str(r)


@pytest.mark.parametrize("quant", [None, Q4_F32, NVFP4], ids=["bf16", "affine4", "nvfp4"])
def test_ffn_down_rows_a_group_change_no_bit(quant):
    """ffn_down with 2, 4 and 8 rows a group (act read once for all of them; fewer units in
    flight a row) sums each row in the same order as one row a group: the same bits, in
    every thread order, and inside the float64 oracle's tolerance."""
    w = T.TailWeights.random(64, 128, 1024, seed=11, fold_block=64, dtype="bfloat16", quantize=quant)
    br, res = T.random_inputs(w, seed=12)
    launch = T.tail_launch(w)
    one = KE.emulated_tail(launch, br, res, tuning=KT.KernelTuning(down_rows=1))
    truth = host_tail_exact(w, br, res)
    tol, _ = tolerance_for(w, br, res, truth)
    assert compare(one, truth, tol=tol).passed
    for rows in (2, 4, 8):
        for order in ("ascending", "shuffled"):
            got = KE.emulated_tail(
                launch, br, res, order=order, seed=rows, tuning=KT.KernelTuning(down_rows=rows, u_down=8)
            )
            assert np.array_equal(got.view(np.uint32), one.view(np.uint32)), (rows, order)


def test_a_batch_is_each_row_its_launches():
    w = _weights(TAIL_CASES[0])
    br, res = T.random_inputs(w, seed=4, batch=3)
    out = T.fused_tail(w, br, res, backend="metal-emulated")
    assert out.shape == (3, 64)
    for i in range(3):
        np.testing.assert_array_equal(out[i], KE.emulated_tail(T.tail_launch(w), br[i], res[i]))
    r = compare(out, host_tail_exact(w, br, res))
    assert r.passed, str(r)


# -- the head launch ----------------------------------------------------------------------------

#: (id, hidden, q/k/v rows, fold block, weight dtype, quantize)
HEAD_CASES = [
    ("f32-m20x4-perm", 320, (64, 32, 32), 80, "float32", None),
    ("bf16-m12x16", 192, (64, 32, 32), 192, "bfloat16", None),
    ("q4-f32scales-m28x4", 448, (64, 32, 32), 112, "float32", Q4_F32),
    ("q4-bf16scales-interleaved-unfolded", 1024, (64, 32, 32), None, "bfloat16", Q4_F32),
    ("q8-m12x16", 192, (64, 32, 32), 192, "bfloat16", Q8),
    ("mxfp4-m20x4-perm", 320, (64, 32, 32), 80, "bfloat16", MXFP4),
    ("nvfp4-interleaved-unfolded", 1024, (64, 32, 32), None, "bfloat16", NVFP4),
    # runs of 2^7 (a warp chunk of 128) and 2^12 (a chunk of 256, then radix-8 and radix-2 passes)
    ("bf16-m1x128-perm", 256, (64, 32, 32), 128, "bfloat16", None),
    ("f32-m1x4096-perm", 4096, (64, 32, 32), 4096, "float32", None),
]


@pytest.mark.parametrize("case", HEAD_CASES, ids=[c[0] for c in HEAD_CASES])
def test_head_launch_matches_the_float64_oracle(case):
    _, hidden, rows, block, dtype, quant = case
    rng = np.random.default_rng(hidden)
    fold = HadamardFold.random(hidden, block, seed=hidden, permute=True) if block else None
    a = math.sqrt(3.0 / hidden)

    def mat(n: int) -> WeightMatrix:
        w = rng.uniform(-a, a, (n, hidden)).astype(np.float32)
        if quant is not None:
            return WeightMatrix.quantize(mx.array(w).astype(getattr(mx, dtype)), fold=fold, **quant)
        m = WeightMatrix(mx.array(w).astype(getattr(mx, dtype)))
        return m.fold_hadamard(fold) if fold is not None else m

    q, k, v = (mat(n) for n in rows)
    x = rng.uniform(-1, 1, hidden).astype(np.float32)
    nw = (1 + rng.uniform(-0.25, 0.25, hidden)).astype(np.float32)

    def oracle(dt) -> np.ndarray:
        n = T.rms_norm_np(x.astype(dt), nw.astype(dt), 1e-6)
        return np.concatenate([m.apply(n) for m in (q, k, v)])

    truth = oracle(np.float64)
    tol = oracle_tolerance(compare(oracle(np.float32), truth).worst)
    got = [np.concatenate([np.array(o) for o in KH.head_launch(mx.array(x), nw, 1e-6, q, k, v, "metal-emulated")])]
    assert [g.shape for g in got] == [(sum(rows),)]
    r = compare(got[0], truth, tol=tol)
    assert r.passed, str(r)


# -- Apple GPUs' 32 KB of threadgroup memory -------------------------------------------------


def test_hidden_8192_fits_32_kb_and_runs():
    """The boundary: n alone is 32,768 bytes at hidden 8192, so gate_up's reduction scratch
    lives inside it (it was 32,768 + 32 bytes) and the head launch's likewise."""
    w = T.TailWeights.random(8192, 64, 64, seed=9)
    prep = KL.prepare_tail(T.tail_launch(w), "metal")
    assert KM.threadgroup_bytes("ffn_gate_up", dict(prep.templates()["ffn_gate_up"])) == KT.METAL_THREADGROUP_LIMIT
    br, res = T.random_inputs(w, seed=9)
    r = compare(T.fused_tail(w, br, res, backend="metal-emulated"), host_tail_exact(w, br, res))
    assert r.passed, str(r)
    rng = np.random.default_rng(1)
    m = WeightMatrix(rng.uniform(-0.02, 0.02, (32, 8192)).astype(np.float32))
    x = rng.uniform(-1, 1, 8192).astype(np.float32)
    got = np.array(KH.head_launch(mx.array(x), np.ones(8192, np.float32), 1e-6, m, m, m, "metal-emulated")[0])
    truth = m.apply(T.rms_norm_np(x.astype(np.float64), np.ones(8192), 1e-6))
    assert compare(got, truth).passed


def test_tiled_rows_keep_their_x_sums_in_group_memory_only_where_they_fit():
    """Tiled formats (affine 8-bit): x in whole 128-byte lines, then a float a unit of sums;
    at 8192 x alone fills 32 KB and the lanes add up their units' x themselves. The other
    formats lay x out as it is."""
    assert KM.TILED_X_FORMATS == (F.AFFINE8,)
    q8 = dict(NT=256, FMT=F.AFFINE8.code, GS=64)
    assert KM.threadgroup_bytes("wo_residual", dict(q8, WIDTH=6144)) == 6144 * 4 + 6144 // 16 * 4
    assert KM.threadgroup_bytes("head_qkv", dict(q8, HID=8192)) == 32768
    assert KM.threadgroup_bytes("ffn_gate_up", dict(q8, HID=5120)) == 5120 * 4 + 32 + 5120 // 16 * 4
    assert KM.threadgroup_bytes("ffn_gate_up", dict(q8, HID=8064)) == 8064 * 4 + 32  # the sums do not fit too
    assert KM.threadgroup_bytes("wo_residual", dict(q8, FMT=F.AFFINE4.code, WIDTH=6144)) == 6144 * 4
    assert KM.tiled_x_bytes(F.NVFP4.code, 16, 1024) == (4096, 0)


def test_common_h_tiles_the_formats_the_launch_builder_counts():
    """kernels/common.h's TILED_X and matrices.TILED_X_FORMATS name the same formats
    (the launch builder sizes group memory by it)."""
    text = (ks.KERNEL_DIR / "common.h").read_text()
    (expr,) = re.findall(r"^#define TILED_X\(FMT\) (.+)$", text, flags=re.M)
    codes = {m.group(1): m.group(2) for m in re.finditer(r"^#define (WF_\w+) (\d+)", text, flags=re.M)}
    tiled = [
        int(c) for c in codes.values() if eval(re.sub(r"WF_\w+", lambda m: codes[m.group(0)], expr.replace("FMT", c)))
    ]
    assert tiled == [f.code for f in KM.TILED_X_FORMATS]


def test_tiled_rows_at_hidden_8192_add_up_their_own_x_sums():
    """The widths where the sums do not fit (x alone fills 32 KB): the lanes' own sums."""
    quant = {"mode": "affine", "bits": 8, "group_size": 64}
    w = T.TailWeights.random(8192, 64, 64, seed=9, dtype="bfloat16", quantize=quant)
    br, res = T.random_inputs(w, seed=9)
    r = compare(T.fused_tail(w, br, res, backend="metal-emulated"), host_tail_exact(w, br, res))
    assert r.passed, str(r)
    rng = np.random.default_rng(1)
    m = WeightMatrix.quantize(
        mx.array(rng.uniform(-0.02, 0.02, (32, 8192)).astype(np.float32)).astype(mx.bfloat16), **quant
    )
    x = rng.uniform(-1, 1, 8192).astype(np.float32)
    got = np.array(KH.head_launch(mx.array(x), np.ones(8192, np.float32), 1e-6, m, m, m, "metal-emulated")[0])
    truth = m.apply(T.rms_norm_np(x.astype(np.float64), np.ones(8192), 1e-6))
    assert compare(got, truth).passed


@pytest.fixture(scope="module")
def every_format_tiled(tmp_path_factory) -> Path:
    """A copy of kernels/ whose TILED_X takes every quantized format: the 4-bit formats'
    tiled rows stay checked (kernels/README.md: they were measured, and not kept, on the
    H200; the next measurement compares this copy with kernels/)."""
    d = tmp_path_factory.mktemp("tiled") / "kernels"
    shutil.copytree(ks.KERNEL_DIR, d, ignore=shutil.ignore_patterns("metal_emulation"))
    text = (d / "common.h").read_text()
    assert text.count("#define TILED_X(FMT) ((FMT) == WF_Q8)") == 1
    (d / "common.h").write_text(
        text.replace("#define TILED_X(FMT) ((FMT) == WF_Q8)", "#define TILED_X(FMT) ((FMT) >= WF_Q4)")
    )
    return d


#: (id, hidden, branch, ffn, fold block, permute, quantize, weight dtype): the 4-bit formats tiled.
TILED_4BIT_CASES = [
    ("q4-f32scales-m20x16", 64, 320, 128, 320, False, Q4_F32, "float32"),
    ("q4-bf16scales-m1x1024-perm", 128, 1024, 1024, 1024, True, Q4_F32, "bfloat16"),
    ("mxfp4-m20x16-perm", 64, 320, 128, 320, True, MXFP4, "bfloat16"),
    ("nvfp4-m12x16", 64, 192, 128, 192, False, NVFP4, "bfloat16"),
    ("nvfp4-8192-own-sums", 8192, 64, 64, None, False, NVFP4, "bfloat16"),
]


@pytest.mark.parametrize("case", TILED_4BIT_CASES, ids=[c[0] for c in TILED_4BIT_CASES])
def test_4bit_rows_read_tiled_match_the_float64_oracle(every_format_tiled, case):
    _, hidden, branch, ffn, block, permute, quant, dtype = case
    w = T.TailWeights.random(
        hidden, branch, ffn, seed=hidden + branch, fold_block=block, fold_permute=permute, dtype=dtype, quantize=quant
    )
    br, res = T.random_inputs(w, seed=5)
    orders = ME.SCHEDULES if hidden < 8192 else ME.SCHEDULES[:1]
    outs = [KE.emulated_tail(T.tail_launch(w), br, res, order=o, seed=7, kernel_dir=every_format_tiled) for o in orders]
    assert len({o.tobytes() for o in outs}) == 1
    r = compare(outs[0], host_tail_exact(w, br, res))
    assert r.passed, str(r)
    if hidden < 8192:  # the head launch too, Q, K and V tiled
        fold = None if block is None else HadamardFold.random(hidden, hidden, seed=3, permute=permute)
        rng = np.random.default_rng(2)
        q, k, v = (
            WeightMatrix.quantize(
                mx.array(rng.uniform(-0.1, 0.1, (n, hidden)).astype(np.float32)).astype(getattr(mx, dtype)),
                fold=fold,
                **quant,
            )
            for n in (64, 32, 32)
        )
        x = rng.uniform(-1, 1, hidden).astype(np.float32)
        got = np.concatenate(
            [
                np.array(a)
                for a in KH.head_launch(
                    mx.array(x),
                    np.ones(hidden, np.float32),
                    1e-6,
                    q,
                    k,
                    v,
                    "metal-emulated",
                    kernel_dir=every_format_tiled,
                )
            ]
        )
        n = T.rms_norm_np(x.astype(np.float64), np.ones(hidden), 1e-6)
        assert compare(got, np.concatenate([m.apply(n) for m in (q, k, v)])).passed


def test_a_launch_over_32_kb_is_refused_naming_the_width():
    t = dict(NT=256, HID=8192, WIDTH=8192, FMT=F.BFLOAT16.code, GS=32)
    assert KM.threadgroup_bytes("wo_residual", t) == 32768
    assert KM.threadgroup_bytes("ffn_gate_up", dict(t, HID=8064)) == 8064 * 4 + 32  # both fit: scratch beside n
    with pytest.raises(ValueError, match=r"branch \(8196\): wo_residual would declare 32784 bytes"):
        KM.check_threadgroup_memory(
            "wo_residual", [("NT", 512), ("WIDTH", 8196), ("FMT", F.FLOAT32.code), ("GS", 32)], "branch (8196)"
        )
    with pytest.raises(ValueError, match="kernel must be one of"):
        KM.threadgroup_bytes("attention", t)


@pytest.mark.parametrize("name", loader.list_models())
def test_every_shipped_models_widths_launch_on_apple_gpus(name):
    cfg = loader.load_model(name)
    t = KT.DEFAULT_TUNING
    for layer in cfg.attention_layers():
        lc = cfg.layer(layer)
        branch, ffn = lc.num_q_heads * lc.head_dim, lc.ffn_dim or cfg.hidden_size
        templates = {
            "wo_residual": dict(NT=t.wo_nt, WIDTH=branch),
            "ffn_gate_up": dict(NT=t.rows_nt, HID=cfg.hidden_size),
            "ffn_down": dict(NT=t.down_nt),
            "head_qkv": dict(NT=t.head_nt, HID=cfg.hidden_size),
        }
        for fmt, gs in (
            (F.BFLOAT16.code, 32),
            (F.AFFINE4.code, 64),
            (F.AFFINE8.code, 64),
            (F.MXFP4.code, 32),
            (F.NVFP4.code, 16),
        ):
            for kernel, tp in templates.items():
                assert KM.threadgroup_bytes(kernel, dict(tp, FMT=fmt, GS=gs)) <= KT.METAL_THREADGROUP_LIMIT, (
                    name,
                    layer,
                    kernel,
                    ffn,
                    fmt,
                )


# -- Bonsai-27B's shape -----------------------------------------------------------------------


@pytest.mark.slow
def test_bonsai_27b_bf16_matches_the_float64_oracle():
    h, b, f = model.BONSAI_SHAPE
    w = T.TailWeights.random(h, b, f, seed=5, fold_block=1024, dtype="bfloat16")
    br, res = T.random_inputs(w, seed=6)
    truth = host_tail_exact(w, br, res)
    tol, _ = tolerance_for(w, br, res, truth)
    r = compare(T.fused_tail(w, br, res, backend="metal-emulated"), truth, tol=tol)
    assert r.passed, str(r)


# -- what notebook 03 shows -------------------------------------------------------------------


def test_metal_check_table():
    """Every schedule and every math variant, on both cases: same bits across schedules, the
    oracle's tolerance held, and the backend's own call is the ascending host run."""
    from workbench.kernels.metal_emulation import SCHEDULES
    from workbench.studies.metal_check import PROVES, SAME_BITS, metal_check_table
    from workbench.studies.metal_math_modes import VARIANTS

    df = metal_check_table()
    assert len(SCHEDULES) == 6 and len(VARIANTS) == 7
    assert list(df["path"]) == (["metal-emulated"] * len(VARIANTS) + ["graph"]) * 2
    metal = df[df["path"] == "metal-emulated"]
    assert set(metal["math"]) == {"host", *(f"{m} {e}" for m, e in VARIANTS[1:])}
    assert df["passed"].all() and (df["tol"] == SEED_TOL).all(), df.to_string()
    assert metal[SAME_BITS].all(), df.to_string()
    assert (metal.loc[metal["math"] == "host", "x host"] == 1.0).all()
    # The math variants move results, so their errors differ from the host's on some variant.
    assert metal.groupby("case")["worst"].nunique().gt(1).all(), df.to_string()
    assert "does not" in PROVES and "8.4" in PROVES and "Mac" not in PROVES
    with pytest.raises(ValueError, match="seed"):
        metal_check_table(seed=-1)


def test_without_clang_every_entry_says_what_to_install(monkeypatch):
    monkeypatch.setenv("WORKBENCH_CLANG", "no-such-clang++")
    c = seed_case()
    with pytest.raises(B.BackendUnavailable, match="apt-get install clang"):
        KE.emulated_tail(T.tail_launch(c.weights), c.branch, c.residual)
    with pytest.raises(B.BackendUnavailable, match="apt-get install clang"):
        ME.compile_source(KE.emulated_tail_sources(T.tail_launch(c.weights))[0])
    m = WeightMatrix(np.ones((32, 64), np.float32))
    with pytest.raises(B.BackendUnavailable, match="apt-get install clang"):
        KH.head_launch(mx.zeros((64,)), np.ones(64, np.float32), 1e-6, m, m, m, "metal-emulated")


def test_the_two_rewrites_and_the_entry():
    src = KE.emulated_tail_sources(T.tail_launch(seed_case().weights))[1]  # gate_up: group memory, a template
    assert "GROUP_SHARED float4 xs4[" in src and "[[host_name(" in src
    tu = ME.translation_unit(src)
    assert "[[host_name(" not in tu and "template decltype(" in tu
    assert "threadgroup metal_emulation_array_xs4& xs4 = " in tu and "GROUP_SHARED float4 xs4[" not in tu
    name, params, targs = ME.signature(src)
    assert [p.name for p in params if p.buffer is not None] == list(
        ks.KERNELS["ffn_gate_up"].inputs + ks.KERNELS["ffn_gate_up"].outputs
    )
    assert f"{name}<{targs}>(" in tu and 'extern "C" void metal_emulation_entry' in tu
    with pytest.raises(ME.MetalCompileError, match="no `\\[\\[kernel\\]\\] void name"):
        ME.translation_unit("int main() {}")
