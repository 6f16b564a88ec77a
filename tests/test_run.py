"""`popri run` machinery: config loading/overrides and the cached, resumable stage runner."""

import json

import pytest

from popri.specs.commands.account import AccountEpsilonCall, AccountLedgerCall
from popri.pipeline import config as C
from popri.core.errors import PopriError
from popri.pipeline.driver import Run
from popri.kit import Stage
from popri.pipeline.stages import StageRunner


def test_config_defaults_yaml_and_overrides(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("rounds: 3\ndpo:\n  beta: 0.1\nprivacy:\n  epsilon: 7\n")
    cfg = C.load(str(y), ["dpo.lr=2e-5", "score.clients_per_round=10", "run_dir=x"])
    assert cfg.rounds == 3 and cfg.dpo.beta == 0.1 and cfg.dpo.lr == 2e-5
    assert cfg.dpo.lora_r == 4 and cfg.privacy.delta == 3e-6  # untouched defaults stay
    assert cfg.privacy.epsilon == 7.0 and cfg.score.clients_per_round == 10 and cfg.run_dir == "x"


@pytest.mark.parametrize("override,msg", [("dpo.lrr=1", "field 'dpo.lrr': unknown key"),
                                          ("rounds=abc", "expects int"),
                                          ("rounds", "key=value")])
def test_config_errors_are_clear(override, msg):
    with pytest.raises(PopriError, match=msg):
        C.load(None, [override])


def _eps_stage(out, z="2.0"):
    return Stage("eps", AccountEpsilonCall(noise_multiplier=float(z), sample_rate=1.0, steps=1,
                                           as_json=True),
                 outputs=[str(out)], stdout_to=str(out))


def test_stage_runs_once_then_skips_and_reruns_on_change(tmp_path):
    out = tmp_path / "eps.json"
    r = StageRunner(tmp_path)
    assert r.run(_eps_stage(out)) is True
    first = json.loads(out.read_text())
    assert first["noise_multiplier"] == 2.0
    assert StageRunner(tmp_path).run(_eps_stage(out)) is False      # unchanged: skipped
    assert StageRunner(tmp_path).run(_eps_stage(out, "3.0")) is True  # new parameter: re-run
    assert json.loads(out.read_text())["noise_multiplier"] == 3.0
    out.unlink()                                                      # output gone: re-run
    assert StageRunner(tmp_path).run(_eps_stage(out, "3.0")) is True
    assert "popri account epsilon" in (tmp_path / "commands.sh").read_text()


def test_downstream_stage_reruns_when_upstream_output_changes(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    r = StageRunner(tmp_path)
    r.run(_eps_stage(a))
    dep = Stage("dep", AccountLedgerCall(paths=(str(tmp_path / "ledger.jsonl"),), as_json=True),
                outputs=[str(b)], inputs=[str(a)], stdout_to=str(b))
    (tmp_path / "ledger.jsonl").write_text(json.dumps(
        {"stage": "s", "mechanism": "gaussian", "noise_multiplier": 2.0, "sample_rate": 1.0,
         "steps": 1, "delta": 1e-5, "sensitivity": 1.0, "release_id": "x"}) + "\n")
    assert r.run(dep) is True
    r2 = StageRunner(tmp_path)
    r2.run(_eps_stage(a))                 # same upstream: both skipped
    assert r2.run(dep) is False
    r3 = StageRunner(tmp_path)
    r3.run(_eps_stage(a, "5.0"))          # upstream re-ran with a new result: dep re-runs
    assert r3.run(dep) is True


def test_failed_stage_leaves_no_marker_and_names_the_command(tmp_path):
    out = tmp_path / "bad.json"
    # a sample rate of 7 the command refuses (a draft: the call itself would refuse it too)
    st = Stage("bad", AccountEpsilonCall.draft(noise_multiplier=1.0, sample_rate=7.0, steps=1),
               outputs=[str(out)],
               stdout_to=str(out))
    with pytest.raises(PopriError, match="stage bad failed"):
        StageRunner(tmp_path).run(st)
    assert not (tmp_path / ".stages" / "bad.json").exists() and not out.exists()


def test_dry_run_plans_every_stage_of_the_loop(tmp_path, capsys):
    cfg = C.load(None, [f"run_dir={tmp_path / 'run'}", "rounds=2", "privacy.noise_multiplier=1.5",
                        "privacy.epsilon=null", "probe.enabled=true"])
    run = Run(cfg, dry_run=True)
    run.execute()
    cmds = run.runner.commands
    names = [c.split()[1] for c in cmds]
    assert names[:2] == ["bench", "bench"]
    # 2 rounds + the synthetic set + the T = 0 control's set + 3 probes (rounds 0, 1, 2)
    assert names.count("gen") == 7 and names.count("dpo") == 2 and names.count("prefs") == 2
    assert sum(" eval probe " in f" {c} " for c in cmds) == 3
    assert any("synthetic_t0.jsonl" in c and "--adapter" not in c for c in cmds)
    assert any(" eval diff " in f" {c} " for c in cmds)
    assert names.count("train-downstream") == 3 and names[-1] == "account"
    round2_gen = [c for c in cmds if " gen " in f" {c} " and "--round 2" in c
                  and "samples.jsonl" in c][0]
    assert "--adapter" in round2_gen and "round1/dpo/adapter" in round2_gen
    assert any("--noise-multiplier 1.5" in c for c in cmds)


def test_dry_run_plans_the_pe_loop_with_the_paper_threshold(tmp_path):
    """PrE-Text: init -> T x (vote, draw) with T - 1 variation steps -> seeds -> expand; H = z*M."""
    cfg = C.load(None, [f"run_dir={tmp_path / 'run'}", "method=pe", "rounds=3", "pe.lookahead=2",
                        "privacy.noise_multiplier=2.1793", "score.max_samples_per_client=8",
                        "privacy.epsilon=null"])
    run = Run(cfg, dry_run=True)
    run.execute()
    cmds = run.runner.commands
    sub = [" ".join(c.split()[1:3]) for c in cmds]
    assert sub.count("pe init") == 1 and sub.count("pe draw") == 3 and sub.count("pe seeds") == 1
    assert sum(1 for c in cmds if " vary " in f" {c} " and "--lookahead" in c) == 3
    assert sum(1 for c in cmds if " vary " in f" {c} " and "--lookahead" not in c) == 2
    assert "gen" not in [c.split()[1] for c in cmds] and "dpo" not in [c.split()[1] for c in cmds]
    scores = [c for c in cmds if c.split()[1] == "score"]
    assert len(scores) == 3 and all("--mode nn-histogram" in c for c in scores)
    assert all(f"--threshold {8 * 2.1793!r}" in c for c in scores)
    expand = [c for c in cmds if c.split()[1] == "expand"][0]
    assert "pe_seeds.jsonl" in expand and "--merged-out" in expand


@pytest.mark.parametrize("sets, batch", [([], 24), (["generator.backend=vllm"], 2048),
                                         (["generator.backend=vllm", "pe.expand_batch_size=7"], 7),
                                         (["generator.batch_size=5"], 24)])
def test_a_run_passes_expand_the_batch_in_effect(tmp_path, sets, batch):
    """Issue 39: expand's batch is pe.expand_batch_size, else the backend's (EXPAND_BATCH in
    specs/generation.py) -- not the generator's sampling batch, which a run used to pass."""
    from popri.specs.generation import EXPAND_BATCH

    cfg = C.load(None, [f"run_dir={tmp_path / 'run'}", "method=pe", "rounds=1",
                        "privacy.noise_multiplier=2", "privacy.epsilon=null", *sets])
    run = Run(cfg, dry_run=True)
    run.execute()
    (expand,) = [c for c in run.runner.commands if c.split()[1] == "expand"]
    assert f"--batch-size {batch} " in expand
    assert EXPAND_BATCH["transformers"] == 24 and EXPAND_BATCH["vllm"] == 2048


def test_method_and_modes_are_checked():
    with pytest.raises(PopriError, match="field 'method': must be one of"):
        C.load(None, ["method=dp-sgd"])
    with pytest.raises(PopriError, match="pe.variation"):
        C.load(None, ["pe.variation=shuffle"])


def test_draws_redraw_both_sets_with_the_next_seeds_and_pair_them(tmp_path):
    """``draws: 3`` (issue 24): the final set and its T = 0 control drawn twice more (the draw's
    own seed stream, ``draw_seed(seed, k)``; the same prompts and adapter), each trained with
    ``draw_seed(run seed, k)`` and evaluated, and paired."""
    from popri.kit import draw_seed

    cfg = C.load(None, [f"run_dir={tmp_path / 'run'}", "rounds=1", "draws=3", "seed=2",
                        "privacy.noise_multiplier=1.5", "privacy.epsilon=null"])
    run = Run(cfg, dry_run=True)
    run.execute()
    cmds = run.runner.commands
    syn = [c for c in cmds if " --num-samples " in c]
    assert len(syn) == 6  # the run's own pair + 2 draws x (method, control)
    own, t0 = syn[0], next(c for c in syn if "/synthetic_t0.jsonl" in c)
    for k in (1, 2):
        d = [c for c in syn if f"/draws/d{k}/" in c]
        sk = draw_seed(2999, k)
        # a stream of its own: not the next run seed's (draw k of seed s was round k - 1 of s + 1)
        assert sk not in (2999, 2999 + k, 3999, 3999 + k, 1999 + k)
        assert len(d) == 2 and all(f"--seed {sk}" in c for c in d)
        tuned = next(c for c in d if " --adapter " in c)
        # the same command as the run's own set but for its seed and outputs
        assert tuned.replace(f"draws/d{k}/", "").replace(f"--seed {sk}", "--seed 2999") == own
        untuned = next(c for c in d if " --adapter " not in c)
        assert untuned.replace(f"draws/d{k}/", "").replace(f"--seed {sk}", "--seed 2999") == t0
        assert any(f"downstream/popri-d{k} " in c and f"--seed {draw_seed(2, k)} " in c
                   for c in cmds)
        assert any(" eval diff " in c and f"eval/popri-d{k}.clients.jsonl" in c
                   and f"eval/t0-d{k}.clients.jsonl" in c and f"control-d{k}.json" in c
                   for c in cmds)
    with pytest.raises(PopriError, match="field 'draws'.*pe"):
        C.load(None, ["method=pe", "draws=2"])
    with pytest.raises(PopriError, match="field 'draws'.*control: false"):
        C.load(None, ["control=false", "draws=2"])
    with pytest.raises(PopriError, match="field 'draws'"):
        C.load(None, ["draws=0"])


def test_draws_summary_and_learning_line():
    from popri.pipeline.driver import draws_summary, results_table

    draws = [{"acc": 0.30, "acc_control": 0.31, "acc_minus_control": -0.01,
              "acc_minus_control_se": 0.003},
             {"acc": 0.32, "acc_control": 0.31, "acc_minus_control": 0.01,
              "acc_minus_control_se": 0.004},
             {"acc": 0.33, "acc_control": 0.30, "acc_minus_control": 0.03,
              "acc_minus_control_se": 0.005}]
    s = draws_summary(draws)
    assert s["n"] == 3 and s["mean"] == pytest.approx(0.01)
    assert s["se_between"] == pytest.approx(0.02 / 3 ** 0.5)  # stdev 0.02 over sqrt(3)
    assert s["se_within"] == pytest.approx((0.003 ** 2 + 0.004 ** 2 + 0.005 ** 2) ** 0.5 / 3)
    r = {"run_dir": "x", "epsilon": 1.0, "delta": 1e-6, "method": "popri", "rounds": 1,
         "prompts": 1, "samples_per_prompt": 2, "num_synthetic": 4, "generator": "g",
         "downstream": "d", "noise_multiplier": 1.0, "sample_rate": 1.0,
         "methods": {"popri": {"accuracy": 0.3}, "t0": {"accuracy": 0.31}},
         "control": {**draws[0], "draws": s}}
    line = next(x for x in results_table(r).splitlines() if x.startswith("learning:"))
    assert "over 3 draws" in line and "+0.0100 +- 0.0115" in line
    assert "-0.0100, +0.0100, +0.0300" in line


@pytest.mark.parametrize("text,field,lines", [
    ("run_dir: runs/x\nprivacy:\n  epsilon: 1\nprivacy:\n  epsilon: 100\n", "privacy", (4, 2)),
    ("privacy:\n  epsilon: 1\n  epsilon: 100\n", "privacy.epsilon", (3, 2)),
    ("score:\n  clip: 1\ndpo:\n  beta: 0.1\n  lr: 1e-4\n  beta: 0.5\n", "dpo.beta", (6, 4)),
])
def test_a_key_given_twice_in_a_yaml_config_is_an_error(tmp_path, text, field, lines):
    """Hostile case N5 (issue 66): YAML keeps the last of two equal keys, so a config with
    `privacy.epsilon` twice silently ran at epsilon 100; now a config error naming both."""
    f = tmp_path / "dup.yaml"
    f.write_text(text)
    with pytest.raises(PopriError, match=rf"field '{field}': duplicate key on line "
                                         rf"{lines[0]} \(first on line {lines[1]}\)"):
        C.load(str(f))
    f.write_text("privacy:\n  epsilon: 2\nscore:\n  clip: 1\n")  # the same key in two sections
    assert C.load(str(f)).privacy.epsilon == 2
