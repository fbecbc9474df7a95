"""One check of an implementation under test: seeded cases at several input scales, the
float64 truth of the same stored weights, the workbench's graph tail beside it, the fault
models on the same cases, a tolerance calibrated from the implementation's own errors,
and the verdict (:mod:`workbench.check.verdict`), gathered in a :class:`CheckReport`.

Input scale multiplies both the branch and the residual: a bug such as eps outside the
square root shows only when the activations are small (eps is then no longer negligible
beside the mean square), and hides when they are large.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench import validate
from workbench.check import blocks
from workbench.check import verdict as verdict_mod
from workbench.check.faults import FAULTS, applies, faulty_tail
from workbench.check.stored import StoredCase, stored_case
from workbench.check.subjects import CallableSubject, SubjectError, checked_output
from workbench.check.time_limit import LimitedCaller
from workbench.fold.weights import DENSE_DTYPES
from workbench.studies.calibration import Tolerance, calibrate_tolerance
from workbench.studies.cases import (
    CASE_BLOCK,
    case_arrays,
    case_row_weights,
    check_fold,
    check_quant_fits,
    check_seeds,
    check_shape,
    quant_spec,
)
from workbench.tail.comparison import max_abs_error, nmse, worst_scaled_error
from workbench.tail.frink_case import SEED_TOL
from workbench.tail.paths import fused_tail, host_tail
from workbench.tail.weights import DEFAULT_EPS

if TYPE_CHECKING:  # pandas for the report's tables only: a check imports it when it builds them
    import pandas as pd

#: The input scales a check sweeps by default: small activations (where eps shows) to large.
DEFAULT_SCALES: tuple[float, ...] = (0.01, 1.0, 100.0)

#: The metrics a user's tolerance may be on (columns of the case table).
METRICS: tuple[str, ...] = ("worst", "max_abs", "nmse")


@dataclass
class CheckReport:
    """A check's results: ``cases`` (one row per case and scale), ``faults`` (the same for each
    fault model), the ``tolerances`` judged (name -> (metric, limit)), the ``calibrated``
    tolerance (or None with ``calibration_note``), the per-scale sign tests and the verdict."""

    subject: str
    kind: str
    cases: pd.DataFrame
    faults: pd.DataFrame
    tolerances: dict[str, tuple[str, float]]
    calibrated: Tolerance | None
    calibration_note: str
    tests: list[verdict_mod.ScaleTest]
    problems: list[str]
    user_tolerance: str | None
    reasons: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.reasons

    def error_table(self):
        """Per input scale: the implementation's and the reference's error quantiles, the sign test."""
        import pandas as pd

        rows = []
        for t in self.tests:
            rows.append(
                {
                    "scale": t.scale,
                    "n": t.n,
                    **{f"{k}": v for k, v in t.quantiles.items()},
                    **{f"ref_{k}": v for k, v in t.reference_quantiles.items()},
                    f"past {verdict_mod.RATIO:g}x ref": t.exceed,
                    "rejects at": t.critical,
                    "power": round(t.power, 4),
                }
            )
        return pd.DataFrame(rows).set_index("scale")

    def catch_table(self):
        """Per fault and scale, the share each tolerance catches; the row ``(correct)`` is the
        share of the implementation's own cases each tolerance fails (its flake rate)."""
        import pandas as pd

        frames = []
        for label, df in (("(correct)", self.cases), *((f, g) for f, g in self.faults.groupby("fault", observed=True))):
            part = pd.DataFrame({name: ~(df[m] <= lim) for name, (m, lim) in self.tolerances.items()})
            part["scale"] = df["scale"].to_numpy()
            r = part.groupby("scale").mean()
            r.insert(0, "fault", label)
            frames.append(r.reset_index())
        return pd.concat(frames, ignore_index=True).set_index(["fault", "scale"])

    def figure(self):
        """Histograms of log10 worst error per scale: the implementation beside the reference."""
        import matplotlib.pyplot as plt

        scales = sorted(self.cases["scale"].unique())
        fig, axes = plt.subplots(1, len(scales), figsize=(4 * len(scales), 3), squeeze=False)
        for ax, s in zip(axes[0], scales):
            d = self.cases[self.cases["scale"] == s]
            for col, label in (("worst", self.subject), ("ref_worst", "workbench graph tail")):
                v = d[col].to_numpy()
                v = np.log10(np.maximum(v[np.isfinite(v)], 1e-12))
                ax.hist(v, bins=30, alpha=0.5, label=label)
            ax.set_title(f"input scale {s:g}")
            ax.set_xlabel("log10 worst |x - y| / max(|y|, 1)")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        return fig

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready record (as the benches write): verdict, tolerances, tables."""
        return {
            "kind": "check",
            "subject": self.subject,
            "form": self.kind,
            "passed": self.passed,
            "reasons": self.reasons,
            "problems": self.problems,
            "tolerances": {k: list(v) for k, v in self.tolerances.items()},
            "calibrated": None
            if self.calibrated is None
            else {
                "recommended": self.calibrated.recommended,
                "value": self.calibrated.value,
                "flake_rate": self.calibrated.flake_rate,
                "method": self.calibrated.method,
            },
            "calibration_note": self.calibration_note,
            "test": {
                "name": verdict_mod.TEST_NAME,
                "ratio": verdict_mod.RATIO,
                "null_share": verdict_mod.NULL_SHARE,
                "alpha": verdict_mod.ALPHA,
                "power_against_share": verdict_mod.POWER_SHARE,
            },
            "errors": json.loads(self.error_table().reset_index().to_json(orient="records")),
            "catch_rates": json.loads(self.catch_table().reset_index().to_json(orient="records")),
        }

    def __str__(self) -> str:
        head = f"{'PASS' if self.passed else 'FAIL'}: {self.kind} {self.subject!r}, {len(self.cases)} case runs"
        lines = [head, *("  - " + r for r in self.reasons)]
        lines.append(self.error_table().to_string(float_format=lambda v: f"{v:.3g}"))
        lines.append(self.catch_table().to_string(float_format=lambda v: f"{v:.3f}"))
        return "\n".join(lines)


def _user_tolerance(tolerance: Any) -> tuple[str, float] | None:
    if tolerance is None:
        return None
    if isinstance(tolerance, (tuple, list)) and len(tolerance) == 2:
        metric, limit = tolerance
        validate.one_of("tolerance metric", metric, METRICS)
        return str(metric), validate.number("tolerance limit", limit, minimum=0)
    return "worst", validate.number("tolerance", tolerance, minimum=0)


def _faults(faults: Any) -> tuple[str, ...]:
    """``faults`` as a tuple of fault names (empty: none run); a bare name or a non-sequence
    is refused rather than iterated (``"abc"`` is not three faults)."""
    out = validate.sequence("faults", faults, what=f"fault names of {tuple(FAULTS)}", non_empty=False)
    for f in out:
        validate.one_of("faults", f, tuple(FAULTS))
    return out


def _flake_rate(flake_rate: Any) -> float:
    """Checked here, not only by the calibration: there a bad rate would end as a note
    ("not calibrated") on a report that otherwise looks complete."""
    return validate.number("flake_rate", flake_rate, minimum=0, exclusive_minimum=True, maximum=0.5)


def _subject(subject: Any) -> Any:
    """``subject`` as a form with ``calls`` (a plain callable becomes a :class:`CallableSubject`)."""
    if hasattr(subject, "calls"):
        return subject
    if not callable(subject):
        hint = " (an import path is for `python -m workbench.check`)" if isinstance(subject, str) else ""
        raise ValueError(
            f"subject: must be a callable (case -> output array) or a CallableSubject, "
            f"KernelsFolderSubject or SourceSubject, got {validate.describe(subject)}{hint}"
        )
    return CallableSubject(subject)


def _metric_columns(out: np.ndarray, truth: np.ndarray, ref: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The per-row metrics of ``out`` against ``truth`` (``worst``, ``max_abs``, ``nmse``), and,
    given the graph reference ``ref``, its ``ref_worst``: the one place every table's columns come from."""
    cols = {"worst": worst_scaled_error(out, truth), "max_abs": max_abs_error(out, truth), "nmse": nmse(out, truth)}
    if ref is not None:
        cols["ref_worst"] = worst_scaled_error(ref, truth)
    return cols


