"""Tolerances: calibrated from a sweep of a correct tail, beside the ones trusted projects use.

A tolerance is a (metric, limit) pair over a sweep's per-case columns
(``workbench.sweeps``): a case passes when ``metric <= limit``. Two questions about it:

* how often does a CORRECT tail fail it? :func:`calibrate_tolerance` picks the limit a
  correct tail exceeds with a stated small probability (a flake rate per case), by a
  peaks-over-threshold fit with a bootstrap interval; :func:`pass_rates` counts;
* how often does a WRONG tail pass it? :func:`catch_rates` over ``sweeps.mutation_sweep``.

:data:`REFERENCE_TOLERANCES` are the limits other projects' tests use, with their sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from workbench.frink_case import SEED_TOL

#: Tolerances of trusted projects' tests, as ``name -> (metric column, limit)``: a case
#: passes when ``column <= limit``. Sources: frink-models 0.48.0's fused-attention-tail
#: test; PyTorch's ``torch.testing.assert_close`` documentation (default rtol/atol by
#: dtype); MLX's ``python/tests/test_fast.py``; llama.cpp's ``tests/test-backend-ops.cpp``.
REFERENCE_TOLERANCES: dict[str, tuple[str, float]] = {
    # frink-models' test: |x - y| <= 2e-4 max(|y|, 1) per element (the label predates the
    # name; tables and notebooks print it)
    "seed 2e-4": ("worst", SEED_TOL),
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

#: How calibration and pass rates group a sweep by default: one weight configuration a group.
_GROUP = ["dtype", "fold", "quant"]


def catch_rates(mutants, tolerances: Mapping[str, tuple[str, float]], *, by: Sequence[str] = ("mutation",)):
    """Fraction of mutant cases each tolerance CATCHES (``metric > limit``, or NaN), per group.

    ``tolerances``: ``name -> (metric column, limit)``, e.g. :data:`REFERENCE_TOLERANCES` plus
    calibrated ones (:meth:`Tolerance.as_criterion`). Returns a DataFrame, one row per group
    (``by`` columns, default per mutation), one column per tolerance.
    """
    import pandas as pd

    if not tolerances:
        raise ValueError("tolerances must name at least one (metric, limit) pair")
    cols = {}
    for name, (metric, limit) in tolerances.items():
        if metric not in mutants.columns:
            raise ValueError(f"tolerances[{name!r}]: metric must be a column of the sweep; got {metric!r}")
        v = mutants[metric]
        cols[name] = (v > limit) | v.isna()
    caught = pd.DataFrame(cols)
    for b in by:
        caught[b] = mutants[b]
    return caught.groupby(list(by), observed=True).mean()


def pass_rates(errors, tolerances: Mapping[str, tuple[str, float]], *, by: Sequence[str] = _GROUP):
    """Fraction of CORRECT cases each tolerance passes (``metric <= limit``), per group."""
    import pandas as pd

    cols = {name: errors[metric] <= limit for name, (metric, limit) in tolerances.items()}
    ok = pd.DataFrame(cols)
    for b in by:
        ok[b] = errors[b]
    return ok.groupby(list(by), observed=True).mean()


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

    @property
    def extrapolation(self) -> float:
        return 1.0 / (self.flake_rate * self.n)

    def as_criterion(self, metric: str = "worst") -> tuple[str, float]:
        """``(metric, recommended)``, for :func:`catch_rates` / :func:`pass_rates`."""
        return (metric, self.recommended)

    def __str__(self) -> str:
        return (f"tolerance {self.value:.3g} (bootstrap {100 * self.level:.0f}%: {self.low:.3g} .. {self.high:.3g}); "
                f"recommended {self.recommended:.2g} at flake rate {self.flake_rate:g}/case; "
                f"GPD xi {self.xi:.3f}, sigma {self.sigma:.3g} over {self.n_tail} of {self.n} above "
                f"{self.threshold:.3g}; observed max {self.observed_max:.3g}")


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
    k = a0 / d - 2.0
    return -k, 2.0 * a0 * a1 / d


def _gpd_level(u: float | np.ndarray, xi: Any, sigma: Any, q: float) -> Any:
    """``u + y`` with ``P(Y > y) = q`` under the fitted tail."""
    xi = np.asarray(xi, dtype=np.float64)
    small = np.abs(xi) < 1e-9
    safe = np.where(small, 1.0, xi)
    y = np.where(small, sigma * -math.log(q), sigma / safe * (q ** (-safe) - 1.0))
    return u + y


def _round_up(x: float, sig: int = 2) -> float:
    if not math.isfinite(x) or x <= 0:
        return x
    e = math.floor(math.log10(x)) - (sig - 1)
    return math.ceil(x / 10.0**e - 1e-9) * 10.0**e


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
    """
    e = np.asarray(errors, dtype=np.float64).ravel()
    if e.size < 100:
        raise ValueError(f"errors must hold at least 100 per-case errors to fit a tail; got {e.size}")
    if not np.isfinite(e).all() or (e < 0).any():
        raise ValueError("errors must be finite and >= 0 (per-case worst errors of a correct tail)")
    if not (0 < flake_rate < 1):
        raise ValueError(f"flake_rate must be in (0, 1); got {flake_rate!r}")
    if not (0 < tail_fraction < 0.5):
        raise ValueError(f"tail_fraction must be in (0, 0.5); got {tail_fraction!r}")
    if not (0 < level < 1):
        raise ValueError(f"level must be in (0, 1); got {level!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 10:
        raise ValueError(f"n_boot must be an int >= 10; got {n_boot!r}")
    n = e.size
    k = int(min(n - 1, max(min_tail, math.ceil(tail_fraction * n))))

    def fit(sample: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Rows of samples -> (level, u, xi, sigma) per row."""
        part = np.partition(sample, n - k - 1, axis=-1)
        u = part[..., n - k - 1]
        top = part[..., n - k:]
        xi, sigma = _gpd_pwm(top - u[..., None])
        if flake_rate >= k / n:
            lvl = np.quantile(sample, 1.0 - flake_rate, axis=-1)
        else:
            lvl = _gpd_level(u, xi, sigma, flake_rate * n / k)
        return lvl, u, xi, sigma

    lvl, u, xi, sigma = fit(e[None, :])
    rng = np.random.default_rng(seed)
    boots = []
    for start in range(0, n_boot, 50):  # chunks keep the resample matrix small
        m = min(50, n_boot - start)
        boots.append(fit(e[rng.integers(0, n, size=(m, n))])[0])
    b = np.concatenate(boots)
    lo, hi = np.quantile(b, [(1 - level) / 2, (1 + level) / 2])
    method = (f"peaks over threshold: generalized Pareto fitted by probability-weighted moments to the top "
              f"{k} of {n} cases; bootstrap x{n_boot} ({100 * level:.0f}% interval); recommended = upper bound "
              f"rounded up to 2 significant figures")
    return Tolerance(value=float(lvl[0]), low=float(lo), high=float(hi), recommended=_round_up(float(hi)),
                     flake_rate=float(flake_rate), level=float(level), n=int(n), threshold=float(u[0]),
                     n_tail=int(k), xi=float(xi[0]), sigma=float(sigma[0]), observed_max=float(e.max()),
                     method=method)


def calibrate_by(errors, *, metric: str = "worst", by: Sequence[str] = _GROUP, flake_rate: float = 1e-6,
                 **kw: Any):
    """:func:`calibrate_tolerance` for each group of a sweep; a DataFrame, one row per group."""
    import pandas as pd

    if metric not in errors.columns:
        raise ValueError(f"metric must be a column of the sweep; got {metric!r}")
    rows = []
    for key, g in errors.groupby(list(by), observed=True):
        t = calibrate_tolerance(g[metric].to_numpy(), flake_rate=flake_rate, **kw)
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key)), "n": t.n, "observed_max": t.observed_max, "tolerance": t.value,
                     "low": t.low, "high": t.high, "recommended": t.recommended, "xi": t.xi})
    return pd.DataFrame(rows).set_index(list(by))
