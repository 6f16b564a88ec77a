"""A released sum is divided only by a PUBLIC count (issue 43, item 1): the noise on what a
release path writes has the same scale for N and N + 1 clients.

    python -m pytest -q tests/test_public_counts.py

The estimator of the issue: a round whose updates are all zero releases noise alone; its std is
z s lr / D, so D-hat = z s lr / std.  Dividing by the realised or total client count made D-hat
track N (10.03 for N = 10, 11.02 for N = 11); dividing by q N_pub (declared) or a fixed L does
not.  Every release path divides through :func:`popri.federated.aggregation.public_count`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from conftest import write_jsonl

from popri.core.errors import ConfigError
from popri.federated.aggregation import public_count, public_denominator
from popri.methods.dpfl import rounds as R
from popri.specs.fl import FLSpec

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the helper
@pytest.mark.parametrize("sampling,kw,want", [
    ("fixed", {"sample_rate": 0.3, "clients_per_round": 7, "public_clients": None}, 7.0),
    ("none", {"sample_rate": 1.0, "clients_per_round": 7, "public_clients": None}, 7.0),
    ("poisson", {"sample_rate": 0.25, "clients_per_round": None, "public_clients": 40}, 10.0),
    ("bins", {"sample_rate": 0.5, "clients_per_round": None, "public_clients": 40}, 20.0),
    ("none", {"sample_rate": 1.0, "clients_per_round": None, "public_clients": 40}, 40.0),
])
def test_public_count_is_a_setting_or_q_times_the_declared_n(sampling, kw, want):
    assert public_count(sampling, **kw) == want


@pytest.mark.parametrize("sampling", ["poisson", "bins", "none"])
def test_public_count_refuses_without_a_declared_n(sampling):
    with pytest.raises(ConfigError, match="public-clients") as e:
        public_count(sampling, sample_rate=0.5, clients_per_round=None, public_clients=None)
    assert e.value.field == "public_clients"


def test_the_score_mean_goes_through_the_same_helper():
    assert public_denominator("cosine", "poisson", 0.5, 13, 40) == ("mean", 20.0)
    assert public_denominator("cosine", "fixed", 0.5, 13, None) == ("mean", 13.0)
    assert public_denominator("cosine", "poisson", 0.5, 13, None) == ("sum", None)
    assert public_denominator("nn-histogram", "fixed", 0.5, 13, 40) == ("sum", None)


def test_no_release_path_divides_by_a_participation_count():
    """The grep of the issue, as a test: the participation record has no divisor of its own any
    more, and the modules that turn a noisy sum into a mean call public_count."""
    src = (ROOT / "popri/federated/participation.py").read_text(encoding="utf-8")
    assert "def denominator" not in src
    for mod in ("popri/methods/dpfl/rounds.py", "popri/methods/fewfedpit/server.py",
                "popri/federated/aggregation.py"):
        tree = ast.parse((ROOT / mod).read_text(encoding="utf-8"))
        calls = {n.func.id for n in ast.walk(tree)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "public_count" in calls, mod
        # no division of anything by len(...) of the members, the uploads or the clients
        for n in ast.walk(tree):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
                r = n.right
                if isinstance(r, ast.Call) and getattr(r.func, "id", "") == "len":
                    arg = ast.unparse(r.args[0])
                    assert not any(w in arg for w in ("members", "uploads", "clients")), \
                        f"{mod}: {ast.unparse(n)}"


# --------------------------------------------------------------------------- DP-FL, end to end
def _data(tmp_path, n):
    rows = [{"client_id": f"c{i % n}", "text": f"the quick brown fox {i} jumps over the lazy "
             f"dog {i * 7}"} for i in range(n * 2)]
    return write_jsonl(tmp_path / f"data{n}.jsonl", rows)


@pytest.fixture
def zero_updates(monkeypatch):
    """Every client's local update is zero: a round then releases its noise alone."""
    def fake(model, params, theta, seqs, spec, rng, pad, device):
        return np.zeros_like(theta), {"loss": 1.0, "steps": 1, "tokens": 1}

    monkeypatch.setattr(R, "local_update", fake)


def _d_hat(tiny_lm, tmp_path, n, spec, z, *, release, **kw):
    out = tmp_path / f"n{n}" / "round1"
    R.run_round(str(_data(tmp_path, n)), str(out), spec, round_=1, noise_multiplier=z,
                model=tiny_lm, seed=3, release=release, **kw)
    theta0 = R.flat(R.build_model(tiny_lm, spec, 3, "cpu")[2]).astype(np.float64)
    step = np.load(out / R.THETA).astype(np.float64) - theta0
    return z * spec.clip * spec.server_lr_value() / float(np.std(step)), step


