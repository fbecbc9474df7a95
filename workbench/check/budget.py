"""How many cases of a shape the check holds at once: blocks sized to a memory budget.

The check's own work (stored weights, float64 truth, graph reference, fault models) runs a
block of cases at a time, and a block's memory grows with its cases: a fixed count (256, as
before) refused 100 seeds at (2048, 2048, 8192) and any at Bonsai-27B's shape. Here the
block is as many cases as fit the budget, so any number of seeds runs in one call, at any
shape whose single case fits; one that does not is refused naming the shape and the bytes.

The bytes are counted per float a case draws (:func:`workbench.studies.cases.case_floats`,
nearly all of them weights, ``F``), and they are MEASURED, not derived: the peak resident
memory of whole checks (``bench/check_shapes.py``, the notebook 07 tail in its worker
process, 2026-12-05). A block of one case peaked at 0.65 GiB at (2048, 2048, 8192) and
3.1 GiB at Bonsai-27B's shape (10.8 bytes a float with the interpreter's own); blocks of 4
and 7 cases at 2048 at 3.7 and 6.75 GiB: about 1.2 GiB, 22 bytes a float, each case past the
first (the draw, the graph reference's copy and the temporaries of the products the truth,
the reference and the fault models make over the block, some at once on two threads).
So one case counts :data:`FIRST_BYTES` plus :data:`FIRST_BYTES_PER_FLOAT` a float, each
further case :data:`BLOCK_BYTES_PER_FLOAT`; a shape whose first case does not fit is refused.
Where a second draw buffer also fits (:data:`DRAW_BYTES_PER_FLOAT` a float a case), the next
block is drawn while one is checked (:func:`block_plan`). These counts were measured before
the check stopped copying its blocks' weights for the graph reference and its calls
(2048-wide blocks of three cases peak at 1.1 GiB now); they are kept as they are: a budget
they keep to holds with room.

"""

from __future__ import annotations

from typing import Any

from workbench import validate
from workbench.studies.cases import CASE_BLOCK, case_floats

#: The budget when none is given: 4 GiB, or half this machine's memory if that is less.
DEFAULT_BUDGET_GIB = 4.0

#: Bytes of the first case of a block: the interpreter, MLX and pandas, and a float's share.
FIRST_BYTES = 2**29
FIRST_BYTES_PER_FLOAT = 11

#: Bytes each further case of a block adds, a float.
BLOCK_BYTES_PER_FLOAT = 22

#: Bytes a case's draw takes, a float (float32): what drawing the next block ahead costs.
DRAW_BYTES_PER_FLOAT = 4


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


def case_bytes(shape: tuple[int, int, int]) -> tuple[int, int]:
    """``(per_case, first)``: bytes each case of a block past the first adds at ``shape``, and
    bytes the first case takes (with the process's own)."""
    floats = case_floats(shape)
    return BLOCK_BYTES_PER_FLOAT * floats, FIRST_BYTES + FIRST_BYTES_PER_FLOAT * floats


def block_size(shape: tuple[int, int, int], budget: int) -> int:
    """The most cases of ``shape`` a block holds within ``budget`` bytes (at most
    :data:`~workbench.studies.cases.CASE_BLOCK`: a draw's stream covers that many seeds);
    ``ValueError`` naming ``memory_budget`` when even one case does not fit."""
    per_case, first = case_bytes(shape)
    if first > budget:
        raise ValueError(
            f"memory_budget: one case at shape {tuple(shape)} needs about {first / 2**30:.3g} GiB "
            f"({first} bytes), more than the budget of {budget / 2**30:.3g} GiB ({budget} bytes); "
            "give a larger memory_budget or a smaller shape"
        )
    return max(1, min(CASE_BLOCK, 1 + (budget - first) // per_case))


def block_plan(shape: tuple[int, int, int], budget: int) -> tuple[int, bool]:
    """``(cases a block, whether the next block is drawn while this one is checked)``: drawing
    ahead takes a second draw buffer, so it is planned only where a block of at least one
    case and that buffer fit ``budget`` (the block made smaller for it, never the budget
    passed); else :func:`block_size` alone. ``ValueError`` as :func:`block_size` gives it."""
    size = block_size(shape, budget)
    per_case, first = case_bytes(shape)
    ahead = DRAW_BYTES_PER_FLOAT * case_floats(shape)
    for s in range(size, 0, -1):
        if first + per_case * (s - 1) + ahead * s <= budget:
            return s, True
    return size, False
