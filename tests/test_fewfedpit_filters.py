"""FewFedPIT's filters (format, Rouge-L novelty and copy), IFS against a hand-computed ratio,
beta mixing and the weighted server average.

    python -m pytest tests/test_fewfedpit_filters.py -q
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

pytest.importorskip("rouge_score")

from popri.methods.fewfedpit import filters as F  # noqa: E402
from popri.methods.fewfedpit.weights import WeightedSum, mix  # noqa: E402


def test_rouge_l_matches_lcs_by_hand():
    # LCS of "the cat sat on the mat" / "the cat lay on a mat" = the cat on mat (4 of 6 each)
    assert F.rouge_l("the cat lay on a mat", "the cat sat on the mat") == pytest.approx(4 / 6)
    assert F.rouge_l("Same words here", "same words HERE!") == 1.0
    assert F.rouge_l("alpha beta", "gamma delta") == 0.0
    assert F.max_rouge_l("a b c d", ["x y", "a b x d", "a b c d"]) == 1.0
    assert F.max_rouge_l("a b", []) == 0.0


@pytest.mark.parametrize("text,ok", [
    ("Describe the package foo in two sentences.", True),
    ("As an AI language model, I cannot do that.", False),
    ("as a user, write a poem", False),
    ("Sorry, I cannot help with this request.", False),
    ("\"Sorry, no.\" is not allowed either", False),
    ("Too short", False),
    ("- bullet starts are not instructions here", False),
    ("Assemble the parts in order.", True),  # "As" inside a word is fine
])
def test_format_filter(text, ok):
    assert F.format_ok(text) is ok


def test_novelty_filter_against_local_and_kept():
    local = ["Describe the Debian package alpha-tool.", "Summarise the release notes of beta."]
    cands = ["Describe the Debian package alpha-tools.",      # near copy of a local one
             "Sorry, I cannot write this.",                    # format
             "Write a haiku about autumn leaves falling.",     # kept
             "Write a haiku about autumn leaves falling down.",  # near copy of a kept one
             "Explain how a compiler turns code into machine instructions.",  # kept
             "List three uses of a hammer in carpentry."]      # not looked at: 2 kept already
    rows, counts = F.novel_instructions(cands, local, keep=2)
    assert [r["kept"] for r in rows] == [False, False, True, False, True]
    assert [r["reason"] for r in rows] == ["rouge_local", "format", None, "rouge_kept", None]
    assert counts == {"format": 1, "rouge_local": 1, "rouge_kept": 1, "kept": 2}
    assert rows[0]["rouge_l"] > 0.7 and rows[2]["rouge_l"] <= 0.7


def test_copy_filter():
    local = [{"instruction": "Describe the package foo.", "input": "a fast parser",
              "output": "Foo parses the bar format quickly and with little memory."}]
    samples = [{"instruction": "Describe the package foo.", "input": "a fast parser",
                "output": "Foo parses the bar format quickly and with little memory use."},
               {"instruction": "Write a limerick about a cat.", "input": "",
                "output": "There once was a cat from the coast."}]
    kept, dropped = F.copy_filter(samples, local)
    assert [s["instruction"] for s in dropped] == ["Describe the package foo."]
    assert [s["instruction"] for s in kept] == ["Write a limerick about a cat."]
    assert dropped[0]["rouge_l_local"] > 0.7 >= kept[0]["rouge_l_local"]


def test_parse_instructions_and_io():
    gen = " Write a poem about rain.\n10. Explain gravity to a child.\n11.\n12) List three fruits."
    assert F.parse_instructions(gen, 9) == ["Write a poem about rain.", "Explain gravity to a child.",
                                            "List three fruits."]
    assert F.parse_io(" none\n[Response] Rain falls.\n\nInstruction: next") == ("", "Rain falls.")
    assert F.parse_io(" 2 + 2\n[Response] 4") == ("2 + 2", "4")
    assert F.parse_io(" something without the prefix") is None
    assert F.parse_io(" x\n[Response]   ") is None


def test_prompts_and_alternating_demos():
    pool = [{"instruction": f"I{i}", "input": "in" if i % 2 else "", "output": f"O{i}"} for i in range(8)]
    demos = F.alternate_demos(pool, 4, random.Random(0))
    assert [bool(d["input"]) for d in demos] == [True, False, True, False]
    p = F.io_prompt(demos, "New task.")
    assert p.endswith("Instruction: New task.\n[Input]") and p.count("\n[Response]") == 4
    q = F.instruction_prompt(["Do a.", "Do b."])
    assert q.endswith("1. Do a.\n2. Do b.\n3.")


def test_ifs_ratio_and_selection():
    assert F.ifs(1.0, 2.0) == 0.5 and F.ifs(1.0, 0.0) == math.inf
    s = [{"id": i, "ifs": v} for i, v in enumerate([0.9, 0.2, 1.3, 0.5, 0.2])]
    assert [x["id"] for x in F.select_top(s, 3)] == [1, 3, 4]  # lowest three, order kept


def test_ifs_against_hand_computed_losses(tiny_lm):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from popri.methods.fewfedpit.ifs import response_losses

    tok = AutoTokenizer.from_pretrained(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm)
    prompt, resp = "### Instruction:\nName a colour.\n\n### Response:\n", "Blue."
    cond, uncond = response_losses(model, tok, [prompt], [resp])
    # by hand: the same response ids (+ EOS) after the prompt and after BOS alone
    y = tok(resp, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ctx = [tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id]

    def mean_nll(pre):
        ids = torch.tensor([pre + y])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        total = 0.0
        for j, t in enumerate(y):
            lp = torch.log_softmax(logits[len(pre) - 1 + j].double(), dim=-1)
            total -= float(lp[t])
        return total / len(y)

    p_ids = ctx + tok(prompt, add_special_tokens=False)["input_ids"]
    assert cond[0] == pytest.approx(mean_nll(p_ids), rel=1e-4)
    assert uncond[0] == pytest.approx(mean_nll(ctx), rel=1e-4)
    assert F.ifs(cond[0], uncond[0]) == pytest.approx(mean_nll(p_ids) / mean_nll(ctx), rel=1e-4)


def test_beta_mixing():
    wl, wg = np.array([1.0, 2.0, -4.0], np.float32), np.array([3.0, 0.0, 0.0], np.float32)
    assert np.allclose(mix(wl, wg, 0.5), [2.0, 1.0, -2.0])
    assert np.array_equal(mix(wl, wg, 1.0), wl)  # beta = 1: FedIT, the private weights
    assert np.array_equal(mix(wl, wg, 0.0), wg)  # beta = 0: synthetic-data weights only
    with pytest.raises(ValueError):
        mix(wl, wg, 1.5)
    with pytest.raises(ValueError):
        mix(wl, wg[:2], 0.5)


def test_weighted_average_is_n_k_weighted():
    acc = WeightedSum()
    acc.add(np.array([1.0, 0.0], np.float32), 1)
    acc.add(np.array([0.0, 4.0], np.float32), 3)
    assert np.allclose(acc.average(), [0.25, 3.0]) and acc.clients == 2
    with pytest.raises(ValueError):
        acc.add(np.zeros(2), 0)
    with pytest.raises(ValueError):
        WeightedSum().average()
