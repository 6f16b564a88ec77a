"""Per-text fluency under the public model and the chosen-vs-rejected comparison of a round's
preference pairs (popri/eval/fluency.py, issue 44).

    python -m pytest -q tests/test_fluency.py
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import write_jsonl
from popri.eval import fluency as F


def test_repeats_distinct_and_degenerate_by_hand():
    assert F.repeat_share("a b c a b c") == pytest.approx(1 / 4)  # (a b c) again, of 4 trigrams
    assert F.repeat_share("one two") == 0.0
    assert F.text_distinct("a b a b") == pytest.approx(2 / 3)     # (a b), (b a) of 3 bigrams
    assert F.text_distinct("alone") is None
    assert F.degenerate("") and F.degenerate("two words")
    assert F.degenerate("the the the the the the the")            # every trigram repeats
    assert not F.degenerate("the nation grows strong in peace and trade")


def test_paired_sign_counts_and_ses():
    row = lambda nll, words, d2=1.0, deg=False: {  # noqa: E731
        "nll": nll, "tokens": 5, "words": words, "distinct_2": d2, "degenerate": deg}
    ch = [row(3.0, 10), row(2.0, 12), row(5.0, 4, deg=True), row(None, 0)]
    rj = [row(2.5, 8), row(2.5, 8), row(3.0, 9), row(2.0, 5)]
    r = F.paired(ch, rj)
    assert r["pairs"] == 4 and r["scored_pairs"] == 3          # the empty text is left out
    assert r["nll_chosen_minus_rejected"] == pytest.approx((0.5 - 0.5 + 2.0) / 3)
    assert r["chosen_less_fluent"] == 2                         # positive: chosen less fluent
    assert r["nll_chosen_minus_rejected_se"] == pytest.approx(
        np.std([0.5, -0.5, 2.0], ddof=1) / math.sqrt(3))
    assert r["degenerate_chosen"] == 1 and r["degenerate_rejected"] == 0
    assert r["words_chosen_minus_rejected"] == pytest.approx((2 + 4 - 5 - 5) / 4)


def test_text_nll_matches_one_unbatched_forward_and_ignores_the_batch(tiny_lm):
    """Each text's NLL is the sum of its next-token losses from an unpadded forward of that
    text alone: padding, batch size and the order of the texts change nothing."""
    import torch

    from popri.models import llm

    texts = ["the union is strong", "a much longer text about the state of the nation and trade",
             "", "peace"]
    nll, cnt = F.text_nll(tiny_lm, texts, batch_size=3)
    m, tok = llm.load_causal_lm(tiny_lm, device="cpu")
    for i, t in enumerate(texts):
        if not t:
            assert cnt[i] == 0 and nll[i] == 0.0
            continue
        ids = tok(t, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            lp = torch.log_softmax(m(input_ids=ids).logits.float()[:, :-1], -1)
        want = float(-lp.gather(-1, ids[:, 1:].unsqueeze(-1)).sum())
        assert cnt[i] == ids.shape[1] - 1
        assert nll[i] == pytest.approx(want, rel=1e-4, abs=1e-4)
    rev, rcnt = F.text_nll(tiny_lm, texts[::-1], batch_size=1)
    assert np.allclose(rev[::-1], nll, rtol=1e-4, atol=1e-4) and (rcnt[::-1] == cnt).all()
    short, scnt = F.text_nll(tiny_lm, texts[1:2], max_tokens=4)
    assert scnt[0] == 3  # the first 4 tokens: 3 predicted


def test_probe_perplexity_is_the_token_weighted_mean_of_text_nll(tiny_lm):
    from popri.eval.probe import perplexity

    texts = ["the union is strong", "trade and peace with every nation"]
    nll, cnt = F.text_nll(tiny_lm, texts, max_tokens=256)
    r = perplexity(tiny_lm, texts, bf16=False)
    assert r["tokens"] == cnt.sum()
    assert r["perplexity"] == pytest.approx(math.exp(nll.sum() / cnt.sum()), rel=1e-6)


def test_cli_fluency_of_pairs_and_of_samples(tiny_lm, tmp_path, run_popri):
    pairs = write_jsonl(tmp_path / "prefs.jsonl", [
        {"prompt": "p", "prompt_id": k, "chosen": f"the nation grows in year {k}",
         "rejected": "the the the the the the"} for k in range(4)])
    per = tmp_path / "per.jsonl"
    p = run_popri(["eval", "fluency", pairs, "--model", tiny_lm, "--out", per, "--json"],
                  check=True)
    r = json.loads(p.stdout)
    assert r["public"] is True and r["pairs"] == 4 and r["scored_pairs"] == 4
    assert r["rejected"]["degenerate_share"] == 1.0 and r["chosen"]["degenerate_share"] == 0.0
    rows = [json.loads(x) for x in per.read_text().splitlines()]
    assert [x["pair"] for x in rows] == [0, 1, 2, 3] and rows[0]["rejected_degenerate"] is True
    d = np.mean([x["chosen_nll"] - x["rejected_nll"] for x in rows])
    assert r["nll_chosen_minus_rejected"] == pytest.approx(d)

    samples = write_jsonl(tmp_path / "s.jsonl", [{"id": f"s{k}", "text": f"word {k} and more"}
                                                 for k in range(3)])
    p = run_popri(["eval", "fluency", samples, "--model", tiny_lm], check=True)
    assert p.stdout.startswith("mean NLL ") and "texts 3" in p.stdout


def test_cli_fluency_names_the_bad_line_and_field(tiny_lm, tmp_path, run_popri):
    bad = write_jsonl(tmp_path / "s.jsonl", [{"id": "a", "text": "fine text here"},
                                             {"id": "b", "txt": "typo"}])
    p = run_popri(["eval", "fluency", bad, "--model", tiny_lm])
    assert p.returncode == 2 and "s.jsonl:2: field 'text'" in p.stderr
    assert p.stdout == ""
    p = run_popri(["eval", "fluency", bad, "--model", tiny_lm, "--adapter", tmp_path])
    assert p.returncode == 2


@pytest.mark.slow
def test_public_model_finds_shuffled_words_less_fluent():
    """On SmolLM2-135M a sentence is more likely than the same words shuffled: the sign the
    chosen-minus-rejected comparison reads (positive: the chosen text is the less fluent)."""
    good = ["The President shall from time to time give to the Congress information of the "
            "State of the Union.",
            "Our economy grew last year, and more Americans found work than in any year before."]
    rng = np.random.default_rng(0)
    bad = [" ".join(rng.permutation(t.split())) for t in good]
    nll, cnt = F.text_nll("smollm2-135m", good + bad)
    mean = nll / cnt
    assert (mean[2:] > mean[:2] + 1.0).all()


def _diagnosis():
    import importlib.util
    from pathlib import Path

    f = Path(__file__).resolve().parents[1] / "benchmarks" / "fluency_diagnosis.py"
    spec = importlib.util.spec_from_file_location("fluency_diagnosis", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_within_prompt_rank_correlation_reads_each_prompt_apart():
    """Positive when, inside each prompt, the higher-scored samples are the less fluent; a
    shift of one prompt's level (a prompt that is just harder) does not enter."""
    D = _diagnosis()
    S = [{"prompt_id": k, "id": f"{k}-{j}"} for k in range(4) for j in range(5)]
    score = np.array([j for k in range(4) for j in range(5)], dtype=float)
    nll = np.array([10 * k + j for k in range(4) for j in range(5)], dtype=float)
    r = D.within_prompt_spearman(S, score, nll)
    assert r["prompts"] == 4 and r["rho"] == pytest.approx(1.0) and r["rho_se"] == 0.0
    assert D.within_prompt_spearman(S, score, -nll)["rho"] == pytest.approx(-1.0)
    flat = D.within_prompt_spearman(S, np.zeros(20), nll)  # no ranking to read: left out
    assert flat["prompts"] == 0 and flat["rho"] is None


