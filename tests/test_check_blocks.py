"""The check's batched truth, graph reference and stored cases are the per-case path's bits:
``host_tail`` / ``fused_tail(backend="graph")`` / ``stored_case`` of each case's own
``TailWeights``, case by case, for every weight format the check sweeps."""

import mlx.core as mx
import numpy as np
import pytest

from workbench.check import blocks, check_kernel
from workbench.check.graph_stage import GraphStage
from workbench.check.stored import stored_case
from workbench.studies.cases import case_arrays, case_row_weights, quant_spec
from workbench.tail import fused_tail, host_tail
from workbench.tail.weights import DEFAULT_EPS

SCALES = np.array([0.01, 1.0, 100.0], dtype=np.float32)

CONFIGS = [
    ((64, 96, 80), "float32", 16, None),
    ((64, 96, 80), "float32", None, None),
    ((64, 96, 80), "bfloat16", 16, None),
    ((64, 96, 80), "float16", None, None),
    ((64, 128, 128), "float32", 16, "affine4"),
    ((64, 128, 128), "bfloat16", None, "affine8"),
    ((64, 128, 128), "float32", 32, "mxfp4"),
]


def _same_matrix(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype and a.quantized == b.quantized
    for k in ("values", "codes", "scales", "biases"):
        x, y = getattr(a, k), getattr(b, k)
        assert (x is None) == (y is None), k
        if x is not None:
            assert x.dtype == y.dtype, k
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.dense(), b.dense())


@pytest.mark.parametrize("shape,dtype,fold,quant", CONFIGS)
def test_the_block_is_the_per_case_path_bit_for_bit(shape, dtype, fold, quant):
    seeds = [5, 6, 300]
    c = case_arrays(shape, seeds)
    _, spec = quant_spec(quant)
    st = blocks.stored_block(c, dtype=dtype, fold=fold, spec=spec, eps=DEFAULT_EPS)
    B, R = c.branch[:, None, :] * SCALES[None, :, None], c.residual[:, None, :] * SCALES[None, :, None]
    truth, ref = blocks.truth(st, B, R), blocks.reference(st, B, R)
    for i in range(len(seeds)):
        w, _, _ = case_row_weights(c, i, dtype=dtype, fold=fold, spec=spec, eps=DEFAULT_EPS)
        np.testing.assert_array_equal(truth[i], host_tail(w, B[i], R[i]))
        with mx.stream(mx.cpu):  # the check's reference is MLX's CPU (check.blocks.reference)
            np.testing.assert_array_equal(ref[i], fused_tail(w, B[i], R[i], backend="graph"))
        got, want = blocks.case(st, i, B[i], R[i], "x"), stored_case(w, B[i], R[i], "x")
        for m in ("wo", "gate", "up", "down"):
            _same_matrix(getattr(got, m), getattr(want, m))
        np.testing.assert_array_equal(got.ffn_norm, want.ffn_norm)
        assert got.eps == want.eps and (got.fold is None) == (want.fold is None)
        if got.fold is not None:
            assert got.fold.same_rotation(want.fold) and got.fold.site == want.fold.site


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_reference_through_a_stage_is_the_copied_path_bit_for_bit(dtype):
    # a GraphStage writes each case's dense weights into MLX arrays it keeps (block after
    # block, in place); where a view would not share MLX's memory it copies: the same bits
    stage, copying = GraphStage(), GraphStage()
    copying.shares = False
    for seeds in ([5, 6], [300, 7]):
        c = case_arrays((64, 96, 80), seeds)
        st = blocks.stored_block(c, dtype=dtype, fold=16, spec=None, eps=DEFAULT_EPS)
        B, R = c.branch[:, None, :] * SCALES[None, :, None], c.residual[:, None, :] * SCALES[None, :, None]
        want = blocks.reference(st, B, R)
        for s in (stage, copying):
            np.testing.assert_array_equal(blocks.reference(st, B, R, s), want)
    assert stage.shares is (None if dtype == "bfloat16" else True) and copying.shares is False  # bfloat16: no view
    assert len(stage.held) == (4 if dtype != "bfloat16" else 0)  # one a weight, kept from block to block
    stage.clear()
    assert not stage.held


