"""The workbench's side of a check, a block of cases at a time: the stored weights, the
float64 truth and the graph reference of up to ``CASE_BLOCK`` seeds in one call each.

The user's implementation runs one case a call (one weight set a call is what a kernel
takes), but built case by case the truth and the reference cost several times a small numpy
tail. Here they are computed for a block at once, with the SAME bits as the per-case path
(``tests/test_check_blocks.py`` holds it, case by case): the stored weights follow
``TailWeights.from_arrays``' order (round to the dtype; fold ``wo`` in float64 from the rounded
weights, store the fold as float32 then the dtype; quantize last); the truth is ``tail_np``'s
five ops in float64 with every product as ``x @ W^T`` with the input scales as the rows
(numpy's stacked ``matmul`` runs the per-case BLAS product, where a batched matrix-vector form
would sum in another order); the reference is ``tail_mx`` on the batch, evaluated once (MLX
gives each case the bits of its own evaluation); a fold's per-case signs are applied to the
activations first (exact), then the shared block transform, as ``HadamardFold.rotate`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from workbench.check.faults import faulty_block
from workbench.check.graph_stage import GraphStage
from workbench.check.stored import StoredCase, StoredMatrix
from workbench.fold import hadamard
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.fold.weights import DENSE_DTYPES, QuantizedBase, QuantSpec, WeightMatrix
from workbench.studies.cases import CaseArrays, fold_for_case
from workbench.tail.ops import rms_norm_np, silu_np, tail_mx

MATRICES = ("wo", "gate", "up", "down")


@dataclass
class StoredBlock:
    """A block's weights as one configuration stores them, per matrix: ``f32`` (the dense
    float32 a ``StoredMatrix`` hands over, [S, out, in]; for dense float32 the draw itself,
    not a copy: the same bits), ``graph`` (what ``tail_mx`` reads: an mx array or a batched
    quantized ``WeightMatrix``), and for quantized matrices ``codes`` / ``scales`` / ``biases``
    as numpy. The truth's float64 is made one case and one matrix at a time (:func:`truth`),
    never held for the block: at a shipped shape it was most of the block's memory."""

    c: CaseArrays
    dtype: str
    fold: Any
    spec: QuantSpec | None
    eps: float
    f32: dict[str, np.ndarray]
    graph: dict[str, Any]
    quant: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]

    @property
    def size(self) -> int:
        return len(self.c.seeds)


def stored_block(c: CaseArrays, *, dtype: str, fold: Any, spec: QuantSpec | None, eps: float) -> StoredBlock:
    """What ``case_row_weights`` stores for every row of ``c``, as one batch.

    ``fold``: ``None`` or an int block (each case its own signs, site INPUT, as
    :func:`workbench.studies.cases.fold_for_case` makes it)."""
    if fold is not None and (isinstance(fold, HadamardFold) or isinstance(fold, bool) or not isinstance(fold, int)):
        raise ValueError(f"fold: the batched check takes None or a block size, got {fold!r}")
    dt = DENSE_DTYPES[dtype]
    drawn = {k: getattr(c, k) for k in MATRICES}
    if fold is not None:  # wo rounded to the dtype, as float64 (exact) times the signs, transformed, as float32
        wo = drawn["wo"] if dtype == "float32" else np.array(mx.array(drawn["wo"]).astype(dt).astype(mx.float32))
        w64 = wo.astype(np.float64) * c.signs[:, None, :].astype(np.float64)
        drawn["wo"] = hadamard.block_transform(w64, int(fold)).astype(np.float32)
        del w64, wo
    f32, graph, quant = {}, {}, {}
    for k, w in drawn.items():
        if spec is None:
            # Dense weights keep no MLX copy of the block: the reference makes one case's
            # matrices at a time from ``f32`` (:func:`reference`), memory MLX's allocator hands
            # back case after case, where a block's copy was memory touched for the first time
            # (on this machine's VM most of a shipped shape's check).
            f32[k] = w if dtype == "float32" else _rounded(w, dt)
            continue
        m = mx.array(w).astype(dt)
        parts = mx.quantize(m, **spec.as_quantize())
        biases = parts[2] if len(parts) > 2 else None
        qb = QuantizedBase(parts[0], parts[1], biases, spec, (int(m.shape[1]), int(m.shape[2])))
        f32[k] = np.array(qb.dequantize().astype(mx.float32))
        graph[k] = WeightMatrix(qb)
        quant[k] = (
            np.array(qb.w),
            np.array(qb.scales.astype(mx.float32)) if qb.scales.dtype != mx.uint8 else np.array(qb.scales),
            None if biases is None else np.array(biases.astype(mx.float32)),
        )
    return StoredBlock(c, dtype, fold, spec, float(eps), f32, graph, quant)


