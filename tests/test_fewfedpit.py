"""FewFedPIT's stages through real processes on a tiny model: init -> local -> selfgen -> train ->
mix -> aggregate, the ledger's "no DP guarantee", the extension's noise, and leakage at beta = 0
below beta = 1 on a model that memorises.

    python -m pytest tests/test_fewfedpit.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rouge_score")

from conftest import write_jsonl  # noqa: E402

PRIVATE = {
    "c0": [("Describe the package zorblax.", "a lamp tool",
            "Zorblax polishes copper lamps with seven quiet brushes every evening at dusk."),
           ("Describe the package quimble.", "",
            "Quimble counts purple sheep on the northern hills and sings their names aloud.")],
    "c1": [("Describe the package frondel.", "a kettle",
            "Frondel boils water for twelve sleepy owls inside the old marble tower."),
           ("Describe the package yestrin.", "",
            "Yestrin paints tiny boats on river stones while the bakers sleep late.")],
}
SYNTHETIC = [("Name a colour.", "", "Blue is a colour."), ("Add two and two.", "", "Four."),
             ("Say hello.", "", "Hello there."), ("Name a fruit.", "", "An apple.")]


def _data(tmp_path: Path) -> Path:
    rows = [{"id": f"{c}#{k}", "client_id": c, "instruction": i, "input": x, "output": o,
             "text": f"{i} {x} {o}"}
            for c, exs in PRIVATE.items() for k, (i, x, o) in enumerate(exs)]
    return write_jsonl(tmp_path / "private.jsonl", rows)


def _synthetic(tmp_path: Path) -> Path:
    rows = [{"instruction": i, "input": x, "output": o, "kept": True, "ifs": 0.5}
            for i, x, o in SYNTHETIC] + [{"instruction": "dropped", "kept": False}]
    return write_jsonl(tmp_path / "syn.jsonl", rows)


FAST = ["--no-bf16", "--lora-r", "8", "--lora-alpha", "16"]


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (left out of CI: the same stages through popri run: test_popri_run_fewfedpit_*)
def test_one_round_through_every_stage(tiny_lm, tmp_path, run_popri):
    from popri.privacy.ledger import read_ledger

    data, R = _data(tmp_path), tmp_path / "run"
    run_popri(["fewfedpit", "init", "--model", tiny_lm, "--seed", "0", "--out", R / "r0",
               "--lora-r", "8", "--lora-alpha", "16"], check=True)
    mixed = []
    for c in PRIVATE:
        base = ["--round", "1", "--init", R / "r0"]
        run_popri(["fewfedpit", "local", "--data", data, "--client", c, *base, "--out",
                   R / "r1" / c / "local", *FAST], check=True)
        run_popri(["fewfedpit", "selfgen", "--data", data, "--client", c, *base, "--local",
                   R / "r1" / c / "local", "--out", R / "r1" / c / "syn.jsonl", "--stats-out",
                   R / "r1" / c / "syn.json", "--candidates", "4", "--keep", "2",
                   "--instruction-prompts", "2", "--instruction-tokens", "24",
                   "--response-tokens", "16", "--retries", "1", *FAST], check=True)
        stats = json.loads((R / "r1" / c / "syn.json").read_text())
        assert stats["counts"]["instruction_prompts"] == 2 and stats["client"] == c
        rows = [json.loads(x) for x in (R / "r1" / c / "syn.jsonl").read_text().splitlines()]
        assert all({"stage", "kept", "reason"} <= set(r) for r in rows)
        assert sum(r["kept"] for r in rows) == stats["counts"]["kept"] <= 2
        run_popri(["fewfedpit", "train", "--synthetic", _synthetic(tmp_path), "--client", c,
                   *base, "--out", R / "r1" / c / "public", *FAST], check=True)
        run_popri(["fewfedpit", "mix", "--local", R / "r1" / c / "local", "--public",
                   R / "r1" / c / "public", *base, "--out", R / "r1" / c / "mixed"], check=True)
        mixed.append(R / "r1" / c / "mixed")
    # beta mixing: the upload is the average of the two (beta = 0.5)
    th = {k: np.load(R / "r1" / "c0" / k / "theta.npy") for k in ("local", "public", "mixed")}
    assert np.allclose(th["mixed"], 0.5 * th["local"] + 0.5 * th["public"], atol=1e-6)
    run_popri(["fewfedpit", "aggregate", *mixed, "--round", "1", "--init", R / "r0", "--out",
               R / "r1" / "global", "--lora-r", "8", "--lora-alpha", "16"], check=True)
    # the server's n_k-weighted average (2 and 2 examples: the plain mean)
    g = np.load(R / "r1" / "global" / "theta.npy")
    ups = [np.load(m / "theta.npy") for m in mixed]
    assert np.allclose(g, (ups[0] + ups[1]) / 2, atol=1e-6)
    (e,) = read_ledger(R / "r1" / "ledger.jsonl")
    assert e.noise_multiplier == 0 and "no DP guarantee" in e.params["note"]
    p = run_popri(["account", "ledger", R / "r1" / "ledger.jsonl", "--json"], check=True)
    acct = json.loads(p.stdout)
    assert acct["epsilon"] is None and "infinity" in acct["note"]  # JSON null = eps infinite
    # the global model loads for evaluation
    p = run_popri(["eval", "accuracy", "--model", R / "r1" / "global" / "model", "--data", data,
                   "--split", "train", "--json", "--no-bf16", "--bootstrap", "0"], check=True)
    assert 0 <= json.loads(p.stdout)["accuracy"] <= 1
    # a round-2 stage refuses round 0's weights
    p = run_popri(["fewfedpit", "local", "--data", data, "--client", "c0", "--round", "2",
                   "--init", R / "r0", "--out", R / "bad", *FAST])
    assert p.returncode == 2 and "expected 1" in p.stderr and not (R / "bad").exists()


def test_weighted_average_uses_n_k(tiny_lm, tmp_path):
    from popri.methods.fewfedpit import client as C
    from popri.methods.fewfedpit.server import aggregate
    from popri.specs.fewfedpit import FewFedPITSpec

    spec = FewFedPITSpec(lora_r=8, lora_alpha=16, bf16=False)
    C.init_global(tiny_lm, str(tmp_path / "r0"), spec, seed=0, device="cpu")
    theta0, st0 = C.read_state(tmp_path / "r0")
    ups = []
    for k, (n, shift) in enumerate(((1, 1.0), (3, -1.0))):
        st = {**st0, "kind": "mixed", "round": 1, "client": f"c{k}", "n_examples": n}
        C.write_state(tmp_path / f"u{k}", theta0 + shift, st)
        ups.append(str(tmp_path / f"u{k}"))
    aggregate(ups, str(tmp_path / "r1"), spec, round_=1, init=str(tmp_path / "r0"), device="cpu")
    g, _ = C.read_state(tmp_path / "r1")
    assert np.allclose(g, theta0 + (1 * 1.0 + 3 * -1.0) / 4, atol=1e-6)


def test_extension_clips_and_ledgers_the_noise(tiny_lm, tmp_path, run_popri):
    from popri.methods.fewfedpit import client as C
    from popri.privacy.ledger import read_ledger
    from popri.specs.fewfedpit import FewFedPITSpec

    spec = FewFedPITSpec(lora_r=8, lora_alpha=16, bf16=False)
    C.init_global(tiny_lm, str(tmp_path / "r0"), spec, seed=0, device="cpu")
    theta0, st0 = C.read_state(tmp_path / "r0")
    ups = []
    for k in range(2):
        C.write_state(tmp_path / f"l{k}", theta0 + (k + 1), {**st0, "kind": "local", "round": 1,
                                                            "client": f"c{k}", "n_examples": 2})
        run_popri(["fewfedpit", "mix", "--local", tmp_path / f"l{k}", "--mode", "fedit",
                   "--round", "1", "--init", tmp_path / "r0", "--clip", "0.5", "--out",
                   tmp_path / f"m{k}"], check=True)
        d = np.load(tmp_path / f"m{k}" / "theta.npy") - theta0
        assert np.linalg.norm(d) == pytest.approx(0.5, rel=1e-4)
        ups.append(tmp_path / f"m{k}")
    run_popri(["fewfedpit", "aggregate", *ups, "--round", "1", "--init", tmp_path / "r0",
               "--clip", "0.5", "-z", "2", "--clients-total", "10", "--out", tmp_path / "r1",
               "--lora-r", "8", "--lora-alpha", "16"], check=True)
    (e,) = read_ledger(tmp_path / "ledger.jsonl")
    assert e.mechanism == "subsampled_gaussian" and e.noise_multiplier == 2
    # 2 of 10 clients drawn without replacement: replace one client, the clipped sum moves by 2C
    assert e.sample_rate == pytest.approx(0.2) and e.sampling == "fixed"
    assert e.neighbouring == "replace one client" and e.sensitivity == 1.0
    # an unclipped upload is refused by a clipping server
    p = run_popri(["fewfedpit", "aggregate", tmp_path / "l0", "--round", "1", "--init",
                   tmp_path / "r0", "--clip", "0.5", "-z", "2", "--out", tmp_path / "bad",
                   "--lora-r", "8", "--lora-alpha", "16"])
    assert p.returncode == 2 and not (tmp_path / "bad").exists()


@pytest.fixture(scope="module")
def sharp_lm(tiny_lm, tmp_path_factory) -> str:
    """tiny_lm's architecture with initializer_range 0.5: the default 0.02 leaves the tied
    embeddings so small that no logit can dominate 49k tokens, and LoRA cannot memorise."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    cfg = AutoConfig.from_pretrained(tiny_lm)
    cfg.initializer_range = 0.5
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("sharp-lm") / "model"
    LlamaForCausalLM(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_lm).save_pretrained(out)
    return str(out)