def test_diagnosis_tables_render_every_section():
    D = _diagnosis()
    pair = {"round": 1, "pairs": 48, "nll_chosen_minus_rejected": 0.16,
            "nll_chosen_minus_rejected_se": 0.13, "chosen_less_fluent": 26,
            "words_chosen_minus_rejected": 1.4, "degenerate_chosen": 0, "degenerate_rejected": 1,
            "samples_nll": 4.5, "samples_nll_p90": 5.3, "samples_degenerate": 0.01,
            "ppl_chosen": 97.2, "ppl_rejected": 80.1,
            "released": {"rho": 0.04, "rho_se": 0.07}, "exact": {"rho": 0.05, "rho_se": 0.06}}
    s = {"mean_nll": 4.5, "mean_nll_se": 0.05, "perplexity": 90.0, "nll_p10": 3.9,
         "nll_p50": 4.5, "nll_p90": 5.2, "degenerate_share": 0.0, "mean_words": 40.0,
         "mean_tokens": 50.0}
    row = {"run": "x-s0", "pairs": [pair], "run_minus_t0": 0.02, "run_minus_t0_se": 0.004,
           "shift": [{"round": 1, "base_nll": 4.5, "nll_shift": 0.1, "nll_shift_se": 0.02}],
           "final": {"method": s, "t0": s, "method_above_t0_p90": 0.1},
           "trim": {"share": 0.25, "minus_t0": 0.01, "minus_t0_se": 0.004},
           "big_n": {"n": 384, "minus_t0": 0.0, "minus_t0_se": 0.003, "acc": 0.2, "acc_t0": 0.2}}
    md = D.tables([row])
    assert "| x-s0 | 1 | 4.500 / 5.300 (0.01) | +0.160 +- 0.130 | 26 of 48 | 97 / 80 |" in md
    assert "+0.100 +- 0.020" in md and "(N = 384;" in md and "(0.25)" in md
    assert "| x-s0 | T = 0 | 4.500 +- 0.050 | 3.900 | 4.500 | 5.200 | 90 | 50.0 | 40.0 |" in md
