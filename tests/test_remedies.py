"""Issue 44's remedies as settings, each with POPri's behaviour as its unset value: the fluent
pair rule, the fluency gate before scoring, and the final set's top-p (popri/methods/popri/
prefs.py, recipe.py; config keys dpo.pair_rule, dpo.fluency_gate, final_top_p).

    python -m pytest -q tests/test_remedies.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import write_jsonl
from popri.core.errors import ConfigError, InputError
from popri.methods.popri.prefs import build_pairs, fluent_chosen, gate, rank_groups
from popri.pipeline import config as C
from popri.pipeline.driver import Run
from popri.specs.training import PrefsSpec


def samples(K=2, J=6):
    return [{"id": f"s{k}-{j}", "round": 1, "prompt_id": f"p{k}", "sample_idx": j,
             "prompt": f"P{k}", "text": f"text {k}-{j}", "model": "m"}
            for k in range(K) for j in range(J)]


def test_fluent_rule_moves_the_chosen_down_to_the_first_no_less_fluent_sample():
    S = samples(K=2, J=6)
    sc = np.array([6, 5, 4, 3, 2, 1, 6, 5, 4, 3, 2, 1], dtype=float)  # rank = sample_idx
    # prompt 0: rank 1 and 2 less fluent than the rejected (rank 5, NLL 3.0); rank 3 is not
    # prompt 1: nothing above the rejected is as fluent: skipped
    nll = [4.0, 3.5, 2.9, 1.0, 3.0, 9.0, 5.0, 5.0, 5.0, 5.0, 2.0, 1.0]
    flu = {s["id"]: v for s, v in zip(S, nll)}
    paper, _ = build_pairs(S, sc, None, PrefsSpec())
    pairs, rep = build_pairs(S, sc, None, PrefsSpec(pair_rule="fluent"), fluency=flu)
    assert [p["chosen"] for p in paper] == ["text 0-0", "text 1-0"]
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("text 0-2", "text 0-4")]
    assert rep["pair_rule"] == "fluent" and rep["chosen_below_rank_1"] == 1
    assert rep["skipped_prompts"] == 1 and "fluent" in rep["skipped"][0]["reason"]
    # 'score' and unset are POPri's rule, whatever fluency says
    assert build_pairs(S, sc, None, PrefsSpec(pair_rule="score"), fluency=flu)[0] == paper


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(2, 8), st.integers(2, 8))
def test_fluent_pairs_never_choose_the_less_fluent_text(seed, J, rank):
    rank = min(rank, J)
    rng = np.random.default_rng(seed)
    S = samples(K=5, J=J)
    sc = rng.normal(size=len(S))
    nll = rng.normal(3, 1, size=len(S))
    nll[rng.random(len(S)) < 0.1] = np.nan  # empty texts
    flu = {s["id"]: (None if np.isnan(v) else float(v)) for s, v in zip(S, nll)}
    pairs, rep = build_pairs(S, sc, None, PrefsSpec(rejected_rank=rank, pair_rule="fluent"),
                             fluency=flu)
    by = {s["text"]: flu[s["id"]] for s in S}
    score = {s["text"]: v for s, v in zip(S, sc)}
    for p in pairs:
        assert by[p["chosen"]] is not None
        assert by[p["rejected"]] is None or by[p["chosen"]] <= by[p["rejected"]]
        assert score[p["chosen"]] >= score[p["rejected"]]  # still ranked above it
    assert len(pairs) + rep["skipped_prompts"] == 5
    for m in rank_groups(S, sc):  # the rule's own check, prompt by prompt
        c = fluent_chosen(m, rank, np.array([np.nan if v is None else v for v in flu.values()]))
        assert c is None or c in m[:rank - 1]


def test_fluent_rule_needs_every_sample_fluency():
    S = samples(K=1, J=6)
    with pytest.raises(InputError, match="needs the samples' fluency"):
        build_pairs(S, np.arange(6.0), None, PrefsSpec(pair_rule="fluent"))
    with pytest.raises(InputError, match="has no NLL"):
        build_pairs(S, np.arange(6.0), None, PrefsSpec(pair_rule="fluent"),
                    fluency={"s0-0": 1.0})


def test_gate_drops_the_least_fluent_and_keeps_each_prompt_its_pair():
    S = samples(K=2, J=6)
    nll = [1, 2, 9, 3, 4, 5, 8, 7, 6, 1, 1, None]
    flu = {s["id"]: v for s, v in zip(S, nll)}
    kept, rep = gate(S, flu, 0.25)  # 3 of 12: the empty text, 9, 8
    assert [s["id"] for s in S if s not in kept] == ["s0-2", "s1-0", "s1-5"]
    assert rep["dropped"] == 3 and rep["max_kept_nll"] == 7
    assert kept == [s for s in S if s in kept]  # input order kept
    kept, rep = gate(S, flu, 0.5, min_per_prompt=5)  # each prompt may lose one sample only
    assert rep["dropped"] == 2 and [s["id"] for s in S if s not in kept] == ["s0-2", "s1-5"]
    assert gate(S, flu, 0.0)[0] == S


def test_cli_gate_then_fluent_pairs(tmp_path, run_popri):
    from popri.core.io import save_scores

    S = samples(K=2, J=6)
    s = write_jsonl(tmp_path / "samples.jsonl", S)
    flu = write_jsonl(tmp_path / "fluency.jsonl", [
        {"id": x["id"], "nll": float(v)} for x, v in zip(S, [1, 2, 9, 3, 4, 5, 8, 7, 6, 1, 1, 2])])
    kept = tmp_path / "kept.jsonl"
    p = run_popri(["prefs", "gate", "-s", s, "--fluency", flu, "--drop", "0.2",
                   "--min-per-prompt", "5", "-o", kept], check=True)
    assert "kept 10 of 12" in p.stderr
    rows = [json.loads(x) for x in kept.read_text().splitlines()]
    assert [r["id"] for r in rows] == [x["id"] for x in S if x["id"] not in ("s0-2", "s1-0")]
    assert all(not k.startswith("_") for r in rows for k in r)
    ids = [r["id"] for r in rows]
    save_scores(tmp_path / "scores.npy", np.linspace(1, 0, len(ids)), {"ids": ids})
    out = tmp_path / "prefs.jsonl"
    p = run_popri(["prefs", "build", "-s", kept, "--scores", tmp_path / "scores.npy",
                   "--pair-rule", "fluent", "--fluency", flu, "-o", out], check=True)
    assert "no less fluent" in p.stderr
    pairs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [p["chosen_id"] for p in pairs] == ["s0-0", "s1-3"]
    # --fluency without the rule that reads it, and a fluency file of other samples: exit 2
    p = run_popri(["prefs", "build", "-s", kept, "--scores", tmp_path / "scores.npy",
                   "--fluency", flu])
    assert p.returncode == 2 and "--pair-rule fluent" in p.stderr
    other = write_jsonl(tmp_path / "other.jsonl", [{"id": "zz", "nll": 1.0}])
    p = run_popri(["prefs", "gate", "-s", s, "--fluency", other, "-o", tmp_path / "k2.jsonl"])
    assert p.returncode == 2 and "samples.jsonl:1: field 'id'" in p.stderr
    assert not (tmp_path / "k2.jsonl").exists()
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "s0-0", "nll": "high"}])
    p = run_popri(["prefs", "gate", "-s", s, "--fluency", bad])
    assert p.returncode == 2 and "bad.jsonl:1: field 'nll'" in p.stderr


def _plan(tmp_path, *sets):
    cfg = C.load(None, [f"run_dir={tmp_path / 'run'}", "rounds=2", "privacy.noise_multiplier=1.5",
                        "privacy.epsilon=null", *sets])
    run = Run(cfg, dry_run=True)
    run.execute()
    return run.runner.commands


def test_unset_remedies_plan_popri_unchanged_and_set_ones_add_their_stages(tmp_path):
    paper = _plan(tmp_path)
    assert not any("fluency" in c or "gated" in c for c in paper)
    assert _plan(tmp_path, "dpo.pair_rule=score") == paper
    cmds = _plan(tmp_path, "dpo.pair_rule=fluent", "dpo.fluency_gate=0.2", "final_top_p=0.9")
    for t in (1, 2):
        flu = [c for c in cmds if "eval fluency" in c and f"round{t}/samples.jsonl" in c]
        gated = f"round{t}/samples_gated.jsonl"
        assert len(flu) == 1
        assert any(c.startswith("popri prefs gate") and "--min-per-prompt 5" in c
                   and "--drop 0.2" in c for c in cmds)
        score = [c for c in cmds if c.startswith("popri score") and f"round{t}/" in c]
        assert score and all(gated in c for c in score)
        pref = [c for c in cmds if c.startswith("popri prefs build") and f"round{t}/" in c][0]
        assert gated in pref and "--pair-rule fluent" in pref and "fluency.jsonl" in pref
    final = [c for c in cmds if c.startswith("popri gen") and "--num-samples" in c]
    assert len(final) == 2 and all("--top-p 0.9" in c for c in final)  # the set and T = 0
    rounds = [c for c in cmds if c.startswith("popri gen") and "--prompts " in c]
    assert rounds and all("--top-p" not in c for c in rounds)  # the command's 1.0


def test_final_top_p_changes_only_the_final_set_lines(tmp_path):
    """benchmarks/learning_study.py computes a ``final_top_p`` setting as draws of its base
    setting's run with ``--top-p`` (``final_variant``): exact only if the plans differ in the
    final-set ``popri gen`` lines' ``--top-p`` and nowhere else, draws included."""
    paper = _plan(tmp_path, "draws=3")
    nucleus = _plan(tmp_path, "draws=3", "final_top_p=0.9")
    assert len(paper) == len(nucleus)
    changed = [(a, b) for a, b in zip(paper, nucleus) if a != b]
    assert len(changed) == 6  # the final set and its T = 0 control, in each of the 3 draws
    for a, b in changed:
        assert a.startswith("popri gen") and "--num-samples" in a
        x, y = a.split(), b.split()
        i = y.index("--top-p")
        assert "--top-p" not in x and y[i + 1] == "0.9" and y[:i] + y[i + 2:] == x
    L = _study()
    assert L.final_variant("ood-eps1-topp0.9") == ("ood-eps1", {"gen": ["--top-p", "0.9"],
                                                                "match": False})
    assert L.final_variant("ood-eps1-tokens") == ("ood-eps1", {"gen": [], "match": True})
    assert L.final_variant("ood-eps1-fluent") is None
    assert L._derived_name("ood-eps1", "top-p0.9") == "ood-eps1-topp0.9"
    assert L._derived_name("ood-eps1", "match-tokens") == "ood-eps1-tokens"