def test_leakage_at_beta_0_is_below_beta_1_on_an_overfit_model(sharp_lm, tmp_path):
    """A client memorises its private examples (high lr, many epochs); its upload at beta = 1
    (FedIT) carries them into the global model, at beta = 0 only its synthetic-data weights go
    up: the extraction audit's Rouge-L on its examples is lower.  One client per round, so the
    server's average is that client's upload (averaging LoRA factors of clients that memorised
    different texts blurs both, which would hide the effect being tested)."""
    from popri.eval.extract import run as extract
    from popri.methods.fewfedpit import client as C
    from popri.methods.fewfedpit.server import aggregate
    from popri.specs.fewfedpit import FewFedPITSpec
    from popri.specs.privacy import ExtractSpec

    data, syn = _data(tmp_path), _synthetic(tmp_path)
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    # the attacked examples: c0's two, each as its own "client" so the audit takes both
    attack = write_jsonl(tmp_path / "attack.jsonl",
                         [{**r, "client_id": r["id"]} for r in rows if r["client_id"] == "c0"])
    spec = FewFedPITSpec(lora_r=16, lora_alpha=32, bf16=False, lr=2e-2, local_epochs=40,
                         batch_size=2, rounds=1)
    C.init_global(sharp_lm, str(tmp_path / "r0"), spec, seed=0, device="cpu")
    C.run_local(str(data), "c0", str(tmp_path / "local"), spec, round_=1,
                init=str(tmp_path / "r0"), device="cpu")
    C.run_train(str(syn), "c0", str(tmp_path / "public"), spec, round_=1,
                init=str(tmp_path / "r0"), device="cpu")
    score = {}
    for beta in (1.0, 0.5, 0.0):
        s = FewFedPITSpec(**{**spec.to_dict(), "beta": beta})
        up = tmp_path / f"b{beta}" / "c0"
        C.run_mix(str(up), s, round_=1, init=str(tmp_path / "r0"),
                  local_dir=str(tmp_path / "local"), public_dir=str(tmp_path / "public"))
        aggregate([str(up)], str(tmp_path / f"b{beta}" / "global"), s, round_=1,
                  init=str(tmp_path / "r0"), device="cpu")
        summary, _ = extract(str(tmp_path / f"b{beta}" / "global" / "model"), str(attack),
                             "train", ExtractSpec(num_examples=2, suffix_tokens=12, bf16=False),
                             seed=0, device="cpu")
        score[beta] = summary["rouge_l"]
    assert score[1.0] > 0.5  # the memorised text comes back through the FedIT upload
    assert score[0.0] < score[1.0] - 0.3
    assert score[0.0] <= score[0.5] <= score[1.0]


