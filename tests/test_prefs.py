"""popri prefs build: ranking, rank l, ties, id matching, recovery rate, CLI.

    python -m pytest -q tests/test_prefs.py
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from popri.core.errors import InputError
from popri.core.io import save_scores
from popri.methods.popri.prefs import build_pairs, top_samples
from popri.specs.training import PrefsSpec


def samples(K=2, J=6, prompt="P{k}"):
    return [{"id": f"s{k}-{j}", "round": 0, "prompt_id": f"p{k}", "sample_idx": j,
             "prompt": prompt.format(k=k), "text": f"text {k}-{j}", "model": "m"}
            for k in range(K) for j in range(J)]


def test_chosen_rank1_rejected_rank_l():
    S = samples(K=2, J=6)
    # prompt 0 scores by sample_idx: 0.1 0.9 0.5 0.7 0.3 0.6 -> order 1,3,5,2,4,0
    # prompt 1: 0.2 0.1 0.8 0.4 0.6 0.0                   -> order 2,4,3,0,1,5
    sc = np.array([.1, .9, .5, .7, .3, .6, .2, .1, .8, .4, .6, .0])
    pairs, rep = build_pairs(S, sc, None, PrefsSpec(rejected_rank=5))
    assert build_pairs(S, sc, None) == (pairs, rep)  # PrefsSpec's default: 5 (POPri B.1)
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("text 0-1", "text 0-4"),
                                                             ("text 1-2", "text 1-1")]
    assert pairs[0]["chosen_score"] == pytest.approx(.9) and pairs[0]["rejected_score"] == pytest.approx(.3)
    assert pairs[0]["prompt"] == "P0" and pairs[1]["prompt_id"] == "p1"
    assert rep["pairs"] == 2 and rep["skipped_prompts"] == 0
    assert rep["mean_score_gap"] == pytest.approx(((.9 - .3) + (.8 - .1)) / 2)
    pairs2, _ = build_pairs(S, sc, None, rejected_rank=2)
    assert [p["rejected"] for p in pairs2] == ["text 0-3", "text 1-4"]
    pairs6, _ = build_pairs(S, sc, None, rejected_rank=6)
    assert [p["rejected"] for p in pairs6] == ["text 0-0", "text 1-5"]


def test_ties_broken_by_sample_idx_not_input_order():
    S = samples(K=1, J=5)
    S = [S[i] for i in (3, 0, 4, 2, 1)]  # shuffled input order
    sc = np.zeros(5)
    pairs, _ = build_pairs(S, sc, None, rejected_rank=4)
    assert pairs[0]["chosen"] == "text 0-0" and pairs[0]["rejected"] == "text 0-3"


def test_short_prompts_are_skipped_and_counted():
    S = samples(K=2, J=5)[:-2]  # prompt 1 keeps only 3 samples
    pairs, rep = build_pairs(S, np.arange(len(S), dtype=float), None, rejected_rank=4)
    assert len(pairs) == 1 and rep["skipped_prompts"] == 1
    assert rep["skipped"] == [{"prompt_id": "p1", "samples": 3}]


def test_a_prompt_whose_pair_would_hold_an_empty_text_is_skipped_and_dpo_reads_the_rest(
        tmp_path):
    """A generation kept degenerate can be empty (the tiny random model wrote one in 18,000 at
    benchmarks/bench_scale.py's full scale); `popri dpo` refuses an empty completion, so such a
    pair was a run that stopped at its own output: the prompt is skipped and counted instead."""
    from popri.core.io import write_jsonl
    from popri.methods.popri.dpo import load_pairs

    S = samples(K=3, J=5)
    S[4]["text"] = ""       # prompt 0's rejected (rank 5 of scores 0..4: sample 0)
    S[5 + 4]["text"] = " "  # prompt 1's chosen (its highest score: sample 4)
    sc = np.tile(np.arange(5, dtype=float)[::-1], 3)
    sc[5:10] = np.arange(5, dtype=float)
    pairs, rep = build_pairs(S, sc, None, rejected_rank=5)
    assert [p["prompt_id"] for p in pairs] == ["p2"] and rep["skipped_prompts"] == 2
    assert {s["prompt_id"] for s in rep["skipped"]} == {"p0", "p1"}
    assert all("empty" in s["reason"] for s in rep["skipped"])
    write_jsonl(pairs, tmp_path / "pairs.jsonl")
    assert load_pairs(tmp_path / "pairs.jsonl") == [
        {k: pairs[0][k] for k in ("prompt", "chosen", "rejected")}]


def test_recovery_rate_against_hand_count():
    S = samples(K=4, J=5)
    noisy = np.tile([5., 4., 3., 2., 1.], 4)  # chosen idx 0, rejected (l=5) idx 4 everywhere
    true = noisy.copy()
    true[5 + 0], true[5 + 4] = 0.0, 9.0        # prompt 1: order flipped
    true[15 + 0] = true[15 + 4]                # prompt 3: a tie is not "recovered" (strict >)
    pairs, rep = build_pairs(S, noisy, None, rejected_rank=5, true_scores=true)
    assert rep["recovered"] == 2 and rep["recovery_rate"] == pytest.approx(0.5)


def test_ids_match_out_of_order_and_true_scores_by_their_own_ids():
    S = samples(K=1, J=5)
    ids = [s["id"] for s in S][::-1]
    sc = np.array([1., 2., 3., 4., 5.])  # reversed: sample_idx 0 has 5.0
    pairs, _ = build_pairs(S, sc, ids, rejected_rank=5, true_scores=np.arange(5.)[::-1].copy(),
                           true_ids=[s["id"] for s in S])
    p = pairs[0]
    assert (p["chosen"], p["rejected"]) == ("text 0-0", "text 0-4")
    assert p["chosen_id"] == "s0-0"


@pytest.mark.parametrize("ids,match", [
    (["s0-0", "s0-1", "s0-2", "zz"], "has no score"),
    (["s0-0", "s0-1", "s0-2", "s0-2"], "appears twice"),
    (["s0-0", "s0-1"], "2 ids but the array has 4"),
])
def test_id_mismatch_is_a_clear_input_error(ids, match):
    S = samples(K=1, J=4)
    with pytest.raises(InputError, match=match):
        build_pairs(S, np.arange(4.0), ids, rejected_rank=2)


def test_row_count_mismatch_and_bad_values():
    S = samples(K=1, J=4)
    with pytest.raises(InputError, match="3 scores but 4 samples"):
        build_pairs(S, np.arange(3.0), None, rejected_rank=2)
    with pytest.raises(InputError, match="NaN"):
        build_pairs(S, np.array([1., np.nan, 2., 3.]), None, rejected_rank=2)
    with pytest.raises(InputError, match="1-D"):
        build_pairs(S, np.zeros((2, 4)), None, rejected_rank=2)
    with pytest.raises(InputError, match="field 'rejected_rank': must be .* >= 2"):
        build_pairs(S, np.arange(4.0), None, rejected_rank=1)
    bad = samples(K=1, J=4)
    del bad[2]["sample_idx"]
    with pytest.raises(InputError, match="sample_idx"):
        build_pairs(bad, np.arange(4.0), None, rejected_rank=2)
    two = samples(K=1, J=4)
    two[3]["prompt"] = "another prompt"
    with pytest.raises(InputError, match="two different prompt texts"):
        build_pairs(two, np.arange(4.0), None, rejected_rank=2)


def test_top_samples_for_sft():
    S = samples(K=2, J=3)
    recs = top_samples(S, np.array([1., 3., 2., 0., 0., 5.]), None)
    assert [(r["prompt"], r["completion"]) for r in recs] == [("P0", "text 0-1"), ("P1", "text 1-2")]


def _write(tmp_path, S, sc, ids=True, name="scores"):
    sp = tmp_path / ("samples.jsonl" if name == "scores" else f"{name}-samples.jsonl")
    sp.write_text("".join(json.dumps(s) + "\n" for s in S), encoding="utf-8")
    npy = tmp_path / f"{name}.npy"
    save_scores(npy, sc, {"ids": [s["id"] for s in S]} if ids else {})
    return sp, npy


def test_cli_build_stdout_report_and_recovery(tmp_path, run_popri):
    S = samples(K=3, J=5)
    rng = np.random.default_rng(0)
    true = rng.normal(size=len(S))
    noisy = true + rng.normal(scale=0.5, size=len(S))
    sp, npy = _write(tmp_path, S, noisy)
    _, tnpy = _write(tmp_path, S, true, name="true")
    rep = tmp_path / "rep.json"
    p = run_popri(["prefs", "build", "--samples", sp, "--scores", npy, "--true-scores", tnpy,
                   "--rejected-rank", "4", "--report-out", rep], check=True)
    pairs = [json.loads(l) for l in p.stdout.splitlines()]
    want, want_rep = build_pairs(S, noisy, [s["id"] for s in S], rejected_rank=4, true_scores=true)
    assert pairs == want
    assert set(pairs[0]) >= {"prompt", "chosen", "rejected", "prompt_id", "chosen_score",
                             "rejected_score"}
    got = json.loads(rep.read_text())
    assert got["recovery_rate"] == pytest.approx(want_rep["recovery_rate"])
    assert "recovery rate" in p.stderr


def test_cli_pipe_out_file_and_errors(tmp_path, run_popri):
    S = samples(K=2, J=5)
    sp, npy = _write(tmp_path, S, np.arange(10.0), ids=False)  # no ids: row-aligned
    out = tmp_path / "pairs.jsonl"
    p = run_popri(["prefs", "build", "--samples", "-", "--scores", npy, "--out", out],
                  input=sp.read_text(), check=True)
    assert p.stdout == ""
    assert [json.loads(l)["chosen"] for l in out.read_text().splitlines()] == ["text 0-4", "text 1-4"]
    # scores of another sample file: one clear line, exit 2, earlier output untouched
    before = out.read_text()
    other = samples(K=2, J=5, prompt="Q{k}")
    for s in other:
        s["id"] = "x" + s["id"]
    _, bad = _write(tmp_path, other, np.arange(10.0), name="other")
    p = run_popri(["prefs", "build", "--samples", sp, "--scores", bad, "--out", out])
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith("popri: error: ")
    assert "samples.jsonl:1: field 'id'" in p.stderr
    assert out.read_text() == before
    # too few samples per prompt for the rank
    p = run_popri(["prefs", "build", "--samples", sp, "--scores", npy, "--rejected-rank", "6"])
    assert p.returncode == 2 and "nothing to pair" in p.stderr


def test_two_inputs_from_stdin_are_refused_by_name(tmp_path, run_popri):
    """Hostile case B07 (issue 66): `prefs build --samples - --scores -` said "sample id ... has
    no score in -"; standard input is read once: refused by name, nothing written."""
    out = tmp_path / "pairs.jsonl"
    p = run_popri(["prefs", "build", "--samples", "-", "--scores", "-", "--out", out],
                  input='{"id": "r1-p0-s0", "prompt_id": 0, "text": "x"}\n')
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "only one input can be '-'" in p.stderr and "--samples and --scores are both" in p.stderr
    assert not out.exists()
