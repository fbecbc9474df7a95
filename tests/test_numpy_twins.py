"""The plain numpy twins the benchmarks time the workbench against give the workbench's bits,
so a ratio between them compares the same work (``bench.common.numpy_twins``); and the CPU
floor is a copy that reaches the machine's rate (``bench.common.timing.copy_bandwidth``)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.common import numpy_twins, timing, twin_rates
from workbench import backends
from workbench.fold import hadamard
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.studies import cases, sweeps
from workbench.tail import frink_case
from workbench.tail.paths import host_tail
from workbench.tail.weights import TailWeights

SHAPE = frink_case.SEED_SHAPE


def _twin_of(w: TailWeights, branch: np.ndarray, residual: np.ndarray) -> np.ndarray:
    wo, norm, gate, up, down = w.host_arrays(np.float64)
    f = w.wo.fold
    return numpy_twins.host_tail(
        wo,
        f.signs.astype(np.float64),
        numpy_twins.orthonormal_t(f.block),
        norm,
        gate,
        up,
        down,
        w.eps,
        branch,
        residual,
    )


def test_the_host_tail_is_its_twin_bit_for_bit() -> None:
    """host_tail's checks and caches change no bit of the float64 oracle: the seed case, a
    batch of three rows (18 block rows, padded to 24) and a float64 input."""
    c = frink_case.seed_case()
    np.testing.assert_array_equal(host_tail(c.weights, c.branch, c.residual), _twin_of(c.weights, c.branch, c.residual))
    rng = np.random.default_rng(3)
    b, r = rng.uniform(-1, 1, (3, 96)), rng.uniform(-1, 1, (3, 64))
    np.testing.assert_array_equal(host_tail(c.weights, b, r), _twin_of(c.weights, b, r))


def test_the_fast_checks_refuse_what_the_full_checks_refuse() -> None:
    """The host tail's one-comparison path for numpy inputs lets nothing through that the
    full checks refuse: a wrong width, mismatched batches, an int array."""
    c = frink_case.seed_case()
    w, b, r = c.weights, c.branch, c.residual
    with pytest.raises(ValueError, match="branch: must have last axis 96"):
        host_tail(w, b[:80], r)
    with pytest.raises(ValueError, match="residual: must have last axis 64"):
        host_tail(w, b, r[:32])
    with pytest.raises(ValueError, match="branch/residual: must have the same leading"):
        host_tail(w, np.stack([b, b]), r)
    with pytest.raises(ValueError, match="branch: must be a float array"):
        host_tail(w, b.astype(np.int32), r)
    with pytest.raises(ValueError, match="dtype"):
        host_tail(w, b, r, dtype=np.int32)


def test_the_fold_and_the_block_transform_are_their_twins() -> None:
    """The float64 block transform as one product, and a fold's rotation (checked once,
    then by a few comparisons), give the twin's bits; a bad width is still refused."""
    x = np.random.default_rng(5).standard_normal((16, 6 * 64))
    np.testing.assert_array_equal(
        hadamard.block_transform(x, 64), numpy_twins.block_transform(x, numpy_twins.orthonormal_t(64))
    )
    np.testing.assert_array_equal(hadamard.block_transform(x, 64), hadamard.block_transform(x, np.int64(64)))
    fold = HadamardFold.random(96, 16, seed=2)
    y = x[:, :96]
    want = numpy_twins.block_transform(y * fold.signs.astype(np.float64), numpy_twins.orthonormal_t(16))
    np.testing.assert_array_equal(fold.rotate(y), want)
    np.testing.assert_allclose(fold.unrotate(fold.rotate(y)), y, rtol=0, atol=1e-13)  # R is orthogonal
    with pytest.raises(ValueError, match="x: its last axis must be a multiple of block"):
        hadamard.block_transform(x[:, :100], 64)
    with pytest.raises(ValueError, match="block"):
        hadamard.block_transform(x, 36)
    with pytest.raises(ValueError, match="width: must equal the fold's dimension 96"):
        fold.rotate(x[:, :112])
    out_fold = HadamardFold(16, None, None, FoldSite.OUTPUT)
    np.testing.assert_array_equal(out_fold.unrotate(y), numpy_twins.block_transform(y, numpy_twins.orthonormal_t(16).T))


