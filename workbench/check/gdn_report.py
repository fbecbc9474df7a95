"""What a check of a recurrent step reports (:class:`StepReport`): per-token errors, the sign
test at each horizon, the growth of the error over tokens, the fault models' catch table
and the first horizon each fault is caught at, and the verdict. It reads as the tail's report
(``workbench.check.report``, whose legend printer and reference row it shares): the catch
table's :data:`~workbench.check.report.REFERENCE_ROW` is the workbench's float32 reference on
the same runs (what each tolerance costs a correct step), the calibrated tolerance is fitted to
a correct step's errors (the subject's own where its verdict passes, the reference's where it
fails; the report says which), and every column is said in words under its table.

Growth: the slope of log10 error against log10 tokens, fitted to the median over runs of the
per-token worst error, with a bootstrap interval over runs; the subject's beside the
reference's. A correct float32 step's error grows like the reference's; a bfloat16 state
adds an error a token that the state keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.check import verdict as verdict_mod
from workbench.check.report import REFERENCE_ROW, legend
from workbench.studies.calibration import calibrate_tolerance

#: The fixed tolerances every catch table holds, on the worst scaled error (the anchors' figures,
#: ``docs/REFERENCE.md``): frink-models' test criterion, FlashInfer's state check.
FIXED_TOLERANCES: dict[str, float] = {"frink-models 2e-4": 2e-4, "FlashInfer 5e-3": 5e-3}

#: A run counts against the subject (and a fault as caught) when its error is past this
#: many times the reference's on the same run: the sign test's per-case rule.
REFERENCE_RULE = f"{verdict_mod.RATIO:g}x reference"

#: A fault is "caught" at the first horizon where a tolerance fails at least this share of runs.
CAUGHT_SHARE = 0.95

#: The subject's growth fails when its slope's interval lies above the reference's by more than this.
SLOPE_MARGIN = 0.25

#: Bootstrap resamples of the slope's interval, and its level.
N_BOOT, LEVEL = 200, 0.95

#: The error table's columns in words, printed under it.
ERROR_LEGEND: dict[str, str] = {
    "horizon": "the first tokens of each run, both states fed back: a run's error is its worst over them",
    "n": "runs (a seed of a condition) judged at the horizon",
    "q50 .. q100": "quantiles (median, 90%, 99%, largest) over runs of the step's worst scaled error "
    "(output and both states)",
    "ref_q50 ..": "the same quantiles for the workbench's float32 reference step on the same runs",
    f"past {verdict_mod.RATIO:g}x ref": f"runs whose error is more than {verdict_mod.RATIO:g}x the reference's",
    "rejects at": "the count at which the sign test says these are not a correct float32 step's errors",
}

#: The catch table in words.
CATCH_LEGEND: dict[str, str] = {
    "rows": f"a fault model (a known bug of recurrent kernels) per row and horizon; {REFERENCE_ROW}: the "
    "workbench's float32 reference step",
    "columns": "a tolerance per column: the share of that row's runs it fails within the horizon's tokens",
    REFERENCE_ROW: "a tolerance's flake rate (what it costs a correct step); a fault row: its catch rate",
    REFERENCE_RULE: "fails a run whose error is past that many times the reference's on the same run "
    "(the sign test's per-run rule; never the reference itself)",
}


@dataclass(frozen=True)
class Condition:
    """One condition's runs: ``base`` (its axes' values), ``seeds``, name -> per-token errors [S, T]."""

    base: dict[str, Any]
    seeds: np.ndarray
    errors: dict[str, np.ndarray]


def condition_frame(base: Mapping[str, Any], seeds: np.ndarray, errors: dict[str, np.ndarray]) -> Condition:
    return Condition(dict(base), np.asarray(seeds), errors)


def growth(curves: np.ndarray, *, seed: int = 0) -> tuple[float, float, float]:
    """``(slope, low, high)``: log10 median error against log10 token (1-based), the interval
    a bootstrap over runs (rows with a NaN left out; all NaN: NaN)."""
    rows = curves[np.isfinite(curves).all(axis=1)]
    if len(rows) == 0:
        return float("nan"), float("nan"), float("nan")
    x = np.log10(np.arange(1, rows.shape[1] + 1))

    def fit(m: np.ndarray) -> float:
        if len(x) < 2:
            return float("nan")
        return float(np.polyfit(x, np.log10(np.maximum(m, 1e-30)), 1)[0])

    rng = np.random.default_rng(seed)
    boots = [fit(np.median(rows[rng.integers(0, len(rows), len(rows))], axis=0)) for _ in range(N_BOOT)]
    lo, hi = np.quantile(boots, [(1 - LEVEL) / 2, (1 + LEVEL) / 2]) if len(x) > 1 else (np.nan, np.nan)
    return fit(np.median(rows, axis=0)), float(lo), float(hi)


@dataclass
class StepReport:
    """A recurrent step's check: ``runs`` (a row a seed and condition), ``curves`` (name ->
    per-token errors [runs, T]: ``worst``, ``out``, ``state`` and the reference's ``ref_*``,
    ``fault <name>``), ``horizons``, the ``tests`` (one :class:`~workbench.check.verdict.ScaleTest`
    a horizon, its ``scale`` the horizon), the tolerances, the ``growth`` slopes and the verdict."""

    subject: str
    kind: str
    runs: Any
    curves: dict[str, np.ndarray]
    horizons: list[int]
    tests: list[verdict_mod.ScaleTest]
    tolerances: dict[str, Any]
    calibration_note: str
    growth: dict[str, tuple[float, float, float]]
    problems: list[str]
    reasons: list[str] = field(default_factory=list)
    part: str = "gdn"
    calibrated_on: str = ""
    flake_rate: float = 1e-3
    #: What the check verified of the subject, in words (where it ran, its guards).
    checked: list[str] = field(default_factory=list)
    #: The reproducers written (``check_step(replay_dir=...)``), one a failing run.
    reproducers: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.reasons

    @classmethod
    def build(
        cls,
        name: str,
        kind: str,
        conds: list[Condition],
        horizons: list[int],
        problems: list[str],
        user: float | None,
        flake_rate: float,
    ) -> StepReport:
        import pandas as pd

        runs = pd.concat(
            [pd.DataFrame({**{k: [v] * len(c.seeds) for k, v in c.base.items()}, "seed": c.seeds}) for c in conds],
            ignore_index=True,
        )
        curves = {k: np.concatenate([c.errors[k] for c in conds]) for k in conds[0].errors}
        if "out" in curves:
            curves["worst"] = np.maximum(curves["out"], curves["state"])  # NaN propagates
        curves["ref_worst"] = np.maximum(curves["ref_out"], curves["ref_state"])
        tols: dict[str, Any] = dict(FIXED_TOLERANCES)
        tests = []
        if "worst" in curves:
            if user is not None:
                tols["user's"] = user
            hcol = np.repeat(np.asarray(horizons, dtype=np.float64), len(runs))
            sub = np.concatenate([_at(curves["worst"], h) for h in horizons])
            ref = np.concatenate([_at(curves["ref_worst"], h) for h in horizons])
            tests = verdict_mod.sign_tests(hcol, sub, ref)
        growth_ = {k: growth(curves[c]) for k, c in (("subject", "worst"), ("reference", "ref_worst")) if c in curves}
        rep = cls(name, kind, runs, curves, horizons, tests, tols, "", growth_, problems)
        if "worst" in curves:
            rep.reasons = rep._reasons(user)
        rep._calibrate(flake_rate)
        return rep

    def _calibrate(self, flake_rate: float) -> None:
        """The tolerance at each horizon fitted to a CORRECT step's errors: the subject's own
        where its verdict passes, else (or with no subject) the reference's on the same runs."""
        own = "worst" in self.curves and not self.reasons
        column = "worst" if own else "ref_worst"
        self.calibrated_on = (
            f"{self.subject}'s own errors (its verdict passes)"
            if own
            else "the workbench's float32 reference's errors on the same runs"
            + (" (the subject's verdict fails)" if "worst" in self.curves else "")
        )
        self.flake_rate = flake_rate
        try:
            fits = {
                h: calibrate_tolerance(_finite(_at(self.curves[column], h)), flake_rate=flake_rate)
                for h in self.horizons
            }
        except ValueError as e:
            self.calibration_note = f"not calibrated: {e}"
            return
        self.tolerances["calibrated"] = {h: f.recommended for h, f in fits.items()}
        self.calibration_note = str(fits[self.horizons[-1]])

    def calibrated_line(self) -> str:
        """The calibrated tolerance in one line: its value at each horizon, its flake rate and
        whose errors it was fitted to."""
        cal = self.tolerances.get("calibrated")
        if cal is None:
            return f"calibrated tolerance: {self.calibration_note}"
        at = ", ".join(f"{v:.2g} within {h}" for h, v in cal.items())
        return (
            f"calibrated tolerance: worst <= {at} token(s), at flake rate {self.flake_rate:g} a run, "
            f"fitted to {self.calibrated_on}"
        )

    def _reasons(self, user: float | None) -> list[str]:
        out = []
        if self.problems:
            out.append(f"{len(self.problems)} run(s) gave no usable result, first: {self.problems[0]}")
        last = self.horizons[-1]
        if user is not None:
            v = _at(self.curves["worst"], last)
            bad = np.flatnonzero(~(v <= user))
            if len(bad):
                out.append(
                    f"{len(bad)} run(s) fail the user's tolerance (worst <= {user:g}) within {last} tokens, "
                    f"first: {self._label(bad[0])} (worst {v[bad[0]]:.3g})"
                )
        for t in self.tests:
            if t.rejected:
                out.append(
                    f"part {self.part}: within {int(t.scale)} token(s) the errors are not those of a correct float32 "
                    f"step: {t.exceed} of {t.n} runs are past {verdict_mod.RATIO:g}x the reference's (the "
                    f"{verdict_mod.TEST_NAME} rejects at {t.critical}; p = {t.p_value:.2g})"
                )
        s, r = self.growth.get("subject"), self.growth.get("reference")
        if s and r and s[1] > r[2] + SLOPE_MARGIN:
            out.append(
                f"part {self.part}: the error grows faster than the reference's over {last} tokens: slope "
                f"{s[0]:.2f} [{s[1]:.2f}, {s[2]:.2f}] against {r[0]:.2f} [{r[1]:.2f}, {r[2]:.2f}] (log10 error per "
                "log10 token)"
            )
        return out

    def _label(self, i: int) -> str:
        row = self.runs.iloc[int(i)]
        return ", ".join(f"{k} {row[k]}" for k in self.runs.columns)

    def _fails(self, v: np.ndarray, ref: np.ndarray, tol: str, h: int) -> np.ndarray:
        if tol == REFERENCE_RULE:
            return ~(v <= verdict_mod.RATIO * ref)
        lim = self.tolerances[tol]
        return ~(v <= (lim[h] if isinstance(lim, Mapping) else lim))

    def error_table(self):
        """Per horizon: the subject's and the reference's worst-error quantiles over runs, the sign test."""
        import pandas as pd

        rows = [
            {
                "horizon": int(t.scale),
                "n": t.n,
                **t.quantiles,
                **{f"ref_{k}": v for k, v in t.reference_quantiles.items()},
                f"past {verdict_mod.RATIO:g}x ref": t.exceed,
                "rejects at": t.critical,
            }
            for t in self.tests
        ]
        return pd.DataFrame(rows).set_index("horizon")

    def token_quantiles(self, name: str = "worst", q: float = 0.5) -> np.ndarray:
        """The ``q`` quantile over runs of ``name``'s per-token error (NaN runs left out)."""
        c = self.curves[name]
        return np.nanquantile(c, q, axis=0)

    def catch_table(self, metric: str = "worst"):
        """Per fault (and :data:`~workbench.check.report.REFERENCE_ROW`: the workbench's float32
        reference on the same runs, what each tolerance costs a correct step) and horizon, the
        share of runs each tolerance fails; the reference rule first. ``metric``: ``"worst"``
        (the output and both states, as the check judges) or ``"out"`` (the output alone, as a
        test that never reads the state sees a step). Columns in words: :data:`CATCH_LEGEND`."""
        key = _metric(metric)
        faults = [k.split(" ", 1)[1] for k in self.curves if k.startswith("fault ")]
        series = [(REFERENCE_ROW, self.curves[f"ref_{key}"])]
        series += [(f, self.curves[f"{'fault' if key == 'worst' else 'fault_out'} {f}"]) for f in faults]
        return self._shares(series, key, "fault")

    def subject_table(self, metric: str = "worst"):
        """The subject's own runs as a row of :meth:`catch_table`: per horizon, the share of its
        runs each tolerance fails (a bug's catch rate, when the subject has one)."""
        key = _metric(metric)
        if key not in self.curves:
            raise ValueError("subject_table: this check ran no subject (only the reference and the fault models)")
        return self._shares([(self.subject, self.curves[key])], key, "subject").droplevel(0)

    def _shares(self, series: list, key: str, label: str):
        import pandas as pd

        names = [REFERENCE_RULE, *self.tolerances]
        rows = []
        for name, c in series:
            for h in self.horizons:
                v, ref = _at(c, h), _at(self.curves[f"ref_{key}"], h)
                rows.append(
                    {label: name, "horizon": h, **{n: float(np.mean(self._fails(v, ref, n, h))) for n in names}}
                )
        return pd.DataFrame(rows).set_index([label, "horizon"])

    def first_caught(self, metric: str = "worst"):
        """Per fault and tolerance: the first horizon where it fails at least :data:`CAUGHT_SHARE`
        of runs (``<NA>``: not within the run); ``metric`` as :meth:`catch_table`'s."""
        t = self.catch_table(metric).drop(index=REFERENCE_ROW, level=0)
        out = {}
        for f, g in t.groupby(level=0, sort=False):
            hs = g.index.get_level_values(1)
            out[f] = {c: next((int(h) for h, v in zip(hs, g[c]) if v >= CAUGHT_SHARE), None) for c in g.columns}
        import pandas as pd

        return pd.DataFrame(out).T.astype("Int64")

    def __str__(self) -> str:
        head = f"{'PASS' if self.passed else 'FAIL'}: part {self.part}, {self.kind} {self.subject!r}, "
        head += f"{len(self.runs)} runs of {self.horizons[-1]} tokens"
        lines = [head, *("  - " + r for r in self.reasons), self.calibrated_line()]
        lines.append(self.error_table().to_string(float_format=lambda v: f"{v:.3g}"))
        lines.append(legend(ERROR_LEGEND))
        for k, (s, lo, hi) in self.growth.items():
            lines.append(f"growth ({k}): slope {s:.3f} [{lo:.3f}, {hi:.3f}] log10 error per log10 token")
        lines.append(self.catch_table().to_string(float_format=lambda v: f"{v:.3f}"))
        lines.append(legend(CATCH_LEGEND))
        lines += ["checked: " + c for c in self.checked]
        return "\n".join(lines)

    def to_record(self) -> dict[str, Any]:
        import json

        def tol(v: Any) -> Any:
            return {str(h): x for h, x in v.items()} if isinstance(v, Mapping) else v

        return {
            "kind": "check",
            "part": self.part,
            "subject": self.subject,
            "form": self.kind,
            "passed": self.passed,
            "reasons": self.reasons,
            "problems": self.problems,
            "horizons": self.horizons,
            "tolerances": {k: tol(v) for k, v in self.tolerances.items()},
            "calibration_note": self.calibration_note,
            "calibrated_on": self.calibrated_on,
            "flake_rate": self.flake_rate,
            "growth": {k: list(v) for k, v in self.growth.items()},
            "errors": json.loads(self.error_table().reset_index().to_json(orient="records")),
            "catch_rates": json.loads(self.catch_table().reset_index().to_json(orient="records")),
        }


def _at(curves: np.ndarray, h: int) -> np.ndarray:
    """Each run's worst error over tokens 1..h (NaN anywhere: NaN)."""
    return curves[:, :h].max(axis=1)


def _finite(v: np.ndarray) -> np.ndarray:
    return v[np.isfinite(v)]


def _metric(metric: str) -> str:
    if metric not in ("worst", "out"):
        raise ValueError(f"metric: must be 'worst' or 'out', got {metric!r}")
    return metric
