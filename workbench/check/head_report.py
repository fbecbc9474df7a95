"""What a check of an attention head reports (:class:`HeadReport`): each case's worst scaled
error beside the reference's, the sign test a condition (a spec, an input scale, a
position), the fault models' catch and flake rates under each tolerance, where each fault
is caught, and the verdict.

A fault's catch rate under a tolerance is the share of the cases it changes (those of
specs it applies to) that the tolerance fails; a tolerance's flake rate is the share of a
CORRECT float32 head's cases it fails: the reference's, and the subject's own when it
passes. A tolerance is worth its catches only beside its flakes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.check import verdict as verdict_mod

#: The fixed tolerances every catch table holds, on the worst scaled error (as the step's:
#: frink-models' test criterion, FlashInfer's looser one, ``docs/REFERENCE.md``).
FIXED_TOLERANCES: dict[str, float] = {"frink-models 2e-4": 2e-4, "FlashInfer 5e-3": 5e-3}

#: A case counts against the subject (and a fault as caught) when its error is past this
#: many times the reference's on the same case: the sign test's per-case rule.
REFERENCE_RULE = f"{verdict_mod.RATIO:g}x reference"

#: A fault is "caught" in a condition where the reference rule fails at least this share of its cases.
CAUGHT_SHARE = 0.95


@dataclass
class HeadReport:
    """A head's check: ``runs`` (a row a case: spec, scale, position, seed), ``errors`` (name ->
    [runs]: ``subject``, ``subject <tensor>``, ``reference``, ``fault <name>``), ``tests`` (one
    :class:`~workbench.check.verdict.ScaleTest` a condition, its ``scale`` the condition's
    number in :attr:`conditions`), the tolerances and the verdict."""

    subject: str
    kind: str
    runs: Any
    errors: dict[str, np.ndarray]
    conditions: list[dict[str, Any]]
    tests: list[verdict_mod.ScaleTest]
    tolerances: dict[str, float]
    problems: list[str]
    reasons: list[str] = field(default_factory=list)
    part: str = "head"

    @property
    def passed(self) -> bool:
        return not self.reasons

    @classmethod
    def build(cls, name: str, kind: str, conds: list, problems: list[str], user: float | None) -> HeadReport:
        import pandas as pd

        runs = pd.concat(
            [pd.DataFrame({**{k: [v] * len(s) for k, v in base.items()}, "seed": s}) for base, s, _ in conds],
            ignore_index=True,
        )
        keys = list(conds[0][2])
        errors = {k: np.concatenate([e[k] for _, _, e in conds]) for k in keys}
        tols = dict(FIXED_TOLERANCES)
        if user is not None:
            tols["user's"] = float(user)
        cond_id = np.concatenate([np.full(len(s), j, np.float64) for j, (_, s, _) in enumerate(conds)])
        tests = verdict_mod.sign_tests(cond_id, errors["subject"], errors["reference"]) if "subject" in errors else []
        rep = cls(name, kind, runs, errors, [dict(b) for b, _, _ in conds], tests, tols, problems)
        rep.reasons = rep._reasons(user) if "subject" in errors else []
        return rep

    def _where(self, j: int) -> str:
        c = self.conditions[j]
        return f"{c['spec']}, scale {c['scale']:g}, position {c['position']}"

    def _reasons(self, user: float | None) -> list[str]:
        out = []
        if self.problems:
            out.append(f"{len(self.problems)} case(s) gave no usable result, first: {self.problems[0]}")
        if user is not None:
            v = self.errors["subject"]
            bad = np.flatnonzero(~(v <= user))
            if len(bad):
                out.append(
                    f"{len(bad)} case(s) fail the user's tolerance (worst <= {user:g}), first: "
                    f"{self._label(bad[0])} (worst {v[bad[0]]:.3g})"
                )
        for t in self.tests:
            if t.rejected:
                j = int(t.scale)
                out.append(
                    f"part {self.part}: at {self._where(j)} the errors are not those of a correct float32 head: "
                    f"{t.exceed} of {t.n} cases are past {verdict_mod.RATIO:g}x the reference's (the "
                    f"{verdict_mod.TEST_NAME} rejects at {t.critical}; p = {t.p_value:.2g}); worst tensor: "
                    f"{self._worst_tensor(j)}"
                )
        return out

    def _worst_tensor(self, j: int) -> str:
        rows = self._rows(j)
        tensors = {k.split(" ", 1)[1]: v[rows] for k, v in self.errors.items() if k.startswith("subject ")}
        med = {k: float(np.nanmedian(v)) if np.isfinite(v).any() else float("inf") for k, v in tensors.items()}
        k = max(med, key=med.get)
        return f"{k} (median {med[k]:.3g})"

    def _rows(self, j: int) -> np.ndarray:
        c = self.conditions[j]
        r = self.runs
        return ((r["spec"] == c["spec"]) & (r["scale"] == c["scale"]) & (r["position"] == c["position"])).to_numpy()

    def _label(self, i: int) -> str:
        row = self.runs.iloc[int(i)]
        return ", ".join(f"{k} {row[k]}" for k in self.runs.columns)

    def _fails(self, v: np.ndarray, ref: np.ndarray, tol: str) -> np.ndarray:
        if tol == REFERENCE_RULE:
            return ~(v <= verdict_mod.RATIO * ref)
        return ~(v <= self.tolerances[tol])

    def error_table(self):
        """Per condition: the subject's and the reference's worst-error quantiles, the sign test."""
        import pandas as pd

        rows = []
        for j, c in enumerate(self.conditions):
            ref = self.errors["reference"][self._rows(j)]
            row = {**c, **{f"ref_q{int(q * 100)}": float(np.nanquantile(ref, q)) for q in verdict_mod.QUANTILES}}
            t = next((t for t in self.tests if int(t.scale) == j), None)
            if t is not None:
                row |= {**t.quantiles, f"past {verdict_mod.RATIO:g}x ref": t.exceed, "rejects at": t.critical}
            rows.append(row)
        return pd.DataFrame(rows).set_index(["spec", "scale", "position"])

    def catch_table(self, by: tuple[str, ...] = ()):
        """Per fault (and ``(reference)``, ``(subject)``: a correct float32 head's flakes), the
        share of the cases it applies to that each tolerance fails; ``by``: columns of
        :attr:`runs` to split the shares by (``("position",)``, ``("spec", "scale")``)."""
        import pandas as pd

        for b in by:
            if b not in ("spec", "scale", "position"):
                raise ValueError(f"by: must name columns of spec, scale, position, got {b!r}")
        names = [REFERENCE_RULE, *self.tolerances]
        ref = self.errors["reference"]
        series = [("(reference)", ref)] + ([("(subject)", self.errors["subject"])] if "subject" in self.errors else [])
        series += [(k.split(" ", 1)[1], v) for k, v in self.errors.items() if k.startswith("fault ")]
        everything = [((), np.ones(len(ref), bool))]
        groups = list(self.runs.groupby(list(by), sort=False).indices.items()) if by else everything
        rows = []
        for label, v in series:
            for key, idx in groups:
                mask = np.zeros(len(ref), bool)
                mask[idx] = True
                if not label.startswith("("):
                    mask &= ~np.isnan(v)  # NaN: the fault changes nothing in this case's spec
                if not mask.any():
                    continue
                keyd = dict(zip(by, key if isinstance(key, tuple) else (key,)))
                row = {"fault": label, **keyd, "cases": int(mask.sum())}
                for n in names:
                    row[n] = float(np.mean(self._fails(v[mask], ref[mask], n)))
                rows.append(row)
        return pd.DataFrame(rows).set_index(["fault", *by])

    def caught_where(self) -> dict[str, list[str]]:
        """Per fault, the conditions where the reference rule fails at least :data:`CAUGHT_SHARE` of its cases."""
        out = {}
        ref = self.errors["reference"]
        for k, v in self.errors.items():
            if not k.startswith("fault "):
                continue
            hit = []
            for j in range(len(self.conditions)):
                rows = self._rows(j)
                if np.isnan(v[rows]).all():
                    continue
                if np.mean(self._fails(v[rows], ref[rows], REFERENCE_RULE)) >= CAUGHT_SHARE:
                    hit.append(self._where(j))
            out[k.split(" ", 1)[1]] = hit
        return out

    def __str__(self) -> str:
        head = f"{'PASS' if self.passed else 'FAIL'}: part {self.part}, {self.kind} {self.subject!r}, "
        head += f"{len(self.runs)} cases in {len(self.conditions)} conditions"
        lines = [head, *("  - " + r for r in self.reasons)]
        lines.append(self.error_table().to_string(float_format=lambda v: f"{v:.3g}"))
        lines.append(self.catch_table().to_string(float_format=lambda v: f"{v:.3f}"))
        return "\n".join(lines)

    def to_record(self) -> dict[str, Any]:
        import json

        return {
            "kind": "check",
            "part": self.part,
            "subject": self.subject,
            "form": self.kind,
            "passed": self.passed,
            "reasons": self.reasons,
            "problems": self.problems,
            "tolerances": self.tolerances,
            "errors": json.loads(self.error_table().reset_index().to_json(orient="records")),
            "catch_rates": json.loads(self.catch_table().reset_index().to_json(orient="records")),
            "caught_where": self.caught_where(),
        }
