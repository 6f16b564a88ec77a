"""`popri run` end to end on tiny random models: every method, a killed run resuming, the table.

    python -m pytest -q tests/test_run_e2e.py            # tiny models (minutes: ~25 subprocesses each)
    python -m pytest -q tests/test_run_e2e.py -m slow    # + the embedded default on SmolLM2 / MiniLM
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import _run, assert_plan_equals_record, write_jsonl

WORDS = ("river market winter council harvest railway treaty budget school harbor army labor "
         "court senate tariff union farmer coal steel bank trade navy").split()


def _texts(rng, n, lo=6, hi=14):
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi)))).capitalize() + "."
            for _ in range(n)]


@pytest.fixture
def tiny_inputs(tmp_path, run_popri):
    import numpy as np

    rng = np.random.default_rng(0)
    priv = tmp_path / "priv.jsonl"
    write_jsonl(priv, [{"user": f"u{i % 24}", "text": t} for i, t in enumerate(_texts(rng, 192))])
    data = tmp_path / "data"
    run_popri(["bench", "fetch", priv, "--client-column", "user", "--out", data, "--seed", "0"],
              check=True)
    pub = tmp_path / "public.jsonl"
    write_jsonl(pub, [{"id": f"p{i}", "text": t} for i, t in enumerate(_texts(rng, 30))])
    return data, pub


def tiny_overrides(run_dir, data, pub, lm, st, method="popri"):
    return [f"run_dir={run_dir}", f"method={method}", f"data.dir={data}", f"data.public_source={pub}",
            f"embedder={st}", f"generator.model={lm}", "generator.max_new_tokens=16",
            "generator.bf16=false", "generator.batch_size=8", "rounds=2", "prompts=3", "score.sample_rate=null",
            "samples_per_prompt=5", "num_synthetic=12", "dpo.rejected_rank=5", "dpo.epochs=1",
            "dpo.select_samples=4", f"downstream.model={lm}", "downstream.epochs=1",
            "downstream.eval_max_samples=24", "downstream.bootstrap=50", "downstream.lr=0.003",
            "pe.num_syn=8", "probe.prompts=2", "probe.samples_per_prompt=2",
            "privacy.epsilon=1.0"]


def popri_cmd(overrides):
    return [sys.executable, "-m", "popri.cli.app", "run", *[f"--set={o}" for o in overrides]]


def env():
    e = dict(os.environ)
    e["POPRI_THREADS"] = "1"
    return e


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (left out of CI: kill-and-resume: tests/test_resume.py, test_hostile_run.py::test_i4)
def test_killed_run_resumes_from_the_last_finished_stage(tiny_inputs, tiny_lm, tiny_st_model,
                                                         tmp_path):
    data, pub = tiny_inputs
    run = tmp_path / "run"
    ov = tiny_overrides(run, data, pub, tiny_lm, tiny_st_model) + ["rounds=1", "probe.enabled=true",
                                                                   "draws=2"]
    marker = run / ".stages" / "round1-score.json"
    # start, and kill the whole process group once round 1's DP scores are released
    p = subprocess.Popen(popri_cmd(ov), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(),
                         start_new_session=True, text=True)
    t0 = time.time()
    while not marker.exists():
        assert p.poll() is None, p.communicate()[1][-3000:]
        assert time.time() - t0 < 600, "round1-score never finished"
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert not (run / "results.json").exists()
    done_before = {f.name: f.stat().st_mtime_ns for f in (run / ".stages").glob("*.json")}
    assert {"embed-train", "embed-val", "round1-gen", "round1-score"} <= {n[:-5] for n in done_before}
    scores_before = (run / "round1" / "scores.npy").read_bytes()
    # rerun the same command: finished stages are skipped, the rest runs, results appear
    r = _run(popri_cmd(ov)[3:], full_env=env())
    assert r.returncode == 0, r.stderr[-3000:]
    reuse = next(x for x in r.stderr.splitlines() if " to run: " in x)
    import re

    m = re.match(r"run: (\d+) cached, (\d+) to run: ", reuse)
    assert m and int(m.group(1)) >= 4 and "round1-prefs (new)" in reuse, reuse
    assert "round1-gen" not in reuse and "round1-score " not in reuse, reuse
    for name in ("round1-gen", "round1-score"):
        assert f" {name} up to date, skipped" in r.stderr
        assert (run / ".stages" / f"{name}.json").stat().st_mtime_ns == done_before[f"{name}.json"]
    assert (run / "round1" / "scores.npy").read_bytes() == scores_before
    assert "| POPri |" in r.stdout and "gap closed" in r.stdout, r.stdout
    assert "| POPri, T = 0 (untuned generator) |" in r.stdout and "learning: POPri minus" in r.stdout
    res = json.loads((run / "results.json").read_text())
    assert_plan_equals_record(run, {"select-stats", "round1-score"})  # DP selection (default)
    assert set(res["methods"]) == {"popri", "t0", "eps0", "epsinf"}
    assert res["control"]["acc_minus_control"] == pytest.approx(
        res["methods"]["popri"]["accuracy"] - res["methods"]["t0"]["accuracy"], abs=1e-9)
    assert res["gap_closed"]["control"]["acc"] == pytest.approx(res["methods"]["t0"]["accuracy"])
    # draws = 2: the final set and its control drawn once more (gen seed + 1), paired again
    dr = res["control"]["draws"]
    assert dr["n"] == 2 and dr["acc_minus_control"][0] == res["control"]["acc_minus_control"]
    d1 = json.loads((run / "eval" / "control-d1.json").read_text())
    assert dr["acc_minus_control"][1] == d1["acc_minus_control"]
    assert len((run / "draws" / "d1" / "synthetic.jsonl").read_text().splitlines()) == 12
    assert "over 2 draws of both synthetic sets" in r.stdout
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    probes = [x for x in rows if x["stage"] == "probe"]
    assert [x["round"] for x in probes] == [0, 1] and all(x["private_diagnostic"] for x in probes)
    assert {"score", "dpo"} <= {x["stage"] for x in rows}
    assert res["probe"]["last_round"] == 1 and res["probe"]["delta_mean_cosine_se"] >= 0
    assert res["epsilon"] == pytest.approx(1.0, abs=2e-3)  # the ledger totals the budget
    assert res["fid_to_val"] is not None and res["fid_to_val"] >= 0
    # a third run has nothing left to do
    r3 = _run(popri_cmd(ov)[3:], full_env=env())
    assert r3.returncode == 0 and "skipped" in r3.stderr
    assert r3.stderr.count(" done in ") == 0 and r3.stdout == r.stdout
    assert "cached, 0 to run: everything is up to date" in r3.stderr
    res3 = json.loads((run / "results.json").read_text())
    ident = res3["run"]
    assert ident["invocations"] == 2 and ident["stages_ran"] == 0 and len(ident["config_hash"]) == 16
    assert ident["popri_version"] and ident["started"] <= ident["ended"]
    # the stages' seconds survive a fully cached rerun (merged from the markers)
    assert res3["stage_seconds"] == res["stage_seconds"] and "round1-gen" in res3["stage_seconds"]
    assert (run / "logs" / "round1-dpo.log").is_file()
    assert len((run / "logs" / "invocations.jsonl").read_text().splitlines()) == 2
    # a changed setting: the plan names the stage and the flag that changed
    plan = _run(popri_cmd(ov + ["dpo.lr=0.0001"])[3:] + ["--dry-run"], full_env=env(),
                timeout=300)
    assert plan.returncode == 0, plan.stderr
    assert "round1-dpo (--lr 0.0005 -> 0.0001)" in plan.stdout + plan.stderr
    # the ledger holds exactly the T = 1 DP release (the noise-free diagnostics are outside it)
    led = [json.loads(l) for l in open(run / "round1" / "ledger.jsonl")]
    assert len({e["release_id"] for e in led}) == 1 and led[0]["noise_multiplier"] > 0


@pytest.mark.parametrize("method", ["pe", "pe-sft", pytest.param(
    "popri-nn-pool", marks=[pytest.mark.slow, pytest.mark.heavy])])  # heavy: a pool variant
def test_baseline_methods_run_end_to_end(method, tiny_inputs, tiny_lm, tiny_st_model, tmp_path):
    data, pub = tiny_inputs
    run = tmp_path / method
    # POPri's scoring ablation (DP nearest-neighbour votes) with the evolving few-shot pool of
    # issue 24, in one run: both are POPri with other settings (each run costs ~50 s).  It and
    # PE run in release mode, whose run directory is enumerated file by file and field by
    # field (tests/test_release_fields.py); PE+SFT in research mode, evaluated
    nn = pool = method == "popri-nn-pool"
    release = method in ("popri-nn-pool", "pe")
    method = "popri" if nn else method
    ov = tiny_overrides(run, data, pub, tiny_lm, tiny_st_model, method=method)
    ov += ["baselines=false", "pe.variation=paraphrase", "control=false", "probe.enabled=false"]
    if nn:
        ov += ["score.mode=nn-histogram", "score.threshold=0"]
    if pool:
        ov += ["pool=chosen"]
    if release:
        ov += ["release=true", "dpo.select_on=public"]
    if method == "pe" and release:
        # release-mode noise comes from the OS, not the seed: with 8 texts a round the noisy
        # votes sometimes fell on 2 texts, too few distinct seeds for Expand's 3-shot prompts
        # (a refusal, tested in test_expand.py); with 16 a round it still happened (once in CI
        # here: the threshold H = z * M at z = 6 left one text a round).  No threshold: every
        # text with a positive noisy vote can be drawn, many distinct ones a round
        ov += ["pe.num_syn=16", "pe.threshold=0"]
    r = _run(popri_cmd(ov)[3:], full_env=env())
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((run / "results.json").read_text())
    assert res["epsilon"] == pytest.approx(1.0, abs=2e-3)
    if release:  # the run stops at its release: nothing evaluated on the private splits
        from test_release_fields import check_release_run

        assert res["methods"] == {} and res["released"] == str(run / "synthetic.jsonl")
        assert f"released: {run / 'synthetic.jsonl'}" in r.stdout
        assert not (run / "eval").exists() and not (run / "downstream").exists()
        check_release_run(run, data, r.stdout + r.stderr)
    else:
        assert list(res["methods"]) == [method]
    assert_plan_equals_record(run, {"round1-score", "round2-score"})
    syn = [json.loads(l) for l in open(run / "synthetic.jsonl")]
    assert len(syn) == 12
    if method == "pe":
        # T rounds of votes -> draws; one variation step between them; seeds -> expand
        for t in (1, 2):
            assert (run / f"round{t}" / "hist.npy").exists()
            assert len((run / f"round{t}" / "survivors.jsonl").read_text().splitlines()) == 16
        assert (run / "round2" / "population.jsonl").exists()
        seeds = (run / "pe_seeds.jsonl").read_text().splitlines()
        assert 3 <= len(seeds) <= 32 and res["pe"]["seed_set"] == len(seeds)
        led = [json.loads(l) for t in (1, 2) for l in open(run / f"round{t}" / "ledger.jsonl")]
        assert {e["params"].get("mode") for e in led} == {"nn-histogram"} or all(
            e["sensitivity"] == 8 for e in led)
        assert r.stdout.startswith("PE on ") and "released: " in r.stdout
    if pool:
        # round 1's chosen samples (one per prompt) are round 2's and the final set's examples
        p1 = [json.loads(x) for x in (run / "round1" / "pool.jsonl").read_text().splitlines()]
        assert p1 and {r["source"] for r in p1} == {"round1"}
        ids1 = {r["id"] for r in p1}
        prompts2 = [json.loads(x) for x in (run / "round2" / "prompts.jsonl").read_text()
                    .splitlines()]
        assert all(set(p["examples"]) <= ids1 for p in prompts2)
        p2 = [json.loads(x) for x in (run / "round2" / "pool.jsonl").read_text().splitlines()]
        assert ids1 < {r["id"] for r in p2}
    if nn:
        side = json.loads((run / "round1" / "scores.json").read_text())
        assert side["mode"] == "nn-histogram"
        assert len((run / "round1" / "prefs.jsonl").read_text().splitlines()) == 3
        assert (run / "round2" / "dpo" / "adapter").is_dir()
    elif method != "pe":
        assert (run / "round2" / "sft" / "adapter").is_dir()
        assert not (run / "round1" / "prefs.jsonl").exists()
        assert "| PE+SFT |" in r.stdout


@pytest.mark.slow
def test_slow_embedded_default_reduced_on_real_models(tmp_path):
    """The README's main job at reduced size on the real SmolLM2-135M / MiniLM (offline)."""
    # 4 texts per client (default 16: fetch and embed), 24 new tokens (default 85; 48 until
    # 2026-12-08: beside the other worker the three generation stages took 240 of this test's
    # 620 s), one DPO epoch (default 2), 16 val / test records (48 before: alone on the box the
    # run took 219 s, of which the three downstream arms' training 90 s and the four
    # evaluations 29 s)
    ov = [f"run_dir={tmp_path / 'run'}", "rounds=1", "prompts=3", "num_synthetic=18",
          "downstream.eval_max_samples=16", "downstream.epochs=1", "dpo.select_checkpoint=false",
          "data.max_samples_per_client=4", "generator.max_new_tokens=24", "dpo.epochs=1"]
    repo = Path(__file__).resolve().parents[1]
    e = env()
    e["POPRI_THREADS"] = "2"
    r = subprocess.run([*popri_cmd(ov)[:4], str(repo / "examples" / "default.yaml"),
                        *[f"--set={o}" for o in ov]], capture_output=True, text=True, env=e,
                       timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    m = res["methods"]
    assert 0.1 < m["eps0"]["accuracy"] < 0.5 and m["epsinf"]["accuracy"] > m["eps0"]["accuracy"]
    assert res["epsilon"] == pytest.approx(1.0, abs=2e-3)
    assert "| POPri |" in r.stdout
    # the control row (the untuned generator) on the real models, and its learning line
    assert "t0" in m and 0.0 < m["t0"]["accuracy"] < 1.0
    assert "learning: POPri minus its T = 0 row" in r.stdout
    # issue 65's common random numbers on the real models: the method, its control and the
    # size-matched eps = inf row start from the same weights and take the same batches
    streams = {a: json.loads((tmp_path / "run" / "downstream" / a / "metrics.json")
                             .read_text())["streams"] for a in ("popri", "t0", "epsinf")}
    assert len({(s["init_sha256"], s["order_sha256"], s["seed"]) for s in streams.values()}) == 1
    (row,) = res["draws"]
    assert set(row["arms"]) == {"popri", "t0"} and row["streams"] == {
        "generation": 0, "training": 0, "test": 0}
    assert row["arms"]["t0"]["accuracy"] == m["t0"]["accuracy"]
