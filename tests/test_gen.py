"""`popri gen` / popri.models.generation: prompts, cleaning, degeneracy, sampling, backends, CLI.

    python -m pytest -q tests/test_gen.py            # fast (tiny random Llama)
    python -m pytest -q -m slow tests/test_gen.py    # real smollm2-135m
"""

import json
import math
import os
import subprocess
import sys
import types

import pytest

from conftest import REPO, write_jsonl
from popri.models import generation as g
from popri.core.errors import InputError, MissingResourceError

OMEGA = [
    "The committee met on Tuesday to discuss the budget for the coming year.",
    "I rise today to speak about the importance of rural broadband access.",
    "Our farmers deserve fair prices and a government that listens to them.",
    "The minister has not answered the question about hospital waiting lists.",
    "We must invest in clean energy to secure jobs for the next generation.",
    "Mr. Speaker, the people of my riding are worried about the cost of housing.",
    "Small businesses are the backbone of every town in this country.",
    "The bill before us today would extend protections to seasonal workers.",
]


@pytest.fixture
def omega_file(tmp_path):
    return write_jsonl(tmp_path / "omega.jsonl", [{"id": f"o{i}", "text": t} for i, t in enumerate(OMEGA)])


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch):
    """In-process generation on one thread (as run_popri's subprocesses): on a shared 2-core box
    two threads per process thrash; the caller's setting is restored afterwards."""
    import torch

    before = torch.get_num_threads()
    monkeypatch.setenv("POPRI_THREADS", "1")
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_tok(tiny_lm):
    from popri.models.llm import load_tokenizer

    return load_tokenizer(tiny_lm)


# --------------------------------------------------------------------------- prompts
def test_default_template_is_the_papers():
    p = g.fill_template(g.DEFAULT_TEMPLATE, ["AAA", "BBB", "CCC"])
    assert p == ("List of 6 diverse original text samples:\nOriginal Text Sample 1\nAAA\n"
                 "Original Text Sample 2\nBBB\nOriginal Text Sample 3\nCCC\nOriginal Text Sample 4\n")


def test_build_prompts_seeded_distinct_shots():
    omega = OMEGA + ["  The committee met on Tuesday to discuss\n the budget for the coming year. "]
    ids = [f"o{i}" for i in range(len(omega))]
    ps = g.build_prompts(omega, 60, seed=3, ids=ids)
    assert [p["prompt_id"] for p in ps] == list(range(60))
    for p in ps:
        assert len(set(p["example_texts"])) == 3 and len(set(p["examples"])) == 3
        assert all(e in ids[:len(OMEGA)] for e in p["examples"])  # the duplicate text is dropped
        assert p["prompt"] == g.fill_template(g.DEFAULT_TEMPLATE, p["example_texts"])
        assert [omega[int(e[1:])] for e in p["examples"]] == p["example_texts"]
    assert ps == g.build_prompts(omega, 60, seed=3, ids=ids)
    assert ps != g.build_prompts(omega, 60, seed=4, ids=ids)
    # every Omega text gets used over many prompts (uniform choice, not a fixed window)
    assert {e for p in ps for e in p["examples"]} == set(ids[:len(OMEGA)])
    assert g.build_prompts(omega, 2, seed=3)[0]["examples"] == [int(e[1:]) for e in ps[0]["examples"]]


def test_build_prompts_needs_enough_distinct_texts():
    with pytest.raises(InputError, match="2 distinct non-empty texts"):
        g.build_prompts(["a b", "a  b", "c d", "   "], 1, seed=0)


def test_template_placeholders():
    assert g.fill_template("{0}|{1}|{2}", ["x", "y", "z"]) == "x|y|z"  # the reference file's form
    ps = g.build_prompts(OMEGA, 1, seed=0, shots=2, template="{{A}} {sample1} / {sample2}\n")
    assert ps[0]["prompt"] == "{A} " + " / ".join(ps[0]["example_texts"]) + "\n"
    with pytest.raises(InputError, match="unknown placeholder"):
        g.check_template("{sample1} {name}", 1)
    with pytest.raises(InputError, match="uses 2 of 3 shots"):
        g.check_template("{sample1} {sample2}", 3)
    with pytest.raises(InputError, match="beyond the 2 shots"):
        g.check_template("{sample1} {sample2} {sample3}", 2)
    with pytest.raises(InputError, match="malformed template"):
        g.check_template("{sample1", 1)