def test_final_match_tokens_changes_only_the_method_final_set(tmp_path):
    """With final_match_tokens the method's final gen draws a pool of 3 N after its control,
    and ``popri take`` cuts it to the control's tokens (draws included); every other line is
    the paper's, so the T = 0 row is the same command."""
    paper = _plan(tmp_path, "draws=2")
    match = _plan(tmp_path, "draws=2", "final_match_tokens=true")
    run = str(tmp_path / "run")
    assert [c for c in match if not c.startswith(("popri gen", "popri take"))
            or "--num-samples" not in c and not c.startswith("popri take")] == \
        [c for c in paper if not (c.startswith("popri gen") and "--num-samples" in c)]
    finals = [c for c in match if c.startswith("popri gen") and "--num-samples" in c]
    takes = [c for c in match if c.startswith("popri take")]
    assert len(finals) == 4 and len(takes) == 2
    for d, take in zip(("", "draws/d1/"), takes):
        ctl = [i for i, c in enumerate(match) if f"--out {run}/{d}synthetic_t0.jsonl" in c]
        pool = [i for i, c in enumerate(match) if f"--out {run}/{d}synthetic_pool.jsonl" in c]
        t = match.index(take)
        assert len(ctl) == len(pool) == 1 and ctl[0] < t and pool[0] < t
        assert f"--tokens-of {run}/{d}synthetic_t0.jsonl" in take
        assert f"--out {run}/{d}synthetic.jsonl" in take
        assert "--num-samples 192" in match[pool[0]]  # 3 N, N = 64
        old = [c for c in paper if f"--out {run}/{d}synthetic.jsonl" in c][0]
        assert match[pool[0]] == old.replace("--num-samples 64", "--num-samples 192").replace(
            f"{d}synthetic.jsonl", f"{d}synthetic_pool.jsonl").replace(
            f"{run}/{d}synthetic_stats.json", f"{run}/{d}synthetic_pool_stats.json")
        assert match[ctl[0]] in paper
        trained = [i for i, c in enumerate(match) if c.startswith("popri train-downstream")
                   and f"{run}/{d}synthetic.jsonl" in c]
        assert trained and trained[0] > t


