"""The DP maths of popri.feedback.{cosine,histogram} and popri.federated.{participation,
aggregation}: brute-force equality, clipping, noise scale, sampling.

    python -m pytest -q tests/test_scoring.py
"""

import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from popri.federated import aggregation, participation
from popri.feedback import cosine, histogram
from popri.core.errors import InputError
from popri.privacy.noise import make_rng

FAST = settings(max_examples=25, deadline=None)


def make_data(seed, n_rows, n_clients, n_syn, d):
    """Random unnormalised private rows with client ids in shuffled order, and synthetic rows."""
    rng = np.random.default_rng(seed)
    emb = (rng.normal(size=(n_rows, d)) * rng.uniform(0.2, 3, size=(n_rows, 1))).astype(np.float32)
    cids = [f"client-{c}" for c in rng.integers(0, n_clients, size=n_rows)]
    syn = (rng.normal(size=(n_syn, d)) + 0.5).astype(np.float32)
    return emb, cids, syn


def brute_force_cosine(emb, cids, syn, members, clients, *, standardize, clip):
    """Client by client, pair by pair, exactly as POPri Algorithm 2 + the reference client code."""
    rows = []
    for m in members:
        E = emb[[i for i, c in enumerate(cids) if c == clients[m]]].astype(np.float64)
        s = np.array([np.mean([e @ y / (np.linalg.norm(e) * np.linalg.norm(y)) for e in E])
                      for y in syn.astype(np.float64)])
        if standardize:
            s = (s - s.mean()) / s.std()
        norm = np.linalg.norm(s)
        rows.append(s * min(1.0, clip / norm))
    return np.array(rows)


def run_cosine(emb, cids, syn, *, z=0.0, clip=1e9, standardize=False, sample_rate=None,
               per_round=None, seed=0, rows=False, block=None, max_per_client=None):
    codes, clients = participation.factorize(cids)
    part = participation.sample_clients(len(clients), make_rng(seed, stream="sampling"),
                                    sample_rate=sample_rate, clients_per_round=per_round)
    out = np.zeros((max(len(part.members), 1), len(syn)), np.float32) if rows else None
    keep = participation.cap_per_client(codes, max_per_client, make_rng(seed, stream="cap"))
    total = cosine.cosine_round(emb, codes, part, syn, noise_multiplier=z, clip=clip,
                                 standardize=standardize, noise_rng=make_rng(seed, stream="noise"),
                                 keep=keep, rows_out=out, block=block)
    return total, part, clients, out


# --------------------------------------------------------------------------- cosine = brute force
@FAST
@given(seed=st.integers(0, 10_000), n_clients=st.integers(1, 7), standardize=st.booleans(),
       clip=st.sampled_from([0.3, 1.0, 1e9]))
def test_cosine_equals_brute_force_pairwise(seed, n_clients, standardize, clip):
    emb, cids, syn = make_data(seed, 40, n_clients, 13, 6)
    total, part, clients, rows = run_cosine(emb, cids, syn, clip=clip, standardize=standardize,
                                              rows=True, block=2)
    want = brute_force_cosine(emb, cids, syn, part.members, clients, standardize=standardize,
                              clip=clip)
    out = aggregation.finish(total, reduce="mean", denominator=len(part.members), threshold=None)
    assert np.allclose(out, want.mean(axis=0), atol=1e-5)
    assert np.allclose(rows, want, atol=1e-5)  # the per-client rows too
    assert np.allclose(total, rows.sum(axis=0), atol=1e-4)


def test_unstandardised_unclipped_mean_is_mean_of_mean_cosines():
    emb, cids, syn = make_data(1, 300, 25, 40, 16)
    total, part, clients, _ = run_cosine(emb, cids, syn, clip=1e9, standardize=False)
    assert part.sampling == "none" and len(part.members) == len(clients) == 25
    want = brute_force_cosine(emb, cids, syn, part.members, clients, standardize=False,
                              clip=1e9).mean(axis=0)
    assert np.allclose(total / 25, want, atol=1e-6)


@FAST
@given(seed=st.integers(0, 10_000), clip=st.floats(0.01, 5.0), standardize=st.booleans())
def test_clipped_rows_have_norm_at_most_c(seed, clip, standardize):
    emb, cids, syn = make_data(seed, 30, 5, 17, 5)
    _, _, _, rows = run_cosine(emb, cids, syn, clip=clip, standardize=standardize, rows=True)
    assert (np.linalg.norm(rows.astype(np.float64), axis=1) <= clip * (1 + 1e-5)).all()


