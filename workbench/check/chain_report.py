"""What a check of a chain reports (:class:`ChainReport`): each link's error beside the
reference chain's, the sign test a link, the verdict a link and for the chain, and the first
failing link named.

A link fails when its sign test rejects at some input scale (its errors are past
``verdict.RATIO`` times the reference chain's on more cases than a correct float32 chain
gives), when the user's tolerance is given and a case's error is past it, or when the
subject gave nothing usable for it on some case. The chain passes when every link does. The
level ``verdict.ALPHA`` is split evenly over the links (and, within a link, over the scales),
so a correct chain of any length fails with at most that probability.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.check import verdict as verdict_mod

#: Below this power (against errors past the ratio on half the cases) a pass is flagged as judging little.
WEAK_POWER = 0.5


def _worst(errors: dict[str, np.ndarray]) -> np.ndarray:
    """A link's error a case: its worst tensor's (NaN when any is NaN: nothing usable)."""
    stack = np.stack(list(errors.values()))
    worst = stack.max(axis=0)
    worst[np.isnan(stack).any(axis=0)] = np.nan
    return worst


def _q(v: np.ndarray, q: float) -> float:
    v = v[np.isfinite(v)]
    return float(np.quantile(v, q)) if v.size else float("nan")


@dataclass
class ChainReport:
    """A chain's check: ``links`` and their ``parts`` in launch order, ``name`` and ``kind``
    (``"one"``: one implementation, ``"links"``: one callable a link, ``given`` what ran each
    link, ``"none"``: only the reference), ``cases`` (a row a case: scale, gate, state_scale,
    seed), ``errors`` / ``reference_errors`` (link -> tensor -> a case's scaled error),
    ``tests`` (link -> the sign test at each scale), ``reasons`` (link -> why it fails),
    ``problems`` (each case and link that gave nothing usable)."""

    links: tuple[str, ...]
    parts: tuple[str, ...]
    name: str
    kind: str
    given: list[str]
    cases: list[dict[str, Any]]
    errors: dict[str, dict[str, np.ndarray]]
    reference_errors: dict[str, dict[str, np.ndarray]]
    tests: dict[str, list[verdict_mod.ScaleTest]] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    tolerance: float | None = None

    @classmethod
    def build(
        cls,
        chain: Any,
        name: str,
        kind: str,
        given: list[str],
        cases: list[dict[str, Any]],
        sub: list[list[dict[str, float]]],
        ref: list[list[dict[str, float]]],
        problems: list[str],
        user: float | None,
    ) -> ChainReport:
        links = chain.names
        parts = tuple(w.link.part for w in chain.links)

        def table(per_case: list[list[dict[str, float]]]) -> dict[str, dict[str, np.ndarray]]:
            return {
                n: {t: np.array([c[i][t] for c in per_case], np.float64) for t in w.link.outputs}
                for i, (n, w) in enumerate(zip(links, chain.links))
            }

        rep = cls(links, parts, name, kind, given, cases, table(sub) if sub else {}, table(ref), problems=problems)
        rep.tolerance = user
        if sub:
            scales = np.array([c["scale"] for c in cases], np.float64)
            alpha = verdict_mod.ALPHA / len(links)
            for i, n in enumerate(links):
                s, r = _worst(rep.errors[n]), _worst(rep.reference_errors[n])
                rep.tests[n] = verdict_mod.sign_tests(scales, s, r, alpha=alpha)
                rep.reasons[n] = rep._reasons(i, n, s)
        return rep

    def _reasons(self, i: int, n: str, s: np.ndarray) -> list[str]:
        out = []
        label = f"link {i + 1} {n} (part {self.parts[i]})"
        missing = np.flatnonzero(np.isnan(s))
        if len(missing):
            out.append(f"{label}: {len(missing)} case(s) gave no usable result, first: {self._case(missing[0])}")
        if self.tolerance is not None:
            bad = np.flatnonzero(s > self.tolerance)
            if len(bad):
                out.append(
                    f"{label}: {len(bad)} case(s) past the user's tolerance {self.tolerance:g}, first: "
                    f"{self._case(bad[0])} (error {s[bad[0]]:.3g})"
                )
        for t in self.tests[n]:
            if t.rejected:
                out.append(
                    f"{label}: at scale {t.scale:g} the errors are not those of a correct float32 chain: {t.exceed} "
                    f"of {t.n} cases past {verdict_mod.RATIO:g}x the reference chain's (rejects at {t.critical}; "
                    f"p = {t.p_value:.2g})"
                )
        return out

    def _case(self, j: int) -> str:
        c = self.cases[j]
        return f"case scale {c['scale']:g} gate {c['gate']} state {c['state_scale']:g} seed {c['seed']}"

    @property
    def failing(self) -> list[str]:
        """The links that fail, in launch order."""
        return [n for n in self.links if self.reasons.get(n)]

    @property
    def first_failing(self) -> str | None:
        """The first link that fails (the links after it read its error), or None."""
        f = self.failing
        return f[0] if f else None

    @property
    def passed(self) -> bool:
        """Every link passes (a check of the reference alone judges nothing: False)."""
        return bool(self.errors) and not self.failing

    def rows(self) -> list[dict[str, Any]]:
        """A row a link: its worst tensor, the subject's and the reference chain's median, 99th
        percentile and worst error, the cases past the ratio, the sign test's power (against
        errors past the ratio on half the cases, at the weakest scale: few cases judge little)
        and the link's verdict."""
        out = []
        for i, n in enumerate(self.links):
            r = _worst(self.reference_errors[n])
            row: dict[str, Any] = {"link": f"{i + 1} {n}", "part": self.parts[i]}
            if self.kind == "links":
                row["run by"] = self.given[i]
            if self.errors:
                s = _worst(self.errors[n])
                per_tensor = {t: np.nanmax(v) if np.isfinite(v).any() else np.nan for t, v in self.errors[n].items()}
                row["worst tensor"] = max(
                    per_tensor, key=lambda t: -np.inf if np.isnan(per_tensor[t]) else per_tensor[t]
                )
                row |= {"median": _q(s, 0.5), "p99": _q(s, 0.99), "max": _q(s, 1.0)}
            row |= {"ref median": _q(r, 0.5), "ref p99": _q(r, 0.99), "ref max": _q(r, 1.0)}
            if self.errors:
                row["past ratio"] = sum(t.exceed for t in self.tests[n])
                row["cases"] = sum(t.n for t in self.tests[n])
                # the test's power against errors past the ratio on half the cases, at its weakest scale
                row["power"] = min(t.power for t in self.tests[n])
                row["verdict"] = "FAIL" if self.reasons[n] else "pass"
            out.append(row)
        return out

    def table(self) -> Any:
        """:meth:`rows` as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.rows())

    def __str__(self) -> str:
        head = f"chain {' -> '.join(self.links)}"
        if not self.errors:
            lines = [f"{head}: the reference chain alone ({len(self.cases)} cases)"]
        else:
            verdict = "PASS" if self.passed else f"FAIL (first failing link: {self.first_failing})"
            form = {"one": "one implementation", "links": "one callable a link"}[self.kind]
            lines = [f"{head}: {verdict}; {self.name} as {form}, {len(self.cases)} cases"]
        table = self.table().set_index("link")
        lines += ["  " + t for t in table.to_string(float_format=lambda v: f"{v:.3g}").splitlines()]
        weak = [r for r in self.rows() if r.get("power", 1.0) < WEAK_POWER]
        if weak:
            lines.append(
                f"  note: the sign test's power is below {WEAK_POWER:g} on {len(weak)} link(s) (a pass judges "
                "little with so few cases a scale: give more seeds)"
            )
        for n in self.failing:
            lines += [f"  - {x}" for x in self.reasons[n]]
        return "\n".join(lines)

    def to_record(self) -> dict[str, Any]:
        """The JSON record of the check (the command's ``--record``)."""

        def clean(v: Any) -> Any:
            return None if isinstance(v, float) and not np.isfinite(v) else v

        return {
            "chain": list(self.links),
            "parts": list(self.parts),
            "subject": self.name,
            "form": self.kind,
            "run_by": self.given,
            "cases": len(self.cases),
            "metric": "max |x - y| / max(|y|, 1) over a link's outputs, against the chained float64 truth",
            "test": verdict_mod.TEST_NAME,
            "ratio": verdict_mod.RATIO,
            "alpha": verdict_mod.ALPHA,
            "tolerance": self.tolerance,
            "links": [{k: clean(v) for k, v in row.items()} for row in self.rows()],
            "reasons": {n: r for n, r in self.reasons.items() if r},
            "first_failing": self.first_failing,
            "problems": self.problems,
            "passed": self.passed,
        }
