"""One check of an attention head: seeded cases over specs, input scales and positions, the
float64 truth and the workbench's float32 reference (MLX) on the same cases, the fault
models beside them, and a verdict (:class:`~workbench.check.head_report.HeadReport`).

A case's error is the worst element's scaled error ``|x - y| / max(|y|, 1)`` over every
tensor the head returns (q, k, v and the gate) against the truth; the paired sign test
(:mod:`workbench.check.verdict`) asks, condition by condition (a spec, an input scale, a
position), whether the subject's errors are those of a correct float32 head beside the
reference's on the same cases.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from workbench import validate
from workbench.check.head_cases import DEFAULT_POSITIONS, HEAD_SCALES, draw_head_cases
from workbench.check.head_math import HEAD_FAULTS, applies, head_block
from workbench.check.head_mlx import head_reference
from workbench.check.head_report import HeadReport
from workbench.check.head_spec import DEFAULT_HEAD_SPECS, HeadSpec
from workbench.check.head_subjects import CallableHead, checked_head
from workbench.check.subjects import SubjectError
from workbench.studies.cases import check_seeds

#: The part's label in every message a check writes.
PART = "head"


def scaled_errors(x: dict[str, np.ndarray], truth: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per tensor, each case's worst ``|x - y| / max(|y|, 1)`` (float64; a NaN anywhere: NaN)."""
    out = {}
    for k, y in truth.items():
        d = np.abs(np.asarray(x[k], np.float64) - y) / np.maximum(np.abs(y), 1.0)
        bad = ~np.isfinite(d).all(axis=1)
        w = np.where(bad, np.nan, np.nanmax(np.where(np.isfinite(d), d, 0), axis=1))
        out[k] = w
    return out


def worst(per_tensor: dict[str, np.ndarray]) -> np.ndarray:
    """The worst over tensors, a NaN in any carried."""
    return np.max(np.stack(list(per_tensor.values())), axis=0)


def _subject(subject: Any) -> Any:
    if subject is None or hasattr(subject, "prepare"):
        return subject
    if not callable(subject):
        raise ValueError(
            "subject: must be a callable (HeadInputs -> (q, k, v[, gate])) or a CallableHead, KernelsFolderHead "
            f"or HeadSource, got {validate.describe(subject)}"
        )
    return CallableHead(subject)


def _specs(specs: Any) -> list[HeadSpec]:
    items = [specs] if isinstance(specs, (str, HeadSpec)) else validate.sequence("specs", specs, what="head specs")
    out = []
    for s in items:
        if isinstance(s, HeadSpec):
            out.append(s)
        elif isinstance(s, str) and s in DEFAULT_HEAD_SPECS:
            out.append(DEFAULT_HEAD_SPECS[s])
        else:
            raise ValueError(
                f"specs: each must be a HeadSpec or one of {tuple(DEFAULT_HEAD_SPECS)}, got {validate.describe(s)}"
            )
    return out


def _run_subject(
    call: Callable | None, cases: Any, position: int, labels: list[str], problems: list[str], why: str = ""
) -> dict[str, np.ndarray]:
    """The subject's tensors [S, width] for every case (a case that fails: NaN, its problem named)."""
    spec = cases.spec
    got = {k: np.full((len(labels), spec.output_shape(k)[0]), np.nan, np.float32) for k in spec.outputs}
    for i, label in enumerate(labels):
        if call is None:
            problems.append(f"part {PART}, {label}: {why}")
            continue
        try:
            one = checked_head(call(cases.inputs(i, position, label)), spec)
        except SubjectError as e:
            problems.append(f"part {PART}, {label}: {e}")
            continue
        except Exception as e:  # a subject's crash is this case's verdict, not the check's
            problems.append(f"part {PART}, {label}: raised {type(e).__name__}: {e}")
            continue
        for k, v in one.items():
            got[k][i] = v
            if not np.isfinite(v).all():
                problems.append(f"part {PART}, {label}: tensor {k}: not finite (NaN or inf)")
                break
    return got