def _rounded(w: np.ndarray, dt: Any) -> np.ndarray:
    """``w`` [S, out, in] rounded to the MLX dtype ``dt`` and handed back as float32 holding its
    values (exact), one case at a time (MLX's rounding: the bits the stored weights have)."""
    out = np.empty(w.shape, dtype=np.float32)
    for i in range(len(w)):
        out[i] = np.array(mx.array(w[i]).astype(dt).astype(mx.float32))
    return out


def _dense_graph(st: StoredBlock, k: str, i: int, stage: GraphStage | None) -> mx.array:
    """Dense matrix ``k`` of case ``i`` as the graph tail reads it: the stored dtype's values
    (``f32`` holds them exactly, so converting back is exact); through ``stage`` where given."""
    w = st.f32[k][i]
    if st.dtype == "float32":
        return mx.array(w) if stage is None else stage.load(k, w)
    if st.dtype == "float16":  # exact: w holds float16 values
        return mx.array(w.astype(np.float16)) if stage is None else stage.load(k, w.astype(np.float16))
    return mx.array(w).astype(DENSE_DTYPES[st.dtype])


def _signed(st: StoredBlock, x: np.ndarray) -> np.ndarray:
    """``x`` [S, n, branch] with each case's fold signs applied (D x; exact)."""
    return x * st.c.signs[:, None, :].astype(x.dtype) if st.fold is not None else x


def truth(st: StoredBlock, branch: np.ndarray, residual: np.ndarray, scratch: dict | None = None) -> np.ndarray:
    """float64 truth [S, n, hidden] of each case at each of its ``n`` input rows.

    One case at a time, each matrix made float64 only while its product runs: the same BLAS
    call on the same operands as the block's stacked ``matmul`` made (numpy runs a stack as
    one 2-D product a case), holding one case's matrix in float64 instead of the block's four.
    ``scratch``: a dict kept from block to block, where that float64 buffer is kept (a new one
    a block is memory touched the first time: at (2048, 2048, 8192) 134 MB, about 0.3 s on this
    project's VM); one truth at a time may use it."""
    x_all = _signed(st, branch.astype(np.float64))
    if st.fold is not None:
        x_all = hadamard.block_transform(x_all, int(st.fold))
    w = st.f32
    out = np.empty((st.size, branch.shape[1], residual.shape[-1]), dtype=np.float64)
    # one float64 buffer, the size of the largest matrix, each matrix copied into its start
    # (float32 to float64 is exact): memory touched once a block, not once a matrix
    size = max(w[k][0].size for k in MATRICES)
    flat = None if scratch is None else scratch.get("float64")
    if flat is None or flat.size < size:
        flat = np.empty(size, dtype=np.float64)
        if scratch is not None:
            scratch["float64"] = flat

    def mv(k: str, i: int, v: np.ndarray) -> np.ndarray:
        m = flat[: w[k][i].size].reshape(w[k][i].shape)
        np.copyto(m, w[k][i])
        return np.matmul(v, m.T)

    for i in range(st.size):
        h = residual[i].astype(np.float64) + mv("wo", i, x_all[i])
        normed = rms_norm_np(h, st.c.ffn_norm[i][None, :].astype(np.float64), st.eps)
        out[i] = h + mv("down", i, silu_np(mv("gate", i, normed)) * mv("up", i, normed))
    return out


