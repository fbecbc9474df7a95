"""A check's report (:class:`CheckReport`) and how it is built from the check's rows
(:func:`build_report`): the tolerances judged, the tolerance calibrated on a CORRECT tail's
errors (the implementation's own where its verdict passes, the workbench reference's where
it fails), the sign tests, the second run's bits, the verdict and its reasons, notes (the
reference itself past the user's tolerance; a rounding-level nondeterminism), what the check
verified, the tables with their columns in words, and the figure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.check import verdict as verdict_mod
from workbench.studies.calibration import Tolerance, calibrate_tolerance
from workbench.tail.frink_case import SEED_TOL

if TYPE_CHECKING:  # pandas for the report's tables only
    import pandas as pd

#: The catch table's row of the workbench's own reference (a correct float32 tail) on the
#: check's cases: what each tolerance costs a correct implementation.
REFERENCE_ROW = "(reference)"

#: The error table's columns in words, printed under it.
ERROR_LEGEND: dict[str, str] = {
    "n": "case runs at this input scale",
    "q50 .. q100": "quantiles (median, 90%, 99%, largest) of the implementation's worst scaled error per case",
    "ref_q50 ..": "the same quantiles for the workbench reference on the same cases",
    f"past {verdict_mod.RATIO:g}x ref": f"cases whose error is more than {verdict_mod.RATIO:g}x the reference's",
    "rejects at": "the count at which the sign test says these are not a correct float32 tail's errors",
    "power": f"the test's chance to reject when {verdict_mod.POWER_SHARE:.0%} of cases are past the ratio",
}

#: The catch table in words.
CATCH_LEGEND: dict[str, str] = {
    "rows": f"a fault model (a known kernel bug) per row; {REFERENCE_ROW}: the workbench's own correct tail",
    "columns": "a tolerance per column: the share of that row's cases it fails at each input scale",
    REFERENCE_ROW: "a tolerance's flake rate (what it costs a correct tail); a fault row: its catch rate",
}


def legend(words: dict[str, str]) -> str:
    """A table's columns (or rows) in words, one indented line each, as printed under the table."""
    width = max(len(k) for k in words)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in words.items())


