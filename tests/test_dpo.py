"""popri dpo / popri sft: DPO moves the margin, IPO path, no reference copy, resume, adapter
continuation, checkpoint selection, CLI (library: popri/methods/popri/dpo.py, the plumbing
popri/models/lora.py, selection popri/methods/popri/select.py, settings DPOSpec / SFTSpec).

    python -m pytest -q tests/test_dpo.py            # fast (tiny random Llama)
    python -m pytest -q tests/test_dpo.py -m slow    # SmolLM2-135M, one epoch
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from popri.core.errors import ConfigError, InputError, PopriError
from popri.methods.popri import dpo as lib
from popri.models.lora import DEFAULT_TARGETS
from popri.specs.training import DPOSpec, SFTSpec

CHOSEN = [" the union is strong and the people are free.", " we must keep faith with the nation.",
          " our economy grew and our workers prospered.", " peace abroad and justice at home."]
REJECTED = [" zebra quantum pickle xylophone marmalade.", " purple seven banana hinge orbit.",
            " lorem ipsum dolor sit amet consectetur.", " cat cat cat dog dog dog."]


def make_pairs(n=8):
    return [{"prompt": f"Original Text Sample {i}: words about topic {i}.\nOriginal Text Sample 4:",
             "chosen": CHOSEN[i % 4], "rejected": REJECTED[i % 4], "prompt_id": i,
             "chosen_score": 1.0, "rejected_score": 0.0} for i in range(n)]


FAST = dict(bf16=False, batch_size=4)  # DPOSpec / SFTSpec fields


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    # tiny models: thread sync costs more than it saves (and the CPU is shared)
    monkeypatch.setenv("POPRI_THREADS", "1")


def adapter_tensors(d):
    from safetensors.numpy import load_file

    return load_file(str(Path(d) / "adapter_model.safetensors"))


def test_dpo_grows_the_reward_margin_on_the_training_pairs(tiny_lm, tmp_path):
    from popri.models import llm

    pairs = make_pairs(8)
    spec = DPOSpec(lr=5e-3, epochs=3, **FAST)
    tr = lib.build_dpo_trainer(pairs, spec, model=tiny_lm, out_dir=tmp_path / "probe")
    before = lib.reward_margins(tr.model, tr.processing_class, pairs)
    assert np.allclose(before, 0.0, atol=1e-6)  # fresh LoRA (B = 0): policy == reference
    res = lib.train_dpo(pairs, spec, model=tiny_lm, out_dir=tmp_path / "o", eval_pairs=8)
    model, tok = llm.load_causal_lm(tiny_lm, adapter=res["adapter"])  # the saved adapter
    after = lib.reward_margins(model, tok, pairs)
    assert after.mean() > 0.02 and (after > 0).mean() >= 0.75, after
    assert res["eval_margin"]["margin"] == pytest.approx(after.mean(), rel=1e-4)
    # TRL's own log agrees in direction, and the per-epoch table is in metrics.json
    m = json.loads(Path(res["metrics"]).read_text())
    assert [e["epoch"] for e in m["epochs"]] == [1, 2, 3]
    assert m["epochs"][-1]["rewards/margins"] > m["epochs"][0]["rewards/margins"]
    assert m["epochs"][-1]["loss"] < m["epochs"][0]["loss"]
    assert m["steps"][0]["loss"] == pytest.approx(np.log(2), abs=1e-4)  # sigmoid loss at margin 0
    assert len(res["checkpoints"]) == 3  # one per epoch (reference code: save_strategy epoch)
    # run.json / metrics.json record the spec's settings, the model, the seed
    assert {k: m["config"][k] for k in spec.to_dict()} == json.loads(json.dumps(spec.to_dict()))
    assert m["config"]["model"] == tiny_lm and m["config"]["seed"] == 0


def test_ipo_loss_path(tiny_lm, tmp_path):
    res = lib.train_dpo(make_pairs(4), DPOSpec(loss="ipo", beta=0.1, lr=1e-3, max_steps=2, **FAST),
                        model=tiny_lm, out_dir=tmp_path / "o")
    steps = json.loads(Path(res["metrics"]).read_text())["steps"]
    # IPO: (margin - 1/(2 beta))^2 = 25 at margin 0 (DPO's sigmoid loss would be ln 2)
    assert steps[0]["loss"] == pytest.approx(25.0, rel=1e-3)
    assert np.isfinite(steps[-1]["loss"])
    with pytest.raises(ConfigError, match="field 'loss': must be one of dpo, ipo"):
        lib.train_dpo(make_pairs(4), model=tiny_lm, out_dir=tmp_path / "x", loss="kto", **FAST)
    assert not (tmp_path / "x").exists()


def test_rpo_adds_the_chosen_nll_to_the_preference_loss(tiny_lm, tmp_path):
    """dpo.sft_weight (RPO, arXiv:2404.19733): TRL's loss_type [sigmoid, sft] with weights
    [1, w]; at the first step the adapter is the reference, so the DPO term is ln 2 and the
    loss exceeds it by w times the chosen sample's NLL (> 0)."""
    assert lib.loss_config(DPOSpec()) == {"loss_type": ["sigmoid"]}
    assert lib.loss_config(DPOSpec(loss="ipo", sft_weight=0.5)) == {
        "loss_type": ["ipo", "sft"], "loss_weights": [1.0, 0.5]}
    res = lib.train_dpo(make_pairs(4), DPOSpec(sft_weight=1.0, lr=1e-3, max_steps=2, **FAST),
                        model=tiny_lm, out_dir=tmp_path / "o")
    m = json.loads(Path(res["metrics"]).read_text())
    assert m["steps"][0]["loss"] > np.log(2) + 1.0  # a random tiny LM's NLL is several nats
    assert m["config"]["sft_weight"] == 1.0
    with pytest.raises(ConfigError, match="sft_weight"):
        DPOSpec(sft_weight=-1)


