"""What an implementation under test is handed for one case: the weights as they are STORED.

A kernel reads the weights in their stored format, not the float64 map they stand for:
a dense dtype (float32, float16, bfloat16), or quantized codes with their scales and
biases, and the fold whose rotation it applies around ``wo``. :class:`StoredCase` carries
exactly that, taken from a :class:`~workbench.tail.weights.TailWeights`, with the
activations, so a user's callable can run a real kernel on it. The float64 truth of the
same case is computed from the same stored weights (``tail.host_tail``), so a difference
is the implementation's, never the storage's.

Arrays are numpy by default; :func:`convert` hands them over as MLX or PyTorch arrays
instead (bfloat16 weights are given as float32 holding the bfloat16 values exactly,
since numpy has no bfloat16; ``StoredMatrix.dtype`` still says ``"bfloat16"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
import numpy as np

from workbench.fold.rotation import HadamardFold
from workbench.fold.weights import QuantizedBase, WeightMatrix
from workbench.tail.weights import TailWeights
from workbench.validate import one_of

#: The array kinds a callable may ask for.
ARRAY_KINDS: tuple[str, ...] = ("numpy", "mlx", "torch")


@dataclass(frozen=True)
class StoredMatrix:
    """One [out, in] weight as stored: ``values`` (dense) or ``codes`` + ``scales`` (+ ``biases``).

    ``dtype``: ``"float32"``, ``"float16"``, ``"bfloat16"`` for a dense matrix, or the
    quantized format (``"affine4-g64"``, ``"mxfp4-g32"``, ...); ``mode`` / ``bits`` /
    ``group_size`` say how the codes are packed (``mx.quantize``'s layout: codes packed
    into uint32 along each row, one scale, and for affine one bias, per group of
    ``group_size`` inputs). ``dense()`` is the matrix the codes stand for, float32, for an
    implementation that dequantizes first.
    """

    shape: tuple[int, int]
    dtype: str
    values: Any = None
    codes: Any = None
    scales: Any = None
    biases: Any = None
    mode: str | None = None
    bits: int | None = None
    group_size: int | None = None
    _dense: Any = None
    #: The rotation this matrix's input takes, where it carries its own (a Hadamard pack's
    #: gate, up, down: each with its block and signs); ``wo``'s is :attr:`StoredCase.fold`.
    fold: HadamardFold | None = None

    @property
    def quantized(self) -> bool:
        return self.codes is not None

    def dense(self) -> Any:
        """The stored matrix as float32 (dequantized when quantized), in the case's array kind."""
        return self._dense if self._dense is not None else self.values