def _study():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import learning_study
    finally:
        sys.path.pop(0)
    return learning_study


def test_study_replays_a_final_set_variant_as_the_variant_run_would(tmp_path):
    """benchmarks/learning_study.py's draw 0 of a final-set variant (draw, _matched) runs
    exactly the commands the variant's own run has for its final set and control."""
    import shlex

    from popri.methods.popri.recipe import MATCH_POOL
    from popri.kit import take_call

    def take_argv(*a):
        return take_call(*a).argv()

    L = _study()
    run = tmp_path / "run"
    paper = _plan(tmp_path)
    lines = L._stage_lines(run, "popri", "\n".join(paper))
    assert len(lines) == 7
    got = L._matched([list(x) for x in lines], run, run, 0, MATCH_POOL, take_argv)
    want = [shlex.split(c) for c in _plan(tmp_path, "final_match_tokens=true")]
    want = [x for x in want if x[1] == "take" or f"{run}/synthetic_pool.jsonl" in x
            or x in lines]
    assert sorted(map(shlex.join, got)) == sorted(map(shlex.join, want))
    assert len(got) == 8
    order = [L.a_out(x) for x in got]
    assert order.index(f"{run}/synthetic_t0.jsonl") < order.index(f"{run}/synthetic.jsonl")
    # with the control's files in the run (its draw 0), they are copied and not run again
    (run / "eval").mkdir(parents=True)
    for f in ("synthetic_t0.jsonl", "eval/t0.json", "eval/t0.clients.jsonl"):
        (run / f).write_text(f)
    dk = tmp_path / "dk"
    (dk / "eval").mkdir(parents=True)
    got = L._matched([L.moved(x, run, dk) for x in lines], run, dk, 0, MATCH_POOL, take_argv)
    assert [x[1] for x in got] == ["gen", "take", "train-downstream", "eval", "eval"]
    assert (dk / "eval" / "t0.clients.jsonl").read_text() == "eval/t0.clients.jsonl"


