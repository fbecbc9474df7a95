"""The fused tail's Metal kernels under Metal's precision contract, emulated on the CPU.

The emulator computes ``metal::exp`` and ``metal::rsqrt`` (the tail's SiLU and RMS norm)
with the host's float functions unless told otherwise; an Apple GPU computes them within
the bounds of the Metal Shading Language spec (section 8.4), which differ between its
precise and fast math modes. :func:`math_mode_sweep` runs the tail in every mode, each
function's result at the upper or lower edge of its bound or seeded random inside it
(``metal_emulation.MATH_MODES`` / ``MATH_ERRORS``), on random cases of frink-models' shape
(64, 96, 80, fold block 16), against the float64 oracle of the same stored weights, so a
tolerance calibrated on the graph tail (notebook 04) can be held against what Metal may
compute. Worst scaled error as everywhere: max |x - y| / max(|y|, 1).
"""

from __future__ import annotations

import pandas as pd

from workbench import validate
from workbench.kernels import metal_emulation
from workbench.kernels.emulated import emulated_tail
from workbench.studies.exact_oracle import host_tail_exact
from workbench.tail.comparison import compare
from workbench.tail.paths import fused_tail, tail_launch
from workbench.tail.weights import TailWeights, random_inputs

#: frink-models' test shape (hidden, branch, ffn) and its fold block on wo's input.
SHAPE = (64, 96, 80)
FOLD_BLOCK = 16

#: The variants of :func:`math_mode_sweep`: the host's functions once (no bound to place a
#: result in: error "none"), then each of Metal's modes at each place in its bound.
VARIANTS: tuple[tuple[str, str], ...] = (("host", "none"),) + tuple(
    (m, e) for m in metal_emulation.MATH_MODES[1:] for e in metal_emulation.MATH_ERRORS
)


def math_mode_sweep(n_cases: int = 40, *, first_seed: int = 0) -> pd.DataFrame:
    """One row a (case, variant): ``seed``, ``mode``, ``error`` and ``worst``, the worst
    scaled error of the emulated Metal tail against the float64 oracle; and one row a case
    for the graph tail (``mode`` "graph") beside it. Raises ``BackendUnavailable`` without
    clang."""
    n_cases = validate.integer("n_cases", n_cases, minimum=1, maximum=100_000)
    first_seed = validate.integer("first_seed", first_seed, minimum=0)
    rows = []
    for seed in range(first_seed, first_seed + n_cases):
        w = TailWeights.random(*SHAPE, seed=seed, fold_block=FOLD_BLOCK)
        br, res = random_inputs(w, seed=seed)
        truth = host_tail_exact(w, br, res)
        launch = tail_launch(w)
        for mode, error in VARIANTS:
            out = emulated_tail(
                launch, br, res, math_mode=mode, seed=seed, math_error="edge-high" if error == "none" else error
            )
            rows.append({"seed": seed, "mode": mode, "error": error, "worst": compare(out, truth).worst})
        graph = fused_tail(w, br, res, backend="graph")
        rows.append({"seed": seed, "mode": "graph", "error": "", "worst": compare(graph, truth).worst})
    return pd.DataFrame(rows)


def summary(sweep: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """Per variant: median and largest worst error, and whether every case is within
    ``tolerance`` (a calibrated tolerance, say)."""
    tolerance = validate.number("tolerance", tolerance, minimum=0, exclusive_minimum=True)
    g = sweep.groupby(["mode", "error"], sort=False)["worst"]
    out = pd.DataFrame({"median": g.median(), "max": g.max()})
    out["within tolerance"] = out["max"] <= tolerance
    return out
