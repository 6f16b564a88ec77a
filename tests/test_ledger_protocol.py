"""The release protocol and the ledger (issue 9, sections 1, 3 and 4): every case here failed on
the code before the protocol (unlocked read-modify-write appends, shared ids, outputs committed
before the ledger, symlinks replaced, diagnostics ledgered, float noise in release mode).

    python -m pytest -q tests/test_ledger_protocol.py
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from popri.privacy import ledger
from popri.core.errors import InputError
from conftest import emb_set as _emb_set
from popri.privacy import noise as N




@pytest.fixture
def sets(tmp_path):
    rng = np.random.default_rng(0)
    priv = rng.normal(size=(120, 16)).astype(np.float32)
    cids = [f"c{rng.integers(0, 15)}" for _ in range(120)]
    syn = rng.normal(size=(40, 16)).astype(np.float32)
    return _emb_set(tmp_path / "priv.npy", priv, cids), _emb_set(tmp_path / "syn.npy", syn)


def _score(priv, syn, out, *extra, z="1", seed="3"):
    return ["score", "--private", priv, "--synthetic", syn, "--noise-multiplier", z, "--seed", seed,
            "--out", str(out), *extra]


def _lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def _entry(z=1.0, q=0.1, rid="", steps=1, **kw):
    return ledger.LedgerEntry(stage="score", mechanism="subsampled_gaussian", noise_multiplier=z,
                              sample_rate=q, steps=steps, delta=3e-6, sensitivity=1.0,
                              sampling="poisson", release_id=rid, **kw)


# --------------------------------------------------------------------------- 1. never under-count
_APPENDER = """
import sys
from popri.privacy import ledger
out, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    ledger.append(out, [ledger.LedgerEntry(stage="score", mechanism="gaussian",
        noise_multiplier=1.0 + i, sample_rate=1.0, steps=1, delta=3e-6, sensitivity=1.0,
        release_id=f"{who}-{i}")])
