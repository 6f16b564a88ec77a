"""Release mode writes no exact statistic of the clients' data (issue 22, cases fl02, fl100,
ff72, env1, rr11, fw02-04): every DP-releasing command runs in release mode on tiny data, and
every file it writes and every JSON field in them is checked against an allowlist.  A new field
fails here until someone decides it is public (a setting, a shape, a noised value) and adds it.

    python -m pytest -q tests/test_release_fields.py

What is public: settings the user typed (q, z, C, L per round, the model), shapes (the
dimension, the number of synthetic samples), noised outputs and what is derived from them only,
the ledger's accounting parameters (the accountant needs them), ids and modes.  What is private
(add/remove-one-client neighbours): the number of clients N, the realised participants L under
Poisson sampling, example counts, update norms, clipped shares, losses, research seeds.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import emb_set, write_jsonl
from test_run_privacy import dataset  # noqa: F401  (fixture)

N_CLIENTS = 13  # private: must never be written (nor printed) in release mode

needs_flower = pytest.mark.skipif(__import__("importlib").util.find_spec("flwr") is None,
                                  reason="the flower extra is not installed")


def keys(obj, prefix: str = "") -> set[str]:
    """Every key path of a JSON value: ``a.b``, ``a[].c`` for a list of objects."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{k}" if prefix else k
            out.add(p)
            out |= keys(v, p)
    elif isinstance(obj, list):
        for v in obj:
            out |= keys(v, prefix + "[]")
    return out


#: model files a weights directory carries (the DP-trained weights and the public tokenizer)
MODEL_FILES = {"README.md", "adapter_config.json", "adapter_model.safetensors",
               "chat_template.jinja", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "generation_config.json", "config.json",
               "model.safetensors",
               # the base model's public tokenizer, in whichever files its tokenizer saves
               "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json"}
LEDGER = {"stage", "mechanism", "noise_multiplier", "sample_rate", "steps", "delta",
          "sensitivity", "sampling", "neighbouring", "release_id", "params", "mode",
          "popri_version"}
SCORE_PARAMS = {"mode", "round", "noise_multiplier", "clip", "standardize", "sample_rate",
                "clients_per_round", "sampling", "max_samples_per_client", "threshold",
                "release", "delta", "reduce", "public_clients", "embedding_model",
                # the relation the round is accounted under and the sum's sensitivity under it:
                # public (functions of the settings), issue 36
                "neighbouring", "sensitivity", "convention"}
FLOWER_ENGINE = {"engine", "engine.engine", "engine.supernodes_requested",
                 "engine.secagg_mechanism"}
#: the distributed discrete Gaussian's accounting record (its parameters are the plan's)
DDG_LEDGER = {"clip", "gamma", "bits", "dim", "min_noisy", "local_sigma", "beta", "delta2", "modulus",
              "noisy", "epsilon_cdp", "uploaders", "padded_dim", "rotation_seed", "vector_dim",
              # the relation's factor on the rounded bound and that bound (public: the plan)
              "sens_factor", "rounding_delta2"}


def _ledger_keys(params: set[str]) -> set[str]:
    return LEDGER | {f"params.{k}" for k in params}


def _score_side(extra_params=frozenset()) -> set[str]:
    p = SCORE_PARAMS | set(extra_params)
    return ({"ids", "mode", "round", "privacy_mode", "params", "ledger"}
            | {f"params.{k}" for k in p}
            | {f"ledger[].{k}" for k in _ledger_keys(
                p | {"noise"} | (DDG_LEDGER | {"secagg", "nominal_noise_multiplier"}
                                 if extra_params else set()))})


FL_SPEC = {"lora_r", "lora_alpha", "target_modules", "bf16", "max_length", "count_eos",
           "bos_token", "eos_token", "algorithm", "restart", "clip", "client_lr", "local_epochs",
           "client_batch_size", "server_lr", "momentum", "lora", "max_samples_per_client",
           "noise_multiplier", "clients_per_round", "sample_rate", "delta", "release",
           "engine", "supernodes", "secagg_mechanism", "max_dropout", "flower_timeout",
           "assignment", "epoch_rounds", "convention", "public_clients"}