@pytest.mark.parametrize("sets,field", [
    (["method=pe-sft", "dpo.pair_rule=fluent"], "dpo.pair_rule"),
    (["method=pe", "dpo.fluency_gate=0.2"], "dpo.fluency_gate"),
    (["method=dp-fedavg", "final_top_p=0.9"], "final_top_p"),
    (["dpo.fluency_gate=0.95"], "dpo.fluency_gate"),
    (["dpo.pair_rule=fluentt"], "dpo.pair_rule"),
    (["final_match_tokens=true", "control=false"], "final_match_tokens"),
    (["method=pe", "final_match_tokens=true"], "final_match_tokens"),
    (["final_top_p=0"], "final_top_p"),
])
def test_remedy_settings_refuse_what_they_cannot_do(tmp_path, sets, field):
    with pytest.raises(ConfigError) as e:
        C.load(None, [f"run_dir={tmp_path}", *sets])
    assert field.split(".")[-1] in str(e.value) or field in str(getattr(e.value, "field", ""))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=30), st.integers(1, 600))
def test_first_by_tokens_is_the_shortest_prefix_reaching_the_budget(counts, budget):
    from popri.data.records import first_by_tokens

    n = first_by_tokens(counts, budget)
    if sum(counts) < budget:
        assert n == len(counts)
    else:
        assert sum(counts[:n]) >= budget and sum(counts[:n - 1]) < budget