def test_the_sweep_twin_draws_the_same_cases_and_truth() -> None:
    """The sweep's twin draws a block's cases and computes their float64 truth with the
    workbench's bits; only its float32 tail differs (numpy where the sweep runs MLX)."""
    c = cases.draw_block(SHAPE, 2)
    twin = numpy_twins.draw_cases(SHAPE, 2)
    for name, arr in twin.items():
        np.testing.assert_array_equal(getattr(c, name), arr)
    got = numpy_twins.sweep_block(SHAPE, 2, frink_case.SEED_EPS)
    np.testing.assert_array_equal(got["truth"], sweeps._model_truth(c, frink_case.SEED_EPS))
    assert (got["worst"] < frink_case.SEED_TOL).all() and got["worst"].shape == (cases.CASE_BLOCK,)


def test_the_cpu_copy_floor_is_numpys_copy() -> None:
    """On the CPU the floor is numpy's copyto, and the record states the method beside the figure."""
    floor = timing.copy_floor(1 << 22, repeats=2)
    assert set(floor) == {"bytes_per_s", "method", "nbytes", "repeats"} and floor["bytes_per_s"] > 0
    if backends.device_kind() == "cpu":
        assert floor["method"] == timing.COPY_METHODS["cpu"] and "numpy copyto" in floor["method"]
    with pytest.raises(ValueError, match="nbytes and repeats must be >= 1"):
        timing.copy_bandwidth(0)


def test_twin_rates_measure_every_path_small() -> None:
    """The table's rows at tiny sizes: every path beside its twin and a limit, same bits where claimed."""
    res = twin_rates.measure(1, transform_rows=8, copy_bytes=1 << 20, repeats=1, gemm_n=64, host_calls=2)
    paths = [r["path"] for r in res["rows"]]
    assert len(paths) == 5 and paths[0].startswith("host tail") and paths[1].startswith("sweep")
    for r in res["rows"]:
        assert r["workbench"] > 0 and r["twin"] > 0 and r["limit"] > 0 and r["ratio"] > 0
        assert r["same_bits"] in (None, True)


def test_the_bonsai_twin_is_the_workbench_truth_bit_for_bit() -> None:
    """The plain twin of notebook 03's Bonsai-27B path (its own draws, bf16 rounding and fold)
    gives the float64 truth of ``TailWeights.random(..., dtype="bfloat16", fold_block=...)``
    bit for bit, here at a small shape; its bf16 rounding is MLX's for finite values."""
    import mlx.core as mx

    from workbench.tail.weights import random_inputs

    shape, block = (128, 192, 160), 64
    w = TailWeights.random(*shape, seed=27, fold_block=block, dtype="bfloat16")
    br, res = random_inputs(w, seed=28)
    np.testing.assert_array_equal(numpy_twins.bonsai_truth(shape, block, 27, 28, w.eps), host_tail(w, br, res))
    x = np.random.default_rng(1).standard_normal(4096).astype(np.float32) * np.float32(1e3)
    want = np.asarray(mx.array(x).astype(mx.bfloat16).astype(mx.float32))
    np.testing.assert_array_equal(numpy_twins.bf16_round(x.copy()), want)


def test_sweep_rate_without_sweeps_runs_only_the_rows_asked_for() -> None:
    """``--no-sweeps`` (for ``--bonsai`` alone) times no sweep; ``--bonsai`` below 0 is a usage error."""
    from bench import sweep_rate

    rec = sweep_rate.main(["--no-sweeps", "--no-record"])
    assert rec["results"] == [] and "bonsai" not in rec and "twins" not in rec
    with pytest.raises(SystemExit):
        sweep_rate.main(["--no-sweeps", "--bonsai", "-1", "--no-record"])
