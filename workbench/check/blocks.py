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
    float32 a ``StoredMatrix`` hands over, [S, out, in]), ``np64`` (the truth's float64),
    ``graph`` (what ``tail_mx`` reads: an mx array or a batched quantized ``WeightMatrix``),
    and for quantized matrices ``codes`` / ``scales`` / ``biases`` as numpy."""

    c: CaseArrays
    dtype: str
    fold: Any
    spec: QuantSpec | None
    eps: float
    f32: dict[str, np.ndarray]
    np64: dict[str, np.ndarray]
    graph: dict[str, Any]
    quant: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]

    @property
    def size(self) -> int:
        return len(self.c.seeds)


def _np64(a: mx.array) -> np.ndarray:
    return np.asarray(a.astype(mx.float32)).astype(np.float64)


def stored_block(c: CaseArrays, *, dtype: str, fold: Any, spec: QuantSpec | None, eps: float) -> StoredBlock:
    """What ``case_row_weights`` stores for every row of ``c``, as one batch.

    ``fold``: ``None`` or an int block (each case its own signs, site INPUT, as
    :func:`workbench.studies.cases.fold_for_case` makes it)."""
    if fold is not None and (isinstance(fold, HadamardFold) or isinstance(fold, bool) or not isinstance(fold, int)):
        raise ValueError(f"fold: the batched check takes None or a block size, got {fold!r}")
    dt = DENSE_DTYPES[dtype]
    mats = {k: mx.array(getattr(c, k)).astype(dt) for k in MATRICES}
    if fold is not None:
        w64 = _np64(mats["wo"]) * c.signs[:, None, :].astype(np.float64)
        mats["wo"] = mx.array(hadamard.block_transform(w64, int(fold)).astype(np.float32)).astype(dt)
    f32, np64, graph, quant = {}, {}, {}, {}
    for k, m in mats.items():
        if spec is None:
            f32[k] = np.array(m.astype(mx.float32))
            np64[k] = f32[k].astype(np.float64)
            graph[k] = m[:, None]  # [S, 1, out, in]: broadcasts over the input scales' axis
            continue
        parts = mx.quantize(m, **spec.as_quantize())
        biases = parts[2] if len(parts) > 2 else None
        qb = QuantizedBase(parts[0], parts[1], biases, spec, (int(m.shape[1]), int(m.shape[2])))
        deq = qb.dequantize().astype(mx.float32)
        f32[k] = np.array(deq)
        np64[k] = f32[k].astype(np.float64)
        graph[k] = WeightMatrix(qb)
        quant[k] = (
            np.array(qb.w),
            np.array(qb.scales.astype(mx.float32)) if qb.scales.dtype != mx.uint8 else np.array(qb.scales),
            None if biases is None else np.array(biases.astype(mx.float32)),
        )
    return StoredBlock(c, dtype, fold, spec, float(eps), f32, np64, graph, quant)


def _signed(st: StoredBlock, x: np.ndarray) -> np.ndarray:
    """``x`` [S, n, branch] with each case's fold signs applied (D x; exact)."""
    return x * st.c.signs[:, None, :].astype(x.dtype) if st.fold is not None else x


def truth(st: StoredBlock, branch: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """float64 truth [S, n, hidden] of each case at each of its ``n`` input rows."""
    x = _signed(st, branch.astype(np.float64))
    if st.fold is not None:
        x = hadamard.block_transform(x, int(st.fold))
    w = st.np64

    def mv(m: np.ndarray, v: np.ndarray) -> np.ndarray:
        return np.matmul(v, np.swapaxes(m, -1, -2))

    h = residual.astype(np.float64) + mv(w["wo"], x)
    normed = rms_norm_np(h, st.c.ffn_norm[:, None, :].astype(np.float64), st.eps)
    return h + mv(w["down"], silu_np(mv(w["gate"], normed)) * mv(w["up"], normed))


def reference(st: StoredBlock, branch: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """The workbench's graph tail (``tail_mx``) on the block, evaluated once ON THE CPU:
    float32 [S, n, hidden].

    Always the CPU, whatever MLX's default device: the verdict compares the implementation's
    errors with these, and its thresholds were calibrated against the CPU's. On a GPU the
    same graph sums in another order and comes out more accurate, so a correct kernel
    emulated on the host would be judged worse than the reference there and not on a CPU.
    Pinned, a verdict is the same on every machine."""
    with mx.stream(mx.cpu):
        x = mx.array(_signed(st, branch.astype(np.float32)))
        fold = None if st.fold is None else HadamardFold(int(st.fold))
        g = st.graph
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
    float32 [S, n, hidden], each case the bits ``faulty_tail`` gives it alone."""
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
