"""The budget of ``popri run`` on its own (issue 39): built from (config, method, paths), no
``Run``, no driver, no stage -- as opacus' accountants are tested apart from the optimizer.

    python -m pytest -q tests/test_budget.py

- :meth:`Budget.plan` calibrates z to privacy.epsilon over the plan's releases (the score
  rounds and the DP checkpoint selection) and keeps one frozen :class:`Noise`;
- before the fetch a fixed L of N waits for N (a dry run says so, a real run refuses), and is
  planned once the data's manifest gives it, as the driver feeds it;
- release mode: the value passed and the value guaranteed differ by the snap factor, declared
  once (:mod:`popri.privacy.snap`);
- the guard and the plan check refuse past the budget, counting what the ledgers hold;
- the planned ledger entry and the one ``popri score`` records are built from the same Noise.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from popri.core.errors import PopriError
from popri.core.io import save_embedding_set
from popri.kit import DPRelease, RunPaths
from popri.pipeline import config as C
from popri.pipeline.budget import Budget, BudgetError
from popri.pipeline.recipes import get_method
from popri.privacy import accounting as A
from popri.privacy import entries as E
from popri.privacy import relations as REL
from popri.privacy.ledger import read_ledger
from popri.privacy.plan import Noise


def budget(tmp_path, *sets: str, data: bool = False, clients: int = 10,
           dry_run: bool = False) -> Budget:
    """A Budget of a tiny config (no data unless ``data``: then a manifest of ``clients``
    training clients, what ``bench fetch`` writes and the driver reads N from)."""
    d = tmp_path / "data"
    if data:
        d.mkdir(parents=True, exist_ok=True)
        (d / "manifest.json").write_text(json.dumps(
            {"counts": {"train": {"clients": clients, "samples": 4 * clients}}}))
    cfg = C.load(None, [f"run_dir={tmp_path / 'run'}", "rounds=3", *sets,
                        *([f"data.dir={d}"] if data else [])])
    return Budget(cfg, get_method(cfg.method), RunPaths.of(cfg.run_dir, cfg.data.dir),
                  dry_run=dry_run)


def planned_entries(b: Budget) -> list:
    return [e for t in range(1, b.cfg.rounds + 1) for e in b.score_entries(t)] \
        + b.select_entries()


def test_plan_calibrates_one_noise_to_the_budget(tmp_path):
    b = budget(tmp_path, "privacy.epsilon=2")
    assert b.noise is None                       # nothing planned before plan()
    n = b.plan()
    assert n is b.noise and dataclasses.is_dataclass(n)
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.z = 1.0                                # a value: planned once
    # the default: Poisson q = 0.5 under add/remove, cosine clip C = 1 the sensitivity
    assert (n.sample_rate, n.sampling, n.relation, n.sensitivity, n.mode) == (
        0.5, "poisson", REL.ADD_REMOVE, 1.0, "research")
    assert n.z > 0 and n.planned
    # T score rounds + the DP selection's mean compose to the budget (from below, to 1e-4 in z)
    total = A.compose(planned_entries(b), b.cfg.privacy.delta, b.cfg.privacy.accountant)
    assert 1.99 <= total.epsilon <= 2.0 + 1e-6
    assert b.noise_line().startswith(f"noise multiplier z={n.z:.4f} (calibrated to eps=2.0")
    # a larger budget, less noise; N is private under Poisson: never asked for
    assert budget(tmp_path / "b", "privacy.epsilon=7").plan().z < n.z
    assert b.disclosed_clients() is None and b.client_count() is None


def test_a_fixed_count_waits_for_the_client_count_then_plans_with_it(tmp_path):
    sets = ("score.clients_per_round=5", "score.sample_rate=null", "dpo.select_on=none")
    dry = budget(tmp_path, *sets, dry_run=True)
    assert dry.needs_clients() and dry.plan() is None
    assert "z is set after the fetch" in dry.noise_line()
    with pytest.raises(PopriError, match="before the fetch"):
        budget(tmp_path, *sets).plan()
    # given z: only q waits
    given = budget(tmp_path, *sets, "privacy.noise_multiplier=2", "privacy.epsilon=null",
                   dry_run=True).plan()
    assert (given.z, given.sample_rate, given.planned) == (2.0, None, False)
    # the driver fetches, the manifest says N = 10: q = L/N, replace one client at 2C
    b = budget(tmp_path, *sets, data=True, clients=10)
    n = b.plan()
    assert (n.sample_rate, n.sampling, n.relation, n.sensitivity) == (0.5, "fixed",
                                                                      REL.REPLACE, 2.0)
    assert b.disclosed_clients() == 10 and "10 clients" in b.noise_line()
    # a count above N is refused before anything runs
    with pytest.raises(Exception, match="exceeds the 4 clients"):
        budget(tmp_path / "x", *sets, data=True, clients=4).plan()


def test_release_mode_passes_the_z_it_records(tmp_path):
    """No factor on the way: release mode's mechanism covers its snapped sensitivity itself
    (popri.privacy.noise.discrete_gaussian_release), so the plan passes the calibrated or given
    z unchanged, in both modes, and the stage records it."""
    sets = ("release=true", "dpo.select_on=public", "probe.enabled=false")
    b = budget(tmp_path, *sets)
    n = b.plan()
    r = budget(tmp_path / "r", "dpo.select_on=public", "probe.enabled=false").plan()
    assert n.mode == "release" and r.mode == "research" and n.z == r.z
    assert "passed as" not in b.noise_line()
    g = budget(tmp_path, *sets, "privacy.noise_multiplier=3", "privacy.epsilon=null").plan()
    assert g.z == 3.0
    assert not hasattr(g, "arg")


def test_the_guard_and_the_plan_check_count_the_ledgers(tmp_path):
    b = budget(tmp_path, "privacy.epsilon=1", "dpo.select_on=none")
    b.plan()
    entries = planned_entries(b)
    assert len(entries) == 3
    b.check(entries)                             # the plan alone fits
    ledger = b.run / "round1" / "ledger.jsonl"
    ledger.parent.mkdir(parents=True)
    with open(ledger, "w") as fh:
        for i, e in enumerate(entries):
            fh.write(json.dumps({**e.to_dict(), "release_id": f"r{i}"}) + "\n")
    assert len(b.existing_entries()) == 3
    with pytest.raises(BudgetError, match="the plan would take the run to epsilon="):
        b.check(entries[:1])                     # one more round on top of a spent budget

    class Runner:                                # what the guard asks of the stage runner
        def __init__(self):
            self.noted = []

        def attempt(self, name):
            return {}

        def same_attempt(self, name, key):
            return False

        def note_attempt(self, name, key, ids):
            self.noted.append((name, key, ids))

    runner = Runner()
    before = b.guard("round4-score", DPRelease(entries[:1], ledger, lambda e: False), runner)
    with pytest.raises(BudgetError, match="stage round4-score would take the run"):
        before("k")
    assert runner.noted == []                    # refused before it was noted
    ok = budget(tmp_path / "ok", "privacy.epsilon=1", "dpo.select_on=none")
    ok.plan()
    ok.guard("round1-score", DPRelease(entries[:1], ledger, lambda e: False), runner)("k")
    assert runner.noted == [("round1-score", "k", [])]


def test_planned_and_recorded_entries_are_built_from_the_same_noise(tmp_path):
    """The budget's entry for a round is its Noise's (Noise.entry), and ``popri score``, passed
    that Noise's value, records its entry through Noise.of_round + Noise.entry from its spec:
    the same z, q, sampling, relation and sensitivity."""
    import popri

    rng = np.random.default_rng(0)
    b = budget(tmp_path, "score.clients_per_round=5", "score.sample_rate=null",
               "dpo.select_on=none", data=True, clients=10)
    noise = b.plan()
    (planned,) = b.score_entries(1)
    spec = b.method.round_spec(b.cfg)
    assert planned == noise.entry(spec, "score", delta=b.cfg.privacy.delta,
                                  params={"round": 1})
    # the record: 10 clients, 5 a round, at the value the score stage is passed
    priv, syn = tmp_path / "priv.npy", tmp_path / "syn.npy"
    save_embedding_set(priv, rng.normal(size=(40, 8)).astype(np.float32),
                       rows=[{"id": str(i), "client_id": f"c{i % 10}"} for i in range(40)])
    save_embedding_set(syn, rng.normal(size=(6, 8)).astype(np.float32),
                       rows=[{"id": f"s{i}"} for i in range(6)])
    (tmp_path / "r1").mkdir()
    popri.score(str(priv), str(syn), out=str(tmp_path / "r1" / "scores.npy"), seed=1, round=1,
                noise_multiplier=noise.z, clients_per_round=5, delta=b.cfg.privacy.delta)
    (recorded,) = read_ledger(tmp_path / "r1" / "ledger.jsonl")
    assert E.conformance([planned], [recorded]) == []
    assert recorded.noise_multiplier == noise.z
    for f in E.ACCOUNTED:
        assert getattr(recorded, f) == getattr(planned, f), f
    # and the record's Noise is the plan's, on the sampling the stage drew
    again = Noise.of_round(noise.z, sample_rate=recorded.sample_rate,
                           sampling=recorded.sampling, spec=spec)
    assert (again.z, again.sample_rate, again.sampling, again.relation, again.sensitivity) == (
        noise.z, noise.sample_rate, noise.sampling, noise.relation, noise.sensitivity)


def test_a_method_with_its_own_rounds_plans_them_from_the_noise(tmp_path):
    """DP-FTRL over blocks: its round spec (the FL clip) sets the noise's relation; N is public
    there (floor(N / L) leaves a tree) and planned from the manifest; the tree entries hold
    under zero-out one client, at q = 1."""
    b = budget(tmp_path, "method=dp-ftrl", "fl.assignment=blocks", "fl.clients_per_round=2",
               "fl.sample_rate=null", "rounds=6", data=True, clients=10)
    n = b.plan()
    assert (n.sample_rate, n.sampling, n.sensitivity) == (0.2, "fixed", 2 * b.cfg.fl.clip)
    assert b.disclosed_clients() == 10
    plan = [e for t in range(1, 7)
            for e in b.method.round_entries(b.cfg, t, n, b.disclosed_clients())]
    assert [e.params["tree"] for e in plan] == [0, 1]          # R = 10 // 2 = 5 leaves a tree
    assert {(e.mechanism, e.sample_rate, e.neighbouring, e.params["leaves"]) for e in plan} == {
        ("tree_aggregation", 1.0, REL.ZERO_OUT, 5)}
    # under Poisson sampling N stays private: the method gets none
    p = budget(tmp_path / "p", "method=dp-fedavg", data=True, clients=10)
    assert p.plan().sampling == "poisson" and p.disclosed_clients() is None