@dataclass(frozen=True)
class StoredCase:
    """One case as an implementation under test receives it.

    ``wo`` (stored: ``W R^T`` when ``fold`` is at site INPUT, ``R W`` at OUTPUT), ``gate``,
    ``up``, ``down`` as :class:`StoredMatrix`; ``ffn_norm`` float32 [hidden] (the effective
    weight: ``x * rsqrt(mean x^2 + eps) * ffn_norm``); ``eps``; ``fold`` the rotation to apply
    around ``wo`` (``None``: none); ``branch`` [..., branch] and ``residual`` [..., hidden]
    float32 (leading axes when the callable takes a batch). ``case`` names it in reports.
    """

    case: str
    wo: StoredMatrix
    gate: StoredMatrix
    up: StoredMatrix
    down: StoredMatrix
    ffn_norm: Any
    eps: float
    fold: HadamardFold | None
    branch: Any
    residual: Any

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(hidden, branch, ffn)``."""
        h, b = self.wo.shape
        return h, b, self.gate.shape[0]


def _stored_matrix(m: WeightMatrix, own_fold: bool = False) -> StoredMatrix:
    base, f = m.launch_parts()
    fold = f if own_fold else None
    if isinstance(base, QuantizedBase):
        spec = base.spec
        return StoredMatrix(
            shape=base.shape,
            dtype=str(spec),
            codes=np.array(base.w),
            scales=np.array(base.scales.astype(mx.float32)) if base.scales.dtype != mx.uint8 else np.array(base.scales),
            biases=None if base.biases is None else np.array(base.biases.astype(mx.float32)),
            mode=spec.mode,
            bits=spec.bits,
            group_size=spec.group_size,
            _dense=m.dense(np.float32),
            fold=fold,
        )
    values = m.dense(np.float32)
    if m.dtype == "float16":
        values = values.astype(np.float16)
    return StoredMatrix(shape=m.shape, dtype=m.dtype, values=values, fold=fold)


def stored_case(w: TailWeights, branch: np.ndarray, residual: np.ndarray, case: str) -> StoredCase:
    """The :class:`StoredCase` of ``w`` and the activations (numpy)."""
    return StoredCase(
        case=case,
        wo=_stored_matrix(w.wo),
        gate=_stored_matrix(w.gate, own_fold=True),
        up=_stored_matrix(w.up, own_fold=True),
        down=_stored_matrix(w.down, own_fold=True),
        ffn_norm=w.ffn_norm,
        eps=float(w.eps),
        fold=w.wo.fold,
        branch=np.asarray(branch, dtype=np.float32),
        residual=np.asarray(residual, dtype=np.float32),
    )


#: The arrays a stored matrix may hold (``_dense``: its float32 values, dequantized when quantized).
MATRIX_PARTS: tuple[str, ...] = ("values", "codes", "scales", "biases", "_dense")


def _to(kind: str, a: Any) -> Any:
    if a is None or kind == "numpy":
        return a
    if kind == "mlx":
        return mx.array(a)
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))


def map_arrays(sc: StoredCase, fn: Callable[[Any], Any]) -> StoredCase:
    """``sc`` with ``fn`` applied to every array it holds (an absent part stays None; the
    fold, read-only, and the scalars are shared): the one walk over a case's arrays."""

    def each(a: Any) -> Any:
        return None if a is None else fn(a)

    def mat(m: StoredMatrix) -> StoredMatrix:
        parts = {p: each(getattr(m, p)) for p in MATRIX_PARTS}
        return StoredMatrix(
            shape=m.shape, dtype=m.dtype, mode=m.mode, bits=m.bits, group_size=m.group_size, fold=m.fold, **parts
        )

    return StoredCase(
        case=sc.case,
        wo=mat(sc.wo),
        gate=mat(sc.gate),
        up=mat(sc.up),
        down=mat(sc.down),
        ffn_norm=each(sc.ffn_norm),
        eps=sc.eps,
        fold=sc.fold,
        branch=each(sc.branch),
        residual=each(sc.residual),
    )


def convert(sc: StoredCase, kind: str) -> StoredCase:
    """``sc`` with every array as ``kind`` (:data:`ARRAY_KINDS`); numpy is returned as it is."""
    one_of("arrays", kind, ARRAY_KINDS)
    if kind == "numpy":
        return sc
    return map_arrays(sc, lambda a: _to(kind, a))


def with_activations(sc: StoredCase, branch: Any, residual: Any, kind: str) -> StoredCase:
    """``sc`` (its arrays already ``kind``) with ``branch`` and ``residual`` (numpy) as ``kind``:
    the calls of one case that share its weights, each with its own activations."""
    one_of("arrays", kind, ARRAY_KINDS)
    return replace(sc, branch=_to(kind, branch), residual=_to(kind, residual))


def as_numpy(value: Any) -> np.ndarray | None:
    """A result handed back by a callable (numpy, MLX or PyTorch array) as numpy, or None if it is not an array."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, mx.array):
        return np.array(value.astype(mx.float32)) if value.dtype == mx.bfloat16 else np.array(value)
    if type(value).__module__.startswith("torch"):
        try:
            return value.detach().to("cpu").float().numpy()
        except Exception:  # not a tensor after all: reported as a non-array by the caller
            return None
    return None
