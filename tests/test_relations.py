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
    (e,) = run.method.round_entries(cfg, 1, Noise(None, sample_rate=0.2), None)
    assert (e.sampling, e.neighbouring, e.sensitivity) == ("fixed", REL.REPLACE, 1.0)
    (full,) = run.method.round_entries(cfg, 1, Noise(None, sample_rate=1.0), None)
    # L = N is still L drawn of N (an added-to neighbour has N + 1): replace one at q = 1
    assert (full.sampling, full.neighbouring, full.sensitivity) == ("fixed", REL.REPLACE, 1.0)


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


# --------------------------------------------------------------------------- issue 43, item 3
_PARAMS = {"tree_aggregation": {"leaves": 1},
           "distributed_discrete_gaussian": {"dim": 4, "noisy": 3, "local_sigma": 10.0,
                                             "delta2": 5.0}}


def _line(mechanism, sampling, relation, q=0.5, **kw):
    return {"stage": "s", "mechanism": mechanism, "noise_multiplier": 1.0, "sample_rate": q,
            "steps": 1, "delta": 1e-5, "sensitivity": 1.0, "sampling": sampling,
            "neighbouring": relation, "params": dict(_PARAMS.get(mechanism, {})),
            "release_id": f"{mechanism}-{sampling}-{relation}-{q}", **kw}


def test_the_docs_table_of_accepted_entries_is_the_codes():
    """docs/privacy.md's "Ledger entries popri accepts" lists exactly REL.PROVEN."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "privacy.md").read_text()
    table = text.split("**Ledger entries popri accepts.**", 1)[1]
    rows = [ln for ln in table.split("| mechanism | sampling | relations | proof |", 1)[1]
            .splitlines()[2:]]
    rows = rows[:next(i for i, ln in enumerate(rows) if not ln.startswith("|"))]
    docs = set()
    for ln in rows:
        mechs, sampling, rels = (c.strip() for c in ln.strip("|").split("|")[:3])
        for m in mechs.split(","):
            for r in rels.split(";"):
                docs.add((m.strip().strip("`"), sampling, r.strip()))
    code = {(m, s, r) for m, pairs in REL.PROVEN.items() for s, r in pairs}
    assert docs == code, (docs - code, code - docs)
    assert all(r in REL.RELATIONS and s in REL.SAMPLINGS for _, s, r in code)


@pytest.mark.parametrize("mechanism", list(REL.PROVEN))
def test_exactly_the_proven_pairs_are_accepted(mechanism):
    """Every (sampling, relation) pair, at q < 1 and q = 1: the reader and a total accept
    exactly the rows of REL.PROVEN; the papers' convention adds only REL.PAPERS_PAIRS (NOT DP);
    everything else is one InputError naming file, line and pair, under every convention."""
    from popri.core.errors import InputError

    for s in REL.SAMPLINGS:
        for r in REL.RELATIONS:
            proven = (s, r) in REL.PROVEN[mechanism]
            papers = (s, r) in REL.PAPERS_PAIRS
            for q in (0.5, 1.0):
                d = _line(mechanism, s, r, q)
                if proven or papers:
                    e = LedgerEntry.from_dict(d, path="L", line=3)
                    assert e.where == "L:3"
                else:
                    with pytest.raises(InputError) as err:
                        LedgerEntry.from_dict(d, path="L", line=3)
                    msg = err.value.format()
                    assert msg.startswith("L:3: field 'neighbouring': refused ledger entry: "
                                          f"{mechanism} with sampling {s!r} under {r!r}"), msg
                    assert "\n" not in msg
                for conv in (None, "papers"):
                    ok = proven or (papers and conv == "papers")
                    if ok:
                        c = A.compose([d], 1e-5, convention=conv)
                        assert c.guarantee == proven and c.epsilon > 0
                    else:
                        with pytest.raises(A.ParameterError) as err:
                            A.compose([d], 1e-5, convention=conv)
                        assert f"sampling {s!r} under {r!r}" in err.value.message
    # the trees' condition on params: a sampled round is a one-leaf tree
    for s, r in (("poisson", REL.ADD_REMOVE), ("fixed", REL.REPLACE)):
        if mechanism == "tree_aggregation":
            d = _line(mechanism, s, r, params={"leaves": 4})
            with pytest.raises(InputError, match="several leaves"):
                LedgerEntry.from_dict(d, path="L", line=1)


def test_a_hand_written_fixed_zero_out_entry_is_refused_naming_file_line_and_pair(
        tmp_path, run_popri):
    """Issue 43 item 3: L = 5 of N = 10, z = 1, delta = 1e-5, sampling fixed under zero-out one
    client was accounted as Poisson at q = L/N (3.89; its pair "others at +C, the target at -C
    vs the zero record" needs at least 4.21).  Refused: one line, exit 2, any convention."""
    import json

    led = tmp_path / "ledger.jsonl"
    good = _line("subsampled_gaussian", "poisson", REL.ADD_REMOVE, 0.5)
    bad = _line("subsampled_gaussian", "fixed", REL.ZERO_OUT, 0.5)
    led.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    for extra in ([], ["--convention", "papers"], ["--delta", "1e-5", "--json"]):
        p = run_popri(["account", "ledger", tmp_path, *extra])
        assert p.returncode == 2 and p.stdout == "", p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"popri: error: {led}:2: "), lines
        assert "sampling 'fixed' under 'zero-out one client'" in lines[0]
    # the writer refuses it too: no popri command can record it
    from popri.core.errors import InputError
    from popri.privacy.ledger import append

    with pytest.raises(InputError, match="refused ledger entry"):
        append(tmp_path / "other" / "ledger.jsonl", [LedgerEntry(**bad)])
    with pytest.raises(A.ParameterError, match="zero-out one client"):
        A.compose([bad], 1e-5)  # a dict handed to the accountant, too