# --------------------------------------------------------------------------- cleaning
def test_clean_generation_cuts_normalises_truncates(tiny_tok):
    raw = "  Taxes are\n\n too   high for\tfamilies.\nOriginal Text Sample 5\nMore text here"
    assert g.clean_generation(raw, tiny_tok, 64) == "Taxes are too high for families."
    # a marker cut short by the token limit goes too, a word merely starting like it stays
    assert g.clean_generation("We agree.\nOriginal Text Sa", tiny_tok, 64) == "We agree."
    assert g.clean_generation("An Origami lesson", tiny_tok, 64) == "An Origami lesson"
    assert g.clean_generation("\n Original Text Sample 5 x", tiny_tok, 64) == ""
    assert g.clean_generation("", tiny_tok, 64) == ""
    long = " ".join(f"word{i}" for i in range(200))
    out = g.clean_generation(long, tiny_tok, 10)
    assert long.startswith(out) and out
    n = len(tiny_tok(out, add_special_tokens=False)["input_ids"])
    assert n <= 10 and n >= 8  # cut on a token boundary, not far short of the limit
    assert g.clean_generation(long, None, 10) == long  # no tokenizer: no truncation


def test_degeneracy():
    ex = ["The committee met on Tuesday to discuss the budget for the coming year."]
    prompt = g.fill_template(g.DEFAULT_TEMPLATE, ex + OMEGA[1:3])
    d = lambda t: g.degeneracy(t, min_words=3, prompt=prompt, examples=ex)  # noqa: E731
    assert d("") == "empty" and d("   ") == "empty"
    assert d("Hello there") == "short" and d("!!! ??? ...") == "short"
    assert d("the the the cat sat") == "repetitive"
    assert d("I am sure. " * 6) == "repetitive"  # a loop: few distinct trigrams
    assert d("the committee met on tuesday to  discuss the BUDGET for the coming year.") == "copy"
    assert d("I rise today to speak about the importance of something else entirely") == "copy"
    assert d("Our schools need more teachers and smaller classes this autumn.") is None
    assert d("The committee met today.") is None  # sharing a few words is not copying


# --------------------------------------------------------------------------- sampling
def test_row_sampler_matches_softmax_and_respects_top_p():
    import torch

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5, -3.0]])
    n = 20000
    s = g.RowSampler(1.0, 1.0, range(n), "cpu")
    draws = s(None, logits.repeat(n, 1)).argmax(-1)
    freq = torch.bincount(draws, minlength=6).double() / n
    assert (freq - torch.softmax(logits[0].double(), -1)).abs().max() < 0.015
    s = g.RowSampler(0.5, 0.9, range(n), "cpu")
    out = s(None, logits.repeat(n, 1))
    assert torch.isfinite(out).sum(-1).eq(1).all()  # one-hot: greedy decoding emits the draw
    draws = out.argmax(-1)
    p = torch.softmax(logits[0].double() / 0.5, -1)  # [.83, .11, .04, ...]: nucleus 0.9 = {0, 1}
    assert set(draws.tolist()) == {0, 1}
    assert abs((draws == 0).double().mean() - p[0] / (p[0] + p[1])) < 0.015
    # the same seeds give the same draws
    again = g.RowSampler(0.5, 0.9, range(n), "cpu")(None, logits.repeat(n, 1)).argmax(-1)
    assert torch.equal(draws, again)


