"""One function per mechanism builds a ledger entry, for the plan and the record (issue 27).

    python -m pytest -q tests/test_entries.py

- the engine (EngineSpec) chooses the mechanism; round_release builds the entry the score and
  DP-FL rounds record and their plans compose;
- conformance finds every way a recorded entry can depart from its plan (property tests);
- the plan of a DP stage equals its record through the real stage runner, and a stage whose
  record departs from its plan stops the run (the end-to-end runs of every method check it too:
  tests/test_run_e2e.py, tests/test_dpfl.py, tests/test_run_privacy.py, tests/test_fewfedpit.py,
  through conftest.assert_plan_equals_record).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import _run
from popri.specs.commands.score import ScoreCall
from popri.core.errors import PopriError
from popri.core.io import save_embedding_set
from popri.kit import DPRelease, Stage
from popri.pipeline.stages import StageRunner
from popri.privacy import entries as E
from popri.privacy.ledger import read_ledger
from popri.privacy.plan import Noise
from popri.specs.engine import EngineSpec
from popri.specs.feedback import ScoreSpec
from popri.specs.fl import FLSpec

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the engine
@pytest.mark.parametrize("engine,mech,tree,q,want", [
    (dict(), "gaussian", False, 0.5, ("subsampled_gaussian", 0.5, "fixed")),
    (dict(), "gaussian", False, 1.0, ("gaussian", 1.0, "fixed")),
    (dict(), "tree_aggregation", True, 0.5, ("tree_aggregation", 0.5, "fixed")),
    (dict(engine="flower"), "distributed_discrete_gaussian", False, 0.5,
     ("distributed_discrete_gaussian", 0.5, "fixed")),
    (dict(engine="flower", secagg_mechanism="gaussian"), "gaussian", False, 0.5,
     ("subsampled_gaussian", 0.5, "fixed")),
    # DP-FTRL on Flower: each round's noise shares are one Gaussian release, no amplification
    (dict(engine="flower"), "distributed_discrete_gaussian", True, 0.5,
     ("distributed_discrete_gaussian", 1.0, "none")),
    (dict(engine="flower", secagg_mechanism="gaussian"), "gaussian", True, 0.5,
     ("gaussian", 1.0, "none")),
])
def test_the_engine_chooses_the_mechanism_and_round_release_builds_it(engine, mech, tree, q,
                                                                     want):
    eng = EngineSpec(**engine)
    assert eng.mechanism(tree=tree) == mech
    e = E.round_release(eng, "fl", noise_multiplier=2.0, sample_rate=q, sensitivity=1.0,
                        sampling="fixed", delta=1e-5, mode="research", tree=tree, leaves=3,
                        params={"round": 1})
    assert (e.mechanism, e.sample_rate, e.sampling) == want
    assert e.params["round"] == 1
    if want[0] == "tree_aggregation":
        assert e.params["leaves"] == 3
    if want[0] == "distributed_discrete_gaussian":  # planned: the nominal params of z
        assert e.params["local_sigma"] == pytest.approx(2e6)


def test_score_and_fl_specs_share_one_engine():
    """Each engine setting is declared once (EngineSpec) and both steps have it."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(EngineSpec)}
    assert names <= {f.name for f in dataclasses.fields(ScoreSpec)}
    assert names <= {f.name for f in dataclasses.fields(FLSpec)}
    s = ScoreSpec(engine="flower", supernodes=4)
    assert (s.kind, EngineSpec.of(s).kind) == ("flower-simulation", "flower-simulation")
    assert ScoreSpec(engine="flower", supernodes=3, federation="x").kind == "flower-deployment"
    assert FLSpec().kind == "inprocess" and FLSpec().engine_settings() == {}
    assert FLSpec(engine="flower").engine_settings()["secagg_mechanism"] == "ddg"


def test_no_engine_branches_outside_the_engine():
    """The engine's mechanism choice lives in popri/specs/engine.py: nothing else compares the
    engine or the SecAgg mechanism by name."""
    pat = re.compile(r"\b(engine|secagg_mechanism)\s*[!=]=")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "popri").rglob("*.py"))
            if p.name != "engine.py" or p.parent.name != "specs"
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if pat.search(line)]
    assert hits == []


# --------------------------------------------------------------------------- conformance
def _entry(**kw):
    # fixed L of N: replace one client, the clipped sum's sensitivity 2C
    base = dict(noise_multiplier=1.5, sample_rate=0.25, sensitivity=2.0, sampling="fixed",
                neighbouring="replace one client", delta=1e-5, mode="research",
                params={"round": 1})
    return E.gaussian("score", **(base | kw))


def test_equal_plan_and_record_conform():
    assert E.conformance([_entry()], [_entry(release_id="abc", params={"round": 1, "x": 2})]) == []
    assert E.conformance([], []) == []


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(["sample_rate", "sensitivity", "sampling", "delta", "mechanism",
                              "stage", "count", "lower_z", "neighbouring"]),
       z=st.floats(0.3, 20), q=st.floats(0.01, 0.9))
