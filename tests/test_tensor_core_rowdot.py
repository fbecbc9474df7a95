"""experiments.tensor_core_rowdot without a GPU: the lanes' fragment mapping in numpy against
the exact map, the three-part split of x, the shape rules, and the kernel text through
nvcc where it is installed."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from experiments import tensor_core_rowdot as tc


def _random(rows: int, cols: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (rows, cols))
    scales = rng.uniform(-0.05, 0.05, (rows, cols // tc.GROUP))
    biases = rng.uniform(-0.3, 0.3, (rows, cols // tc.GROUP))
    x = rng.uniform(-1, 1, cols).astype(np.float32)
    return codes, scales, biases, x


def _exact(codes, scales, biases, x) -> tuple[np.ndarray, np.ndarray]:
    """The stored map in float64, and sum |w| |x| a row (the error's scale)."""
    w = np.repeat(scales, tc.GROUP, axis=1) * codes + np.repeat(biases, tc.GROUP, axis=1)
    return w @ x.astype(np.float64), np.abs(w) @ np.abs(x.astype(np.float64))


@pytest.mark.parametrize("subnormal", [False, True])
@pytest.mark.parametrize("rows, cols, seed", [(16, 64, 0), (32, 128, 1), (48, 256, 2)])
def test_the_fragment_mapping_takes_every_product_once(rows, cols, seed, subnormal) -> None:
    """Each (row, k) code meets x at the same k exactly once: the model of the lanes'
    A and B slots gives the exact map, up to x's split (24 significant bits or more)."""
    codes, scales, biases, x = _random(rows, cols, seed)
    truth, scale = _exact(codes, scales, biases, x)
    err = np.abs(tc.fragment_model(codes, scales, biases, x, subnormal) - truth) / scale
    assert err.max() < 2.0**-22


@pytest.mark.parametrize("top", [1e-3, 1.0, 3.0e4, 6.0e8])
def test_the_float16_scheme_keeps_x_in_range_at_any_scale(top) -> None:
    """x 2^e has its largest value in [2^14, 2^15) whatever x's scale (float16 neither
    overflows nor loses the large values), and the model stays exact to 2^-22."""
    codes, scales, biases, x = _random(32, 128, 5)
    x = (x / np.abs(x).max() * top).astype(np.float32)
    e = tc.x_scale_exponent(x)
    assert 2.0**14 <= np.abs(x).max() * 2.0**e < 2.0**15
    truth, scale = _exact(codes, scales, biases, x)
    assert (np.abs(tc.fragment_model(codes, scales, biases, x, True) - truth) / scale).max() < 2.0**-22


def test_a_code_at_the_wrong_k_is_far_outside_the_check() -> None:
    """What the check's tolerance separates: a mapping one nibble off gives errors many
    orders above CHECK_TOL (so a wrong slot in the kernel cannot pass the device check)."""
    codes, scales, biases, x = _random(32, 128, 3)
    truth, scale = _exact(codes, scales, biases, x)
    shifted = np.roll(codes, 1, axis=1)  # every code meets its neighbour's x
    err = np.abs(tc.fragment_model(shifted, scales, biases, x) - truth) / scale
    assert err.max() > 1000 * tc.CHECK_TOL


def test_x_splits_into_three_bfloat16_parts_that_sum_back() -> None:
    import mlx.core as mx

    x = np.random.default_rng(4).normal(0, 10, 4096).astype(np.float32)
    x[:4] = [0.0, 1e-30, -3.5e5, 1.0 + 2.0**-20]
    hi, mid, lo = tc.split_bf16(x)
    # hi is bfloat16 round-to-nearest-even, as MLX's (and __float2bfloat16_rn) makes it
    assert np.array_equal(hi, np.asarray(mx.array(x).astype(mx.bfloat16).astype(mx.float32)))
    for part in (hi, mid, lo):  # each a bfloat16: its low 16 bits zero
        assert not (part.view(np.uint32) & 0xFFFF).any()
    back = hi.astype(np.float64) + mid + lo
    assert (np.abs(back - x) <= 2.0**-24 * np.abs(x)).all()


@pytest.mark.parametrize(
    "rows, cols, units, word",
    [
        (24, 128, 1, "rows"),
        (0, 128, 1, "rows"),
        (32, 96, 1, "cols"),
        (32, 7744, 1, "cols"),
        (32, 128, 3, "units"),
        (32, 128, 0, "units"),
    ],
)
def test_shapes_the_kernel_cannot_take_are_refused_by_name(rows, cols, units, word) -> None:
    with pytest.raises(ValueError, match=f"^{word} must"):
        tc.check_shape(rows, cols, units)


def test_without_cuda_it_says_so(capsys) -> None:
    import mlx.core as mx

    if mx.cuda.is_available():
        pytest.skip("MLX's CUDA backend is here")
    assert tc.main(["--rows", "32", "--cols", "128", "--units", "1", "--no-record"]) == 2
    assert "CUDA backend is not available" in capsys.readouterr().out


def test_a_bad_option_is_a_usage_error_naming_it(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        tc.main(["--cols", "100"])
    assert done.value.code == 2 and "cols must be a multiple of 64" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
@pytest.mark.parametrize("subnormal", [False, True])
def test_the_kernel_compiles_for_the_h200_without_spills(tmp_path, subnormal) -> None:
    """The body in the signature MLX gives it, at the default shape: nvcc compiles it for
    sm_90, ptxas spills nothing, and the machine code has the MMAs (4 a group); the
    float16 scheme has no packed subtract (HADD2) left."""
    from bench.common import sass as machine_code

    cuobjdump = machine_code.find_tool("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump is not installed here")
    sub = "true" if subnormal else "false"
    report, sass = machine_code.compile_sass(
        tc.HEADER + "\ntemplate <int K, int R, int NT, int UG, bool SUB>\n__global__ void rowdot("
        "const unsigned int* w, const __nv_bfloat16* s, const __nv_bfloat16* b, const float* x, float* y) {\n"
        + tc.SOURCE
        + f"}}\ntemplate __global__ void rowdot<5120, 34816, 256, 4, {sub}>(const unsigned int*, "
        "const __nv_bfloat16*, const __nv_bfloat16*, const float*, float*);\n",
        tmp_path,
        "rowdot",
        nvcc="nvcc",
        cuobjdump=cuobjdump,
    )
    assert "0 bytes spill stores" in report
    mma = "HMMA.16816.F32" if subnormal else "HMMA.16816.F32.BF16"
    assert sum(mma + " " in line for line in sass.splitlines()) == 4 * 4  # four MMAs a group, four groups a batch
    (unit_loop,) = [
        i for lp in machine_code.outer_loop_counts(sass) for i in lp["inner"] if "HMMA" in i["opcodes"]
    ]  # the batch of groups (the prologue's loops have none)
    assert unit_loop["opcodes"].get("HMMA") == 4 * 4
    assert ("HADD2" in unit_loop["opcodes"]) != subnormal  # the packed subtract of 128, bf16 only


@pytest.mark.parametrize("name", ["tensor_core_rowdot", "async_copy_rowdot"])
def test_an_experiment_runs_as_python_m_experiments_and_records_to_data_bench(name) -> None:
    """``python -m experiments.NAME --help`` from the project's root names that command, and
    the record still goes to the project's data/bench/ (where the readers look)."""
    import subprocess
    import sys
    from pathlib import Path

    from bench.common import record

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-m", f"experiments.{name}", "--help"], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m experiments.{name} ")
    assert f"{name}-<device>-<UTC time>.json" in done.stdout
    assert tc.parser(name, "doc").parse_args([]).out_dir == record.RECORD_DIR == root / "data" / "bench"


def test_the_record_names_the_experiments_command(tmp_path, monkeypatch) -> None:
    """run_and_record's record says how it was run: ``python -m experiments.NAME ...``."""
    import argparse
    import json

    import mlx.core as mx

    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    res = {
        "shape": [16, 64],
        "units": 1,
        "threads": 32,
        "blocks": 1,
        "chain": 1,
        "repeats": 1,
        "seed": 0,
        "weight_bytes": 1,
        "copy_bandwidth_Bps": {"used_for_floor": 1e12},
        "floor_ms": 1e-9,
        "check_tol": tc.CHECK_TOL,
        "variants": {},
        "all_checks_passed": True,
    }
    a = argparse.Namespace(no_record=False, out_dir=tmp_path, force=False)
    assert tc.run_and_record("tensor_core_rowdot", "what", ["--rows", "16"], a, "mma.sync", lambda: res) == 0
    (path,) = tmp_path.glob("tensor_core_rowdot-*.json")
    rec = json.loads(path.read_text())
    assert (
        rec["command"] == "python -m experiments.tensor_core_rowdot --rows 16" and rec["bench"] == "tensor_core_rowdot"
    )