def reference(st: StoredBlock, branch: np.ndarray, residual: np.ndarray, stage: GraphStage | None = None) -> np.ndarray:
    """The workbench's graph tail (``tail_mx``) on the block, evaluated once ON THE CPU:
    float32 [S, n, hidden].

    Always the CPU, whatever MLX's default device: the verdict compares the implementation's
    errors with these, and its thresholds were calibrated against the CPU's. On a GPU the
    same graph sums in another order and comes out more accurate, so a correct kernel
    emulated on the host would be judged worse than the reference there and not on a CPU.
    Pinned, a verdict is the same on every machine.

    Dense weights run one case a graph, each matrix 2-D (``x @ W^T`` of the case's input
    rows): the batched form broadcast each case's weights over its input scales, which MLX's
    CPU made into a copy a scale (12 bytes a weight float at three scales, a 2048-wide block
    of 7 cases at 7.9 GiB) and ran at about 1 GB/s. The bits are the per-case path's either
    way (``tests/test_check_blocks.py``). ``stage``: where the dense weights are written for
    MLX (:class:`~workbench.check.graph_stage.GraphStage`; without one, a copy a case)."""
    fold = None if st.fold is None else HadamardFold(int(st.fold))
    g = st.graph
    if st.spec is None:
        xs = _signed(st, branch.astype(np.float32))
        rs = residual.astype(np.float32)
        outs = []
        with mx.stream(mx.cpu):
            for i in range(st.size):
                one = tail_mx(
                    _dense_graph(st, "wo", i, stage),
                    fold,
                    mx.array(st.c.ffn_norm[i]),
                    _dense_graph(st, "gate", i, stage),
                    _dense_graph(st, "up", i, stage),
                    _dense_graph(st, "down", i, stage),
                    st.eps,
                    mx.array(xs[i]),
                    mx.array(rs[i]),
                )
                mx.eval(one)
                outs.append(np.array(one))
        return np.stack(outs)
    with mx.stream(mx.cpu):
        x = mx.array(_signed(st, branch.astype(np.float32)))
        out = tail_mx(
            g["wo"],
            fold,
            mx.array(st.c.ffn_norm[:, None, :]),
            g["gate"],
            g["up"],
            g["down"],
            st.eps,
            x,
            mx.array(residual.astype(np.float32)),
        )
        mx.eval(out)
    return np.array(out)


def _matrix(st: StoredBlock, k: str, i: int) -> StoredMatrix:
    dense = st.f32[k][i]
    if st.spec is None:
        values = dense.astype(np.float16) if st.dtype == "float16" else dense
        return StoredMatrix(shape=dense.shape, dtype=st.dtype, values=values)
    codes, scales, biases = st.quant[k]
    s = st.spec
    return StoredMatrix(
        shape=dense.shape,
        dtype=str(s),
        codes=codes[i],
        scales=scales[i],
        biases=None if biases is None else biases[i],
        mode=s.mode,
        bits=s.bits,
        group_size=s.group_size,
        _dense=dense,
    )


def case(st: StoredBlock, i: int, branch: np.ndarray, residual: np.ndarray, name: str) -> StoredCase:
    """Row ``i`` of the block as the implementation under test receives it (what
    ``stored_case`` gives for that case's ``TailWeights``)."""
    fold = fold_for_case(st.fold, st.c.signs[i])
    if fold is not None and fold.site is not FoldSite.INPUT:  # pragma: no cover -- fold_for_case folds at INPUT
        raise ValueError("fold: the batched check folds wo at its input")
    return StoredCase(
        case=name,
        wo=_matrix(st, "wo", i),
        gate=_matrix(st, "gate", i),
        up=_matrix(st, "up", i),
        down=_matrix(st, "down", i),
        ffn_norm=st.c.ffn_norm[i],
        eps=st.eps,
        fold=fold,
        branch=np.asarray(branch, dtype=np.float32),
        residual=np.asarray(residual, dtype=np.float32),
    )


def faulty(st: StoredBlock, branch: np.ndarray, residual: np.ndarray, fault: str) -> np.ndarray:
    """A fault model (:func:`workbench.check.faults.faulty_block`) on every case of the block:
    float32 [S, n, hidden], each case the bits ``faulty_tail`` gives it alone.

    ``float16_accumulation`` runs one case a call: its products and running sums are float16
    arrays [n, out, in] a matrix, and a block's worth at a shipped shape is gigabytes
    (:mod:`workbench.check.budget` counts one case's)."""
    if fault == "float16_accumulation" and st.size > 1:
        return np.concatenate(
            [faulty(_row(st, i), branch[i : i + 1], residual[i : i + 1], fault) for i in range(st.size)]
        )
    bias = None
    if st.spec is not None and st.quant["wo"][2] is not None:
        bias = st.quant["wo"][2][:, 0, 0]
    return faulty_block(
        st.f32["wo"],
        st.f32["gate"],
        st.f32["up"],
        st.f32["down"],
        st.c.ffn_norm,
        st.eps,
        branch,
        residual,
        fault,
        fold_block=None if st.fold is None else int(st.fold),
        signs=st.c.signs,
        group_size=None if st.spec is None else st.spec.group_size,
        wo_bias=bias,
    )


def _row(st: StoredBlock, i: int) -> StoredBlock:
    """Case ``i`` of the block as a block of one (views, no copies)."""
    sl = slice(i, i + 1)
    quant = {k: (q[0][sl], q[1][sl], None if q[2] is None else q[2][sl]) for k, q in st.quant.items()}
    return StoredBlock(
        st.c.rows(sl), st.dtype, st.fold, st.spec, st.eps, {k: v[sl] for k, v in st.f32.items()}, {}, quant
    )
