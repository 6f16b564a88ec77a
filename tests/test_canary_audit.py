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
    assert r["method"] == "dp-fedavg" and r["m"] == 20 and r["score"] in ("model", "model-raw", "model-rows")
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
    assert not any("model-rows" in x for x in rows)  # a LoRA release moves no embedding row
    # the same directory with other canaries: refused, the draw kept
    p = run_popri(["audit", "canaries", "--run-dir", out, "--canaries", "20", "--seed", "1",
                   *_sets(data, pub, tiny_lm)])
    assert_one_line_error(p, "canaries.jsonl", "other canaries", logs=True)
    assert [json.loads(x) for x in (out / "canaries.jsonl").read_text().splitlines()] == can


def test_the_audit_has_teeth_a_run_without_noise_is_refuted_far_above_its_claim(
        dataset, tiny_lm, tmp_path, run_popri):
    """Issue 69, point 4: the same DP-FedAvg run at z = 1e-6 (--break no-noise) is held to the
    config's eps = 1 and refuted far above it (the white-box model-rows score separates the 200
    canaries' draw nearly perfectly: ~2.9 is the most 200 canaries can show); the honest run at
    eps = 1 is not refuted.  A run that leaks, caught from the released model alone."""
    from transformers import AutoTokenizer

    data, _ = dataset
    # the public vocabulary (the canaries' alphabet): whole-word tokens of the model's tokenizer,
    # so that most canaries hold tokens of their own (random letter strings share sub-words)
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    words = sorted({t[1:] for t in tok.get_vocab() if t.startswith("\u0120") and t[1:].isalpha()
                    and t[1:].islower() and 6 <= len(t) <= 11})[:3000]
    assert len(words) >= 2000
    pub = tmp_path / "words.jsonl"
    write_jsonl(pub, [{"id": f"w{i}", "text": " ".join(words[i:i + 20])}
                      for i in range(0, len(words), 20)])
    sets = _sets(data, pub, tiny_lm, "privacy.epsilon=1.0", "fl.clip=20", "fl.momentum=0",
                 "fl.server_lr=1", "fl.lora=false", "fl.local_epochs=1", "fl.public_clients=130")
    brk = run_popri(["audit", "canaries", "--run-dir", tmp_path / "brk", "--canaries", "200",
                     "--copies", "1", "--break", "no-noise", "--json", *sets])
    assert brk.returncode == 1, brk.stderr[-3000:]  # the claim refuted: exit 1
    r = json.loads(brk.stdout)
    assert r["break"] == "no-noise" and r["eps_claimed"] == 1.0 and r["refuted"], r
    assert r["eps_lower"] >= 2.0 and r["score"] == "model-rows", r
    assert "VIOLATION" in brk.stderr
    # the same run held to eps = inf (privacy.epsilon: null, the eps = inf audit): the run is
    # cached (the break runs it without a budget either way), the claim is written null (JSON
    # has no inf) and not refuted
    inf = run_popri(["audit", "canaries", "--run-dir", tmp_path / "brk", "--canaries", "200",
                     "--copies", "1", "--break", "no-noise", "--json", *sets, "--set",
                     "privacy.epsilon=null"])
    assert inf.returncode == 0, inf.stderr[-3000:]
    ri = json.loads(inf.stdout)
    assert ri["eps_claimed"] is None and not ri["refuted"] and ri["eps_lower"] == r["eps_lower"]
    assert "fl-round1 (new)" not in inf.stderr  # the run cached
    ok = run_popri(["audit", "canaries", "--run-dir", tmp_path / "dp", "--canaries", "200",
                    "--copies", "1", "--json", *sets])
    assert ok.returncode == 0, ok.stderr[-3000:]
    h = json.loads(ok.stdout)
    assert not h["refuted"] and h["eps_lower"] <= h["eps_ledger"] <= 1.0 + 1e-9, h
    # the two audits share the canaries' draw (one seed): only the noise differs
    assert [c["included"] for c in map(json.loads, (tmp_path / "brk" / "canaries.jsonl")
                                       .read_text().splitlines())] == [
        c["included"] for c in map(json.loads, (tmp_path / "dp" / "canaries.jsonl")
                                   .read_text().splitlines())]


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


def test_row_shifts_read_the_moved_embedding_rows_of_each_canarys_own_tokens(tiny_lm, tmp_path):
    """model-rows (white-box): a canary whose own tokens' rows moved scores their mean shift; one
    whose rows did not move scores 0; a token two canaries share counts for neither, unless a
    canary has no token of its own (then all its tokens count)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm)
    texts = ["zebra quantum", "walrus dominion", "zebra dominion"]
    ids = [set(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    own = [ids[i] - set().union(*(ids[j] for j in range(3) if j != i)) for i in range(3)]
    assert own[0] and own[1] and not own[2]
    m = AutoModelForCausalLM.from_pretrained(tiny_lm)
    w = m.get_input_embeddings().weight
    shared = ids[0] & ids[2]
    with torch.no_grad():
        for t in own[0]:
            w[t] += 0.5  # an L2 shift of 0.5 * sqrt(64) = 4
        for t in shared:
            w[t] += 10.0  # 80: not canary 0's own, so not in its score
    m.save_pretrained(tmp_path / "released")
    tok.save_pretrained(tmp_path / "released")
    s = C.row_shifts(texts, str(tmp_path / "released"), reference=tiny_lm)
    assert s[0] == pytest.approx(4.0, rel=1e-4) and s[1] == pytest.approx(0.0, abs=1e-6), s
    assert s[2] == pytest.approx(80.0 * len(shared) / len(ids[2]), rel=1e-4), s