"""


def test_eight_concurrent_library_appenders_keep_every_entry(tmp_path):
    out = tmp_path / "scores.npy"
    procs = [subprocess.Popen([sys.executable, "-c", _APPENDER, str(out), f"w{k}", "25"])
             for k in range(8)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    ids = [e.release_id for e in ledger.read_ledger(tmp_path / "ledger.jsonl")]
    assert len(ids) == 200 and len(set(ids)) == 200


def test_eight_concurrent_score_processes_keep_every_entry(sets, tmp_path):
    priv, syn = sets
    env = dict(os.environ, POPRI_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-m", "popri.cli.app",
                               *_score(priv, syn, tmp_path / f"s{k}.npy", seed=str(k))],
                              env=env, stderr=subprocess.PIPE, text=True) for k in range(8)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    entries = ledger.read_ledger(tmp_path / "ledger.jsonl")
    assert len({e.release_id for e in entries}) == 8 == len(entries)


def test_per_client_out_is_a_different_release_with_its_own_id(sets, tmp_path, run_popri):
    priv, syn = sets
    run_popri(_score(priv, syn, tmp_path / "a" / "s.npy"), check=True)
    run_popri(_score(priv, syn, tmp_path / "b" / "s.npy", "--per-client-out",
                     tmp_path / "b" / "c.npy"), check=True)
    ia = _lines(tmp_path / "a" / "ledger.jsonl")[0]["release_id"]
    ib = _lines(tmp_path / "b" / "ledger.jsonl")[0]["release_id"]
    assert ia != ib
    # both count: two releases, two entries
    got = ledger.collect([tmp_path / "a", tmp_path / "b"])
    assert len(got) == 2
    # the identical command again reproduces the identical release: same id, counted once
    run_popri(_score(priv, syn, tmp_path / "a2" / "s.npy"), check=True)
    assert _lines(tmp_path / "a2" / "ledger.jsonl")[0]["release_id"] == ia
    assert len(ledger.collect([tmp_path / "a", tmp_path / "a2"])) == 1


def test_same_id_different_parameters_is_a_conflict_not_a_merge(tmp_path, run_popri):
    led = tmp_path / "ledger.jsonl"
    led.write_text(json.dumps(_entry(z=1.0, rid="x").to_dict()) + "\n"
                   + json.dumps(_entry(z=9.0, rid="x").to_dict()) + "\n")
    with pytest.raises(InputError, match="recorded twice"):
        ledger.collect([led])
    p = run_popri(["account", "ledger", str(led), "--delta", "3e-6"])
    assert p.returncode == 2 and "recorded twice with different noise_multiplier" in p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


def test_commit_failure_after_ledger_append_rolls_back(sets, tmp_path, run_popri):
    priv, syn = sets
    before = _score(priv, syn, tmp_path / "old.npy")
    run_popri(before, check=True)
    led = (tmp_path / "ledger.jsonl").read_bytes()
    p = run_popri(_score(priv, syn, tmp_path / "new.npy", seed="9"),
                  env={"POPRI_FAULT": "after-ledger"})
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert not (tmp_path / "new.npy").exists() and not (tmp_path / "new.json").exists()
    assert (tmp_path / "ledger.jsonl").read_bytes() == led  # rolled back
    assert not list(tmp_path.glob(".*.tmp"))


def test_commit_failure_on_a_blocked_destination_rolls_back_everything(sets, tmp_path, run_popri):
    """The score file renames fine, its sidecar cannot (a directory sits there): the ledger
    entry is rolled back and the earlier score file is restored byte for byte."""
    priv, syn = sets
    run_popri(_score(priv, syn, tmp_path / "s.npy"), check=True)
    old = (tmp_path / "s.npy").read_bytes()
    led = (tmp_path / "ledger.jsonl").read_bytes()
    (tmp_path / "s.json").unlink()
    (tmp_path / "s.json").mkdir()
    p = run_popri(_score(priv, syn, tmp_path / "s.npy", seed="8"))
    assert p.returncode != 0
    assert (tmp_path / "s.npy").read_bytes() == old
    assert (tmp_path / "ledger.jsonl").read_bytes() == led


def test_kill_between_ledger_and_commit_leaves_an_entry_and_no_output(sets, tmp_path, run_popri):
    priv, syn = sets
    p = run_popri(_score(priv, syn, tmp_path / "s.npy"), env={"POPRI_FAULT": "kill-after-ledger"})
    assert p.returncode == -9
    assert not (tmp_path / "s.npy").exists()
    assert len(_lines(tmp_path / "ledger.jsonl")) == 1  # over-counted, never under-counted


def test_ledger_path_that_is_a_symlink_stays_a_symlink(sets, tmp_path, run_popri):
    priv, syn = sets
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "ledger.jsonl").write_text(json.dumps(_entry(rid="earlier").to_dict()) + "\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ledger.jsonl").symlink_to(shared / "ledger.jsonl")
    run_popri(_score(priv, syn, run_dir / "s.npy"), check=True)
    assert (run_dir / "ledger.jsonl").is_symlink()
    assert [e["release_id"] for e in _lines(shared / "ledger.jsonl")][0] == "earlier"
    assert len(_lines(shared / "ledger.jsonl")) == 2


def test_torn_last_line_is_skipped_and_cut_by_the_next_append(tmp_path):
    led = tmp_path / "ledger.jsonl"
    whole = json.dumps(_entry(rid="a").to_dict()) + "\n"
    led.write_text(whole + json.dumps(_entry(rid="b").to_dict())[:40])
    assert [e.release_id for e in ledger.read_ledger(led)] == ["a"]
    ledger.append(led, [_entry(rid="c")])
    assert [e.release_id for e in ledger.read_ledger(led)] == ["a", "c"]


@pytest.mark.parametrize("bad, field", [
    ({"steps": 1.9}, "steps"), ({"steps": True}, "steps"), ({"noise_multiplier": "1"}, None),
    ({"neighbouring": "not add/remove one client"}, None), ({"mode": "prod"}, None),
    ({"sample_rate": None}, None), ({"params": []}, None), ({"noise_multiplier": 1e400}, None),
])
def test_ledger_entries_are_type_checked(tmp_path, bad, field):
    d = _entry(rid="a").to_dict()
    d.update(bad)
    led = tmp_path / "ledger.jsonl"
    led.write_text(json.dumps(d).replace("Infinity", "1e400") + "\n")
    with pytest.raises(InputError) as e:
        ledger.read_ledger(led)
    assert e.value.line == 1
    if field:
        assert e.value.field == field


def test_relation_check_is_exact_not_a_substring():
    from popri.privacy import accounting as A

    d = _entry(rid="a").to_dict()
    d["neighbouring"] = "not add/remove one client"
    with pytest.raises(A.ParameterError):
        A.compose([d], 3e-6)


def test_library_caller_writes_the_same_ledger_as_the_cli(sets, tmp_path, run_popri):
    from popri.feedback.release import release_scores

    priv, syn = sets
    run_popri(_score(priv, syn, tmp_path / "cli" / "s.npy", "--sample-rate", "0.5"), check=True)
    r = release_scores(priv, syn, noise_multiplier=1.0, seed=3, sample_rate=0.5,
                       out=str(tmp_path / "lib" / "s.npy"))
    a = _lines(tmp_path / "cli" / "ledger.jsonl")
    b = _lines(tmp_path / "lib" / "ledger.jsonl")
    assert a == b and r["entry"].to_dict() == b[0]
    assert np.array_equal(np.load(tmp_path / "cli" / "s.npy"), np.load(tmp_path / "lib" / "s.npy"))


def test_diagnostic_scores_write_no_ledger_and_say_so(sets, tmp_path, run_popri):
    priv, syn = sets
    run_popri(_score(priv, syn, tmp_path / "d" / "exact.npy", "--diagnostic", z="0"), check=True)
    assert not (tmp_path / "d" / "ledger.jsonl").exists()
    side = json.loads((tmp_path / "d" / "exact.json").read_text())
    assert side["diagnostic"] is True and side["private"] is False and side["ledger"] == []
    p = run_popri(_score(priv, syn, tmp_path / "e" / "x.npy", "--diagnostic", z="1"))
    assert p.returncode == 2 and not (tmp_path / "e" / "x.npy").exists()


# --------------------------------------------------------------------------- 3. modes
def test_research_mode_is_recorded_and_account_warns(sets, tmp_path, run_popri):
    priv, syn = sets
    run_popri(_score(priv, syn, tmp_path / "s.npy"), check=True)
    side = json.loads((tmp_path / "s.json").read_text())
    assert side["privacy_mode"] == "research" and side["ledger"][0]["mode"] == "research"
    assert side["params"]["seed"] == 3
    p = run_popri(["account", "ledger", str(tmp_path)], check=True)
    assert "RESEARCH mode" in p.stderr


def test_release_mode_is_discrete_hides_counts_and_seed(sets, tmp_path, run_popri):
    priv, syn = sets
    run_popri(_score(priv, syn, tmp_path / "s.npy", "--sample-rate", "0.5", "--release"),
              check=True)
    side = json.loads((tmp_path / "s.json").read_text())
    e = side["ledger"][0]
    assert side["privacy_mode"] == "release" and e["mode"] == "release"
    for k in ("participating_clients", "total_clients", "denominator", "seed"):
        assert k not in side["params"] and k not in e["params"]
    assert side["params"]["reduce"] == "sum"  # Poisson + private N: the noisy sum
    # the noise is discrete: every released value lies on the power-of-two grid
    g = N.snap_grid(1.0, 40)
    s = np.load(tmp_path / "s.npy").astype(np.float64)
    assert np.allclose(np.round(s / g) * g, s, rtol=0, atol=g * 1e-3 + 1e-6 * np.abs(s))
    assert e["params"]["noise"] == "discrete-gaussian"
    assert e["noise_multiplier"] == 1.0  # the z it was passed: the noise covers the snapping
    q = run_popri(["account", "ledger", str(tmp_path)], check=True)
    assert "RESEARCH" not in q.stderr
    r = run_popri(_score(priv, syn, tmp_path / "t.npy", "--release", "--per-client-out",
                         tmp_path / "c.npy"))
    assert r.returncode == 2 and "--per-client-out" in r.stderr


def test_fred_release_mode_records_the_multiplier_it_calibrated(tmp_path, run_popri):
    rng = np.random.default_rng(1)
    p = _emb_set(tmp_path / "p.npy", rng.normal(size=(60, 6)).astype(np.float32))
    run_popri(["fred", "stats", "--private", p, "--out", tmp_path / "st.npz", "--epsilon", "0.5", "--delta",
               "1e-5", "--release"], check=True)
    ents = _lines(tmp_path / "ledger.jsonl")
    assert [e["mode"] for e in ents] == ["release", "release"]
    side = json.loads((tmp_path / "st.json").read_text())
    z = ents[0]["noise_multiplier"]
    for e, sens in zip(ents, (side["params"]["mean_sensitivity"],
                              side["params"]["cov_sensitivity"]), strict=True):
        assert e["noise_multiplier"] == z and "nominal_noise_multiplier" not in e["params"]
        assert e["params"]["noise"] == "discrete-gaussian"
        # the std drawn covers the snapped sensitivity: z (D + g sqrt(dim)) > z D
        assert z * sens < e["params"]["noise_std_on_sum"] <= z * sens * (1 + N.SNAP_SHARE)


# --------------------------------------------------------------------------- 4. budget guard
def test_account_max_epsilon_exits_nonzero_over_budget(tmp_path, run_popri):
    led = tmp_path / "ledger.jsonl"
    led.write_text(json.dumps(_entry(z=1.0, q=1.0, rid="a").to_dict()) + "\n")
    ok = run_popri(["account", "ledger", str(led), "--max-epsilon", "100"])
    assert ok.returncode == 0
    bad = run_popri(["account", "ledger", str(led), "--max-epsilon", "1", "--json"])
    assert bad.returncode == 4 and json.loads(bad.stdout)["within_budget"] is False


# --------------------------------------------------------------------------- the discrete mechanism
@settings(max_examples=40, deadline=None)
@given(sens=st.floats(1e-3, 1e3), dim=st.integers(1, 5000), z=st.floats(0.1, 50))
def test_snapping_costs_at_most_its_share(sens, dim, z):
    g, snapped = N.snapped_sensitivity(sens, dim)
    assert g == N.snap_grid(sens, dim)
    assert math.log2(g) == int(math.log2(g))  # a power of two
    assert g * math.sqrt(dim) <= N.SNAP_SHARE * sens
    assert sens < snapped <= sens * (1 + N.SNAP_SHARE)


@settings(max_examples=60, deadline=None)
@given(sens=st.floats(1e-2, 1e2), dim=st.integers(1, 64), seed=st.integers(0, 2**32 - 1))
def test_the_snapped_sensitivity_bounds_every_pair_of_neighbours(sens, dim, seed):
    """Worst case, not a bound on the bound: for aggregates x and x' with ||x - x'|| <= D (one
    at the grid's half-points, where rounding moves it most), the snapped ones differ by at most
    D + g sqrt(dim), the sensitivity the release mode noise is drawn for."""
    rng = np.random.default_rng(seed)
    g, snapped = N.snapped_sensitivity(sens, dim)
    x = (rng.integers(-50, 50, dim) + 0.5 - 1e-9) * g
    d = rng.normal(size=dim)
    xp = x + d / np.linalg.norm(d) * sens
    gap = np.linalg.norm(np.rint(x / g) - np.rint(xp / g)) * g
    assert gap <= snapped * (1 + 1e-12)


def test_release_noise_has_std_z_times_the_snapped_sensitivity():
    """In grid units the noise of discrete_gaussian_release(x, z, D) has std z D' / g (D' the
    snapped sensitivity): its multiplier on the snapped sum is exactly the z passed."""
    z, sens, dim = 0.7, 3.0, 20000
    out, g = N.discrete_gaussian_release(np.zeros(dim), z, sens, N.make_rng(5, stream="t"))
    _, snapped = N.snapped_sensitivity(sens, dim)
    # 20000 draws: the sample std is within 3% of the true one with overwhelming probability
    assert abs(out.std() / (z * snapped) - 1) < 0.03


@settings(max_examples=25, deadline=None)
@given(x=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30), sens=st.floats(1e-2, 10))
def test_release_outputs_lie_on_one_grid_whatever_the_input(x, sens):
    out, g = N.discrete_gaussian_release(np.array(x), 2.0, sens, N.SecureRandom())
    k = out / g
    assert np.array_equal(k, np.round(k))


def test_discrete_gaussian_matches_its_pmf():
    from scipy import stats

    sigma = 2.5
    draws = N.discrete_gaussian(sigma, 60000, N.make_rng(0, stream="t"))
    support = np.arange(-12, 13)
    pmf = np.exp(-support ** 2 / (2 * sigma ** 2))
    pmf /= pmf.sum()
    obs = np.array([(draws == k).sum() for k in support])
    keep = pmf * len(draws) > 5
    chi = stats.chisquare(obs[keep], pmf[keep] / pmf[keep].sum() * obs[keep].sum())
    assert chi.pvalue > 1e-3
    big = N.discrete_gaussian(1e4, 40000, N.SecureRandom())
    assert abs(big.std() / 1e4 - 1) < 0.02 and abs(big.mean()) < 300
