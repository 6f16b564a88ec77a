"""The CUDA decoding path (popri.models.slots, issue 38), exercised on CPU where it can be.

    python -m pytest -q tests/test_gpu_paths.py          # CPU: eager and compiled slot engine
    python -m pytest -q tests/test_gpu_paths.py -m cuda  # (on a GPU box, also the CUDA graphs)

On CPU: the slot engine (static cache, refill, the counter-based sampler, the folded
grouped-query attention) gives exactly the samples of popri's loop with the same sampler (fp32),
whatever the batch size and however often it refills; torch.compile of its step runs; a model
the engine does not fit falls back to the loop.  On CUDA (skipped here): the captured graphs
give the eager engine's samples, and the engine's statistics match the loop's.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from popri.models import generation as g
from popri.models import slots

OMEGA = [
    "The committee met on Tuesday to discuss the budget for the coming year.",
    "I rise today to speak about the importance of rural broadband access.",
    "Our farmers deserve fair prices and a government that listens to them.",
    "The minister has not answered the question about hospital waiting lists.",
    "We must invest in clean energy to secure jobs for the next generation.",
    "Mr. Speaker, the people of my riding are worried about the cost of housing.",
]
cuda = pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs CUDA")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


@pytest.fixture(scope="module")
def eos_lm(tiny_lm):
    """The tiny Llama with a large end-of-sequence row (its logit is then often the largest):
    rows end after 1-20 tokens, so slots free up at different steps and the engine refills."""
    import torch

    from popri.models.llm import load_causal_lm

    m, tok = load_causal_lm(tiny_lm)
    w = m.get_output_embeddings().weight  # the EOS row is the padding row: zero
    with torch.no_grad():
        w[tok.eos_token_id] = torch.randn(w.shape[1], generator=torch.Generator().manual_seed(1)) * 0.8
    return m, tok


def run(model_tok, tiny_lm, decode, batch_size, **over):
    m, tok = model_tok
    kw = dict(model=tiny_lm, samples_per_prompt=4, seed=3, max_new_tokens=20, max_tokens=64,
              min_words=0, max_retries=0, bf16=False, model_obj=m, tokenizer_obj=tok)
    kw.update(over)
    return g.generate(g.build_prompts(OMEGA, 5, seed=2), batch_size=batch_size, decode=decode,
                      **kw)


def test_slot_attention_equals_expanded_kv_attention():
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    b, h, hkv, d, S = 3, 6, 2, 8, 11
    k, v = torch.randn(b, hkv, S, d, generator=gen), torch.randn(b, hkv, S, d, generator=gen)
    mask = torch.rand(b, 1, 1, S, generator=gen) > 0.3
    mask[..., 0] = True
    ke, ve = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1)  # repeat_kv
    q1 = torch.randn(b, h, 1, d, generator=gen)
    got, _ = slots.slot_attention(None, q1, k, v, mask, scaling=0.3)
    want = F.scaled_dot_product_attention(q1, ke, ve, attn_mask=mask, scale=0.3).transpose(1, 2)
    assert got.shape == (b, 1, h, d) and torch.allclose(got, want, atol=1e-6)
    q = torch.randn(b, h, S, d, generator=gen)
    causal = torch.ones(S, S, dtype=torch.bool).tril()[None, None] & mask
    causal |= torch.eye(S, dtype=torch.bool)
    got, _ = slots.slot_attention(None, q, k, v, causal, scaling=0.3)
    want = F.scaled_dot_product_attention(q, ke, ve, attn_mask=causal, scale=0.3).transpose(1, 2)
    assert torch.allclose(got, want, atol=1e-6)
    with pytest.raises(NotImplementedError):
        slots.slot_attention(None, q1, k, v, mask, softcap=30.0)


def same_rows(a, b) -> int:
    assert [r["id"] for r in a] == [r["id"] for r in b]
    return sum(x["text"] == y["text"] for x, y in zip(a, b))


def test_slot_engine_equals_the_loop_at_every_batch_size_and_refills(eos_lm, tiny_lm,
                                                                      monkeypatch):
    """fp32: the slot engine draws the loop's samples (counter sampler) row for row, whatever
    the batch, up to the rare near-tie that fp32 rounding of another batch shape flips (the
    loop itself: docs/serving.md); with fewer slots than rows it refills freed slots from the
    queue.  A rerun is byte-identical."""
    ref, st = run(eos_lm, tiny_lm, "decoder=loop,sampler=counter", 24)
    assert st["generated_tokens"] < 20 * 20  # rows end early: slots free up at different steps
    prefills = []
    orig = slots.SlotRunner.prefill
    monkeypatch.setattr(slots.SlotRunner, "prefill",
                        lambda self, ids, *a, **k: prefills.append(len(a[0])) or orig(self, ids, *a, **k))
    for bs, refill in ((24, 0.125), (5, 0.125), (3, 1.0), (7, 0.5)):
        prefills.clear()
        out, st2 = run(eos_lm, tiny_lm, f"decoder=slots,refill={refill}", bs)
        assert same_rows(out, ref) >= 18, bs
        assert abs(st2["generated_tokens"] - st["generated_tokens"]) <= 0.15 * st["generated_tokens"]
        if bs < 20:
            assert len(prefills) > 2 and max(prefills) <= bs  # refilled as slots freed
        again, _ = run(eos_lm, tiny_lm, f"decoder=slots,refill={refill}", bs)
        assert again == out
    other, _ = run(eos_lm, tiny_lm, "slots", 5, seed=4)  # another seed: other samples
    assert same_rows(other, ref) < 10


def test_slot_engine_top_p_temperature_and_greedy(eos_lm, tiny_lm):
    for over in ({"temperature": 0.7, "top_p": 0.8}, {"temperature": 0.0}):
        ref, _ = run(eos_lm, tiny_lm, "decoder=loop,sampler=counter", 24, **over)
        out, _ = run(eos_lm, tiny_lm, "slots", 6, **over)
        assert same_rows(out, ref) >= 18, over


def test_slot_engine_shares_one_runner_across_attempts_and_runs(eos_lm, tiny_lm):
    from popri.models.backends import make_engine
    from popri.specs.generation import GenSpec

    m, tok = eos_lm
    spec = GenSpec(model=tiny_lm, batch_size=4, max_new_tokens=12, bf16=False)
    eng = make_engine(spec, seed=1, model_obj=m, tokenizer_obj=tok, decode="slots")
    ps = [p["prompt"] for p in g.build_prompts(OMEGA, 3, seed=0)]
    keys = [(i, j) for i in range(3) for j in range(2)]
    ticks = []
    a = eng.run([p for p in ps for _ in range(2)], keys, 0, lambda n, t: ticks.append((n, t)))
    r1 = eng.runner
    b = eng.run([p for p in ps for _ in range(2)], keys, 0, lambda n, t: None)
    assert a == b and eng.runner is r1  # same seeds, same samples; the runner is reused
    assert sum(n for n, _ in ticks) == 6 and sum(t for _, t in ticks) == sum(n for _, n in a)
    c = eng.run([p for p in ps for _ in range(2)], keys, 1, lambda n, t: None)
    assert c != a  # another attempt: other seeds


def test_a_model_the_engine_does_not_fit_falls_back_to_the_loop(eos_lm, tiny_lm, monkeypatch,
                                                                capsys):
    monkeypatch.setattr(slots.SlotRunner, "check", lambda self, *a, **k: "logits differ")
    ref, _ = run(eos_lm, tiny_lm, "decoder=loop,sampler=counter", 24)
    out, _ = run(eos_lm, tiny_lm, "slots", 5)
    assert same_rows(out, ref) >= 18
    assert "the slot engine does not fit" in capsys.readouterr().err


def test_the_engine_check_passes_on_the_tiny_llama(eos_lm):
    m, tok = eos_lm
    r = slots.SlotRunner(m, tok, slots=2, max_len=64, temperature=1.0, top_p=1.0)
    probe = [tok("Original Text Sample 1\nThe committee met")["input_ids"], [5, 6, 7]]
    assert r.check(probe, [9, 10], rtol=2e-3) is None


def test_compiled_step_on_cpu(eos_lm, tiny_lm):
    """torch.compile of the decode step (inductor's C++ backend on CPU): same schema and stats
    as eager, reproducible; fp32 fusion may round differently, so texts may differ."""
    pytest.importorskip("torch._inductor")
    ref, st = run(eos_lm, tiny_lm, "slots", 8)
    out, st2 = run(eos_lm, tiny_lm, "decoder=slots,capture=compile", 8)
    again, _ = run(eos_lm, tiny_lm, "decoder=slots,capture=compile", 8)
    assert out == again and [r["id"] for r in out] == [r["id"] for r in ref]
    assert same_rows(out, ref) >= len(ref) // 2
    assert abs(st2["generated_tokens"] - st["generated_tokens"]) <= 0.3 * st["generated_tokens"]


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (left out of CI)
def test_gpu_check_runs_end_to_end_on_cpu(tmp_path):
    """benchmarks/gpu_check.sh's CPU fallback (tiny random models): the bench against the old
    path and every stage of the round run, and the results table says so (the script the next
    GPU session runs cannot rot).  Its `tests` step is this file, run by the suite anyway."""
    out = tmp_path / "check"
    env = {**os.environ, "WHEELHOUSE": "none", "PYTHON": sys.executable, "DEVICE": "cpu",
           "QUICK": "1", "SKIP": "tests", "DATA": str(tmp_path / "data"), "POPRI_THREADS": "1"}
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), str(out)], env=env,
                       capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    steps = {s["step"]: s for s in res["steps"]}
    assert set(steps) >= {"bench", "embed", "gen", "score", "prefs", "dpo", "final", "fid"}
    assert all(s["rc"] == 0 for s in steps.values())
    assert "s/step" in steps["dpo"]["notes"] and "FID to val" in steps["fid"]["notes"]
    rows = {(r["backend"], r["batch_size"]) for r in res["bench"]["results"]}
    assert ("transformers-generate", 4) in rows and ("transformers (slots, none)", 8) in rows
    assert ("transformers (loop, generator)", 2) in rows
    table = (out / "results.md").read_text()
    assert "| dpo | 0 |" in table and "x baseline" in table
    assert (out / "round" / "synthetic.jsonl").read_text().count("\n") == 16
    # the paper-shaped round (bench_scale.py) at the CPU fallback's scale: every stage timed
    assert steps["paper"]["rc"] == 0
    scale = json.loads((out / "scale-cpu.json").read_text())
    (row,) = scale["rows"]
    assert set(row["stages"]) == {"gen", "embed", "score", "prefs", "dpo", "final", "pe-hist"}
    assert row["counts"]["samples"] == row["samples"] and not scale["info"]["partial"]
    assert "## The paper-shaped round" in table and "| pe-hist |" in table


# --------------------------------------------------------------------------- CUDA only
@cuda
def test_cuda_graphs_replay_the_eager_engine(eos_lm, tiny_lm):
    """fp32 on the GPU (no TF32): the captured graphs draw the eager engine's samples (eager
    compacts to exact sizes, graphs to powers of two: a rare near-tie may flip), reruns are
    byte-identical, and the loop on CUDA agrees too."""
    m, tok = eos_lm
    mt = (m.to("cuda"), tok)
    try:
        eager, st = run(mt, tiny_lm, "decoder=slots,capture=none", 8)
        graph, st2 = run(mt, tiny_lm, "decoder=slots,capture=graph", 8)
        again, _ = run(mt, tiny_lm, "decoder=slots,capture=graph", 8)
        loop, _ = run(mt, tiny_lm, "decoder=loop,sampler=counter", 24)
    finally:
        m.to("cpu")
    assert graph == again and same_rows(graph, eager) >= 18 and same_rows(loop, eager) >= 18
    assert abs(st2["generated_tokens"] - st["generated_tokens"]) <= 0.15 * st["generated_tokens"]


@cuda
def test_cuda_counter_uniforms_equal_the_cpu_bits():
    import torch

    from popri.models.sampling import philox_uniform

    s = torch.arange(100_000) * 7919 % 2**31
    t = torch.arange(100_000) % 97
    assert torch.equal(philox_uniform(s, t), philox_uniform(s.cuda(), t.cuda()).cpu())