def test_cli_take_cuts_a_pool_to_its_reference_tokens(tmp_path, run_popri, tiny_lm):
    from popri.models import llm

    tok = llm.load_tokenizer(tiny_lm)
    pool = [{"id": f"s{i}", "text": "word " * (3 + i % 4)} for i in range(20)]
    ref = [{"id": f"t{i}", "text": "a much longer reference text of many words " * 2}
           for i in range(3)]
    P, R = write_jsonl(tmp_path / "pool.jsonl", pool), write_jsonl(tmp_path / "ref.jsonl", ref)
    budget = sum(len(tok(r["text"], add_special_tokens=False)["input_ids"]) for r in ref)
    counts = [len(tok(r["text"], add_special_tokens=False)["input_ids"]) for r in pool]
    out, stats = tmp_path / "kept.jsonl", tmp_path / "kept_take.json"
    p = run_popri(["take", P, "--tokens-of", R, "--tokenizer", tiny_lm, "-o", out,
                   "--stats-out", stats])
    assert p.returncode == 0, p.stderr
    kept = [json.loads(x) for x in out.read_text().splitlines()]
    n = len(kept)
    assert kept == pool[:n] and sum(counts[:n]) >= budget > sum(counts[:n - 1])
    s = json.loads(stats.read_text())
    assert s["budget"] == budget and s["kept"] == n and s["reached"] and s["pool"] == 20
    # stdin -> stdout, a fixed budget; a pool that falls short is kept whole, and says so
    p = run_popri(["take", "-", "--tokens", "100000", "--tokenizer", tiny_lm],
                  input=P.read_text())
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 20
    assert "falls short" in p.stderr
    # bad input: one line naming the file, line and field; nothing written
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "x", "text": "ok"}, {"id": "y"}])
    p = run_popri(["take", bad, "--tokens", "5", "--tokenizer", tiny_lm, "-o",
                   tmp_path / "b.jsonl"])
    assert p.returncode == 2 and "bad.jsonl:2: field 'text'" in p.stderr
    assert not (tmp_path / "b.jsonl").exists()
    p = run_popri(["take", P, "--tokenizer", tiny_lm])
    assert p.returncode == 2 and "exactly one of --tokens" in p.stderr


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (2.5-5.5 min here; the plans are checked above in CI)
def test_run_with_final_match_tokens_end_to_end(tmp_path, run_popri, tiny_lm, tiny_st_model):
    """`popri run` with final_match_tokens (tiny models, 1 round, 2 draws): each final set is a
    prefix of its 3 N pool holding at least its control's tokens (or the whole pool), and the
    control row is trained and paired as usual."""
    from test_run_e2e import tiny_inputs as _inputs, tiny_overrides

    data, pub = _inputs.__wrapped__(tmp_path, run_popri)
    run = tmp_path / "run"
    ov = tiny_overrides(run, data, pub, tiny_lm, tiny_st_model) + [
        "rounds=1", "draws=2", "final_match_tokens=true", "probe.enabled=false"]
    p = run_popri(["run", *[f"--set={o}" for o in ov]])
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((run / "results.json").read_text())
    assert set(res["methods"]) == {"popri", "t0", "eps0", "epsinf"}
    assert res["control"]["draws"]["n"] == 2
    for d in (run, run / "draws" / "d1"):
        pool = (d / "synthetic_pool.jsonl").read_text().splitlines()
        kept = (d / "synthetic.jsonl").read_text().splitlines()
        t = json.loads((d / "synthetic_take.json").read_text())
        assert len(pool) == 36 and kept == pool[:len(kept)] and t["kept"] == len(kept)
        assert t["budget_of"].endswith("synthetic_t0.jsonl") and t["ref_samples"] == 12
        assert t["reached"] or len(kept) == len(pool)
    assert res["final_match_tokens"]["kept"] == len((run / "synthetic.jsonl").read_text()
                                                    .splitlines())


def _ctl(d):
    return {"acc_minus_control": d, "acc_minus_control_se": 0.003, "acc": 0.2 + d,
            "acc_control": 0.2}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(-0.05, 0.05), min_size=3, max_size=3), min_size=3,
                max_size=5))
def test_verdict_is_a_one_sided_t_test_over_seed_means(per_seed):
    """The full comparison's verdict (benchmarks/learning_study.py verdict) is the one-sided
    one-sample t-test of the seeds' draw means at 0.05, both ways (scipy's ttest_1samp, an
    independent computation), and counts a seed's draws, not its test clients."""
    from scipy.stats import ttest_1samp

    L = _study()
    drows = [{"setting": "deb-eps1-fluent", "seed": s, "draws": [_ctl(d) for d in ds]}
             for s, ds in enumerate(per_seed)]
    (v,) = L.verdict([], drows, draws=3)
    means = [float(np.mean(ds)) for ds in per_seed]
    assert v["d_s"] == pytest.approx(means)
    if np.std(means) == 0:
        return  # no spread: the t statistic is undefined
    up = ttest_1samp(means, 0.0, alternative="greater").pvalue
    down = ttest_1samp(means, 0.0, alternative="less").pvalue
    want = "beats" if up < 0.05 else "loses" if down < 0.05 else "neither"
    if min(abs(up - 0.05), abs(down - 0.05)) > 1e-9:  # not on the boundary
        assert v["verdict"] == want