def test_reference_is_the_base_with_the_adapter_disabled_no_copy(tiny_lm, tmp_path):
    from popri.models import llm

    base, _ = llm.load_causal_lm(tiny_lm)
    n_base = sum(p.numel() for p in base.parameters())
    tr = lib.build_dpo_trainer(make_pairs(4), DPOSpec(**FAST), model=tiny_lm,
                               out_dir=tmp_path / "o")
    assert tr.ref_model is None
    assert list(tr.model.peft_config) == ["default"]  # no "ref" adapter either
    n_lora = sum(p.numel() for n, p in tr.model.named_parameters() if "lora_" in n)
    n_all = sum(p.numel() for p in tr.model.parameters())
    assert n_all - n_lora == n_base  # exactly one copy of the base weights
    assert n_lora == sum(p.numel() for p in tr.model.parameters() if p.requires_grad)
    lora = tr.model.peft_config["default"]
    assert (lora.r, lora.lora_alpha) == (4, 8)  # POPri B.1
    assert set(lora.target_modules) == set(DEFAULT_TARGETS)


def test_continues_from_a_previous_adapter_with_the_base_as_reference(tiny_lm, tmp_path):
    pairs = make_pairs(4)
    r1 = lib.train_dpo(pairs, DPOSpec(lr=5e-3, max_steps=3, **FAST), model=tiny_lm,
                       out_dir=tmp_path / "r1")
    a1 = adapter_tensors(r1["adapter"])
    tr = lib.build_dpo_trainer(pairs, DPOSpec(**FAST), model=tiny_lm, adapter=r1["adapter"],
                               out_dir=tmp_path / "p")
    assert list(tr.model.peft_config) == ["default"] and tr.ref_model is None
    # lr ~ 0 (the spec wants lr > 0; 1e-30 is below fp32's spacing at these weights): round 2
    # starts from round 1's weights and keeps them
    r2 = lib.train_dpo(pairs, DPOSpec(lr=1e-30, max_steps=2, **FAST), model=tiny_lm,
                       adapter=r1["adapter"], out_dir=tmp_path / "r2")
    a2 = adapter_tensors(r2["adapter"])
    assert a1.keys() == a2.keys()
    assert all(np.array_equal(a1[k], a2[k]) for k in a1)
    assert any(np.abs(a1[k]).sum() > 0 for k in a1 if "lora_B" in k)  # really trained, not init
    # the reference is the base, not a copy of the adapter: the margin is non-zero from step 1
    steps = json.loads(Path(r2["metrics"]).read_text())["steps"]
    assert steps[0]["rewards/margins"] > 0
    with pytest.raises(InputError, match="adapter_config"):
        lib.train_dpo(pairs, DPOSpec(**FAST), model=tiny_lm, adapter=str(tmp_path),
                      out_dir=tmp_path / "r3")
    assert not (tmp_path / "r3").exists()  # checked before anything is written
    # the continued adapter is part of the run's record (its content digest)
    cfg = json.loads(Path(r2["metrics"]).read_text())["config"]
    from popri.core.artifacts import dir_digest

    assert cfg["adapter"] == r1["adapter"] and cfg["adapter_sha256"] == dir_digest(r1["adapter"])