def run_condition(
    subject: Any,
    spec: HeadSpec,
    seeds: np.ndarray,
    scale: float,
    position: int,
    faults: Sequence[str],
    problems: list[str],
    call: Callable | None = None,
    why: str = "",
) -> dict[str, np.ndarray]:
    """One condition's errors a case: ``subject`` and ``subject <tensor>`` (when a subject is
    run), ``reference``, ``fault <name>`` (NaN where the fault changes nothing in ``spec``)."""
    cases = draw_head_cases(spec, seeds, scale=scale)
    pos = np.full(len(seeds), int(position))
    truth = head_block(spec, cases.weights.astype(np.float64), cases.hidden, pos)
    err = {"reference": worst(scaled_errors(head_reference(spec, cases.weights, cases.hidden, position), truth))}
    for f in faults:
        if applies(f, spec):
            err[f"fault {f}"] = worst(scaled_errors(head_block(spec, cases.weights, cases.hidden, pos, fault=f), truth))
        else:
            err[f"fault {f}"] = np.full(len(seeds), np.nan)
    if subject is not None:
        labels = [f"case {spec.label} scale {scale:g} position {position} seed {int(s)}" for s in seeds]
        per = scaled_errors(_run_subject(call, cases, position, labels, problems, why), truth)
        err["subject"] = worst(per)
        err |= {f"subject {k}": v for k, v in per.items()}
    return err


def check_head(
    subject: Any,
    *,
    specs: Any = ("model",),
    seeds: Iterable[int] = range(20),
    scales: Sequence[float] = HEAD_SCALES,
    positions: Sequence[int] = DEFAULT_POSITIONS,
    tolerance: float | None = None,
    faults: Sequence[str] = tuple(HEAD_FAULTS),
) -> HeadReport:
    """Check ``subject`` (a callable ``HeadInputs -> (q, k, v[, gate])``, or a form of
    :mod:`workbench.check.head_subjects`; None: the faults and the reference alone) on one
    case a seed and condition: ``specs`` (:class:`HeadSpec` objects or names of
    ``DEFAULT_HEAD_SPECS``: ``"launch"``, ``"model"``) x ``scales`` (the hidden state's) x
    ``positions`` (a spec without RoPE at position 0 only). ``tolerance``: the user's own
    limit on the worst scaled error."""
    subject = _subject(subject)
    spec_list = _specs(specs)
    seed_arr = check_seeds(seeds)
    sc = [
        float(validate.number("scales", s, minimum=0, exclusive_minimum=True))
        for s in validate.sequence("scales", scales, what="positive numbers")
    ]
    given = validate.sequence("positions", positions, what="token positions >= 0")
    ps = sorted({validate.integer("positions", p, minimum=0, maximum=1 << 24) for p in given})
    flt = validate.sequence("faults", faults, what=f"fault names of {tuple(HEAD_FAULTS)}", non_empty=False)
    for f in flt:
        validate.one_of("faults", f, tuple(HEAD_FAULTS))
    user = None if tolerance is None else validate.number("tolerance", tolerance, minimum=0)
    conds, problems = [], []
    for spec in spec_list:
        call, why = None, ""
        if subject is not None:
            try:
                call = subject.prepare(spec)
            except Exception as e:  # a kernel that does not build is every case's verdict, not a crash
                why = f"could not be prepared: {type(e).__name__}: {e}"
        for scale in sc:
            for position in ps if spec.rotary_dim else [0]:
                err = run_condition(subject, spec, seed_arr, scale, position, flt, problems, call, why)
                base = {"spec": spec.label, "scale": scale, "position": position}
                conds.append((base, seed_arr, err))
    name = "" if subject is None else getattr(subject, "name", "?")
    kind = "" if subject is None else getattr(subject, "kind", "callable")
    return HeadReport.build(name, kind, conds, problems, user)