def test_every_departure_is_found(field, z, q):
    planned = [_entry(noise_multiplier=z, sample_rate=q)]
    change = {"sample_rate": dict(sample_rate=min(1.0, q * 1.5)),
              "sensitivity": dict(sensitivity=4.0), "sampling": dict(sampling="poisson"),
              "delta": dict(delta=2e-5), "mechanism": dict(sample_rate=1.0),
              "lower_z": dict(noise_multiplier=z * 0.99),
              "neighbouring": dict(neighbouring="zero-out one client")}.get(field, {})
    if field == "stage":
        rec = [E.gaussian("fl", **{k: getattr(planned[0], k) for k in (
            "noise_multiplier", "sample_rate", "sensitivity", "sampling", "neighbouring",
            "delta", "mode")})]
    elif field == "count":
        rec = planned * 2
    else:
        rec = [_entry(**({"noise_multiplier": z, "sample_rate": q} | change))]
    assert E.conformance(planned, rec) != []


def test_more_noise_than_planned_conforms_less_does_not():
    """Release mode snaps the noise up: recorded z >= planned z is what the guard assumes."""
    assert E.conformance([_entry()], [_entry(noise_multiplier=1.6)]) == []
    assert "recorded noise multiplier" in E.conformance([_entry()],
                                                        [_entry(noise_multiplier=1.4)])[0]


def test_a_ddg_record_that_spends_more_than_its_nominal_plan_is_found():
    planned = [E.round_release(EngineSpec(engine="flower"), "score", noise_multiplier=1.0,
                               sample_rate=1.0, sensitivity=1.0, sampling="none", delta=1e-5,
                               mode="research")]
    good = E.distributed_discrete_gaussian("score", noise_multiplier=1.0, sample_rate=1.0,
                                           sensitivity=1.0, sampling="none", delta=1e-5,
                                           mode="research", ddg=dict(planned[0].params))
    assert E.conformance(planned, [good]) == []
    worse = E.distributed_discrete_gaussian(
        "score", noise_multiplier=1.0, sample_rate=1.0, sensitivity=1.0, sampling="none",
        delta=1e-5, mode="research",
        ddg={"dim": 1, "noisy": 1, "local_sigma": 0.5, "delta2": 1.0})  # half the noise
    assert any("spend epsilon" in p for p in E.conformance(planned, [worse]))


# --------------------------------------------------------------------------- the stage runner
def _score_inputs(tmp: Path):
    rng = np.random.default_rng(0)
    priv = tmp / "priv.npy"
    save_embedding_set(priv, rng.normal(size=(40, 8)).astype(np.float32),
                       rows=[{"id": str(i), "client_id": f"c{i % 10}"} for i in range(40)])
    syn = tmp / "syn.npy"
    save_embedding_set(syn, rng.normal(size=(6, 8)).astype(np.float32),
                       rows=[{"id": f"s{i}"} for i in range(6)])
    return priv, syn


def _score_stage(tmp: Path, planned, q_args=("--clients-per-round", "5")):
    priv, syn = _score_inputs(tmp)
    out = tmp / "r1" / "scores.npy"
    q = {"clients_per_round": 5} if q_args == ("--clients-per-round", "5") else \
        {q_args[0][2:].replace("-", "_"): float(q_args[1])}
    return Stage("round1-score", ScoreCall(private=str(priv), synthetic=str(syn), out=str(out),
                                           noise_multiplier=1.5, seed=3, round_=1,
                                           delta=1e-05, **q),
                 outputs=[str(out)], inputs=[str(priv), str(syn)],
                 release=DPRelease(planned, out.parent / "ledger.jsonl",
                                   lambda e: e.stage == "score"))


def _planned(q=0.5, sampling="fixed", z=1.5):
    from popri.privacy.relations import round_relation

    rel, sens = round_relation(1.0, sampling)
    return [E.round_release(EngineSpec(), "score", noise_multiplier=z, sample_rate=q,
                            sensitivity=sens, sampling=sampling, neighbouring=rel, delta=1e-5,
                            mode="research", params={"round": 1})]


def test_the_runner_checks_a_dp_stage_record_against_its_plan(tmp_path):
    r = StageRunner(tmp_path / "run")
    stage = _score_stage(tmp_path, _planned())
    assert r.run(stage)
    checks = r.ledger_checks([stage])
    assert checks == {"round1-score": {"planned": 1, "recorded": 1, "agree": True}}
    # a research-mode rerun of the same seeded release (marker removed): its entry repeats the
    # release id already in the ledger -- no new release, counted once, and the check says so
    (tmp_path / "run" / ".stages" / "round1-score.json").unlink()
    r2 = StageRunner(tmp_path / "run")
    assert r2.run(stage)
    assert r2.ledger_checks([stage])["round1-score"]["recorded"] == 0


def test_a_record_that_departs_from_the_plan_stops_the_run(tmp_path):
    """The plan says q = 0.25 (5 of 20 clients), the stage samples 5 of 10: the guard composed
    the wrong entry, so the run stops with the stage named and no marker."""
    r = StageRunner(tmp_path / "run")
    stage = _score_stage(tmp_path, _planned(q=0.25))
    with pytest.raises(PopriError, match=r"round1-score: the ledger entries it recorded differ"):
        r.run(stage)
    assert not (tmp_path / "run" / ".stages" / "round1-score.json").exists()
    # the release itself is in the ledger: `popri account` counts what was recorded
    assert len(read_ledger(tmp_path / "r1" / "ledger.jsonl")) == 1


