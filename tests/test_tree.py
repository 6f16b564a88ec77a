"""Tree-aggregation noise (popri.privacy.tree) and the ``tree_aggregation`` mechanism (DP-FTRL).

    python -m pytest -q tests/test_tree.py
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from popri.privacy import accounting as A
from popri.privacy import tree as T
from popri.privacy.ledger import LedgerEntry, append
from popri.privacy.noise import snap_grid
from popri.privacy.tree import TreeNoise, depth, leaf_nodes, prefix_nodes

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DELTA = 3e-6
BIG = 20_000  # dims for the statistical checks: sample variance within ~1% (1 sd), tol 6 sd


def _leaves(node):
    lv, i = node
    return set(range(i * 2 ** lv + 1, (i + 1) * 2 ** lv + 1))


def _var_ok(x, var, sds=6.0):
    """Sample variance of ``x`` (mean 0 known) within ``sds`` standard errors of ``var``."""
    v = float(np.mean(x * x))
    return abs(v / var - 1) < sds * math.sqrt(2 / x.size)


# --------------------------------------------------------------------------- tree combinatorics
def test_prefix_nodes_examples():
    assert prefix_nodes(1) == [(0, 0)]
    assert prefix_nodes(6) == [(2, 0), (1, 2)]
    assert prefix_nodes(7) == [(2, 0), (1, 2), (0, 6)]
    assert prefix_nodes(8) == [(3, 0)]
    assert [depth(n) for n in (1, 2, 3, 4, 5, 7, 8, 9)] == [1, 2, 2, 3, 3, 3, 4, 4]


@FAST
@given(st.integers(1, 10 ** 6))
def test_prefix_nodes_tile_leaves_one_to_step(step):
    nodes = prefix_nodes(step)
    assert len(nodes) == bin(step).count("1")
    covered = [_leaves(n) for n in nodes]
    assert sum(map(len, covered)) == step
    assert set().union(*covered) == set(range(1, step + 1))
    # left to right, contiguous
    assert [min(c) for c in covered] == sorted(min(c) for c in covered)


@FAST
@given(st.integers(1, 300))
def test_depth_is_the_most_used_nodes_holding_one_leaf(leaves):
    used = set()
    for s in range(1, leaves + 1):
        used.update(prefix_nodes(s))
    per_leaf = [sum(t in _leaves(n) for n in used) for t in range(1, leaves + 1)]
    assert max(per_leaf) == depth(leaves) == per_leaf[0]
    assert depth(leaves) == math.ceil(math.log2(leaves + 1))  # dp-accounting's formula
    assert depth(leaves) <= math.ceil(math.log2(leaves)) + 1  # the padded tree's path
    for t in (1, leaves, (leaves + 1) // 2):
        assert set(leaf_nodes(t, leaves)) == {n for n in used if t in _leaves(n)}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None, "3"])
def test_depth_and_prefix_nodes_refuse_bad_arguments(bad):
    with pytest.raises(ValueError):
        depth(bad)
    with pytest.raises(ValueError):
        prefix_nodes(bad)


# --------------------------------------------------------------------------- research mode
def test_prefix_variance_is_popcount_times_std_squared():
    std, L = 1.7, 16
    tn = TreeNoise(BIG, std, L, seed=2024)
    for r in range(1, 2 * L + 1):
        x = tn.prefix(r)
        assert x.dtype == np.float64 and x.shape == (BIG,)
        k = tn.node_count(r)
        assert k == bin((r - 1) % L + 1).count("1")
        assert _var_ok(x, k * std ** 2), (r, k, float(np.var(x)))
        assert abs(float(x.mean())) < 6 * std * math.sqrt(k / BIG)


def test_variance_check_can_fail():
    tn = TreeNoise(BIG, 1.0, 8, seed=1)
    assert not _var_ok(tn.prefix(3), 1.0)   # 2 nodes: variance 2, not 1
    assert not _var_ok(tn.prefix(7), 2.0)   # 3 nodes


@FAST
@given(st.integers(0, 2 ** 63 - 1), st.integers(1, 9),
       st.lists(st.integers(1, 40), min_size=1, max_size=8))
def test_research_mode_is_a_pure_function_of_seed_and_round(seed, L, rounds):
    a = TreeNoise(5, 0.8, L, seed=seed)
    ref = {r: a.prefix(r) for r in sorted(set(rounds))}
    b = TreeNoise(5, 0.8, L, seed=seed)  # a fresh process resuming at any round, any order
    for r in reversed(rounds):
        assert np.array_equal(b.prefix(r), ref[r])
    c = TreeNoise.from_state(a.state())
    assert np.array_equal(c.prefix(rounds[0]), ref[rounds[0]])
    assert not np.array_equal(TreeNoise(5, 0.8, L, seed=seed ^ 1).prefix(rounds[0]),
                              ref[rounds[0]])


@FAST
@given(st.integers(0, 2 ** 32), st.integers(1, 9), st.integers(1, 40))
def test_prefix_is_the_sum_of_its_nodes_and_increments_telescope(seed, L, r):
    tn = TreeNoise(6, 1.3, L, seed=seed)
    t, s = tn.locate(r)
    assert (t, s) == ((r - 1) // L, (r - 1) % L + 1)
    total = sum(tn.node(t, lv, i) for lv, i in prefix_nodes(s))
    np.testing.assert_allclose(tn.prefix(r), total, rtol=0, atol=1e-12)
    first = t * L + 1
    inc = sum(tn.increment(q) for q in range(first, r + 1))
    np.testing.assert_allclose(inc, tn.prefix(r), rtol=0, atol=1e-11)


def test_chunked_generation_equals_one_draw(monkeypatch):
    ref = TreeNoise(1000, 2.0, 4, seed=7).prefix(3)
    monkeypatch.setattr(T, "CHUNK", 64)
    assert np.array_equal(TreeNoise(1000, 2.0, 4, seed=7).prefix(3), ref)
    monkeypatch.setattr(T, "CHUNK", 1000)
    assert np.array_equal(TreeNoise(1000, 2.0, 4, seed=7).prefix(3), ref)


def test_a_restart_starts_an_independent_tree():
    L, std = 4, 1.0
    tn = TreeNoise(BIG, std, L, seed=11)
    last, first = tn.prefix(L), tn.prefix(L + 1)
    assert np.array_equal(first, tn.node(1, 0, 0))       # new tree, one node
    assert _var_ok(first, std ** 2)
    assert abs(float(np.corrcoef(last, first)[0, 1])) < 6 / math.sqrt(BIG)
    assert not np.array_equal(first, tn.prefix(1))        # keyed by the tree index
    # within a tree, steps share nodes: prefix(3) = node(1,0) + node(0,2), prefix(2) = node(1,0)
    np.testing.assert_allclose(tn.prefix(3) - tn.prefix(2), tn.node(0, 0, 2), atol=1e-12)
    assert float(np.corrcoef(tn.prefix(2), tn.prefix(3))[0, 1]) > 0.6   # ~1/sqrt(2)


def test_one_leaf_per_tree_is_independent_gaussians_per_round():
    std = 0.5
    tn = TreeNoise(BIG, std, 1, seed=3)
    xs = [tn.prefix(r) for r in range(1, 7)]
    for r, x in enumerate(xs, 1):
        assert tn.node_count(r) == 1
        assert _var_ok(x, std ** 2)
        assert np.array_equal(tn.increment(r), x)
    c = np.corrcoef(np.stack(xs))
    assert np.max(np.abs(c - np.eye(len(xs)))) < 6 / math.sqrt(BIG)


def test_std_zero_is_zero_noise():
    assert not TreeNoise(4, 0.0, 3, seed=0).prefix(3).any()
    assert not TreeNoise(4, 0.0, 3, seed=None, secure=True, grid=0.5).prefix(3).any()


def test_research_state_is_metadata_only():
    tn = TreeNoise(3, 1.0, 4, seed=5)
    tn.prefix(6)
    s = tn.state()
    assert set(s) == set(T.META_KEYS)
    assert int(s["seed"]) == 5 and int(s["round"]) == 6
    with pytest.raises(ValueError, match="seed"):
        TreeNoise(3, 1.0, 4, seed=6).load_state(s)
    with pytest.raises(ValueError, match="dim"):
        TreeNoise(4, 1.0, 4, seed=5).load_state(s)


@pytest.mark.parametrize("kw, match", [
    (dict(dim=0), "dim"), (dict(dim=2.5), "dim"), (dict(std=-1.0), "std"),
    (dict(std=float("nan")), "std"), (dict(std=float("inf")), "std"),
    (dict(leaves_per_tree=0), "leaves_per_tree"), (dict(seed=None), "seed"),
    (dict(seed=-3), "seed"), (dict(grid=0.5), "grid"),
    (dict(secure=True, seed=None), "grid"), (dict(secure=True, grid=0.3), "power of two"),
    (dict(secure=True, grid=-0.5), "power of two"),
])
def test_bad_arguments_are_value_errors(kw, match):
    base = dict(dim=3, std=1.0, leaves_per_tree=2, seed=0)
    base.update(kw)
    dim, std, L = base.pop("dim"), base.pop("std"), base.pop("leaves_per_tree")
    with pytest.raises(ValueError, match=match):
        TreeNoise(dim, std, L, **base)


def test_bad_rounds_are_value_errors():
    tn = TreeNoise(3, 1.0, 2, seed=0)
    for r in (0, -1, 1.0, None):
        with pytest.raises(ValueError, match="round_"):
            tn.prefix(r)


# --------------------------------------------------------------------------- release mode
def _keyed_draws(monkeypatch):
    """Replace the CSPRNG by a keyed fake, so two objects draw equal nodes (and count draws)."""
    drawn = []

    def fake(self, tree, level, index):
        drawn.append((tree, level, index))
        rng = np.random.default_rng([tree, level, index])
        return rng.integers(-1000, 1000, self.dim)

    monkeypatch.setattr(TreeNoise, "_draw_units", fake)
    return drawn


def test_release_values_are_multiples_of_the_grid_with_tree_variance():
    g = snap_grid(1.0, BIG)
    std = 0.9
    tn = TreeNoise(BIG, std, 8, seed=None, secure=True, grid=g)
    for r in (1, 3, 7, 8, 9):
        x = tn.prefix(r)
        assert x.dtype == np.float64
        assert np.array_equal(x / g, np.rint(x / g))
        assert _var_ok(x, tn.node_count(r) * std ** 2)
    u = tn.prefix_units(9)
    assert u.dtype == np.int64 and np.array_equal(u * g, tn.prefix(9))


def test_release_refuses_research_only_calls():
    with pytest.raises(ValueError, match="grid"):
        TreeNoise(3, 1.0, 2, seed=0, secure=True)
    with pytest.raises(ValueError, match="release mode"):
        TreeNoise(3, 1.0, 2, seed=0).prefix_units(1)


@FEW
@given(st.integers(1, 9), st.integers(1, 30), st.integers(1, 5))
def test_release_state_round_trips(L, r, ahead):
    with pytest.MonkeyPatch.context() as mp:
        drawn = _keyed_draws(mp)
        a = TreeNoise(7, 2.0, L, seed=None, secure=True, grid=2.0 ** -6)
        for q in range(1, r + 1):
            a.prefix(q)
        s = a.state()
        t, step = a.locate(r)
        held = [k for k in s if k.startswith("node_")]
        assert sorted(held) == sorted(f"node_L{lv}_I{i}" for lv, i in prefix_nodes(step))
        b = TreeNoise.from_state({k: np.array(v) for k, v in s.items()})
        drawn.clear()
        for q in range(r + 1, r + ahead + 1):
            assert np.array_equal(b.prefix(q), a.prefix(q))
        # b drew only nodes a new step needs, never one it held (a and b each drew them)
        assert len(drawn) == len(set(drawn)) * 2


def test_release_state_saved_to_npz_reproduces_the_held_noise(tmp_path):
    a = TreeNoise(50, 1.0, 8, seed=None, secure=True, grid=2.0 ** -10)
    for q in range(1, 8):
        x7 = a.prefix(q)
    np.savez(tmp_path / "tree.npz", **a.state())
    with np.load(tmp_path / "tree.npz") as f:
        b = TreeNoise.from_state(f)
    assert np.array_equal(b.prefix(7), x7)             # the last round again: held nodes only
    nxt = b.prefix(8)                                   # step 8: one fresh node, level 3
    assert b.node_count(8) == 1 and not np.array_equal(nxt, x7)
    c = TreeNoise(50, 1.0, 8, seed=None, secure=True, grid=2.0 ** -10)
    with np.load(tmp_path / "tree.npz") as f:
        c.load_state(f)
    assert np.array_equal(c.prefix(7), x7)
    with pytest.raises(ValueError, match="grid"):
        with np.load(tmp_path / "tree.npz") as f:
            TreeNoise(50, 1.0, 8, seed=None, secure=True, grid=2.0 ** -9).load_state(f)


def test_release_drops_other_trees_and_moves_forward_only():
    tn = TreeNoise(4, 1.0, 4, seed=None, secure=True, grid=0.25)
    tn.prefix(3)
    assert len([k for k in tn.state() if k.startswith("node_")]) == 2
    p5 = tn.prefix(5)  # a new tree
    s = tn.state()
    assert [k for k in s if k.startswith("node_")] == ["node_L0_I0"] and int(s["tree"]) == 1
    with pytest.raises(ValueError, match="forward"):
        tn.prefix(4)
    with pytest.raises(ValueError, match="not held"):
        tn.node(0, 1, 0)
    inc = tn.increment(6)  # in order: works, and telescopes
    assert np.array_equal(p5 + inc, tn.prefix(6))


def test_release_increment_telescopes(monkeypatch):
    _keyed_draws(monkeypatch)
    a = TreeNoise(5, 1.0, 8, seed=None, secure=True, grid=0.5)
    b = TreeNoise(5, 1.0, 8, seed=None, secure=True, grid=0.5)
    acc = np.zeros(5)
    for r in range(1, 9):
        acc = acc + a.increment(r)
        assert np.array_equal(acc, b.prefix(r))
    with pytest.raises(ValueError, match="increment"):
        TreeNoise(5, 1.0, 8, seed=None, secure=True, grid=0.5).increment(2)


def test_malformed_state_is_refused():
    a = TreeNoise(3, 1.0, 4, seed=None, secure=True, grid=0.5)
    a.prefix(3)
    s = a.state()
    bad = dict(s)
    bad.pop("node_L0_I2")
    with pytest.raises(ValueError, match="expected"):
        TreeNoise.from_state(bad)
    bad = dict(s, node_L0_I2=np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match="shape"):
        TreeNoise.from_state(bad)
    with pytest.raises(ValueError, match="lacks"):
        TreeNoise.from_state({k: v for k, v in s.items() if k != "round"})
    with pytest.raises(ValueError, match="unexpected"):
        TreeNoise.from_state(dict(TreeNoise(3, 1.0, 4, seed=1).state(), node_L1_I0=s["node_L1_I0"]))


# --------------------------------------------------------------------------- accounting
def _entry(z, steps=20, leaves=1, q=1.0, rid="", **kw):
    return LedgerEntry(stage="fl", mechanism="tree_aggregation", noise_multiplier=z,
                       sample_rate=q, steps=steps, delta=DELTA, sensitivity=0.1,
                       params={"leaves": leaves}, release_id=rid, **kw)


@pytest.mark.parametrize("z, eps", [(19.5, 0.99), (3.35, 6.96)])
def test_dp_ftrl_paper_epsilons(z, eps):
    """DP-FTRL at full participation, a restart every round, T = 20, delta = 3e-6 (issue 13;
    dp-accounting's SingleEpochTreeAggregationDpEvent gives 0.986 / 6.962)."""
    one = A.compose([_entry(z)], DELTA, "rdp")
    many = A.compose([_entry(z, steps=1) for _ in range(20)], DELTA, "rdp")
    assert round(one.epsilon, 2) == eps
    assert many.epsilon == pytest.approx(one.epsilon, rel=1e-12)
    assert one.epsilon == pytest.approx({19.5: 0.98632, 3.35: 6.96215}[z], abs=1e-5)
    g = one.groups[0]
    assert (g["mechanism"], g["noise_multiplier"], g["sample_rate"], g["leaves"], g["steps"]) \
        == ("tree_aggregation", z, 1.0, 1, 20)
    assert many.groups[0]["steps"] == 20 and many.groups[0]["entries"] == 20


def test_tree_costs_more_than_one_gaussian_per_tree():
    # 8 leaves: depth 4, i.e. the Gaussian at z / 2
    tree = A.compose([_entry(4.0, steps=3, leaves=8)], DELTA).epsilon
    assert tree == pytest.approx(A.epsilon(2.0, 1.0, 3, DELTA), rel=1e-12)
    assert tree > A.epsilon(4.0, 1.0, 3, DELTA)


@FAST
@given(st.integers(1, 2000), st.integers(1, 60), st.floats(0.3, 80.0),
       st.sampled_from([1e-5, 3e-6, 1e-8]))
def test_rdp_matches_dp_accounting_tree_aggregation(leaves, steps, z, delta):
    dp = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import RdpAccountant
    from dp_accounting.privacy_accountant import NeighboringRelation

    acc = RdpAccountant(orders=list(A.ORDERS),
                        neighboring_relation=NeighboringRelation.REPLACE_SPECIAL)
    acc.compose(dp.SelfComposedDpEvent(dp.SingleEpochTreeAggregationDpEvent(z, leaves), steps))
    mine = A.compose([_entry(z, steps=steps, leaves=leaves)], delta, "rdp").epsilon
    assert mine == pytest.approx(acc.get_epsilon(delta), rel=1e-9)
    mech = A.get_mechanism("tree_aggregation")
    np.testing.assert_allclose(mech.rdp((z, 1.0, leaves), steps, A.ORDERS),
                               np.asarray(A.ORDERS) * steps * depth(leaves) / (2 * z * z),
                               rtol=1e-12)


@FEW
@given(st.integers(1, 64), st.integers(1, 30), st.floats(1.0, 30.0))
def test_pld_is_close_to_rdp_or_below(leaves, steps, z):
    pytest.importorskip("dp_accounting")
    e = _entry(z, steps=steps, leaves=leaves)
    rdp = A.compose([e], DELTA, "rdp").epsilon
    pld = A.compose([e], DELTA, "pld").epsilon
    assert pld <= rdp * (1 + 1e-9)
    assert pld >= 0.7 * rdp
    gauss = A.epsilon(z / math.sqrt(depth(leaves)), 1.0, steps, DELTA, "pld")
    assert pld == pytest.approx(gauss, rel=1e-9)


def test_partial_participation_is_accounted_at_q1_with_a_note():
    c = A.compose([_entry(5.0, q=0.1, sampling="poisson")], DELTA)
    assert c.epsilon == pytest.approx(A.compose([_entry(5.0)], DELTA).epsilon, rel=1e-12)
    assert any("no amplification" in n for n in c.notes)


@pytest.mark.parametrize("leaves", [0, 2.5, -1, None, "4"])
def test_bad_leaves_are_refused(leaves):
    with pytest.raises(A.ParameterError, match="params.leaves"):
        _entry(3.0, leaves=leaves)


def test_zero_noise_is_infinite_epsilon():
    assert A.compose([_entry(0.0)], DELTA).epsilon == math.inf


def test_account_ledger_cli_totals_tree_entries(tmp_path):
    z = 3.35
    (tmp_path / "round1").mkdir()
    (tmp_path / "round2").mkdir()
    append(tmp_path / "round1" / "update.npy",
           [_entry(z, steps=1, rid=f"ftrl-{r}") for r in range(1, 11)])
    append(tmp_path / "round2" / "update.npy",
           [_entry(z, steps=1, rid=f"ftrl-{r}") for r in range(6, 21)])  # 6..10 repeated
    p = subprocess.run([sys.executable, "-m", "popri", "account", "ledger", str(tmp_path),
                        "--delta", "3e-6", "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["entries"] == 20
    assert round(out["epsilon"], 2) == 6.96
    (g,) = out["groups"]
    assert (g["mechanism"], g["leaves"], g["steps"]) == ("tree_aggregation", 1, 20)
