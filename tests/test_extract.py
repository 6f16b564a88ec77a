"""popri audit extract: the example choice, a memorising model scores high and a fresh one low,
instruction records use the prompt as prefix, the CLI's outputs and errors.

    python -m pytest tests/test_extract.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("rouge_score")

from conftest import write_jsonl  # noqa: E402

TEXTS = [
    "the quiet harbour lamp burned all night while seven grey ships waited for the morning tide to turn",
    "marble stairs lead down to a cellar where the old brewer kept forty barrels of dark cherry ale",
    "every spring the valley farmers count their sheep twice and write the total on the chapel door",
    "a copper kettle sang on the stove as the twins argued about the map of the northern islands",
]


def _data(tmp_path: Path) -> Path:
    rows = [{"id": f"c{i}#0", "client_id": f"c{i}", "text": t} for i, t in enumerate(TEXTS)]
    return write_jsonl(tmp_path / "train.jsonl", rows)


def test_pick_examples_one_per_client_and_seeded():
    from popri.eval.extract import pick_examples

    recs = [{"id": f"{c}#{k}", "client_id": c, "text": "x"} for c in "abcdef" for k in range(3)]
    a = pick_examples(recs, 4, seed=0)
    assert len(a) == 4 and len({r["client_id"] for r in a}) == 4
    assert a == pick_examples(recs, 4, seed=0)
    assert [r["id"] for r in pick_examples(recs, 6, seed=1)] != [r["id"] for r in pick_examples(recs, 6, seed=0)]
    assert len(pick_examples(recs, 100, seed=0)) == 6  # at most one per client


@pytest.fixture(scope="module")
def memorised(tiny_lm, tmp_path_factory):
    """The tiny LM trained until it recites TEXTS (a model that leaks by construction)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm)
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    seqs = [torch.tensor([bos + tok(t, add_special_tokens=False)["input_ids"]]) for t in TEXTS]
    model.train()
    for _ in range(60):
        for s in seqs:
            loss = model(input_ids=s, labels=s).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    out = tmp_path_factory.mktemp("memorised") / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def test_a_memorising_model_leaks_and_a_fresh_one_does_not(memorised, tiny_lm, tmp_path):
    from popri.eval.extract import run
    from popri.specs.privacy import ExtractSpec

    data = _data(tmp_path)
    spec = ExtractSpec(num_examples=4, prefix_tokens=6, suffix_tokens=8, bf16=False)
    hot, rows = run(memorised, str(data), "train", spec, seed=0, device="cpu")
    cold, rows0 = run(tiny_lm, str(data), "train", spec, seed=0, device="cpu")
    assert [r["id"] for r in rows] == [r["id"] for r in rows0]  # the same examples for both
    assert hot["examples"] == 4 and hot["rouge_l"] > 0.8 and hot["extracted"] >= 0.75
    assert cold["rouge_l"] < 0.3 and cold["rouge_l"] < hot["rouge_l"]
    r = rows[0]
    assert r["tokens"] == 8 and r["generated"] and r["truth"] in " ".join(TEXTS)


def test_instruction_records_use_the_prompt_as_prefix(tiny_lm):
    from transformers import AutoTokenizer

    from popri.data.instruct import prompt
    from popri.eval.extract import split_example
    from popri.specs.privacy import ExtractSpec

    tok = AutoTokenizer.from_pretrained(tiny_lm)
    rec = {"instruction": "Describe the Debian package foo.", "input": "a parser",
           "output": "Foo parses bar files quickly.", "text": "ignored", "client_id": "a"}
    p, y = split_example(rec, tok, ExtractSpec(suffix_tokens=4))
    assert tok.decode(p) == prompt(rec["instruction"], rec["input"])
    assert y == tok("Foo parses bar files quickly.", add_special_tokens=False)["input_ids"][:4]


def test_cli_json_and_rows(tiny_lm, tmp_path, run_popri):
    data = _data(tmp_path)
    p = run_popri(["audit", "extract", "--model", tiny_lm, "--data", data, "-n", "3",
                   "--prefix-tokens", "5", "--suffix-tokens", "4", "--no-bf16", "--json",
                   "--out", tmp_path / "rows.jsonl"], check=True)
    s = json.loads(p.stdout)
    assert s["examples"] == 3 and 0 <= s["rouge_l"] <= 1 and s["split"] == "train"
    rows = [json.loads(x) for x in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and len({r["client_id"] for r in rows}) == 3
    # too long a prefix for every record: one line, exit 2, nothing written
    p = run_popri(["audit", "extract", "--model", tiny_lm, "--data", data, "--prefix-tokens",
                   "500", "--out", tmp_path / "none.jsonl"])
    assert p.returncode == 2 and "longer than --prefix-tokens" in p.stderr
    assert not (tmp_path / "none.jsonl").exists()
    p = run_popri(["audit", "extract", "--model", tiny_lm, "--data", data, "-n", "0"])
    assert p.returncode == 2
