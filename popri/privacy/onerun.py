"""One-run privacy auditing: a lower bound on epsilon from m canaries in ONE run (Steinke, Nasr,
Jagielski, "Privacy auditing with one (1) training run", NeurIPS 2023, arXiv:2305.08846).

    python -c "from popri.privacy.onerun import epsilon_lower_bound as e; print(e(m=200, r=40, v=40, delta=3e-6))"

The game (section 3 of the paper).  Each of m canaries is included in the private data
independently with probability 1/2 (S in {-1, +1}^m, recorded); the algorithm runs once on the
data; the auditor sees only what the run releases, scores every canary, and guesses "in" for its
k_+ highest scores and "out" for its k_- lowest (r = k_+ + k_- guesses, the rest abstentions).
If the algorithm is (eps, delta)-DP under the relation that makes each canary one unit of
privacy (here: add or remove one client, each canary one client), the number W of correct
guesses is stochastically dominated as their Theorem 3 (with delta; Theorem 1 for delta = 0)
says: for every v,

    P[W >= v] <= beta + alpha * delta * 2 m,
    beta  = P[Binomial(r, q) >= v],   q = e^eps / (1 + e^eps),
    alpha = max_{1 <= i <= v} P[v > Binomial(r, q) >= v - i] / i,

(:func:`p_value`, the paper's own algorithm for the bound).  A run in which the auditor got v of
r right therefore refutes (eps, delta)-DP at significance p when that tail is below p; the
largest such eps is the audit's lower bound (:func:`epsilon_lower_bound`, bisection: the tail
falls as eps grows).  It is a lower bound on the epsilon the run really has -- never a proof of
privacy: a weak attack gives a small bound on a leaky run.
"""

from __future__ import annotations

import math

#: bisection steps of :func:`epsilon_lower_bound` (the bound to ~1e-9 relative of its bracket)
STEPS = 60


def p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P[at least ``v`` of ``r`` guesses correct] under (eps, delta)-DP with ``m`` canaries,
    each included w.p. 1/2 (Steinke et al. 2023, Theorem 3; delta = 0 is Theorem 1: a
    Binomial(r, e^eps / (1 + e^eps)) tail).  Refuses what the theorem does not cover."""
    from scipy import stats

    if not (0 <= v <= r <= m):
        raise ValueError(f"need 0 <= v <= r <= m (got v={v}, r={r}, m={m})")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be finite and >= 0 (got {eps})")
    if not (0 <= delta <= 1):
        raise ValueError(f"delta must be in [0, 1] (got {delta})")
    if v == 0:
        return 1.0
    q = 1.0 / (1.0 + math.exp(-eps))  # the accuracy of eps-DP randomized response
    beta = float(stats.binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    if delta == 0:
        return min(beta, 1.0)
    alpha, tail = 0.0, 0.0  # tail = P[v > Binomial(r, q) >= v - i]
    for i in range(1, v + 1):
        tail += float(stats.binom.pmf(v - i, r, q))
        alpha = max(alpha, tail / i)
    return min(beta + alpha * delta * 2 * m, 1.0)


def epsilon_lower_bound(*, m: int, r: int, v: int, delta: float,
                        significance: float = 0.05) -> float:
    """The largest eps that ``v`` correct of ``r`` guesses (``m`` canaries) refutes at
    ``significance``: sup {eps : p_value(m, r, v, eps, delta) < significance}, 0 when even
    eps = 0 is not refuted (a fair coin does as well).  The p-value falls as eps grows, so the
    bound is found by bisection on a bracket doubled until the claim is no longer refuted."""
    if not (0 < significance < 1):
        raise ValueError(f"significance must be in (0, 1) (got {significance})")
    if p_value(m, r, v, 0.0, delta) >= significance:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < significance:
        lo, hi = hi, 2 * hi
        if hi > 1e4:  # v = r with a vanishing delta term: refuted for every eps we can name
            return math.inf
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        if p_value(m, r, v, mid, delta) < significance:
            lo = mid
        else:
            hi = mid
    return lo


def guesses(scores, included, k_plus: int, k_minus: int) -> dict:
    """The auditor's guesses from membership ``scores`` (higher = more likely in): "in" for the
    ``k_plus`` highest, "out" for the ``k_minus`` lowest (ties broken by position, which the
    scores do not see); the count correct against the recorded draw ``included``."""
    import numpy as np

    s = np.asarray(scores, dtype=np.float64)
    inc = np.asarray(included, dtype=bool)
    m = len(s)
    if len(inc) != m:
        raise ValueError(f"{m} scores for {len(inc)} canaries")
    if not np.all(np.isfinite(s)):
        raise ValueError("every membership score must be finite")
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > m:
        raise ValueError(f"need k_plus, k_minus >= 0 and k_plus + k_minus <= m = {m}")
    order = np.argsort(-s, kind="stable")
    top, bottom = order[:k_plus], order[m - k_minus:] if k_minus else order[:0]
    correct = int(inc[top].sum() + (~inc[bottom]).sum())
    return {"m": m, "r": k_plus + k_minus, "k_plus": k_plus, "k_minus": k_minus,
            "correct": correct}


def audit(scores, included, *, delta: float, significance: float = 0.05,
          ks=None) -> dict:
    """The best bound over the guess counts ``ks`` (each a (k_plus, k_minus); default: k_+ =
    k_- = k for k in 5 %, 10 %, 20 %, 50 % of m), each at ``significance`` / len(ks)
    (Bonferroni: the reported bound holds at ``significance`` for the whole search)."""
    m = len(scores)
    if ks is None:
        ks = sorted({(max(1, int(f * m) // 2),) * 2 for f in (0.05, 0.1, 0.2, 0.5)})
    rows = []
    for kp, km in ks:
        g = guesses(scores, included, kp, km)
        g["eps_lower"] = epsilon_lower_bound(m=g["m"], r=g["r"], v=g["correct"], delta=delta,
                                             significance=significance / len(ks))
        rows.append(g)
    best = max(rows, key=lambda g: (g["eps_lower"], -g["r"]))
    return {**best, "delta": delta, "significance": significance, "searched": rows}