def test_verdict_needs_three_seeds_of_the_plans_draws_and_the_rule_needs_every_corpus():
    L = _study()
    win = [0.010, 0.012, 0.011]
    drows = [{"setting": f"{c}-eps1-fluent", "seed": s,
              "draws": [_ctl(win[s] + e) for e in (-0.001, 0.0, 0.001)]}
             for c in ("sotu", "ood", "deb") for s in range(3)]
    # pypi: only two seeds so far, and one of them with a single draw
    drows += [{"setting": "pypi-eps1-fluent", "seed": 0, "draws": [_ctl(0.01)] * 3}]
    rows = [{"setting": "pypi-eps1-fluent", "seed": 1, "diff": 0.02}]
    vs = {v["setting"]: v for v in L.verdict(rows, drows, draws=3)}
    assert vs["deb-eps1-fluent"]["verdict"] == "beats"
    assert vs["pypi-eps1-fluent"]["verdict"] == "incomplete"
    assert vs["pypi-eps1-fluent"]["draws"] == [3, 1]
    (r,) = L.rule(list(vs.values()))
    assert r["beats"] == ["sotu", "ood", "deb"] and r["meets_rule"] is None
    # pypi completed, losing: beats on three, loses on one -> not the default
    drows = [d for d in drows if not d["setting"].startswith("pypi")] + [
        {"setting": "pypi-eps1-fluent", "seed": s, "draws": [_ctl(-win[s] + e)
                                                             for e in (-0.001, 0.0, 0.001)]}
        for s in range(3)]
    (r,) = L.rule(L.verdict([], drows, draws=3))
    assert r["loses"] == ["pypi"] and r["meets_rule"] is False
    table = L.verdict_table(L.verdict([], drows, draws=3))
    assert "| pypi-eps1-fluent | pypi | 0 (3), 1 (3), 2 (3) |" in table
    assert "| fluent | sotu, ood, deb, pypi | sotu, ood, deb | pypi | no |" in table
    # a setting outside the comparison is never judged
    assert L.corpus_of("ood-eps1-rpo-fluent") is None and L.corpus_of("eps1") is None


def test_a_table_written_after_its_runs_are_gone_judges_each_seed_by_all_its_draws(
        tmp_path, monkeypatch):
    """`--with NAME` (the run directories deleted, e.g. a new machine): a kept row counts with
    all its draws -- from the row's own ``draws_d`` (kept since keep_draws) or, for a table
    written before, from NAME.md's printed values -- not with its first draw alone."""
    L = _study()
    monkeypatch.setattr(L, "HERE", tmp_path)
    (tmp_path / "results").mkdir()
    live = [{"setting": "deb-eps1", "seed": 2, "diff": 0.004}]
    live_draws = [{"setting": "deb-eps1", "seed": 2, "draws": [_ctl(d) for d in
                                                               (0.004, 0.002, 0.006)]}]
    L.keep_draws(live, live_draws)
    assert live[0]["draws_d"] == [0.004, 0.002, 0.006]
    old = [{"setting": "deb-eps1", "seed": 0, "diff": -0.0034},  # before draws_d was kept
           {"setting": "deb-eps1", "seed": 1, "diff": 0.0021,
            "draws_d": [0.00211, 0.00333, 0.00334]}]
    (tmp_path / "results" / "x.json").write_text(json.dumps(old))
    (tmp_path / "results" / "x.md").write_text(
        "| deb-eps1 | 0 | 3 | -0.0034, -0.0062, +0.0028 | -0.0022 | 0.0019 | 0.0026 | no |\n"
        "| deb-eps1 | 1 | 3 | +0.0021, +0.0033, +0.0033 | +0.0029 | 0.0015 | 0.0004 | yes |\n")
    rows, kept = L.with_previous(live, [], "x")
    assert len(kept) == 2 and [r["seed"] for r in rows] == [0, 1, 2]
    assert rows[0]["draws_d"] == [-0.0034, -0.0062, 0.0028] and "4 decimals" in rows[0][
        "draws_d_from"]
    old[0]["diff"] = -0.00336759  # the run's own draw is exact in its row
    (tmp_path / "results" / "x.json").write_text(json.dumps(old))
    rows, _ = L.with_previous(live, [], "x")
    assert rows[0]["draws_d"] == [-0.00336759, -0.0062, 0.0028]
    assert rows[1]["draws_d"] == [0.00211, 0.00333, 0.00334] and "draws_d_from" not in rows[1]
    (v,) = L.verdict(rows, [], draws=3)
    assert v["draws"] == [3, 3, 3] and v["verdict"] != "incomplete"
    assert v["d_s"] == pytest.approx([-0.00676759 / 3, 0.00878 / 3, 0.004])


