"""sweep: the batched sweep held to host_tail / fused_tail case by case, reproducibility, bad input."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench import tail
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.studies import cases as sweep_cases
from workbench.studies import sweeps
from workbench.tail import comparison, frink_case

SEED_SHAPE = frink_case.SEED_SHAPE  # (64, 96, 80)
QSHAPE = (64, 128, 128)  # every in-dimension a multiple of 64, so every format quantizes


# ---------------------------------------------------------------------------------------
# the batched sweep is tail.host_tail / tail.fused_tail, case by case
# ---------------------------------------------------------------------------------------

CONFIGS = [
    ("float32", None, None, 0),
    ("float32", 16, None, 0),
    ("bfloat16", 16, None, 0),
    ("float16", None, None, 0),
    ("float32", 16, "affine4", 4),
    ("float32", None, "nvfp4", 0),
    ("float32", 16, "mxfp4", 0),
    ("float32", 32, "affine8", 0),
    ("float32", HadamardFold(16, None, None, FoldSite.OUTPUT), None, 0),
]


@pytest.mark.parametrize("dtype,fold,quant,outliers", CONFIGS)
def test_batched_rows_are_host_tail_and_fused_tail(dtype, fold, quant, outliers) -> None:
    shape = QSHAPE if quant is not None else SEED_SHAPE
    seeds = [3, 300, 1000]
    df = sweeps.sweep(
        shapes=[shape],
        seeds=seeds,
        dtypes=(dtype,),
        folds=(fold,),
        quantize=(quant,),
        wo_outliers=outliers,
        progress=False,
    )
    assert list(df.seed) == seeds
    for i, s in enumerate(seeds):
        w, b, r = sweep_cases.case_weights(shape, s, dtype=dtype, fold=fold, quantize=quant, wo_outliers=outliers)
        truth = tail.host_tail(w, b, r)
        fused = tail.fused_tail(w, b, r, backend="graph")
        # the batched graph evaluates the same tail_mx: the same error, to float32 rounding. On a
        # GPU a batch's products are matrix products and one case's vector products, which round
        # apart (worst 6.1e-7 against 3.2e-7 on an H200): there both are held to a few float32 ulps.
        on_cpu = mx.default_device().type == mx.cpu
        worst_abs, nmse_abs = (2e-7, 1e-14) if on_cpu else (1e-6, 5e-14)
        assert df.worst[i] == pytest.approx(comparison.worst_scaled_error(fused, truth)[()], rel=0.5, abs=worst_abs)
        assert df.nmse[i] == pytest.approx(comparison.nmse(fused, truth)[()], rel=0.6, abs=nmse_abs)


@pytest.mark.parametrize("dtype,fold,quant,outliers", [CONFIGS[i] for i in (0, 1, 2, 4, 8)])
def test_batched_rows_are_the_per_case_tails_bit_for_bit(dtype, fold, quant, outliers) -> None:
    """The batched graph's rows ARE fused_tail's outputs, and the batched truth's rows ARE
    host_tail's, bit for bit: the batched layout (rows times the weights' transpose) and the
    bulk draws change no bit of any case."""
    shape = QSHAPE if quant is not None else SEED_SHAPE
    seeds = [3, 300, 1000]
    c = sweep_cases.case_arrays(shape, seeds, wo_outliers=outliers)
    _, spec = sweep_cases.quant_spec(quant)
    st_ = sweeps._store(c, dtype, fold, spec)
    graph = sweeps._graph(st_, c, fold, frink_case.SEED_EPS, None)
    truth = sweeps._truth(st_, c, fold, frink_case.SEED_EPS)
    for i, s in enumerate(seeds):
        w, b, r = sweep_cases.case_weights(shape, s, dtype=dtype, fold=fold, quantize=quant, wo_outliers=outliers)
        # the rows equal a case's own graph, bit for bit on MLX's CPU; on a GPU a batch is a
        # matrix product where one case is a vector product, so it rounds apart there
        on_cpu = mx.default_device().type == mx.cpu
        want = tail.fused_tail(w, b, r, backend="graph")
        if on_cpu:
            np.testing.assert_array_equal(graph[i], want)
        else:
            assert comparison.compare(graph[i], want, tol=1e-5).passed
        np.testing.assert_array_equal(truth[i], tail.host_tail(w, b, r))


def test_batched_truth_is_host_tail_bit_for_bit_on_weights() -> None:
    """The stored weights the sweep builds are exactly those TailWeights.from_arrays stores."""
    for dtype, fold, quant, shape in [("bfloat16", 16, None, SEED_SHAPE), ("float32", 16, "affine4", QSHAPE)]:
        c = sweep_cases.case_arrays(shape, [7, 8])
        _, spec = sweep_cases.quant_spec(quant)
        st_ = sweeps._store(c, dtype, fold, spec)
        for i, s in enumerate([7, 8]):
            w, _, _ = sweep_cases.case_weights(shape, s, dtype=dtype, fold=fold, quantize=quant)
            if quant is None:
                np.testing.assert_array_equal(st_.np64[0][i], w.wo.dense(np.float64))
            else:
                np.testing.assert_array_equal(np.asarray(st_.graph[0]._base.w[i]), np.asarray(w.wo._base.w))


def test_half_precision_affine_truth_is_the_kernels_map() -> None:
    """For bf16 affine weights the sweep's truth is scale*q + bias unrounded (what
    mx.quantized_matmul computes); WeightMatrix.dense rounds it to bf16 (weights.py), so
    host_tail is ~1e-2 off the fused tail there. The sweep must not inherit that."""
    df = sweeps.sweep(shapes=[QSHAPE], seeds=range(16), dtypes=("bfloat16",), quantize=("affine4",), progress=False)
    assert df.worst.max() < 1e-5


def test_seed_case_shape_and_the_seed_tolerance() -> None:
    df = sweeps.sweep(shapes=[SEED_SHAPE], seeds=range(512), folds=(None, 16), progress=False)
    assert len(df) == 1024
    assert (df.worst < frink_case.SEED_TOL).all()
    assert (df.ulp_max >= 0).all()
    # float32 weights, unfolded: the two truths are the same truth
    plain = df[df.fold == "none"]
    np.testing.assert_array_equal(plain.worst, plain.model_worst)


# ---------------------------------------------------------------------------------------
# reproducibility
# ---------------------------------------------------------------------------------------


def test_a_case_depends_only_on_its_seed() -> None:
    a = sweeps.sweep(shapes=[SEED_SHAPE], seeds=range(250, 270), folds=(16,), progress=False)
    b = sweeps.sweep(shapes=[SEED_SHAPE], seeds=[255, 260, 265], folds=(16,), progress=False)
    again = sweeps.sweep(shapes=[SEED_SHAPE], seeds=range(250, 270), folds=(16,), progress=False)
    import pandas as pd

    pd.testing.assert_frame_equal(a, again)  # bit for bit, run to run
    sub = a.set_index("seed").loc[[255, 260, 265]]
    np.testing.assert_array_equal(sub.worst.to_numpy(), b.worst.to_numpy())
    np.testing.assert_array_equal(sub.nmse.to_numpy(), b.nmse.to_numpy())


def test_sweep_rows_and_columns() -> None:
    df = sweeps.sweep(
        shapes=[SEED_SHAPE, (32, 64, 48)],
        seeds=range(5),
        dtypes=("float32", "bfloat16"),
        folds=(None, 16),
        progress=False,
    )
    assert len(df) == 2 * 5 * 2 * 2
    for col in (
        "hidden",
        "branch",
        "ffn",
        "wo_outliers",
        "dtype",
        "fold",
        "quant",
        "backend",
        "seed",
        "worst",
        "max_abs",
        "max_rel",
        "nmse",
        "torch_ratio",
        "ulp_max",
        "ulp_mean",
        "model_worst",
        "model_nmse",
    ):
        assert col in df.columns
    assert set(df.fold) == {"none", "b16"}
    # tidy order: shape, then configuration as given (dtype x fold), then seed
    first = df[(df.hidden == 64)]
    assert list(first.dtype.astype(str)[::5]) == ["float32", "float32", "bfloat16", "bfloat16"]
    assert list(first.fold.astype(str)[::5]) == ["none", "b16", "none", "b16"]
    assert list(first.seed[:5]) == [0, 1, 2, 3, 4]
    assert list(df.hidden[:20].unique()) == [64]


def test_rows_in_order_whatever_the_blocks() -> None:
    df = sweeps.sweep(shapes=[SEED_SHAPE], seeds=[1000, 0, 300], folds=(None, 16), progress=False)
    assert list(df.seed) == [0, 300, 1000, 0, 300, 1000]
    assert list(df.fold.astype(str)) == ["none"] * 3 + ["b16"] * 3


def test_sweep_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="dtypes"):
        sweeps.sweep(shapes=[SEED_SHAPE], seeds=range(3), dtypes=("float8",))
    with pytest.raises(ValueError, match="shapes"):
        sweeps.sweep(shapes=[(64, 96)], seeds=range(3))
    with pytest.raises(ValueError, match="seeds"):
        sweeps.sweep(shapes=[SEED_SHAPE], seeds=[-1])
    with pytest.raises(ValueError, match="block"):
        sweeps.sweep(shapes=[SEED_SHAPE], seeds=range(3), folds=(36,))
    with pytest.raises(ValueError, match="group_size"):
        sweeps.sweep(shapes=[SEED_SHAPE], seeds=range(3), quantize=("affine4",))
    with pytest.raises(ValueError, match="quantize"):
        sweeps.sweep(shapes=[SEED_SHAPE], seeds=range(3), quantize=("int3",))
    with pytest.raises(ValueError, match="backend"):
        sweeps.sweep(shapes=[SEED_SHAPE], seeds=range(3), backends=("opencl",))
    with pytest.raises(ValueError, match="wo_outliers"):
        sweeps.sweep(shapes=[SEED_SHAPE], seeds=range(3), wo_outliers=-1)


def test_absent_kernel_backend_raises() -> None:
    from workbench import backends

    absent = [b for b in ("metal", "cuda") if b not in backends.available_backends()]
    if not absent:
        pytest.skip("both kernel backends are present here")
    with pytest.raises(backends.BackendUnavailable):
        sweeps.sweep(shapes=[SEED_SHAPE], seeds=range(3), backends=(absent[0],))