def test_resume_after_interruption(tiny_lm, tmp_path):
    from transformers import TrainerCallback

    class Crash(Exception):
        pass

    class CrashAfterFirstSave(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            raise Crash(f"killed after step {state.global_step}")

    pairs = make_pairs(8)
    spec = DPOSpec(lr=5e-3, max_steps=4, save_steps=2, **FAST)
    kw = dict(model=tiny_lm)
    with pytest.raises(Crash):
        lib.train_dpo(pairs, spec, out_dir=tmp_path / "o", callbacks=[CrashAfterFirstSave()], **kw)
    out = tmp_path / "o"
    assert [Path(c).name for c in lib.list_checkpoints(out)] == ["checkpoint-2"]
    assert not (out / "adapter").exists()
    (out / "checkpoint-3").mkdir()  # a checkpoint half-written when the process died
    # other data or settings in the same directory: refused, nothing touched
    with pytest.raises(InputError, match="different dpo run"):
        lib.train_dpo(pairs[:6], spec, out_dir=out, **kw)
    with pytest.raises(InputError, match="different dpo run"):  # other settings
        lib.train_dpo(pairs, spec.replace(beta=0.02), out_dir=out, **kw)
    res = lib.train_dpo(pairs, spec, out_dir=out, **kw)
    assert res["resumed_from"].endswith("checkpoint-2") and res["steps_this_run"] == 2
    assert res["global_step"] == 4 and Path(res["adapter"], "adapter_model.safetensors").exists()
    assert not (out / "checkpoint-3").exists()
    m = json.loads(Path(res["metrics"]).read_text())
    assert [s["step"] for s in m["steps"]] == [1, 2, 3, 4]
    # identical to an uninterrupted run (optimizer, schedule, RNG and data order restored)
    ref = lib.train_dpo(pairs, spec, out_dir=tmp_path / "straight", **kw)
    a, b = adapter_tensors(res["adapter"]), adapter_tensors(ref["adapter"])
    assert all(np.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_select_checkpoint_picks_lowest_fid_with_fakes():
    rng = np.random.default_rng(0)
    val = rng.normal(size=(200, 4))
    shift = {"ck-1": 3.0, "ck-2": 0.2, "ck-3": 1.0}
    calls = []

    def gen(ck):
        calls.append(ck)
        return [f"{ck}|{i}" for i in range(150)]

    def emb(texts):
        ck = texts[0].split("|")[0]
        return np.random.default_rng(len(ck) + int(ck[-1])).normal(size=(len(texts), 4)) + shift[ck]

    best, res = lib.select_checkpoint(list(shift), base_model="m", val_embeddings=val,
                                      generate_fn=gen, embed_fn=emb)
    assert best == "ck-2" and calls == list(shift)
    fids = {r["checkpoint"]: r["fid"] for r in res}
    assert fids["ck-2"] < fids["ck-3"] < fids["ck-1"]
    assert res[0]["samples"] == 150 and res[0]["base_model"] == "m"
    # ties go to the earlier checkpoint; too few samples is an error
    best, _ = lib.select_checkpoint(["a1", "b1"], base_model="m", val_embeddings=val,
                                    generate_fn=lambda ck: ["x", "y", "z"],
                                    embed_fn=lambda t: np.eye(3, 4))
    assert best == "a1"
    with pytest.raises(PopriError, match="at least 2"):
        lib.select_checkpoint(["a1"], base_model="m", val_embeddings=val,
                              generate_fn=lambda ck: ["x"], embed_fn=lambda t: np.ones((1, 4)))


def test_sft_trains_on_the_completion_only(tiny_lm, tmp_path):
    recs = [{"prompt": p["prompt"], "completion": p["chosen"]} for p in make_pairs(4)]
    tr = lib.build_sft_trainer(recs, SFTSpec(**FAST), model=tiny_lm, out_dir=tmp_path / "probe")
    batch = next(iter(tr.get_train_dataloader()))
    tok = tr.processing_class
    for ids, labels in zip(batch["input_ids"], batch["labels"]):
        kept = [int(i) for i, lab in zip(ids, labels) if lab != -100]
        text = tok.decode(kept)
        assert text.strip().rstrip(tok.eos_token).strip() in [c.strip() for c in CHOSEN], text
    res = lib.train_sft(recs, SFTSpec(lr=5e-3, epochs=2, **FAST), model=tiny_lm,
                        out_dir=tmp_path / "o")
    m = json.loads(Path(res["metrics"]).read_text())
    assert m["epochs"][-1]["loss"] < m["epochs"][0]["loss"]
    assert Path(res["adapter"], "adapter_config.json").exists()


def _samples_and_scores(tmp_path, K=3, J=5):
    from popri.core.io import save_scores

    S = [{"id": f"r0-p{k}-s{j}", "round": 0, "prompt_id": k, "sample_idx": j,
          "prompt": make_pairs(K)[k]["prompt"], "text": (CHOSEN if j == 0 else REJECTED)[(k + j) % 4],
          "model": "tiny"} for k in range(K) for j in range(J)]
    sp = tmp_path / "samples.jsonl"
    sp.write_text("".join(json.dumps(s) + "\n" for s in S))
    sc = np.array([1.0 if s["sample_idx"] == 0 else -s["sample_idx"] / 10 for s in S])
    npy = tmp_path / "scores.npy"
    save_scores(npy, sc, {"ids": [s["id"] for s in S]})
    return sp, npy


def test_cli_prefs_build_then_dpo(tiny_lm, tmp_path, run_popri):
    sp, npy = _samples_and_scores(tmp_path)
    pairs = tmp_path / "pairs.jsonl"
    run_popri(["prefs", "build", "--samples", sp, "--scores", npy, "--out", pairs], check=True)
    out = tmp_path / "dpo"
    p = run_popri(["dpo", "--pairs", pairs, "--model", tiny_lm, "--out", out, "--max-steps", "2",
                   "--batch-size", "2", "--no-bf16", "--lr", "1e-3", "--loss", "ipo",
                   "--sft-weight", "0.5"], check=True)
    assert p.stdout.strip() == str(out / "adapter")
    assert (out / "adapter" / "adapter_model.safetensors").exists()
    m = json.loads((out / "metrics.json").read_text())
    assert m["config"]["loss"] == "ipo" and len(m["steps"]) == 2
    assert m["config"]["sft_weight"] == 0.5  # a spec field is an option (spec_options)
    assert "margin" in p.stderr and "epoch" in p.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "chosen": "b"}\n')
    p = run_popri(["dpo", "--pairs", bad, "--model", tiny_lm, "--out", tmp_path / "bad"])
    assert p.returncode == 2 and "bad.jsonl:1: field 'rejected'" in p.stderr


def test_two_processes_with_the_same_seed_train_the_same_adapter(tiny_lm, tmp_path, run_popri):
    """Same pairs + seed + machine -> the same adapter, in separate processes (each starts from
    its own unseeded torch generator).  TRL 0.29 (the lowest admitted) draws the LoRA init
    before Trainer seeds: without popri seeding first, two runs trained different models."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in make_pairs(8)))

    def train(name, seed):
        out = tmp_path / name
        run_popri(["dpo", "--pairs", pairs, "--model", tiny_lm, "--out", out, "--max-steps", "2",
                   "--batch-size", "4", "--no-bf16", "--lr", "1e-2", "--seed", str(seed)],
                  check=True)
        return adapter_tensors(out / "adapter")

    a, b, c = train("a", 3), train("b", 3), train("c", 4)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a)  # the seed does reach the init
    # (popri sft builds its trainer through the same models/lora.py:build_trainer)


def test_cli_sft_from_samples_or_pairs(tiny_lm, tmp_path, run_popri):
    sp, npy = _samples_and_scores(tmp_path)
    pairs = tmp_path / "pairs.jsonl"
    run_popri(["prefs", "build", "--samples", sp, "--scores", npy, "--out", pairs], check=True)
    # SFT from samples + scores (top-scored per prompt) and from the pairs
    for src in (["--samples", sp, "--scores", npy], ["--pairs", pairs]):
        o = tmp_path / f"sft{len(src)}"
        p = run_popri(["sft", *src, "--model", tiny_lm, "--out", o, "--max-steps", "1",
                       "--no-bf16"], check=True)
        assert p.stdout.strip() == str(o / "adapter") and (o / "adapter").is_dir()
    p = run_popri(["sft", "--pairs", pairs, "--samples", sp, "--out", tmp_path / "bad"])
    assert p.returncode == 2 and "either --pairs" in p.stderr


def test_cli_dpo_selects_the_checkpoint_by_fid(tiny_lm, tiny_st_model, tmp_path, run_popri):
    sp, npy = _samples_and_scores(tmp_path, K=2, J=5)
    pairs = tmp_path / "pairs.jsonl"
    run_popri(["prefs", "build", "--samples", sp, "--scores", npy, "--out", pairs], check=True)
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n"
                           for i, t in enumerate(CHOSEN + REJECTED)))
    out = tmp_path / "dpo"
    p = run_popri(["dpo", "--pairs", pairs, "--model", tiny_lm, "--out", out, "--epochs", "2",
                   "--batch-size", "2", "--no-bf16", "--select-on", val, "--select-prompts", sp,
                   "--select-samples", "4", "--embed-model", tiny_st_model, "--select-by",
                   "fid"], check=True)
    sel = json.loads((out / "selection.json").read_text())
    assert [Path(r["checkpoint"]).name for r in sel["results"]] == ["checkpoint-1", "checkpoint-2"]
    best = min(sel["results"], key=lambda r: r["fid"])["checkpoint"]
    assert sel["selected"] == best and p.stdout.strip() == str(out / "adapter")
    assert (Path(best) / "adapter_model.safetensors").read_bytes() == \
        (out / "adapter" / "adapter_model.safetensors").read_bytes()


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (left out of CI: DPO on SmolLM2: test_run_e2e.py::test_slow_embedded_default_reduced_on_real_models)
def test_slow_smollm2_one_epoch_grows_the_margin(tmp_path, monkeypatch):
    from popri.models import llm

    monkeypatch.setenv("POPRI_THREADS", "2")
    pairs = make_pairs(16)
    res = lib.train_dpo(pairs, DPOSpec(epochs=1, batch_size=4, bf16=True), model="smollm2-135m",
                        out_dir=tmp_path / "o")  # default lr (5e-4), 4 steps
    model, tok = llm.load_causal_lm("smollm2-135m", adapter=res["adapter"])
    after = lib.reward_margins(model, tok, pairs)
    assert after.mean() > 0 and (after > 0).mean() > 0.5, after
