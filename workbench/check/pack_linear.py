"""One packed linear of a Hadamard pack checked on its own: ``y = W' (R x)``, each module its own rotation.

The tail (:mod:`workbench.check.pack_run`) covers wo and the MLP; the other packed modules
are projections a user's kernel also computes: the attention's ``q_proj`` / ``k_proj`` /
``v_proj`` and a recurrent layer's ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` /
``in_proj_a`` / ``out_proj`` (the Gated DeltaNet step part takes the projections' outputs,
so its check holds no weights). :func:`check_packed_linear` judges an implementation of one
such module (``x [n, in] -> [n, out]``) against the float64 truth of the stored codes with
the module's rotation, beside the workbench's float32 reference (the same rotation through
``mx.hadamard_transform``, then ``mx.quantized_matmul``, on the CPU), with its faults: the
rotation skipped, applied with another module's signs (``others``), the float16 scales and
biases read as bfloat16, and the verdict of :func:`workbench.check.report.build_report`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.check.report import CheckReport, build_report
from workbench.check.run import DEFAULT_SCALES
from workbench.check.subjects import checked_output
from workbench.fold.affine_codes import dequantize_float64
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.fold.weights import QuantizedBase, WeightMatrix
from workbench.tail.comparison import max_abs_error, nmse, worst_scaled_error

#: fault name -> what it does (``signs_of_<name>`` for each module of ``others`` whose width fits).
LINEAR_FAULTS: dict[str, str] = {
    "rotation_skipped": "the module's input rotation not applied",
    "signs_of_<other>": "the input rotated with another module's signs (same width)",
    "scales_bfloat16": "the float16 scales and biases read as bfloat16 (rounded to 8 significant bits)",
}


def _bf16(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.bfloat16).astype(mx.float32))


def faulty_linear(m: WeightMatrix, x: np.ndarray, rotation: HadamardFold | None, bf16: bool) -> np.ndarray:
    """The float32 product with ``rotation`` in place of the module's, and the scales as read."""
    base, _ = m.launch_parts()
    if bf16:
        w = dequantize_float64(
            np.asarray(base.w),
            _bf16(base.scales),
            _bf16(base.biases),
            bits=base.spec.bits,
            group_size=base.spec.group_size,
        ).astype(np.float32)
    else:
        w = m.dense(np.float32)
    if rotation is not None:
        x = rotation.rotate(x).astype(np.float32)
    return x @ w.T


def _metrics(out: np.ndarray, truth: np.ndarray) -> dict[str, np.ndarray]:
    return {"worst": worst_scaled_error(out, truth), "max_abs": max_abs_error(out, truth), "nmse": nmse(out, truth)}


def check_packed_linear(
    subject: Callable[[Any], Any],
    m: WeightMatrix,
    *,
    others: Mapping[str, WeightMatrix] | None = None,
    seeds: Iterable[int] = range(100),
    scales: Sequence[float] = DEFAULT_SCALES,
    tolerance: float | None = None,
    flake_rate: float = 1e-4,
    name: str = "packed linear",
) -> CheckReport:
    """Check ``subject`` (``x`` float32 numpy [n, in] -> [n, out], any array kind) computing the
    packed module ``m`` (``HadamardPack.matrix``), at each seed's inputs (uniform in [-1, 1))
    times each of ``scales``; ``others``: modules whose signs the faults borrow."""
    import pandas as pd

    if not isinstance(m, WeightMatrix) or not isinstance(m.launch_parts()[0], QuantizedBase):
        raise ValueError(f"m: must be a quantized WeightMatrix (HadamardPack.matrix), got {validate.describe(m)}")
    if not callable(subject):
        raise ValueError(f"subject: must be a callable x [n, in] -> [n, out], got {validate.describe(subject)}")
    fold = m.fold
    if fold is not None and fold.site is not FoldSite.INPUT:
        raise ValueError("m: a packed linear's rotation sits at its INPUT (HadamardQuantizedLinear)")
    seed_list = [validate.seed("seeds", s) for s in validate.sequence("seeds", list(seeds), what="seeds")]
    scale_list = [
        float(validate.number("scales", s, minimum=0, exclusive_minimum=True))
        for s in validate.sequence("scales", scales, what="positive numbers")
    ]
    user = None if tolerance is None else ("worst", validate.number("tolerance", tolerance, minimum=0))
    flake_rate = validate.number("flake_rate", flake_rate, minimum=0, exclusive_minimum=True, maximum=0.5)
    out_dim, in_dim = m.shape
    sa = np.asarray(scale_list, dtype=np.float32)[None, :, None]
    x = np.stack([np.random.default_rng(s).uniform(-1, 1, in_dim).astype(np.float32) for s in seed_list])[:, None] * sa
    x64 = x.astype(np.float64)
    truth = (fold.rotate(x64) if fold is not None else x64) @ m.dense(np.float64).T
    with mx.stream(mx.cpu):
        ref = np.array(m.apply(mx.array(x)))
    out = np.full(truth.shape, np.nan, dtype=np.float32)
    problems: list[str] = []
    for k, seed in enumerate(seed_list):
        try:
            out[k] = checked_output(subject(x[k].copy()), (len(scale_list), out_dim))
        except Exception as e:  # the implementation's failure is the check's result, not its crash
            problems.append(f"{name} seed {seed}: {type(e).__name__}: {e}")
    base = {"hidden": out_dim, "branch": in_dim, "ffn": 0, "dtype": m.dtype, "fold": repr(fold), "quant": m.dtype}
    cols = {"seed": np.repeat(seed_list, len(scale_list)), "scale": np.tile(scale_list, len(seed_list))}
    mo, mr = _metrics(out, truth), _metrics(ref, truth)
    cases = pd.DataFrame(
        {
            **base,
            **cols,
            **{k: v.reshape(-1) for k, v in mo.items()},
            **{f"ref_{k}": v.reshape(-1) for k, v in mr.items()},
        }
    )
    faults: dict[str, np.ndarray] = {}
    if fold is not None:
        faults["rotation_skipped"] = faulty_linear(m, x, None, False)
        for other, om in (others or {}).items():
            of = om.fold
            if (
                of is not None
                and of.signs is not None
                and of.signs.size == in_dim
                and not np.array_equal(of.signs, fold.signs)
            ):
                faults[f"signs_of_{other}"] = faulty_linear(m, x, HadamardFold(fold.block, signs=of.signs), False)
    faults["scales_bfloat16"] = faulty_linear(m, x, fold, True)
    frames = [
        pd.DataFrame({**base, "fault": f, **cols, **{k: v.reshape(-1) for k, v in _metrics(fo, truth).items()}})
        for f, fo in faults.items()
    ]
    checked = [f"{name}: its own input rotation ({fold!r}) and 2-bit codes, truth in float64 from the codes"]
    return build_report(
        cases, pd.concat(frames, ignore_index=True), problems, user, flake_rate, name, "callable", checked=checked
    )
