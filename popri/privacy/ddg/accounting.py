"""The distributed discrete Gaussian's privacy: the paper's concentrated-DP epsilon of one
round (:func:`epsilon_cdp`), its RDP curve with Poisson subsampling (:func:`rdp`) and the ledger
entry's parameters (:func:`ledger_params`).  The overview, the paper and the maths:
:mod:`popri.privacy.ddg`.

    python -m pytest -q tests/test_ddg.py tests/test_worst_case.py

Pure maths: numpy, scipy and the standard library only.
"""

from __future__ import annotations

import math

import numpy as np

from popri.privacy.ddg.planning import DDGPlan

#: tau's series is summed term by term up to this many terms; beyond, every term is bounded by
#: the last one (the terms decrease in k): an upper bound on tau
TAU_TERMS = 1_000_000


# --------------------------------------------------------------------------- privacy
def tau(local_sigma: float, noisy: int) -> float:
    """The paper's tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 s^2 k/(k+1)) (Theorem 1; the loop in
    the authors' ``ddgauss_epsilon``): 0 for one share; an upper bound beyond TAU_TERMS terms."""
    n = int(noisy)
    if n <= 1:
        return 0.0
    a = 2.0 * math.pi ** 2 * float(local_sigma) ** 2
    K = min(n - 1, TAU_TERMS)
    k = np.arange(1, K + 1, dtype=np.float64)
    t = float(np.exp(-a * k / (k + 1.0)).sum())
    if n - 1 > K:
        t += (n - 1 - K) * math.exp(-a * K / (K + 1.0))
    return 10.0 * t


def cdp_epsilon(delta2: float, local_sigma: float, noisy: int, dim: int) -> float:
    """eps with (1/2) eps^2-concentrated DP for the sum of ``noisy`` N_Z(0, s^2)^d shares and
    L2 sensitivity ``delta2`` (integer units): see the module docstring.  inf without noise."""
    n, s, d2 = int(noisy), float(local_sigma), float(delta2)
    if n < 1 or s <= 0:
        return math.inf
    sd = math.sqrt(n) * s
    l2 = d2 / sd
    l1 = min(math.sqrt(dim) * d2, d2 * d2) / sd
    t = tau(s, n)
    if t == 0.0:
        return l2
    return min(l2 + t * math.sqrt(dim), math.sqrt(l2 * l2 + 2.0 * l1 * t + t * t * dim))


def epsilon_cdp(p: DDGPlan, noisy: int) -> float:
    """The paper's concentrated-DP eps (the sum is (1/2) eps^2-CDP) with ``noisy`` noise shares
    of N_Z(0, p.local_sigma^2) and L2 sensitivity :attr:`DDGPlan.sensitivity` (sens_factor *
    Delta_2; :func:`cdp_epsilon`)."""
    return cdp_epsilon(p.sensitivity, p.local_sigma, noisy, p.noise_dim)


def effective_noise_multiplier(p: DDGPlan, noisy: int) -> float:
    """sqrt(noisy) * local_sigma / sensitivity (sens_factor * Delta_2): the continuous Gaussian
    this round is compared with (for messages and the ledger's ``noise_multiplier``; the DDG's
    eps is >= that Gaussian's)."""
    return math.sqrt(max(int(noisy), 0)) * p.local_sigma / p.sensitivity


def nominal_params(z: float) -> dict:
    """Ledger ``params`` of a prospective distributed-discrete-Gaussian release at the asked
    noise multiplier ``z`` (what ``popri run`` calibrates and budgets with): the Flower engine
    scales the noise shares to the rounded sensitivity, so the recorded z is the asked one, with
    a negligible tau (the shares are many integer units wide)."""
    return {"dim": 1, "noisy": 1, "local_sigma": z * 1e6, "delta2": 1e6}