def test_a_check_does_not_depend_on_how_its_seeds_are_blocked():
    def tail(case):  # a float32 numpy tail (the implementation under test)
        x = case.fold.rotate(np.asarray(case.branch, np.float32)).astype(np.float32)
        h = case.residual + case.wo.dense() @ x
        n = h / np.sqrt(np.float32(np.dot(h, h) / h.size) + np.float32(case.eps)) * case.ffn_norm
        g, u = case.gate.dense() @ n, case.up.dense() @ n
        return h + case.down.dense() @ (g / (1 + np.exp(-g)) * u)

    together = check_kernel(tail, seeds=[1, 2, 257, 700], faults=("wrong_eps",))
    apart = [check_kernel(tail, seeds=[s], faults=("wrong_eps",)) for s in (1, 2, 257, 700)]
    for col in ("worst", "max_abs", "nmse", "ref_worst"):
        np.testing.assert_array_equal(
            together.cases[col].to_numpy(), np.concatenate([a.cases[col].to_numpy() for a in apart])
        )
    np.testing.assert_array_equal(
        together.faults.worst.to_numpy(), np.concatenate([a.faults.worst.to_numpy() for a in apart])
    )


def test_drawing_the_next_block_ahead_changes_no_bit():
    # blocks of three, each drawn on a thread while the one before is checked, against blocks
    # of one drawn in turn (a budget with no room for a second draw buffer)
    from workbench.check import budget as budget_mod
    from workbench.studies.cases import case_floats

    def tail(case):
        h = case.residual + case.wo.dense() @ np.asarray(case.branch, np.float32)
        n = h / np.sqrt(np.float32(np.dot(h, h) / h.size) + np.float32(case.eps)) * case.ffn_norm
        g, u = case.gate.dense() @ n, case.up.dense() @ n
        return h + case.down.dense() @ (g / (1 + np.exp(-g)) * u)

    shape = (64, 96, 80)
    per_case, first = budget_mod.case_bytes(shape)
    ahead = budget_mod.DRAW_BYTES_PER_FLOAT * case_floats(shape)
    roomy, tight = first + 2 * per_case + 3 * ahead, first + ahead - 1
    assert budget_mod.block_plan(shape, roomy) == (3, True)
    assert budget_mod.block_plan(shape, tight) == (1, False)
    args = {"shapes": [shape], "seeds": range(8), "folds": (None,), "faults": ("wrong_eps",)}
    ahead_run = check_kernel(tail, memory_budget=roomy, **args)
    in_turn = check_kernel(tail, memory_budget=tight, **args)
    for col in ("worst", "max_abs", "nmse", "ref_worst"):
        np.testing.assert_array_equal(ahead_run.cases[col].to_numpy(), in_turn.cases[col].to_numpy())
    np.testing.assert_array_equal(ahead_run.faults.worst.to_numpy(), in_turn.faults.worst.to_numpy())


def test_the_block_takes_block_sizes_only():
    c = case_arrays((64, 96, 80), [0])
    with pytest.raises(ValueError, match="fold"):
        blocks.stored_block(c, dtype="float32", fold=True, spec=None, eps=1e-6)


@pytest.mark.parametrize("shape,dtype,fold,quant", [CONFIGS[0], CONFIGS[1], CONFIGS[4], CONFIGS[6]])
def test_the_fault_models_on_a_block_are_each_cases_own(shape, dtype, fold, quant):
    from workbench.check import FAULTS, faulty_tail
    from workbench.check.faults import applies

    c = case_arrays(shape, [5, 300])
    _, spec = quant_spec(quant)
    st = blocks.stored_block(c, dtype=dtype, fold=fold, spec=spec, eps=DEFAULT_EPS)
    B, R = c.branch[:, None, :] * SCALES[None, :, None], c.residual[:, None, :] * SCALES[None, :, None]
    for f in (None, *FAULTS):
        cases = [blocks.case(st, i, B[i], R[i], "x") for i in range(2)]
        if f is not None and not applies(f, cases[0]):
            continue
        got = blocks.faulty(st, B, R, f)
        for i, sc in enumerate(cases):
            np.testing.assert_array_equal(got[i], faulty_tail(sc, f), err_msg=str(f))


@pytest.mark.parametrize("shape", [(64, 96, 80), (33, 17, 9)])  # the second: an odd count of floats a case
def test_the_reused_draw_is_draw_blocks_bits(shape):
    from workbench.check.draws import Draws
    from workbench.studies.cases import CaseArrays, draw_block

    d = Draws(shape, 5)
    for block, rows in ((0, [0, 1, 2, 3, 4]), (3, [7, 100, 255]), (0, [1, 2])):  # the buffer reused
        got, want = d.block(block, np.array(rows)), draw_block(shape, block, np.array(rows))
        for k in CaseArrays.__dataclass_fields__:
            a, b = getattr(got, k), getattr(want, k)
            assert a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes(), k
