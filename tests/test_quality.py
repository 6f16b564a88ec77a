"""popri eval quality (issue 65): MAUVE on a language model's features and the diversity of a
synthetic set.

    python -m pytest -q tests/test_quality.py
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import write_jsonl
from popri.eval import quality as Q


def test_self_cosine_and_spread_match_brute_force():
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(9, 5))
    d = Q.diversity([f"a b c {i}" for i in range(9)], emb)
    u = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    sims = u @ u.T
    assert d["self_cosine"] == pytest.approx(sims[~np.eye(9, dtype=bool)].mean())
    assert d["embedding_spread"] == pytest.approx(
        np.sqrt(np.mean(np.sum((u - u.mean(0)) ** 2, 1))))
    # "a", "b", "c" and the 9 numbers are distinct among 9 x 4 whitespace tokens
    assert d["distinct_1"] == pytest.approx((3 + 9) / 36)
    assert Q.diversity(["x"], emb[:1])["self_cosine"] is None


def test_mauve_sees_the_same_distribution_and_a_shifted_one():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(300, 8))
    same = Q.mauve_score(rng.normal(size=(300, 8)), q, seed=0)["mauve"]
    far = Q.mauve_score(rng.normal(size=(300, 8)) + 4.0, q, seed=0)["mauve"]
    near = Q.mauve_score(rng.normal(size=(300, 8)) + 0.7, q, seed=0)["mauve"]
    assert same > 0.9 and far < 0.1 and far < near < same
    a = Q.mauve_score(q[:150] + 0.5, q, seed=3)
    assert a == Q.mauve_score(q[:150] + 0.5, q, seed=3)  # seeded: reproducible
    assert a["buckets"] == 15  # min(n_p, n_q) / 10


def test_features_are_each_texts_own_last_token_whatever_its_batch(tiny_lm):
    texts = ["the cat sat on the mat.", "a much longer sentence about the dog and the log.",
             "hi"]
    together = Q.lm_features(tiny_lm, texts, batch_size=3)
    alone = np.vstack([Q.lm_features(tiny_lm, [t], batch_size=1) for t in texts])
    assert together.shape == (3, 64)
    np.testing.assert_allclose(together, alone, atol=1e-5)
    assert not np.allclose(together[0], together[1])


def test_cli_quality_json_sizes_and_errors(tmp_path, run_popri, tiny_lm, tiny_st_model):
    rng = np.random.default_rng(0)
    words = "river market winter council harvest railway treaty budget".split()
    syn = write_jsonl(tmp_path / "syn.jsonl", [{"text": " ".join(rng.choice(words, 7))}
                                               for _ in range(24)])
    ref = write_jsonl(tmp_path / "ref.jsonl", [{"text": " ".join(rng.choice(words, 9))}
                                               for _ in range(30)])
    base = ["eval", "quality", syn, "--reference", ref, "--model", tiny_lm, "--embed-model",
            tiny_st_model]
    p = run_popri([*base, "--sizes", "8,16", "--max-reference", "20", "--reference-seed",
                   "4", "--json"])
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert [x["n"] for x in r["sizes"]] == [8, 16, 24] and r["n"] == 24
    assert r["n_reference"] == 20 and r["private_diagnostic"] is True
    assert all(0 < x["mauve"] <= 1 for x in r["sizes"])
    p = run_popri([*base, "--sizes", "40"])
    assert p.returncode == 2 and "every size must be in 2 .. 24" in p.stderr
    assert p.stderr.count("\n") == 1 and p.stdout == ""
