"""Numerical worst cases of popri's releases, independent of its accountants (a test helper).

    python -m pytest -q tests/test_worst_case.py

A lower bound on the true epsilon of a release at delta: one neighbouring pair of datasets and
the exact distributions of the release on each.  Every client's contribution lies along one
direction, so the release projected on it is a 1-D mixture of Gaussians of the noise std the
code adds (sigma); the pair is:

=====================  ==================================================================
sampling, relation     pair (C: one client's contribution bound; s: the replace-one bound,
                       2C for vectors, sqrt(2) M for non-negative votes)
=====================  ==================================================================
none, add/remove       N(0, sigma^2)  vs  N(C, sigma^2)
poisson(q), add/remove N(0)  vs  (1 - q) N(0) + q N(C)              (the canary joins w.p. q)
fixed(L of N),         N(0)  vs  (1 - p) N(0) + p N(-s),  p = L / (N + 1): every client at +C,
add/remove             the added one at -C; sampled (w.p. p) it DISPLACES one at +C
fixed(L of N),         (1 - g) N(0) + g N(+s/2)  vs  (1 - g) N(0) + g N(-s/2),  g = L / N
replace one client
=====================  ==================================================================

Each is binned on a fine grid (exact bin masses from the normal CDF, tails accurate in log
space); binning is post-processing, so the binned pair's hockey-stick divergence is at most the
true one (data-processing inequality): its epsilon(delta) is a LOWER bound on the release's.
One round: the exact divergence of the binned pair, both directions.  T rounds: the binned
pair's privacy-loss distribution (both directions) composed T times by dp-accounting with
``pessimistic_estimate=False`` (losses rounded down, truncated mass dropped): a lower bound again.

DP-FTRL trees (R <= 4 leaves: the R released prefix sums, node noise N(0, sigma^2) on every
node of the binary tree, :func:`tree_covariance`) are checked by Monte Carlo:
:func:`tree_delta` estimates delta(eps) of a Gaussian-mixture pair in R dimensions with an
empirical-Bernstein confidence bound (Maurer & Pontil 2009), whose lower end is a lower bound
on the true delta at that epsilon with the stated confidence.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import log_ndtr, logsumexp

#: a pair: (components of P, components of Q), each a list of (weight, mean)
Pair = tuple[list[tuple[float, float]], list[tuple[float, float]]]


def full_pair(shift: float) -> Pair:
    return [(1.0, 0.0)], [(1.0, float(shift))]


def poisson_pair(q: float, shift: float) -> Pair:
    return [(1.0, 0.0)], [(1.0 - q, 0.0), (q, float(shift))]


def displacement_pair(p: float, replace_shift: float) -> Pair:
    return [(1.0, 0.0)], [(1.0 - p, 0.0), (p, -float(replace_shift))]


def replace_pair(g: float, replace_shift: float) -> Pair:
    h = float(replace_shift) / 2.0
    return [(1.0 - g, 0.0), (g, h)], [(1.0 - g, 0.0), (g, -h)]


def _log_bin_masses(comps, sigma: float, edges: np.ndarray) -> np.ndarray:
    """log P(bin) for a Gaussian mixture: bins (-inf, e0], (e0, e1], ..., (e_last, inf).  Each
    bin's mass as a difference of log-CDFs on the side where both are small (accurate in the
    tails)."""
    out = np.full(len(edges) + 1, -np.inf)
    for w, m in comps:
        if w <= 0:
            continue
        x = (edges - m) / sigma
        lo = log_ndtr(x)            # log P(X <= e)
        hi = log_ndtr(-x)           # log P(X > e)
        parts = np.empty(len(edges) + 1)
        parts[0], parts[-1] = lo[0], hi[-1]
        left = x[1:] <= 0               # both edges left of the mean: CDF differences
        with np.errstate(divide="ignore", invalid="ignore"):
            d_left = lo[1:] + np.log1p(-np.exp(np.minimum(lo[:-1] - lo[1:], 0.0)))
            d_right = hi[:-1] + np.log1p(-np.exp(np.minimum(hi[1:] - hi[:-1], 0.0)))
        parts[1:-1] = np.where(left, d_left, d_right)
        out = np.logaddexp(out, math.log(w) + parts)
    return out


def binned(pair: Pair, sigma: float, bins: int = 40_000, width: float = 40.0):
    """(log pmf of P, log pmf of Q) on a common grid of ``bins`` cells over the means +- width
    sigma (and two tail cells)."""
    means = [m for _, m in pair[0] + pair[1]]
    lo, hi = min(means) - width * sigma, max(means) + width * sigma
    edges = np.linspace(lo, hi, bins + 1)
    return _log_bin_masses(pair[0], sigma, edges), _log_bin_masses(pair[1], sigma, edges)


def delta_of(lp: np.ndarray, lq: np.ndarray, eps: float) -> float:
    """Exact hockey-stick divergence of the binned pair at eps, the larger direction."""
    with np.errstate(over="ignore"):
        a = np.sum(np.maximum(np.exp(lp) - np.exp(eps + lq), 0.0))
        b = np.sum(np.maximum(np.exp(lq) - np.exp(eps + lp), 0.0))
    return float(max(a, b))


def epsilon_one_round(pair: Pair, sigma: float, delta: float) -> float:
    """The smallest eps with delta_of <= delta for the binned pair: a lower bound on the true
    epsilon of one release (bisection to 1e-6)."""
    lp, lq = binned(pair, sigma)
    if delta_of(lp, lq, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while delta_of(lp, lq, hi) > delta:
        lo, hi = hi, 2 * hi
        if hi > 1e4:
            return math.inf
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        if delta_of(lp, lq, mid) > delta:
            lo = mid
        else:
            hi = mid
    return lo  # the last eps known to violate delta: still a lower bound


def epsilon_composed(pair: Pair, sigma: float, rounds: int, delta: float,
                     interval: float = 1e-3) -> float:
    """A lower bound on the epsilon of ``rounds`` independent releases of the pair: the binned
    pair's PLD (both directions) composed by dp-accounting, optimistic estimate."""
    if rounds == 1:
        return epsilon_one_round(pair, sigma, delta)
    from dp_accounting.pld import privacy_loss_distribution as PLD

    lp, lq = binned(pair, sigma, bins=20_000)
    keep = (lp > -700) | (lq > -700)  # masses below e^-700 are 0 in float64 anyway
    lower = {i: float(v) for i, v in enumerate(lp) if keep[i] and v > -np.inf}
    upper = {i: float(v) for i, v in enumerate(lq) if keep[i] and v > -np.inf}
    pld = PLD.from_two_probability_mass_functions(lower, upper, pessimistic_estimate=False,
                                                  value_discretization_interval=interval,
                                                  symmetric=False)
    return float(pld.self_compose(int(rounds)).get_epsilon_for_delta(delta))


