"""How many cases of a shape the check holds at once: blocks sized to a memory budget.

The check's own work (stored weights, float64 truth, graph reference, fault models) runs a
block of cases at a time, and a block's memory grows with its cases: a fixed count (256, as
before) refused 100 seeds at (2048, 2048, 8192) and any at Bonsai-27B's shape. Here the
block is as many cases as fit the budget, so any number of seeds runs in one call, at any
shape whose single case fits; one that does not is refused naming the shape and the bytes.

The bytes are counted per float a case draws (:func:`workbench.studies.cases.case_floats`,
nearly all of them weights, ``F``) and per float of its largest matrix (``M``), from what
:mod:`workbench.check.blocks` holds:

- a block holds, per case, the float32 draw (4 F: while it is drawn, its bulk uniforms beside
  its tensors, 8 F) and the graph reference's MLX copy (4 F), for a stored dtype or format
  other than float32 the dense float32 the implementation is handed (4 F), and a fault model's
  copy of one matrix (4 M): :func:`case_bytes`' ``per_case``;
- one case at a time needs more, whatever the block's size: the fresh copies a guarded call
  hands the implementation (4 F) and, for a callable in a worker process of its own, the case
  sent there (4 F more), the float64 of one matrix for the truth (8 M) and the float16 fault's
  products (a slice of 32 MiB): ``once``.

Measured peaks are in ``bench/check_shapes.py``'s record (the budget is an estimate, not a
cap the allocator enforces).
"""

from __future__ import annotations

from typing import Any

from workbench import validate
from workbench.studies.cases import CASE_BLOCK, case_floats

#: The budget when none is given: 4 GiB, or half this machine's memory if that is less.
DEFAULT_BUDGET_GIB = 4.0

#: Bytes a block holds per float of each of its cases: dense float32, and any other storage.
BLOCK_BYTES_PER_FLOAT = {"float32": 8, "other": 12}

#: Bytes one case needs beside the block, per float (the call's copies) and per float of its
#: largest matrix (the truth's float64 of it), with the float16 fault's slice of products.
ONCE_BYTES_PER_FLOAT = 8
ONCE_BYTES_PER_MATRIX_FLOAT = 8
FLOAT16_SLICE_BYTES = 1 << 25


def default_budget() -> int:
    """:data:`DEFAULT_BUDGET_GIB`, capped at :func:`workbench.validate.memory_cap_bytes`."""
    return min(int(DEFAULT_BUDGET_GIB * 2**30), validate.memory_cap_bytes())


def check_budget(budget: Any) -> int:
    """``budget`` (bytes, or None for :func:`default_budget`) as an int, or ``ValueError`` naming ``memory_budget``."""
    if budget is None:
        return default_budget()
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ValueError(f"memory_budget: must be a positive int of bytes (or None), got {validate.describe(budget)}")
    return validate.within_memory("memory_budget", budget, f"a budget of {budget} bytes")


def case_bytes(shape: tuple[int, int, int], stored: str = "float32") -> tuple[int, int]:
    """``(per_case, once)``: bytes a block holds per case of ``shape`` (``stored``: "float32" for
    dense float32 weights, anything else for a rounded dtype or a quantized format), and bytes
    one case needs beside it."""
    h, b, f = shape
    floats, largest = case_floats(shape), max(h * b, f * h)
    per_case = BLOCK_BYTES_PER_FLOAT["float32" if stored == "float32" else "other"] * floats + 4 * largest
    f16 = min(FLOAT16_SLICE_BYTES, 8 * largest)  # a small matrix's products are fewer than a slice
    once = ONCE_BYTES_PER_FLOAT * floats + ONCE_BYTES_PER_MATRIX_FLOAT * largest + f16
    return per_case, once


def block_size(shape: tuple[int, int, int], stored: str, budget: int) -> int:
    """The most cases of ``shape`` a block holds within ``budget`` bytes (at most
    :data:`~workbench.studies.cases.CASE_BLOCK`: a draw's stream covers that many seeds);
    ``ValueError`` naming ``memory_budget`` when even one case does not fit."""
    per_case, once = case_bytes(shape, stored)
    if per_case + once > budget:
        raise ValueError(
            f"memory_budget: one case at shape {tuple(shape)} ({stored}) needs about "
            f"{(per_case + once) / 2**30:.3g} GiB ({per_case + once} bytes), more than the budget of "
            f"{budget / 2**30:.3g} GiB ({budget} bytes); give a larger memory_budget or a smaller shape"
        )
    return max(1, min(CASE_BLOCK, (budget - once) // per_case))
