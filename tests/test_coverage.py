"""The coverage reward (issue 67, popri/feedback/coverage.py): per-prompt nearest-candidate
votes, normalised to L2 norm 1 -- the bound its accounting rests on, checked as a property and
at its worst case -- and `popri score --mode coverage` through a real process.

    python -m pytest -q tests/test_coverage.py
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import emb_set
from popri.core.errors import ConfigError, InputError
from popri.federated.participation import Participation, factorize
from popri.feedback import coverage
from popri.feedback.cosine import normalize_rows
from popri.privacy.plan import Noise
from popri.specs.feedback import ScoreSpec


def _groups(G: int, J: int) -> np.ndarray:
    return np.repeat(np.arange(G), J)


def _brute(emb, syn, groups):
    """Votes by a double loop: each private row, each group, its most similar candidate."""
    x, y = normalize_rows(emb), normalize_rows(syn)
    G = groups.max() + 1
    v = np.zeros(len(syn))
    for e in x:
        for g in range(G):
            m = np.flatnonzero(groups == g)
            v[m[int(np.argmax(y[m] @ e))]] += 1
    return v / (len(emb) * math.sqrt(G))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 12), G=st.integers(1, 6),
       J=st.integers(1, 5), d=st.integers(2, 6))
def test_a_clients_vector_has_norm_at_most_one_and_each_prompt_gets_one_over_sqrt_g(
        seed, k, G, J, d):
    rng = np.random.default_rng(seed)
    emb, syn = rng.normal(size=(k, d)), rng.normal(size=(G * J, d))
    groups = _groups(G, J)
    v = coverage.client_vector(emb, syn, groups)
    assert np.all(v >= 0)
    assert np.linalg.norm(v) <= 1 + 1e-12
    for g in range(G):
        assert v[groups == g].sum() == pytest.approx(1 / math.sqrt(G))
    np.testing.assert_allclose(v, _brute(emb, syn, groups), atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), k1=st.integers(1, 8), k2=st.integers(1, 8),
       G=st.integers(1, 5), J=st.integers(2, 5))
def test_two_clients_vectors_differ_by_at_most_sqrt_two_the_replace_one_bound(
        seed, k1, k2, G, J):
    rng = np.random.default_rng(seed)
    syn = rng.normal(size=(G * J, 4))
    a = coverage.client_vector(rng.normal(size=(k1, 4)), syn, _groups(G, J))
    b = coverage.client_vector(rng.normal(size=(k2, 4)), syn, _groups(G, J))
    assert np.linalg.norm(a - b) <= math.sqrt(2) + 1e-12


def test_the_bounds_are_attained_so_the_sensitivity_is_not_loose():
    """Worst cases: a client whose records all sit on one candidate per prompt has norm exactly
    1 (add/remove: D = 1); two such clients on different candidates differ by exactly sqrt 2
    (replace: D = sqrt 2, the spec's nonnegative factor)."""
    G, J = 4, 3
    syn = np.eye(G * J)
    groups = _groups(G, J)
    on_first = syn[::J].sum(axis=0, keepdims=True)  # nearest to candidate 0 of every prompt
    on_second = syn[1::J].sum(axis=0, keepdims=True)
    a = coverage.client_vector(np.repeat(on_first, 5, axis=0), syn, groups)
    b = coverage.client_vector(on_second, syn, groups)
    assert np.linalg.norm(a) == pytest.approx(1.0)
    assert np.linalg.norm(a - b) == pytest.approx(math.sqrt(2))
    spec = ScoreSpec(mode="coverage", noise_multiplier=1.0, clients_per_round=2)
    assert spec.sensitivity == 1.0 and spec.nonnegative
    replace = Noise.of_round(1.0, sample_rate=0.5, sampling="fixed", spec=spec, mode="research")
    poisson = Noise.of_round(1.0, sample_rate=0.5, sampling="poisson",
                             spec=ScoreSpec(mode="coverage", noise_multiplier=1.0,
                                            sample_rate=0.5), mode="research")
    assert replace.sensitivity == pytest.approx(math.sqrt(2))
    assert poisson.sensitivity == pytest.approx(1.0)


def test_the_round_sum_is_the_sum_of_the_clients_vectors():
    rng = np.random.default_rng(3)
    G, J = 5, 4
    syn, groups = rng.normal(size=(G * J, 6)), _groups(G, J)
    ids = [f"c{i % 7}" for i in range(40)]
    codes, clients = factorize(ids)
    emb = rng.normal(size=(40, 6))
    part = Participation.everyone(len(clients))
    c = coverage.contributions(emb, codes, part, syn, groups)
    want = sum(coverage.client_vector(emb[codes == i], syn, groups)
               for i in range(len(clients)))
    np.testing.assert_allclose(c.exact(), want, atol=1e-12)
    np.testing.assert_allclose(c.rows(0, len(clients)).sum(axis=0), want, atol=1e-5)
    # every client puts 1 / sqrt(G) on each prompt: the sum per prompt is L / sqrt(G)
    for g in range(G):
        assert c.exact()[groups == g].sum() == pytest.approx(len(clients) / math.sqrt(G))


def test_spec_refuses_the_other_modes_settings_and_flower():
    with pytest.raises(ConfigError) as e:
        ScoreSpec(mode="coverage", noise_multiplier=1.0, clip=2.0)
    assert e.value.field == "clip"
    with pytest.raises(ConfigError) as e:
        ScoreSpec(mode="coverage", noise_multiplier=1.0, threshold=3.0)
    assert e.value.field == "threshold"
    with pytest.raises(ConfigError) as e:
        ScoreSpec(mode="coverage", noise_multiplier=1.0, engine="flower", supernodes=3)
    assert e.value.field == "mode"


def test_groups_need_a_prompt_id_named_by_line():
    with pytest.raises(InputError) as e:
        coverage.groups_of([{"prompt_id": 0}, {"id": "x"}], "syn.npy")
    assert e.value.line == 2 and e.value.field == "prompt_id"
    assert coverage.groups_of([{"prompt_id": "b"}, {"prompt_id": "a"},
                               {"prompt_id": "b"}]).tolist() == [0, 1, 0]


def _sets(tmp_path, G=6, J=4, clients=9):
    from popri.core.io import save_embedding_set

    rng = np.random.default_rng(0)
    syn = rng.normal(size=(G * J, 8)).astype(np.float32)
    rows = [{"id": f"r1-p{g}-s{j}", "prompt_id": g, "sample_idx": j}
            for g in range(G) for j in range(J)]
    save_embedding_set(str(tmp_path / "syn.npy"), syn, rows, {"model": "test-model"})
    ids = [f"c{i % clients}" for i in range(4 * clients)]
    priv = emb_set(tmp_path / "priv.npy", rng.normal(size=(len(ids), 8)).astype(np.float32),
                   ids)
    return str(tmp_path / "syn.npy"), priv, G


def test_score_mode_coverage_through_the_cli_with_its_ledger(tmp_path, run_popri):
    syn, priv, G = _sets(tmp_path)
    exact = tmp_path / "exact.npy"
    r = run_popri(["score", "--mode", "coverage", "--private", priv, "--synthetic", syn,
                  "--noise-multiplier", "0", "--diagnostic", "--seed", "1", "--out", str(exact)])
    assert r.returncode == 0, r.stderr
    s = np.load(exact)
    assert s.sum() == pytest.approx(9 * G / math.sqrt(G), rel=1e-5)  # 9 clients, all in
    out = tmp_path / "scores.npy"
    r = run_popri(["score", "--mode", "coverage", "--private", priv, "--synthetic", syn,
                  "--noise-multiplier", "2", "--sample-rate", "0.5", "--seed", "1",
                  "--out", str(out)])
    assert r.returncode == 0, r.stderr
    side = json.loads(out.with_suffix(".json").read_text())
    (entry,) = side["ledger"]
    assert side["mode"] == "coverage"
    assert entry["sampling"] == "poisson"
    assert entry["neighbouring"] == "add/remove one client"
    assert entry["mechanism"] == "subsampled_gaussian" and entry["noise_multiplier"] == 2.0
    assert entry["sensitivity"] == pytest.approx(1.0)
    # a fixed count of clients: replace one client, the non-negative votes' sqrt 2
    out2 = tmp_path / "fixed.npy"
    r = run_popri(["score", "--mode", "coverage", "--private", priv, "--synthetic", syn,
                   "--noise-multiplier", "2", "--clients-per-round", "4", "--seed", "1",
                   "--out", str(out2)])
    assert r.returncode == 0, r.stderr
    (entry,) = json.loads(out2.with_suffix(".json").read_text())["ledger"]
    assert entry["neighbouring"] == "replace one client"
    assert entry["sensitivity"] == pytest.approx(math.sqrt(2))


def test_score_mode_coverage_refuses_clip_and_samples_without_prompt_ids(tmp_path, run_popri):
    syn, priv, _ = _sets(tmp_path)
    r = run_popri(["score", "--mode", "coverage", "--private", priv, "--synthetic", syn,
                  "--noise-multiplier", "1", "--clip", "2", "--out", str(tmp_path / "a.npy")])
    assert r.returncode == 2 and "clip" in r.stderr
    bare = emb_set(tmp_path / "bare.npy", np.ones((4, 8), np.float32))
    r = run_popri(["score", "--mode", "coverage", "--private", priv, "--synthetic", bare,
                  "--noise-multiplier", "1", "--out", str(tmp_path / "b.npy")])
    assert r.returncode == 2 and "bare.npy:1: field 'prompt_id'" in r.stderr
    assert not (tmp_path / "b.npy").exists()