def test_loop_sampler_matches_softmax_respects_top_p_and_is_seeded():
    import torch

    from popri.models import decoding

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5, -3.0]])
    n = 20000
    draws = decoding.Sampler(1.0, 1.0, range(n), "cpu").draw(logits.repeat(n, 1), range(n))
    freq = torch.bincount(draws, minlength=6).double() / n
    assert (freq - torch.softmax(logits[0].double(), -1)).abs().max() < 0.015
    s = decoding.Sampler(0.5, 0.9, range(n), "cpu")
    draws = s.draw(logits.repeat(n, 1), range(n))
    p = torch.softmax(logits[0].double() / 0.5, -1)  # nucleus 0.9 = {0, 1}
    assert set(draws.tolist()) == {0, 1}
    assert abs((draws == 0).double().mean() - p[0] / (p[0] + p[1])) < 0.015
    # a row's draw depends on its own generator only: not on the other rows or their order
    again = decoding.Sampler(0.5, 0.9, range(n), "cpu")
    sub = again.draw(logits.repeat(3, 1), [7, 3, 11])
    assert sub.tolist() == [draws[7].item(), draws[3].item(), draws[11].item()]
    assert decoding.Sampler(0.0, 1.0, [], "cpu").draw(logits, [0]).tolist() == [0]  # greedy


def test_stop_candidates_end_the_marker(tiny_lm):
    from popri.models import decoding
    from popri.models.llm import load_tokenizer

    tok = load_tokenizer(tiny_lm)
    ids = decoding.stop_candidates(tok, g.MARKER)
    for text in ("x\nOriginal Text Sample", "x Original Text Sample", "Original Text Sample"):
        assert tok(text, add_special_tokens=False)["input_ids"][-1] in ids


def test_loop_and_generate_paths_write_the_same_kind_of_text(tiny_lm):
    """The decoding loop and model.generate on one fp32 model: same schema, sampled (not
    greedy), each seeded; the loop's shared-prompt prefill equals a prefill per row."""
    from popri.models.llm import load_causal_lm

    m, tok = load_causal_lm(tiny_lm)
    ps = g.build_prompts(OMEGA, 2, seed=1)
    kw = dict(model=tiny_lm, samples_per_prompt=3, seed=2, max_new_tokens=10, max_tokens=8,
              min_words=0, max_retries=0, bf16=False, model_obj=m, tokenizer_obj=tok)
    loop, st = g.generate(ps, batch_size=6, **kw)          # 2 prompts share 6 rows
    solo, _ = g.generate(ps, batch_size=1, **kw)           # one row per prefill
    assert [r["text"] for r in loop] == [r["text"] for r in solo]
    assert len({r["text"] for r in loop}) > 1 and st["generated_tokens"] > 0
    old, st_old = g.generate(ps, batch_size=6, backend="transformers-generate", **kw)
    assert [r["id"] for r in old] == [r["id"] for r in loop]
    assert st_old["backend"] == "transformers-generate" and len({r["text"] for r in old}) > 1


def test_derive_seed_is_stable():
    assert g.derive_seed(0, 0, 1, 2) == g.derive_seed(0, 0, 1, 2) != g.derive_seed(0, 0, 2, 1)
    assert 0 <= g.derive_seed(2**40, 3) < 2**31


# --------------------------------------------------------------------------- regeneration
class FakeEngine:
    """Stands in for a backend: junk for the rows listed in `bad` on the first attempts."""

    name = "fake"

    def __init__(self, junk_attempts, always_bad=()):
        self.tok = None
        self.calls = []
        self.junk_attempts, self.always_bad = junk_attempts, set(always_bad)

    def run(self, prompts, keys, attempt, tick):
        self.calls.append((attempt, list(keys)))
        out = []
        for pid, j in keys:
            if (pid, j) in self.always_bad or (attempt < self.junk_attempts and j == 0):
                out.append(("spam spam spam spam\nOriginal Text Sample 5", 7))
            else:
                out.append((f"Fresh words number {pid} {j} attempt {attempt}.\nOriginal Text", 9))
        tick(len(keys), sum(n for _, n in out))
        return out


