"""The audit's statistics: Clopper-Pearson bounds on a test's error rates and the lower bounds
on epsilon (Jagielski, Ullman, Oprea, arXiv:2006.07709) and on mu (GDP: Nasr et al., "Tight
auditing of differentially private machine learning", arXiv:2302.07956) they give; the
threshold chosen on a training half (the maths of popri/apps/audit/__init__.py's docstring).

    python -c "from popri.apps.audit.stats import epsilon_from_rates; print(epsilon_from_rates(0.01, 0.5, 1e-5))"
"""

from __future__ import annotations

import math

import numpy as np

from popri.privacy.calibration import gaussian_log_delta
from popri.specs.privacy import AUDIT_BREAKS as BREAKS  # noqa: F401  (re-exported)
from popri.specs.privacy import AUDIT_MECHANISMS as MECHANISMS  # noqa: F401  (re-exported)

TRAIN_TAIL = 1e-3  # Clopper-Pearson tail used to pick the threshold on the training half


# --------------------------------------------------------------------------- statistics
def clopper_pearson(k, n, alpha: float = 0.05):
    """Two-sided Clopper-Pearson interval (lo, hi) of a binomial rate, k successes of n, at level
    1 - alpha (each tail alpha / 2).  Vectorised over k; lo = 0 at k = 0, hi = 1 at k = n."""
    from scipy.stats import beta

    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        lo = np.where(k > 0, beta.ppf(alpha / 2, np.maximum(k, 1), n - k + 1), 0.0)
        hi = np.where(k < n, beta.ppf(1 - alpha / 2, k + 1, np.maximum(n - k, 1)), 1.0)
    if lo.ndim == 0:
        return float(lo), float(hi)
    return lo, hi


def epsilon_from_rates(fpr, fnr, delta: float):
    """max(log((1 - delta - FNR) / FPR), log((1 - delta - FPR) / FNR)), at least 0 (vectorised)."""
    fpr, fnr = np.asarray(fpr, dtype=np.float64), np.asarray(fnr, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(1 - delta - fnr > 0, np.log(np.maximum(1 - delta - fnr, 1e-300)) - np.log(fpr),
                     -np.inf)
        b = np.where(1 - delta - fpr > 0, np.log(np.maximum(1 - delta - fpr, 1e-300)) - np.log(fnr),
                     -np.inf)
    e = np.maximum(np.maximum(a, b), 0.0)
    return float(e) if e.ndim == 0 else e


def mu_from_rates(fpr, fnr):
    """Phi^-1(1 - FPR) - Phi^-1(FNR), at least 0: the smallest mu of a mu-GDP mechanism that has
    a test with these rates (vectorised)."""
    from scipy.special import ndtri

    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.maximum(-ndtri(np.asarray(fpr, dtype=np.float64))
                       - ndtri(np.asarray(fnr, dtype=np.float64)), 0.0)
    m = np.where(np.isnan(m), 0.0, m)
    return float(m) if m.ndim == 0 else m


def gdp_epsilon(mu: float, delta: float) -> float:
    """epsilon at ``delta`` of a mu-GDP mechanism (= a Gaussian mechanism with multiplier 1/mu):
    the root of Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) = delta (Balle & Wang 2018)."""
    from scipy.optimize import brentq

    if not mu > 0:
        return 0.0
    if not math.isfinite(mu):
        return math.inf
    z, target = 1.0 / mu, math.log(delta)
    f = lambda e: gaussian_log_delta(z, e) - target  # noqa: E731  (decreasing in e)
    if f(0.0) <= 0:
        return 0.0
    hi = 1.0
    while f(hi) > 0:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    return float(brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-12))


def _counts(s0: np.ndarray, s1: np.ndarray, t) -> tuple[np.ndarray, np.ndarray]:
    """Errors of the test "D' iff statistic > t": false positives among s0, false negatives
    among s1 (``t`` scalar or array)."""
    a0, a1 = np.sort(s0), np.sort(s1)
    fp = len(a0) - np.searchsorted(a0, t, side="right")
    fn = np.searchsorted(a1, t, side="right")
    return fp, fn


def best_threshold(s0: np.ndarray, s1: np.ndarray, bound, alpha: float = 2 * TRAIN_TAIL) -> float:
    """The threshold (among the observed statistics) whose ``bound(FPR_hi, FNR_hi)`` is largest on
    this (training) sample; upper bounds are Clopper-Pearson at tail alpha / 2.

    The default tail, TRAIN_TAIL = 1e-3, is stricter than the test's: it discounts thresholds
    whose training rates rest on a handful of errors, which otherwise win the maximum by luck
    (the winner's curse) and do poorly on the test half."""
    cand = np.unique(np.concatenate([s0, s1]))
    fp, fn = _counts(s0, s1, cand)
    fpr_hi = clopper_pearson(fp, len(s0), alpha)[1]
    fnr_hi = clopper_pearson(fn, len(s1), alpha)[1]
    return float(cand[int(np.argmax(bound(fpr_hi, fnr_hi)))])


def audit_statistics(stat0, stat1, *, delta: float, confidence: float = 0.95) -> dict:
    """Threshold on the first half of each world's trials, rates and bounds on the second half.

    Returns the epsilon bound (with its interval), the GDP bound and the test's rates; see the
    module docstring for the confidence levels."""
    s0, s1 = np.asarray(stat0, dtype=np.float64), np.asarray(stat1, dtype=np.float64)
    h0, h1 = len(s0) // 2, len(s1) // 2
    tr0, te0, tr1, te1 = s0[:h0], s0[h0:], s1[:h1], s1[h1:]
    alpha = 1.0 - confidence
    a = alpha / 2  # per bound; per rate: two-sided at level 1 - a (tails a / 2)

    t_eps = best_threshold(tr0, tr1, lambda f, g: epsilon_from_rates(f, g, delta))
    fp, fn = (int(x) for x in _counts(te0, te1, t_eps))
    fpr_lo, fpr_hi = clopper_pearson(fp, len(te0), a)
    fnr_lo, fnr_hi = clopper_pearson(fn, len(te1), a)
    eps_lb = epsilon_from_rates(fpr_hi, fnr_hi, delta)
    eps_hi = epsilon_from_rates(fpr_lo, fnr_lo, delta)

    t_mu = best_threshold(tr0, tr1, mu_from_rates)
    gp, gn = (int(x) for x in _counts(te0, te1, t_mu))
    mu_lb = mu_from_rates(clopper_pearson(gp, len(te0), a)[1], clopper_pearson(gn, len(te1), a)[1])
    return {
        "epsilon_lower_bound": eps_lb,
        "ci": [eps_lb, eps_hi if math.isfinite(eps_hi) else None],
        "threshold": t_eps, "fpr": fp / len(te0), "fnr": fn / len(te1),
        "fpr_upper": fpr_hi, "fnr_upper": fnr_hi,
        "mu_lower_bound": mu_lb, "gdp_epsilon": gdp_epsilon(mu_lb, delta),
        "gdp_threshold": t_mu, "gdp_fpr": gp / len(te0), "gdp_fnr": gn / len(te1),
        "test_trials": [len(te0), len(te1)],
    }
