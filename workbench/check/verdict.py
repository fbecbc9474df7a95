"""Are these the errors of a correct float32 tail? A paired sign test against the reference.

Pass/fail at one tolerance says little: a tail with eps outside the square root passes
frink-models' 2e-4 on ordinary inputs. So the yardstick is the workbench's own graph tail on
the SAME cases (same stored weights, inputs and float64 truth): for each case, is the
implementation's worst scaled error more than :data:`RATIO` times the reference's? Two correct
float32 tails differ only in rounding order, so that happens on at most a share
:data:`NULL_SHARE` of cases (measured: an independent numpy float32 tail against the graph,
``tests/test_check_verdict.py``). A one-sided exact binomial (sign) test of
``H0: share <= NULL_SHARE`` at level ``alpha`` (Bonferroni over the input scales) rejects when
the count reaches :func:`critical_count`; its power against errors over the ratio on a share
:data:`POWER_SHARE` of cases comes with every verdict (:func:`power`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: A case counts against the implementation when its error is more than this many times
#: the reference's on the same case.
RATIO = 4.0

#: The share of cases on which a CORRECT float32 tail exceeds :data:`RATIO` times the
#: reference's error (the null hypothesis' bound; measured well below it, see the module doc).
NULL_SHARE = 0.1

#: The alternative the power is stated against: errors past the ratio on half the cases.
POWER_SHARE = 0.5

#: The test's level over all input scales together.
ALPHA = 1e-3

TEST_NAME = "one-sided exact binomial sign test on paired per-case errors"


def _binom_sf(c: int, n: int, p: float) -> float:
    """``P(X >= c)`` for ``X ~ Binomial(n, p)``, exact (log-space terms)."""
    if c <= 0:
        return 1.0
    if c > n:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lp + (n - k) * lq
        for k in range(c, n + 1)
    ]
    m = max(terms)
    return min(1.0, math.exp(m) * sum(math.exp(t - m) for t in terms))


def critical_count(n: int, alpha: float, p0: float = NULL_SHARE) -> int:
    """The smallest count ``c`` with ``P(X >= c | n, p0) <= alpha``: the test rejects at ``c`` or more."""
    c = int(math.floor(n * p0))
    while c <= n and _binom_sf(c, n, p0) > alpha:
        c += 1
    return c


def power(n: int, alpha: float, p1: float = POWER_SHARE, p0: float = NULL_SHARE) -> float:
    """The test's power: ``P(reject)`` when the true share is ``p1``."""
    return _binom_sf(critical_count(n, alpha, p0), n, p1)


@dataclass(frozen=True)
class ScaleTest:
    """The sign test at one input scale: ``exceed`` of ``n`` cases past the ratio, ``critical`` the rejecting count."""

    scale: float
    n: int
    exceed: int
    critical: int
    p_value: float
    power: float
    quantiles: dict[str, float] = field(default_factory=dict)
    reference_quantiles: dict[str, float] = field(default_factory=dict)

    @property
    def rejected(self) -> bool:
        return self.exceed >= self.critical


#: The quantiles of the per-case errors shown beside the reference's.
QUANTILES = (0.5, 0.9, 0.99, 1.0)


def _quantiles(v: np.ndarray) -> dict[str, float]:
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {f"q{int(q * 100)}": float("nan") for q in QUANTILES}
    return {f"q{int(q * 100)}": float(np.quantile(v, q)) for q in QUANTILES}


def sign_tests(
    scales: np.ndarray, subject: np.ndarray, reference: np.ndarray, *, alpha: float = ALPHA
) -> list[ScaleTest]:
    """One :class:`ScaleTest` per input scale (``alpha`` split evenly over them).

    ``subject`` / ``reference``: per-case worst scaled errors, paired; a NaN in the
    subject counts past the ratio (a NaN is never a correct float32 tail's error).
    """
    out = []
    groups = np.unique(scales)
    a = alpha / max(1, len(groups))
    for s in groups:
        m = scales == s
        sub, ref = subject[m], reference[m]
        past = ~(sub <= RATIO * ref)  # NaN counts past
        n, k = int(m.sum()), int(past.sum())
        crit = critical_count(n, a)
        out.append(
            ScaleTest(
                scale=float(s),
                n=n,
                exceed=k,
                critical=crit,
                p_value=_binom_sf(k, n, NULL_SHARE),
                power=power(n, a),
                quantiles=_quantiles(sub),
                reference_quantiles=_quantiles(ref),
            )
        )
    return out