def test_regeneration_counting(monkeypatch):
    ps = g.build_prompts(OMEGA, 3, seed=0)
    eng = FakeEngine(junk_attempts=1, always_bad=[(2, 1)])
    monkeypatch.setattr(g.backends, "TransformersBackend", lambda *a, **k: eng)
    recs, st = g.generate(ps, model="fake", samples_per_prompt=2, round_no=4, max_retries=2)
    assert [r["id"] for r in recs] == [f"r4-p{p}-s{s}" for p in range(3) for s in range(2)]
    assert eng.calls[0][1] == [(p, s) for p in range(3) for s in range(2)]
    assert eng.calls[1] == (1, [(0, 0), (1, 0), (2, 0), (2, 1)])
    assert eng.calls[2] == (2, [(2, 1)])
    assert len(eng.calls) == 3
    assert st["generated"] == 6 + 4 + 1 and st["regenerated"] == 5
    assert st["degenerate_first_pass"] == 4 and st["degenerate_first_pass_reasons"] == {"repetitive": 4}
    assert st["kept_degenerate"] == 1 and st["kept_degenerate_reasons"] == {"repetitive": 1}
    assert st["generated_tokens"] == (4 * 7 + 2 * 9) + (3 * 9 + 7) + 7
    by = {r["id"]: r for r in recs}
    assert by["r4-p0-s0"]["text"] == "Fresh words number 0 0 attempt 1." and "degenerate" not in by["r4-p0-s0"]
    assert by["r4-p2-s1"]["text"] == "spam spam spam spam" and by["r4-p2-s1"]["degenerate"] is True
    assert sum("degenerate" in r for r in recs) == 1
    # no retries: every junk sample is kept and flagged, J per prompt unchanged
    eng2 = FakeEngine(junk_attempts=5)
    monkeypatch.setattr(g.backends, "TransformersBackend", lambda *a, **k: eng2)
    recs, st = g.generate(ps, model="fake", samples_per_prompt=2, max_retries=0, num_samples=5)
    assert len(recs) == 5 and st["regenerated"] == 0 and st["kept_degenerate"] == 3


# --------------------------------------------------------------------------- transformers
def test_generate_tiny_lm_schema_determinism_batch_independence(tiny_lm):
    from popri.models.llm import load_causal_lm

    ps = g.build_prompts(OMEGA, 3, seed=1)
    kw = dict(model=tiny_lm, samples_per_prompt=2, round_no=2, seed=5, max_new_tokens=12,
              max_tokens=8, min_words=0, max_retries=0)
    recs, st = g.generate(ps, batch_size=4, bf16=False, **kw)
    assert len(recs) == 6 and st["samples"] == 6 and st["generated_tokens"] > 0
    assert st["tokens_per_s"] > 0
    for r, (p, s) in zip(recs, [(p, s) for p in range(3) for s in range(2)]):
        assert list(r) == ["id", "round", "prompt_id", "sample_idx", "prompt", "text", "model"]
        assert (r["id"], r["round"], r["prompt_id"], r["sample_idx"]) == (f"r2-p{p}-s{s}", 2, p, s)
        assert r["prompt"] == ps[p]["prompt"] and r["model"] == tiny_lm and r["text"]
    assert len({r["text"] for r in recs}) == 6  # samples of one prompt differ
    # fp32: a row's sample does not depend on the batch it lands in; a loaded model is reused
    m, tok = load_causal_lm(tiny_lm)
    again, _ = g.generate(ps, batch_size=5, bf16=False, model_obj=m, tokenizer_obj=tok, **kw)
    assert again == recs
    other, _ = g.generate(ps, batch_size=4, bf16=False, model_obj=m, tokenizer_obj=tok,
                          **{**kw, "seed": 6})
    assert [r["text"] for r in other] != [r["text"] for r in recs]
    b1, _ = g.generate(ps, batch_size=4, bf16=True, model_obj=m, tokenizer_obj=tok, **kw)
    b2, _ = g.generate(ps, batch_size=4, bf16=True, model_obj=m, tokenizer_obj=tok, **kw)
    assert b1 == b2 and tok.padding_side == "right"  # restored