@pytest.mark.parametrize("release", [False, True])
@pytest.mark.parametrize("case", ["fedavg-poisson", "fedavg-everyone", "ftrl-bins"])
def test_dp_fl_noise_scale_is_the_same_for_n_and_n_plus_1(tiny_lm, tmp_path, zero_updates,
                                                          case, release):
    """The issue's reproduction (tiny LM, z = 1, clip 0.01): D-hat = q N_pub for N = 10 and 11
    alike (it was q N: 10.03 / 11.02 under Poisson, 9.96 / 10.91 under DP-FTRL bins)."""
    spec_kw, kw, want = {
        "fedavg-poisson": ({}, {"sample_rate": 0.5}, 0.5 * 30),
        "fedavg-everyone": ({}, {}, 30.0),
        "ftrl-bins": ({"algorithm": "ftrl", "assignment": "bins", "epoch_rounds": 2}, {}, 15.0),
    }[case]
    spec = FLSpec(clip=0.01, bf16=False, public_clients=30, release=release, **spec_kw)
    a, step_a = _d_hat(tiny_lm, tmp_path, 10, spec, 1.0, release=release, **kw)
    b, step_b = _d_hat(tiny_lm, tmp_path, 11, spec, 1.0, release=release, **kw)
    if case == "ftrl-bins":  # leaf 1's prefix sum carries the tree's node noise, not z C: ratio
        assert a == pytest.approx(b, rel=0.05)
    else:
        assert a == pytest.approx(want, rel=0.05) and b == pytest.approx(want, rel=0.05)
    if not release:  # seeded noise: the very same step whatever N is
        assert np.array_equal(step_a, step_b)


def test_dp_fl_without_a_public_count_is_one_line_exit_2(tiny_lm, tmp_path, run_popri):
    data = _data(tmp_path, 10)
    p = run_popri(["fl", "round", "--data", data, "--model", tiny_lm, "--round", "1", "-z", "1",
                   "--sample-rate", "0.5", "--out", tmp_path / "r1", "--no-bf16"])
    assert p.returncode == 2 and "--public-clients" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "r1").exists()
    assert not (tmp_path / "ledger.jsonl").exists()


def test_popri_run_dp_fl_names_the_public_count_it_needs(tmp_path, run_popri):
    p = run_popri(["run", "examples/dpfl.yaml", "--dry-run", "--set", "fl.public_clients=null",
                   "--set", f"run_dir={tmp_path / 'r'}"], cwd=ROOT)
    assert p.returncode == 2 and "fl.public_clients" in p.stderr
    p = run_popri(["run", "examples/dpfl.yaml", "--dry-run", "--set", f"run_dir={tmp_path / 'r'}"],
                  cwd=ROOT, check=True)
    assert "--public-clients 100" in p.stdout


# --------------------------------------------------------------------------- FewFedPIT
def test_fewfedpit_with_everyone_divides_by_the_declared_n(tiny_lm, tmp_path):
    """The extension's noisy mean: K of a declared N drawn divides by K (= L, public by the
    accounting); everyone divides by the declared --public-clients, and without either it is
    refused (the count of uploads is private under add/remove one client)."""
    from popri.methods.fewfedpit import client as C
    from popri.methods.fewfedpit.server import aggregate
    from popri.specs.fewfedpit import FewFedPITSpec

    spec = FewFedPITSpec(lora_r=8, lora_alpha=16, bf16=False, clip=0.5, noise_multiplier=1.0)
    C.init_global(tiny_lm, str(tmp_path / "r0"), spec, seed=0, device="cpu")
    theta0, st0 = C.read_state(tmp_path / "r0")
    ups = []
    for k in range(3):
        st = {**st0, "kind": "mixed", "round": 1, "client": f"c{k}", "n_examples": 1}
        C.write_state(tmp_path / f"u{k}", theta0, st)  # a zero update
        ups.append(str(tmp_path / f"u{k}"))

    def step(out, uploads, **kw):
        aggregate(uploads, str(out), spec, round_=1, init=str(tmp_path / "r0"), device="cpu",
                  **kw)
        return C.read_state(out)[0].astype(np.float64) - theta0

    with pytest.raises(ConfigError, match="public-clients") as e:
        step(tmp_path / "a" / "g", ups)
    assert e.value.field == "public_clients" and not (tmp_path / "a" / "ledger.jsonl").exists()
    # everyone, N = 2 and N + 1 = 3 clients, N_pub = 20 declared: the same step (seeded noise)
    a, b = (step(tmp_path / f"e{k}" / "g", ups[:k], public_clients=20) for k in (2, 3))
    assert np.array_equal(a, b)
    assert float(np.std(a)) == pytest.approx(1.0 * 0.5 / 20, rel=0.05)  # z C / N_pub
    # K = 2 of a declared 10 drawn: replace one client (2C), divided by K
    f = step(tmp_path / "f" / "g", ups[:2], clients_total=10)
    assert float(np.std(f)) == pytest.approx(1.0 * 2 * 0.5 / 2, rel=0.05)