def ledger_params(p: DDGPlan, noisy: int, release: bool = False) -> dict:
    """The ``params`` of a ledger entry for mechanism ``distributed_discrete_gaussian``: the plan
    (:meth:`DDGPlan.to_dict`) plus ``noisy`` (noise shares guaranteed in the sum) and, for
    reading, ``epsilon_cdp`` (None when infinite).  ``release``: without the plan's ``clients``
    (the round's participant count, private under add/remove-one-client neighbours; the
    accountant reads only ``dim``, ``noisy``, ``local_sigma`` and ``delta2``)."""
    e = epsilon_cdp(p, noisy)
    # the accountant's dim is the length of the noised integer vectors (D when rotated), its
    # delta2 the sum's sensitivity under the entry's relation (sens_factor * Delta_2; the
    # rounding bound each client's vector keeps is rounding_delta2)
    d = {**p.to_dict(), "dim": p.noise_dim, "vector_dim": p.dim, "noisy": int(noisy),
         "delta2": p.sensitivity, "rounding_delta2": p.delta2,
         "epsilon_cdp": e if math.isfinite(e) else None}
    if release:
        d.pop("clients")
    return d


def _log_comb(n: int, k: np.ndarray) -> np.ndarray:
    from scipy.special import gammaln  # lazy: scipy.special costs ~0.2 s at start-up

    return gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0)


def subsampled_rdp(alpha: int, q: float, rdp_of) -> float:
    """Zhu & Wang, "Poisson Subsampled Renyi Differential Privacy", ICML 2019, Theorem 6
    (general upper bound, any mechanism with RDP curve ``rdp_of``), integer alpha >= 2::

        1/(alpha-1) log[ (1-q)^(alpha-1) (alpha q - q + 1)
                         + C(alpha,2) q^2 (1-q)^(alpha-2) e^{eps(2)}
                         + 3 sum_{l=3}^{alpha} C(alpha,l) q^l (1-q)^(alpha-l) e^{(l-1) eps(l)} ]

    (as ``_compute_rdp_subsampled(upper_bound=True)`` of the DDG authors' code)."""
    a = int(alpha)
    if a != alpha or a < 2:
        raise ValueError(f"alpha must be an integer >= 2 (got {alpha})")
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1) (got {q})")
    lq, l1q = math.log(q), math.log1p(-q)
    terms = [(a - 1) * l1q + math.log1p((a - 1) * q),
             float(_log_comb(a, np.array(2.0))) + 2 * lq + (a - 2) * l1q + rdp_of(2)]
    if a >= 3:
        ls = np.arange(3, a + 1, dtype=np.float64)
        eps_l = np.array([rdp_of(int(v)) for v in ls], dtype=np.float64)
        terms.extend(math.log(3.0) + _log_comb(a, ls) + ls * lq + (a - ls) * l1q
                     + (ls - 1.0) * eps_l)
    from scipy.special import logsumexp  # lazy: as in _log_comb

    return float(logsumexp(terms)) / (a - 1)


def rdp(orders, eps_cdp: float, q: float = 1.0) -> np.ndarray:
    """Renyi DP at ``orders`` of one DDG release that is (1/2) eps^2-CDP (RDP alpha eps^2 / 2 at
    every order alpha), on a Poisson sample of clients at rate ``q``: q = 1 that curve; q < 1
    the smaller of it and :func:`subsampled_rdp` at integer orders, inf at the others."""
    orders = np.asarray(orders, dtype=np.float64)
    rho = float(eps_cdp) ** 2 / 2.0
    full = orders * rho
    if not math.isfinite(rho):
        return np.full_like(orders, math.inf)
    if q >= 1:
        return full
    out = np.full_like(orders, math.inf)
    cache: dict[int, float] = {}
    for i, a in enumerate(orders):
        if a >= 2 and a == int(a):
            ai = int(a)
            if ai not in cache:
                cache[ai] = subsampled_rdp(ai, q, lambda l: l * rho)
            out[i] = min(full[i], cache[ai])
    return out