FL_ROUND = ({"round", "model", "base_model", "spec", "algorithm", "sampling", "dim",
             "noise_multiplier", "noise_multiplier_guaranteed", "noise_std", "momentum",
             "server_lr", "mode", "release_id", "source", "engine", "sample_rate",
             "clients_per_round", "flower", "flower.supernodes_requested",
             "flower.secagg_mechanism", "neighbouring", "sensitivity",
             # public: a fixed L, or q times the declared --public-clients (public_count)
             "divisor", "public_clients"}
            | {f"spec.{k}" for k in FL_SPEC})
FL_MODEL_METRICS = {"model", "base_model", "lora", "trainable_parameters", "bos_token",
                    "eos_token", "fl_round", "algorithm"}
WEIGHTS_STATE = {"kind", "round", "client", "base_model", "lora", "lora.lora_r",
                 "lora.lora_alpha", "lora.target_modules", "mode", "seed"}
FFP_ROUND = {"round", "method", "beta", "weights", "noise_multiplier", "clip", "privacy",
             "mode", "release_id", "base_model", "neighbouring", "sensitivity"}
FFP_MODEL_METRICS = {"model", "base_model", "lora", "trainable_parameters", "method", "round"}
#: the marker's "files": the names of the files popri wrote in the directory (H08, issue 66)
MARKER = {"format", "kind", "popri_version", "files"}
#: a privacy-provenance companion (issue 66): the status of a public or DP output, the release
#: ids its chain holds, and the output's size / mtime / hash (the output is itself released)
PROVENANCE = {"format", "format_version", "status", "entries", "links", "pending", "file",
              "file.size", "file.mtime_ns", "file.sha256"}


def _provenance(path: Path) -> bool:
    return path.name == "provenance.json" or path.name.endswith(".provenance.json")