def test_a_plan_with_fewer_entries_than_the_record_stops_the_run(tmp_path):
    r = StageRunner(tmp_path / "run")
    with pytest.raises(PopriError, match="planned 0 ledger entries, recorded 1"):
        r.run(_score_stage(tmp_path, []))


@pytest.mark.parametrize("extra", [[], ["--release"]])
def test_the_score_command_records_what_the_budget_plans(tmp_path, extra):
    """The driver's plan (Budget.score_entries) for score.clients_per_round L and the entry
    `popri score` records, in research and release mode (the same z: release mode's noise
    covers its snapping)."""
    from popri.pipeline import config as C
    from popri.pipeline.driver import Run

    priv, syn = _score_inputs(tmp_path)
    cfg = C.load(None, [f"run_dir={tmp_path / 'run'}", "score.clients_per_round=5",
                        "score.sample_rate=null",
                        "privacy.epsilon=null", "privacy.noise_multiplier=1.5",
                        *(["release=true", "dpo.select_on=public"] if extra else [])])
    run = Run(cfg)
    b = run.budget
    b.noise = b.noise_at(Noise.of(1.5, release=b.release), 0.5)  # q = L/N = 5/10
    planned = b.score_entries(1)
    p = _run(["score", "--private", priv, "--synthetic", syn, "--out", tmp_path / "s.npy",
              "-z", "1.5", "--clients-per-round", "5", "--seed", "0", "--round", "1",
              "--delta", repr(cfg.privacy.delta), *extra])
    assert p.returncode == 0, p.stderr
    rec = read_ledger(tmp_path / "ledger.jsonl")
    assert E.conformance(planned, rec) == []
    for f in (*E.ACCOUNTED, "noise_multiplier"):  # equal field by field (z in release mode too)
        assert [getattr(e, f) for e in rec] == [getattr(e, f) for e in planned], f
    assert json.loads(json.dumps(rec[0].to_dict()))["mechanism"] == "subsampled_gaussian"


def test_popri_run_dry_run_plans_with_the_engine_entry(tmp_path):
    """A Flower DDG plan: the dry run names the mechanism the record will carry."""
    p = subprocess.run([sys.executable, "-m", "popri.cli.app", "run", "--dry-run",
                        "--set", f"run_dir={tmp_path / 'run'}", "--set", "score.engine=flower",
                        "--set", "score.supernodes=3", "--set", "privacy.noise_multiplier=2",
                        "--set", "privacy.epsilon=null"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    import shlex

    import typer

    from popri.cli.app import app
    from popri.cli.options import parse_call

    # the plan's score lines mean DDG on Flower (ddg is the command's default: a line writes
    # only what differs from the defaults, so it is read as the command parses it)
    score = [shlex.split(x) for x in p.stdout.splitlines() if x.startswith("popri score")]
    assert score and "--engine flower" in p.stdout
    for line in score:
        call = parse_call(typer.main.get_command(app), line[1:])[1]
        assert call.engine == "flower" and call.secagg_mechanism == "ddg"
        assert call.to_dict()["supernodes"] == 3


@pytest.mark.parametrize("sets", [[], ["score.clients_per_round=5", "score.sample_rate=null"],
                                  ["method=pe"], ["release=true", "dpo.select_on=public"]])
def test_a_score_stage_is_planned_from_its_own_call(tmp_path, sets):
    """One builder (Method.score_settings) makes the calibration's round spec and every score
    stage's call, and the stage's ledger entry is planned from that call instance."""
    import dataclasses

    from popri.methods import steps
    from popri.pipeline import config as C
    from popri.pipeline.driver import Run
    from popri.specs.feedback import ScoreSpec

    cfg = C.load(None, [f"run_dir={tmp_path / 'run'}", "privacy.epsilon=null",
                        "privacy.noise_multiplier=1.5", *sets])
    run = Run(cfg, dry_run=True)
    run.budget.noise = run.budget.noise_at(Noise.of(1.5, release=run.release), 0.5)
    st = steps.score_stage(run, 2, tmp_path / "syn.npy", tmp_path / "r2" / "scores.npy",
                           seed=3)
    spec = run.method.round_spec(cfg)
    for f in dataclasses.fields(ScoreSpec):
        if f.name not in ("noise_multiplier", "threshold"):
            assert getattr(st.call, f.name) == getattr(spec, f.name), f.name
    assert st.call.noise_multiplier == 1.5
    (e,) = st.release.entries
    fixed = "score.clients_per_round=5" in sets  # replace one client: the cosine sum's 2C
    assert (e.noise_multiplier, e.sampling, e.sensitivity, e.params["round"]) == (
        1.5, "fixed" if fixed else "poisson", spec.sensitivity * (2.0 if fixed else 1.0), 2)
    assert e.mode == ("release" if run.release else "research")