def test_generate_with_lora_adapter(tiny_lm, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_lm)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"],
                                         init_lora_weights=False))
    pm.save_pretrained(tmp_path / "ad")
    ps = g.build_prompts(OMEGA, 2, seed=0)
    kw = dict(model=tiny_lm, samples_per_prompt=2, max_new_tokens=10, min_words=0, max_retries=0,
              bf16=False)
    base_recs, _ = g.generate(ps, **kw)
    ad_recs, _ = g.generate(ps, adapter=str(tmp_path / "ad"), **kw)
    assert all(r["adapter"] == str(tmp_path / "ad") for r in ad_recs)
    assert [r["text"] for r in ad_recs] != [r["text"] for r in base_recs]


# --------------------------------------------------------------------------- vllm
def fake_vllm(monkeypatch, outputs):
    log = {"llm": [], "generate": [], "lora": []}

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class LoRARequest:
        def __init__(self, name, int_id, path):
            self.args = (name, int_id, path)
            log["lora"].append(self)

    class Out:
        def __init__(self, text, n):
            self.outputs = [types.SimpleNamespace(text=text, token_ids=list(range(n)))]

    class LLM:
        def __init__(self, **kw):
            log["llm"].append(kw)

        def generate(self, prompts, sampling_params=None, lora_request=None, use_tqdm=True):
            log["generate"].append((list(prompts), sampling_params, lora_request))
            return [Out(*outputs(i, p)) for i, p in enumerate(prompts)]

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, SamplingParams
    lora = types.ModuleType("vllm.lora")
    req = types.ModuleType("vllm.lora.request")
    req.LoRARequest = LoRARequest
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", lora)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", req)
    return log


def test_vllm_missing_is_a_clear_error(monkeypatch, tiny_lm):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(MissingResourceError, match="pip install 'popri\\[gpu\\]'"):
        g.generate(g.build_prompts(OMEGA, 1, seed=0), model=tiny_lm, samples_per_prompt=1,
                   backend="vllm")


def test_vllm_request_construction_and_parsing(monkeypatch, tiny_lm, tmp_path):
    (tmp_path / "ad").mkdir()
    (tmp_path / "ad" / "adapter_config.json").write_text(json.dumps({"r": 4}))
    texts = {0: " Budgets\n are   tight this year.\nOriginal Text Sample 5\nxx",
             1: "zz zz zz zz", 2: "Fine words about housing.", 3: "Rail links matter to towns."}
    log = fake_vllm(monkeypatch, lambda i, p: (texts[i] if len(log["generate"]) == 1
                                                else "A repaired sample text.", 11))
    ps = g.build_prompts(OMEGA, 2, seed=0)
    recs, st = g.generate(ps, model=tiny_lm, adapter=str(tmp_path / "ad"), samples_per_prompt=2,
                          backend="vllm", round_no=1, seed=7, temperature=0.7, top_p=0.9,
                          max_new_tokens=85, max_retries=1, max_model_len=512)
    (kw,) = log["llm"]
    assert kw["model"] == tiny_lm and kw["seed"] == 7 and kw["dtype"] == "bfloat16"
    assert kw["enable_lora"] is True and kw["max_lora_rank"] == 8 and kw["max_model_len"] == 512
    prompts, sps, lora = log["generate"][0]
    assert prompts == [ps[0]["prompt"]] * 2 + [ps[1]["prompt"]] * 2
    assert lora.args == ("popri-adapter", 1, str((tmp_path / "ad").resolve()))
    for sp, key in zip(sps, [(0, 0), (0, 1), (1, 0), (1, 1)]):
        assert sp.kw == {"n": 1, "temperature": 0.7, "top_p": 0.9, "max_tokens": 85,
                         "stop": ["Original Text Sample"], "seed": g.derive_seed(7, 0, *key)}
    # the repetitive row was regenerated with a fresh seed, same LoRA
    prompts2, sps2, lora2 = log["generate"][1]
    assert prompts2 == [ps[0]["prompt"]] and sps2[0].kw["seed"] == g.derive_seed(7, 1, 0, 1)
    assert lora2 is lora
    assert [r["text"] for r in recs] == ["Budgets are tight this year.", "A repaired sample text.",
                                         "Fine words about housing.", "Rail links matter to towns."]
    assert recs[0]["id"] == "r1-p0-s0" and st["generated_tokens"] == 5 * 11
    assert st["backend"] == "vllm" and st["regenerated"] == 1 and st["kept_degenerate"] == 0


