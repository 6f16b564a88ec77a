"""The distributed discrete Gaussian: plan, client rounding and noise, modular sums, accounting.

    python -m pytest -q tests/test_ddg.py
"""

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from popri.privacy import accounting as A
from popri.privacy import ddg
from popri.privacy.noise import SecureRandom

from conftest import write_jsonl

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DELTA = 3e-6


def _plan(**kw):
    base = dict(clip=1.0, noise_multiplier=1.0, dim=16, clients=10, min_noisy=8)
    return ddg.plan(**{**base, **kw})


def _entry(p, noisy, steps=1, q=1.0, sampling="none", **kw):
    return {"stage": "score", "mechanism": "distributed_discrete_gaussian",
            "noise_multiplier": ddg.effective_noise_multiplier(p, noisy), "sample_rate": q,
            "sampling": sampling, "steps": steps, "delta": DELTA, "sensitivity": p.clip,
            "neighbouring": "add/remove one client", "release_id": f"ddg-{noisy}-{steps}-{q}",
            "params": ddg.ledger_params(p, noisy), **kw}


# --------------------------------------------------------------------------- modular sums
@FAST
@given(st.integers(2, 40), st.integers(1, 30), st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_sum_of_encoded_uploads_decodes_to_the_sum(bits, n, d, seed):
    rng = np.random.default_rng(seed)
    p = ddg.DDGPlan(clip=1.0, gamma=0.375, bits=bits, dim=d, clients=n, min_noisy=1,
                    local_sigma=0.0, beta=0.5, delta2=2.0)
    m = p.modulus
    lim = max((m // 2 - 1) // n, 0)  # n summands of |v| <= lim: the sum cannot wrap
    v = rng.integers(-lim, lim + 1, size=(n, d))
    enc = np.stack([ddg.encode(row, p) for row in v])
    assert enc.min() >= -m // 2 and enc.max() < m // 2
    total = np.mod(enc.sum(axis=0), m)  # what secure aggregation gives the server
    np.testing.assert_array_equal(ddg.decode(total, p), 0.375 * v.sum(axis=0))
    # any representative mod m decodes the same (unsigned, shifted by multiples of m, floats)
    np.testing.assert_array_equal(ddg.decode(total.astype(np.uint64) + np.uint64(m), p),
                                  ddg.decode(total, p))
    np.testing.assert_array_equal(ddg.decode(total.astype(np.float64) - 3 * m, p),
                                  ddg.decode(total, p))
    # a sum that does wrap still decodes to its residue mod m
    big = np.full(d, m // 2 + 1)
    assert np.all(ddg.decode(big, p) == 0.375 * (m // 2 + 1 - m))


@FAST
@given(st.integers(1, 40), st.integers(1, 64), st.floats(0.01, 100), st.integers(0, 2**32 - 1))
def test_float_uploads_round_trip_within_rounding(n, d, clip, seed):
    """z = 0: the decoded sum is the sum of the clipped inputs within n * gamma per coordinate
    (each client rounds each coordinate by < gamma), and no plan-sized sum wraps."""
    rng = np.random.default_rng(seed)
    p = ddg.plan(clip=clip, noise_multiplier=0.0, dim=d, clients=n, min_noisy=n)
    x = rng.normal(size=(n, d)) * clip / math.sqrt(d) * rng.uniform(0.1, 3.0, size=(n, 1))
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    clipped = x * np.minimum(1.0, clip / norms)
    total = np.mod(sum(ddg.encode(ddg.round_client(xi, p, rng), p) for xi in x), p.modulus)
    err = np.abs(ddg.decode(total, p) - clipped.sum(axis=0))
    assert err.max() <= n * p.gamma * (1 + 1e-9)


@FEW
@given(st.integers(1, 200), st.floats(0.0, 3.0), st.integers(1, 50), st.integers(0, 2**32 - 1))
def test_noisy_round_trip_with_every_client_at_the_clip(n, z, d, seed):
    """The plan's worst case: every client puts its whole norm on coordinate 0, with noise;
    the sum decodes without wrapping (to n*clip within rounding and a few noise std)."""
    rng = np.random.default_rng(seed)
    p = ddg.plan(clip=2.0, noise_multiplier=z, dim=d, clients=n, min_noisy=max(1, n // 2))
    x = np.zeros(d)
    x[0] = 2.0
    ups = [ddg.encode(ddg.round_client(x, p, rng) + ddg.noise_share(p, rng), p) for _ in range(n)]
    got = ddg.decode(np.mod(np.sum(ups, axis=0), p.modulus), p)
    noise_std = p.gamma * p.local_sigma * math.sqrt(n)  # float units
    assert abs(got[0] - 2.0 * n) <= n * p.gamma + 6 * noise_std + 1e-9
    assert p.clients * 2 ** p.bits <= 2 ** 31


# --------------------------------------------------------------------------- the client
@FAST
@given(st.integers(1, 300), st.floats(0.01, 1e4), st.floats(1e-4, 10.0), st.floats(0.0, 0.99),
       st.floats(0.0, 5.0), st.integers(0, 2**32 - 1), st.booleans())
def test_round_client_norm_never_exceeds_delta2(d, clip, gscale, beta, spread, seed, secure):
    rng = SecureRandom() if secure else np.random.default_rng(seed)
    gamma = clip * gscale / math.sqrt(d)  # from ~1e-4 to ~10 integer steps per clip/sqrt(d)
    p = ddg.DDGPlan(clip=clip, gamma=gamma, bits=40, dim=d, clients=1, min_noisy=1,
                    local_sigma=0.0, beta=beta,
                    delta2=ddg.rounded_l2_bound(clip / gamma, beta, d))
    x = np.random.default_rng(seed).normal(size=d) * clip * spread
    for _ in range(3):
        r = ddg.round_client(x, p, rng)
        assert r.dtype == np.int64 and r.shape == (d,)
        assert math.sqrt(float(np.dot(r.astype(float), r.astype(float)))) <= p.delta2


def test_rounding_is_unbiased():
    rng = np.random.default_rng(7)
    x = np.array([0.31, -0.77, 0.05, 0.5, -0.2, 0.0, 0.13, -0.41])
    for beta, tol in ((0.0, 0.02), (math.exp(-0.5), 0.1)):
        p = ddg.DDGPlan(clip=1.5, gamma=0.25, bits=30, dim=8, clients=1, min_noisy=1,
                        local_sigma=0.0, beta=beta,
                        delta2=ddg.rounded_l2_bound(1.5 / 0.25, beta, 8))
        draws = np.stack([ddg.round_client(x, p, rng) for _ in range(10000)])
        assert np.abs(draws.mean(axis=0) - x / 0.25).max() < tol, beta
        assert set(np.unique(draws - np.floor(x / 0.25))) <= {0, 1}  # floor or ceil only


def test_round_client_clips_and_refuses_bad_input():
    rng = np.random.default_rng(0)
    p = _plan(noise_multiplier=0.0, dim=4)
    r = ddg.round_client(np.array([300.0, 400.0, 0.0, 0.0]), p, rng)  # norm 500 -> 1
    assert abs(np.linalg.norm(r) * p.gamma - 1.0) <= 4 * p.gamma
    with pytest.raises(ValueError, match="3 values, the plan 4"):
        ddg.round_client(np.zeros(3), p, rng)
    with pytest.raises(ValueError, match="non-finite"):
        ddg.round_client(np.array([np.nan, 0, 0, 0]), p, rng)


def test_conditional_rounding_gives_up_with_runtime_error():
    # a plan whose delta2 no rounding of this input meets (delta2 below the input's norm)
    # (each coordinate 0.5 rounds to 0 or 1; norm <= 5.0001 needs <= 25 ones of 100: ~1e-7)
    p = ddg.DDGPlan(clip=5.0, gamma=1.0, bits=30, dim=100, clients=1, min_noisy=1,
                    local_sigma=0.0, beta=0.5, delta2=5.0001)
    with pytest.raises(RuntimeError, match="conditional rounding failed"):
        ddg.round_client(np.full(100, 0.5), p, np.random.default_rng(0))


def test_integer_inputs_are_exact():
    rng = np.random.default_rng(1)
    p = ddg.plan(clip=3.0, noise_multiplier=0.0, dim=5, clients=4, min_noisy=4,
                 integer_inputs=True)
    assert p.gamma == 1.0 and p.delta2 == 3.0 and p.integer_mode
    votes = np.array([[1, 0, 2, 0, 0], [0, 0, 0, 3, 0], [1, 1, 1, 1, 0], [0, 0, 0, 0, 0]])
    total = np.mod(sum(ddg.encode(ddg.round_client(v, p, rng), p) for v in votes), p.modulus)
    np.testing.assert_array_equal(ddg.decode(total, p), votes.sum(axis=0))
    with pytest.raises(ValueError, match="integer inputs"):
        ddg.round_client(np.array([0.5, 0, 0, 0, 0]), p, rng)
    with pytest.raises(ValueError, match="integer inputs"):
        ddg.round_client(np.array([4, 0, 0, 0, 0]), p, rng)  # norm 4 > clip 3
    # gamma = 1/K: votes scaled by K, still exact, delta2 = K * clip
    g = ddg.integer_gamma(clip=3.0, noise_multiplier=1.0, clients=4, min_noisy=4)
    q = ddg.plan(clip=3.0, noise_multiplier=1.0, dim=5, clients=4, min_noisy=4,
                 integer_inputs=True, gamma=g)
    assert g < 1e-6 and q.delta2 == 3.0 / g and q.integer_mode
    np.testing.assert_array_equal(ddg.round_client(votes[0], q, rng), votes[0] / g)
    with pytest.raises(ValueError, match="gamma = 1/K"):
        ddg.plan(clip=3.0, noise_multiplier=1.0, dim=5, clients=4, min_noisy=4,
                 integer_inputs=True, gamma=0.3)
    assert not _plan().integer_mode


# --------------------------------------------------------------------------- the noise
def test_noise_share_variance_and_zero():
    p = ddg.DDGPlan.from_dict({**_plan(dim=60000).to_dict(), "local_sigma": 3.7})
    for rng in (np.random.default_rng(3), SecureRandom()):
        z = ddg.noise_share(p, rng)
        assert z.dtype == np.int64 and z.shape == (60000,)
        assert abs(z.mean()) < 0.1
        assert z.var() == pytest.approx(3.7 ** 2, rel=0.03)
    p0 = ddg.plan(clip=1.0, noise_multiplier=0.0, dim=7, clients=3, min_noisy=2)
    assert p0.local_sigma == 0
    np.testing.assert_array_equal(ddg.noise_share(p0, SecureRandom()), np.zeros(7, np.int64))
    # a subnormal sigma (z = 5e-324) returns zeros instead of looping in the float sampler
    tiny = ddg.DDGPlan.from_dict({**p0.to_dict(), "local_sigma": 5e-324})
    np.testing.assert_array_equal(ddg.noise_share(tiny, SecureRandom()), np.zeros(7, np.int64))


def test_noise_share_is_fast_for_20000_values():
    import time

    p = ddg.DDGPlan.from_dict({**_plan(dim=20000).to_dict(), "local_sigma": 1234.5})
    t = time.perf_counter()
    ddg.noise_share(p, SecureRandom())
    assert time.perf_counter() - t < 0.5


# --------------------------------------------------------------------------- the plan
@FAST
@given(st.integers(1, 5000), st.floats(0.0, 10.0), st.floats(1e-3, 1e3), st.integers(1, 10**5),
       st.floats(0.05, 1.0))
def test_plan_sizes_the_modulus_for_the_worst_case_sum(n, z, clip, d, frac):
    n_min = max(1, int(n * frac))
    p = ddg.plan(clip=clip, noise_multiplier=z, dim=d, clients=n, min_noisy=n_min)
    m = p.modulus
    assert n * m <= 2 ** 31 and n * 2 * m > 2 ** 31  # the largest bits Flower allows
    # worst-case signal (all n at clip/gamma, rounded up) + 4 std of all n noise shares fits
    assert n * (clip / p.gamma + 1) + 4 * math.sqrt(n) * p.local_sigma <= m / 2 - 1
    # the sum's noise is z * clip at min_noisy survivors
    assert p.local_sigma * p.gamma * math.sqrt(n_min) == pytest.approx(z * clip, rel=1e-9,
                                                                       abs=1e-12)
    assert p.delta2 == ddg.rounded_l2_bound(clip / p.gamma, p.beta, d)
    assert clip / p.gamma < p.delta2 <= clip / p.gamma + math.sqrt(d)
    # gamma is the finest that fits: a little finer overflows
    with pytest.raises(ValueError, match="too fine"):
        ddg.plan(clip=clip, noise_multiplier=z, dim=d, clients=n, min_noisy=n_min,
                 gamma=p.gamma * 0.999)
    assert ddg.DDGPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_bits_shrink_as_clients_grow():
    bits = [ddg.plan(clip=1.0, noise_multiplier=1.0, dim=10, clients=n, min_noisy=1).bits
            for n in (1, 2, 3, 50, 1000, 1024, 1025, 4096)]
    assert bits == [31, 30, 29, 25, 21, 21, 20, 19]
    assert bits == sorted(bits, reverse=True)


@pytest.mark.parametrize("kw,needle", [
    (dict(clients=2 ** 31), "no modulus fits"),
    (dict(clients=10, bits=29), "bits = 29 too large"),
    (dict(clients=2 ** 20, min_noisy=1), "cannot hold"),
    (dict(clients=10, bits=4), "cannot hold"),
    (dict(clients=10, bits=12, gamma=1e-6), "too fine"),
    (dict(clients=10, integer_inputs=True, clip=1e9), "does not fit"),
    (dict(min_noisy=11, clients=10), "cannot exceed"),
    (dict(clip=0.0), "clip"),
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(dim=0), "dim"),
    (dict(beta=1.0), "beta"),
])
def test_plan_refuses_what_cannot_fit(kw, needle):
    with pytest.raises(ValueError, match=needle):
        _plan(**kw)


def test_plan_record_is_validated():
    d = _plan().to_dict()
    assert d["modulus"] == 2 ** d["bits"]
    with pytest.raises(ValueError, match="misses delta2"):
        ddg.DDGPlan.from_dict({k: v for k, v in d.items() if k != "delta2"})
    with pytest.raises(ValueError, match="bits"):
        ddg.DDGPlan.from_dict({**d, "bits": 2.5})
    with pytest.raises(ValueError, match="min_noisy"):
        ddg.DDGPlan.from_dict({**d, "min_noisy": d["clients"] + 1})


# --------------------------------------------------------------------------- privacy maths
@FAST
@given(st.floats(0.3, 50.0), st.floats(1.001, 3.0), st.integers(1, 3000), st.integers(1, 10**5),
       st.floats(0.5, 1e4))
def test_epsilon_falls_with_local_sigma(s, factor, n, d, d2):
    assert ddg.cdp_epsilon(d2, s * factor, n, d) <= ddg.cdp_epsilon(d2, s, n, d)


@FAST
@given(st.floats(2.0, 50.0), st.integers(1, 3000), st.integers(1, 500), st.integers(1, 10**5),
       st.floats(0.5, 1e3))
def test_epsilon_falls_with_noise_shares(s, n, more, d, d2):
    assert ddg.cdp_epsilon(d2, s, n + more, d) <= ddg.cdp_epsilon(d2, s, n, d)


@FAST
@given(st.floats(0.05, 100.0), st.integers(1, 10**5), st.floats(0.5, 1e4), st.integers(2, 10**4))
def test_epsilon_is_the_gaussians_without_tau(s, d, d2, n):
    assert ddg.tau(s, 1) == 0.0
    assert ddg.cdp_epsilon(d2, s, 1, d) == d2 / s  # n = 1: one discrete Gaussian, tau = 0
    big = 10.0 * s + 5.0  # tau ~ n e^{-pi^2 s^2} = 0 in float64
    assert ddg.cdp_epsilon(d2, big, n, d) == pytest.approx(d2 / (math.sqrt(n) * big), rel=1e-12)
    # never below the Gaussian of the same effective multiplier
    assert ddg.cdp_epsilon(d2, s, n, d) >= d2 / (math.sqrt(n) * s) * (1 - 1e-12)


def test_tau_matches_the_papers_series_and_its_tail_bound():
    s, n = 0.6, 50
    ref = 10 * sum(math.exp(-2 * math.pi ** 2 * s ** 2 * k / (k + 1)) for k in range(1, n))
    assert ddg.tau(s, n) == pytest.approx(ref, rel=1e-12)
    # beyond TAU_TERMS terms the tail is bounded by its first term (an upper bound)
    exact = ddg.tau(0.3, ddg.TAU_TERMS + 1)
    assert ddg.tau(0.3, ddg.TAU_TERMS + 1001) >= exact
    p = _plan()
    assert ddg.epsilon_cdp(p, 8) == ddg.cdp_epsilon(p.delta2, p.local_sigma, 8, p.dim)
    assert ddg.effective_noise_multiplier(p, 8) == pytest.approx(
        math.sqrt(8) * p.local_sigma / p.delta2)
    assert ddg.epsilon_cdp(ddg.DDGPlan.from_dict({**p.to_dict(), "local_sigma": 0.0}), 8) \
        == math.inf


@FAST
@given(st.floats(0.5, 20.0), st.floats(1e-4, 0.9), st.integers(2, 64))
def test_subsampled_bound_is_never_below_the_subsampled_gaussian(z, q, alpha):
    """Zhu & Wang's general bound for a (1/2)eps^2-CDP mechanism at eps = 1/z is >= the exact
    RDP of the Poisson-subsampled Gaussian of multiplier z (opacus), and <= the unsubsampled."""
    ours = ddg.rdp([alpha], 1.0 / z, q)[0]
    gauss = A.rdp_lib().compute_rdp(q=q, noise_multiplier=z, steps=1, orders=[alpha])[0]
    assert ours >= gauss * (1 - 1e-9) - 1e-15
    assert ours <= alpha / (2 * z * z) * (1 + 1e-12)
    assert math.isinf(ddg.rdp([alpha + 0.5], 1.0 / z, q)[0])  # non-integer orders: no bound
    assert ddg.rdp([alpha + 0.5], 1.0 / z, 1.0)[0] == pytest.approx((alpha + 0.5) / (2 * z * z))


# --------------------------------------------------------------------------- the accountant
@pytest.mark.parametrize("acc", A.ACCOUNTANTS)
@pytest.mark.parametrize("q", [1.0, 0.05])
def test_composes_and_never_undercounts_the_gaussian(acc, q):
    assert "distributed_discrete_gaussian" in A.MECHANISMS
    p = ddg.plan(clip=1.0, noise_multiplier=1.2, dim=20000, clients=100, min_noisy=80)
    sampling = "none" if q == 1 else "poisson"
    c = A.compose([_entry(p, 80, steps=5, q=q, sampling=sampling)], DELTA)
    z = ddg.effective_noise_multiplier(p, 80)
    assert 0 < c.epsilon < math.inf
    assert c.epsilon >= A.epsilon(z, q, 5, DELTA, acc) * (1 - 1e-9)
    g = c.groups[0]
    assert (g["dim"], g["noisy"], g["steps"], g["sample_rate"]) == (20000, 80, 5, q)
    assert g["noise_multiplier"] == pytest.approx(z) and g["epsilon_cdp"] > 0
    if q == 1:  # tau = 0 here: exactly the Gaussian's RDP
        assert c.epsilon == pytest.approx(A.epsilon(z, 1.0, 5, DELTA), rel=1e-9)


def test_tiny_local_sigma_costs_more_than_the_gaussian():
    """Many clients with tiny shares (integer votes at gamma = 1): tau dominates."""
    p = ddg.plan(clip=1.0, noise_multiplier=5.0, dim=100, clients=1000, min_noisy=800,
                 integer_inputs=True)
    z = ddg.effective_noise_multiplier(p, 800)
    assert z == pytest.approx(5.0)
    assert A.compose([_entry(p, 800)], DELTA).epsilon > 100 * A.epsilon(z, 1.0, 1, DELTA)
    g = ddg.integer_gamma(clip=1.0, noise_multiplier=5.0, clients=1000, min_noisy=800)
    p2 = ddg.plan(clip=1.0, noise_multiplier=5.0, dim=100, clients=1000, min_noisy=800,
                  integer_inputs=True, gamma=g)
    assert A.compose([_entry(p2, 800)], DELTA).epsilon == pytest.approx(
        A.epsilon(5.0, 1.0, 1, DELTA), rel=1e-6)


def test_composes_with_gaussian_entries_and_refuses_pld():
    p = _plan(dim=1000, clients=50, min_noisy=40)
    e = _entry(p, 40, steps=2)
    both = A.compose([e, (3.0, 0.1, 10)], DELTA)
    assert both.epsilon > A.compose([e], DELTA).epsilon
    assert [g["mechanism"] for g in both.groups] == ["distributed_discrete_gaussian",
                                                     "subsampled_gaussian"]
    with pytest.raises(A.ParameterError, match="'distributed_discrete_gaussian' has no pld "
                                               "analysis; use --accountant rdp") as err:
        A.compose([e], DELTA, "pld")
    assert err.value.param == "accountant"


def test_entry_checks_and_infinite_cases():
    from popri.privacy.ledger import LedgerEntry

    p = _plan()
    e = _entry(p, 8)
    LedgerEntry(**e)  # a valid ledger entry
    bad = dict(e, params={k: v for k, v in e["params"].items() if k != "delta2"})
    with pytest.raises(A.ParameterError, match="needs params.delta2") as err:
        A.compose([bad], DELTA)
    assert err.value.param == "params.delta2"
    for k, v in (("dim", 0), ("noisy", 2.5), ("local_sigma", -1.0), ("delta2", 0.0)):
        with pytest.raises(A.ParameterError) as err:
            A.compose([dict(e, params={**e["params"], k: v})], DELTA)
        assert err.value.param == f"params.{k}"
    for k in ("noisy", "local_sigma"):
        c = A.compose([dict(e, params={**e["params"], k: 0})], DELTA)
        assert c.epsilon == math.inf and any("infinity" in n for n in c.notes)
    # at q = 1 the DDG's bound holds under whatever relation delta2 is the sensitivity for: an
    # entry recorded under replace-one is totalled under it, at the same epsilon
    c = A.compose([dict(e, neighbouring="replace one client")], DELTA)
    assert c.neighbouring == "replace one client"
    assert c.epsilon == pytest.approx(A.compose([e], DELTA).epsilon, rel=1e-12)
    # Zhu & Wang's subsampled bound is for Poisson sampling under add/remove only
    with pytest.raises(A.ParameterError, match="Poisson sampling under add/remove") as err:
        A.compose([dict(e, sample_rate=0.5, sampling="poisson",
                        neighbouring="replace one client")], DELTA)
    assert err.value.param == "neighbouring"
    # a fixed-size sample: under replace one client it is accounted at q = 1 (no amplification,
    # the mechanism's own note), under add/remove not at all (the displacement pair)
    c = A.compose([dict(e, sample_rate=0.5, sampling="fixed", neighbouring="replace one client")],
                  DELTA)
    assert c.epsilon == pytest.approx(A.compose([e], DELTA).epsilon, rel=1e-12)
    assert c.groups[0]["sample_rate"] == 1.0 and any("no amplification" in n for n in c.notes)
    with pytest.raises(A.ParameterError, match="displaces"):
        A.compose([dict(e, sample_rate=0.5, sampling="fixed")], DELTA)


def test_account_ledger_cli_totals_a_ddg_entry(run_popri, tmp_path):
    p = _plan(dim=1000, clients=50, min_noisy=40)
    e = _entry(p, 40, steps=3)
    write_jsonl(tmp_path / "ledger.jsonl", [e])
    out = run_popri(["account", "ledger", tmp_path, "--json"], check=True).stdout
    d = json.loads(out)
    assert d["epsilon"] == pytest.approx(A.compose([e], DELTA).epsilon, rel=1e-9)
    assert d["delta"] == DELTA and d["groups"][0]["mechanism"] == "distributed_discrete_gaussian"
    assert d["groups"][0]["noisy"] == 40
    r = run_popri(["account", "ledger", tmp_path, "--accountant", "pld"])
    assert r.returncode != 0 and "use --accountant rdp" in r.stderr


def test_discrete_gaussian_of_a_vanishing_sigma_returns_zeros_instead_of_looping():
    from popri.privacy.noise import discrete_gaussian

    rng = np.random.default_rng(0)
    for s in (1e-200, 5e-324, 0.01):
        assert not discrete_gaussian(s, 1000, rng).any()
    assert discrete_gaussian(2.0, 20000, rng).std() == pytest.approx(2.0, rel=0.05)
