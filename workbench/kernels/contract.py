"""The launch contract: what a caller hands the kernels to run a tail (:class:`TailLaunch`).

It lives with the kernels, not with the tail, so that the kernels never import the tail's
types: the tail (level 5) builds a contract (``workbench.tail.tail_launch``) and hands it
down; the kernels (level 4) read only what is here. ``owner`` is the object the constants
belong to (the tail passes its ``TailWeights``): the kernels keep what they prepare from a
contract WEAKLY by it, so a prepared launch lives exactly as long as its weights, and is
never found by hashing the weights or by ``id()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from workbench.fold.rotation import FoldPlan, HadamardFold
from workbench.fold.weights import WeightMatrix
from workbench.validate import describe


@dataclass(frozen=True)
class TailLaunch:
    """What every fused backend needs, assembled in ONE place (frink-models' ``attn_tail_launch``).

    ``owner``: the weak-referenceable object the constants belong to (a ``TailWeights``), or
    None for a launch made to be prepared once by its caller (nothing is kept for it).
    ``wo`` is wo's stored base as a matrix WITHOUT its fold (the same stored arrays, dense
    or quantized), and ``fold`` / ``fold_plan`` the rotation the backend must apply around
    it (``None`` without a fold): kept apart, as ``WeightMatrix.launch_parts`` gives them,
    because a kernel applies the rotation itself. The FFN parts: ``ffn_norm`` (float32
    ``mx.array``), ``eps``, and ``gate`` / ``up`` / ``down``.
    """

    owner: Any
    wo: WeightMatrix
    fold: HadamardFold | None
    fold_plan: FoldPlan | None
    ffn_norm: mx.array
    eps: float
    gate: WeightMatrix
    up: WeightMatrix
    down: WeightMatrix

    @property
    def weights(self) -> Any:
        """``owner`` under the tail's name for it (the ``TailWeights`` the launch was built from)."""
        return self.owner


def each_row(
    tail: Callable[[Any, Any], Any], branch: Any, residual: Any, hidden: int, stack: Callable[[list], Any]
) -> Any:
    """``tail`` run on each row of a batch (``branch`` [..., width], ``residual`` [..., hidden]),
    the rows' outputs joined by ``stack`` and given back the batch's leading axes: the ONE loop
    every backend that takes a single position a launch runs a batch by (MLX or numpy rows)."""
    lead = tuple(branch.shape[:-1])
    bf, rf = branch.reshape(-1, branch.shape[-1]), residual.reshape(-1, residual.shape[-1])
    return stack([tail(bf[i], rf[i]) for i in range(bf.shape[0])]).reshape(*lead, hidden)


def check_launch(launch: Any, name: str = "launch") -> TailLaunch:
    """``launch`` itself when it is a :class:`TailLaunch`, else a ValueError naming ``name`` (and,
    for the tail's weights passed where their launch goes, the call that makes one)."""
    if not isinstance(launch, TailLaunch):
        hint = " (build one with workbench.tail.tail_launch(weights))"
        raise ValueError(f"{name}: must be a TailLaunch{hint}, got {describe(launch)}")
    return launch


def check_tail_inputs(launch: TailLaunch, branch: Any, residual: Any) -> None:
    """A ValueError naming ``branch`` or ``residual`` when its last axis is not the launch's
    width (wo's in dimension, the hidden size) or their leading (batch) axes differ.

    Every kernel entry point checks this before it builds anything: a kernel reads exactly
    the widths it was compiled for, so an input of another width is read out of bounds or
    in part (a wrong result, or MLX's bare ``[matmul]``), never refused by the kernel itself.
    Only shapes are read (numpy, MLX or anything with ``.shape``; lists through numpy).
    """
    width, hidden = int(launch.wo.shape[1]), int(launch.wo.shape[0])
    shapes = []
    for arg, value, want, what in (
        ("branch", branch, width, "wo's in dimension"),
        ("residual", residual, hidden, "the hidden size"),
    ):
        shape = getattr(value, "shape", None)
        if shape is None:
            try:
                shape = np.shape(value)
            except Exception:  # ragged lists and the like
                shape = None
        shape = None if shape is None else tuple(int(d) for d in shape)
        if not shape or shape[-1] != want:
            raise ValueError(
                f"{arg}: must be an array whose last axis is {want} ({what} of this launch), got {describe(value)}"
            )
        shapes.append(shape)
    if shapes[0][:-1] != shapes[1][:-1]:
        raise ValueError(
            f"residual: must have the branch's leading (batch) axes {shapes[0][:-1]}, got shape {shapes[1]}"
        )