@FAST
@given(seed=st.integers(0, 10_000))
def test_standardised_rows_are_zero_mean_unit_std_before_clipping(seed):
    emb, cids, syn = make_data(seed, 30, 4, 25, 5)
    _, _, _, rows = run_cosine(emb, cids, syn, clip=np.inf, standardize=True, rows=True)
    assert np.allclose(rows.mean(axis=1), 0, atol=1e-5)
    assert np.allclose(rows.std(axis=1), 1, atol=1e-4)


def test_standardising_a_constant_vector_gives_zeros():
    emb, cids, _ = make_data(0, 20, 3, 1, 4)
    syn = np.tile(np.float32([1, 2, 3, 4]), (9, 1))  # every synthetic sample identical
    total, _, _, rows = run_cosine(emb, cids, syn, standardize=True, clip=1.0, rows=True)
    assert np.array_equal(rows, np.zeros_like(rows)) and np.array_equal(total, np.zeros(9))


def test_zero_private_row_counts_as_cosine_zero():
    syn = np.eye(3, dtype=np.float32)
    emb = np.float32([[0, 0, 0], [2, 0, 0]])
    total, *_ = run_cosine(emb, ["a", "a"], syn)
    assert np.allclose(total, [0.5, 0, 0])


# --------------------------------------------------------------------------- noise scale
def test_per_row_and_aggregate_noise_std():
    emb, cids, syn = make_data(3, 400, 50, 4000, 8)
    z, clip = 2.0, 0.5
    exact, part, _, exact_rows = run_cosine(emb, cids, syn, clip=clip, standardize=True, rows=True)
    L = len(part.members)
    noisy, _, _, noisy_rows = run_cosine(emb, cids, syn, z=z, clip=clip, standardize=True, rows=True)
    per_row = (noisy_rows - exact_rows).astype(np.float64).ravel()  # 200,000 draws
    assert abs(per_row.std() / (z * clip / np.sqrt(L)) - 1) < 0.01  # sd of the ratio ~0.0016
    assert abs(per_row.mean()) < 5 * z * clip / np.sqrt(L) / np.sqrt(per_row.size)
    on_sum = noisy - exact  # sum of L per-row draws: std z*clip
    assert abs(on_sum.std() / (z * clip) - 1) < 0.05  # 4,000 draws: sd of the ratio ~0.011
    # without per-client rows: one draw of N(0, z^2 clip^2) on the sum
    once, *_ = run_cosine(emb, cids, syn, z=z, clip=clip, standardize=True)
    assert abs((once - exact).std() / (z * clip) - 1) < 0.05
    assert not np.allclose(once, noisy)


@FAST
@given(seed=st.integers(0, 10_000), z=st.floats(0.1, 20.0))
def test_aggregate_noise_chi_square(seed, z):
    """sum((noise/(z C))^2) over n coordinates is chi-square(n): inside +-6 sd."""
    emb, cids, syn = make_data(seed, 20, 3, 2000, 4)
    exact, *_ = run_cosine(emb, cids, syn, clip=1.0, standardize=True, seed=seed)
    noisy, *_ = run_cosine(emb, cids, syn, z=z, clip=1.0, standardize=True, seed=seed)
    n = len(syn)
    chi2 = (((noisy - exact) / z) ** 2).sum()
    assert abs(chi2 - n) < 6 * np.sqrt(2 * n)


# --------------------------------------------------------------------------- sampling
def test_poisson_mean_divides_by_expected_count():
    emb, cids, syn = make_data(5, 600, 60, 20, 6)
    total, part, clients, _ = run_cosine(emb, cids, syn, clip=1e9, sample_rate=0.3, seed=2)
    assert part.sampling == "poisson" and 0 < len(part.members) < 60
    # the divisor: q times the DECLARED N (public_count), here declared as the true 60
    d = aggregation.public_count(part.sampling, sample_rate=0.3, clients_per_round=None,
                                 public_clients=60)
    assert d == pytest.approx(0.3 * 60)
    want = brute_force_cosine(emb, cids, syn, part.members, clients, standardize=False, clip=1e9)
    out = aggregation.finish(total, reduce="mean", denominator=d, threshold=None)
    assert np.allclose(out, want.sum(axis=0) / (0.3 * 60), atol=1e-5)


