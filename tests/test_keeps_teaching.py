"""Issue 67's remedies as settings of `popri run`, each with POPri as its unset value: the
coverage reward (score.mode: coverage; its maths in tests/test_coverage.py), DivPO pairs
(dpo.pair_rule: divpo), and the final set's mixture with the untuned generator
(final_untuned_share) and conditioning on many prompts (final_samples_per_prompt).

    python -m pytest -q tests/test_keeps_teaching.py
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import write_jsonl
from test_remedies import _plan  # the dry-run plan of examples' defaults
from popri.core.errors import ConfigError, InputError
from popri.data.records import mix_by_prompt
from popri.methods.popri.prefs import build_pairs, diverse_pair, rank_groups
from popri.specs.training import PrefsSpec


def samples(K=2, J=6, tag=""):
    return [{"id": f"{tag}s{k}-{j}", "round": 1, "prompt_id": f"p{k}", "sample_idx": j,
             "prompt": f"P{k}", "text": f"{tag}text {k}-{j}", "model": "m"}
            for k in range(K) for j in range(J)]


# --------------------------------------------------------------------------- DivPO pairs
def test_divpo_chooses_the_most_diverse_above_the_rejected_rank_and_rejects_the_least():
    """One prompt of J = 6, rejected rank 3: ranks 1-2 may be chosen, ranks 3-6 rejected.
    Samples 0, 2, 3, 5 sit together, 1 and 4 apart: the chosen is rank 2 (sample 1, apart),
    the rejected the least diverse of ranks 3-6."""
    S = samples(K=1, J=6)
    sc = np.array([6, 5, 4, 3, 2, 1], dtype=float)  # rank = sample_idx
    e = np.array([[1, 0, 0], [0, 1, 0], [1, .1, 0], [1, 0, .1], [0, 0, 1], [1, .05, .05]])
    unit = e / np.linalg.norm(e, axis=1, keepdims=True)
    (pair,), rep = build_pairs(S, sc, None, PrefsSpec(rejected_rank=3, pair_rule="divpo"),
                               embeddings=unit)
    assert pair["chosen"] == "text 0-1"
    div = [1 - np.mean([unit[m] @ unit[n] for m in range(6) if m != n]) for n in range(6)]
    assert pair["rejected"] == f"text 0-{2 + int(np.argmin(div[2:]))}"
    assert rep["pair_rule"] == "divpo" and rep["chosen_below_rank_1"] == 1
    # unset and 'score' are POPri's rule whatever the embeddings say
    paper, _ = build_pairs(S, sc, None, PrefsSpec(rejected_rank=3))
    assert (paper[0]["chosen"], paper[0]["rejected"]) == ("text 0-0", "text 0-2")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(2, 8), st.integers(2, 8))
def test_divpo_pairs_keep_the_released_order(seed, J, rank):
    """Whatever the embeddings: every chosen sample ranks above its rejected one under the
    released scores (the threshold is the rejected rank), one pair per prompt."""
    rank = min(rank, J)
    rng = np.random.default_rng(seed)
    S = samples(K=4, J=J)
    sc = rng.normal(size=len(S))
    unit = rng.normal(size=(len(S), 5))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    pairs, _ = build_pairs(S, sc, None, PrefsSpec(rejected_rank=rank, pair_rule="divpo"),
                           embeddings=unit)
    assert len(pairs) == 4
    pos = {s["text"]: i for i, s in enumerate(S)}
    for p, members in zip(pairs, rank_groups(S, sc)):
        c, r = pos[p["chosen"]], pos[p["rejected"]]
        assert members.index(c) < rank - 1 <= members.index(r)
        assert sc[c] >= sc[r]
    # the rule itself, with the set so far: deterministic
    m = rank_groups(S, sc)[0]
    assert diverse_pair(m, rank, unit, [0]) == diverse_pair(m, rank, unit, [0])


def test_divpo_needs_embeddings_of_every_sample(tmp_path, run_popri):
    S = samples(K=1, J=6)
    with pytest.raises(InputError, match="needs the samples' embeddings"):
        build_pairs(S, np.arange(6.0), None, PrefsSpec(pair_rule="divpo"))
    from popri.core.io import save_embedding_set, save_scores

    smp = write_jsonl(tmp_path / "s.jsonl", samples(K=2, J=6))
    save_scores(str(tmp_path / "sc.npy"), np.arange(12.0)[::-1].copy(),
                {"ids": [s["id"] for s in samples(K=2, J=6)]})
    rng = np.random.default_rng(0)
    save_embedding_set(str(tmp_path / "e.npy"), rng.normal(size=(12, 4)).astype(np.float32),
                       [{"id": s["id"]} for s in samples(K=2, J=6)], {"model": "m"})
    out = tmp_path / "pairs.jsonl"
    r = run_popri(["prefs", "build", "--samples", smp, "--scores", tmp_path / "sc.npy",
                   "--pair-rule", "divpo", "--embeddings", tmp_path / "e.npy", "--out", out])
    assert r.returncode == 0, r.stderr
    assert "most diverse" in r.stderr and len(out.read_text().splitlines()) == 2
    save_embedding_set(str(tmp_path / "few.npy"), np.ones((3, 4), np.float32),
                       [{"id": s["id"]} for s in samples(K=2, J=6)[:3]], {"model": "m"})
    r = run_popri(["prefs", "build", "--samples", smp, "--scores", tmp_path / "sc.npy",
                   "--pair-rule", "divpo", "--embeddings", tmp_path / "few.npy",
                   "--out", tmp_path / "p2.jsonl"])
    assert r.returncode == 2 and "s.jsonl:4: field 'id'" in r.stderr
    assert not (tmp_path / "p2.jsonl").exists()
    r = run_popri(["prefs", "build", "--samples", smp, "--scores", tmp_path / "sc.npy",
                   "--embeddings", tmp_path / "e.npy", "--out", tmp_path / "p3.jsonl"])
    assert r.returncode == 2 and "--pair-rule divpo" in r.stderr


# --------------------------------------------------------------------------- the final set
def test_mix_by_prompt_swaps_whole_prompts_a_seeded_share():
    mine, other = samples(K=8, J=3, tag="t"), samples(K=8, J=3, tag="u")
    out, stats = mix_by_prompt(mine, other, 0.25, 7)
    assert stats["prompts_from_other"] == 2 and stats["samples_from_other"] == 6
    assert [r["prompt_id"] for r in out] == [r["prompt_id"] for r in mine]  # file order kept
    for k in range(8):
        block = [r for r in out if r["prompt_id"] == f"p{k}"]
        assert len({r["mixed_from"] for r in block}) == 1  # a prompt from one set
        assert all(r["text"].startswith("u" if r["mixed_from"] == "other" else "t")
                   for r in block)
    assert mix_by_prompt(mine, other, 0.25, 7)[0] == out
    assert mix_by_prompt(mine, other, 0.25, 8)[0] != out or True  # another seed may swap others
    assert mix_by_prompt(mine, other, 0.0, 7)[1]["prompts_from_other"] == 0
    with pytest.raises(InputError, match="different prompt ids"):
        mix_by_prompt(mine, samples(K=7, J=3), 0.5, 0)
    bad = [dict(r, prompt="X") if r["prompt_id"] == "p3" else r for r in other]
    with pytest.raises(InputError, match="another prompt text"):
        mix_by_prompt(mine, bad, 0.5, 0)


def test_cli_take_mix_from(tmp_path, run_popri):
    a = write_jsonl(tmp_path / "a.jsonl", samples(K=4, J=2, tag="t"))
    b = write_jsonl(tmp_path / "b.jsonl", samples(K=4, J=2, tag="u"))
    r = run_popri(["take", a, "--mix-from", b, "--share", "0.5", "--seed", "3",
                   "--stats-out", tmp_path / "mix.json"])
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert sum(x["mixed_from"] == "other" for x in rows) == 4
    assert json.loads((tmp_path / "mix.json").read_text())["prompts_from_other"] == 2
    r = run_popri(["take", a, "--mix-from", b, "--tokens", "5"])
    assert r.returncode == 2 and "exactly one of" in r.stderr
    r = run_popri(["take", a, "--mix-from", b])
    assert r.returncode == 2 and "--share" in r.stderr


def test_unset_remedies_plan_popri_unchanged_and_set_ones_change_what_they_say(tmp_path):
    paper = _plan(tmp_path)
    assert _plan(tmp_path, "score.mode=cosine", "final_untuned_share=0") == paper
    cmds = _plan(tmp_path, "score.mode=coverage", "dpo.pair_rule=divpo",
                 "final_untuned_share=0.25", "final_samples_per_prompt=1", "draws=2")
    score = [c for c in cmds if c.startswith("popri score") and "--diagnostic" not in c]
    assert score and all("--mode coverage" in c and "--clip" not in c for c in score)
    exact = [c for c in cmds if "--diagnostic" in c]
    assert exact and all("--mode coverage" in c for c in exact)
    for t in (1, 2):
        emb = [c for c in cmds if c.startswith("popri embed") and f"round{t}/samples.jsonl" in c]
        assert len(emb) == 1 and f"round{t}/samples_emb.npy" in emb[0]
        pref = [c for c in cmds if c.startswith("popri prefs build") and f"round{t}/" in c][0]
        assert "--pair-rule divpo" in pref and f"round{t}/samples_emb.npy" in pref
    # the set and its control, draws 0 and 1 (the recipe and the driver both list draw 0's
    # control, one command: it runs once)
    final = {c for c in cmds if c.startswith("popri gen") and "--num-samples" in c}
    assert len(final) == 4 and all("--samples-per-prompt 1" in c for c in final)
    assert any("synthetic_tuned.jsonl" in c and "--adapter" in c for c in final)
    mix = [c for c in cmds if c.startswith("popri take") and "--mix-from" in c]
    assert len(mix) == 2  # draw 0 and draw 1
    assert "synthetic_tuned.jsonl" in mix[0] and "--share 0.25" in mix[0]
    assert mix[0].split("--out ")[1].split()[0].endswith("run/synthetic.jsonl")
    assert "draws/d1/synthetic.jsonl" in mix[1] and "draws/d1/synthetic_t0.jsonl" in mix[1]
    # the rounds keep POPri's J
    rounds = [c for c in cmds if c.startswith("popri gen") and "--prompts " in c]
    assert rounds and all("--samples-per-prompt 1" not in c for c in rounds)


@pytest.mark.parametrize("sets,field", [
    (["method=pe", "final_untuned_share=0.5"], "final_untuned_share"),
    (["method=pe", "final_samples_per_prompt=2"], "final_samples_per_prompt"),
    (["method=pe", "dpo.pair_rule=divpo"], "dpo.pair_rule"),
    (["final_untuned_share=0.5", "final_match_tokens=true"], "final_untuned_share"),
    (["final_untuned_share=1"], "final_untuned_share"),
    (["score.mode=coverage", "score.clip=2"], "clip"),
])
def test_remedy_settings_refuse_what_they_cannot_do(tmp_path, sets, field):
    with pytest.raises(ConfigError) as e:
        _plan(tmp_path, *sets)
    assert field.split(".")[-1] in str(e.value.field)


@pytest.mark.slow
def test_a_run_with_every_remedy_on_tiny_models(tmp_path, run_popri, tiny_lm, tiny_st_model):
    """`popri run` with the coverage reward, DivPO pairs, a mixed final set on one prompt per
    sample (tiny models, 1 round, 2 draws): the ledger holds coverage rounds of sensitivity
    1, the pairs are DivPO's, the final set mixes whole prompts of the tuned and the control
    set, and the control row is trained and paired as usual."""
    from test_run_e2e import tiny_inputs as _inputs, tiny_overrides

    data, pub = _inputs.__wrapped__(tmp_path, run_popri)
    run = tmp_path / "run"
    ov = tiny_overrides(run, data, pub, tiny_lm, tiny_st_model) + [
        "rounds=1", "draws=2", "probe.enabled=false", "score.mode=coverage",
        "dpo.pair_rule=divpo", "final_untuned_share=0.5", "final_samples_per_prompt=1"]
    p = run_popri(["run", *[f"--set={o}" for o in ov]])
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((run / "results.json").read_text())
    assert set(res["methods"]) >= {"popri", "t0"}
    assert res["control"]["draws"]["n"] == 2
    (entry,) = [json.loads(x) for x in (run / "round1" / "ledger.jsonl").read_text()
                .splitlines()]
    assert entry["params"]["mode"] == "coverage" and entry["sensitivity"] == 1.0
    rep = json.loads((run / "round1" / "prefs_report.json").read_text())
    assert rep["pair_rule"] == "divpo"
    for d in (run, run / "draws" / "d1"):
        mixed = [json.loads(x) for x in (d / "synthetic.jsonl").read_text().splitlines()]
        t0 = [json.loads(x) for x in (d / "synthetic_t0.jsonl").read_text().splitlines()]
        assert len(mixed) == len(t0) and len({r["prompt_id"] for r in mixed}) == len(mixed)
        other = [r for r in mixed if r["mixed_from"] == "other"]
        assert len(other) == round(0.5 * len(mixed))
        by_id = {r["id"]: r["text"] for r in t0}
        assert all(by_id[r["id"]] == r["text"] for r in other)
