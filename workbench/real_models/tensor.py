"""One stored tensor under its Hugging Face name, dense or quantized as MLX quantizes.

Every reader (GGUF, Hugging Face folder, mlx-lm model) ends in :class:`Tensor`; a quantized
one keeps its packed words, scales and biases as stored, so the tail reads exactly the
numbers the file holds. :func:`tensor_from_parts` is how a file's arrays become one:
a quantized matrix's bits and group size come from the config's quantization entry, or
(GGUF, which names none) from the packed width against the matrix's input width.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from workbench.fold.weights import QuantizedBase, QuantSpec, WeightMatrix, check_quant_spec
from workbench.models.config import ModelConfig
from workbench.validate import describe

__all__ = ["Tensor", "in_dims", "tensor_from_parts"]


@dataclass(frozen=True)
class Tensor:
    """One stored tensor under its Hugging Face name: dense (``scales is None``) or an MLX
    quantized matrix (``weight`` packed, ``scales``, ``biases`` for affine, ``spec``)."""

    weight: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    spec: QuantSpec | None = None

    @property
    def quantized(self) -> bool:
        return self.scales is not None

    @property
    def shape(self) -> tuple[int, ...]:
        if not self.quantized:
            return tuple(int(d) for d in self.weight.shape)
        assert self.spec is not None
        return int(self.weight.shape[0]), int(self.weight.shape[1]) * 32 // self.spec.bits

    def matrix(self) -> WeightMatrix:
        """As a ``WeightMatrix``: the stored arrays themselves, dense or quantized (nothing re-rounded)."""
        if not self.quantized:
            return WeightMatrix(self.weight)
        assert self.spec is not None and self.scales is not None
        out_dim, in_dim = self.shape
        return WeightMatrix(QuantizedBase(self.weight, self.scales, self.biases, self.spec, (out_dim, in_dim)))

    def dense(self, dtype: Any = mx.float32) -> mx.array:
        """The matrix (or vector) as MLX ``dtype``; a quantized one dequantized in float32 first."""
        if not self.quantized:
            return self.weight.astype(dtype)
        m = self.matrix().launch_parts()[0]
        assert isinstance(m, QuantizedBase)
        return m.dequantize().astype(dtype)

    def take_rows(self, index: np.ndarray) -> Tensor:
        """The same tensor with its rows (axis 0) reordered; quantization groups run along a
        row, so the packed words, scales and biases move together and nothing is re-rounded."""
        idx = mx.array(index.astype(np.int32))
        pick = lambda a: None if a is None else mx.take(a, idx, axis=0)  # noqa: E731
        return Tensor(pick(self.weight), pick(self.scales), pick(self.biases), self.spec)


def in_dims(config: ModelConfig) -> dict[str, int]:
    """Each Llama-shaped matrix's input width, by module name ending: what tells a packed
    array's bits (``32 * packed / in``)."""
    lc = config.layer(config.attention_layers()[0]) if config.attention_layers() else config.layer(0)
    h = int(config.hidden_size)
    return {"o_proj": lc.num_q_heads * lc.head_dim or h, "down_proj": lc.ffn_dim or h, "hidden": h}


def tensor_from_parts(
    name: str, p: dict[str, mx.array], in_dims: dict[str, int], *, mode: str, quant: Mapping[str, Any] | None = None
) -> Tensor:
    if "weight" not in p:
        raise ValueError(f"source: tensor {name!r} has quantization parts {sorted(p)} but no weight")
    if "scales" not in p:
        return Tensor(p["weight"])
    w, scales = p["weight"], p["scales"]
    if w.ndim != 2 or scales.ndim != 2 or int(scales.shape[-1]) == 0:
        raise ValueError(
            f"source: quantized tensor {name!r} has weight {tuple(w.shape)} and scales "
            f"{tuple(scales.shape)}; both must be matrices, with at least one group a row"
        )
    groups = int(scales.shape[-1])
    if quant is not None:
        if not isinstance(quant, Mapping) or not {"bits", "group_size"} <= set(quant):
            raise ValueError(
                f"source: tensor {name!r} is quantized, but the config's quantization "
                f"{describe(quant)} does not give bits and group_size"
            )
        bits, group = quant["bits"], quant["group_size"]
    else:
        in_dim = in_dims.get(name.rsplit(".", 1)[-1], None)
        if in_dim is None:  # hidden wide: every other matrix reads the residual stream
            in_dim = in_dims.get("hidden")
        if not in_dim:
            raise ValueError(
                f"source: tensor {name!r} is quantized (it has scales), but the config has no "
                f"quantization entry giving its bits and group size"
            )
        bits = 32 * int(w.shape[-1]) // in_dim
        group = in_dim // groups
    spec = check_quant_spec(mode, bits, group)
    t = Tensor(w, scales, p.get("biases"), spec)
    out_dim, in_dim = t.shape
    if int(scales.shape[0]) != out_dim or in_dim != groups * spec.group_size:
        raise ValueError(
            f"source: quantized tensor {name!r}: weight {tuple(w.shape)} at {spec.bits} bits is "
            f"{out_dim} x {in_dim}, but its scales {tuple(scales.shape)} give groups of "
            f"{spec.group_size} over a different shape"
        )
    return t