def _frame(base: dict[str, Any], seeds: np.ndarray, scales: list[float], metrics: Mapping[str, np.ndarray]):
    """One DataFrame for a block: a row per case and input scale, case-major (as the
    per-case loop wrote them), the ``base`` columns first."""
    import pandas as pd

    n = len(scales)
    cols: dict[str, Any] = {k: [v] * (len(seeds) * n) for k, v in base.items()}
    cols["seed"] = np.repeat(seeds.astype(np.int64), n)
    cols["scale"] = np.tile(np.asarray(scales, dtype=np.float64), len(seeds))
    cols.update({k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in metrics.items()})
    return pd.DataFrame(cols)


def _run_calls(
    subject: Any,
    caller: LimitedCaller,
    scs: list[StoredCase],
    c: Any,
    *,
    scales: list[float],
    dtype: str,
    fold: Any,
    spec: Any,
    eps: float,
    problems: list[str],
) -> np.ndarray:
    """The implementation under test on every case of a block: float32 [S, n, hidden], NaN
    where a call gave no usable result (``problems`` says why, naming the case)."""
    calls, where = [], []
    for i, sc in enumerate(scs):
        name = sc.case
        if isinstance(subject, CallableSubject):
            made = subject.calls(sc)
        else:  # the kernel forms launch the workbench's own TailWeights of the case
            w, _, _ = case_row_weights(c, i, dtype=dtype, fold=fold, spec=spec, eps=eps)
            made = subject.calls(sc, w)
        for j, (call, want) in enumerate(made):
            calls.append(call)
            where.append(
                (i, j if len(made) > 1 else None, want, name if len(made) == 1 else f"{name} scale {scales[j]:g}")
            )
    n_rows, hidden = scs[0].branch.shape[0], scs[0].shape[0]
    out = np.full((len(scs), n_rows, hidden), np.nan, dtype=np.float32)
    for o, (i, j, want, label) in zip(caller.run_all(calls), where):
        if o.timed_out:
            problems.append(f"{label}: no result within the {caller.seconds:g} s limit")
            continue
        if o.error is not None:
            kind = "" if isinstance(o.error, SubjectError) else f"raised {type(o.error).__name__}: "
            problems.append(f"{label}: {kind}{o.error}")
            continue
        try:
            got = checked_output(o.value, want)
        except SubjectError as e:
            problems.append(f"{label}: {e}")
            continue
        if np.isnan(got).any():
            problems.append(f"{label}: NaN in the output")
        if j is None:
            out[i] = got
        else:
            out[i, j] = got
    return out