def test_eval_instruct_token_accuracy_by_hand(tiny_lm, tmp_path, run_popri):
    """Response-token accuracy counts argmax hits on the response + EOS only (checked against a
    forward pass by hand), Rouge-L is in [0, 1], per-client rows feed eval gap."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from popri.data.instruct import prompt
    from popri.eval.instruct import evaluate

    data = _data(tmp_path)
    res = evaluate(tiny_lm, str(data), "train", bf16=False, bootstrap=50, device="cpu",
                   max_new_tokens=8)
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm)
    hits = n = 0
    for c, exs in PRIVATE.items():
        for i, x, o in exs:
            p = [tok.bos_token_id] + tok(prompt(i, x), add_special_tokens=False)["input_ids"]
            y = tok(o, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            with torch.no_grad():
                lg = model(input_ids=torch.tensor([p + y])).logits[0]
            pred = lg[len(p) - 1: len(p) + len(y) - 1].argmax(-1).tolist()
            hits += sum(a == b for a, b in zip(pred, y))
            n += len(y)
    assert res["tokens"] == n and res["accuracy"] == pytest.approx(hits / n)
    assert 0 <= res["rouge_l"] <= 1 and res["clients"] == 2 and res["accuracy_se"] is not None
    p = run_popri(["eval", "instruct", "--model", tiny_lm, "--data", data, "--split", "train",
                   "--no-bf16", "--no-generate", "--json", "--bootstrap", "0",
                   "--per-client-out", tmp_path / "per.jsonl"], check=True)
    out = json.loads(p.stdout)
    assert out["accuracy"] == pytest.approx(hits / n) and out["rouge_l"] is None
    rows = [json.loads(x) for x in (tmp_path / "per.jsonl").read_text().splitlines()]
    assert sum(r["tokens"] for r in rows) == n


def _instruct_table(tmp_path: Path) -> Path:
    topics = ["lamps", "boats", "sheep", "owls", "kettles", "maps", "bells", "ropes", "kites",
              "drums"]
    rows = [{"client_id": f"u{c}", "instruction": f"Describe the {topics[c]} of town {k}.",
             "input": "" if k % 2 else f"town {k}",
             "output": f"The {topics[c]} of town {k} are old, loud and loved by everyone there."}
            for c in range(10) for k in range(3)]
    return write_jsonl(tmp_path / "instruct.jsonl", rows)


def _ffp_run_args(run, data, tiny_lm, method="fewfedpit", *more):
    return ["run", str(Path(__file__).resolve().parents[1] / "examples" / "fewfedpit.yaml"),
            "--set", f"run_dir={run}", "--set", f"method={method}", "--set", f"data.source={data}",
            "--set", "rounds=1", "--set", "instruct.max_clients=null",
            "--set", "instruct.val_frac=0.2", "--set", "instruct.test_frac=0.3",
            "--set", f"downstream.model={tiny_lm}", "--set", "downstream.bootstrap=50",
            "--set", "fewfedpit.bf16=false", "--set", "fewfedpit.candidates=2",
            "--set", "fewfedpit.keep=1", "--set", "fewfedpit.instruction_prompts=1",
            "--set", "fewfedpit.instruction_tokens=16", "--set", "fewfedpit.response_tokens=12",
            "--set", "fewfedpit.retries=1", "--set", "fewfedpit.centralized_epochs=1",
            "--set", "fewfedpit.eval_max_samples=4", "--set", "fewfedpit.eval_max_new_tokens=8",
            "--set", "fewfedpit.extract_examples=4", *more]


def test_popri_run_fewfedpit_records_no_dp_guarantee_and_resumes(tiny_lm, tmp_path, run_popri):
    """method: fewfedpit end to end on a tiny model: instruction data built from a table, one
    round of two clients, eval instruct + audit extract of the method, eps = 0 and eps = inf,
    the ledger's eps = inf stated in the results; a rerun skips every stage."""
    data, run = _instruct_table(tmp_path), tmp_path / "ffp"
    p = run_popri(_ffp_run_args(run, data, tiny_lm), check=True)
    res = json.loads((run / "results.json").read_text())
    assert res["method"] == "fewfedpit" and res["epsilon"] is None
    assert set(res["methods_instruct"]) == {"fewfedpit", "eps0", "epsinf"}
    assert set(res["leakage"]) == {"fewfedpit", "eps0", "epsinf"}
    for v in res["methods_instruct"].values():
        assert 0 <= v["accuracy"] <= 1 and 0 <= v["rouge_l"] <= 1
    assert "no DP guarantee" in (run / "results.md").read_text()
    assert "| FewFedPIT | inf |" in p.stdout
    ups = list((run / "fewfedpit" / "r1").glob("*/mixed"))
    assert len(ups) == 2
    p = run_popri(_ffp_run_args(run, data, tiny_lm), check=True)
    assert " ffp-r1-aggregate up to date, skipped" in p.stderr


