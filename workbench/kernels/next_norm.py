"""The next layer's input norm, carried by a tail: ``rms_norm(out) * weight`` computed where
``out`` is made.

In a decoder every tail's output goes straight into a norm: the next block's input norm,
or after the last block the model's final norm. On a GPU that norm is a launch of its own
a layer, and in a small model's decode a step's time is the host's work for each launch
(SmolLM2-135M on the H200: ``bench.real_model``). A tail that also writes the norm of its
output takes that launch away: the one CUDA launch computes it in its last group
(``kernels/next_norm.body``), the graph tail in the same compiled call.

:class:`NextNorm` is that norm's parameters; :meth:`NextNorm.oracle` its float64 value,
against which a carried norm is judged (``tests/test_next_norm.py``, the GPU checks).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from workbench.validate import describe

__all__ = ["NextNorm", "checked"]


@dataclass(frozen=True, eq=False)
class NextNorm:
    """An RMS norm ``x / sqrt(mean(x^2) + eps) * weight`` over a tail's hidden width.

    ``weight``: its weight, 1-D, finite (kept as float32: the kernels and the graph tail
    compute in float32); ``eps`` a finite number > 0. Two norms with the same weight bits
    and eps have the same :attr:`key` (prepared launches are kept by it).
    """

    weight: Any
    eps: float
    key: tuple = field(init=False)

    def __post_init__(self) -> None:
        try:
            w = np.asarray(self.weight, dtype=np.float32)
        except (TypeError, ValueError):
            raise ValueError(f"weight: must be a 1-D array of finite numbers, got {describe(self.weight)}") from None
        if w.ndim != 1 or w.size == 0 or not np.isfinite(w).all():
            raise ValueError(f"weight: must be a non-empty 1-D array of finite numbers, got {describe(self.weight)}")
        if (
            isinstance(self.eps, bool)
            or not isinstance(self.eps, (int, float, np.floating))
            or not np.isfinite(self.eps)
            or self.eps <= 0
        ):
            raise ValueError(f"eps: must be a finite number > 0, got {describe(self.eps)}")
        w = np.ascontiguousarray(w)
        object.__setattr__(self, "weight", w)
        object.__setattr__(self, "eps", float(self.eps))
        object.__setattr__(self, "key", (w.size, float(np.float32(self.eps)), hashlib.sha256(w.tobytes()).hexdigest()))

    @property
    def width(self) -> int:
        return int(self.weight.size)

    def packed(self) -> mx.array:
        """The kernel's ``next_nw`` input: the weight, then eps as float32, padded to a
        whole float4 (``kernels/next_norm.body``)."""
        tail = np.zeros(4, dtype=np.float32)
        tail[0] = self.eps
        return mx.array(np.concatenate([self.weight, tail]))

    def oracle(self, out: Any) -> np.ndarray:
        """The norm of ``out`` (``[..., width]``) in float64: what a carried norm is judged by."""
        x = np.asarray(out, dtype=np.float64)
        if x.shape[-1:] != (self.width,):
            raise ValueError(f"out: must have last axis {self.width}, got shape {x.shape}")
        inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + float(np.float32(self.eps)))
        return x * inv * self.weight.astype(np.float64)


def checked(next_norm: Any, width: int | None = None) -> NextNorm | None:
    """``next_norm`` where it is None or a :class:`NextNorm` (of ``width`` entries, where
    given), else ``ValueError`` naming the parameter: the one check of every call that
    takes a next norm."""
    if next_norm is None:
        return None
    if not isinstance(next_norm, NextNorm):
        raise ValueError(
            f"next_norm: must be a workbench.kernels.next_norm.NextNorm or None, got {describe(next_norm)}"
        )
    if width is not None and next_norm.width != width:
        raise ValueError(f"next_norm: its weight has {next_norm.width} entries, the tail's hidden width is {width}")
    return next_norm
