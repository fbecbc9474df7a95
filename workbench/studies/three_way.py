"""The three-way comparison: "the kernel is wrong" versus "float32 is float32".

A fused tail that misses a tolerance against the float64 truth is not necessarily wrong:
float32 itself may miss it at that shape. So the fused result (float32) is compared with
the truth (float64) AND with the float32 host oracle, and the float32 host with the
truth, all at one tolerance; :data:`VERDICTS` says what each outcome means. Deliberately
wrong fused variants (:data:`FAULTS`) show what the comparison tells apart, and
:func:`count_waits` counts what each path waits on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.tail.comparison import Comparison, compare
from workbench.tail.faults import TailVariant, apply_fault
from workbench.tail.frink_case import SEED_TOL
from workbench.tail.ops import tail_mx
from workbench.tail.paths import check_inputs, fused_tail, host_tail, tail_launch, to_mx, unfused_tail
from workbench.tail.weights import TailWeights
from workbench.waits.measurement import count_waits

#: Deliberately wrong fused variants, to show what the three-way comparison tells apart, named
#: and applied from the tail's one fault vocabulary (``workbench.tail.faults``):
#: ``rotation_skipped`` forgets wo's rotation (invisible without a fold, as frink-models' source
#: warns); ``bf16_normed`` rounds the normed vector to bf16 before the FFN (seen 1.5e-2 off).
FAULTS = ("rotation_skipped", "bf16_normed")


def faulty_fused_tail(w: TailWeights, branch: Any, residual: Any, fault: str) -> np.ndarray:
    """The graph fused tail with one deliberate ``fault`` (see :data:`FAULTS`); float32 numpy."""
    validate.one_of("fault", fault, FAULTS)
    branch, residual = check_inputs(w, branch, residual)
    launch = tail_launch(w)
    v = TailVariant(
        launch.wo, launch.gate, launch.up, launch.down, launch.ffn_norm, launch.eps, to_mx(branch), to_mx(residual)
    )
    v = apply_fault(fault, v, allowed=FAULTS)
    out = tail_mx(
        v.wo,
        None if v.rotations == 0 else launch.fold,  # this graph applies the fold once or not at all
        v.ffn_norm,
        v.gate,
        v.up,
        v.down,
        v.eps,
        v.branch,
        v.residual,
        normed_dtype=None if v.normed_dtype is None else getattr(mx, v.normed_dtype),
    )
    mx.eval(out)
    return np.asarray(out)


#: What a user should conclude from (fused vs truth, host vs truth), both at the same tol.
VERDICTS: dict[tuple[bool, bool], str] = {
    (True, True): "fused is right (float32 is float32)",
    (False, True): "the fused path is WRONG (the float32 host meets the tolerance it misses)",
    (False, False): "float32 itself misses this tolerance here: widen it or accumulate wider",
    (True, False): "fused is right; the float32 host is the less accurate path",
}


def verdict(fused_vs_truth: Comparison, host_vs_truth: Comparison) -> str:
    """The conclusion :data:`VERDICTS` draws from the two comparisons against the truth."""
    for name, c in (("fused_vs_truth", fused_vs_truth), ("host_vs_truth", host_vs_truth)):
        if not isinstance(c, Comparison):
            raise ValueError(f"{name}: must be a Comparison (from compare), got {validate.describe(c)}")
    return VERDICTS[(bool(fused_vs_truth.passed), bool(host_vs_truth.passed))]


@dataclass(frozen=True)
class ThreeWay:
    """Fused (float32) vs host (float32) vs truth (float64), and the waits each path cost."""

    fused_vs_truth: Comparison
    host_vs_truth: Comparison
    fused_vs_host: Comparison
    waits: dict[str, int]

    @property
    def verdict(self) -> str:
        return verdict(self.fused_vs_truth, self.host_vs_truth)


def three_way(
    w: TailWeights,
    branch: Any,
    residual: Any,
    *,
    tol: float = SEED_TOL,
    backend: str = "graph",
    fault: str | None = None,
) -> ThreeWay:
    """Run the fused tail (``backend``, or a :data:`FAULTS` variant), the float32 host and the
    float64 truth on the same inputs, compare all three at ``tol``, and count each one's waits
    (the MLX paths run first; the host copies of the weights are made before the oracles run,
    outside their counts, so the oracles count 0).

    The inputs, and the truth, must be finite: with a NaN or Inf in ``branch`` or
    ``residual`` every path's output is NaN, and a verdict would blame float32 for what the
    input did; so a ``ValueError`` names the first non-finite input element (or, for finite
    inputs whose truth is not finite, the weights).
    """
    branch, residual = check_inputs(w, branch, residual)
    tol = validate.number("tol", tol, minimum=0, exclusive_minimum=True)
    if fault is not None:
        validate.one_of("fault", fault, FAULTS)
    for name, a in (("branch", branch), ("residual", residual)):
        host = validate.float_array(name, a)  # a study, not the hot path: one host read is fine
        bad = ~np.isfinite(host)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"{name}: must be finite for a three-way comparison (a non-finite input makes every path "
                f"non-finite, which says nothing about float32), got {float(host[where])!r} at index {where} "
                f"({int(bad.sum())} non-finite in all)"
            )
    # The MLX paths first, then the host copies: the graph's float32 temporaries of the
    # weights and the float64 host copies are never held at once (at Bonsai-27B's shape
    # 0.7 GB beside 2.4 GB).
    with count_waits() as n_fused:
        fused = (
            fused_tail(w, branch, residual, backend=backend)
            if fault is None
            else faulty_fused_tail(w, branch, residual, fault)
        )
    with count_waits() as n_unfused:
        unfused_tail(w, branch, residual)
    w.host_arrays(np.float64)  # the host copies of the weights (both oracles read them), made outside the counts
    with count_waits() as n_truth:
        truth = host_tail(w, branch, residual)
    with count_waits() as n_host:
        host = host_tail(w, branch, residual, dtype=np.float32)
    if not np.isfinite(truth).all():
        raise ValueError(
            "w: the float64 truth is not finite on these finite inputs (a weight is NaN or Inf, or the tail "
            "overflows float64): no verdict on float32 can be drawn"
        )
    return ThreeWay(
        compare(fused, truth, tol=tol),
        compare(host, truth, tol=tol),
        compare(fused, host, tol=tol),
        {"unfused": n_unfused.n, "fused": n_fused.n, "host": n_host.n, "truth": n_truth.n},
    )


def _sig(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.1e}"


def three_way_table(
    cases: Sequence[tuple[str, TailWeights, Any, Any]],
    *,
    tol: float = SEED_TOL,
    fault: str | None = None,
    figures: bool = True,
) -> Any:
    """One row per ``(label, weights, branch, residual)``: the three-way comparison.

    ``figures=True``: the worst scaled errors (2 significant digits) and NMSE, which vary
    with the device in their last digits; ``figures=False``: only what does not (PASS /
    FAIL at ``tol``, the waits, the verdict), for checked notebook output. A pandas
    DataFrame.
    """
    import pandas as pd  # tables only; the tail itself needs no pandas

    cases = validate.sequence("cases", cases, what="(label, weights, branch, residual) tuples")
    for i, case in enumerate(cases):
        if not (isinstance(case, (tuple, list)) and len(case) == 4):
            raise ValueError(
                f"cases[{i}]: must be a (label, weights, branch, residual) tuple, got {validate.describe(case)}"
            )
    figures = validate.flag("figures", figures)
    rows = []
    for label, w, br, res in cases:
        r = three_way(w, br, res, tol=tol, fault=fault)
        h, b, f = w.shape
        row: dict[str, Any] = {
            "case": label,
            "shape": f"{h}x{b}x{f}",
            "weights": w.wo.dtype,
            "fold": "none" if w.wo.fold is None else f"{w.wo.fold.block}/{w.wo.fold.site.name.lower()}",
        }
        if figures:
            row.update(
                {
                    "fused-truth worst": _sig(r.fused_vs_truth.worst),
                    "host-truth worst": _sig(r.host_vs_truth.worst),
                    "fused-host worst": _sig(r.fused_vs_host.worst),
                    "fused-truth NMSE": _sig(r.fused_vs_truth.nmse),
                }
            )
        row.update(
            {
                "fused~truth": "PASS" if r.fused_vs_truth.passed else "FAIL",
                "host~truth": "PASS" if r.host_vs_truth.passed else "FAIL",
                "fused~host": "PASS" if r.fused_vs_host.passed else "FAIL",
                "waits unfused/fused/oracle": f"{r.waits['unfused']}/{r.waits['fused']}/{r.waits['truth']}",
                "verdict": r.verdict,
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)
