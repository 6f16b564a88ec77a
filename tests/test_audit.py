"""popri audit release: the empirical lower bound stays under the claim on the real mechanisms and
exceeds it on deliberately broken ones (popri/apps/audit/)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import beta

from popri.apps import audit as A
from popri.methods.fred import stats as fred
from popri.federated import participation
from popri.feedback import cosine
from popri.privacy.accounting import epsilon

DELTA = 3e-6
Z = 3.0  # one release at q = 1: rdp epsilon 1.48 at delta 3e-6


def _audit(mechanism, trials, *, brk=None, seed=0, z=Z, **kw):
    claim = epsilon(z, 1.0, 1, DELTA)
    return A.audit(A.Setup(mechanism, z, trials, seed=seed, brk=brk, **kw), claimed=claim,
                   delta=DELTA)


# --------------------------------------------------------------------------- statistics
def test_clopper_pearson_matches_scipy_on_a_hand_case():
    lo, hi = A.clopper_pearson(3, 100, 0.05)
    assert lo == pytest.approx(beta.ppf(0.025, 3, 98), rel=1e-12)
    assert hi == pytest.approx(beta.ppf(0.975, 4, 97), rel=1e-12)
    # no errors: the exact closed form 1 - (alpha/2)^(1/n), and lo = 0
    lo, hi = A.clopper_pearson(0, 5000, 0.05)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 5000), rel=1e-9)
    assert A.clopper_pearson(7, 7, 0.05)[1] == 1.0
    los, his = A.clopper_pearson(np.array([0, 3, 100]), 100, 0.05)
    assert his[1] == pytest.approx(hi := beta.ppf(0.975, 4, 97)) and los[2] > 0.9 and hi < 1


def test_epsilon_and_mu_from_rates_hand_cases():
    assert A.epsilon_from_rates(0.01, 0.5, 0.0) == pytest.approx(math.log(50))
    assert A.epsilon_from_rates(0.5, 0.01, 0.0) == pytest.approx(math.log(50))  # the other side
    assert A.epsilon_from_rates(0.5, 0.5, 0.0) == 0.0  # a coin flip certifies nothing
    assert A.mu_from_rates(0.5, 0.5) == 0.0
    # a 1-GDP mechanism's test at its midpoint: FPR = FNR = Phi(-1/2)
    from scipy.stats import norm
    assert A.mu_from_rates(norm.cdf(-0.5), norm.cdf(-0.5)) == pytest.approx(1.0)


@pytest.mark.parametrize("z", [1.0, 3.0])
def test_gdp_epsilon_is_the_gaussian_mechanisms_epsilon(z):
    """mu-GDP at mu = 1/z is the Gaussian mechanism: the same epsilon as the PLD accountant."""
    assert A.gdp_epsilon(1 / z, DELTA) == pytest.approx(epsilon(z, 1.0, 1, DELTA, "pld"),
                                                       abs=2e-3)


# --------------------------------------------------------------------------- real mechanisms
@pytest.mark.parametrize("mechanism", ["cosine", "nn-histogram", "fred"])
def test_real_mechanism_lower_bound_stays_under_the_claim(mechanism):
    r = _audit(mechanism, 4000)
    assert 1.0 < r["claimed_epsilon"] < 2.0
    assert r["epsilon_lower_bound"] <= r["claimed_epsilon"]
    assert r["gdp_epsilon"] <= r["claimed_epsilon"]
    assert r["mu_lower_bound"] <= 1 / Z
    assert r["verdict"] == "ok" and r["violations"] == []
    assert 0 <= r["ci"][0] <= (r["ci"][1] if r["ci"][1] is not None else math.inf)
    assert r["test_trials"] == [2000, 2000]


def test_the_audit_has_power_on_the_real_mechanism():
    """Not vacuous: 10,000 trials of the real nn-histogram certify most of its mu = 1/z."""
    r = _audit("nn-histogram", 10000, z=1.0)
    assert 0.8 < r["mu_lower_bound"] <= 1.0
    assert r["epsilon_lower_bound"] > 1.5


# --------------------------------------------------------------------------- broken mechanisms
@pytest.mark.parametrize("brk", ["no-clip", "half-noise"])
@pytest.mark.parametrize("mechanism,trials", [("cosine", 10000), ("nn-histogram", 4000),
                                              ("fred", 2000)])
def test_broken_mechanism_is_flagged(mechanism, trials, brk):
    r = _audit(mechanism, trials, brk=brk)
    assert r["verdict"] == "violation"
    assert max(r["epsilon_lower_bound"], r["gdp_epsilon"]) > r["claimed_epsilon"]
    assert r["violations"][0].startswith("VIOLATION: empirical lower bound ")
    assert f"> claimed eps {r['claimed_epsilon']:.4f}" in r["violations"][0]
    if brk == "no-clip":  # the canary's 10x contribution is certified by (eps, delta) alone
        assert r["epsilon_lower_bound"] > 2 * r["claimed_epsilon"]
    else:
        assert r["noise_multiplier_run"] == Z / 2 and r["noise_multiplier"] == Z


def test_breaks_leave_the_library_untouched():
    before = (cosine.cosine_coefficients, participation.cap_per_client, fred.clip_rows)
    for mechanism in ("cosine", "nn-histogram", "fred"):
        _audit(mechanism, 200, brk="no-clip")
    assert (cosine.cosine_coefficients, participation.cap_per_client, fred.clip_rows) == before
    x = np.array([[3.0, 4.0]])
    assert np.allclose(fred.clip_rows(x, 1.0), [[0.6, 0.8]])


# Found by this audit (issue 9): the cosine mean used to divide the noisy sum by the realised
# client count, private under add/remove-one-client neighbours; on this dataset (every other
# client mirrors the canary) the release was ~2/z-GDP, not 1/z.  Now only a public count divides.
def test_cosine_mean_keeps_its_claim_on_an_adversarial_dataset():
    r = _audit("cosine", 10000, z=1.0, dataset="adversarial")
    assert r["verdict"] == "ok", r["violations"]


# --------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("mechanism", ["cosine", "fred"])
def test_same_seed_same_result(mechanism):
    a = json.dumps(_audit(mechanism, 600, seed=5))
    assert json.dumps(_audit(mechanism, 600, seed=5)) == a
    assert json.dumps(_audit(mechanism, 600, seed=6)) != a


def test_trial_noise_is_each_trials_own_seeded_stream():
    from popri.privacy.noise import make_rng

    seeds = A.trial_seeds(0, 1, 3)
    draws = A.TrialNoise(seeds, "noise").standard_normal(4)
    assert draws.shape == (3, 4)
    assert np.array_equal(draws[2], make_rng(int(seeds[2]), stream="noise").standard_normal(4))
    assert not np.array_equal(A.trial_seeds(0, 0, 3), seeds)  # D and D' draw independently


# --------------------------------------------------------------------------- the command
def test_cli_table_json_and_violation(run_popri):
    p = run_popri(["audit", "release", "--mechanism", "cosine", "-z", "3", "--trials", "2000"])
    assert p.returncode == 0, p.stderr
    head, row = p.stdout.splitlines()
    for col in ("mechanism", "claimed eps", "eps lower bound", "CI", "trials", "FPR", "FNR",
                "verdict"):
        assert col in head
    assert row.split()[0] == "cosine" and row.split()[-1] == "ok"
    assert "VIOLATION" not in p.stdout

    p = run_popri(["audit", "release", "--mechanism", "cosine", "-z", "3", "--trials", "2000",
                   "--break", "no-clip", "--json"])
    assert p.returncode == 1, p.stderr
    obj = json.loads(p.stdout)  # one JSON object, nothing else on stdout
    assert obj["verdict"] == "violation" and obj["break"] == "no-clip"
    assert obj["epsilon_lower_bound"] > obj["claimed_epsilon"]
    assert "VIOLATION: empirical lower bound" in p.stderr

    p = run_popri(["audit", "release", "--mechanism", "cosine", "-z", "3", "--trials", "10000",
                   "--break", "half-noise"])
    assert p.returncode == 1
    assert any(line.startswith("VIOLATION: empirical lower bound ") and "> claimed eps 1.4"
               in line for line in p.stdout.splitlines())


def test_cli_bad_input_one_line_exit_2(run_popri, tmp_path):
    for args, field in ((["--mechanism", "laplace", "-z", "1"], "--mechanism"),
                        (["--mechanism", "cosine"], "--noise-multiplier"),
                        (["--mechanism", "cosine", "-z", "nan"], "--noise-multiplier"),
                        (["--mechanism", "nn-histogram", "-z", "1", "--clip", "2"], "--clip"),
                        (["--mechanism", "cosine", "-z", "1", "--break", "x"], "--break"),
                        (["--mechanism", "fred", "--epsilon", "2"], "--epsilon")):
        p = run_popri(["audit", "release", *args, "--trials", "1000"], cwd=tmp_path)
        assert p.returncode == 2, (args, p.stderr)
        assert p.stdout == "" and len(p.stderr.strip().splitlines()) == 1
        assert p.stderr.startswith("popri: error:") and field in p.stderr
    assert list(tmp_path.iterdir()) == []  # no ledger, nothing written


def test_cli_help_lists_audit_and_its_options(run_popri):
    assert "audit" in run_popri(["--help"], check=True).stdout
    p = run_popri(["audit", "release", "--help"], env={"COLUMNS": "200"}, check=True)
    for opt in ("--mechanism", "--trials", "--noise-multiplier", "--epsilon", "--delta", "--clip",
                "--max-samples-per-client", "--clients", "--synthetic", "--dim", "--seed",
                "--json", "--break", "VIOLATION: empirical lower bound X > claimed eps Y"):
        assert opt in p.stdout, opt


# --------------------------------------------------------------------------- issue 23, item 5
def _spec(mechanism, trials, **kw):
    from popri.specs.privacy import AuditSpec

    return AuditSpec(mechanism=mechanism, trials=trials, synthetic=50, **kw)


@pytest.mark.parametrize("mechanism,kw,brk", [
    # the distributed discrete Gaussian through the Flower nodes' encoding (4 SuperNodes):
    # the canary's unclipped vector (10 C) is certified by (eps, delta) alone
    ("ddg", dict(noise_multiplier=2.0), "no-clip"),
    # a DP-FTRL tree of 8 leaves, every prefix released; the canary in two leaves of one tree
    # (what epoch-wise participation forbids) doubles its weight in the shared nodes
    ("tree", dict(noise_multiplier=2.0), "two-leaves"),
    ("tree", dict(noise_multiplier=2.0), "half-noise"),
    # a Poisson-subsampled cosine round at q = 0.01, claimed with PLD: a sample the adversary
    # can recompute (the canary always in it) voids the amplification the ledger claims
    ("subsampled", dict(noise_multiplier=1.0, accountant="pld", delta=1e-5), "public-sample"),
])
def test_every_mechanism_keeps_its_claim_and_its_broken_variant_is_flagged(mechanism, kw, brk):
    real = A.run(_spec(mechanism, 2000, **kw), seed=0)
    assert real["verdict"] == "ok", real["violations"]
    assert real["epsilon_lower_bound"] <= real["claimed_epsilon"]
    bad = A.run(_spec(mechanism, 2000, brk=brk, **kw), seed=0)
    assert bad["verdict"] == "violation", bad
    assert bad["claimed_epsilon"] == pytest.approx(real["claimed_epsilon"])


def test_the_new_mechanisms_claim_their_ledger_entrys_epsilon():
    from popri.privacy import accounting as Acc
    from popri.privacy.tree import depth

    r = A.run(_spec("tree", 200, noise_multiplier=2.0, leaves=8), seed=0)
    assert r["claimed_mu"] == pytest.approx(math.sqrt(depth(8)) / 2.0)
    assert r["claimed_epsilon"] == pytest.approx(
        Acc.epsilon(2.0 / math.sqrt(depth(8)), 1.0, 1, r["delta"], "rdp"))
    s = A.run(_spec("subsampled", 200, noise_multiplier=1.0, sample_rate=0.05), seed=0)
    assert s["claimed_epsilon"] == pytest.approx(Acc.epsilon(1.0, 0.05, 1, s["delta"], "rdp"))
    d = A.run(_spec("ddg", 200, noise_multiplier=2.0), seed=0)
    assert d["claimed_mu"] == pytest.approx(0.5, rel=1e-6) and d["nodes"] == 4


def test_the_displacement_pair_replays_what_fixed_size_sampling_does():
    """--mechanism fixed (issue 36): D' adds a client at -C among N at +C; the library's sampler
    takes it w.p. L / (N + 1) and it then displaces one, so D' is a mixture with weight
    L / (N + 1) at a 2C shift.  Held to the entry of one round: replace one client with twice
    the noise (popri 0.4), or with --convention papers popri 0.3's add/remove entry at the old
    noise (labelled NOT A DP GUARANTEE).  100,000 trials a side (docs/privacy.md): the papers'
    claim 2.929 is refuted (lower bound 3.347), the new one (3.090) is not (1.707)."""
    from popri.privacy import accounting as Acc

    N, L, z, n = 20, 19, 1.5, 4000
    new = A.Setup("fixed", z, n, clients=N, clients_per_round=L, synthetic=50)
    s0, s1, what, shift = A.worlds(new)
    assert shift == pytest.approx(2.0) and "displaces" in what
    p = L / (N + 1)
    sd = 2 * z  # replace one client: the noise std is z 2C
    assert abs(s0.mean()) < 4 * sd / math.sqrt(n) and s0.std() == pytest.approx(sd, rel=0.05)
    assert s1.mean() == pytest.approx(p * 2.0, abs=4 * sd / math.sqrt(n))
    old = A.Setup("fixed", z, n, clients=N, clients_per_round=L, synthetic=50,
                  convention="papers")
    o0, _, _, _ = A.worlds(old)
    assert o0.std() == pytest.approx(z, rel=0.05)  # popri <= 0.3's noise: z C
    _, claim_new, how_new = A.entry_claim(new, delta=1e-5, accountant="rdp")
    _, claim_old, how_old = A.entry_claim(old, delta=1e-5, accountant="rdp")
    assert claim_new == pytest.approx(Acc.epsilon(z, L / N, 1, 1e-5, sampling="fixed"))
    assert claim_old == pytest.approx(Acc.epsilon(z, L / N, 1, 1e-5))  # Poisson at q = L/N
    assert "replace one client" in how_new and "NOT A DP GUARANTEE" in how_old
    with pytest.raises(Exception, match="clients-per-round|must be <"):
        _spec("fixed", 200, noise_multiplier=1.0, clients=5, clients_per_round=5)
