"""Issue 36: the neighbouring relations of popri.privacy.relations and how totals use them.

    python -m pytest -q tests/test_relations.py
"""

from __future__ import annotations

import math

import pytest

from popri.privacy import accounting as A
from popri.privacy import relations as REL
from popri.privacy.ledger import LedgerEntry

D = 3e-6


def test_each_sampling_is_accounted_under_its_relation_with_its_sensitivity():
    assert REL.of_sampling("poisson") == REL.of_sampling("none") == REL.ADD_REMOVE
    assert REL.of_sampling("fixed") == REL.REPLACE
    assert REL.of_sampling("fixed", "papers") == REL.ADD_REMOVE  # the convention, by name
    assert REL.round_relation(0.5, "poisson") == (REL.ADD_REMOVE, 0.5)
    assert REL.round_relation(0.5, "fixed") == (REL.REPLACE, 1.0)
    rel, s = REL.round_relation(8, "fixed", nonnegative=True)  # histogram votes
    assert rel == REL.REPLACE and s == pytest.approx(8 * math.sqrt(2))
    assert REL.sensitivity(1.0, REL.ZERO_OUT) == 1.0
    with pytest.raises(ValueError):
        REL.of_sampling("bins")
    with pytest.raises(ValueError):
        REL.of_sampling("fixed", "paper")


def test_the_only_conversions_are_the_proven_ones():
    c = REL.conversion
    assert c(REL.ADD_REMOVE, REL.REPLACE, relation_free=True) == 2.0
    assert c(REL.ADD_REMOVE, REL.ZERO_OUT, relation_free=True) == 2.0
    assert c(REL.REPLACE, REL.ZERO_OUT, relation_free=False) == 1.0
    assert c(REL.ADD_REMOVE, REL.REPLACE, relation_free=False) is None  # Poisson: no rule
    assert c(REL.REPLACE, REL.ADD_REMOVE, relation_free=True) is None
    assert c(REL.ZERO_OUT, REL.ADD_REMOVE, relation_free=True) is None
    assert c(REL.ADD_REMOVE_SAMPLE, REL.REPLACE, relation_free=True) is None  # units differ


def _e(**kw):
    base = dict(stage="s", mechanism="subsampled_gaussian", noise_multiplier=1.5,
                sample_rate=0.2, steps=1, delta=D, sensitivity=1.0, sampling="poisson")
    return LedgerEntry(**(base | kw))


def test_totals_refuse_unproven_pairs_and_mixtures_with_one_line():
    rep = _e(sampling="fixed", neighbouring=REL.REPLACE, sensitivity=2.0)
    with pytest.raises(A.ParameterError, match="no proven conversion"):
        A.compose([rep, _e()], D)  # Poisson add/remove cannot join replace-one
    with pytest.raises(A.ParameterError, match="Poisson sampling is accounted under add/remove"):
        A.compose([_e(neighbouring=REL.REPLACE)], D)
    ddg = dict(mechanism="distributed_discrete_gaussian", sampling="fixed",
               neighbouring=REL.REPLACE,
               params={"dim": 4, "noisy": 3, "local_sigma": 10.0, "delta2": 5.0})
    # the DDG on a fixed-size sample: replace one client at q = 1 (no amplification claimed),
    # the same epsilon as every client; under add/remove it is the displacement pair, refused
    assert A.compose([_e(**ddg)], D).epsilon == pytest.approx(
        A.compose([_e(**ddg | {"sampling": "none", "sample_rate": 1.0})], D).epsilon, rel=1e-12)
    with pytest.raises(A.ParameterError, match="displaces"):
        A.compose([_e(**ddg | {"neighbouring": REL.ADD_REMOVE})], D)
    with pytest.raises(A.ParameterError, match="Zhu & Wang"):
        A.compose([_e(**ddg | {"sampling": "poisson"})], D)
    zero = LedgerEntry(stage="fl", mechanism="tree_aggregation", noise_multiplier=2.0,
                       sample_rate=1.0, steps=1, delta=D, sensitivity=1.0,
                       neighbouring=REL.ZERO_OUT, params={"leaves": 4})
    t = A.compose([zero, rep], D)  # replace-one counts as zero-out as it is
    assert t.neighbouring == REL.ZERO_OUT and t.guarantee
    with pytest.raises(A.ParameterError):
        A.compose([zero, _e()], D)