@dataclass
class CheckReport:
    """A check's results: ``cases`` (one row per case and scale), ``faults`` (the same for each
    fault model), the ``tolerances`` judged (name -> (metric, limit)), the ``calibrated``
    tolerance (or None with ``calibration_note``) and ``calibrated_on`` (whose errors it was
    fitted to), the per-scale sign tests, the verdict's ``reasons``, ``notes`` that do not fail
    it, ``determinism`` (the second run's verdict) and ``checked`` (what the check verified)."""

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
    calibrated_on: str = ""
    notes: list[str] = field(default_factory=list)
    determinism: str = "not run"
    checked: list[str] = field(default_factory=list)
    reproducers: list[str] = field(default_factory=list)
    flake_rate: float = 1e-4  # the calibration's per-case rate: a merge of shards calibrates at the same

    @property
    def passed(self) -> bool:
        return not self.reasons

    def error_table(self):
        """Per input scale: the implementation's and the reference's error quantiles, the sign
        test (the columns in words: :data:`ERROR_LEGEND`)."""
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
        """Per fault and scale, the share of cases each tolerance fails (its catch rate); the row
        :data:`REFERENCE_ROW` is the share of the workbench reference's cases it fails (the flake
        rate it costs a correct tail), never the implementation's own."""
        import pandas as pd

        ref_cols = {m: self.cases[f"ref_{m}"] for m in ("worst", "max_abs", "nmse") if f"ref_{m}" in self.cases}
        ref = pd.DataFrame({**ref_cols, "scale": self.cases["scale"]})
        frames = []
        groups = self.faults.groupby("fault", observed=True)
        for label, df in ((REFERENCE_ROW, ref), *((f, g) for f, g in groups)):
            part = pd.DataFrame({name: ~(df[m] <= lim) for name, (m, lim) in self.tolerances.items()})
            part["scale"] = df["scale"].to_numpy()
            r = part.groupby("scale").mean()
            r.insert(0, "fault", label)
            frames.append(r.reset_index())
        return pd.concat(frames, ignore_index=True).set_index(["fault", "scale"])

    def figure(self):
        """Histograms of each case's worst scaled error per input scale, the implementation beside
        the reference, one x range, the tolerances drawn (:mod:`workbench.check.report_figure`)."""
        from workbench.check.report_figure import check_figure

        return check_figure(self)

    def calibrated_line(self) -> str:
        """The calibrated tolerance in one line: its value, flake rate and whose errors it fits."""
        if self.calibrated is None:
            return f"calibrated tolerance: {self.calibration_note}"
        c = self.calibrated
        return (
            f"calibrated tolerance: worst <= {c.recommended:.2g} at flake rate {c.flake_rate:g} a case, "
            f"fitted to {self.calibrated_on}"
        )

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready record (as the benches write): verdict, tolerances, tables."""
        return {
            "kind": "check",
            "subject": self.subject,
            "form": self.kind,
            "passed": self.passed,
            "reasons": self.reasons,
            "notes": self.notes,
            "problems": self.problems,
            "checked": self.checked,
            "determinism": self.determinism,
            "reproducers": self.reproducers,
            "tolerances": {k: list(v) for k, v in self.tolerances.items()},
            "calibrated": None
            if self.calibrated is None
            else {
                "recommended": self.calibrated.recommended,
                "value": self.calibrated.value,
                "flake_rate": self.calibrated.flake_rate,
                "method": self.calibrated.method,
                "fitted_to": self.calibrated_on,
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
        lines += [*("  note: " + n for n in self.notes), self.calibrated_line(), f"determinism: {self.determinism}"]
        lines += ["checked:", *("  - " + c for c in self.checked)] if self.checked else []
        if self.reproducers:
            lines.append(f"reproducers: {len(self.reproducers)} written ({self.reproducers[0]} ..)")
        lines.append(self.error_table().to_string(float_format=lambda v: f"{v:.3g}"))
        lines.append(legend(ERROR_LEGEND))
        lines.append(self.catch_table().to_string(float_format=lambda v: f"{v:.3f}"))
        lines.append(legend(CATCH_LEGEND))
        return "\n".join(lines)


def _determinism(cases: Any) -> tuple[str, list[str], list[str]]:
    """The second run's verdict line, its failing reasons and its notes (``rerun_diff``: 0 for
    the same bits; a difference past RATIO x the reference's error is more than rounding)."""
    if "rerun_diff" not in cases:
        return "not run (the outputs were given, not computed here)", [], []
    d, ref = cases["rerun_diff"].to_numpy(), cases["ref_worst"].to_numpy()
    differ = ~(d == 0)
    beyond = differ & ~(d <= verdict_mod.RATIO * np.maximum(ref, np.finfo(np.float32).eps))
    n = len(d)
    how = "on a second run in the reverse order, with fresh copies of the inputs"
    if not differ.any():
        return f"deterministic: the same bits on all {n} case runs {how}", [], []
    if beyond.any():
        row = cases[beyond].iloc[0]
        reason = (
            f"{int(beyond.sum())} of {n} case run(s) gave a different result {how}, beyond rounding "
            f"(first: {case_label(row)}, difference {row['rerun_diff']:.3g}): state kept "
            "between calls, or a cache keyed by input identity"
        )
        return f"NOT deterministic: {reason}", [reason], []
    note = (
        f"{int(differ.sum())} of {n} case run(s) gave other bits {how}, at rounding level (largest difference "
        f"{np.nanmax(d):.3g}, within {verdict_mod.RATIO:g}x the reference's error): legitimately nondeterministic "
        "(e.g. float atomics), reported, not failed"
    )
    return f"nondeterministic at rounding level: {note}", [], [note]