def check_kernel(
    subject: Any,
    *,
    shapes: Sequence[Sequence[int]] = ((64, 96, 80),),
    seeds: Iterable[int] = range(100),
    scales: Sequence[float] = DEFAULT_SCALES,
    dtypes: Sequence[str] = ("float32",),
    folds: Sequence[Any] = (16,),
    quantize: Sequence[Any] = (None,),
    tolerance: Any = None,
    flake_rate: float = 1e-4,
    faults: Sequence[str] = tuple(FAULTS),
    time_limit: float = 30.0,
    eps: float = DEFAULT_EPS,
) -> CheckReport:
    """Check ``subject`` (a callable, or a form of :mod:`workbench.check.subjects`) on every
    combination of ``shapes`` x ``dtypes`` x ``folds`` x ``quantize`` x ``seeds``, each at every
    input scale. ``tolerance``: the user's own (a limit on ``worst``, or ``(metric, limit)``);
    ``flake_rate``: the per-case rate the calibrated tolerance is set at; ``time_limit``: seconds
    a call may take before its case is reported as hanging.

    The implementation runs one case a call; the truth and the graph reference run a block
    of :data:`~workbench.studies.cases.CASE_BLOCK` cases at a time (:mod:`workbench.check.blocks`:
    the same bits as case by case). ``folds``: ``None`` or block sizes (each case folds
    ``wo``'s input with its own random signs)."""
    import pandas as pd

    subject = _subject(subject)
    user = _user_tolerance(tolerance)
    flake_rate = _flake_rate(flake_rate)
    # The inputs are multiplied in float32; the rows are labelled with the scales as given
    # (0.01, not float32's 0.009999999776...), so a table is indexed by what was asked for.
    scale_labels = [
        float(validate.number("scales", s, minimum=0, exclusive_minimum=True))
        for s in validate.sequence("scales", scales, what="positive numbers")
    ]
    scale_arr = np.array(scale_labels, dtype=np.float32)
    faults = _faults(faults)
    caller = LimitedCaller(validate.number("time_limit", time_limit, minimum=0, exclusive_minimum=True))
    if isinstance(seeds, range):  # a typo'd count must be refused before its seeds are allocated
        validate.within_memory("seeds", len(seeds) * 8, f"{len(seeds)} seeds")
    seed_arr = check_seeds(seeds)
    eps = validate.number("eps", eps, minimum=0, exclusive_minimum=True)
    frames, fframes, problems = [], [], []
    configs = []
    for shp in validate.sequence("shapes", shapes, what="(hidden, branch, ffn) triples"):
        shp = check_shape(shp)
        for dtype in validate.sequence("dtypes", dtypes, what=f"dtypes in {tuple(DENSE_DTYPES)}"):
            validate.one_of("dtypes", dtype, tuple(DENSE_DTYPES))
            for fold in validate.sequence("folds", folds, what="None or block sizes"):
                check_fold(fold, shp)
                for q in validate.sequence("quantize", quantize, what="None, format names or dicts"):
                    qlabel, spec = quant_spec(q)
                    check_quant_fits(spec, shp)
                    configs.append((shp, dtype, fold, qlabel, spec))
    chunks = [seed_arr[k : k + CASE_BLOCK] for k in range(0, len(seed_arr), CASE_BLOCK)]
    for shp, dtype, fold, qlabel, spec in configs:
        base = {"hidden": shp[0], "branch": shp[1], "ffn": shp[2], "dtype": dtype, "fold": str(fold), "quant": qlabel}
        for chunk in chunks:
            c = case_arrays(shp, chunk)
            st = blocks.stored_block(c, dtype=dtype, fold=fold, spec=spec, eps=eps)
            B = c.branch[:, None, :] * scale_arr[None, :, None]
            R = c.residual[:, None, :] * scale_arr[None, :, None]
            truth, ref = blocks.truth(st, B, R), blocks.reference(st, B, R)
            scs = [
                blocks.case(st, i, B[i], R[i], f"shape {shp} {dtype} fold {fold} quant {qlabel} seed {int(s)}")
                for i, s in enumerate(c.seeds)
            ]
            out = _run_calls(
                subject,
                caller,
                scs,
                c,
                scales=scale_labels,
                dtype=dtype,
                fold=fold,
                spec=spec,
                eps=eps,
                problems=problems,
            )
            frames.append(_frame(base, c.seeds, scale_labels, _metric_columns(out, truth, ref)))
            for f in faults:
                if not applies(f, scs[0]):  # a fold and a quantized wo are the same for every case of a block
                    continue
                fo = blocks.faulty(st, B, R, f)
                fframes.append(_frame({**base, "fault": f}, c.seeds, scale_labels, _metric_columns(fo, truth)))
    cases = pd.concat(frames, ignore_index=True)
    fault_df = pd.concat(fframes, ignore_index=True) if fframes else None
    return _report(
        cases, fault_df, problems, user, flake_rate, getattr(subject, "name", "?"), getattr(subject, "kind", "callable")
    )


