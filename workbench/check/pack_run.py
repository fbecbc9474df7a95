"""The check of a tail read from a Hadamard pack: the pack's own stored weights, every linear rotating its input.

:func:`check_pack_tail` judges an implementation of one layer's tail on the weights a pack
stores (``workbench.models.hadamard_pack``: 2-bit codes, float16 scales and biases, each
matrix's block and signs), not on random ones: seeded inputs at each input scale, the
float64 truth of the same stored codes (``tail.host_tail``: every matrix's rotation, weights
from the codes in float64), the workbench's graph tail beside it (the same rotations in
float32, then ``mx.quantized_matmul``), the fault models of :mod:`workbench.check.pack_faults`,
and the verdict and calibrated tolerance of :func:`workbench.check.report.build_report`. The
implementation is handed :func:`~workbench.check.stored.stored_case` (each ``StoredMatrix``
with its own ``fold``) and called directly, one call a case or a scale, in this process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.check.pack_faults import PACK_FAULTS, applies, packed_faulty_tail
from workbench.check.report import CheckReport, build_report
from workbench.check.run import DEFAULT_SCALES, as_subject
from workbench.check.stored import stored_case
from workbench.check.subjects import SubjectError, checked_output
from workbench.tail.comparison import max_abs_error, nmse, worst_scaled_error
from workbench.tail.paths import fused_tail, host_tail
from workbench.tail.weights import TailWeights, random_inputs


def _metrics(out: np.ndarray, truth: np.ndarray) -> dict[str, np.ndarray]:
    return {"worst": worst_scaled_error(out, truth), "max_abs": max_abs_error(out, truth), "nmse": nmse(out, truth)}


def check_pack_tail(
    subject: Any,
    w: TailWeights,
    *,
    seeds: Iterable[int] = range(100),
    scales: Sequence[float] = DEFAULT_SCALES,
    faults: Sequence[str] = tuple(PACK_FAULTS),
    tolerance: float | None = None,
    flake_rate: float = 1e-4,
    name: str = "pack layer",
) -> CheckReport:
    """Check ``subject`` (a callable ``StoredCase -> [hidden]``, or a ``CallableSubject``) on the
    tail ``w`` read from a pack (``tail.pack_tail_weights``), at each seed's inputs times each
    of ``scales``; ``tolerance``: the user's own limit on the worst scaled error; ``name``: the
    rows' label (the pack and layer)."""
    import pandas as pd

    if not isinstance(w, TailWeights):
        raise ValueError(f"w: must be TailWeights (tail.pack_tail_weights), got {validate.describe(w)}")
    subject = as_subject(subject)
    seed_list = [validate.seed("seeds", s) for s in validate.sequence("seeds", list(seeds), what="seeds")]
    scale_list = [
        float(validate.number("scales", s, minimum=0, exclusive_minimum=True))
        for s in validate.sequence("scales", scales, what="positive numbers")
    ]
    fault_list = validate.sequence("faults", faults, what=f"fault names of {tuple(PACK_FAULTS)}", non_empty=False)
    for f in fault_list:
        validate.one_of("faults", f, tuple(PACK_FAULTS))
    user = None if tolerance is None else ("worst", validate.number("tolerance", tolerance, minimum=0))
    flake_rate = validate.number("flake_rate", flake_rate, minimum=0, exclusive_minimum=True, maximum=0.5)
    h, b, f_ = w.shape
    base = {"hidden": h, "branch": b, "ffn": f_, "dtype": w.wo.dtype, "fold": "every linear's", "quant": w.wo.dtype}
    sa = np.asarray(scale_list, dtype=np.float32)[None, :, None]
    # The pack's weights are the same for every seed, so the truth, the reference and the
    # faults run once over all seeds' inputs ([seeds, scales, ...]); the implementation runs a case a call.
    drawn = [random_inputs(w, seed=s) for s in seed_list]
    B = np.stack([d[0] for d in drawn])[:, None, :] * sa
    R = np.stack([d[1] for d in drawn])[:, None, :] * sa
    truth = host_tail(w, B, R)
    with mx.stream(mx.cpu):  # the reference on the CPU, whatever the default device (as check.blocks pins it)
        ref = np.asarray(fused_tail(w, B, R, backend="graph"))
    every = stored_case(w, B, R, name)
    out = np.full(truth.shape, np.nan, dtype=np.float32)
    problems: list[str] = []
    for k, seed in enumerate(seed_list):
        label = f"{name} seed {seed}"
        sc = dataclasses.replace(every, case=label, branch=B[k], residual=R[k])
        for i, (call, want) in enumerate(subject.calls(sc)):
            try:
                got = checked_output(call(), want)
            except SubjectError as e:
                problems.append(f"{label}: {e}")
                continue
            except Exception as e:  # the implementation's own failure is a result of the check, not its crash
                problems.append(f"{label}: raised {type(e).__name__}: {e}")
                continue
            if got.ndim == 2:
                out[k] = got
            else:
                out[k, i] = got
    cols = {"seed": np.repeat(seed_list, len(scale_list)), "scale": np.tile(scale_list, len(seed_list))}
    m, mr = _metrics(out, truth), _metrics(ref, truth)
    cases = pd.DataFrame(
        {
            **base,
            **cols,
            **{k: v.reshape(-1) for k, v in m.items()},
            **{f"ref_{k}": v.reshape(-1) for k, v in mr.items()},
        }
    )
    fframes = []
    for flt in fault_list:
        if applies(flt, every):
            fm = _metrics(packed_faulty_tail(every, flt), truth)
            fframes.append(pd.DataFrame({**base, "fault": flt, **cols, **{k: v.reshape(-1) for k, v in fm.items()}}))
    checked = [
        "each linear's input rotation (its own block and signs) in the truth, the reference and the faults",
        "weights from the pack's stored 2-bit codes, float16 scales and biases (float64 in the truth)",
    ]
    return build_report(
        cases,
        pd.concat(fframes, ignore_index=True) if fframes else None,
        problems,
        user,
        flake_rate,
        getattr(subject, "name", "?"),
        getattr(subject, "kind", "callable"),
        checked=checked,
    )
