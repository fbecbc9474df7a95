"""experiments.async_copy_rowdot without a GPU: the warps' steps and lanes' units in numpy against
the exact map, the padded x layout's banks, the shape rules, and the kernel text through
nvcc where it is installed."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from experiments import async_copy_rowdot as ac


def _random(rows: int, cols: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (rows, cols))
    scales = rng.uniform(-0.05, 0.05, (rows, cols // 64))
    biases = rng.uniform(-0.3, 0.3, (rows, cols // 64))
    x = rng.uniform(-1, 1, cols).astype(np.float32)
    return codes, scales, biases, x


def _exact(codes, scales, biases, x) -> tuple[np.ndarray, np.ndarray]:
    w = np.repeat(scales, 64, axis=1) * codes + np.repeat(biases, 64, axis=1)
    return w @ x.astype(np.float64), np.abs(w) @ np.abs(x.astype(np.float64))


@pytest.mark.parametrize(
    "rows, cols, warps, seed", [(5, 1024, 2, 0), (7, 2048, 3, 1), (3, 1024, 8, 2), (4, 3072, 4, 3)]
)
def test_every_code_meets_its_own_x_scale_and_bias_once(rows, cols, warps, seed) -> None:
    """The model of the warps' rows, the steps' slots and the lanes' units gives the exact
    map: any number of warps, rows not a multiple of them, more warps than rows."""
    codes, scales, biases, x = _random(rows, cols, seed)
    truth, scale = _exact(codes, scales, biases, x)
    assert (np.abs(ac.step_model(codes, scales, biases, x, warps) - truth) / scale).max() < 1e-12


def test_a_code_at_the_wrong_k_is_far_outside_the_check() -> None:
    from experiments import tensor_core_rowdot as tc

    codes, scales, biases, x = _random(4, 1024, 5)
    truth, scale = _exact(codes, scales, biases, x)
    err = np.abs(ac.step_model(np.roll(codes, 1, axis=1), scales, biases, x, 2) - truth) / scale
    assert err.max() > 1000 * tc.CHECK_TOL


def test_eight_lanes_reading_their_units_x_hit_eight_bank_groups() -> None:
    """The padding's point: a 16-byte read (LDS.128) is served a quarter warp (8 lanes) at
    a time; lanes of consecutive units reading chunk c of their x land in 8 different
    16-byte bank groups (of the 8 that 32 4-byte banks make), so no read waits on another."""
    for first in range(0, 64, 8):
        for chunk in range(8):
            addresses = [(first + lane) * ac.X_PITCH * 4 + 16 * chunk for lane in range(8)]
            assert len({(a // 16) % 8 for a in addresses}) == 8
    # without the padding they would all share one
    assert len({((lane * 32 * 4) // 16) % 8 for lane in range(8)}) == 1


def test_the_default_shape_fits_static_group_memory() -> None:
    for stages in (4, 8):
        ac.check_shape(2 * 17408, 5120, 128, stages)
    assert ac.shared_bytes(5120, 128, 8) == 160 * 36 * 4 + 160 * 4 + 4 * 8 * 36 * 16


@pytest.mark.parametrize(
    "rows, cols, threads, stages, word",
    [
        (0, 1024, 128, 4, "rows"),
        (8, 1000, 128, 4, "cols"),
        (8, 512, 128, 4, "cols"),
        (8, 1024, 100, 4, "threads"),
        (8, 1024, 2048, 4, "threads"),
        (8, 1024, 128, 1, "stages"),
        (8, 5120, 1024, 8, "stages"),
    ],
)
def test_shapes_the_kernel_cannot_take_are_refused_by_name(rows, cols, threads, stages, word) -> None:
    with pytest.raises(ValueError, match=f"^{word}"):
        ac.check_shape(rows, cols, threads, stages)


def test_without_cuda_it_says_so(capsys) -> None:
    import mlx.core as mx

    if mx.cuda.is_available():
        pytest.skip("MLX's CUDA backend is here")
    assert ac.main(["--rows", "32", "--cols", "1024", "--no-record"]) == 2
    assert "CUDA backend is not available" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--cols", "1000"], "cols must be a positive multiple of 1024"),
        (["--stages", "4,x"], "--stages must be a comma list"),
        (["--stages", "1"], "stages must be an integer >= 2"),
        (["--chain", "0"], "--chain must be >= 1"),
    ],
)
def test_a_bad_option_is_a_usage_error_naming_it(capsys, argv, words) -> None:
    with pytest.raises(SystemExit) as done:
        ac.main(argv)
    assert done.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
@pytest.mark.parametrize("stages", [4, 8])
def test_the_kernel_compiles_for_the_h200_without_spills(tmp_path, stages) -> None:
    """The body in the signature MLX gives it, at the default shape: nvcc compiles it for
    sm_90, ptxas spills nothing, and the row loop copies its weights asynchronously
    (LDGSTS, with its commits and waits: LDGDEPBAR, DEPBAR) and loads none to registers."""
    from bench.common import sass as machine_code

    cuobjdump = machine_code.find_tool("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump is not installed here")
    report, sass = machine_code.compile_sass(
        "#include <cuda_bf16.h>\n" + ac.HEADER + "\ntemplate <int K, int R, int NT, int ST>\n"
        "__global__ void rowdot(const unsigned int* w, const __nv_bfloat16* s, const __nv_bfloat16* b, "
        "const float* x, float* y) {\n" + ac.SOURCE + f"}}\ntemplate __global__ void rowdot<5120, 34816, "
        f"128, {stages}>(const unsigned int*, const __nv_bfloat16*, const __nv_bfloat16*, const float*, float*);\n",
        tmp_path,
        "rowdot",
        nvcc="nvcc",
        cuobjdump=cuobjdump,
    )
    assert "0 bytes spill stores" in report
    (row_loop,) = [
        lp for lp in machine_code.outer_loop_counts(sass) if "LDGSTS" in lp["opcodes"] and "FFMA" in lp["opcodes"]
    ]
    ops = row_loop["opcodes"]
    assert ops["LDGSTS"] >= 2 and "LDGDEPBAR" in ops and "DEPBAR" in ops
    assert "LDG" not in ops  # no weight passes through a register on its way in
