"""The Metal kernels run live (emulated on the CPU) beside the graph tail and the float64 oracle.

:func:`metal_check_table` is what notebook 03 shows: for frink-models' case and one folded random
case, the fused tail's Metal launches (MLX's generated Metal source compiled by clang and run
by the emulator) in every schedule of :data:`workbench.kernels.metal_emulation.SCHEDULES` and
every math variant of :data:`workbench.studies.metal_math_modes.VARIANTS`, and the graph tail,
each compared with the float64 oracle (:func:`workbench.studies.exact_oracle.host_tail_exact`)
at the case's tolerance (:func:`workbench.studies.exact_oracle.tolerance_for`).

Bits must agree across schedules (a difference is a race); they may differ across math
variants (that is the point of them), so each variant's worst error is also given as a
multiple of the host functions' worst on the same case: how much of the tolerance Metal's
contract may take beyond what the host shows. :data:`PROVES` says in a sentence what this
does and does not establish.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench import validate
from workbench.kernels import metal_emulation
from workbench.kernels.emulated import emulated_tail
from workbench.studies.exact_oracle import host_tail_exact, tolerance_for
from workbench.studies.metal_math_modes import VARIANTS
from workbench.tail.comparison import compare
from workbench.tail.frink_case import seed_case
from workbench.tail.paths import fused_tail, tail_launch
from workbench.tail.weights import TailWeights, random_inputs

#: What :func:`metal_check_table` establishes, and what it does not.
PROVES = (
    "The Metal source MLX would compile for these launches compiles against a strict stand-in of "
    "<metal_stdlib> and, executed thread by thread with real barrier, SIMD-group and 32 KB "
    "threadgroup-memory semantics, gives the same bits in every schedule (SIMD-groups in step, and "
    "apart as an Apple GPU runs them between barriers) and matches the float64 oracle with exp, exp2 "
    "and rsqrt computed by the host or anywhere Metal's precise and fast contracts allow (MSL spec "
    "8.4: each result at either edge of its bound, or random in it). It does not show that Apple's "
    "compiler accepts the source, how fast an Apple GPU runs it, or what Apple's division, its other "
    "math functions and fast-math reassociation do to the result: the emulator does not model them."
)

#: The folded random case: Bonsai-27B's fold geometry scaled down (m = 12 x 2^4 with a
#: permutation, bfloat16 weights).
FOLDED_CASE = dict(hidden=128, branch=384, ffn=256, seed=12, fold_block=192, fold_permute=True, dtype="bfloat16")

#: The column that says whether every schedule gave the same bits.
SAME_BITS = "same bits in every schedule"


def _variant_name(mode: str, error: str) -> str:
    return mode if error == "none" else f"{mode} {error}"


def metal_check_table(seed: int = 0) -> pd.DataFrame:
    """One row a (case, path, math variant): ``worst`` scaled error against the float64
    oracle, ``x host`` (that worst over the host variant's worst on the case), the
    tolerance, pass, and for the emulated Metal kernels whether all schedules gave the same
    bits. The graph tail has one row a case (``math`` empty, ``x host`` and the bits column
    None).

    ``seed``: the random inputs of the folded case (frink-models' case has its own), the
    shuffled and random schedules, and the random place in each math bound.
    Raises ``BackendUnavailable`` without clang.
    """
    seed = validate.integer("seed", seed, minimum=0)
    c = seed_case()
    folded = TailWeights.random(
        FOLDED_CASE["hidden"],
        FOLDED_CASE["branch"],
        FOLDED_CASE["ffn"],
        seed=FOLDED_CASE["seed"],
        fold_block=FOLDED_CASE["fold_block"],
        fold_permute=FOLDED_CASE["fold_permute"],
        dtype=FOLDED_CASE["dtype"],
    )
    br, res = random_inputs(folded, seed=seed)
    rows = []
    for name, w, b, r in (
        ("frink-models' case", c.weights, c.branch, c.residual),
        ("folded m=12x16, permuted, bf16", folded, br, res),
    ):
        truth = host_tail_exact(w, b, r)
        tol, _ = tolerance_for(w, b, r, truth)
        launch = tail_launch(w)
        # The backend itself once: it must be the ascending schedule with the host's functions.
        backend = fused_tail(w, b, r, backend="metal-emulated")
        host_worst = None
        for mode, error in VARIANTS:
            outs = [
                emulated_tail(
                    launch,
                    b,
                    r,
                    order=o,
                    seed=seed,
                    math_mode=mode,
                    math_error="edge-high" if error == "none" else error,
                )
                for o in metal_emulation.SCHEDULES
            ]
            bits = [o.view(np.uint32) for o in outs]
            same = all(np.array_equal(x, bits[0]) for x in bits[1:])
            if mode == "host":
                same = same and np.array_equal(backend.view(np.uint32), bits[0])
            cmp = compare(outs[0], truth, tol=tol)
            host_worst = cmp.worst if host_worst is None else host_worst
            rows.append(
                {
                    "case": name,
                    "path": "metal-emulated",
                    "math": _variant_name(mode, error),
                    "worst": cmp.worst,
                    "x host": cmp.worst / host_worst if host_worst else float("nan"),
                    "tol": tol,
                    "passed": bool(cmp.passed),
                    SAME_BITS: same,
                }
            )
        cmp = compare(fused_tail(w, b, r, backend="graph"), truth, tol=tol)
        rows.append(
            {
                "case": name,
                "path": "graph",
                "math": "",
                "worst": cmp.worst,
                "x host": None,
                "tol": tol,
                "passed": bool(cmp.passed),
                SAME_BITS: None,
            }
        )
    return pd.DataFrame(rows)