def test_poisson_with_no_client_is_pure_noise():
    emb, cids, syn = make_data(0, 10, 2, 5000, 4)
    codes, clients = participation.factorize(cids)
    part = participation.Participation(np.zeros(0, np.int64), len(clients), "poisson", 0.01)
    for rows in (None, np.zeros((1, len(syn)), np.float32)):
        total = cosine.cosine_round(emb, codes, part, syn, noise_multiplier=3.0, clip=2.0,
                                     standardize=True, noise_rng=make_rng(1), rows_out=rows)
        assert abs(total.std() / 6.0 - 1) < 0.05
        d = aggregation.public_count("poisson", sample_rate=0.01, clients_per_round=None,
                                     public_clients=2)
        out = aggregation.finish(total, reduce="mean", denominator=d, threshold=None)
        assert np.allclose(out, (total / 0.02).astype(np.float32))
        if rows is not None:
            assert np.allclose(rows[0], total)


@given(n=st.integers(1, 300), q=st.floats(0.01, 0.99), seed=st.integers(0, 1000))
@FAST
def test_sampling_kinds(n, q, seed):
    s = participation.sample_clients(n, make_rng(seed), sample_rate=q)
    assert s.sampling == "poisson" and s.sample_rate == pytest.approx(q) and s.total == n
    assert np.all(np.diff(s.members) > 0) and (len(s.members) == 0 or s.members[-1] < n)
    L = max(1, n // 3)
    f = participation.sample_clients(n, make_rng(seed), clients_per_round=L)
    assert len(np.unique(f.members)) == L
    # a fixed L = N is still the fixed-L algorithm: replace one client at q = 1 (issue 43)
    assert f.sampling == "fixed" and f.sample_rate == pytest.approx(L / n)
    assert participation.sample_clients(n, make_rng(seed)).sampling == "none"


def test_poisson_rate_is_right_and_options_are_exclusive():
    s = participation.sample_clients(100_000, make_rng(0), sample_rate=0.2)
    assert abs(len(s.members) - 20_000) < 6 * np.sqrt(100_000 * 0.2 * 0.8)
    with pytest.raises(ValueError, match="mutually exclusive"):
        participation.sample_clients(10, make_rng(0), sample_rate=0.5, clients_per_round=3)
    with pytest.raises(ValueError):
        participation.sample_clients(10, make_rng(0), clients_per_round=11)


def test_cap_keeps_at_most_m_rows_per_client_seeded():
    codes = np.repeat(np.arange(5), [1, 3, 8, 20, 9])
    keep = participation.cap_per_client(codes, 4, make_rng(7))
    assert list(np.bincount(codes[keep], minlength=5)) == [1, 3, 4, 4, 4]
    assert np.array_equal(keep, participation.cap_per_client(codes, 4, make_rng(7)))
    assert not np.array_equal(keep, participation.cap_per_client(codes, 4, make_rng(8)))
    assert participation.cap_per_client(codes, None, make_rng(7)) is None


def test_factorize_orders_clients_by_id_not_by_row():
    codes, clients = participation.factorize(["b", "a", "c", "a"])
    assert clients == ["a", "b", "c"] and list(codes) == [1, 0, 2, 0]


# --------------------------------------------------------------------------- determinism
def test_seeded_determinism_and_block_size_invariance():
    emb, cids, syn = make_data(9, 200, 30, 50, 8)
    kw = dict(z=1.0, clip=1.0, standardize=True, per_round=10, rows=True)
    t1, s1, _, r1 = run_cosine(emb, cids, syn, seed=4, block=3, **kw)
    t0, s0, _, r0 = run_cosine(emb, cids, syn, seed=4, block=3, **kw)
    assert r1.tobytes() == r0.tobytes() and t1.tobytes() == t0.tobytes()
    # another block size: the same noise draws; the float32 products may differ in the last bit
    t2, s2, _, r2 = run_cosine(emb, cids, syn, seed=4, block=7, **kw)
    assert np.array_equal(s1.members, s2.members)
    assert np.allclose(r1, r2, atol=1e-6) and np.allclose(t1, t2, atol=1e-5)
    t3, s3, _, r3 = run_cosine(emb, cids, syn, seed=5, block=3, **kw)
    assert r3.tobytes() != r1.tobytes()
    t4, *_ = run_cosine(emb, cids, syn, z=1.0, seed=4)
    assert t4.tobytes() == run_cosine(emb, cids, syn, z=1.0, seed=4)[0].tobytes()


# --------------------------------------------------------------------------- nn-histogram
def clustered(seed, n_rows, n_clients, n_syn, d):
    """Private rows near random synthetic points, so nearest neighbours are unambiguous."""
    rng = np.random.default_rng(seed)
    syn = rng.normal(size=(n_syn, d)).astype(np.float32)
    emb = (syn[rng.integers(0, n_syn, n_rows)] + 0.01 * rng.normal(size=(n_rows, d))).astype(np.float32)
    cids = [str(c) for c in rng.integers(0, n_clients, n_rows)]
    return emb, cids, syn


@FAST
@given(seed=st.integers(0, 10_000), n_clients=st.integers(1, 9))
def test_histogram_equals_numpy_argmin(seed, n_clients):
    emb, cids, syn = clustered(seed, 60, n_clients, 15, 6)
    codes, clients = participation.factorize(cids)
    part = participation.sample_clients(len(clients), make_rng(0))
    rows = np.zeros((len(clients), len(syn)), np.float32)
    total = histogram.histogram_round(emb, codes, part, syn, noise_multiplier=0,
                                      max_per_client=10**6, keep=None, noise_rng=make_rng(0),
                                      rows_out=rows, block=2)
    d2 = ((emb[:, None, :].astype(np.float64) - syn[None].astype(np.float64)) ** 2).sum(-1)
    nn = d2.argmin(axis=1)
    assert np.array_equal(total, np.bincount(nn, minlength=len(syn)))
    for j, c in enumerate(clients):
        mine = [i for i, x in enumerate(cids) if x == c]
        assert np.array_equal(rows[j], np.bincount(nn[mine], minlength=len(syn)))
    hist = aggregation.finish(total, reduce="sum", denominator=1, threshold=0.0)
    assert np.array_equal(hist, np.bincount(nn, minlength=len(syn)).astype(np.float32))


def test_histogram_cap_threshold_and_noise():
    emb, cids, syn = clustered(1, 500, 20, 3000, 8)
    codes, clients = participation.factorize(cids)
    part = participation.sample_clients(len(clients), make_rng(0))
    M = 3
    keep = participation.cap_per_client(codes, M, make_rng(0))
    exact = histogram.histogram_round(emb, codes, part, syn, noise_multiplier=0,
                                      max_per_client=M, keep=keep, noise_rng=make_rng(0))
    assert exact.sum() == np.minimum(np.bincount(codes), M).sum()
    noisy = histogram.histogram_round(emb, codes, part, syn, noise_multiplier=2.0,
                                      max_per_client=M, keep=keep, noise_rng=make_rng(0))
    assert abs((noisy - exact).std() / (2.0 * M) - 1) < 0.05  # std Z*M on the sum
    out = aggregation.finish(noisy, reduce="sum", denominator=1, threshold=4.0)
    assert np.allclose(out, np.maximum(noisy - 4.0, 0).astype(np.float32))
    assert out.min() == 0


# --------------------------------------------------------------------------- streaming I/O
def test_row_blocks_reads_memmap_files_like_slicing(tmp_path):
    arr = np.random.default_rng(0).normal(size=(1001, 7)).astype(np.float32)
    np.save(tmp_path / "a.npy", arr)
    mm = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert isinstance(mm.base, mmap.mmap)  # the fast path is taken
    got = np.concatenate([b for _, b in participation.row_blocks(mm, 100)])
    assert np.array_equal(got, arr)
    sliced = mm[10:20]  # a view: read by slicing, still correct
    got = np.concatenate([b for _, b in participation.row_blocks(sliced, 3)])
    assert np.array_equal(got, arr[10:20])
    assert np.allclose(aggregation.sum_rows(mm), arr.sum(axis=0, dtype=np.float64))


def test_nan_row_is_a_located_input_error():
    emb, cids, syn = make_data(0, 50, 5, 4, 3)
    emb[37, 1] = np.nan
    with pytest.raises(InputError) as e:
        run_cosine(emb, cids, syn)
    assert e.value.line == 38 and e.value.field == "embedding"