def test_a_fewfedpit_dp_round_plans_replace_one_at_twice_the_clip(tmp_path):
    from popri.pipeline import config as C
    from popri.pipeline.driver import Run
    from popri.privacy.plan import Noise

    cfg = C.load(None, [f"run_dir={tmp_path / 'run'}", "method=fewfedpit", "rounds=3",
                        "fewfedpit.clients_per_round=2", "fewfedpit.noise_multiplier=2",
                        "fewfedpit.clip=0.5", "privacy.epsilon=null"])
    run = Run(cfg)
    (e,) = run.method.round_entries(cfg, 1, Noise(None, None, sample_rate=0.2), None)
    assert (e.sampling, e.neighbouring, e.sensitivity) == ("fixed", REL.REPLACE, 1.0)
    (full,) = run.method.round_entries(cfg, 1, Noise(None, None, sample_rate=1.0), None)
    assert (full.sampling, full.neighbouring, full.sensitivity) == ("none", REL.ADD_REMOVE, 0.5)


def test_the_score_command_doubles_the_noise_for_a_fixed_count(tmp_path, run_popri):
    """`popri score --clients-per-round L`: the per-client noise std recorded for the uploads
    is z 2C / sqrt(L) (replace one client), z C / sqrt(L) under --convention papers."""
    import json

    import numpy as np

    from popri.core.io import save_embedding_set

    rng = np.random.default_rng(0)
    save_embedding_set(tmp_path / "p.npy", rng.normal(size=(20, 4)).astype(np.float32),
                       rows=[{"id": str(i), "client_id": f"c{i % 10}"} for i in range(20)])
    save_embedding_set(tmp_path / "s.npy", rng.normal(size=(3, 4)).astype(np.float32),
                       rows=[{"id": f"s{i}"} for i in range(3)])
    stds = {}
    for tag, extra in (("new", []), ("papers", ["--convention", "papers"])):
        d = tmp_path / tag
        run_popri(["score", "--private", tmp_path / "p.npy", "--synthetic", tmp_path / "s.npy",
                   "-z", 1.5, "-L", 4, "--per-client-out", d / "rows.npy", "--seed", 0,
                   *extra], check=True)
        side = json.loads((d / "rows.json").read_text())
        stds[tag] = side["noise_std_per_row"]
        (e,) = side["ledger"]
        assert e["neighbouring"] == (REL.ADD_REMOVE if extra else REL.REPLACE)
        assert e["sensitivity"] == (1.0 if extra else 2.0)
    assert stds["new"] == pytest.approx(2 * stds["papers"]) == pytest.approx(1.5 * 2 / 2)


def test_release_mode_sizes_the_secure_sum_from_a_public_bound_and_never_prints_the_count():
    """Issue 36 item 5: the DDG plan of a release-mode round follows a PUBLIC bound on the
    participants (--public-clients N, --clients-per-round L, a deployment's SuperNodes), never
    the realised count, which no error message prints."""
    from types import SimpleNamespace

    from popri.core.errors import ConfigError, InputError
    from popri.federated.flower import engine as E
    from popri.specs.feedback import ScoreSpec

    spec = SimpleNamespace(clients_per_round=None, public_clients=40, supernodes=4)
    for L in (3, 17, 40):  # whatever the realised count, the same sizes
        assert E.planned_sizes(spec, L, 4, 1.0, release=True) == (40, [10.0] * 4)
    assert E.planned_sizes(spec, 17, 4, 1.0, release=False)[0] == 17  # research: realised
    with pytest.raises(InputError) as err:
        E.planned_sizes(spec, 41, 4, 1.0, release=True)
    assert "41" not in str(err.value) and "public bound 40" in str(err.value)
    with pytest.raises(InputError, match="--public-clients"):
        E.planned_sizes(SimpleNamespace(clients_per_round=None, public_clients=None), 5, 4,
                        1.0, release=True)
    with pytest.raises(ConfigError, match="PUBLIC upper bound"):
        ScoreSpec(noise_multiplier=1.0, engine="flower", release=True, sample_rate=0.5)
    ScoreSpec(noise_multiplier=1.0, engine="flower", release=True, sample_rate=0.5,
              public_clients=100)
