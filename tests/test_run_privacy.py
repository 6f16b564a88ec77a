"""`popri run` and the global --config, issue 9 sections 3-5: config errors (exit 2, before any
stage), a dry run that is right and has no side effects, a run total over EVERY ledger under the
run directory (diagnostics write none), release mode, the budget guard, and the DPO
checkpoint-selection choices (private / public / dp / none).

Fast: no model runs (tiny embedding sets, dry runs, the stage runner on 'popri score' with .npy
inputs)."""

from __future__ import annotations

import json
from pathlib import Path
import shlex
import sys

import numpy as np
import pytest

from conftest import assert_one_line_error, _run, write_jsonl
from test_run_e2e import tiny_inputs  # noqa: F401  (fixture)
from popri.methods import steps
from popri.specs.commands.account import AccountEpsilonCall
from popri.pipeline import config as C
from popri.core.errors import ConfigError
from popri.core.io import save_embedding_set
from popri.privacy.ledger import LedgerEntry, read_ledger
from popri.pipeline.driver import BudgetError, Run, results_table
from popri.pipeline.results import collect
from popri.privacy import accounting as A
from popri.privacy import calibration
from popri.kit import DPRelease, Stage
from popri.privacy.plan import Noise
from popri.pipeline.stages import StageRunner

WORDS = ("river market winter council harvest railway treaty budget school harbor army labor "
         "court senate tariff union farmer coal steel bank trade navy").split()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A federated dataset directory (48 clients, whitespace tokens): data.dir for runs whose
    client count must be known before any stage."""
    d = tmp_path_factory.mktemp("fed")
    rng = np.random.default_rng(0)
    write_jsonl(d / "priv.jsonl", [
        {"user": f"u{i % 48}", "text": " ".join(rng.choice(WORDS, size=9)).capitalize() + "."}
        for i in range(288)])
    _run(["bench", "fetch", d / "priv.jsonl", "--client-column", "user", "--out", d / "data",
          "--seed", "0", "--tokenizer", "whitespace"],
         env={"POPRI_CACHE": str(d / "cache"), "HF_HUB_OFFLINE": "1"}, check=True)
    return d / "data"


def _train_clients(data) -> int:
    return json.loads((data / "manifest.json").read_text())["counts"]["train"]["clients"]


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def _one_line_error(p, *needles):
    return assert_one_line_error(p, *needles, no_stdout=True)


# --------------------------------------------------------------------------- global --config
@pytest.mark.parametrize("text,field,known", [
    ("score: {clip_norm: 0.1}\n", "score.clip_norm", "clip"),
    ("scor: {clip: 0.1}\n", "scor", "score"),
    ("bench: {fetch: {bogus: 1}}\n", "bench.fetch.bogus", "max_samples_per_client"),
    ("account: {ledgr: {json: true}}\n", "account.ledgr", "ledger"),
    ("fred: {stats: {epsilonn: 0.5}}\n", "fred.stats.epsilonn", "epsilon"),
    ("threads: 2\n", "threads", "score"),
    ("account: 3\n", "account", "mapping"),
])
def test_global_config_refuses_unknown_keys_and_sections(tmp_path, run_popri, text, field, known):
    """Before: an unknown key or section was ignored (score: {clip_norm: 0.1} ran with clip 1)."""
    cfg = tmp_path / "popri.yaml"
    cfg.write_text(text)
    p = run_popri(["--config", cfg, "account", "epsilon", "-z", "2", "-q", "1", "-T", "1"])
    line = _one_line_error(p, str(cfg), f"'{field}'", known)
    assert "known:" in line or "mapping" in line


@pytest.mark.parametrize("key", ["json", "as_json"])
def test_global_config_keys_are_options_by_name_or_long_flag(tmp_path, run_popri, key):
    """Nested groups (account: {epsilon: ...}) reach their command; a key may be the parameter
    name or its long option (json for --json), with '-' or '_'."""
    cfg = tmp_path / "popri.yaml"
    cfg.write_text(f"account:\n  epsilon: {{{key}: true, delta: 1.0e-5}}\n")
    p = run_popri(["--config", cfg, "account", "epsilon", "-z", "2", "-q", "1", "-T", "1"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["delta"] == 1e-5


# --------------------------------------------------------------------------- config ranges
@pytest.mark.parametrize("override,field", [
    ("privacy.epsilon=-1", "privacy.epsilon"), ("privacy.epsilon=.inf", "privacy.epsilon"),
    ("privacy.epsilon=.nan", "privacy.epsilon"), ("privacy.delta=1", "privacy.delta"),
    ("privacy.delta=nan", "privacy.delta"),
    ("privacy.noise_multiplier=0", "privacy.noise_multiplier"),
    ("privacy.noise_multiplier=1e308", "privacy.noise_multiplier"),
    ("privacy.accountant=gdp", "privacy.accountant"),
    ("score.clip=-2", "score.clip"), ("score.clip=1e400", "score.clip"),
    ("score.clients_per_round=0", "score.clients_per_round"),
    ("score.sample_rate=1.5", "score.sample_rate"), ("score.threshold=-1", "score.threshold"),
    ("rounds=0", "rounds"), ("rounds=.inf", "rounds"), ("prompts=0", "prompts"),
    ("seed=-1", "seed"),
    ("generator.top_p=0", "generator.top_p"), ("generator.temperature=-1", "generator.temperature"),
    ("generator.backend=tgi", "generator.backend"), ("dpo.beta=0", "dpo.beta"),
    ("dpo.lr=.nan", "dpo.lr"), ("dpo.rejected_rank=7", "dpo.rejected_rank"),
    ("dpo.select_on=val", "dpo.select_on"), ("dpo.select_epsilon=-1", "dpo.select_epsilon"),
    ("pe.mask_ratio=0", "pe.mask_ratio"), ("downstream.lr=.inf", "downstream.lr"),
    ("downstream.bootstrap=1", "downstream.bootstrap"),
    ("data.public_source=", "data.public_source"),
    ("release=maybe", "release"),
    ("privacy=3", "privacy"), ("embedder=''", "embedder"),
])
def test_every_config_value_is_range_checked(override, field):
    """Before: privacy.epsilon=-1 was a traceback; score.clip=-2 and clients_per_round=0 passed
    the config check and failed after fetch, embed and gen; inf/nan went through."""
    with pytest.raises(ConfigError) as e:
        C.load(None, [override])
    assert e.value.field == field and e.value.exit_code == 2
    assert e.value.path == f"--set {override.split('=')[0]}"


def test_combinations_are_checked_and_yaml_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="not both"):
        C.load(None, ["score.clients_per_round=5", "score.sample_rate=0.1"])
    with pytest.raises(ConfigError, match="privacy.epsilon"):
        C.load(None, ["privacy.epsilon=null"])
    with pytest.raises(ConfigError, match="select_checkpoint"):
        C.load(None, ["dpo.select_checkpoint=false", "dpo.select_on=public"])
    # a fixed count replaces the default Poisson rate (no "both" error): replace one client
    cfg = C.load(None, ["score.clients_per_round=5"])
    assert (cfg.score.clients_per_round, cfg.score.sample_rate) == (5, None)
    y = tmp_path / "bad.yaml"
    y.write_text("privacy:\n  epsilon: -1\n")
    with pytest.raises(ConfigError) as e:
        C.load(str(y))
    assert e.value.path == str(y) and e.value.field == "privacy.epsilon"


@pytest.mark.parametrize("override", ["privacy.epsilon=-1", "score.clip=-2",
                                      "score.clients_per_round=0"])
def test_run_config_errors_exit_2_before_anything(tmp_path, run_popri, override):
    run = tmp_path / "run"
    p = run_popri(["run", "--dry-run", "--set", f"run_dir={run}", "--set", override])
    _one_line_error(p, override.split("=")[0])
    assert not run.exists()


@pytest.mark.parametrize("override,field", [("data.dir=/nonexistent", "data.dir"),
                                            ("data.public_source=/no.jsonl", "data.public_source")])
def test_missing_input_files_stop_a_run_before_any_stage(tmp_path, run_popri, override, field):
    """A dry run still plans (and notes it); a real run stops before its first stage."""
    run = tmp_path / "run"
    p = run_popri(["run", "--set", f"run_dir={run}", "--set", override])
    _one_line_error(p, f"'{field}'")
    assert not run.exists()
    p = run_popri(["run", "--dry-run", "--set", f"run_dir={run}", "--set", override])
    assert p.returncode == 0 and "a real run would stop here" in p.stdout and not run.exists()


def test_clients_per_round_above_the_client_count_is_refused_before_any_stage(tmp_path, dataset,
                                                                           run_popri):
    """Before: q silently became 1 (min(1, L/N)) and score failed after fetch, embed and gen."""
    run = tmp_path / "run"
    p = run_popri(["run", "--set", f"run_dir={run}", "--set", f"data.dir={dataset}",
                   "--set", "score.clients_per_round=1000", "--set", "embedder=/nonexistent"])
    _one_line_error(p, "score.clients_per_round", f"{_train_clients(dataset)} clients")
    assert not run.exists()


# --------------------------------------------------------------------------- dry run
def _score_z(plan: str) -> list[str]:
    return [shlex.split(c)[shlex.split(c).index("--noise-multiplier") + 1]
            for c in plan.splitlines() if c.startswith("popri score ")]


def test_dry_run_plan_is_right_goes_to_stdout_and_writes_nothing(tmp_path, dataset, run_popri):
    """Before: z calibrated at q = 1 with 0 clients (6.09 where the run used 3.68), the plan on
    stderr, commands.sh and config.resolved.json written, commands.sh appended on every call."""
    run = tmp_path / "run"
    args = ["run", "--dry-run", "--set", f"run_dir={run}", "--set", f"data.dir={dataset}",
            "--set", "score.clients_per_round=12", "--set", "rounds=2",
            "--set", "dpo.select_on=none"]
    p = run_popri(args)
    assert p.returncode == 0, p.stderr
    N = _train_clients(dataset)
    # 12 of N a round: sampling without replacement under replace one client
    z = calibration.noise_multiplier(1.0, 12 / N, 2, 3e-6, "rdp", sampling="fixed")
    assert _score_z(p.stdout) == [repr(z)] * 2
    assert f"z={z:.4f}" in p.stdout and f"q={12 / N:.4g}" in p.stdout
    assert "run: [" not in p.stderr and not run.exists()
    assert run_popri(args).stdout == p.stdout and not run.exists()  # no state, same plan
    # a fixed 50 of N (N unknown before the fetch): z is not made up
    run2 = tmp_path / "run2"
    p = run_popri(["run", "--dry-run", "--set", f"run_dir={run2}",
                   "--set", "score.clients_per_round=50"])
    assert p.returncode == 0, p.stderr
    assert "z is set after the fetch" in p.stdout
    assert set(_score_z(p.stdout)) == {"<z: set after the fetch>"}
    assert not run2.exists()


def test_commands_sh_is_rewritten_by_each_run_not_appended(tmp_path):
    out = tmp_path / "eps.json"

    def stage(z):
        return Stage("eps", AccountEpsilonCall(noise_multiplier=float(z), sample_rate=1.0,
                                               steps=1, as_json=True),
                     outputs=[str(out)], stdout_to=str(out))

    StageRunner(tmp_path).run(stage("2.0"))
    first = (tmp_path / "commands.sh").read_text().splitlines()
    StageRunner(tmp_path).run(stage("3.0"))        # ran again
    StageRunner(tmp_path).run(stage("3.0"))        # skipped: still listed
    again = (tmp_path / "commands.sh").read_text().splitlines()
    assert len(again) == len(first)
    assert [c for c in again if c.startswith("popri ")] == [
        "popri account epsilon --noise-multiplier 3.0 --sample-rate 1.0 --steps 1 --json > "
        + shlex.quote(str(out))]
    dry = StageRunner(tmp_path / "dry", dry_run=True)
    dry.run(stage("4.0"))
    assert dry.commands and not (tmp_path / "dry").exists()


# --------------------------------------------------------------------------- run total
def _emb_set(path, x, clients=None, model="m"):
    rows = [{"id": f"s{i}", **({"client_id": f"c{clients[i]}"} if clients is not None else {})}
            for i in range(len(x))]
    save_embedding_set(path, x, rows, {"model": model, "normalize": True})
    return path


def _unit(rng, n, d=8):
    x = rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_run_total_is_every_ledger_under_the_run_and_diagnostics_record_nothing(tmp_path,
                                                                                dataset):
    """Before: the noise-free recovery-rate scores ('score --noise-multiplier 0' into
    RUN/diagnostics) wrote a z = 0 ledger, so 'popri account ledger RUN' (as the README says)
    was epsilon = inf; the run's own total read a hard-coded list of round ledgers."""
    rng = np.random.default_rng(0)
    run = tmp_path / "run"
    cfg = C.load(None, ["score.sample_rate=null", "rounds=2", "dpo.select_on=none",
                        f"run_dir={run}", f"data.dir={dataset}", "rounds=2", "embedder=m",
                        "privacy.epsilon=1", "score.recovery_rate=true"])
    r = Run(cfg)
    r.budget.plan()
    _emb_set(r.paths.emb_private, _unit(rng, 120), clients=np.arange(120) // 4)
    for t in (1, 2):
        syn = _emb_set(run / f"round{t}" / "samples.npy", _unit(rng, 10))
        r.stage(steps.score_stage(r, t, syn, run / f"round{t}" / "scores.npy", seed=t))
        st = steps.exact_stage(r, t, syn, seed=t)
        r.stage(st)
        exact = Path(st.outputs[0])
        side = json.loads(exact.with_suffix(".json").read_text())
        assert side.get("diagnostic") is True and side.get("private") is False
    assert not list((run / "diagnostics").rglob("ledger.jsonl"))
    r.account_stage()
    assert r.runner.commands[-1].startswith(f"popri account ledger {run} ")
    total = json.loads((run / "privacy.json").read_text())
    assert total["epsilon"] is not None and total["entries"] == 2
    assert total["epsilon"] == pytest.approx(1.0, abs=1e-3) and total["epsilon"] <= 1.0
    p = _run(["account", "ledger", run, "--json"])            # what the README suggests
    assert p.returncode == 0 and json.loads(p.stdout)["epsilon"] == pytest.approx(1.0, abs=1e-3)
    # a release anywhere under the run counts in the run's total
    extra = LedgerEntry(stage="score", mechanism="gaussian", noise_multiplier=5.0,
                        sample_rate=1.0, steps=1, delta=3e-6, sensitivity=1.0,
                        release_id="elsewhere")
    (run / "elsewhere").mkdir()
    (run / "elsewhere" / "ledger.jsonl").write_text(json.dumps(extra.to_dict()) + "\n")
    r2 = Run(cfg)
    r2.account_stage()
    assert json.loads((run / "privacy.json").read_text())["entries"] == 3


# --------------------------------------------------------------------------- release mode
def _plan(run_popri, run, *sets, flags=()):
    sets = ("rounds=2", "score.sample_rate=null", *sets)  # T = 2, q = 1
    p = run_popri(["run", "--dry-run", *flags, "--set", f"run_dir={run}",
                   *[a for s in sets for a in ("--set", s)]])
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_release_mode_reaches_every_dp_and_sampling_stage(tmp_path, run_popri):
    """`popri run --release` (config key release) passes --release to score, fred stats and
    pe draw; the noise-free diagnostic is not planned; the plan states the mode."""
    plan = _plan(run_popri, tmp_path / "a", "dpo.select_on=dp", flags=["--release"])
    cmds = [c for c in plan.splitlines() if c.startswith("popri ")]
    dp = [c for c in cmds if c.startswith(("popri score", "popri fred stats"))]
    assert len(dp) == 3 and all(" --release" in c for c in dp)
    assert not any("--diagnostic" in c for c in cmds)
    assert "release mode: OS CSPRNG, discretised Gaussian" in plan
    pe = _plan(run_popri, tmp_path / "b", "method=pe", "release=true")
    draws = [c for c in pe.splitlines() if c.startswith(("popri pe draw", "popri score"))]
    assert len(draws) == 4 and all(" --release" in c for c in draws)
    research = _plan(run_popri, tmp_path / "c")
    assert "--release" not in research and "--diagnostic" in research
    assert "research mode: noise is seeded and reproducible from the sidecars" in research


def test_release_run_ends_at_its_release_and_refuses_unnoised_reads(tmp_path, run_popri):
    """Release mode plans no stage that writes an exact statistic of the clients' data: no
    evaluation on the private splits (accuracy per test client, FID, eps = inf, the control and
    its draws), the clients' embedding stages run quiet; the probe and private checkpoint
    selection are refused with one line naming the field (tests/test_release_fields.py
    enumerates what a real release run writes)."""
    plan = _plan(run_popri, tmp_path / "a", "dpo.select_on=public", "draws=2",
                 flags=["--release"])
    cmds = [x for x in plan.splitlines() if x.startswith("popri ")]
    assert cmds and not [x for x in cmds if x.split()[1] in ("eval", "train-downstream")]
    quiet = [x for x in cmds if x.startswith("popri --quiet embed ")]
    assert len(quiet) == 2 and all("embeddings/public" not in x for x in quiet)
    assert "the run stops at its release" in plan
    research = _plan(run_popri, tmp_path / "b", "draws=2")
    assert [x for x in research.splitlines() if x.startswith("popri eval accuracy")]
    for extra, field in ((["probe.enabled=true", "dpo.select_on=none"], "probe.enabled"),
                         (["dpo.select_on=private"], "dpo.select_on")):
        with pytest.raises(ConfigError) as e:
            C.load(None, [f"run_dir={tmp_path / 'c'}", "release=true", *extra])
        assert e.value.field == field and "release mode" in str(e.value)
    C.load(None, [f"run_dir={tmp_path / 'c'}", "release=true", "method=pe"])  # PE selects none
    C.load(None, [f"run_dir={tmp_path / 'c'}", "release=true"])  # the default selection is DP


@pytest.mark.parametrize("release,select,notes", [
    (False, "private", ["research mode: noise is seeded and reproducible from the sidecars; "
                        "not for release",
                        "checkpoint selection: the EXACT private validation split, NOT "
                        "covered by epsilon",
                        # every research read of the private splits is named as such
                        "NOT covered by epsilon (research reads of the private splits",
                        "the evaluation on the private test split",
                        "checkpoint selection on the exact private validation split"]),
    (True, "public", ["release mode: OS CSPRNG, discretised Gaussian",
                      "checkpoint selection: public Omega embeddings",
                      "recovery rate: not computed in release mode"]),
    (False, "dp", ["checkpoint selection: DP mean of the private validation split",
                   "included in the total epsilon"]),
    (False, "none", ["checkpoint selection: none (the last epoch's adapter)"]),
])
def test_results_state_the_mode_and_what_checkpoint_selection_reads(tmp_path, release, select,
                                                                    notes):
    run = tmp_path / "run"
    run.mkdir()
    (run / "privacy.json").write_text(json.dumps({"epsilon": 0.999, "delta": 3e-6,
                                                  "accountant": "rdp"}))
    cfg = C.load(None, ["score.sample_rate=null", "rounds=2",
                        f"run_dir={run}", f"release={str(release).lower()}",
                        f"dpo.select_on={select}"])
    (run / "eval").mkdir()  # an evaluation left by an earlier research run in the directory
    (run / "eval" / "popri.json").write_text(json.dumps({"accuracy": 0.3, "clients": 13}))
    res = collect(Run(cfg), Noise(z=3.0, sample_rate=0.5))
    assert res["mode"] == ("release" if release else "research")
    assert res["methods"] == ({} if release else {"popri": {
        "accuracy": 0.3, "accuracy_se": None, "loss": None, "tokens": None, "clients": 13}})
    assert ("released" in res) == release
    assert res["checkpoint_selection"]["on"] == select
    table = results_table(res)
    for n in notes:
        assert n in table, (n, table)


# --------------------------------------------------------------------------- budget guard
def test_a_plan_over_budget_is_refused_before_anything(tmp_path, dataset, run_popri):
    """privacy.noise_multiplier too small for privacy.epsilon: exit 2 before the first stage
    (before: the run went ahead and spent epsilon ~7 against a budget of 1)."""
    run = tmp_path / "run"
    base = ["run", "--set", f"run_dir={run}", "--set", f"data.dir={dataset}",
            "--set", "privacy.noise_multiplier=0.5", "--set", "embedder=/nonexistent",
            "--set", "score.sample_rate=null", "--set", "rounds=2"]
    _one_line_error(run_popri(base), "privacy.epsilon", "budget")
    _one_line_error(run_popri([*base, "--dry-run"]), "budget")
    assert not run.exists()


def test_a_spent_release_in_the_run_dir_blocks_the_run(tmp_path, dataset, run_popri):
    run = tmp_path / "run"
    spent = LedgerEntry(stage="score", mechanism="gaussian", noise_multiplier=1.0,
                        sample_rate=1.0, steps=1, delta=3e-6, sensitivity=1.0, release_id="old")
    (run / "old").mkdir(parents=True)
    (run / "old" / "ledger.jsonl").write_text(json.dumps(spent.to_dict()) + "\n")
    before = _files(run)
    p = run_popri(["run", "--set", f"run_dir={run}", "--set", f"data.dir={dataset}",
                   "--set", "embedder=/nonexistent", "--set", "score.clients_per_round=20"])
    _one_line_error(p, "privacy.epsilon", "budget", str(run))
    assert _files(run) == before


def test_stage_guard_counts_every_prior_release_and_a_seeded_rerun_once(tmp_path):
    run = tmp_path / "run"
    cfg = C.load(None, ["score.sample_rate=null", "rounds=2", "dpo.select_on=none",
                        f"run_dir={run}", "rounds=2", "privacy.epsilon=1"])
    r = Run(cfg)
    r.budget.plan()                               # q = 1: no client count needed
    name, entries, own, match = r.dp_stages()[0]
    assert name == "round1-score"
    before = r.budget.guard(name, DPRelease(entries, own, match), r.runner)

    def record(rid):
        own.parent.mkdir(parents=True, exist_ok=True)
        e = LedgerEntry(**{**entries[0].to_dict(), "release_id": rid})
        with open(own, "a") as fh:
            fh.write(json.dumps(e.to_dict()) + "\n")

    record("a")                                   # an earlier attempt of round 1 (spent)
    before("k1")                                  # a + this = 2 of T = 2 rounds: within budget
    record("b")                                   # ... this attempt recorded, then killed
    before("k1")                                  # same key, research mode: b is this release
    assert len(read_ledger(own)) == 2
    with pytest.raises(BudgetError, match="stage round1-score would take the run"):
        before("k2")                              # other inputs: a new release on top of a, b
    rel = Run(C.load(None, ["score.sample_rate=null", "rounds=2",
                        f"run_dir={run}", "rounds=2", "release=true", "dpo.select_on=none"]))
    rel.budget.plan()
    with pytest.raises(BudgetError):              # release mode: every run is a new release
        rel.budget.guard(name, DPRelease(rel.dp_stages()[0][1], own, match), rel.runner)("k1")
    # a refusing guard stops the stage: it does not run, no marker
    out = tmp_path / "x.json"
    st = Stage("x", AccountEpsilonCall(noise_multiplier=2.0, sample_rate=1.0, steps=1),
               outputs=[str(out)],
               stdout_to=str(out), before=lambda key: (_ for _ in ()).throw(BudgetError("no")))
    with pytest.raises(BudgetError):
        StageRunner(tmp_path).run(st)
    assert not out.exists() and not (tmp_path / ".stages" / "x.json").exists()


# --------------------------------------------------------------------------- checkpoint selection
def test_select_on_plans_each_target_and_dp_shares_the_budget(tmp_path, dataset):
    def plan(select):
        cfg = C.load(None, [f"run_dir={tmp_path / select}", f"data.dir={dataset}", "rounds=2",
                            f"dpo.select_on={select}", "score.clients_per_round=12"])
        r = Run(cfg, dry_run=True)
        r.execute()
        dpo = [c for c in r.runner.commands if c.startswith("popri dpo ")]
        return r, dpo

    r, dpo = plan("private")
    assert all("--select-on " + str(r.paths.emb_val) in c for c in dpo)
    r, dpo = plan("public")
    assert any(c.startswith("popri embed ") and str(r.paths.emb_public) in c
               for c in r.runner.commands)
    assert all("--select-on " + str(r.paths.emb_public) in c for c in dpo)
    r, dpo = plan("none")
    assert dpo and not any("--select-on" in c for c in dpo)
    z_private = Run(C.load(None, [f"run_dir={tmp_path}/p", f"data.dir={dataset}",
                                  "score.clients_per_round=12", "rounds=2",
                                  "dpo.select_on=private"])).budget.plan()
    r, dpo = plan("dp")
    fred = [c for c in r.runner.commands if c.startswith("popri fred stats ")]
    assert len(fred) == 1
    for flag in ("--level user", "--relation add-remove", "--calibration analytic",
                 f"--private {r.paths.emb_val}", "--epsilon 0.1"):
        assert flag in fred[0]
    assert all("--select-on " + str(r.paths.select_stats) in c for c in dpo)
    assert "--statistics mean" in fred[0]  # mean-cosine reads the mean alone: one release
    # the selection release is part of privacy.epsilon: more noise on the scores, and the whole
    # plan (the FreD mean + T score rounds) composes to the budget -- under replace one client,
    # the relation of the fixed 12 clients a round, the selection at twice its sensitivity
    assert r.noise.z > z_private.z
    planned = [e for _, entries, _, _ in r.dp_stages() for e in entries]
    assert len(planned) == 3
    c = A.compose(planned, 3e-6, "rdp")
    assert 0.999 <= c.epsilon <= 1.0 + 1e-6 and c.neighbouring == "replace one client"
    # select_by fid reads mean and covariance: two releases
    cfg = C.load(None, [f"run_dir={tmp_path / 'fid'}", f"data.dir={dataset}", "rounds=2",
                        "dpo.select_on=dp", "dpo.select_by=fid", "score.clients_per_round=12"])
    assert len(Run(cfg).selection_entries()) == 2


def test_dp_selection_that_alone_exceeds_the_budget_is_a_config_error(tmp_path):
    r = Run(C.load(None, ["score.sample_rate=null", "rounds=2",
                        f"run_dir={tmp_path}/r", "dpo.select_on=dp",
                               "dpo.select_epsilon=2"]))
    with pytest.raises(ConfigError, match="selection alone spends"):
        r.budget.plan()


def test_select_checkpoint_on_statistics_equals_on_the_embeddings():
    from popri.methods.popri.dpo import select_checkpoint
    from popri.models.fid import gaussian_stats

    rng = np.random.default_rng(1)
    val = rng.normal(size=(200, 4))
    shift = {"a": 1.0, "b": 0.1, "c": 0.5}
    gen = {k: rng.normal(size=(50, 4)) + v for k, v in shift.items()}
    kw = dict(base_model="m", generate_fn=lambda ck: [ck] * 50,
              embed_fn=lambda texts: gen[texts[0]])
    best_e, res_e = select_checkpoint(list(gen), val_embeddings=val, **kw)
    best_s, res_s = select_checkpoint(list(gen), val_stats=gaussian_stats(val), **kw)
    assert best_e == best_s == "b"
    assert [x["fid"] for x in res_e] == pytest.approx([x["fid"] for x in res_s])


def test_dpo_selects_on_fred_statistics(tmp_path, monkeypatch):
    """`popri dpo --select-on STATS.npz` (what select_on: dp passes): the Frechet distance to the
    DP mean and covariance; the embedder must match the statistics'."""
    import popri.models.embed as E
    import popri.models.generation as G
    from popri.cli.commands.dpo import _selector
    from popri.core.errors import InputError

    rng = np.random.default_rng(2)
    priv = _emb_set(tmp_path / "val.npy", rng.normal(size=(400, 4)) * 0.3,
                    clients=np.arange(400) // 4)
    stats = tmp_path / "sel" / "val_stats.npz"
    _run(["fred", "stats", "--private", priv, "--out", stats, "--epsilon", "2", "--delta", "1e-5",
          "--level", "user", "--relation", "add-remove", "--calibration", "analytic"], check=True)
    assert read_ledger(stats.parent / "ledger.jsonl")[0].neighbouring == "add/remove one client"
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Write.", "prompt_id": 0}])
    with pytest.raises(InputError, match="embedding"):
        _selector(str(stats), str(prompts), 8, "lm", 0, False, "other-model")
    shift = {"ck1": 2.0, "ck2": 0.0}
    monkeypatch.setattr(G, "generate", lambda prompts, adapter, **kw: (
        [{"text": adapter}] * kw["num_samples"], {}))
    monkeypatch.setattr(E, "embed_texts", lambda texts, model, **kw: (
        rng.normal(size=(len(texts), 4)) * 0.3 + shift[texts[0]]))
    import popri.models.lora as lora_lib

    monkeypatch.setattr(lora_lib, "save_adapter", lambda _m, dest, source: str(source))
    select = _selector(str(stats), str(prompts), 64, "lm", 0, False, "m")
    assert select(["ck1", "ck2"], tmp_path) == "ck2"
    sel = json.loads((tmp_path / "selection.json").read_text())
    assert "DP mean and covariance" in sel["criterion"] and sel["validation"] == str(stats)


# --------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_slow_release_run_with_dp_selection_end_to_end(tiny_inputs, tiny_lm, tiny_st_model,
                                                       tmp_path):
    """A real `popri run --release` with dpo.select_on: dp on tiny models: every DP stage in
    release mode, the selection release inside the budget, the run total = the budget, the
    table states both; a second run rewrites commands.sh and re-runs nothing."""
    import subprocess

    from test_run_e2e import env, popri_cmd, tiny_overrides

    data, pub = tiny_inputs
    run = tmp_path / "run"
    ov = tiny_overrides(run, data, pub, tiny_lm, tiny_st_model) + [
        "rounds=1", "baselines=false", "dpo.select_on=dp", "dpo.select_epsilon=0.2"]
    r = subprocess.run([*popri_cmd(ov), "--release"], capture_output=True, text=True, env=env(),
                       timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((run / "results.json").read_text())
    assert res["mode"] == "release" and res["checkpoint_selection"]["on"] == "dp"
    from conftest import assert_plan_equals_record

    assert_plan_equals_record(run, {"select-stats", "round1-score"})
    assert res["epsilon"] == pytest.approx(1.0, abs=2e-3) and res["epsilon"] <= 1.0 + 1e-6
    led = {p.parent.name: read_ledger(p) for p in run.rglob("ledger.jsonl")}
    assert sorted(led) == ["round1", "selection"]
    # select_by mean-cosine (the default) reads the mean alone: one release
    assert [(e.stage, e.params.get("release")) for e in led["selection"]] == [("fred", "mean")]
    assert all(e.mode == "release" for es in led.values() for e in es)
    assert not (run / "diagnostics").exists()
    sel = json.loads((run / "round1" / "dpo" / "selection.json").read_text())
    assert "DP mean of the validation split" in sel["criterion"]
    p = _run(["account", "ledger", run, "--json"])
    assert json.loads(p.stdout)["epsilon"] == pytest.approx(res["epsilon"])
    assert "release mode: OS CSPRNG, discretised Gaussian" in r.stdout
    assert "checkpoint selection: DP mean of the private validation split" in r.stdout
    lines = (run / "commands.sh").read_text().splitlines()
    r2 = subprocess.run([*popri_cmd(ov), "--release"], capture_output=True, text=True, env=env(),
                        timeout=1200)
    assert r2.returncode == 0 and r2.stderr.count(" done in ") == 0, r2.stderr[-3000:]
    assert (run / "commands.sh").read_text().splitlines() == lines


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
