"""The tail as one CUDA launch (``workbench.kernels.one_launch``, ``kernels/tail_one_launch.body``).

Its numbers are checked on an NVIDIA GPU (``python -m bench.one_launch``: against the
float64 oracle and the three launches, and the barrier's timeout); a grid barrier cannot
run in the CPU emulator, which runs groups one after another. Here: the composition (each
phase is its launch's body, verbatim, with its own template values), the CUDA text
compiled by nvcc with the template values a launch would pass (no spills, one 512-thread
group an SM, shared memory as :func:`one_launch.static_shared_bytes` says and under CUDA's
static limit), and every refusal; the launch's Python side with MLX's kernel objects
replaced (inputs, grid, ordering, the barrier's limit and flag); the bodies at the group
sizes the benchmark sweeps, emulated, against float64; what the benchmark reads from its
records and how it chooses a variant; ``fused_tail(backend="cuda")`` as the one launch (its
shape per format, rows ordered, the barrier's flag, the three launches where it does not
fit), with MLX's kernel objects replaced; the kernel text's fingerprint.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from workbench import backends, tail
from workbench.fold import formats as F
from workbench.kernels import cuda_device, one_launch
from workbench.kernels import emulated as kernel_emulated
from workbench.kernels import launch as kernel_launch
from workbench.kernels import matrices as kernel_matrices
from workbench.kernels import run as kernel_run
from workbench.kernels import source as ks
from workbench.kernels import tuning as kernel_tuning
from workbench.reports import one_launch as one_launch_report
from workbench.reports import records


def test_each_phase_is_its_launch_body_verbatim_in_order():
    header, source = ks.compose_one_launch()
    assert "//== phase" not in source
    at = [source.index(ks.read(ks.KERNELS[k].body)) for k, _ in ks.ONE_LAUNCH_PHASES]
    assert at == sorted(at)
    # two grid barriers, between the phases
    bars = [m.start() for m in re.finditer(r"grid_barrier\(count", source)]
    assert len(bars) == 2 and at[0] < bars[0] < at[1] < bars[1] < at[2]
    assert "grid_barrier" in header and "ld.acquire.gpu" in header


def test_inputs_leave_h_and_act_to_the_launch_memory():
    names = ks.one_launch_inputs()
    assert names[-2:] == ("work", "after") and len(set(names)) == len(names)
    assert not {"h", "hin", "act"} & set(names)
    for k, _ in ks.ONE_LAUNCH_PHASES:
        assert set(ks.KERNELS[k].inputs) - {"hin", "act"} <= set(names)


def test_each_phase_binds_its_own_template_values():
    _, source = ks.compose_one_launch()
    for kernel, prefix in ks.ONE_LAUNCH_PHASES:
        for t in ks.KERNELS[kernel].template:
            if t != "NT":
                assert f"constexpr auto {t} = {prefix}{t};" in source
    names = ks.one_launch_template()
    assert len(set(names)) == len(names) and names[:5] == ("NT", "HID", "FFN", "SYNC_AT", "BARRIER_LIMIT_MS")


def test_an_unknown_phase_line_is_refused(tmp_path: Path):
    copy = tmp_path / "kernels"
    shutil.copytree(ks.KERNEL_DIR, copy, ignore=shutil.ignore_patterns("metal_emulation"))
    body = copy / ks.ONE_LAUNCH_BODY
    body.write_text(body.read_text().replace("//== phase ffn_down ==", "//== phase ffn_sideways =="))
    with pytest.raises(ValueError, match="unknown phase 'ffn_sideways'"):
        ks.compose_one_launch(kernel_dir=copy)


def _small_prep(dtype: str = "bfloat16", quantize: dict | None = None) -> kernel_launch.PreparedTail:
    w = tail.TailWeights.random(256, 1024, 2048, seed=3, fold_block=256, dtype=dtype, quantize=quantize)
    # the template values are dialect-free; a Metal prepared tail can be made without a GPU
    return kernel_launch.prepare_tail(tail.tail_launch(w), "metal")


def test_the_launch_template_is_each_launchs_own_with_downs_rows_from_the_shape():
    prep = _small_prep()
    shape = one_launch.OneLaunchShape(down_rows=4)
    t = dict(one_launch.launch_template(prep, shape))
    assert tuple(t) == ks.one_launch_template()
    for kernel, prefix in ks.ONE_LAUNCH_PHASES:
        own = {"NT", "DR", "U"} if kernel == "ffn_down" else {"NT"}  # what the one launch sets itself
        for name, value in prep.templates()[kernel]:
            if name not in own:
                assert t[prefix + name] == value, (kernel, name)
    assert t["NT"] == shape.nt and t["DN_DR"] == 4
    assert t["DN_U"] == kernel_matrices.units_for(prep.down.fmt, prep.tuning.u_down) // 4
    assert t["SYNC_AT"] % 32 == 0 and t["SYNC_AT"] >= prep.hidden + prep.ffn


@pytest.mark.parametrize(
    "kw, says",
    [
        (dict(nt=48), "nt: must be a multiple of 32"),
        (dict(nt=2048), "nt"),
        (dict(down_rows=3), "down_rows: must be 1, 2, 4 or 8"),
        (dict(groups_per_sm=0), "groups_per_sm"),
        (dict(sm_count=0), "sm_count"),
        (dict(row_units=0), "row_units"),
        (dict(row_units=65), "row_units"),
    ],
)
def test_bad_shapes_are_refused_by_name(kw, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        one_launch.OneLaunchShape(**kw)


def test_metal_has_no_one_launch_tail():
    with pytest.raises(ValueError, match="CUDA only.*no forward progress"):
        one_launch.OneLaunchTail(_small_prep())
    with pytest.raises(ValueError, match="prep must be a kernels.launch.PreparedTail"):
        one_launch.OneLaunchTail("a tail")


def test_the_sm_count_comes_from_the_driver_or_raises():
    with pytest.raises(ValueError, match="device must be a non-negative integer"):
        cuda_device.multiprocessor_count(-1)
    if backends.cuda_available():
        assert cuda_device.multiprocessor_count() > 0
    else:
        try:
            n = cuda_device.multiprocessor_count()
        except backends.BackendUnavailable as e:
            assert "CUDA driver" in str(e)
        else:  # a driver without MLX's CUDA back-end: still a real count
            assert n > 0


# -- the CUDA text, compiled here when nvcc is -------------------------------------------


def _dtypes(fmt: int, sfmt: int) -> dict[str, str]:
    return ks.input_dtypes(ks.one_launch_inputs(), fmt, sfmt)


def _bonsai_template(fmt: int, sfmt: int, gs: int) -> dict[str, object]:
    """The template values a launch passes at Bonsai-27B's shape (its defaults), written out:
    making Bonsai's weights here would take minutes of CPU."""
    base = dict(FMT=fmt, SFMT=sfmt, GS=gs, QI=F.by_code(fmt)[0].quantized)
    t: dict[str, object] = dict(
        NT=512, HID=5120, FFN=17408, SYNC_AT=22528, BARRIER_LIMIT_MS=one_launch.BARRIER_LIMIT_MS
    )
    u = kernel_matrices.units_for
    phases = {
        "WO_": dict(base, WIDTH=6144, ROWS=5120, ROT=True, M=1, LOGP=10, U=u(fmt, 4), PRE=True),
        "GU_": dict(base, HID=5120, FFN=17408, U=u(fmt, 4), PRE=False),
        "DN_": dict(base, HID=5120, FFN=17408, U=max(1, u(fmt, 16) // 4), DR=4),
    }
    for prefix, values in phases.items():
        t.update({prefix + k: v for k, v in values.items()})
    return t


def _ptxas(src: Path) -> tuple[int, int, str]:
    # Device code only (-cubin), as MLX compiles a kernel (NVRTC): the host pass is most of
    # nvcc's time and gives nothing read here.
    r = subprocess.run(
        ["nvcc", "-arch=sm_90", "-cubin", "-o", str(src.with_suffix(".cubin")), "-Xptxas", "-v", str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "0 bytes spill stores" in r.stderr, r.stderr[-2000:]
    m = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", r.stderr)
    assert m, r.stderr[-2000:]
    return int(m.group(1)), int(m.group(2)), r.stderr


#: bf16; affine 8-bit (the most shared memory: x tiled with its sums in two phases);
#: nvfp4 (the most registers).
_BONSAI_FORMATS = [
    (F.BFLOAT16.code, 0, 32),
    (F.AFFINE8.code, F.SCALE_CODES["bfloat16"], 64),
    (F.NVFP4.code, F.SCALE_CODES["e4m3"], 16),
]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
@pytest.mark.parametrize("fmt,sfmt,gs", _BONSAI_FORMATS, ids=["bf16", "affine8", "nvfp4"])
def test_bonsai_one_launch_compiles_to_one_group_an_sm(tmp_path: Path, fmt, sfmt, gs):
    src = tmp_path / "one.cu"
    src.write_text(ks.one_launch_translation_unit(_dtypes(fmt, sfmt), _bonsai_template(fmt, sfmt, gs)))
    regs, smem, _ = _ptxas(src)
    assert regs * 512 <= 65536, "a 512-thread group must fit an SM alone (the grid barrier needs every group resident)"
    assert smem <= one_launch.STATIC_SHARED_LIMIT


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_the_shared_memory_estimate_is_what_nvcc_allocates(tmp_path: Path):
    prep = _small_prep()
    shape = one_launch.OneLaunchShape()
    dtypes = _dtypes(prep.wo.fmt, prep.wo.sfmt)
    src = tmp_path / "small.cu"
    src.write_text(ks.one_launch_translation_unit(dtypes, dict(one_launch.launch_template(prep, shape))))
    _, smem, _ = _ptxas(src)
    est = one_launch.static_shared_bytes(prep, shape)
    assert est - 16 <= smem <= est


def test_the_committed_record_reads_into_its_tables():
    # the first one-launch record: the oldest layout its tables must still read
    rec = records.load_all("one_launch")[0]
    checks, timing = one_launch_report.record_tables(rec)
    assert len(checks) == len(rec["checks"]) and checks["pass"].all() == rec["all_checks_passed"]
    bf16 = timing["bfloat16"]
    case = rec["cases"][0]
    assert bf16["one wait: one launch compiled"] == case["resident_ms"]["one_launch_compiled"]["median_ms"]
    assert bf16["one launch / three (one wait)"] == pytest.approx(case["one_launch_compiled_over_three_compiled"])


@pytest.mark.parametrize(
    "bad, says",
    [
        (None, "record: must be a 'one_launch' record"),
        ({"bench": "kernel_bench"}, "record: is a 'kernel_bench' record, expected 'one_launch'"),
        ({"bench": "one_launch"}, "record: a 'one_launch' record must have"),
    ],
)
def test_record_tables_refuses_what_is_not_its_record(bad, says):
    with pytest.raises(records.RecordError, match=says):
        one_launch_report.record_tables(bad)


@pytest.mark.skipif(not backends.clang_available(), reason="clang++ is not installed here (the Metal emulator)")
@pytest.mark.parametrize("nt, fmt, u", [(768, None, 4), (640, "nvfp4", 8), (640, "affine4", 8), (640, "mxfp4", 8)])
def test_the_bodies_at_the_group_sizes_the_one_launch_sweeps_match_float64(nt, fmt, u):
    """bench.one_launch tries 640 and 768 threads a group (not powers of two), the
    quantized formats with more units in flight (640 threads and u 8 is the shape
    fused_tail(backend="cuda") runs every 4-bit format in, one_launch.shape_for): the
    three bodies at those sizes, run by the Metal emulator, against the float64 oracle."""
    from workbench.fold.weights import QUANT_FORMATS
    from workbench.studies.exact_oracle import host_tail_exact
    from workbench.tail.comparison import compare

    quant = QUANT_FORMATS[fmt].as_quantize() if fmt else None
    w = tail.TailWeights.random(128, 512, 1024, seed=5, fold_block=256, dtype="bfloat16", quantize=quant)
    br, res = tail.random_inputs(w, seed=6)
    t = kernel_tuning.KernelTuning(wo_nt=nt, rows_nt=nt, down_nt=nt, down_rows=4, u_down=16, u_wo=u, u_gate_up=u)
    out = kernel_emulated.emulated_tail(tail.tail_launch(w), br, res, tuning=t)
    assert compare(out, host_tail_exact(w, br, res)).passed


def _cuda_prep_without_gpu(monkeypatch) -> kernel_launch.PreparedTail:
    """A CUDA prepared tail (hidden 128, branch 512, ffn 1024) made without a GPU: the three
    launches' MLX kernel objects replaced by placeholders, which nothing here calls."""
    monkeypatch.setattr(kernel_launch, "compiled_kernel", lambda *a, **k: object())
    w = tail.TailWeights.random(128, 512, 1024, seed=5, fold_block=256, dtype="bfloat16")
    return kernel_launch.prepare_tail(tail.tail_launch(w), "cuda")


def test_each_launch_passes_its_inputs_by_name_and_names_the_previous_output(monkeypatch):
    """The Python side of a launch, without a GPU: MLX's CUDA kernel objects replaced by a
    recorder. Inputs in the kernel's order, the grid one group an SM, and each launch's
    ``after`` the previous launch's output (what orders them in MLX's graph)."""
    import mlx.core as mx

    prep = _cuda_prep_without_gpu(monkeypatch)
    calls = []

    def recorder(**kw):
        calls.append(kw)
        return [mx.full((kw["output_shapes"][0][0],), float(len(calls)))]

    monkeypatch.setattr(one_launch, "_kernel", lambda kernel_dir=None, compact=True, next_norm=False: recorder)
    one = one_launch.OneLaunchTail(prep, one_launch.OneLaunchShape(sm_count=4))
    b, r = mx.ones((512,)), mx.zeros((128,))
    first = one(b, r)
    second = one(b, r)
    names = ks.one_launch_inputs()
    for kw in calls:
        assert len(kw["inputs"]) == len(names)
        got = dict(zip(names, kw["inputs"]))
        assert got["x"] is b and got["residual"] is r and got["work"] is one.work and got["w"] is prep.wo.w
        assert got["wd"] is prep.down.w and got["nw"] is prep.norm and got["sdest"] is prep.rot["sdest"]
        assert kw["grid"] == (4 * 512, 1, 1) and kw["threadgroup"] == (512, 1, 1)
        assert kw["template"] == one_launch.launch_template(prep, one.shape)
    assert dict(zip(names, calls[0]["inputs"]))["after"] is one._none
    assert dict(zip(names, calls[1]["inputs"]))["after"] is first
    assert one(b, r, after=second) is not None and dict(zip(names, calls[2]["inputs"]))["after"] is second


def test_a_reset_retraces_the_compiled_launch_with_the_new_memory(monkeypatch):
    """After a barrier timeout, run() zeroes the launch's memory by making a new array;
    the compiled form traced the old one in, so it must be traced again."""

    prep = _cuda_prep_without_gpu(monkeypatch)
    echo = lambda **kw: [kw["inputs"][-2][: kw["output_shapes"][0][0]] + 0]  # noqa: E731
    monkeypatch.setattr(one_launch, "_kernel", lambda kernel_dir=None, compact=True, next_norm=False: echo)
    one = one_launch.OneLaunchTail(prep, one_launch.OneLaunchShape(sm_count=4))
    first = one.compiled()
    old = one.work
    one.reset()
    assert one.work is not old and one.compiled() is not first


@pytest.mark.parametrize("limit", [0, -5, 1.5, True, "4000", one_launch.MAX_BARRIER_LIMIT_MS + 1])
def test_a_bad_barrier_limit_is_refused_by_name(limit, monkeypatch):
    prep = _cuda_prep_without_gpu(monkeypatch)
    with pytest.raises(ValueError, match="barrier_limit_ms must be an integer from 1 to 3600000"):
        one_launch.OneLaunchTail(prep, one_launch.OneLaunchShape(sm_count=4), barrier_limit_ms=limit)
    with pytest.raises(ValueError, match="barrier_limit_ms"):
        one_launch.launch_template(prep, one_launch.OneLaunchShape(), limit)


def test_the_barrier_limit_reaches_the_kernel_and_the_timeout_message(monkeypatch):
    """A sanitizer run raises the limit (instrumented groups are slow); the launch's
    template carries it, and a timeout names the limit that was in force."""
    import mlx.core as mx

    prep = _cuda_prep_without_gpu(monkeypatch)
    seen = []

    def flagged(**kw):  # a launch that raises the barrier's failure flag
        seen.append(dict(kw["template"])["BARRIER_LIMIT_MS"])
        work = kw["inputs"][ks.one_launch_inputs().index("work")]
        work[one_launch.sync_at(prep) + 32] = mx.array(1, dtype=mx.uint32).view(mx.float32)
        return [mx.full((kw["output_shapes"][0][0],), float("nan"))]

    monkeypatch.setattr(one_launch, "_kernel", lambda kernel_dir=None, compact=True, next_norm=False: flagged)
    one = one_launch.OneLaunchTail(
        prep, one_launch.OneLaunchShape(sm_count=4), barrier_limit_ms=one_launch.SANITIZER_BARRIER_LIMIT_MS
    )
    with pytest.raises(one_launch.GridBarrierTimeout, match="waited over 600 s"):
        one.run([1.0] * 512, [0.0] * 128)
    assert seen == [one_launch.SANITIZER_BARRIER_LIMIT_MS]
    assert not one.barrier_failed()  # run() zeroed the memory for the next launch


def test_the_wait_breakdown_reads_both_committed_records():
    """notebook 08's breakdown of the one launch's wait: the kernel run once (ncu) beside
    its evaluation, from the committed records; the arithmetic checked row by row."""
    # the one launch timed beside PyTorch's graph replay, and its ncu profile of minutes later:
    # the pair that showed MLX adds more around the kernel than the graph replay does
    rec = records.load("one_launch", "one_launch-nvidia-h200-20261201T112516Z.json")
    prof = records.load("launch_profile", "launch_profile-nvidia-h200-20261201T112816Z.json")
    t = one_launch_report.wait_breakdown(rec, prof)
    assert list(t.columns) == ["bfloat16", "affine4", "nvfp4"]  # the formats both records have
    bf = t["bfloat16"]
    assert bf["MLX around the kernel, at least"] == pytest.approx(
        bf["evaluation and wait"] - bf["kernel run once (ncu)"]
    )
    case = next(c for c in rec["cases"] if c["case"] == "bonsai27b-bfloat16")
    torch_wait = case["resident_ms"]["torch_cuda_graph"]["median_ms"]
    assert bf["kernel for one wait = PyTorch graph, at most"] == pytest.approx(
        torch_wait - bf["MLX around the kernel, at least"]
    )
    assert bf["floor"] == pytest.approx(case["floor_ms"])
    assert t["affine4"].isna()["floor"]  # PyTorch ran bf16 only


def test_the_sweep_table_reads_the_committed_record():
    """notebook 08's sweep table: device ms a tail, variant by swept format, NaN where a
    variant failed, and the variant each format was timed with."""
    import math

    # the shape sweep behind one_launch.FOUR_BIT_NT (640 threads a group in the 4-bit formats)
    rec = records.load("one_launch", "one_launch-nvidia-h200-20261201T131203Z.json")
    t = one_launch_report.sweep_table(rec)
    assert list(t.columns) == ["bfloat16", "affine4", "mxfp4", "nvfp4"]
    assert t.loc["default", "affine4"] == rec["sweeps"]["affine4"]["default"]["device_ms"]
    assert math.isnan(t.loc["gps2", "bfloat16"])  # two groups an SM do not fit bf16's registers
    assert t.loc["chosen"].tolist() == ["default", "gps2", "nt640", "u8_nt640"]
    with pytest.raises(ValueError, match="with its sweeps"):  # the older layout: one sweep
        one_launch_report.sweep_table({k: v for k, v in rec.items() if k != "sweeps"} | {"sweep": {}})


def _made_up(kind: str, **fields) -> dict:
    """A record of ``kind`` with every key its kind promises (None but the bench and ``fields``)."""
    return {key: None for key in records.KINDS[kind].keys} | {"bench": kind} | fields


@pytest.mark.parametrize(
    "rec, prof, says",
    [
        (
            {"bench": "kernel_bench"},
            _made_up("launch_profile", table=[]),
            "record: is a 'kernel_bench' record, expected 'one_launch'",
        ),
        (
            _made_up("one_launch"),
            _made_up("launch_profile", table=[]),
            "record must be a bench.one_launch record with timed cases",
        ),
        (
            _made_up("one_launch", cases=[]),
            {"bench": "one_launch"},
            "profile: is a 'one_launch' record, expected 'launch_profile'",
        ),
        (_made_up("one_launch", cases=[]), _made_up("launch_profile", table=[]), "share no weight format"),
    ],
)
def test_the_wait_breakdown_refuses_other_records(rec, prof, says):
    with pytest.raises(ValueError, match=says):
        one_launch_report.wait_breakdown(rec, prof)


def test_each_format_is_timed_with_its_own_sweeps_fastest_variant():
    """bench.one_launch: a swept format takes its own fastest variant if it beats the
    default by more than the margin (one that failed or disagreed has no time and is never
    chosen); an unswept one the first swept format's choice."""
    from bench.one_launch import chosen_variants

    sweeps = {
        "bfloat16": {"default": {"device_ms": 0.18}, "u8": {"device_ms": 0.15}, "nt1024": {"error": "x"}},
        "nvfp4": {
            "default": {"device_ms": 0.22},
            "u16": {"device_ms": 0.30},
            "nt640": {"error": "disagrees", "vs_default_worst_scaled": 1.0},
        },
    }
    got = chosen_variants(["bfloat16", "affine4", "nvfp4"], sweeps)
    assert got == {"bfloat16": "u8", "affine4": "u8", "nvfp4": "default"}
    assert chosen_variants(["affine4"], {"affine4": {"nt1024": {"error": "x"}}}) == {"affine4": "default"}
    # within the margin of the default (the sweep's noise), the default stands
    near = {"bfloat16": {"default": {"device_ms": 0.1785}, "u8": {"device_ms": 0.1744}}}
    assert chosen_variants(["bfloat16"], near) == {"bfloat16": "default"}
    assert chosen_variants(["bfloat16"], near, margin=0.01) == {"bfloat16": "u8"}


def test_sweep_formats_must_be_among_the_formats(capsys):
    from bench import one_launch as bench_one_launch

    with pytest.raises(SystemExit):
        bench_one_launch.main(["--formats", "bfloat16", "--sweep-formats", "nvfp4", "--no-record"])
    assert "--sweep-formats must be a comma-separated list of ['bfloat16']" in capsys.readouterr().err


def test_the_benchs_run_times_each_format_with_its_own_choice(monkeypatch):
    """bench.one_launch.run's orchestration without a GPU: every device step replaced by a
    stand-in; with --sweep-formats each swept format is timed with its own sweep's choice,
    the others with the first's."""
    from bench import one_launch as bench

    monkeypatch.setattr(bench, "_weights", lambda fmt, shape, block, seed: fmt)
    monkeypatch.setattr(bench.tail, "random_inputs", lambda w, seed: ([0.0], [0.0]))
    monkeypatch.setattr(bench, "seed_case", lambda: type("C", (), {"weights": "seed", "branch": 0, "residual": 0}))
    monkeypatch.setattr(bench, "_check", lambda label, w, br, res, oracle: {"case": label, "passed": True})
    monkeypatch.setattr(bench.kernels, "copy_bandwidth_torch", lambda: 4e12)
    monkeypatch.setattr(bench.kernels.timing, "copy_bandwidth", lambda *a, **k: 4e12)
    monkeypatch.setattr(bench, "fixed_cost", lambda repeats: {"one_tiny_eval": 0.03})
    fast = {"bfloat16": "u8_nt640", "nvfp4": "gps2"}  # each format's clear winner
    monkeypatch.setattr(
        bench,
        "sweep",
        lambda w, b, r, br, res: {
            "default": {"device_ms": 1.0},
            fast[w]: {"device_ms": 0.5},
            "u16": {"device_ms": 0.9},
        },
    )
    timed = {}

    def time_case(label, w, tuning, shape, bandwidth, repeats, seed):
        timed[w] = (tuning, shape)
        return {"case": label}

    monkeypatch.setattr(bench, "time_case", time_case)
    monkeypatch.setattr(bench, "print_case", lambda c: None)
    out = bench.run(["bfloat16", "affine4", "nvfp4"], 1, 0, False, ["bfloat16", "nvfp4"])
    assert out["variant_chosen"] == {"bfloat16": "u8_nt640", "affine4": "u8_nt640", "nvfp4": "gps2"}
    assert [c["variant"] for c in out["cases"]] == ["u8_nt640", "u8_nt640", "gps2"]
    assert timed["nvfp4"][1] == bench.VARIANTS["gps2"][1] and timed["bfloat16"][1].nt == 640
    assert timed["affine4"][0].u_wo == 8 and out["sweep"] is out["sweeps"]["bfloat16"]

    # --no-sweep: nothing swept; each format timed as fused_tail(backend="cuda") runs it
    monkeypatch.setattr(bench, "sweep", lambda *a: pytest.fail("--no-sweep swept"))
    monkeypatch.setattr(bench.tail, "tail_launch", lambda w: ("launch", w))
    monkeypatch.setattr(bench, "prepared", lambda launch, dialect, tuning: ("prep", launch, tuning))
    monkeypatch.setattr(bench, "shape_for", lambda prep: ("shape for", prep[1][1]))
    timed.clear()
    out = bench.run(["bfloat16", "nvfp4"], 1, 0, False, [])
    assert out["sweeps"] == {} and "sweep" not in out
    assert out["variant_chosen"] == {"bfloat16": bench.FUSED_TAIL, "nvfp4": bench.FUSED_TAIL}
    assert timed == {f: (kernel_tuning.DEFAULT_TUNING, ("shape for", f)) for f in ("bfloat16", "nvfp4")}


def test_no_sweep_and_sweep_formats_exclude_each_other(capsys):
    from bench import one_launch as bench_one_launch

    with pytest.raises(SystemExit):
        bench_one_launch.main(["--no-sweep", "--sweep-formats", "bfloat16", "--no-record"])
    assert "--no-sweep and --sweep-formats exclude each other" in capsys.readouterr().err


# -- fused_tail(backend="cuda"): the one launch, without a GPU ------------------------------


def _fake_cuda(monkeypatch, launch_kernel) -> None:
    """A machine that looks like it has MLX's CUDA back-end and 4 SMs: the three launches'
    kernel objects are placeholders and the one launch's is ``launch_kernel``."""
    monkeypatch.setattr(backends, "cuda_available", lambda: True)
    monkeypatch.setattr(cuda_device, "multiprocessor_count", lambda device=0: 4)
    monkeypatch.setattr(kernel_launch, "compiled_kernel", lambda *a, **k: object())
    monkeypatch.setattr(one_launch, "_kernel", lambda kernel_dir=None, compact=True, next_norm=False: launch_kernel)


@pytest.mark.parametrize(
    "fmt,nt",
    [
        (None, one_launch.DEFAULT_NT),
        ("affine4", one_launch.FOUR_BIT_NT),
        ("affine8", one_launch.DEFAULT_NT),
        ("mxfp4", one_launch.FOUR_BIT_NT),
        ("nvfp4", one_launch.FOUR_BIT_NT),
    ],
)
def test_the_cuda_path_runs_4bit_tails_in_640_thread_groups_two_units_a_lane(monkeypatch, fmt, nt):
    from workbench.fold.weights import QUANT_FORMATS

    monkeypatch.setattr(kernel_launch, "compiled_kernel", lambda *a, **k: object())
    quant = QUANT_FORMATS[fmt].as_quantize() if fmt else None
    w = tail.TailWeights.random(128, 512, 1024, seed=5, fold_block=256, dtype="bfloat16", quantize=quant)
    prep = kernel_launch.prepare_tail(tail.tail_launch(w), "cuda")
    shape = one_launch.shape_for(prep)
    assert (shape.nt, shape.groups_per_sm) == (nt, 1)  # one group an SM: always resident
    assert one_launch.fits(prep, shape)
    # 4-bit: wo and gate_up load FOUR_BIT_ROW_UNITS (two 4-bit units) a batch; the rest
    # keep the tuning's (and down always does)
    phases = one_launch._phase_templates(prep, shape)
    tuned = {k: dict(v) for k, v in prep.templates().items()}
    four_bit = fmt in ("affine4", "mxfp4", "nvfp4")
    assert shape.row_units == (one_launch.FOUR_BIT_ROW_UNITS if four_bit else None)
    for k in ("wo_residual", "ffn_gate_up"):
        assert phases[k]["U"] == (2 if four_bit else tuned[k]["U"])
    assert phases["ffn_down"]["U"] == max(
        1, kernel_matrices.units_for(prep.down.fmt, prep.tuning.u_down) // shape.down_rows
    )


@pytest.mark.parametrize(
    "formats,nt",
    [
        ([F.FLOAT32], one_launch.DEFAULT_NT),
        ([F.BFLOAT16] * 4, one_launch.DEFAULT_NT),
        ([F.AFFINE8] * 4, one_launch.DEFAULT_NT),
        ([F.BFLOAT16, F.AFFINE4, F.BFLOAT16, F.BFLOAT16], one_launch.FOUR_BIT_NT),
        ([F.MXFP4], one_launch.FOUR_BIT_NT),
        ([F.NVFP4], one_launch.FOUR_BIT_NT),
    ],
)
def test_shape_for_formats_gives_the_4bit_shape_where_any_matrix_is_4bit(formats, nt):
    shape = one_launch.shape_for_formats(formats)
    assert shape.nt == nt and shape.groups_per_sm == 1
    assert shape.row_units == (None if nt == one_launch.DEFAULT_NT else one_launch.FOUR_BIT_ROW_UNITS)


@pytest.mark.parametrize("formats", [[], [F.FLOAT16], [F.BFLOAT16, F.MXFP8], [1], ["bfloat16"]])
def test_shape_for_formats_names_what_it_cannot_read(formats):
    with pytest.raises(ValueError, match="formats: must be at least one weight format the kernels read"):
        one_launch.shape_for_formats(formats)


def test_fused_tail_on_cuda_is_the_one_launch_each_row_ordered_after_the_last(monkeypatch):
    """fused_tail(backend="cuda") runs ONE launch a row (not the three), every launch
    naming the one before it as ``after``, all in one evaluation; the output is the
    launch's, rows in order."""
    import mlx.core as mx
    import numpy as np

    calls = []

    def launch(**kw):
        calls.append(kw)
        got = dict(zip(ks.one_launch_inputs(), kw["inputs"]))
        return [got["residual"] + float(len(calls))]

    _fake_cuda(monkeypatch, launch)
    w = tail.TailWeights.random(128, 512, 1024, seed=5, fold_block=256, dtype="bfloat16")
    br, res = tail.random_inputs(w, batch=(3,), seed=6)
    out = tail.fused_tail(w, br, res, backend="cuda")
    assert len(calls) == 3 and out.shape == (3, 128)
    np.testing.assert_array_equal(out, res.astype(np.float32) + np.arange(1, 4, dtype=np.float32)[:, None])
    names = ks.one_launch_inputs()
    afters = [dict(zip(names, kw["inputs"]))["after"] for kw in calls]
    one = one_launch.for_launch(tail.tail_launch(w))
    assert afters[0] is one._none  # first launch of this tail: nothing before it
    assert all(kw["grid"] == (4 * one_launch.DEFAULT_NT, 1, 1) for kw in calls)
    assert one_launch.for_launch(tail.tail_launch(w)) is one  # made once per weights object
    mx.eval(*afters)


def test_fused_tail_on_cuda_raises_when_a_barrier_gave_up(monkeypatch):
    import mlx.core as mx

    def flagged(**kw):
        # what a launch whose barrier gave up leaves in its memory: the flag up. The real kernel
        # writes the launch's `work` in place on the device; here the tail's own array is set
        # (inside mx.compile's trace, kw["inputs"] holds stand-ins for it, not the array)
        one = one_launch.for_launch(tail.tail_launch(w))
        one.work[one_launch.sync_at(one.prep) + 32] = mx.array(1, dtype=mx.uint32).view(mx.float32)
        return [mx.full((kw["output_shapes"][0][0],), float("nan"))]

    _fake_cuda(monkeypatch, flagged)
    w = tail.TailWeights.random(128, 512, 1024, seed=5, fold_block=256, dtype="bfloat16")
    br, res = tail.random_inputs(w, seed=6)
    with pytest.raises(one_launch.GridBarrierTimeout, match="waited over 4 s"):
        tail.fused_tail(w, br, res, backend="cuda")
    assert not one_launch.for_launch(tail.tail_launch(w)).barrier_failed()  # zeroed for the next call


def test_the_cuda_path_runs_three_launches_where_the_one_does_not_fit(monkeypatch):
    """Where the one launch's shared memory would pass CUDA's static limit, the CUDA path
    is the three launches (kernel_run.run_kernel_tail), never a failed launch."""
    import numpy as np

    _fake_cuda(monkeypatch, None)
    monkeypatch.setattr(one_launch, "STATIC_SHARED_LIMIT", 1024)
    ran = []
    monkeypatch.setattr(
        kernel_run, "run_kernel_tail", lambda dialect, launch, b, r: ran.append(dialect) or np.zeros(128, np.float32)
    )
    w = tail.TailWeights.random(128, 512, 1024, seed=5, fold_block=256, dtype="bfloat16")
    br, res = tail.random_inputs(w, seed=6)
    assert one_launch.for_launch(tail.tail_launch(w)) is None
    assert tail.fused_tail(w, br, res, backend="cuda").shape == (128,) and ran == ["cuda"]


def test_the_kernel_texts_fingerprint_follows_every_source_file_and_only_them(tmp_path: Path):
    """kernel_source.fingerprint: the same text, the same digest; any body, prelude or
    common.h edited, another; the README and the Metal emulation's runtime not part of it.
    Every bench record carries it (bench.common.record.provenance)."""
    from bench.common import record

    copy = tmp_path / "kernels"
    shutil.copytree(ks.KERNEL_DIR, copy)
    assert ks.fingerprint(kernel_dir=copy) == ks.fingerprint() and len(ks.fingerprint()) == 12
    assert set(ks.source_files()) >= {"common.h", "prelude_cuda.h", "prelude_metal.h", "tail_one_launch.body"}
    assert "README.md" not in ks.source_files()
    (copy / "README.md").write_text("edited")
    assert ks.fingerprint(kernel_dir=copy) == ks.fingerprint()
    for name in ("ffn_down.body", "common.h"):
        edited = tmp_path / f"edit-{name}"
        shutil.copytree(ks.KERNEL_DIR, edited)
        (edited / name).write_text((edited / name).read_text() + "\n// one more line\n")
        assert ks.fingerprint(kernel_dir=edited) != ks.fingerprint()
    assert record.provenance("one_launch", [])["kernel_text"] == ks.fingerprint()


def test_another_kernel_folder_gets_its_own_one_launch_under_its_own_name(tmp_path, monkeypatch):
    """bench.kernel_bodies runs an older folder's one launch beside the current one: MLX
    keys compiled kernels by name, so another folder's one launch is named apart (by a
    digest of its text), and a prepared tail from a folder launches that folder's."""
    import mlx.core as mx

    copy = tmp_path / "kernels"
    shutil.copytree(ks.KERNEL_DIR, copy, ignore=shutil.ignore_patterns("metal_emulation"))
    assert ks.one_launch_mlx_name() == ks.ONE_LAUNCH_NAME == ks.one_launch_mlx_name(kernel_dir=ks.KERNEL_DIR)
    same = ks.one_launch_mlx_name(kernel_dir=copy)
    assert same.startswith(ks.ONE_LAUNCH_NAME + "_") and same == ks.one_launch_mlx_name(kernel_dir=copy)
    edited = tmp_path / "edited"
    shutil.copytree(copy, edited)
    (edited / "common.h").write_text((edited / "common.h").read_text() + "\n// edited\n")
    assert ks.one_launch_mlx_name(kernel_dir=edited) != same

    seen = []

    def fake_kernel(kernel_dir=None, compact=True, next_norm=False):
        seen.append(kernel_dir)
        return lambda **kw: [mx.zeros(kw["output_shapes"][0], dtype=mx.float32)]

    monkeypatch.setattr(kernel_launch, "compiled_kernel", lambda *a, **k: object())
    monkeypatch.setattr(one_launch, "_kernel", fake_kernel)
    w = tail.TailWeights.random(128, 512, 1024, seed=5, fold_block=256, dtype="bfloat16")
    prep = kernel_launch.prepare_tail(tail.tail_launch(w), "cuda", kernel_dir=copy)
    one = one_launch.OneLaunchTail(prep, one_launch.OneLaunchShape(sm_count=4))
    br, res = tail.random_inputs(w, seed=6)
    one(mx.array(br), mx.array(res))
    assert seen == [copy]


def test_tails_of_one_form_share_one_compiled_launch_each_passing_its_own_weights(monkeypatch):
    """``OneLaunchTail.compiled`` traces the launch once for every tail of the same form (a
    model's layers): two tails with different weights share the traced function, MLX traces
    it once, and each call hands the kernel that tail's own weights and memory."""
    import mlx.core as mx

    traces = []

    def launch(**kw):
        traces.append(kw)
        got = dict(zip(ks.one_launch_inputs(), kw["inputs"]))
        return [got["residual"] + got["wd"].astype(mx.float32).sum()]

    _fake_cuda(monkeypatch, launch)
    ws = [tail.TailWeights.random(128, 512, 1024, seed=s, fold_block=256, dtype="bfloat16") for s in (5, 6)]
    ones = [one_launch.for_launch(tail.tail_launch(w)) for w in ws]
    br, res = tail.random_inputs(ws[0], seed=7)
    b, r = mx.array(br.astype("float32")), mx.array(res.astype("float32"))
    got = [one.compiled()(b, r) for one in ones] + [ones[0].compiled()(b, r)]
    assert len(traces) == 1  # one trace for both tails (the same shapes)
    for one, out in zip(ones + ones[:1], got):
        want = r + one.prep.down.w.astype(mx.float32).sum()
        assert mx.array_equal(out, want).item()


def test_a_per_layer_trace_captures_its_own_weights_and_still_orders_its_launches(monkeypatch):
    """``compiled(trace="per-layer")``: each tail traces its own function (its weights captured
    in it), a call hands over only the activations, the memory and ``after``, gives what the
    shared trace gives, and still names the previous launch's output as ``after``."""
    import mlx.core as mx

    traces = []

    def launch(**kw):
        traces.append(kw)
        got = dict(zip(ks.one_launch_inputs(), kw["inputs"]))
        return [got["residual"] + got["wd"].astype(mx.float32).sum() + got["after"][: got["residual"].size]]

    _fake_cuda(monkeypatch, launch)
    ws = [tail.TailWeights.random(128, 512, 1024, seed=s, fold_block=256, dtype="bfloat16") for s in (5, 6)]
    ones = [one_launch.for_launch(tail.tail_launch(w)) for w in ws]
    br, res = tail.random_inputs(ws[0], seed=7)
    b, r = mx.array(br.astype("float32")), mx.array(res.astype("float32"))
    own = [one.compiled("per-layer") for one in ones]
    assert own[0] is ones[0].compiled("per-layer") and own[0] is not ones[0].compiled("shared")
    first = own[0](b, r)
    second = own[0](b, r)  # after = the first call's output
    assert len(traces) == 1
    want = r + ones[0].prep.down.w.astype(mx.float32).sum()
    assert mx.array_equal(first, want).item() and mx.array_equal(second, want + first).item()
    assert ones[0]._last is second
    other = own[1](b, r)
    assert len(traces) == 2  # another layer: its own trace, with its own weights
    assert mx.array_equal(other, r + ones[1].prep.down.w.astype(mx.float32).sum()).item()
    with pytest.raises(ValueError, match="trace: must be one of"):
        ones[0].compiled("captured")
