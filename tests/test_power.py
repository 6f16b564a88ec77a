"""The power study's maths (benchmarks/power_study.py, issue 65): the MDE of a nested design
(draws within seeds, corpora averaged), checked against the issue's own figures and against a
simulation of the model it assumes; the verdict rule; the decomposition's bookkeeping.

    python -m pytest -q tests/test_power.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import power_study as P  # noqa: E402


def test_mde_reproduces_the_issues_figures_for_issue_44s_design():
    """Issue 65: 3 seeds x 3 draws at N = 96, SD 0.0104 between draws and 0.0036 between seeds:
    MDE 0.016 at two-sided 10 % (the t(0.95, 2) rule) and 0.023 at two-sided 5 %."""
    assert P.mde(0.0036, 0.0104, 3, 3, alpha=0.10) == pytest.approx(0.016, abs=5e-4)
    assert P.mde(0.0036, 0.0104, 3, 3) == pytest.approx(0.023, abs=5e-4)


def test_mde_has_the_power_it_claims_and_tends_to_the_normal_formula():
    e = P.mde(0.004, 0.01, 6, 3, 2)
    se = P.endpoint_se(0.004, 0.01, 6, 3, 2)
    assert se == pytest.approx(math.sqrt((0.004 ** 2 + 0.01 ** 2 / 3) / 2 / 6))
    assert P.power(e, se, 5) == pytest.approx(0.8, abs=1e-6)
    big = P.mde(0.004, 0.01, 400, 3, 2)
    assert big == pytest.approx((1.959964 + 0.841621) * P.endpoint_se(0.004, 0.01, 400, 3, 2),
                                rel=0.01)
    assert P.mde(0.004, 0.01, 1, 3) == math.inf
    # more seeds, more draws, more corpora: never a larger MDE
    assert P.mde(0.004, 0.01, 8, 3, 2) < e and P.mde(0.004, 0.01, 6, 6, 2) < e
    assert P.mde(0.004, 0.01, 6, 3, 4) < e


def test_mde_matches_a_simulation_of_the_nested_model():
    """Seeds' true differences ~ N(effect, sd_seed^2) per corpus, draws ~ N(seed's, sd_draw^2):
    the t-test on the seeds' endpoint rejects at the MDE in about 80 % of 4,000 experiments,
    and at effect 0 in about 5 %."""
    from scipy import stats

    rng = np.random.default_rng(0)
    S, D, C, sd_s, sd_d = 5, 3, 2, 0.004, 0.01
    e = P.mde(sd_s, sd_d, S, D, C)

    def rate(effect, reps=4000):
        seeds = effect + rng.normal(0, sd_s, size=(reps, S, C, 1))
        draws = seeds + rng.normal(0, sd_d, size=(reps, S, C, D))
        end = draws.mean(axis=(2, 3))  # each seed's mean over corpora of its mean over draws
        t = end.mean(1) / (end.std(1, ddof=1) / math.sqrt(S))
        return float(np.mean(np.abs(t) > stats.t.ppf(0.975, S - 1)))

    assert rate(e) == pytest.approx(0.80, abs=0.025)
    assert rate(0.0) == pytest.approx(0.05, abs=0.012)


@pytest.mark.parametrize("vals,want", [
    ([0.010, 0.012, 0.011, 0.009], "beats"),
    ([-0.010, -0.012, -0.011, -0.009], "loses"),
    ([0.001, -0.001, 0.0005, -0.0004, 0.0002], "equivalent"),
    ([0.02, -0.02, 0.01, -0.015], "inconclusive"),
    ([0.01], "inconclusive"),
])
def test_verdict_rule(vals, want):
    v = P.verdict(vals)
    assert v["verdict"] == want
    if len(vals) > 1:
        assert v["ci95"][0] < v["ci90"][0] < v["mean"] < v["ci90"][1] < v["ci95"][1]


def test_source_sd_reads_a_runs_draws_for_both_arms():
    rows = [{"acc_minus_control": d, "arms": {"popri": {"accuracy": 0.3 + d},
                                              "t0": {"accuracy": 0.3}}}
            for d in (0.01, 0.02, 0.03)]
    s = P.source_sd(rows)
    assert s["reps"] == 3 and s["sd"] == pytest.approx(0.01) and s["mean"] == pytest.approx(0.02)
    assert s["sd_popri"] == pytest.approx(0.01) and s["sd_t0"] == 0.0


def test_the_cheapest_design_that_meets_the_goal():
    rows = P.designs(0.0036, 0.0104, 4, cost_seed_min=60, cost_draw_min=15,
                     seeds=range(2, 13), draws=range(1, 7))
    best = P.cheapest(rows)
    assert best is not None and best["mde"] <= P.GOAL
    cheaper = [r for r in rows if r["minutes"] < best["minutes"]]
    assert all(r["mde"] > P.GOAL for r in cheaper)
    assert best["minutes"] == best["seeds"] * 4 * (60 + best["draws"] * 15)
    assert P.cheapest(rows, goal=1e-6) is None


def test_the_plan_gives_each_corpus_its_own_seed_and_one_tuning():
    cmds = {(c, s): P.command(c, s) for c in P.CORPORA for s in P.SOURCES}
    assert len(set(P.SEEDS.values())) == len(P.CORPORA)
    for (c, s), cmd in cmds.items():
        assert f"--set=seed={P.SEEDS[c]}" in cmd and f"--set=draws={P.REPS + 1}" in cmd
        assert f"--set=draw_sources={P.SOURCES[s]}" in cmd
        assert ("--reuse-from" in cmd) == (s != "generation")
    from popri.pipeline import config as C

    sets = [a.split("=", 1)[1] for a in cmds[("ood", "test")] if a.startswith("--set=")]
    cfg = C.load(str(P.CONFIG), sets)
    assert cfg.draw_sources == ("test",) and cfg.num_synthetic == P.N
    assert cfg.data.source == "shakespeare" and cfg.privacy.epsilon == 1
