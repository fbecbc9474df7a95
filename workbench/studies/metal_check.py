"""The Metal kernels run live (emulated on the CPU) beside the graph tail and the float64 oracle.

:func:`metal_check` is what notebook 03 shows: for frink-models' case and one folded
random case, the fused tail through ``backend="metal-emulated"`` (MLX's generated Metal
source compiled by clang and executed by the emulator, in ascending, descending and
shuffled thread order) and through ``backend="graph"``, each compared with the float64
oracle (:func:`workbench.studies.exact_oracle.host_tail_exact`) at the case's tolerance
(:func:`workbench.studies.exact_oracle.tolerance_for`; 2e-4 on both cases here). :data:`PROVES`
says in a sentence what that does and does not establish.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.kernels.emulated import emulated_tail
from workbench.kernels import metal_emulation
from workbench.tail.comparison import compare
from workbench.studies.exact_oracle import host_tail_exact, tolerance_for
from workbench.tail.frink_case import seed_case
from workbench.tail.weights import TailWeights, random_inputs
from workbench.tail.paths import fused_tail, tail_launch

#: What :func:`metal_check` establishes, and what it does not.
PROVES = ("The Metal source MLX would compile for these launches compiles against a strict stand-in of "
          "<metal_stdlib> and, executed thread by thread with real barrier, SIMD-group and 32 KB "
          "threadgroup-memory semantics, matches the float64 oracle with the same bits in every thread order; "
          "it does not show that Apple's compiler accepts the source or how fast or precise (exp, rsqrt) "
          "an Apple GPU runs it: that needs a Mac.")

#: The folded random case: Bonsai-27B's fold geometry scaled down (m = 12 x 2^4 with a
#: permutation, bfloat16 weights).
FOLDED_CASE = dict(hidden=128, branch=384, ffn=256, seed=12, fold_block=192, fold_permute=True, dtype="bfloat16")


def metal_check(seed: int = 0) -> pd.DataFrame:
    """One row a (case, path): worst scaled error against the float64 oracle, the tolerance,
    pass, and for the emulated Metal kernels whether all thread orders gave the same bits.

    ``seed``: the random inputs of the folded case (frink-models' case has its own).
    Raises ``BackendUnavailable`` without clang.
    """
    c = seed_case()
    folded = TailWeights.random(FOLDED_CASE["hidden"], FOLDED_CASE["branch"], FOLDED_CASE["ffn"],
                                seed=FOLDED_CASE["seed"], fold_block=FOLDED_CASE["fold_block"],
                                fold_permute=FOLDED_CASE["fold_permute"], dtype=FOLDED_CASE["dtype"])
    br, res = random_inputs(folded, seed=seed)
    rows = []
    for name, w, b, r in (("frink-models' case", c.weights, c.branch, c.residual),
                          ("folded m=12x16, permuted, bf16", folded, br, res)):
        truth = host_tail_exact(w, b, r)
        tol, _ = tolerance_for(w, b, r, truth)
        metal = fused_tail(w, b, r, backend="metal-emulated")
        orders = [emulated_tail(tail_launch(w), b, r, order=o, seed=seed)
                  for o in metal_emulation.ORDERS]
        same = all(np.array_equal(o.view(np.uint32), metal.view(np.uint32)) for o in orders)
        for path, out, bits in (("metal-emulated", metal, same), ("graph", fused_tail(w, b, r, backend="graph"),
                                                                     None)):
            cmp = compare(out, truth, tol=tol)
            rows.append({"case": name, "path": path, "worst": cmp.worst, "tol": tol, "passed": bool(cmp.passed),
                         "same bits in every thread order": bits})
    return pd.DataFrame(rows)