def check_provenance(path: Path) -> None:
    """A companion in release mode: only its allowlisted keys, and a released output's status
    is dp or public (or private, for the clients' own files)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    extra = sorted(keys(doc) - PROVENANCE)
    assert not extra, f"{path}: fields outside the provenance allowlist: {extra}"
    assert doc["status"] in ("dp", "public", "private") and not doc["pending"], (path, doc)
    if doc["status"] == "private":
        assert doc["file"] is None, f"{path}: a private file's size is not written"

#: relative path (glob) -> allowed JSON keys (None: not JSON, allowed as a whole)
ALLOW = {
    "score": {"s/scores.npy": None, "s/scores.json": _score_side(),
              "s/ledger.jsonl": _ledger_keys(SCORE_PARAMS | {"noise"})},
    "fl": {"R/ledger.jsonl": _ledger_keys({"round", "algorithm", "dim", "leaves"}),
           "R/r1/.popri-output": MARKER, "R/r1/theta.npy": None, "R/r1/server.npz": None,
           "R/r1/round.json": FL_ROUND, "R/r1/model/metrics.json": FL_MODEL_METRICS,
           **{f"R/r1/model/{f}": None for f in MODEL_FILES}},
    "fred": {"f/stats.npz": None, "f/ledger.jsonl": _ledger_keys(
        {"release", "epsilon", "delta", "calibration", "noise_std_on_sum", "claim", "noise"}),
        "f/stats.json": {"kind", "private", "dim", "privacy_mode", "n", "n_public",
                         "embedding_model", "normalize", "source", "split", "neighbouring",
                         "statistics", "params", "ledger"} | {f"params.{k}" for k in (
                             "epsilon", "delta", "clip", "relation", "level",
                             "max_samples_per_client", "calibration", "seed", "release",
                             "noise_multiplier", "mean_sensitivity", "cov_sensitivity",
                             "noise_std_sum1", "noise_std_sum2", "tau1", "tau2",
                             "count_public", "count_weight", "count_noise_std", "count_clamped",
                             "covariance", "noise_edge", "noise", "statistics")}
        | {f"ledger[].{k}" for k in _ledger_keys(
            {"release", "epsilon", "delta", "calibration", "noise_std_on_sum", "claim",
             "noise"})}},
    "ffp": {"G/ledger.jsonl": _ledger_keys({"round", "method"}),
            "G/r1/.popri-output": MARKER, "G/r1/theta.npy": None, "G/r1/state.json":
            WEIGHTS_STATE, "G/r1/round.json": FFP_ROUND,
            "G/r1/model/metrics.json": FFP_MODEL_METRICS,
            **{f"G/r1/model/{f}": None for f in MODEL_FILES}},
}
ALLOW["fl-flower"] = {k.replace("R/", "FR/"): v for k, v in ALLOW["fl"].items()}
ALLOW["fl-flower"]["FR/ledger.jsonl"] = _ledger_keys({"round", "algorithm"} | DDG_LEDGER)
ALLOW["score-flower"] = {"fw/scores.npy": None,
                         "fw/scores.json": _score_side(FLOWER_ENGINE),
                         "fw/ledger.jsonl": _ledger_keys(
                             SCORE_PARAMS | FLOWER_ENGINE | DDG_LEDGER
                             | {"noise", "nominal_noise_multiplier", "secagg"})}


def check_files(root: Path, allow: dict) -> None:
    """Every file under ``root`` is allowed, and so is every key of every JSON in it."""
    seen = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    for f in [f for f in seen if _provenance(root / f)]:
        check_provenance(root / f)
        seen.remove(f)
    unknown = [f for f in seen if f not in allow]
    assert not unknown, f"files written in release mode that no allowlist covers: {unknown}"
    for f in seen:
        want = allow[f]
        if want is None:
            continue
        text = (root / f).read_text(encoding="utf-8")
        docs = ([json.loads(x) for x in text.splitlines() if x.strip()]
                if f.endswith(".jsonl") else [json.loads(text)])
        got = set().union(*(keys(d) for d in docs))
        extra = sorted(got - want)
        assert not extra, f"{f}: fields written in release mode outside the allowlist: {extra}"


PRIVATE_LINE = re.compile(r"\b(\d+) (?:of \d+ )?(clients|participants|uploads|examples)\b"
                          r"|update norms? [\d.]|local loss [\d.]|clipped \d|n_k")


def scrub(err: str) -> str:
    """The log without what is public and may hold any number: paths, the stage lines' clock
    ("[2/3 13:35:41]"), ISO times, hashes and wall times ("done in 41 s", "running, 41 s",
    "6.5s")."""
    err = re.sub(r"\[\d+/[\d?]+ \d\d:\d\d:\d\d\]", "[STAGE]", err)
    err = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", "TIME", err)  # run identity
    err = re.sub(r"\b[0-9a-f]{16,40}\b", "HASH", err)  # config hash, git commit
    err = re.sub(r"(?<!\w)/\S+", "PATH", err)
    return re.sub(r"\b\d+(\.\d+)? ?s\b", "N s", err)


def check_stderr(err: str, public_counts=()) -> None:
    """No private count or statistic in the log: 'N clients' only for a public L per round."""
    for m in PRIVATE_LINE.finditer(err):
        if m.group(1) is not None and int(m.group(1)) in public_counts \
                and "clients per round" in err[m.start():m.end() + 20]:
            continue
        raise AssertionError(f"release mode printed a private statistic: {m.group(0)!r} in "
                             f"{err!r}")
    # the count as a number of its own ("13", "13.0"), not the digits inside another one: a
    # noised statistic such as fred's tau1 = s1 / n_hat may print as "2.13" (CI, stop 58)
    assert not re.search(count_pattern(N_CLIENTS), scrub(err)), err


def count_pattern(n: int) -> str:
    """A private count n as a number of its own ("13", "13.0", "(13)"), not as the digits
    inside another number ("2.13", "113", "13.5") nor inside a word ("c13")."""
    return rf"(?<![\w.]){n}(\.0+)?(?!\w|\.\d)"


def test_the_count_check_sees_the_count_and_not_the_digits_of_another_number():
    found = ["13 clients", "n=13", "n=13.0", "(13)", "13,", "13."]
    missed = ["tau1=2.13", "113", "13.5", "c13", "1.13e3", "z=9.69"]
    assert [t for t in found if not re.search(count_pattern(13), t)] == []
    assert [t for t in missed if re.search(count_pattern(13), t)] == []


# --------------------------------------------------------------------------- the commands
@pytest.fixture
def emb(tmp_path):
    rng = np.random.default_rng(0)
    cid = [f"c{i % N_CLIENTS}" for i in range(4 * N_CLIENTS)]
    emb_set(tmp_path / "in" / "priv.npy", rng.normal(size=(len(cid), 8)).astype(np.float32), cid)
    emb_set(tmp_path / "in" / "syn.npy", rng.normal(size=(10, 8)).astype(np.float32))
    return tmp_path / "in"


def _fl_data(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    return write_jsonl(d / "data.jsonl", [
        {"client_id": f"c{i % N_CLIENTS}", "text": f"the quick brown fox {i} jumps over"}
        for i in range(2 * N_CLIENTS)])


@pytest.mark.parametrize("mode,sampling,public", [
    ("cosine", ["--sample-rate", "0.5"], ()),
    ("nn-histogram", ["--clients-per-round", "5"], (5,)),
])
def test_fw04_score_release_writes_only_public_fields(emb, tmp_path, run_popri, mode, sampling,
                                                 public):
    out = tmp_path / "o"
    p = run_popri(["score", "--mode", mode, "--private", emb / "priv.npy", "--synthetic",
                   emb / "syn.npy", "-z", "1", *sampling, "--release", "--out",
                   out / "s" / "scores.npy"], check=True)
    check_files(out, ALLOW["score"])
    check_stderr(p.stderr, public)


def test_fred_stats_release_writes_only_public_fields(emb, tmp_path, run_popri):
    out = tmp_path / "o"
    p = run_popri(["fred", "stats", "--private", emb / "priv.npy", "--epsilon", "0.5", "--delta",
                   "1e-5", "--level", "user", "--max-samples-per-client", "4", "--release",
                   "--out", out / "f" / "stats.npz"], check=True)
    check_files(out, ALLOW["fred"])
    side = json.loads((out / "f" / "stats.json").read_text())
    assert side["n"] != 4 * N_CLIENTS  # the count is private at user level: noised
    check_stderr(p.stderr)


@pytest.mark.parametrize("algorithm", ["fedavg", "ftrl"])
def test_fl02_fl100_fl_round_release_writes_only_public_fields(tiny_lm, tmp_path, run_popri,
                                                               algorithm):
    data = _fl_data(tmp_path / "in")
    out = tmp_path / "o"
    p = run_popri(["fl", "round", "--data", data, "--model", tiny_lm, "--round", "1", "-z", "1",
                   "--sample-rate", "0.5", "--algorithm", algorithm, "--release", "--no-bf16",
                   "--public-clients", "40",  # declared, public (not the private 13)
                   # DP-FTRL under Poisson sampling: a tree restarted every round (the epoch
                   # trees take a fixed number of clients per round)
                   *(["--restart", "round"] if algorithm == "ftrl" else []),
                   "--out", out / "R" / "r1"], check=True)
    check_files(out, ALLOW["fl"])
    check_stderr(p.stderr)
    # the exact statistics only behind --diagnostics, labelled NOT PRIVATE
    p = run_popri(["fl", "round", "--data", data, "--model", tiny_lm, "--round", "1", "-z", "1",
                   "--sample-rate", "0.5", "--release", "--diagnostics", "--no-bf16",
                   "--public-clients", "40",
                   "--out", tmp_path / "d" / "r1"], check=True)
    diag = json.loads((tmp_path / "d" / "r1" / "round.json").read_text())["private_diagnostics"]
    assert diag["private"] is False and "NOT PRIVATE" in diag["note"]
    assert diag["clients"] == N_CLIENTS and diag["update_norm_max"] is not None


@pytest.fixture
def uploads(tiny_lm, tmp_path):
    from popri.methods.fewfedpit import client as C
    from popri.specs.fewfedpit import FewFedPITSpec

    spec = FewFedPITSpec(lora_r=8, lora_alpha=16, bf16=False)
    d = tmp_path / "in"
    C.init_global(tiny_lm, str(d / "r0"), spec, seed=0, device="cpu")
    theta0, st0 = C.read_state(d / "r0")
    ups = []
    for k, n in enumerate((N_CLIENTS, 7)):  # private example counts n_k
        C.write_state(d / f"m{k}", theta0 + 0.001 * (k + 1),
                      {**st0, "kind": "mixed", "round": 1, "client": f"c{k}", "n_examples": n})
        ups.append(d / f"m{k}")
    return d / "r0", ups


@pytest.mark.parametrize("how", ["flag", "env1"])
def test_ff72_env1_fewfedpit_aggregate_release_writes_only_public_fields(uploads, tmp_path,
                                                                       run_popri, how):
    init, ups = uploads
    out = tmp_path / "o"
    flag, env = (["--release"], None) if how == "flag" else ([], {"POPRI_RELEASE": "1"})
    p = run_popri(["fewfedpit", "aggregate", *ups, "--round", "1", "--init", init, "--clip",
                   "1", "-z", "1", "--clients-total", "10", "--lora-r", "8", "--lora-alpha",
                   "16", *flag, "--out", out / "G" / "r1"], env=env, check=True)
    check_files(out, ALLOW["ffp"])
    led = json.loads((out / "G" / "ledger.jsonl").read_text().splitlines()[0])
    assert led["mode"] == "release"  # env1: POPRI_RELEASE=1 is release mode here too
    check_stderr(p.stderr)
    assert "7" not in re.findall(r"\b\d+\b", p.stderr)


def test_env1_a_typo_in_popri_release_is_refused(run_popri):
    p = run_popri(["account", "epsilon", "-z", "1", "-q", "1", "-T", "1"],
                  env={"POPRI_RELEASE": "maybe"})
    assert p.returncode == 2 and "POPRI_RELEASE" in p.stderr


@needs_flower
def test_fw03_fw02_score_on_flower_release_writes_only_public_fields(emb, tmp_path, run_popri):
    out = tmp_path / "o"
    p = run_popri(["score", "--engine", "flower", "--supernodes", "3", "--private",
                   emb / "priv.npy", "--synthetic", emb / "syn.npy", "-z", "1", "--sample-rate",
                   "0.8", "--release", "--public-clients", str(N_CLIENTS),
                   "--out", out / "fw" / "scores.npy"],
                  env={"POPRI_THREADS": "2"}, check=True)
    check_files(out, ALLOW["score-flower"])
    check_stderr(p.stderr)


@needs_flower
def test_fl_round_on_flower_release_writes_only_public_fields(tiny_lm, tmp_path, run_popri):
    data = _fl_data(tmp_path / "in")
    out = tmp_path / "o"
    p = run_popri(["fl", "round", "--data", data, "--model", tiny_lm, "--round", "1", "-z", "1",
                   "--sample-rate", "0.8", "--engine", "flower", "--supernodes", "3",
                   "--release", "--public-clients", str(N_CLIENTS), "--no-bf16",
                   "--out", out / "FR" / "r1"],
                  env={"POPRI_THREADS": "2"}, check=True)
    check_files(out, ALLOW["fl-flower"])
    check_stderr(p.stderr)


def test_rr11_popri_run_dp_fl_release_writes_no_exact_statistic(tmp_path, dataset, tiny_lm,
                                                               run_popri):
    """``popri run`` with a DP-FL method in release mode: results.json's rounds hold no
    participant count, norm or loss, and the log prints no client count."""
    from test_dpfl import _run_args

    run = tmp_path / "run"
    n_train = json.loads((dataset / "manifest.json").read_text())["counts"]["train"]["clients"]
    p = run_popri(_run_args(run, dataset, tiny_lm, "dp-fedavg", "--set", "rounds=1",
                            "--set", "fl.clients_per_round=null", "--set",
                            "fl.sample_rate=0.5", "--set", "privacy.epsilon=20",
                            "--set", "fl.public_clients=40", "--release"),
                  check=True)
    res = json.loads((run / "results.json").read_text())
    assert res["mode"] == "release"
    assert [sorted(r) for r in res["fl"]["rounds"]] == [["round"]]
    # issue 27's plan-vs-record check (results.json and the stage marker): counts of ledger
    # entries, i.e. the plan's structure, and a verdict -- nothing of the clients' data
    check = {"planned": 1, "recorded": 1, "agree": True}
    assert keys(res["ledger_check"]) == {"stages", "stages.fl-round1", "agree",
                                         *(f"stages.fl-round1.{k}" for k in check)}
    assert res["ledger_check"] == {"stages": {"fl-round1": check}, "agree": True}
    marker = json.loads((run / ".stages" / "fl-round1.json").read_text())
    assert marker["ledger_check"] == check
    assert "private_diagnostics" not in json.loads((run / "fl" / "round1" / "round.json")
                                                   .read_text())
    for m in PRIVATE_LINE.finditer(p.stderr):
        raise AssertionError(f"popri run printed {m.group(0)!r}")
    assert not re.search(count_pattern(n_train), scrub(p.stderr)), p.stderr
    # what issue 25 added: the run's identity (public settings, code and clock), and the
    # per-stage logs, which copy the stages' stderr and must hold no private count either
    assert set(res["run"]) == {"popri_version", "git_commit", "command", "config_hash",
                               "started", "ended", "stages_ran", "stages_cached", "stages_copied",
                               "invocations"}
    logs = sorted((run / "logs").iterdir())
    assert {f.name for f in logs} >= {"invocations.jsonl", "fl-round1.log"}
    for f in logs:
        text = f.read_text()
        assert not PRIVATE_LINE.search(text), (f.name, text)
        assert not re.search(count_pattern(n_train), scrub(text)), (f.name, text)
    for line in (run / "logs" / "invocations.jsonl").read_text().splitlines():
        assert set(json.loads(line)) == set(res["run"]) - {"invocations"}
    # and every file, field and log line of the run (no evaluation in release mode)
    assert res["released"] == str(run / "fl" / "round1" / "model")  # rounds=1
    check_release_run(run, dataset, p.stdout + p.stderr)



# --------------------------------------------------------------------------- popri run
#: the simulated devices' own stages: the clients' data and their embeddings, which in a
#: deployment never leave the devices (the run directory holds them because it simulates them)
CLIENT_SIDE = {"fetch-private", "embed-train", "embed-val"}
#: what the driver itself writes (not a stage's output)
RESULTS = {"accountant", "budget", "budget.accountant", "budget.delta", "budget.epsilon",
           # the relation the total holds under and whether it is a DP guarantee (issue 36)
           "budget.convention", "dp_guarantee", "guarantee", "neighbouring",
           "checkpoint_selection", "checkpoint_selection.note", "checkpoint_selection.on",
           "checkpoint_selection.epsilon", "checkpoint_selection.delta", "delta", "downstream",
           "epsilon", "generator", "ledger_check", "ledger_check.agree", "ledger_check.stages",
           "ledger_check.stages.*", "ledger_check.stages.*.agree",
           "ledger_check.stages.*.planned", "ledger_check.stages.*.recorded", "method",
           "methods", "mode", "mode_note", "noise_multiplier", "num_synthetic", "prompts",
           "precision",  # the machine's numeric path (cpu fp32, ...): public (issue 43)
           "recovery_rate_note", "recovery_rate_per_round", "released", "rounds", "run",
           # what the release may be published as (issue 66): its status and release ids
           "release_provenance", "release_provenance.path", "release_provenance.status",
           "release_provenance.entries", "release_provenance.links",
           "release_provenance.dp_guarantee",
           "run.command", "run.config_hash", "run.ended", "run.git_commit", "run.invocations",
           "run.popri_version", "run.stages_cached", "run.stages_copied", "run.stages_ran",
           "run.started",
           "run_dir", "sample_rate", "samples_per_prompt", "seed", "stage_seconds",
           "stage_seconds.*",
           # DP-FL: its settings and the rounds that ran (nothing else per round: rr11)
           "fl", "fl.algorithm", "fl.client_lr", "fl.clients_per_round", "fl.clip",
           "fl.local_epochs", "fl.lora", "fl.model", "fl.momentum", "fl.rounds",
           "fl.rounds[].round", "fl.sample_rate", "fl.server_lr", "fl.restart", "fl.assignment",
           "fl.epoch_rounds",  # public settings (DP-FTRL epochs, issue 36)
           # PE: its settings, the threshold H and the seed set's size (the DP votes' survivors)
           "pe", "pe.lookahead", "pe.num_syn", "pe.seed_set", "pe.threshold", "pe.variation"}
#: RUN/metrics.jsonl in release mode: post-processing of the released scores and of the
#: tuning on them (no probe, no recovery rate: both refused / skipped in release mode)
METRICS = {"round", "stage", "released_mean", "samples", "chosen_mean", "rejected_mean",
           "pairs", "train_loss", "last_epoch_loss", "steps", "seconds_per_step",
           "train_eval_margin", "train_eval_accuracy", "train_eval_pairs", "holdout_margin",
           "holdout_accuracy", "holdout_pairs"}
STAGE_MARKER = {"args", "env", "env.*", "hashes", "hashes.*", "key", "outputs", "popri",
                "seconds", "ledger_check", "ledger_check.agree", "ledger_check.planned",
                "ledger_check.recorded"}
IDENTITY = set(k[4:] for k in RESULTS if k.startswith("run.")) - {"invocations"}
PRIVACY = {"accountant", "delta", "entries", "epsilon", "groups", "groups[].entries",
           "groups[].epsilon_alone", "groups[].mechanism", "groups[].noise_multiplier",
           "groups[].sample_rate", "groups[].sampling", "groups[].stage", "groups[].steps",
           "modes", "modes.release", "modes.research", "neighbouring", "order",
           # public labels of the total (issue 36): the relation and the proof each group's
           # epsilon stands on, and whether the total is a DP guarantee at all
           "dp_guarantee", "guarantee", "groups[].neighbouring", "groups[].proof",
           # the files under the run whose chain is not-dp (issue 66): none in release mode
           "not_dp", "not_dp[].path", "not_dp[].status", "not_dp[].links"}
#: the DP stages' own outputs, by file name: the released vector, its sidecar and the ledger
DP_OUTPUTS = {"scores.npy": None, "scores.json": _score_side(), "hist.npy": None, "hist.json": _score_side(),
              "ledger.jsonl": _ledger_keys(SCORE_PARAMS | {"noise"}),
              "stats.npz": None, "stats.json": ALLOW["fred"]["f/stats.json"]}
DP_OUTPUTS["ledger.jsonl"] |= ALLOW["fred"]["f/ledger.jsonl"] | ALLOW["fl"]["R/ledger.jsonl"]
# a DP-FL round (fl round): the noised model, its server state and sidecars
DP_OUTPUTS |= {"round.json": FL_ROUND, "metrics.json": FL_MODEL_METRICS, "theta.npy": None,
               "server.npz": None, ".popri-output": MARKER, **{f: None for f in MODEL_FILES}}


def _norm(key: str, free: tuple[str, ...]) -> str:
    """``stage_seconds.round1-gen`` -> ``stage_seconds.*``: maps keyed by stage, env or path."""
    for f in free:
        if key.startswith(f + "."):
            rest = key[len(f) + 1:]
            tail = ""
            for sub in (".agree", ".planned", ".recorded"):
                if f == "ledger_check.stages" and rest.endswith(sub):
                    tail = sub
            return f"{f}.*{tail}"
    return key


def _json_keys(path: Path, free=()) -> set[str]:
    text = path.read_text(encoding="utf-8")
    docs = ([json.loads(x) for x in text.splitlines() if x.strip()]
            if path.name.endswith(".jsonl") else [json.loads(text)])
    return {_norm(k, free) for k in set().union(*(keys(d) for d in docs))}


def check_release_run(run: Path, data: Path, log: str) -> None:
    """Everything ``popri run --release`` wrote under ``run`` (issue 24's release-mode gap):

    1. data flow, from the run's own plan: every stage that reads the clients' data or their
       embeddings is a clients' stage (CLIENT_SIDE) or a DP release (``Stage.release``), so
       every other stage's output is post-processing of DP releases and public data;
    2. every file is a stage's output (or its sidecar, or a DP stage's ledger) or one of the
       driver's own files -- nothing else is written;
    3. the DP stages' outputs and the driver's files (results, metrics, the accountant's
       total, stage markers, invocation log) hold only allowlisted fields;
    4. no log and no text file prints the private counts (clients, samples)."""
    from popri.pipeline import config as C
    from popri.pipeline.driver import Run

    cfg = C.load(str(run / "config.resolved.json"), [])
    assert cfg.release
    r = Run(cfg, dry_run=True)
    r.budget.plan()
    private = {str(r.paths.private), str(r.paths.emb_private), str(r.paths.emb_val)}
    owner: dict[str, tuple[str, str]] = {}
    for st in r.all_stages():
        kind = ("clients" if st.name in CLIENT_SIDE else
                "dp" if st.release is not None else "public")
        reads = private & {str(x) for x in st.inputs}
        assert kind != "public" or not reads, \
            f"{st.name} reads {sorted(reads)} without a DP release: its outputs are private"
        # what it writes: its declared outputs and what its command names as an output
        # (``--out DIR`` of dpo is the directory around the declared adapter)
        outs = set(st.outputs) | {str(getattr(st.call, f.name)) for f in
                                  dataclasses.fields(st.call)
                                  if (f.name == "out" or f.name.endswith("_out"))
                                  and getattr(st.call, f.name) not in (None, "-")}
        for o in outs:
            if Path(o).is_relative_to(run):
                owner[str(Path(o).relative_to(run))] = (st.name, kind)
        if st.release is not None:
            owner[str(Path(st.release.ledger).relative_to(run))] = (st.name, "dp")

    def whose(f: str) -> tuple[str, str] | None:
        if f in owner:
            return owner[f]
        p = Path(f)
        for o, w in owner.items():
            po = Path(o)
            if po in p.parents:  # a file in an output directory
                return w
            if po.parent == p.parent and p.name.split(".")[0] == po.name.split(".")[0]:
                return w  # a sidecar: x.npy -> x.json, x.jsonl, x.meta.json
        return None

    settings = keys(C.to_dict(type(cfg)()))
    driver = {"results.json": (RESULTS, ("stage_seconds", "ledger_check.stages")),
              "metrics.jsonl": (METRICS, ()), "privacy.json": (PRIVACY, ()),
              "config.resolved.json": (settings, ()), ".popri-output": (MARKER, ()),
              "logs/invocations.jsonl": (IDENTITY, ())}
    texts = [("popri run's stdout and stderr", log)]
    seen = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())
    for f in seen:
        path = run / f
        w = whose(f)
        if _provenance(path):
            check_provenance(path)
        elif f in driver or f.startswith(".stages/"):
            want, free = driver.get(f, (STAGE_MARKER, ("hashes", "env")))
            extra = sorted(_json_keys(path, free) - want)
            assert not extra, f"{f}: fields outside the release allowlist: {extra}"
        elif f.startswith("logs/"):
            if Path(f).stem not in CLIENT_SIDE:
                texts.append((f, path.read_text(encoding="utf-8")))
        elif f in ("commands.sh", "results.md"):
            texts.append((f, path.read_text(encoding="utf-8")))
        elif w is None:
            raise AssertionError(f"{f}: written in release mode by no stage of the plan and "
                                 f"not one of the driver's files")
        elif w[1] == "dp":
            assert Path(f).name in DP_OUTPUTS, f"{f}: a DP stage's file no allowlist covers"
            want = DP_OUTPUTS[Path(f).name]
            if want is not None:
                extra = sorted(_json_keys(path) - want)
                assert not extra, f"{f}: fields outside the DP release's allowlist: {extra}"
    res = json.loads((run / "results.json").read_text())
    assert res["methods"] == {} and not any(res.get("recovery_rate_per_round") or [])
    # the clients' counts (manifest of the private splits): in no log or text the run wrote
    counts = json.loads((data / "manifest.json").read_text())["counts"]
    secret = {v for split in ("train", "val") for v in (counts[split]["clients"],
                                                         counts[split].get("samples"))
              if isinstance(v, int) and v > 12}  # small numbers coincide with settings
    assert secret, counts
    for name, text in texts:
        assert not PRIVATE_LINE.search(text), (name, PRIVATE_LINE.search(text).group(0))
        for n in secret:
            assert not re.search(count_pattern(n), scrub(text)), (name, n)
