"""Tolerances: calibrated from a sweep of a correct tail, beside the ones trusted projects use.

A tolerance is a (metric, limit) pair over a sweep's per-case columns
(``workbench.studies.sweeps``): a case passes when ``metric <= limit``. Two questions about it:

* how often does a CORRECT tail fail it? :func:`calibrate_tolerance` picks the limit a
  correct tail exceeds with a stated small probability (a flake rate per case), by a
  peaks-over-threshold fit with a bootstrap interval; :func:`pass_rates` counts;
* how often does a WRONG tail pass it? :func:`catch_rates` over ``sweeps.mutation_sweep``.

:data:`REFERENCE_TOLERANCES` are the limits other projects' tests use, with their sources.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.tail.frink_case import SEED_TOL
from workbench.validate import describe, integer, number

#: Tolerances of trusted projects' tests, as ``name -> (metric column, limit)``: a case
#: passes when ``column <= limit``. Sources: frink-models 0.48.0's fused-attention-tail
#: test; PyTorch's ``torch.testing.assert_close`` documentation (default rtol/atol by
#: dtype); MLX's ``python/tests/test_fast.py``; llama.cpp's ``tests/test-backend-ops.cpp``.
REFERENCE_TOLERANCES: dict[str, tuple[str, float]] = {
    # frink-models' test: |x - y| <= 2e-4 max(|y|, 1) per element
    "frink-models 2e-4": ("worst", SEED_TOL),
    # torch.testing.assert_close float32 defaults: |x - y| <= 1e-5 + 1.3e-6 |y|
    "torch f32 defaults": ("torch_ratio", 1.0),
    # MLX python/tests/test_fast.py: rms_norm max abs error vs an fp32 reference, fp32 / bf16
    "MLX test_fast fp32 1e-6": ("max_abs", 1e-6),
    "MLX test_fast bf16 1e-2": ("max_abs", 1e-2),
    # llama.cpp test-backend-ops NMSE limits: default (rms_norm too), mul_mat, fused mul_mat_vec
    "llama.cpp NMSE 1e-7": ("nmse", 1e-7),
    "llama.cpp NMSE 5e-4": ("nmse", 5e-4),
    "llama.cpp NMSE 5e-3": ("nmse", 5e-3),
}

#: A tail (threshold and top cases) with fewer distinct values than this is treated as
#: discrete: no curve is fitted to it (see :func:`calibrate_tolerance`).
MIN_DISTINCT = 10

#: How calibration and pass rates group a sweep by default: one weight configuration a group.
_GROUP = ["dtype", "fold", "quant"]


def _checked_rates_input(
    name: str, frame: Any, tolerances: Any, by: Any
) -> tuple[dict[str, tuple[str, float]], list[str]]:
    """The sweep, tolerances and grouping of :func:`catch_rates` / :func:`pass_rates`, checked:
    a non-empty DataFrame, ``name -> (column, finite limit >= 0)`` pairs over its columns,
    ``by`` naming its columns. A NaN limit would make every comparison false: a rate of 0
    or 1 that says nothing, so it is refused here."""
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"{name}: must be a pandas DataFrame (a sweep), got {describe(frame)}")
    if len(frame) == 0:
        raise ValueError(f"{name}: the sweep has no cases; a rate over none is undefined")
    if not isinstance(tolerances, Mapping) or not tolerances:
        raise ValueError(f"tolerances: must be a non-empty mapping name -> (metric, limit), got {describe(tolerances)}")
    checked = {}
    for key, pair in tolerances.items():
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"tolerances[{key!r}]: must be a (metric, limit) pair, got {describe(pair)}")
        metric, limit = pair
        if not isinstance(metric, str) or metric not in frame.columns:
            raise ValueError(
                f"tolerances[{key!r}]: metric must be a column of the sweep "
                f"({sorted(map(str, frame.columns))}); got {describe(metric)}"
            )
        checked[key] = (metric, number(f"tolerances[{key!r}]: limit", limit, minimum=0))
    groups = [by] if isinstance(by, str) else list(by) if isinstance(by, (tuple, list)) else None
    if not groups or any(not isinstance(b, str) or b not in frame.columns for b in groups):
        raise ValueError(
            f"by: must name one or more columns of the sweep ({sorted(map(str, frame.columns))}); got {describe(by)}"
        )
    return checked, groups


def catch_rates(mutants, tolerances: Mapping[str, tuple[str, float]], *, by: Sequence[str] = ("mutation",)):
    """Fraction of mutant cases each tolerance CATCHES (``metric > limit``, or NaN), per group.

    ``tolerances``: ``name -> (metric column, limit)``, e.g. :data:`REFERENCE_TOLERANCES` plus
    calibrated ones (:meth:`Tolerance.as_criterion`); limits must be finite and >= 0.
    Returns a DataFrame, one row per group (``by`` columns, default per mutation), one
    column per tolerance. A NaN metric counts as caught (a wrong tail that produced NaN).
    """
    import pandas as pd

    checked, groups = _checked_rates_input("mutants", mutants, tolerances, by)
    cols = {}
    for name, (metric, limit) in checked.items():
        v = mutants[metric]
        cols[name] = (v > limit) | v.isna()
    caught = pd.DataFrame(cols)
    for b in groups:
        caught[b] = mutants[b]
    return caught.groupby(groups, observed=True).mean()


def pass_rates(errors, tolerances: Mapping[str, tuple[str, float]], *, by: Sequence[str] = _GROUP):
    """Fraction of CORRECT cases each tolerance passes (``metric <= limit``), per group.
    Limits must be finite and >= 0; a NaN metric counts as failed (it is not <= anything)."""
    import pandas as pd

    checked, groups = _checked_rates_input("errors", errors, tolerances, by)
    cols = {name: errors[metric] <= limit for name, (metric, limit) in checked.items()}
    ok = pd.DataFrame(cols)
    for b in groups:
        ok[b] = errors[b]
    return ok.groupby(groups, observed=True).mean()


# -- calibration ------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """A calibrated tolerance and how it was found.

    ``value``: the point estimate of the level a correct tail exceeds with probability
    ``flake_rate`` per case; ``low`` / ``high``: a bootstrap interval (``level``) around it;
    ``recommended``: ``high`` rounded UP to two significant figures, the figure to use in a
    test (erring, at the rate asked, on the side of not flaking). ``xi`` / ``sigma`` /
    ``threshold`` / ``n_tail``: the fitted generalized Pareto tail; ``observed_max``: the
    largest error seen; ``extrapolation``: ``1 / (flake_rate * n)``, how far beyond the data
    the fit reaches (> 1: past the largest error one would expect to see).
    """

    value: float
    low: float
    high: float
    recommended: float
    flake_rate: float
    level: float
    n: int
    threshold: float
    n_tail: int
    xi: float
    sigma: float
    observed_max: float
    method: str = field(default="")
    #: True when the top of the sample is tied (see :func:`calibrate_tolerance`): the
    #: tolerance is then the tied largest error, not an extrapolation.
    degenerate: bool = False

    @property
    def extrapolation(self) -> float:
        return 1.0 / (self.flake_rate * self.n)

    def as_criterion(self, metric: str = "worst") -> tuple[str, float]:
        """``(metric, recommended)``, for :func:`catch_rates` / :func:`pass_rates`."""
        return (metric, self.recommended)

    def __str__(self) -> str:
        return (
            f"tolerance {self.value:.3g} (bootstrap {100 * self.level:.0f}%: {self.low:.3g} .. {self.high:.3g}); "
            f"recommended {self.recommended:.2g} at flake rate {self.flake_rate:g}/case; "
            f"GPD xi {self.xi:.3f}, sigma {self.sigma:.3g} over {self.n_tail} of {self.n} above "
            f"{self.threshold:.3g}; observed max {self.observed_max:.3g}"
        )


def _gpd_pwm(y: np.ndarray) -> tuple[float, float]:
    """Generalized Pareto (xi, sigma) from exceedances ``y > 0`` by probability-weighted moments.

    Hosking & Wallis (1987), Technometrics 29(3): with ``a0 = mean(y)`` and
    ``a1 = mean((1 - p_i) y_(i))`` (``p_i = (i - 0.35) / n``, ``y`` ascending), Hosking's shape
    ``k = a0 / (a0 - 2 a1) - 2`` and scale ``sigma = 2 a0 a1 / (a0 - 2 a1)``; ``xi = -k`` in
    the convention ``P(Y > y) = (1 + xi y / sigma)^(-1 / xi)``. Closed form, so a bootstrap
    of a thousand refits is cheap, and it is well behaved for the light tails (xi <= 0)
    that rounding errors have, where maximum likelihood is not (it is irregular for xi < -0.5).
    """
    y = np.sort(y, axis=-1)
    n = y.shape[-1]
    p = (np.arange(1, n + 1) - 0.35) / n
    a0 = y.mean(axis=-1)
    a1 = ((1.0 - p) * y).mean(axis=-1)
    d = a0 - 2.0 * a1
    # d = mean((2p - 1) y) > 0 whenever any excess is > 0 (Chebyshev's sum inequality: both
    # factors ascend and mean(2p - 1) = 0.3 / n > 0); d = 0 only when every excess is 0, a
    # point mass, which is returned as xi = 0, sigma = 0 (its level is the threshold).
    flat = d <= 0
    safe = np.where(flat, 1.0, d)
    xi = np.where(flat, 0.0, 2.0 - a0 / safe)  # -k
    return xi, np.where(flat, 0.0, 2.0 * a0 * a1 / safe)


def _gpd_level(u: float | np.ndarray, xi: Any, sigma: Any, q: float) -> Any:
    """``u + y`` with ``P(Y > y) = q`` under the fitted tail."""
    xi = np.asarray(xi, dtype=np.float64)
    small = np.abs(xi) < 1e-9
    safe = np.where(small, 1.0, xi)
    y = np.where(small, sigma * -math.log(q), sigma / safe * (q ** (-safe) - 1.0))
    return u + y


def _round_up(x: float, sig: int = 2) -> float:
    """``x`` rounded UP to ``sig`` significant figures, never below ``x``.

    The figure is built from its decimal text (``3e-05``, the float nearest 3 x 10^-5), not
    as ``3 * 1e-05``, which lands one ulp below 3e-05 and would recommend a tolerance
    under the largest error it was calibrated on."""
    if not math.isfinite(x) or x <= 0:
        return x
    e = math.floor(math.log10(x)) - (sig - 1)
    m = math.ceil(x / 10.0**e - 1e-9)
    r = float(f"{m}e{e}")
    while r < x:
        m += 1
        r = float(f"{m}e{e}")
    return r


def calibrate_tolerance(
    errors: Any,
    *,
    flake_rate: float = 1e-6,
    tail_fraction: float = 0.02,
    min_tail: int = 50,
    n_boot: int = 400,
    level: float = 0.9,
    seed: int = 0,
) -> Tolerance:
    """The tolerance a correct implementation exceeds with probability ``flake_rate`` per case.

    Method: peaks over threshold. ``errors`` are per-case worst errors of a CORRECT tail
    (e.g. a sweep's ``worst``). The threshold ``u`` is the empirical quantile leaving the
    top ``max(min_tail, tail_fraction * n)`` cases above it; their excesses are fitted with a
    generalized Pareto distribution (Pickands-Balkema-de Haan: excesses over a high threshold
    tend to one) by probability-weighted moments (:func:`_gpd_pwm`), and the tolerance is
    the level ``t`` with ``P(E > t) = (n_tail / n) P(Y > t - u) = flake_rate``. When
    ``flake_rate >= tail_fraction`` it is the plain empirical quantile.

    Uncertainty: a bootstrap (``n_boot`` resamples of the cases, seeded by ``seed``), each
    re-choosing the threshold and refitting; ``low`` / ``high`` are the ``level`` percentile
    interval. The extrapolation from n cases to a rate of 1e-6 is long when n is small: the
    interval says how long.

    Ties and discrete metrics (the defined answer, never NaN): a continuous tail cannot be
    fitted when the threshold and the top ``k`` errors take fewer than
    :data:`MIN_DISTINCT` distinct values: every error 0 (a bit-exact implementation), or
    an integer metric such as a ULP count with a handful of levels. A moment fit there
    is meaningless (all-zero excesses give 0/0; a few levels give a tail that reaches
    far past anything seen), so the tolerance is then the largest error seen, with
    ``degenerate`` True, ``sigma = 0`` and ``xi`` reported as 0, and the method saying
    so: n cases give no evidence of any larger error, and no extrapolation is made. A
    bootstrap resample that is discrete the same way counts at its own largest error.
    Input that cannot be calibrated at all (fewer than 100 errors, a NaN, a negative
    error) is a ValueError naming ``errors``.
    """
    try:
        e = np.asarray(errors, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise ValueError(f"errors: must be an array of numbers (per-case errors), got {describe(errors)}") from None
    if e.size < 100:
        raise ValueError(f"errors: must hold at least 100 per-case errors to fit a tail; got {e.size}")
    if not np.isfinite(e).all() or (e < 0).any():
        bad = e[~(np.isfinite(e) & (e >= 0))]
        raise ValueError(
            f"errors: must be finite and >= 0 (per-case worst errors of a correct tail); "
            f"got {bad.size} others, e.g. {bad[0]!r}"
        )
    flake_rate = number("flake_rate", flake_rate, minimum=0, exclusive_minimum=True, maximum=0.5)
    tail_fraction = number("tail_fraction", tail_fraction, minimum=0, exclusive_minimum=True, maximum=0.5)
    level = number("level", level, minimum=0, exclusive_minimum=True, maximum=0.999)
    n_boot = integer("n_boot", n_boot, minimum=10, maximum=100_000)
    min_tail = integer("min_tail", min_tail, minimum=MIN_DISTINCT)
    seed = integer("seed", seed, minimum=0)
    n = e.size
    k = int(min(n - 1, max(min_tail, math.ceil(tail_fraction * n))))

    def fit(sample: np.ndarray) -> tuple[np.ndarray, ...]:
        """Rows of samples -> (level, u, xi, sigma, distinct values in the tail) per row."""
        part = np.partition(sample, n - k - 1, axis=-1)
        u = part[..., n - k - 1]
        top = part[..., n - k :]
        xi, sigma = _gpd_pwm(top - u[..., None])
        distinct = 1 + (np.diff(np.sort(part[..., n - k - 1 :], axis=-1), axis=-1) > 0).sum(axis=-1)
        if flake_rate >= k / n:
            return np.quantile(sample, 1.0 - flake_rate, axis=-1), u, xi, sigma, np.full_like(distinct, k + 1)
        discrete = distinct < MIN_DISTINCT
        lvl = np.where(discrete, sample.max(axis=-1), _gpd_level(u, xi, sigma, flake_rate * n / k))
        return lvl, u, np.where(discrete, 0.0, xi), np.where(discrete, 0.0, sigma), distinct

    lvl, u, xi, sigma, distinct = fit(e[None, :])
    degenerate = bool(distinct[0] < MIN_DISTINCT)
    rng = np.random.default_rng(seed)
    boots = []
    for start in range(0, n_boot, 50):  # chunks keep the resample matrix small
        m = min(50, n_boot - start)
        boots.append(fit(e[rng.integers(0, n, size=(m, n))])[0])
    b = np.concatenate(boots)
    lo, hi = np.quantile(b, [(1 - level) / 2, (1 + level) / 2])
    method = (
        f"peaks over threshold: generalized Pareto fitted by probability-weighted moments to the top "
        f"{k} of {n} cases; bootstrap x{n_boot} ({100 * level:.0f}% interval); recommended = upper bound "
        f"rounded up to 2 significant figures"
    )
    if degenerate:
        method = (
            f"discrete tail: the threshold and the top {k} of {n} cases take only {int(distinct[0])} distinct "
            f"value(s) (fewer than {MIN_DISTINCT}), too few to fit a continuous tail; the tolerance is the "
            f"largest error seen (sigma = 0, xi reported as 0); bootstrap x{n_boot} "
            f"({100 * level:.0f}% interval)"
        )
    out = dict(
        value=float(lvl[0]),
        low=float(lo),
        high=float(hi),
        recommended=_round_up(float(hi)),
        threshold=float(u[0]),
        xi=float(xi[0]),
        sigma=float(sigma[0]),
    )
    bad = {k: v for k, v in out.items() if not math.isfinite(v)}
    if bad:  # cannot happen for finite errors >= 0 and the ranges above; said plainly if it ever does
        raise ValueError(
            f"errors: the tail fit gave non-finite {bad}; the errors cannot be calibrated (observed max {e.max():.6g})"
        )
    return Tolerance(
        **out,
        flake_rate=float(flake_rate),
        level=float(level),
        n=int(n),
        n_tail=int(k),
        observed_max=float(e.max()),
        method=method,
        degenerate=degenerate,
    )


def calibrate_by(errors, *, metric: str = "worst", by: Sequence[str] = _GROUP, flake_rate: float = 1e-6, **kw: Any):
    """:func:`calibrate_tolerance` for each group of a sweep; a DataFrame, one row per group."""
    import pandas as pd

    # The same checks as the rates: a non-empty sweep, the metric and the groups its columns.
    _, by = _checked_rates_input("errors", errors, {"metric": (metric, 0.0)}, by)
    rows = []
    for key, g in errors.groupby(by, observed=True):
        key = key if isinstance(key, tuple) else (key,)
        try:
            t = calibrate_tolerance(g[metric].to_numpy(), flake_rate=flake_rate, **kw)
        except ValueError as err:
            raise ValueError(f"group {dict(zip(by, key))}: {err}") from None
        rows.append(
            {
                **dict(zip(by, key)),
                "n": t.n,
                "observed_max": t.observed_max,
                "tolerance": t.value,
                "low": t.low,
                "high": t.high,
                "recommended": t.recommended,
                "xi": t.xi,
            }
        )
    return pd.DataFrame(rows).set_index(list(by))
