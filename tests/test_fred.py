"""FreD: the private mean/covariance mechanism, its sensitivities and calibration, the shared
Frechet distance, and `popri fred stats|compare` through a real process.

    python -m pytest -q tests/test_fred.py
"""

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from scipy.linalg import sqrtm
from scipy.stats import norm

from popri.methods.fred import stats as F
from popri.models.fid import frechet_distance, gaussian_stats, trace_sqrt_product
from popri.core.io import save_embedding_set
from popri.privacy import accounting as A
from popri.privacy import calibration as C
from popri.privacy.noise import make_rng

from conftest import write_jsonl

PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EPS, DELTA = 0.6, 2e-6  # the paper's Figure 2
CLASSIC = math.sqrt(2 * math.log(1.25 / DELTA)) / EPS


def rand_spd(rng, d, rank=None, scale=1.0):
    b = rng.normal(size=(d, rank or d)) * scale
    return b @ b.T / (rank or d)


def closed_form_commuting(m1, a, m2, b):
    """Frechet distance of N(m1, Q diag(a) Q^T) and N(m2, Q diag(b) Q^T)."""
    return float(np.sum((m1 - m2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2))


# --------------------------------------------------------------------------- Frechet distance
@PROPS
@given(st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_frechet_equals_closed_form_for_commuting_covariances(d, seed):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    a, b = rng.uniform(0, 3, d), rng.uniform(0, 3, d)
    a[rng.random(d) < 0.3] = 0.0  # rank-deficient too
    m1, m2 = rng.normal(size=d), rng.normal(size=d)
    got = frechet_distance(m1, (q * a) @ q.T, m2, (q * b) @ q.T)
    assert got == pytest.approx(closed_form_commuting(m1, a, m2, b), rel=1e-7, abs=1e-7)


def test_frechet_matches_scipy_sqrtm_reference():
    rng = np.random.default_rng(1)
    for d in (2, 7, 30):
        c1, c2 = rand_spd(rng, d), rand_spd(rng, d, scale=2.0)
        m1, m2 = rng.normal(size=d), rng.normal(size=d)
        ref = np.sum((m1 - m2) ** 2) + np.trace(c1 + c2 - 2 * np.real(sqrtm(c1 @ c2)))
        assert frechet_distance(m1, c1, m2, c2) == pytest.approx(ref, rel=1e-8)


@PROPS
@given(st.integers(2, 40), st.integers(1, 6), st.integers(0, 2**31 - 1),
       st.sampled_from([1e-12, 1.0, 1e6]))
def test_sqrt_is_safe_for_rank_deficient_and_near_singular(d, rank, seed, scale):
    rng = np.random.default_rng(seed)
    c1 = rand_spd(rng, d, rank=min(rank, d), scale=scale)
    c2 = c1 + 1e-13 * scale * scale * np.eye(d)  # near-singular, almost equal
    t = trace_sqrt_product(c1, c2)
    assert isinstance(t, float) and math.isfinite(t) and t >= 0
    mu = rng.normal(size=d)
    for a, b in ((c1, c1), (c1, c2), (c2, c1)):
        fd = frechet_distance(mu, a, mu, b)
        assert isinstance(fd, float) and fd >= 0.0  # no negative trace from round-off
        assert fd <= 1e-5 * np.trace(c1) + 1e-12  # round-off only
    # the covariance term never eats into the mean term
    shift = np.zeros(d)
    shift[0] = 1e-3 * scale
    assert frechet_distance(np.zeros(d), c1, shift, c1) >= np.sum(shift ** 2)


def test_nonprivate_fred_matches_closed_form_on_large_gaussian_samples():
    rng = np.random.default_rng(7)
    d, n = 4, 200_000
    a, b = np.array([1.0, 0.5, 2.0, 0.1]), np.array([0.3, 0.5, 1.0, 0.4])
    m1, m2 = np.array([0.0, 1.0, 0.0, -1.0]), np.array([0.5, 1.0, 0.2, -1.0])
    x = m1 + rng.normal(size=(n, d)) * np.sqrt(a)
    y = m2 + rng.normal(size=(n, d)) * np.sqrt(b)
    st_x = F.exact_stats(x)
    got = frechet_distance(*gaussian_stats(y), st_x.mean, st_x.cov)
    assert got == pytest.approx(closed_form_commuting(m1, a, m2, b), abs=0.01)


# --------------------------------------------------------------------------- PSD projection
@PROPS
@given(st.integers(1, 15), st.integers(0, 2**31 - 1))
def test_psd_projection_is_psd_and_nearest(d, seed):
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(d, d))
    a = (g + g.T) / 2
    p = F.project_psd(a)
    assert np.array_equal(p, p.T)
    w = np.linalg.eigvalsh(a)
    assert np.linalg.eigvalsh(p).min() >= -1e-12 * max(1.0, np.abs(w).max())
    dist = np.linalg.norm(a - p)
    assert dist == pytest.approx(math.sqrt(np.sum(np.minimum(w, 0) ** 2)), rel=1e-9, abs=1e-12)
    for _ in range(5):  # no other PSD matrix is closer
        h = rng.normal(size=(d, d))
        for q in (h @ h.T, p + 1e-3 * h @ h.T, F.project_psd(p + 0.01 * (h + h.T))):
            assert np.linalg.norm(a - q) >= dist - 1e-12
    assert np.allclose(F.project_psd(p), p, atol=1e-12)  # idempotent on PSD input


def test_denoise_spectrum_removes_the_noise_bulk_and_debiases_spikes():
    rng = np.random.default_rng(4)
    d, tau = 400, 0.01
    u = np.linalg.qr(rng.normal(size=(d, 2)))[0]
    theta = np.array([1.0, 0.6])  # above the noise edge 2 tau sqrt(d) = 0.4
    c = (u * theta) @ u.T
    tops, errs = {"den": [], "psd": []}, {"den": [], "psd": []}
    for _ in range(5):
        e = F.symmetric_noise(d, tau, rng)
        for k, m in (("den", F.denoise_spectrum(c + e, tau)), ("psd", F.project_psd(c + e))):
            assert np.linalg.eigvalsh(m).min() >= -1e-12 and np.allclose(m, m.T)
            tops[k].append(np.linalg.eigvalsh(m)[-2:][::-1])
            errs[k].append(np.linalg.norm(m - c))
        # pure noise: the bulk is removed, the nearest-PSD projection keeps its positive half
        assert np.linalg.norm(F.denoise_spectrum(e, tau)) < 0.2 * np.linalg.norm(F.project_psd(e))
    bias = {k: np.abs(np.mean(v, axis=0) - theta) for k, v in tops.items()}
    assert np.all(bias["psd"] > 0.8 * d * tau ** 2 / theta)  # theta + d tau^2 / theta
    assert np.all(bias["den"] < 0.3 * bias["psd"])
    assert np.mean(errs["den"]) < 0.5 * np.mean(errs["psd"])


# --------------------------------------------------------------------------- calibration
def test_classic_multiplier_is_the_papers_formula_and_refuses_eps_ge_1():
    assert C.classic_multiplier(EPS, DELTA) == CLASSIC
    with pytest.raises(A.ParameterError) as e:
        C.classic_multiplier(1.0, DELTA)
    assert e.value.param == "epsilon" and "analytic" in e.value.message


def exact_delta(z, eps):
    """Balle & Wang 2018, Theorem 8, sensitivity 1, noise std z (plain scipy)."""
    return norm.cdf(0.5 / z - eps * z) - math.exp(eps) * norm.cdf(-0.5 / z - eps * z)


@PROPS
@given(st.floats(0.05, 0.99), st.floats(-9, -2))
def test_analytic_is_exact_and_below_classic(eps, log10_delta):
    delta = 10 ** log10_delta
    z = C.analytic_multiplier(eps, delta)
    zc = C.classic_multiplier(eps, delta)
    assert z <= zc
    assert exact_delta(zc, eps) <= delta  # the classic bound is valid (not tight)
    assert exact_delta(z, eps) <= delta * (1 + 1e-9)  # the analytic z meets the condition...
    assert C.gaussian_log_delta(z, eps) <= math.log(delta)  # exactly, in the log domain
    assert exact_delta(z * (1 - 1e-6), eps) > delta  # ...and is the smallest that does


def test_analytic_allows_eps_above_one():
    z = C.analytic_multiplier(4.0, 1e-5)
    assert 0 < z < 1.5 and math.exp(C.gaussian_log_delta(z, 4.0)) <= 1e-5


# --------------------------------------------------------------------------- sensitivities
def test_stated_sensitivities():
    c, r2 = 0.7, math.sqrt(2)
    d = F.Design("replace-one", "sample", c)
    assert (d.mean_sensitivity, d.cov_sensitivity, d.count_public) == (2 * c, r2 * c * c, True)
    assert d.neighbouring == "replace one sample"
    d = F.Design("add-remove", "sample", c)
    assert d.mean_sensitivity == pytest.approx(c * math.sqrt(1.25))
    assert d.cov_sensitivity == c * c and not d.count_public and d.count_weight == c / 2
    d = F.Design("replace-one", "user", c, 5)
    assert d.mean_sensitivity == pytest.approx(10 * c) and d.count_weight == c
    assert d.cov_sensitivity == pytest.approx(r2 * 5 * c * c)
    assert d.neighbouring == "replace one client"
    d = F.Design("add-remove", "user", c)  # default cap 8
    assert d.m == 8 and d.mean_sensitivity == pytest.approx(8 * c * math.sqrt(1.25))
    assert d.cov_sensitivity == pytest.approx(8 * c * c)
    assert d.neighbouring == "add/remove one client"
    with pytest.raises(A.ParameterError):
        F.Design("replace-one", "sample", c, 3)
    with pytest.raises(A.ParameterError):
        F.Design("swap", "sample", c)


def _release_vectors(records, design, center):
    """(release-1 sum, upper triangle of the release-2 sum) over ``records`` (client arrays)."""
    g = design.count_weight
    t1 = F.server_sum(F.mean_contribution(x, design.clip, g) for x in records)
    if design.count_public:
        t1 = t1[:-1]
    t2 = F.server_sum(F.cov_contribution(x, design.clip, center) for x in records)
    return t1, t2[np.triu_indices(len(center))]


@PROPS
@given(st.sampled_from(F.RELATIONS), st.sampled_from(F.LEVELS), st.integers(1, 4),
       st.floats(0.1, 3.0), st.integers(0, 2**31 - 1))
def test_neighbours_never_exceed_the_stated_sensitivity(relation, level, m, c, seed):
    rng = np.random.default_rng(seed)
    design = F.Design(relation, level, c, m if level == "user" else None)
    cap, d = design.m, 3

    def record():
        k = int(rng.integers(1, cap + 1))
        return rng.normal(size=(k, d)) * rng.choice([0.1, 1.0, 5.0])

    data = [record() for _ in range(4)]
    center = rng.normal(size=d) * rng.choice([0.0, 0.5, 3.0])
    other = data[1:] if relation == "add-remove" else [record()] + data[1:]
    a1, a2 = _release_vectors(data, design, center)
    b1, b2 = _release_vectors(other, design, center)
    assert np.linalg.norm(a1 - b1) <= design.mean_sensitivity * (1 + 1e-12)
    assert np.linalg.norm(a2 - b2) <= design.cov_sensitivity * (1 + 1e-12)


@pytest.mark.parametrize("relation", F.RELATIONS)
@pytest.mark.parametrize("m", [1, 3])
def test_sensitivities_are_attained(relation, m):
    """The bounds are tight: a worst-case neighbour reaches them exactly."""
    c, d = 0.5, 3
    level = "sample" if m == 1 else "user"
    design = F.Design(relation, level, c, None if m == 1 else m)
    e1, e2 = np.eye(d)[0] * c, np.eye(d)[1] * c
    rest = [np.full((1, d), 0.1)]
    center = np.zeros(d)
    if relation == "add-remove":
        pair = ([np.tile(e1, (m, 1))] + rest, rest)
        cov_pair = pair
    else:
        pair = ([np.tile(e1, (m, 1))] + rest, [np.tile(-e1, (m, 1))] + rest)
        cov_pair = ([np.tile(e1, (m, 1))] + rest, [np.tile(e2, (m, 1))] + rest)
    a1, _ = _release_vectors(pair[0], design, center)
    b1, _ = _release_vectors(pair[1], design, center)
    _, a2 = _release_vectors(cov_pair[0], design, center)
    _, b2 = _release_vectors(cov_pair[1], design, center)
    assert np.linalg.norm(a1 - b1) == pytest.approx(design.mean_sensitivity, rel=1e-12)
    assert np.linalg.norm(a2 - b2) == pytest.approx(design.cov_sensitivity, rel=1e-12)


# --------------------------------------------------------------------------- the mechanism
def _clip(x, c):
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x * np.minimum(1.0, c / np.maximum(n, 1e-300))


@pytest.mark.parametrize("relation", F.RELATIONS)
@pytest.mark.parametrize("clip", [10.0, 0.3])  # inactive (norms <= 3), active
def test_noise_scales_match_the_formulas(relation, clip):
    rng = np.random.default_rng(3)
    d, n = 3, 40
    x = rng.normal(size=(n, d)) * rng.uniform(0.5, 1.7, size=(n, 1))
    clients = [x[i:i + 4] for i in range(0, n, 4)]
    design = F.Design(relation, "sample", clip)
    z = C.gaussian_multiplier(EPS, DELTA)
    s1, s2 = z * design.mean_sensitivity, z * design.cov_sensitivity
    cx = _clip(x, clip)
    if relation == "replace-one":  # the paper's tau1, and sqrt(2) times its tau2
        assert s1 / n == pytest.approx((2 * clip / n) * CLASSIC, rel=1e-12)
        assert s2 / n == pytest.approx(math.sqrt(2) * (clip ** 2 / n) * CLASSIC, rel=1e-12)
    else:
        assert s2 / n == pytest.approx((clip ** 2 / n) * CLASSIC, rel=1e-12)  # the paper's tau2
    iu = np.triu_indices(d)
    n1, n2, nc = [], [], []
    for seed in range(300):
        r = F.private_stats(clients, design, z, make_rng(seed, stream="t"))
        assert r.params["tau1"] == pytest.approx(s1 / r.n, rel=1e-12)
        assert r.params["tau2"] == pytest.approx(s2 / r.n, rel=1e-12)
        n1.append(r.sum1[:d] - cx.sum(axis=0))
        if relation == "add-remove":
            nc.append(r.sum1[d] - design.count_weight * n)
            assert r.n == pytest.approx(max(r.sum1[d] / design.count_weight, 1.0))
        else:
            assert r.n == n and len(r.sum1) == d
        y = _clip(cx - r.sum1[:d] / r.n, clip)
        noise2 = r.sum2 - y.T @ y
        assert np.array_equal(r.sum2, r.sum2.T)  # mirrored
        n2.append(noise2[iu])
        assert np.linalg.eigvalsh(r.cov).min() >= -1e-12
        assert np.allclose(r.mean, r.sum1[:d] / r.n)
    for noise, s in ((np.array(n1), s1), (np.array(n2), s2), (np.array(nc), s1)):
        if noise.size == 0:
            continue
        assert noise.std() == pytest.approx(s, rel=4 / math.sqrt(2 * noise.size))
        assert abs(noise.mean()) < 4 * s / math.sqrt(noise.size)


def test_client_grouping_does_not_change_the_sums():
    """Clients compute their parts, the server adds them: any partition gives the same sums."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(30, 4))
    design = F.Design("add-remove", "sample", 0.8)
    a = F.private_stats([x[:7], x[7:20], x[20:]], design, 2.0, make_rng(1, stream="t"))
    b = F.private_stats([x[i:i + 1] for i in range(30)], design, 2.0, make_rng(1, stream="t"))
    assert np.allclose(a.sum1, b.sum1, atol=1e-12) and np.allclose(a.sum2, b.sum2, atol=1e-12)
    assert np.allclose(a.cov, b.cov, atol=1e-12)


def test_private_stats_approach_the_truth_with_little_noise():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5000, 3)) * 0.2 + np.array([0.3, 0.0, -0.2])
    r = F.private_stats([x], F.Design("replace-one", "sample", 5.0), 1e-3, make_rng(0, stream="t"))
    mean, cov = gaussian_stats(x)
    assert np.allclose(r.mean, mean, atol=1e-5)
    assert np.allclose(r.cov, cov, atol=1e-3)


# --------------------------------------------------------------------------- accounting
def test_ledger_composes_replace_relations_and_refuses_mixtures():
    def e(rel, q=1.0):
        return {"stage": "fred", "mechanism": "gaussian" if q == 1 else "subsampled_gaussian",
                "noise_multiplier": CLASSIC, "sample_rate": q, "steps": 1, "delta": DELTA,
                "sampling": "none" if q == 1 else "poisson", "neighbouring": rel}

    rep = A.compose([e("replace one sample"), e("replace one sample")], DELTA, "pld")
    add = A.compose([(CLASSIC, 1.0, 2)], DELTA, "pld")
    assert rep.epsilon == pytest.approx(add.epsilon, rel=1e-12)
    assert rep.to_dict()["neighbouring"] == "replace one sample"
    assert rep.epsilon < 2 * EPS  # tighter than basic composition
    # samples and clients never add up (no conversion between units)
    with pytest.raises(A.ParameterError, match="no proven conversion"):
        A.compose([e("replace one sample"), e("add/remove one client")], DELTA)
    with pytest.raises(A.ParameterError, match="no proven conversion"):
        A.compose([e("add/remove one sample"), e("add/remove one client")], DELTA)
    # a q = 1 Gaussian under add/remove one sample joins replace one sample at twice its
    # sensitivity (the triangle inequality): the same mechanism at z / 2
    mix = A.compose([e("replace one sample"), e("add/remove one sample")], DELTA, "pld")
    assert mix.neighbouring == "replace one sample" and "2 times" in mix.to_dict()["note"]
    assert mix.epsilon == pytest.approx(A.compose(
        [e("replace one sample"), {**e("replace one sample"), "noise_multiplier": CLASSIC / 2}],
        DELTA, "pld").epsilon, rel=1e-12)
    with pytest.raises(A.ParameterError):
        A.compose([e("replace one sample", q=0.1)], DELTA)


# --------------------------------------------------------------------------- CLI
def _set(path, x, clients=None, model="m"):
    rows = [{"id": str(i), **({"client_id": str(clients[i])} if clients is not None else {})}
            for i in range(len(x))]
    save_embedding_set(path, x, rows, {"model": model, "normalize": True})
    return path


@pytest.fixture
def sets(tmp_path):
    rng = np.random.default_rng(0)
    d = 6
    priv = rng.normal(size=(2000, d)) * 0.3 + 0.2
    near = rng.normal(size=(300, d)) * 0.3 + 0.2
    far = rng.normal(size=(300, d)) * 0.5 - 0.4
    return {"priv": _set(tmp_path / "priv.npy", priv, clients=np.arange(2000) // 8),
            "near": _set(tmp_path / "near.npy", near), "far": _set(tmp_path / "far.npy", far),
            "arrays": (priv, near, far), "dir": tmp_path}


def _ok(run_popri, *args, **kw):
    return run_popri(["fred", *map(str, args)], check=True, **kw)


def test_cli_stats_compare_and_ledger(sets, run_popri):
    out = sets["dir"] / "fred" / "stats.npz"
    _ok(run_popri, "stats", "--private", sets["priv"], "--epsilon", EPS, "--delta", DELTA,
        "--clip", 2, "--out", out)
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["kind"] == "fred-stats" and side["private"] and side["dim"] == 6
    assert side["n"] == 2000 and side["n_public"]
    assert side["neighbouring"] == "replace one sample"
    p = side["params"]
    assert p["tau1"] == pytest.approx((2 * 2 / 2000) * CLASSIC, rel=1e-12)
    assert p["tau2"] == pytest.approx(math.sqrt(2) * (4 / 2000) * CLASSIC, rel=1e-12)
    with np.load(out) as z:
        assert z["mean"].shape == (6,) and z["cov"].shape == (6, 6) and float(z["n"]) == 2000
        assert np.linalg.eigvalsh(z["cov"]).min() >= -1e-12
    led = [json.loads(line) for line in (out.parent / "ledger.jsonl").read_text().splitlines()]
    assert [e["params"]["release"] for e in led] == ["mean", "covariance"]
    assert all(e["stage"] == "fred" and e["mechanism"] == "gaussian" and e["delta"] == DELTA
               and e["noise_multiplier"] == pytest.approx(CLASSIC, rel=1e-12)
               and e["neighbouring"] == "replace one sample" for e in led)
    assert [e["sensitivity"] for e in led] == pytest.approx([4.0, math.sqrt(2) * 4])
    assert led[0]["release_id"] != led[1]["release_id"]
    acc = json.loads(run_popri(["account", "ledger", out.parent, "--accountant", "pld", "--json"],
                               check=True).stdout)
    assert acc["entries"] == 2 and acc["neighbouring"] == "replace one sample"
    assert acc["delta"] == DELTA and acc["epsilon"] < 2 * EPS
    assert acc["epsilon"] == pytest.approx(A.compose([(CLASSIC, 1.0, 2)], DELTA, "pld").epsilon)
    txt = run_popri(["account", "ledger", out.with_suffix(".json")], check=True).stdout
    assert txt.splitlines()[-1].endswith("(eps, delta)-DP under replace one sample)")

    # compare: the near candidate ranks first; JSON and table agree
    res = json.loads(_ok(run_popri, "compare", "--stats", out, sets["far"], sets["near"],
                         "--json").stdout)
    assert [r["candidate"] for r in res] == [str(sets["near"]), str(sets["far"])]
    assert set(res[0]) == {"candidate", "fred"} and 0 <= res[0]["fred"] < res[1]["fred"]
    lines = _ok(run_popri, "compare", "-s", out, sets["far"], sets["near"]).stdout.splitlines()
    assert lines[0].split() == ["rank", "fred", "n", "candidate"]
    assert lines[1].split() == ["1", f"{res[0]['fred']:.6f}", "300", str(sets["near"])]
    mean, cov, _ = F.load_stats(str(out))
    assert res[1]["fred"] == pytest.approx(
        frechet_distance(*gaussian_stats(sets["arrays"][2].astype(np.float32)), mean, cov))
    # a pipe: JSONL rows with 'embedding' (what 'popri embed --out -' writes) on stdin
    far = sets["arrays"][2]
    piped = "".join(json.dumps({"id": str(i), "embedding": [float(v) for v in row],
                                "embedding_model": "m"}) + "\n" for i, row in enumerate(far))
    res2 = json.loads(_ok(run_popri, "compare", "--stats", out, "-", "--json",
                          input=piped).stdout)
    assert res2 == [{"candidate": "-", "fred": pytest.approx(res[1]["fred"], rel=1e-9)}]
    # compare spends nothing
    assert len((out.parent / "ledger.jsonl").read_text().splitlines()) == 2


def test_cli_same_seed_same_bytes(sets, run_popri):
    outs = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        o = sets["dir"] / name / "s.npz"
        _ok(run_popri, "stats", "--private", sets["priv"], "-e", EPS, "--delta", DELTA,
            "--seed", seed, "--out", o, "--relation", "add-remove", "--level", "user", "-M", 4)
        outs.append((o.read_bytes(), o.with_suffix(".json").read_bytes()))
    assert outs[0] == outs[1] and outs[0][0] != outs[2][0]
    side = json.loads(outs[0][1])
    assert not side["n_public"] and side["neighbouring"] == "add/remove one client"
    # 250 clients keep 4 samples each: the count written is a noisy one, never the exact 1000
    assert side["n"] != 1000 and abs(side["n"] - 1000) < 6 * side["params"]["count_noise_std"]
    assert side["params"]["max_samples_per_client"] == 4


def test_cli_denoise_is_post_processing_of_the_same_release(sets, run_popri):
    a, b = sets["dir"] / "r" / "psd.npz", sets["dir"] / "r" / "den.npz"
    common = ["--private", sets["priv"], "-e", EPS, "--delta", DELTA, "--seed", 3]
    _ok(run_popri, "stats", *common, "--out", a)
    _ok(run_popri, "stats", *common, "--denoise", "--out", b)
    sa, sb = (json.loads(x.with_suffix(".json").read_text()) for x in (a, b))
    assert (sa["params"]["covariance"], sb["params"]["covariance"]) == ("nearest-psd", "denoised")
    assert [e["release_id"] for e in sa["ledger"]] == [e["release_id"] for e in sb["ledger"]]
    assert len((a.parent / "ledger.jsonl").read_text().splitlines()) == 2  # spent once
    with np.load(a) as za, np.load(b) as zb:
        assert np.array_equal(za["mean"], zb["mean"]) and not np.allclose(za["cov"], zb["cov"])
    p = run_popri(["fred", "stats", "--private", sets["priv"], "--non-private", "--denoise",
                   "--out", sets["dir"] / "x.npz"])
    assert p.returncode == 2 and "--denoise" in p.stderr


def test_cli_nonprivate_equals_eval_fid(sets, run_popri):
    out = sets["dir"] / "exact.npz"
    p = _ok(run_popri, "stats", "--private", sets["priv"], "--non-private", "--out", out)
    assert "no privacy" in " ".join(p.stderr.lower().split())
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["private"] is False and side["ledger"] == []
    assert not (sets["dir"] / "ledger.jsonl").exists()
    res = json.loads(_ok(run_popri, "compare", "--stats", out, sets["far"], "--json").stdout)
    fid = json.loads(run_popri(["eval", "fid", sets["far"], sets["priv"], "--json"],
                               check=True).stdout)["fid"]
    assert res[0]["fred"] == pytest.approx(fid, rel=1e-9)


def test_cli_user_level_composes_with_popri_rounds(sets, run_popri):
    out = sets["dir"] / "u" / "stats.npz"
    _ok(run_popri, "stats", "--private", sets["priv"], "-e", 2.0, "--delta", 3e-6,
        "--calibration", "analytic", "--relation", "add-remove", "--level", "user", "--out", out)
    led = [json.loads(s) for s in (out.parent / "ledger.jsonl").read_text().splitlines()]
    assert led[0]["noise_multiplier"] == pytest.approx(C.analytic_multiplier(2.0, 3e-6))
    assert led[0]["sensitivity"] == pytest.approx(8 * math.sqrt(1.25))  # m = 8, c = 1
    score = {"stage": "score", "mechanism": "subsampled_gaussian", "noise_multiplier": 1.05,
             "sample_rate": 0.0075, "sampling": "poisson", "steps": 20, "delta": 3e-6,
             "sensitivity": 1.0, "neighbouring": "add/remove one client", "release_id": "r1"}
    (sets["dir"] / "u" / "round").mkdir()
    write_jsonl(sets["dir"] / "u" / "round" / "ledger.jsonl", [score])
    acc = json.loads(run_popri(["account", "ledger", out.parent, "--json"], check=True).stdout)
    assert acc["entries"] == 3 and acc["neighbouring"] == "add/remove one client"
    # a sample-level (replace one sample) release does not silently join that total
    s2 = sets["dir"] / "u" / "s2" / "stats.npz"
    _ok(run_popri, "stats", "--private", sets["priv"], "-e", EPS, "--delta", 3e-6, "--out", s2)
    p = run_popri(["account", "ledger", out.parent])
    assert p.returncode == 2 and "no proven conversion" in p.stderr


@pytest.mark.slow  # three processes load torch + the tiny model (~30 s on a busy 2-core box)
def test_cli_texts_dataset_dir_and_pipe(tmp_path, run_popri, tiny_st_model):
    words = ["tax", "war", "jobs", "peace", "budget", "union", "army", "trade"]
    rng = np.random.default_rng(0)
    d = tmp_path / "data"
    d.mkdir()
    write_jsonl(d / "train.jsonl", [{"id": f"c{i % 10}#{i}", "client_id": f"c{i % 10}",
                                     "text": " ".join(rng.choice(words, 6))} for i in range(60)])
    write_jsonl(tmp_path / "same.jsonl", [{"text": " ".join(rng.choice(words, 6))}
                                          for _ in range(40)])
    write_jsonl(tmp_path / "other.jsonl", [{"text": f"zebra {i} quantum {i * 7} xylophone"}
                                           for i in range(40)])
    out = tmp_path / "s.npz"  # a large epsilon (analytic calibration) keeps the ranking sharp
    _ok(run_popri, "stats", "--private", d, "-e", 50, "--delta", 1e-5, "--out", out,
        "--calibration", "analytic", "--model", tiny_st_model)
    assert json.loads(out.with_suffix(".json").read_text())["embedding_model"] == tiny_st_model
    res = json.loads(_ok(run_popri, "compare", "--stats", out, tmp_path / "other.jsonl",
                         tmp_path / "same.jsonl", d, "--json").stdout)
    assert [r["candidate"] for r in res] == [str(d), str(tmp_path / "same.jsonl"),
                                             str(tmp_path / "other.jsonl")]
    piped = run_popri(["embed", tmp_path / "other.jsonl", "--out", "-", "--model", tiny_st_model],
                      check=True).stdout
    res2 = json.loads(_ok(run_popri, "compare", "--stats", out, "-", "--json",
                          input=piped).stdout)
    assert res2[0]["fred"] == pytest.approx(res[-1]["fred"], rel=1e-6)


@pytest.mark.parametrize("args,needle", [
    (["--clip", 1], "--epsilon"),
    (["-e", 1.0, "--delta", 1e-5], "Theorem A.1"),
    (["-e", 0.5, "--delta", 1.5], "--delta"),
    (["--non-private", "-e", 0.5], "--epsilon"),
    (["-e", 0.5, "--delta", 1e-5, "--relation", "swap"], "--relation"),
    (["-e", 0.5, "--delta", 1e-5, "-M", 3], "--max-samples-per-client"),
    (["-e", 0.5, "--delta", 1e-5, "--clip", 0], "--clip"),
])
def test_cli_bad_options(sets, run_popri, args, needle):
    out = sets["dir"] / "bad" / "s.npz"
    p = run_popri(["fred", "stats", "--private", sets["priv"], "--out", out, *map(str, args)])
    assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not out.exists() and not out.parent.exists()


def test_cli_bad_inputs_are_located(sets, run_popri, tmp_path):
    # user level needs client ids: file, line and field named
    rows = [{"embedding": [0.1, 0.2], "client_id": "x"}, {"embedding": [0.3, 0.1]}]
    p = run_popri(["fred", "stats", "--private", "-", "-e", 0.5, "--delta", 1e-5, "--level",
                   "user", "--out", tmp_path / "o.npz"],
                  input="".join(json.dumps(r) + "\n" for r in rows))
    assert p.returncode == 2 and "<stdin>:2: field 'client_id'" in p.stderr
    write_jsonl(tmp_path / "t.jsonl", rows)
    p = run_popri(["fred", "stats", "--private", tmp_path / "t.jsonl", "-e", 0.5, "--delta",
                   1e-5, "--level", "user", "--out", tmp_path / "o.npz"])
    assert p.returncode == 2 and "t.jsonl:2: field 'client_id'" in p.stderr
    assert not (tmp_path / "o.npz").exists()
    p = run_popri(["fred", "stats", "--private", sets["priv"], "-e", 0.5, "--delta", 1e-5,
                   "--out", tmp_path / "o.npy"])
    assert p.returncode == 2 and "NAME.npz" in p.stderr
    # compare: dimension mismatch names the candidate; a stats file without its sidecar
    out = tmp_path / "s.npz"
    _ok(run_popri, "stats", "--private", sets["priv"], "-e", 0.5, "--delta", 1e-5, "--out", out)
    _set(tmp_path / "wide.npy", np.zeros((5, 9)) + np.arange(9))
    p = run_popri(["fred", "compare", "--stats", out, sets["near"], tmp_path / "wide.npy"])
    assert p.returncode == 2 and "wide.npy: field 'embedding'" in p.stderr and not p.stdout
    _set(tmp_path / "other_model.npy", np.random.default_rng(0).normal(size=(5, 6)), model="zz")
    p = run_popri(["fred", "compare", "--stats", out, tmp_path / "other_model.npy"])
    assert p.returncode == 2 and "field 'model'" in p.stderr
    out.with_suffix(".json").unlink()
    p = run_popri(["fred", "compare", "--stats", out, sets["near"]])
    assert p.returncode == 2 and "missing sidecar" in p.stderr


def test_cli_release_mode_uses_fresh_ids(sets, run_popri):
    ids = []
    for name in ("r1", "r2"):
        o = sets["dir"] / name / "s.npz"
        _ok(run_popri, "stats", "--private", sets["priv"], "-e", EPS, "--delta", DELTA, "--out", o,
            "--release")
        led = [json.loads(s) for s in (o.parent / "ledger.jsonl").read_text().splitlines()]
        ids.append(led[0]["release_id"])
        assert json.loads(o.with_suffix(".json").read_text())["params"]["release"] is True
    assert ids[0] != ids[1]


def test_library_steps_write_what_the_cli_writes(sets, run_popri):
    """popri.methods.fred.steps: the same files and ledger as `popri fred stats`, the same
    ranking as `popri fred compare` (the command is one call of each)."""
    from popri.methods.fred.steps import rank_candidates, release_stats
    from popri.specs.privacy import FredStatsSpec

    a, b = sets["dir"] / "cli" / "s.npz", sets["dir"] / "lib" / "s.npz"
    _ok(run_popri, "stats", "--private", sets["priv"], "-e", EPS, "--delta", DELTA, "--level",
        "user", "--seed", 4, "--out", a)
    r = release_stats(str(sets["priv"]), str(b), FredStatsSpec(epsilon=EPS, delta=DELTA),
                      seed=4, level="user")  # a spec's field given as a keyword
    assert r["noise_multiplier"] == CLASSIC and len(r["entries"]) == 2
    assert a.read_bytes() == b.read_bytes()
    la, lb = ((x.parent / "ledger.jsonl").read_text() for x in (a, b))
    assert la == lb  # same release ids (same data, settings, seed): counted once
    res = json.loads(_ok(run_popri, "compare", "--stats", a, sets["far"], sets["near"],
                         "--json").stdout)
    lib = rank_candidates([str(sets["far"]), str(sets["near"])], str(b))
    assert [{"candidate": x["candidate"], "fred": x["fred"]} for x in lib] == res
    assert [x["n"] for x in lib] == [300, 300]
    with pytest.raises(A.ParameterError, match="Theorem A.1"):
        release_stats(str(sets["priv"]), str(sets["dir"] / "x.npz"), epsilon=1.0, delta=DELTA)
    assert not (sets["dir"] / "x.npz").exists()


def test_gaussian_multiplier_dispatches():
    assert C.gaussian_multiplier(EPS, DELTA) == CLASSIC
    assert C.gaussian_multiplier(2.0, 1e-5, "analytic") == C.analytic_multiplier(2.0, 1e-5)
    with pytest.raises(A.ParameterError) as e:
        C.gaussian_multiplier(EPS, DELTA, "exact")
    assert e.value.param == "calibration"
    assert F.sidecar_path("a/s.npz") == "a/s.json"  # deprecated (popri.core.guard)


def test_help_states_relation_and_sensitivities(run_popri):
    h = " ".join(run_popri(["fred", "stats", "--help"], check=True).stdout.split())
    for s in ("replace-one", "add-remove", "2 m c", "sqrt(2) m c^2", "m c^2", "Theorem A.1",
              "Balle & Wang", "1.118 m c", "Definition 2.1"):
        assert s in h, s
    assert "fred" in run_popri(["--help"], check=True).stdout