# --------------------------------------------------------------------------- trees
def prefix_nodes(step: int) -> list[tuple[int, int]]:
    """The binary-tree nodes summed into the prefix up to ``step`` (1-based), as DP-FTRL's
    tree aggregation does (written here again, independently of popri.privacy.tree)."""
    return [(lv, (step >> lv) - 1) for lv in range(step.bit_length() - 1, -1, -1)
            if (step >> lv) & 1]


def tree_covariance(R: int, sigma: float) -> np.ndarray:
    """Covariance of the R released prefix-sum noises: each node N(0, sigma^2), independent."""
    nodes = sorted({n for s in range(1, R + 1) for n in prefix_nodes(s)})
    A = np.array([[1.0 if n in prefix_nodes(s) else 0.0 for n in nodes]
                  for s in range(1, R + 1)])
    return sigma * sigma * A @ A.T


def leaf_effect(R: int, leaf: int, amount: float) -> np.ndarray:
    """The prefix sums' shift when leaf ``leaf`` (1-based) moves by ``amount``."""
    return np.array([amount if s >= leaf else 0.0 for s in range(1, R + 1)])


def tree_delta(p_means, q_means, cov: np.ndarray, eps: float, *, samples: int = 400_000,
               alpha: float = 1e-6, seed: int = 0) -> tuple[float, float]:
    """Monte Carlo estimate of delta(eps) for the pair P = sum_i w_i N(p_i, cov), Q = sum_j
    v_j N(q_j, cov) (both directions, the larger), and the lower end of its confidence
    interval: the integrand 1 - e^(eps - L) clipped to [0, 1] has its empirical-Bernstein bound
    sqrt(2 V ln(2/alpha) / n) + 7 ln(2/alpha) / (3 (n - 1)) (Maurer & Pontil 2009), so the true
    delta is >= estimate - bound with probability >= 1 - alpha per direction."""
    rng = np.random.default_rng(seed)
    L = np.linalg.cholesky(cov)
    Pi = np.linalg.inv(cov)

    def logpdf(y, comps):
        out = []
        for w, m in comps:
            d = y - m
            out.append(math.log(w) - 0.5 * np.einsum("ni,ij,nj->n", d, Pi, d))
        return logsumexp(np.stack(out), axis=0)

    def sample(comps, n):
        ws = np.array([w for w, _ in comps])
        k = rng.choice(len(comps), size=n, p=ws / ws.sum())
        means = np.stack([m for _, m in comps])[k]
        return means + rng.standard_normal((n, cov.shape[0])) @ L.T

    out = []
    for a, b in ((p_means, q_means), (q_means, p_means)):
        y = sample(a, samples)
        loss = logpdf(y, a) - logpdf(y, b)
        f = np.clip(1.0 - np.exp(np.minimum(eps - loss, 50.0)), 0.0, 1.0)
        m, v = float(f.mean()), float(f.var(ddof=1))
        bound = (math.sqrt(2 * v * math.log(2 / alpha) / samples)
                 + 7 * math.log(2 / alpha) / (3 * (samples - 1)))
        out.append((m, m - bound))
    return max(out, key=lambda r: r[1])
