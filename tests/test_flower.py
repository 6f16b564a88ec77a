"""Client feedback on Flower with SecAgg+: the derived parameters, one node's upload, and real
simulation rounds (real processes, loopback only, bounded in time) against the in-process path.

    python -m pytest -q tests/test_flower.py                 # ~1-2 min (each round ~9 s, Ray)
    python -m pytest -q tests/test_flower.py -k "not round"  # the maths only, no flwr needed
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from popri.core import io
from popri.federated import secagg
from popri.apps.flower import node

needs_flower = pytest.mark.skipif(
    __import__("importlib").util.find_spec("flwr") is None,
    reason="flwr not installed (pip install 'popri[flower]'; scripts/test-min.sh installs it)")


# --------------------------------------------------------------------------- derived parameters
@settings(max_examples=200, deadline=None)
@given(st.integers(3, 5000), st.floats(0, 0.45))
def test_shares_and_threshold_are_secure_and_tolerate_the_planned_dropouts(n, d):
    try:
        k, t = secagg.shares(n, d)
    except ValueError as e:  # only when the threshold would not be above half
        assert "half" in str(e)
        return
    assert 3 <= k <= n and 2 <= t <= k - 1
    assert t > k / 2                                    # no server gets both kinds of shares
    assert k - t >= math.ceil(d * k) or t == k - 1      # d*k neighbours may drop
    if n > secagg.FULL_GRAPH:
        # a partial neighbourhood: O(log n) shares, made odd (which can reach n = 65: k = 65)
        assert k <= max(secagg.FULL_GRAPH, 8 * math.ceil(math.log2(n))) + 1


@settings(max_examples=200, deadline=None)
@given(st.integers(3, 4000), st.floats(0, 0.4), st.floats(1e-3, 1e3), st.floats(0, 50),
       st.integers(1, 50_000))
def test_quantisation_never_wraps_and_the_clip_covers_the_noise_tail(n, d, bound, z, dim):
    try:
        secagg.shares(n, d)
    except ValueError:
        assume(False)  # too many planned dropouts for a secure threshold (tested above)
    p = secagg.plan(nodes=n, max_dropout=d, dim=dim, value_bound=bound, noise_std=z * bound)
    # Flower sums n values in [0, T] and a weight entry that sums to n*T, mod M
    assert n * p.quantization_range < p.modulus_range <= 2 ** 32
    assert p.quantization_range & (p.quantization_range - 1) == 0
    assert p.clipping_range >= bound + 5 * p.node_std * (p.node_std > 0)
    assert p.node_std == pytest.approx(z * bound / math.sqrt(p.min_survivors))
    assert p.error_bound == pytest.approx(n * 2 * p.clipping_range / p.quantization_range)


def test_plan_refuses_what_cannot_be_secure():
    with pytest.raises(ValueError, match="at least 3"):
        secagg.plan(nodes=2, max_dropout=0, dim=4, value_bound=1)
    with pytest.raises(ValueError, match="0.5"):
        secagg.plan(nodes=10, max_dropout=0.5, dim=4, value_bound=1)
    with pytest.raises(ValueError, match="overflow"):
        secagg.plan(nodes=300, max_dropout=0, dim=4, value_bound=1, mechanism="ddg",
                    ddg_bits=24)
    p = secagg.plan(nodes=1024, max_dropout=0.1, dim=4, value_bound=1)
    assert p.quantization_range == 2 ** 21  # 1024 uploads + the weight entry fill 2^32


def test_guaranteed_noise_follows_the_survivors():
    p = secagg.plan(nodes=10, max_dropout=0.2, dim=4, value_bound=1, noise_std=1.0)
    assert p.min_survivors == 8
    assert secagg.guaranteed_multiplier(1.0, 8, p) == pytest.approx(1.0)
    assert secagg.guaranteed_multiplier(1.0, 10, p) == pytest.approx(math.sqrt(10 / 8))
    assert secagg.guaranteed_multiplier(1.0, 6, p) < 1.0  # more dropouts than planned: weaker


# --------------------------------------------------------------------------- one node's upload
def test_node_upload_is_the_sum_of_its_clients_score_vectors():
    from popri.feedback import cosine

    rng = np.random.default_rng(0)
    emb, syn = rng.normal(size=(12, 8)), rng.normal(size=(5, 8))
    ids = [f"c{i % 3}" for i in range(12)]
    s = {"mode": "cosine", "clip": 1.0, "standardize": True,
         "secagg": {"mechanism": "gaussian", "node_std": 0.0}}
    up = node.upload(s, syn, emb, ids, rng)
    want = sum(cosine.client_vector(emb[[i for i in range(12) if ids[i] == c]], syn, clip=1.0,
                                    standardize=True) for c in ("c0", "c1", "c2"))
    np.testing.assert_allclose(up, want, atol=1e-6)
    # the noise share has the planned std
    s["secagg"]["node_std"] = 2.0
    noisy = np.stack([node.upload(s, syn, emb, ids, np.random.default_rng(k)) for k in range(400)])
    assert np.std(noisy - want) == pytest.approx(2.0, rel=0.1)


# --------------------------------------------------------------------------- real Flower rounds
@pytest.fixture
def fed(tmp_path):
    """30 clients x 5 embeddings (d = 16) and 400 synthetic samples, as embedding sets."""
    rng = np.random.default_rng(0)
    io.save_embedding_set(tmp_path / "priv.npy", rng.normal(size=(150, 16)),
                          [{"id": f"p{i}", "client_id": f"c{i // 5}"} for i in range(150)],
                          meta={"model": "toy"})
    io.save_embedding_set(tmp_path / "syn.npy", rng.normal(size=(400, 16)),
                          [{"id": f"s{i}"} for i in range(400)], meta={"model": "toy"})
    return tmp_path


def score(tmp_path, out, *args, env=None, timeout=300):
    cmd = [sys.executable, "-m", "popri.cli.app", "score", "--private",
           str(tmp_path / "priv.npy"), "--synthetic", str(tmp_path / "syn.npy"), "--seed", "1",
           "--out", str(tmp_path / out), *map(str, args)]
    # a tag in the environment, which the Flower / Ray processes inherit: no_ray_left looks
    # for this worker's processes only (the other xdist worker may be running a round)
    tag = f"{os.getpid()}-{len(_TAGS)}"
    _TAGS.append(tag)
    e = dict(os.environ, POPRI_THREADS="2", POPRI_TEST_TAG=tag, **(env or {}))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
    assert r.returncode == 0, r.stderr[-3000:]
    scores, side = io.load_scores(tmp_path / out)
    return scores, side, r.stderr


_TAGS: list[str] = []


def no_ray_left():
    """Processes still alive that a round this worker started left behind (by the tag in their
    environment; /proc, Linux)."""
    tags = {f"POPRI_TEST_TAG={t}".encode() for t in _TAGS}
    left = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = set((d / "environ").read_bytes().split(b"\0"))
            args = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if env & tags:
            left.append(f"{d.name} {args[:200]}")
    return left


@needs_flower
@pytest.mark.parametrize("mech,mode", [("gaussian", "cosine"), ("ddg", "cosine"),
                                       ("ddg", "nn-histogram")])
def test_flower_round_at_z0_equals_in_process_within_the_quantisation_bound(fed, mech, mode):
    base = ["--mode", mode, "-z", "0", "--clients-per-round", "12"]
    a, side_a, _ = score(fed, "a.npy", *base)
    b, side_b, err = score(fed, "b.npy", *base, "--engine", "flower", "--supernodes", "4",
                           "--secagg-mechanism", mech)
    eng = side_b["params"]["engine"]
    assert eng["engine"] == "flower" and eng["survivors"] == 4 and eng["supernodes"] == 4
    bound = eng["quantisation_bound"] / side_a["params"]["denominator"] if mode == "cosine" \
        else eng["quantisation_bound"]
    assert np.abs(a - b).max() <= bound + 1e-6
    if mode == "nn-histogram":
        np.testing.assert_array_equal(a, b)  # integer votes: exact
    assert side_a["ids"] == side_b["ids"]
    led = side_b["ledger"][0]
    assert led["mechanism"] == ("distributed_discrete_gaussian" if mech == "ddg"
                                else "subsampled_gaussian")
    assert not list(fed.glob(".popri-flower-*")), "the job directory is removed"
    assert not no_ray_left()


@needs_flower
def test_flower_round_noise_on_the_sum_has_std_z_times_c(fed):
    """Gaussian path, no dropout planned: 12 of the clients a round is a fixed-size sample,
    replace one client, so the sum's noise std is z 2C (statistical, 400 values)."""
    base = ["-z", "0", "--clients-per-round", "12", "--standardize"]
    exact, side, _ = score(fed, "exact.npy", *base)
    noisy, side_n, _ = score(fed, "noisy.npy", "-z", "2", "--clients-per-round", "12",
                             "--engine", "flower", "--supernodes", "4",
                             "--secagg-mechanism", "gaussian", "--max-dropout", "0")
    L = side["params"]["denominator"]
    resid = (noisy - exact) * L  # back to the sum
    # std of 400 normals: relative standard error ~ 1/sqrt(800) = 3.5%; 5 se
    assert np.std(resid) == pytest.approx(4.0, rel=0.18)
    assert abs(np.mean(resid)) < 5 * 4.0 / np.sqrt(400)
    led = side_n["ledger"][0]
    assert led["noise_multiplier"] == pytest.approx(2.0) and led["sensitivity"] == 2.0
    assert led["neighbouring"] == "replace one client"


