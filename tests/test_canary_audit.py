"""`popri audit canaries` (issue 69): the canaries (seeded, recorded, each a client included
w.p. 1/2), the audited data, the scores from the released artifacts, the bound beside the
ledger's epsilon (popri/pipeline/canaries.py, popri/apps/audit/canaries.py; the bound's maths:
tests/test_onerun.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import assert_one_line_error, write_jsonl
from popri.apps.audit import canaries as C

LETTERS = list("abcdefghijklmnopqrstuvwxyz")


def _vocab(rng, n=400):
    return ["".join(rng.choice(LETTERS, size=int(rng.integers(4, 9)))) for _ in range(n)]


def _texts(rng, vocab, n):
    return [" ".join(rng.choice(vocab, size=int(rng.integers(6, 14)))) + "." for _ in range(n)]


def test_canaries_are_seeded_secret_and_each_included_by_its_own_coin():
    rng = np.random.default_rng(0)
    pub = _texts(rng, _vocab(rng), 80)
    vocab = C.vocabulary(pub)
    a = C.make_canaries(400, vocab=vocab, public_texts=pub, seed=3)
    assert a == C.make_canaries(400, vocab=vocab, public_texts=pub, seed=3)
    assert a != C.make_canaries(400, vocab=vocab, public_texts=pub, seed=4)
    assert len({c["client_id"] for c in a}) == 400 and len({c["text"] for c in a}) == 400
    n_in = sum(c["included"] for c in a)
    assert abs(n_in - 200) < 3 * 10  # Binomial(400, 1/2): SD 10
    echo = C.make_canaries(20, vocab=vocab, public_texts=pub, seed=3, style="echo")
    assert all(any(c["text"].startswith(" ".join(t.split()[:3])) for t in pub) for c in echo)
    with pytest.raises(ValueError, match="distinct words"):
        C.vocabulary(["a few words only"])
    with pytest.raises(ValueError, match="style"):
        C.make_canaries(10, vocab=vocab, public_texts=pub, seed=0, style="loud")


def test_lcs_scores_find_a_verbatim_run_and_shuffles_keep_the_words():
    samples = ["the quick brown fox jumps", "nothing in common here", "over the lazy dog"]
    s = C.lcs_scores(["quick brown fox", "lazy dog sleeps today", "zebra"], samples)
    assert s.tolist() == [1.0, 0.5, 0.0]
    assert C.longest_common_run("a b c d".split(), "x b c y".split()) == 2
    sh = C.shuffled(["one two three four five"], seed=1)
    assert sorted(sh[0].split()) == sorted("one two three four five".split())


@pytest.fixture
def dataset(tmp_path, run_popri):
    rng = np.random.default_rng(0)
    vocab = _vocab(rng)
    priv = tmp_path / "priv.jsonl"
    write_jsonl(priv, [{"user": f"u{i % 24}", "text": t}
                       for i, t in enumerate(_texts(rng, vocab, 192))])
    data = tmp_path / "data"
    run_popri(["bench", "fetch", priv, "--client-column", "user", "--out", data, "--seed", "0",
               "--tokenizer", "whitespace"], check=True)
    pub = tmp_path / "public.jsonl"
    write_jsonl(pub, [{"id": f"p{i}", "text": t} for i, t in enumerate(_texts(rng, vocab, 60))])
    return data, pub


def _sets(data, pub, lm, *more):
    ov = ["method=dp-fedavg", f"data.dir={data}", f"data.public_source={pub}", f"fl.model={lm}",
          f"downstream.model={lm}", "rounds=1", "fl.sample_rate=1.0", "fl.public_clients=40",
          "fl.bf16=false", "fl.client_lr=0.5", "downstream.eval_max_samples=16",
          "baselines=false", *more]
    return [a for o in ov for a in ("--set", o)]


def test_an_audit_of_a_dp_fedavg_run_prints_the_bound_beside_the_ledger(dataset, tiny_lm,
                                                                         tmp_path, run_popri):
    data, pub = dataset
    out = tmp_path / "audit"
    p = run_popri(["audit", "canaries", "--run-dir", out, "--canaries", "20", "--copies", "2",
                   "--json", *_sets(data, pub, tiny_lm)])
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout)  # stdout: the audit's JSON only (the run's table went to stderr)
    assert r == json.loads((out / "audit.json").read_text())
    assert r["method"] == "dp-fedavg" and r["m"] == 20 and r["score"] in ("model", "model-raw")
    assert r["neighbouring"] == "add/remove one client" and r["eps_ledger"] <= 1.0 + 1e-9
    assert r["eps_claimed"] == r["eps_ledger"] and r["refuted"] is (r["eps_lower"] > 1.0)
    assert 0 <= r["correct"] <= r["r"] <= r["m"]
    can = [json.loads(x) for x in (out / "canaries.jsonl").read_text().splitlines()]
    assert [c["id"] for c in can] == [f"canary-{i:04d}" for i in range(20)]
    # the audited data: the included canaries' clients only, `copies` records each
    train = [json.loads(x) for x in (out / "data" / "train.jsonl").read_text().splitlines()]
    planted = [t for t in train if t["client_id"].startswith("canary-")]
    assert sorted({t["client_id"] for t in planted}) == sorted(c["id"] for c in can
                                                              if c["included"])
    assert len(planted) == 2 * r["included"]
    man = json.loads((out / "data" / "manifest.json").read_text())
    base = json.loads((data / "manifest.json").read_text())
    assert man["counts"]["train"]["clients"] == base["counts"]["train"]["clients"] + r["included"]
    assert json.loads((out / "data" / "provenance.json").read_text())["status"] == "private"
    rows = [json.loads(x) for x in (out / "membership_scores.jsonl").read_text().splitlines()]
    assert [x["id"] for x in rows] == [c["id"] for c in can] and all("model" in x and "model-raw" in x for x in rows)
    # the same directory with other canaries: refused, the draw kept
    p = run_popri(["audit", "canaries", "--run-dir", out, "--canaries", "20", "--seed", "1",
                   *_sets(data, pub, tiny_lm)])
    assert_one_line_error(p, "canaries.jsonl", "other canaries", logs=True)
    assert [json.loads(x) for x in (out / "canaries.jsonl").read_text().splitlines()] == can


def test_a_method_without_a_claim_and_an_unknown_score_are_refused(dataset, tiny_lm, tmp_path,
                                                                    run_popri):
    data, pub = dataset
    p = run_popri(["audit", "canaries", "--run-dir", tmp_path / "a",
                   *_sets(data, pub, tiny_lm, "method=fewfedpit", "privacy.epsilon=null")])
    assert_one_line_error(p, "method", "fewfedpit")
    p = run_popri(["audit", "canaries", "--run-dir", tmp_path / "b", "--scores", "embed,vibes",
                   *_sets(data, pub, tiny_lm)])
    assert_one_line_error(p, "vibes")
    assert not (tmp_path / "b" / "run").exists()