def test_vllm_merge_mode_serves_a_merged_checkpoint(monkeypatch, tiny_lm, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    pm = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_lm),
                        LoraConfig(r=4, target_modules=["q_proj"]))
    pm.save_pretrained(tmp_path / "ad")
    log = fake_vllm(monkeypatch, lambda i, p: ("Some decent words here.", 5))
    recs, _ = g.generate(g.build_prompts(OMEGA, 1, seed=0), model=tiny_lm, samples_per_prompt=1,
                         backend="vllm", adapter=str(tmp_path / "ad"), adapter_mode="merge",
                         bf16=False)
    (kw,) = log["llm"]
    assert "enable_lora" not in kw and kw["dtype"] == "auto" and log["generate"][0][2] is None
    from popri.models.llm import load_tokenizer

    n = len(load_tokenizer(tiny_lm)(g.build_prompts(OMEGA, 1, seed=0)[0]["prompt"])["input_ids"])
    assert kw["max_model_len"] == 64 * math.ceil((n + 85) / 64)  # what the prompts need
    merged = kw["model"]
    assert os.path.isfile(os.path.join(merged, "config.json")) and merged != tiny_lm
    assert not os.path.exists(os.path.join(merged, "adapter_config.json"))
    assert recs[0]["text"] == "Some decent words here."


# --------------------------------------------------------------------------- CLI
def test_cli_stdout_then_out_file_num_samples_same_bytes(omega_file, tiny_lm, tmp_path, run_popri):
    args = ["gen", omega_file, "-J", "2", "--model", tiny_lm, "--round", "1", "--seed", "9",
            "--max-new-tokens", "12", "--no-bf16"]
    p = run_popri([*args, "-K", "3", "--stats-out", tmp_path / "st.json",
                   "--prompts-out", tmp_path / "pr.jsonl"], check=True)
    rows = [json.loads(l) for l in p.stdout.splitlines()]
    assert len(rows) == 6
    for r in rows:
        assert {"id", "round", "prompt_id", "sample_idx", "prompt", "text", "model"} <= set(r)
        assert r["id"] == f"r1-p{r['prompt_id']}-s{r['sample_idx']}" and r["model"] == tiny_lm
    st = json.loads((tmp_path / "st.json").read_text())
    assert st["samples"] == 6 and st["generated"] == 6 + st["regenerated"]
    assert st["omega"]["texts"] == len(OMEGA) and st["tokens_per_s"] > 0
    prs = [json.loads(l) for l in (tmp_path / "pr.jsonl").read_text().splitlines()]
    assert [x["prompt_id"] for x in prs] == [0, 1, 2]
    assert all(len(x["examples"]) == 3 and x["examples"][0].startswith("o") for x in prs)
    assert prs[1]["prompt"] == rows[2]["prompt"]
    assert "gen: 6 samples from 3 prompts x 2" in p.stderr and "still degenerate" in p.stderr
    # same seed again, into a file, N=5 -> K=ceil(5/2)=3: byte-identical to the first 5 lines
    q = run_popri([*args, "--num-samples", "5", "--out", tmp_path / "o" / "b.jsonl"], check=True)
    assert q.stdout == "" and "gen: 5 samples from 3 prompts" in q.stderr
    want = "".join(l + "\n" for l in p.stdout.splitlines()[:5]).encode()
    assert (tmp_path / "o" / "b.jsonl").read_bytes() == want
    # no temp file left behind; the set and its privacy provenance (issue 66)
    assert sorted(os.listdir(tmp_path / "o")) == ["b.jsonl", "b.jsonl.provenance.json"]