def check_dump(
    path: Any, *, tolerance: Any = None, flake_rate: float = 1e-4, faults: Sequence[str] = tuple(FAULTS)
) -> CheckReport:
    """Check the outputs an engine dumped (:mod:`workbench.check.dump`: a file, or a folder of
    them): each row of each file against the float64 truth of the file's stored weights,
    beside the workbench's graph tail and the fault models on the same rows (input scale 1:
    the engine's own activations). A file that does not follow the layout is reported by
    name and tensor; the others are still checked."""
    from workbench.check.dump import DumpError, dump_files, read_layer

    user = _user_tolerance(tolerance)
    flake_rate = _flake_rate(flake_rate)
    faults = _faults(faults)
    rows, frows, problems = [], [], []
    for file in dump_files(path):
        try:
            layer = read_layer(file)
        except DumpError as e:
            problems.append(str(e))
            continue
        w, B, R = layer.weights, layer.branch, layer.residual
        truth = host_tail(w, B, R)
        ref = fused_tail(w, B, R, backend="graph")
        out = layer.output
        h, b, f_ = w.shape
        base = {"hidden": h, "branch": b, "ffn": f_, "dtype": w.wo.dtype, "fold": repr(w.wo.fold), "file": file.name}
        metrics = _metric_columns(out, truth, ref)
        for j in range(len(B)):
            rows.append({**base, "seed": j, "scale": 1.0, **{k: float(v[j]) for k, v in metrics.items()}})
        sc = stored_case(w, B, R, file.name)
        for flt in faults:
            if not applies(flt, sc):
                continue
            fo = faulty_tail(sc, flt)
            fm = _metric_columns(fo, truth)
            for j in range(len(B)):
                frows.append({**base, "fault": flt, "seed": j, "scale": 1.0, **{k: float(v[j]) for k, v in fm.items()}})
    if not rows:
        raise ValueError(f"path: no dump file could be read: {problems[0] if problems else 'none found'}")
    import pandas as pd

    return _report(
        pd.DataFrame(rows), pd.DataFrame(frows) if frows else None, problems, user, flake_rate, str(path), "dump"
    )


