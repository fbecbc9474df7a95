"""What a check of a recurrent step reports (:class:`StepReport`): per-token errors, the sign
test at each horizon, the growth of the error over tokens, the fault models' catch table
and the first horizon each fault is caught at, and the verdict.

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
        note, tests = "", []
        if "worst" in curves:
            at = {h: _at(curves["worst"], h) for h in horizons}
            try:
                tols["calibrated"] = {
                    h: calibrate_tolerance(v, flake_rate=flake_rate).recommended for h, v in at.items()
                }
                note = f"calibrated at each horizon on the subject's own errors, flake rate {flake_rate:g} a run"
            except ValueError as e:
                note = f"not calibrated: {e}"
            if user is not None:
                tols["user's"] = user
            hcol = np.repeat(np.asarray(horizons, dtype=np.float64), len(runs))
            sub = np.concatenate([at[h] for h in horizons])
            ref = np.concatenate([_at(curves["ref_worst"], h) for h in horizons])
            tests = verdict_mod.sign_tests(hcol, sub, ref)
        growth_ = {k: growth(curves[c]) for k, c in (("subject", "worst"), ("reference", "ref_worst")) if c in curves}
        rep = cls(name, kind, runs, curves, horizons, tests, tols, note, growth_, problems)
        if "worst" in curves:
            rep.reasons = rep._reasons(user)
        return rep

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
        """Per fault (and ``(correct)``: the subject's own flake) and horizon, the share of runs
        each tolerance fails; the reference rule first. ``metric``: ``"worst"`` (the output and
        both states, as the check judges) or ``"out"`` (the output alone, as a test that never
        reads the state sees a step)."""
        import pandas as pd

        if metric not in ("worst", "out"):
            raise ValueError(f"metric: must be 'worst' or 'out', got {metric!r}")
        names = [REFERENCE_RULE, *self.tolerances]
        faults = [k.split(" ", 1)[1] for k in self.curves if k.startswith("fault ")]
        key = "worst" if metric == "worst" else "out"
        series = ([("(correct)", self.curves[key])] if key in self.curves else []) + [
            (f, self.curves[f"{'fault' if metric == 'worst' else 'fault_out'} {f}"]) for f in faults
        ]
        rows = []
        for label, c in series:
            for h in self.horizons:
                v, ref = _at(c, h), _at(self.curves[f"ref_{key}"], h)
                rows.append(
                    {"fault": label, "horizon": h, **{n: float(np.mean(self._fails(v, ref, n, h))) for n in names}}
                )
        return pd.DataFrame(rows).set_index(["fault", "horizon"])

    def first_caught(self, metric: str = "worst"):
        """Per fault and tolerance: the first horizon where it fails at least :data:`CAUGHT_SHARE`
        of runs (``<NA>``: not within the run); ``metric`` as :meth:`catch_table`'s."""
        t = self.catch_table(metric).drop(index="(correct)", level=0, errors="ignore")
        out = {}
        for f, g in t.groupby(level=0, sort=False):
            hs = g.index.get_level_values(1)
            out[f] = {c: next((int(h) for h, v in zip(hs, g[c]) if v >= CAUGHT_SHARE), None) for c in g.columns}
        import pandas as pd

        return pd.DataFrame(out).T.astype("Int64")

    def __str__(self) -> str:
        head = f"{'PASS' if self.passed else 'FAIL'}: part {self.part}, {self.kind} {self.subject!r}, "
        head += f"{len(self.runs)} runs of {self.horizons[-1]} tokens"
        lines = [head, *("  - " + r for r in self.reasons)]
        lines.append(self.error_table().to_string(float_format=lambda v: f"{v:.3g}"))
        for k, (s, lo, hi) in self.growth.items():
            lines.append(f"growth ({k}): slope {s:.3f} [{lo:.3f}, {hi:.3f}] log10 error per log10 token")
        lines.append(self.catch_table().to_string(float_format=lambda v: f"{v:.3f}"))
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
            "growth": {k: list(v) for k, v in self.growth.items()},
            "errors": json.loads(self.error_table().reset_index().to_json(orient="records")),
            "catch_rates": json.loads(self.catch_table().reset_index().to_json(orient="records")),
        }


def _at(curves: np.ndarray, h: int) -> np.ndarray:
    """Each run's worst error over tokens 1..h (NaN anywhere: NaN)."""
    return curves[:, :h].max(axis=1)