def test_cli_bad_input_one_line_nothing_written(omega_file, tmp_path, run_popri):
    out = tmp_path / "keep.jsonl"
    out.write_text("precious\n")
    tmpl = tmp_path / "t.txt"
    tmpl.write_text("{sample1} {oops}\n")
    cases = [(["--template", tmpl, "-K", "2"], f"{tmpl}: field 'template': unknown placeholder"),
             ([], "exactly one of --prompts K and --num-samples N"),
             (["-K", "2", "--backend", "tgi"], "field '--backend': must be one of transformers, transformers-generate, vllm, openai"),
             (["-K", "2", "--out", omega_file], "output would overwrite input")]
    for extra, msg in cases:
        p = run_popri(["gen", omega_file, "--out", out, *extra])
        assert p.returncode == 2 and msg in p.stderr and p.stderr.count("\n") == 1, p.stderr
        assert out.read_text() == "precious\n"
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "text": "x y"}, {"id": "b"}])
    p = run_popri(["gen", bad, "-K", "1", "--out", out])
    assert p.returncode == 2 and f"{bad}:2: field 'text'" in p.stderr
    few = write_jsonl(tmp_path / "few.jsonl", [{"text": "x y"}, {"text": "z w"}])
    p = run_popri(["gen", few, "-K", "1", "--out", out])
    assert p.returncode == 2 and f"{few}: field 'text': the initial population has 2" in p.stderr
    assert out.read_text() == "precious\n"


def test_pipe_gen_into_score(omega_file, tiny_lm, tiny_st_model, tmp_path):
    private = write_jsonl(tmp_path / "priv.jsonl",
                          [{"id": f"x{i}", "client_id": f"c{i % 3}", "text": t}
                           for i, t in enumerate(OMEGA)])
    env = {**os.environ, "POPRI_THREADS": "1"}
    popri = f"{sys.executable} -m popri.cli.app"
    cmd = (f"{popri} gen {omega_file} -K 2 -J 3 --model {tiny_lm} --max-new-tokens 12 | "
           f"{popri} score --mode cosine --private {private} --synthetic - --noise-multiplier 0 "
           f"--model {tiny_st_model} --seed 0 --out {tmp_path / 'S.npy'}")
    p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=900)
    assert p.returncode == 0, p.stderr
    import numpy as np

    s = np.load(tmp_path / "S.npy")
    side = json.loads((tmp_path / "S.json").read_text())
    assert s.shape == (6,) and np.isfinite(s).all()
    assert side["ids"] == [f"r0-p{i}-s{j}" for i in range(2) for j in range(3)]


# --------------------------------------------------------------------------- real model
@pytest.mark.slow
def test_real_smollm2_writes_text(tmp_path):
    ps = g.build_prompts(OMEGA, 2, seed=0)
    recs, st = g.generate(ps, model="smollm2-135m", samples_per_prompt=2, seed=0, batch_size=4)
    assert len(recs) == 4 and st["tokens_per_s"] > 0
    ok = [r for r in recs if "degenerate" not in r]
    assert len(ok) >= 2
    for r in ok:
        assert len(r["text"].split()) >= 3 and "Original Text Sample" not in r["text"]
        assert not math.isnan(st["tokens_per_s"])


def test_cli_decoder_slots_on_cpu_writes_j_samples_per_prompt_reproducibly(tmp_path, omega_file,
                                                                           tiny_lm, run_popri):
    """`popri gen --decoder slots` (issue 38: the CUDA default, on CPU without the graph): the
    same K x J samples as every decoder writes, and byte-identical on a rerun."""
    outs = []
    for k in range(2):
        out = tmp_path / f"s{k}.jsonl"
        run_popri(["gen", omega_file, "-K", "3", "-J", "2", "--model", tiny_lm, "--no-bf16",
                   "--max-new-tokens", "8", "--min-words", "1", "--decoder", "slots",
                   "--batch-size", "4", "--seed", "5", "--out", out], check=True)
        outs.append(out.read_bytes())
    rows = [json.loads(line) for line in outs[0].decode().splitlines()]
    assert len(rows) == 6 and outs[0] == outs[1]
    p = run_popri(["gen", omega_file, "-K", "1", "-J", "1", "--model", tiny_lm, "--backend",
                   "transformers-generate", "--decoder", "slots", "--out", tmp_path / "x.jsonl"])
    assert p.returncode == 2 and "--decoder" in p.stderr and not (tmp_path / "x.jsonl").exists()