def test_popri_run_fewfedpit_refuses_a_budget_and_plans_fedit(tiny_lm, tmp_path, run_popri):
    data = _instruct_table(tmp_path)
    p = run_popri([*_ffp_run_args(tmp_path / "x", data, tiny_lm), "--set", "privacy.epsilon=1"])
    assert p.returncode == 2 and "no DP guarantee" in p.stderr and "privacy.epsilon" in p.stderr
    assert not (tmp_path / "x").exists()
    p = run_popri([*_ffp_run_args(tmp_path / "y", data, tiny_lm, "fedit"), "--dry-run"],
                  check=True)
    cmds = [x for x in p.stdout.splitlines() if x.startswith("popri fewfedpit")]
    assert any(" local " in x for x in cmds) and not any(" selfgen " in x for x in cmds)
    assert any(" mix " in x and "--mode fedit" in x for x in cmds)


def test_popri_run_fewfedpit_with_noise_records_what_it_plans(tiny_lm, tmp_path, run_popri):
    """The popri extension (fewfedpit.noise_multiplier and clip): the aggregate stage declares its
    release, and the entry it records is the one the plan composed (issue 27)."""
    from conftest import assert_plan_equals_record
    from popri.privacy.ledger import read_ledger

    data, run = _instruct_table(tmp_path), tmp_path / "ffp"
    run_popri(_ffp_run_args(run, data, tiny_lm, "fewfedpit", "--set", "baselines=false",
                            "--set", "fewfedpit.noise_multiplier=0.5", "--set",
                            "fewfedpit.clip=1", "--set", "fewfedpit.clients_per_round=2"),
              check=True)
    assert_plan_equals_record(run, {"ffp-r1-aggregate"})
    (e,) = [e for p in run.rglob("ledger.jsonl") for e in read_ledger(p)]
    assert e.mechanism == "subsampled_gaussian" and e.noise_multiplier == 0.5