@needs_flower
def test_a_node_dropping_mid_round_is_recovered_and_the_ledger_states_what_holds(fed):
    noisy, side, err = score(fed, "d.npy", "-z", "1", "--clients-per-round", "12",
                             "--engine", "flower", "--supernodes", "5",
                             "--secagg-mechanism", "gaussian", "--max-dropout", "0.2",
                             env={"POPRI_FLOWER_DROP": "2"})
    eng = side["params"]["engine"]
    assert eng["survivors"] == 4 and eng["supernodes"] == 5
    assert "1 of 5 SuperNodes dropped out" in err
    led = side["ledger"][0]
    # n_min = 4 planned: four survivors give exactly the planned noise
    assert led["noise_multiplier"] == pytest.approx(1.0)
    # 7 nodes, d = 0.2: noise for n_min = 6, threshold t = 5 of 7 shares.  Two dropouts: SecAgg+
    # still recovers, but the noise is that of 5 < 6 nodes: the ledger records the weaker z
    _, side2, err2 = score(fed, "d2.npy", "-z", "1", "--clients-per-round", "14",
                           "--engine", "flower", "--supernodes", "7",
                           "--secagg-mechanism", "gaussian", "--max-dropout", "0.2",
                           env={"POPRI_FLOWER_DROP": "1,3"})
    eng2 = side2["params"]["engine"]
    assert eng2["survivors"] == 5 and eng2["secagg"]["threshold"] == 5
    assert side2["ledger"][0]["noise_multiplier"] == pytest.approx(math.sqrt(5 / 6))
    # three dropouts leave fewer than t: SecAgg+ halts; exit 1, nothing written or recorded
    r = subprocess.run(
        [sys.executable, "-m", "popri.cli.app", "score", "--private", str(fed / "priv.npy"),
         "--synthetic", str(fed / "syn.npy"), "-z", "1", "--clients-per-round", "14",
         "--out", str(fed / "d3.npy"), "--engine", "flower", "--supernodes", "7",
         "--secagg-mechanism", "gaussian", "--max-dropout", "0.2"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, POPRI_THREADS="2", POPRI_FLOWER_DROP="0,1,3"))
    assert r.returncode == 1 and "SecAgg+ halted" in r.stderr and ".popri-flower-" in r.stderr
    # the job (the clients' embeddings) is gone; its log is kept next to the output
    assert not [d for d in fed.glob(".popri-flower-*") if d.is_dir()]
    assert list(fed.glob(".popri-flower-*.log"))
    assert not (fed / "d3.npy").exists()
    assert len((fed / "ledger.jsonl").read_text().splitlines()) == 2
    assert not no_ray_left()