def test_probe_curves_read_every_finished_comparison_run_in_round_order(tmp_path):
    """The full comparison's probe figure (learning_study.probe_curves / probe_figure): per
    corpus, setting and seed, the probe's rounds (metrics.jsonl) in numeric order (round 10
    after round 2); runs outside the comparison or unfinished are left out; the PNG is written
    atomically."""
    L = _study()

    def run(name, rounds, done=True):
        d = tmp_path / "runs" / name
        d.mkdir(parents=True)
        write_jsonl(d / "metrics.jsonl", [{"round": t, "stage": "probe", "mean_cosine": 0.1 * t,
                                           "mean_cosine_se": 0.01, "perplexity": 90.0 + t}
                                          for t in sorted(rounds, key=str)])
        if done:
            (d / "results.json").write_text("{}")

    run("deb-eps1-s0", [0, 1, 2, 10])
    run("deb-eps1-fluent-s2", [0, 1])
    run("pypi-eps1-s1", [0, 1], done=False)  # still running
    run("eps1-rpo-s0", [0, 1])  # not in the comparison
    curves = L.probe_curves(L.collect(tmp_path / "runs"))
    assert set(curves) == {"deb"}
    assert [p["round"] for p in curves["deb"]["deb-eps1"][0]] == [0, 1, 2, 10]
    assert curves["deb"]["deb-eps1"][0][-1]["ppl"] == 100.0
    assert list(curves["deb"]["deb-eps1-fluent"]) == [2]
    png = tmp_path / "probe.png"
    assert L.probe_figure(curves, png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert not L.probe_figure({}, tmp_path / "none.png") and not (tmp_path / "none.png").exists()


def test_the_draws_table_counts_a_run_only_once_it_finished(tmp_path):
    """A running run (no results.json yet) whose draw evaluations are all written is left out
    of the draws table and so of the verdict, as it is left out of the first table (collect):
    a seed is judged with its row, never before it."""
    L = _study()

    def run(name, diffs, done):
        d = tmp_path / name
        (d / "eval").mkdir(parents=True)
        (d / "eval" / "control.json").write_text(json.dumps(_ctl(diffs[0])))
        for k, x in enumerate(diffs[1:], 1):
            (d / "eval" / f"control-d{k}.json").write_text(json.dumps(_ctl(x)))
        if done:
            (d / "results.json").write_text(json.dumps({"method": "popri"}))

    run("deb-eps1-s0", [0.001, 0.002, 0.003], done=True)
    run("deb-eps1-s2", [0.013, 0.004, 0.011], done=False)  # draws done, last stages running
    got = {(r["setting"], r["seed"]) for r in L.collect_draws(tmp_path)}
    assert got == {("deb-eps1", 0)}
    (tmp_path / "deb-eps1-s2" / "results.json").write_text(json.dumps({"method": "popri"}))
    got = {(r["setting"], r["seed"]) for r in L.collect_draws(tmp_path)}
    assert got == {("deb-eps1", 0), ("deb-eps1", 2)}


def test_the_per_setting_summary_says_it_reads_each_seed_s_first_draw():
    """learning_study.table's summary over seeds averages each row's own ``diff``, the run's
    first draw; its header says so (issue44.md's summary read +0.0086 for Debian beside the
    verdict's +0.0015 over every draw, under a header that did not say which)."""
    L = _study()
    keys = ("epsilon", "q", "selection", "cos0", "cosT", "dcos_se", "dmmd", "dmmd_se", "d2_0",
            "d2_T", "ppl0", "pplT", "hold_margin", "hold_acc", "acc", "acc_t0", "diff_se")
    rows = [{**dict.fromkeys(keys), "setting": "deb-eps1", "seed": s, "rounds": 3, "dcos": 0.1,
             "diff": d, "diff_se": 0.001, "minutes": 1.0, "draws_d": [d, -d, 0.0]}
            for s, d in ((0, 0.004), (1, 0.002))]
    out = L.table(rows)
    head = next(ln for ln in out.splitlines() if ln.startswith("| setting | seeds |"))
    assert "first draw" in head and "verdicts use every draw" in head
    assert "| deb-eps1 | 2 | 0.1000 (0.0000) | +0.0030 (" in out