def _reference_past_user(cases: Any, user: tuple[str, float] | None) -> list[str]:
    """A note when the workbench's own reference fails the user's tolerance on some cases."""
    if user is None or f"ref_{user[0]}" not in cases:
        return []
    metric, limit = user
    bad = cases[~(cases[f"ref_{metric}"] <= limit)]
    if not len(bad):
        return []
    row = bad.iloc[0]
    return [
        f"the workbench's own reference exceeds your tolerance ({metric} <= {limit:g}) on {len(bad)} of "
        f"{len(cases)} case run(s) (first: {case_label(row)}, {row[f'ref_{metric}']:.3g}): "
        "a correct float32 tail fails it there; the tolerance is tighter than float32 rounding allows"
    ]


def case_label(row: Any) -> str:
    """A case run in words: a dumped row by its file and row, a seeded case by its seed and scale."""
    file = row.get("file") if hasattr(row, "get") else None
    if isinstance(file, str):
        return f"{file} row {int(row['seed'])}"
    return f"seed {row['seed']} at scale {row['scale']:g}"


def _in_files(rows: Any) -> str:
    """For a dump's rows: `` in N file(s): a, b``, every file named; empty for seeded cases."""
    if "file" not in rows or not len(rows):
        return ""
    names = list(dict.fromkeys(str(f) for f in rows["file"]))
    return f", in {len(names)} file(s): {', '.join(names)}"


def build_report(
    cases: Any,
    fault_df: Any,
    problems: list[str],
    user: tuple[str, float] | None,
    flake_rate: float,
    name: str,
    kind: str,
    checked: list[str] | None = None,
) -> CheckReport:
    """The tolerances, calibration, sign tests and verdict over a check's rows (``fault_df``:
    None when no fault model ran); ``checked``: what the check verified, in words."""
    import pandas as pd

    if fault_df is None:
        fault_df = pd.DataFrame(columns=["fault", "scale", "worst", "max_abs", "nmse"])
    tols: dict[str, tuple[str, float]] = {"frink-models 2e-4": ("worst", SEED_TOL)}
    if user is not None:
        tols["user's"] = user
    tests = verdict_mod.sign_tests(cases["scale"].to_numpy(), cases["worst"].to_numpy(), cases["ref_worst"].to_numpy())
    reasons = []
    if problems and kind == "dump":  # every file not read, each with what is wrong
        reasons += [f"file not read: {p}" for p in problems]
    elif problems:
        reasons.append(f"{len(problems)} case run(s) gave no usable result, first: {problems[0]}")
    for tol_name, (metric, limit) in tols.items():
        bad = cases[~(cases[metric] <= limit)]
        if len(bad):
            row = bad.iloc[0]
            reasons.append(
                f"{len(bad)} case run(s) fail the {tol_name} tolerance ({metric} <= {limit:g}){_in_files(bad)}, "
                f"first: {case_label(row)} ({metric} {row[metric]:.3g})"
            )
    past = ~(cases["worst"] <= verdict_mod.RATIO * cases["ref_worst"])
    for t in tests:
        if t.rejected:
            reasons.append(
                f"at input scale {t.scale:g} the errors are not those of a correct float32 tail: "
                f"{t.exceed} of {t.n} cases are past {verdict_mod.RATIO:g}x the reference's"
                f"{_in_files(cases[past & (cases['scale'] == t.scale)])} "
                f"(the {verdict_mod.TEST_NAME} rejects at {t.critical}; p = {t.p_value:.2g})"
            )
    determinism, rerun_reasons, notes = _determinism(cases)
    reasons += rerun_reasons
    notes = _reference_past_user(cases, user) + notes
    # Fitted to a CORRECT tail's errors: the implementation's own only where nothing failed it
    own = not reasons
    column = "worst" if own else "ref_worst"
    on = (
        f"{name}'s own errors (its verdict passes)"
        if own
        else "the workbench reference's errors on the same cases (the implementation's verdict fails)"
    )
    calibrated, note = None, ""
    errors = cases[column].to_numpy()
    try:
        calibrated = calibrate_tolerance(errors[np.isfinite(errors)], flake_rate=flake_rate)
        tols["calibrated"] = calibrated.as_criterion()
        note = str(calibrated)
    except ValueError as e:
        note = f"not calibrated: {e}"
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
        calibrated_on=on,
        notes=notes,
        determinism=determinism,
        checked=list(checked or []),
        flake_rate=float(flake_rate),
    )