@needs_flower
def test_flower_engine_refusals_are_one_line_exit_2(fed, run_popri):
    common = ["score", "--private", fed / "priv.npy", "--synthetic", fed / "syn.npy", "-z", "1",
              "--out", fed / "x.npy", "--engine", "flower"]
    r = run_popri([*common, "--clients-per-round", "2"])
    assert r.returncode == 2 and "at least 3 SuperNodes" in r.stderr
    r = run_popri([*common, "--per-client-out", fed / "rows.npy"])
    assert r.returncode == 2 and "secure sum" in r.stderr
    r = run_popri([*common, "--release", "--secagg-mechanism", "gaussian"])
    assert r.returncode == 2 and "ddg" in r.stderr
    assert not (fed / "x.npy").exists()


@needs_flower
@pytest.mark.slow
def test_popri_run_with_the_flower_engine_gives_the_in_process_table_at_z0(tmp_path, run_popri,
                                                                           tiny_lm, tiny_st_model):
    """`score.engine: flower` in `popri run`: at z = 0 the Flower scores equal the in-process
    ones within the quantisation bound, so the preference pairs, the tuned generator and the
    results table are the same (tiny random models; ~2 x 1.5 min).  popri run refuses z = 0: z = 1e-9 is
    noise far below the quantisation bound."""
    from test_run_e2e import _texts, popri_cmd, tiny_overrides

    rng = np.random.default_rng(0)
    priv = tmp_path / "priv.jsonl"
    from conftest import write_jsonl

    write_jsonl(priv, [{"user": f"u{i % 24}", "text": t} for i, t in enumerate(_texts(rng, 192))])
    data = tmp_path / "data"
    run_popri(["bench", "fetch", priv, "--client-column", "user", "--out", data, "--seed", "0"],
              check=True)
    pub = tmp_path / "public.jsonl"
    write_jsonl(pub, [{"id": f"p{i}", "text": t} for i, t in enumerate(_texts(rng, 30))])
    tables = {}
    for eng in ("inprocess", "flower"):
        run = tmp_path / eng
        ov = tiny_overrides(run, data, pub, tiny_lm, tiny_st_model) + [
            "rounds=1", "baselines=false", "privacy.epsilon=null", "privacy.noise_multiplier=1e-9",
            "score.clients_per_round=6", f"score.engine={eng}", "score.supernodes=3",
            "score.recovery_rate=false"]
        r = subprocess.run(popri_cmd(ov), capture_output=True, text=True, timeout=900,
                           env=dict(os.environ, POPRI_THREADS="2"))
        assert r.returncode == 0, r.stderr[-3000:]
        tables[eng] = r.stdout
        side = json.loads((run / "round1" / "scores.json").read_text())
        assert (side["params"].get("engine", {}).get("engine") == "flower") == (eng == "flower")
    a = np.load(tmp_path / "inprocess" / "round1" / "scores.npy")
    b = np.load(tmp_path / "flower" / "round1" / "scores.npy")
    assert np.abs(a - b).max() < 1e-4
    pairs = {eng: [(p["chosen_id"], p["rejected_id"]) for p in
                   map(json.loads, (tmp_path / eng / "round1" / "prefs.jsonl").open())]
             for eng in ("inprocess", "flower")}
    assert pairs["inprocess"] == pairs["flower"]  # (their recorded scores differ by ~1e-8)

    def utility(table, run):
        """The table without its privacy figures: at z = 1e-9 the epsilons are astronomical and
        differ by mechanism (Gaussian in-process, distributed discrete Gaussian on Flower)."""
        out = []
        for line in table.replace(str(run), "RUN").splitlines():
            if "epsilon" in line:
                continue
            cells = line.split("|")
            out.append("|".join(cells[:2] + cells[3:]) if line.startswith("| POPri") else line)
        return out

    assert utility(tables["inprocess"], tmp_path / "inprocess") == \
        utility(tables["flower"], tmp_path / "flower")
    assert any(l.startswith("| POPri") for l in utility(tables["flower"], tmp_path / "flower"))


def test_deployment_settings_are_checked_before_anything_runs():
    from popri.core.errors import ConfigError
    from popri.specs.feedback import ScoreSpec

    with pytest.raises(ConfigError, match="--engine flower"):
        ScoreSpec(noise_multiplier=1, federation="popri")
    with pytest.raises(ConfigError, match="--supernodes"):
        ScoreSpec(noise_multiplier=1, engine="flower", federation="popri")
    with pytest.raises(ConfigError, match="q = 1"):
        ScoreSpec(noise_multiplier=1, engine="flower", federation="popri", supernodes=3,
                  clients_per_round=3)
    s = ScoreSpec(noise_multiplier=1, engine="flower", federation="popri", supernodes=3)
    assert s.federation == "popri"


def test_score_without_private_data_needs_a_federation(tmp_path, run_popri):
    io.save_embedding_set(tmp_path / "syn.npy", np.ones((3, 4)), [{"id": f"s{i}"} for i in range(3)])
    r = run_popri(["score", "--synthetic", tmp_path / "syn.npy", "-z", "1", "--out",
                   tmp_path / "x.npy"])
    assert r.returncode == 2 and "--private" in r.stderr and not (tmp_path / "x.npy").exists()