def _report(
    cases: Any,
    fault_df: Any,
    problems: list[str],
    user: tuple[str, float] | None,
    flake_rate: float,
    name: str,
    kind: str,
) -> CheckReport:
    """The tolerances, calibration, sign tests and verdict over a check's rows (``fault_df``:
    None when no fault model ran)."""
    import pandas as pd

    if fault_df is None:
        fault_df = pd.DataFrame(columns=["fault", "scale", "worst", "max_abs", "nmse"])
    tols: dict[str, tuple[str, float]] = {"frink-models 2e-4": ("worst", SEED_TOL)}
    if user is not None:
        tols["user's"] = user
    calibrated, note = None, ""
    finite = cases["worst"].to_numpy()
    finite = finite[np.isfinite(finite)]
    try:
        calibrated = calibrate_tolerance(finite, flake_rate=flake_rate)
        tols["calibrated"] = calibrated.as_criterion()
        note = str(calibrated)
    except ValueError as e:
        note = f"not calibrated: {e}"
    tests = verdict_mod.sign_tests(cases["scale"].to_numpy(), cases["worst"].to_numpy(), cases["ref_worst"].to_numpy())
    reasons = []
    if problems:
        reasons.append(f"{len(problems)} case run(s) gave no usable result, first: {problems[0]}")
    for tol_name, (metric, limit) in tols.items():
        if tol_name == "calibrated":
            continue
        bad = cases[~(cases[metric] <= limit)]
        if len(bad):
            row = bad.iloc[0]
            reasons.append(
                f"{len(bad)} case run(s) fail the {tol_name} tolerance ({metric} <= {limit:g}), first: seed "
                f"{row['seed']} at scale {row['scale']:g} ({metric} {row[metric]:.3g})"
            )
    for t in tests:
        if t.rejected:
            reasons.append(
                f"at input scale {t.scale:g} the errors are not those of a correct float32 tail: "
                f"{t.exceed} of {t.n} cases are past {verdict_mod.RATIO:g}x the reference's "
                f"(the {verdict_mod.TEST_NAME} rejects at {t.critical}; p = {t.p_value:.2g})"
            )
    return CheckReport(
        subject=name,
        kind=kind,
        cases=cases,
        faults=fault_df,
        tolerances=tols,
        calibrated=calibrated,
        calibration_note=note,
        tests=tests,
        problems=problems,
        user_tolerance=None if user is None else f"{user[0]} <= {user[1]:g}",
        reasons=reasons,
    )
