"""The attention layer's tail: its weights, its math, and the three ways to run it.

``weights`` holds one layer's :class:`TailWeights` and the recipe random cases follow;
``ops`` the math, once in numpy and once in MLX; ``paths`` the oracle (:func:`host_tail`),
the engine before the fusion (:func:`unfused_tail`, two waits) and the fused tail
(:func:`fused_tail`, one wait) on any backend; ``comparison`` the criterion and every
error metric; ``frink_case`` frink-models' test case, bit for bit. The names below are the
tail's API, importable from ``workbench.tail`` itself.
"""

from workbench.tail.ops import rms_norm_np, silu_np, tail_mx, tail_np
from workbench.tail.paths import (
    TailLaunch,
    check_inputs,
    fused_tail,
    host_tail,
    tail_graph,
    tail_launch,
    tail_refusals,
    to_mx,
    unfused_tail,
)
from workbench.tail.weights import DEFAULT_EPS, NORM_CONVENTIONS, Draw, TailRefused, TailWeights, case_recipe, random_inputs

__all__ = [
    "DEFAULT_EPS", "NORM_CONVENTIONS", "Draw", "TailRefused", "TailWeights", "case_recipe", "random_inputs",
    "rms_norm_np", "silu_np", "tail_np", "tail_mx",
    "TailLaunch", "check_inputs", "fused_tail", "host_tail", "tail_graph", "tail_launch", "tail_refusals",
    "to_mx", "unfused_tail",
]
