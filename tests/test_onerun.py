"""The one-run bound of Steinke, Nasr, Jagielski (arXiv:2305.08846), popri/privacy/onerun.py:
its closed form at delta = 0, its validity by simulation against the worst eps-DP mechanism (each
guess right with probability e^eps / (1 + e^eps): randomized response), the delta term, and the
guesses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from popri.privacy import onerun as O


def test_perfect_guesses_at_delta_0_have_the_closed_form():
    """delta = 0, all r right: P[Bin(r, q) >= r] = q^r, so the bound is logit(p^(1/r))."""
    for r in (10, 50, 200):
        q = 0.05 ** (1 / r)
        want = math.log(q / (1 - q))
        got = O.epsilon_lower_bound(m=1000, r=r, v=r, delta=0.0, significance=0.05)
        assert got == pytest.approx(want, rel=1e-6), (r, got, want)


def test_chance_accuracy_gives_no_bound_and_more_right_gives_more():
    assert O.epsilon_lower_bound(m=200, r=100, v=50, delta=0.0) == 0.0
    bounds = [O.epsilon_lower_bound(m=200, r=100, v=v, delta=1e-5) for v in (60, 70, 80, 90, 100)]
    assert bounds == sorted(bounds) and bounds[0] < bounds[-1], bounds


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 60), st.floats(0.0, 4.0), st.floats(1e-9, 1e-2))
def test_the_delta_term_only_raises_the_p_value(r, eps, delta):
    m = 2 * r
    for v in {0, r // 2, r}:
        a, b = O.p_value(m, r, v, eps, 0.0), O.p_value(m, r, v, eps, delta)
        assert 0.0 <= a <= b <= 1.0


def test_the_alpha_term_matches_its_vectorised_form():
    """alpha = max_i P[v > Bin(r, q) >= v - i] / i, recomputed with survival functions."""
    from scipy import stats

    m, r, v, eps, delta = 500, 120, 95, 1.3, 1e-4
    q = 1 / (1 + math.exp(-eps))
    beta = stats.binom.sf(v - 1, r, q)
    i = np.arange(1, v + 1)
    alpha = np.max((stats.binom.sf(v - i - 1, r, q) - beta) / i)
    assert O.p_value(m, r, v, eps, delta) == pytest.approx(min(beta + alpha * delta * 2 * m, 1),
                                                           rel=1e-9)


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_the_bound_exceeds_the_true_epsilon_at_most_at_its_significance(eps):
    """Randomized response at eps is the mechanism the theorem is tight for: each of r guesses
    is right independently w.p. e^eps / (1 + e^eps).  Over 4000 audits the bound exceeds eps in
    at most 5 % of them (plus 3 binomial SDs)."""
    rng = np.random.default_rng(7)
    q = 1 / (1 + math.exp(-eps))
    r, trials = 100, 4000
    v = rng.binomial(r, q, size=trials)
    over = sum(O.epsilon_lower_bound(m=r, r=r, v=int(x), delta=0.0) > eps for x in np.unique(v)
               for _ in range(int((v == x).sum())))
    assert over / trials <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials), over / trials


def test_guesses_count_top_in_and_bottom_out():
    scores = [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    included = [True, False, True, False, False, True]
    g = O.guesses(scores, included, 2, 2)
    # top 2: idx 0 (in, right), 1 (out, wrong); bottom 2: idx 4 (out, right), 5 (in, wrong)
    assert g == {"m": 6, "r": 4, "k_plus": 2, "k_minus": 2, "correct": 2}
    with pytest.raises(ValueError, match="finite"):
        O.guesses([1.0, math.nan], [True, False], 1, 1)
    with pytest.raises(ValueError, match="k_plus"):
        O.guesses(scores, included, 4, 4)


def test_audit_takes_the_best_k_at_a_bonferroni_level():
    rng = np.random.default_rng(0)
    inc = rng.random(400) < 0.5
    scores = inc * 3.0 + rng.standard_normal(400)  # a strong attack
    a = O.audit(scores, inc, delta=1e-5)
    assert a["eps_lower"] > 1.0 and len(a["searched"]) == 4
    assert all(s["eps_lower"] <= a["eps_lower"] for s in a["searched"])
    # each row's bound is at significance / 4: the same counts at 0.05 give at least as much
    row = a["searched"][0]
    assert O.epsilon_lower_bound(m=400, r=row["r"], v=row["correct"], delta=1e-5) >= row["eps_lower"]
    blind = O.audit(rng.standard_normal(400), inc, delta=1e-5)  # scores that know nothing
    assert blind["eps_lower"] < 0.5


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 80), st.floats(0.0, 5.0), st.sampled_from([0.0, 1e-6, 1e-4, 1e-2]),
       st.data())
def test_the_p_value_is_the_papers_appendix_d_running_sum(r, eps, delta, data):
    """Steinke et al.'s Appendix D computes the alpha term as a running sum of binomial pmfs
    (i = 1 .. v, alpha = max of the partial sums over i); the same from its definition here, on a
    grid of (m, r, v, eps, delta)."""
    from scipy import stats

    v = data.draw(st.integers(0, r))
    m = data.draw(st.integers(r, 4 * r))
    q = 1 / (1 + math.exp(-eps))
    beta = stats.binom.sf(v - 1, r, q)
    alpha, run = 0.0, 0.0
    for i in range(1, v + 1):
        run += stats.binom.pmf(v - i, r, q)
        alpha = max(alpha, run / i)
    want = min(beta + alpha * delta * 2 * m, 1.0)
    assert O.p_value(m, r, v, eps, delta) == pytest.approx(want, rel=1e-7, abs=1e-12)
