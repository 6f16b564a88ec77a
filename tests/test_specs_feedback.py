"""ScoreSpec / AggregateSpec (popri.specs.feedback): validation, CLI errors, the spec -> argv ->
spec round trip through the real commands, and the per-client ``client_vector`` of
popri.feedback.{cosine,histogram} summing to the in-process round.

    python -m pytest -q tests/test_specs_feedback.py
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import click_command, emb_set
from popri.cli.options import build
from popri.core.errors import ConfigError, InputError
from popri.core.spec import to_argv
from popri.federated import aggregation, participation
from popri.feedback import cosine, histogram
from popri.privacy.noise import make_rng
from popri.specs.feedback import AggregateSpec, ScoreSpec

FAST = settings(max_examples=20, deadline=None)


# --------------------------------------------------------------------------- validation
def test_per_mode_defaults_are_resolved_once():
    c = ScoreSpec(noise_multiplier=1.0)
    assert (c.mode, c.clip, c.standardize, c.max_samples_per_client, c.threshold) == \
        ("cosine", 1.0, True, None, None)
    assert c.sensitivity == 1.0 and c.delta == 3e-6 and c.release is False
    h = ScoreSpec(mode="nn-histogram", noise_multiplier=1.0)
    assert (h.clip, h.standardize, h.max_samples_per_client, h.threshold) == (None, None, 8, 0.0)
    assert h.sensitivity == 8.0
    assert ScoreSpec(noise_multiplier=1.0, standardize=False, clip=2.0).clip == 2.0
    assert ScoreSpec().noise_multiplier is None  # popri run fills it in after calibration


@pytest.mark.parametrize("kw, field", [
    ({"mode": "bogus"}, "mode"),
    ({"clip": 0.0}, "clip"),
    ({"clip": float("inf")}, "clip"),
    ({"clip": 1e7}, "clip"),
    ({"noise_multiplier": -1.0}, "noise_multiplier"),
    ({"noise_multiplier": float("nan")}, "noise_multiplier"),
    ({"sample_rate": 0.0}, "sample_rate"),
    ({"sample_rate": 1e-300}, "sample_rate"),
    ({"sample_rate": 1.5}, "sample_rate"),
    ({"clients_per_round": 0}, "clients_per_round"),
    ({"sample_rate": 0.5, "clients_per_round": 3}, "clients_per_round"),
    ({"max_samples_per_client": 0}, "max_samples_per_client"),
    ({"public_clients": 0}, "public_clients"),
    ({"delta": 0.0}, "delta"),
    ({"delta": 1.0}, "delta"),
    ({"block_size": 0}, "block_size"),
    ({"threshold": 1.0}, "threshold"),  # cosine
    ({"mode": "nn-histogram", "threshold": -1.0}, "threshold"),
    ({"mode": "nn-histogram", "clip": 1.0}, "clip"),
    ({"mode": "nn-histogram", "standardize": True}, "standardize"),
    ({"diagnostic": True, "release": True}, "diagnostic"),
    ({"diagnostic": True, "noise_multiplier": 1.0}, "diagnostic"),
    ({"release": True, "noise_multiplier": 0.0}, "noise_multiplier"),
])
def test_score_spec_errors_name_the_field(kw, field):
    with pytest.raises(ConfigError) as e:
        ScoreSpec(**kw)
    assert e.value.field == field and "\n" not in str(e.value)


def test_from_dict_is_strict_and_prefixes_the_section():
    s = ScoreSpec.from_dict({"mode": "nn-histogram", "max_samples_per_client": "4"}, "score")
    assert s.max_samples_per_client == 4 and s.threshold == 0.0
    with pytest.raises(ConfigError) as e:
        ScoreSpec.from_dict({"clipp": 1}, "score")
    assert e.value.field == "score.clipp"
    with pytest.raises(ConfigError) as e:
        ScoreSpec.from_dict({"clip": -1}, "score")
    assert e.value.field == "score.clip"


def test_aggregate_spec_errors():
    assert AggregateSpec() == AggregateSpec(reduce=None, threshold=None, expected_clients=None)
    for kw, field in (({"reduce": "median"}, "reduce"), ({"expected_clients": 0.0},
                      "expected_clients"), ({"threshold": float("nan")}, "threshold")):
        with pytest.raises(ConfigError) as e:
            AggregateSpec(**kw)
        assert e.value.field == field


def test_build_names_the_flag():
    with pytest.raises(InputError) as e:
        build(ScoreSpec, mode="cosine", clip=0.0)
    assert e.value.field == "--clip"
    with pytest.raises(InputError) as e:
        build(ScoreSpec, sample_rate=0.5, clients_per_round=2)
    assert e.value.field == "--clients-per-round" and "mutually exclusive" in e.value.message


@pytest.fixture
def sets(tmp_path):
    rng = np.random.default_rng(0)
    priv = emb_set(tmp_path / "priv.npy", rng.normal(size=(30, 8)).astype(np.float32),
                   [f"c{i % 5}" for i in range(30)])
    syn = emb_set(tmp_path / "syn.npy", rng.normal(size=(6, 8)).astype(np.float32))
    return priv, syn


@pytest.mark.parametrize("extra, flag", [
    (["--clip", "0"], "--clip"),
    (["--mode", "bogus"], "--mode"),
    (["--delta", "1"], "--delta"),
    (["--threshold", "2"], "--threshold"),
    (["--mode", "nn-histogram", "--no-standardize"], "--standardize"),
    (["--block-size", "0"], "--block-size"),
    (["--diagnostic"], "--diagnostic"),
])
def test_cli_bad_setting_is_one_line_exit_2(sets, tmp_path, run_popri, extra, flag):
    priv, syn = sets
    out = tmp_path / "o" / "s.npy"
    p = run_popri(["score", "--private", priv, "--synthetic", syn, "-z", "1", "--out", out,
                   *extra])
    assert p.returncode == 2 and p.stdout == ""
    err = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("popri: error:") and f"'{flag}'" in err[0], err
    assert not (tmp_path / "o").exists()


def test_aggregate_cli_bad_setting_is_one_line_exit_2(tmp_path, run_popri):
    p = run_popri(["aggregate", tmp_path / "c.npy", "--out", tmp_path / "a.npy", "--reduce",
                   "median"])
    err = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and len(err) == 1 and "'--reduce'" in err[0], p.stderr


# --------------------------------------------------------------------------- spec -> argv -> spec
_command = click_command


def _parse(spec_cls, name, argv):
    ctx = _command(name).make_context(name, argv, resilient_parsing=True)
    names = {f.name for f in dataclasses.fields(spec_cls)}
    return build(spec_cls, **{k: v for k, v in ctx.params.items()
                              if k in names and v is not None})


@pytest.mark.parametrize("spec", [
    ScoreSpec(noise_multiplier=1.05),
    ScoreSpec(noise_multiplier=0.1 + 0.2, clip=0.3, standardize=False, clients_per_round=7,
              delta=1e-5, public_clients=40, block_size=3, max_samples_per_client=5),
    ScoreSpec(mode="nn-histogram", noise_multiplier=10.0, threshold=20.0, sample_rate=0.25,
              max_samples_per_client=4, release=True),
    ScoreSpec(noise_multiplier=0.0, diagnostic=True, clip=1e6, standardize=False),
])
def test_score_spec_round_trips_through_the_real_command(spec, monkeypatch):
    monkeypatch.delenv("POPRI_RELEASE", raising=False)
    argv = ["--private", "p.npy", "--synthetic", "s.npy", *to_argv(spec)]
    assert _parse(ScoreSpec, "score", argv) == spec


@pytest.mark.parametrize("spec", [
    AggregateSpec(), AggregateSpec(reduce="sum", threshold=2.5),
    AggregateSpec(reduce="mean", expected_clients=7.5),
])
def test_aggregate_spec_round_trips_through_the_real_command(spec):
    assert _parse(AggregateSpec, "aggregate", ["c.npy", "--out", "a.npy", *to_argv(spec)]) == spec


def test_every_score_setting_is_a_score_option():
    opts = {o for p in _command("score").params for o in p.opts + p.secondary_opts}
    for f in dataclasses.fields(ScoreSpec):
        assert "--" + f.name.replace("_", "-") in opts, f.name


# --------------------------------------------------------------------------- client_vector
def _clients(seed, n_rows, n_clients, n_syn, d, clustered=False):
    rng = np.random.default_rng(seed)
    syn = (rng.normal(size=(n_syn, d)) + 0.3).astype(np.float32)
    if clustered:  # private rows near synthetic ones: unambiguous nearest neighbours
        emb = syn[rng.integers(0, n_syn, n_rows)] + 0.01 * rng.normal(size=(n_rows, d))
    else:
        emb = rng.normal(size=(n_rows, d)) * rng.uniform(0.2, 3, size=(n_rows, 1))
    cids = [f"client-{c}" for c in rng.integers(0, n_clients, n_rows)]
    return emb.astype(np.float32), cids, syn


@FAST
@given(seed=st.integers(0, 10_000), n_clients=st.integers(1, 8), standardize=st.booleans(),
       clip=st.sampled_from([0.2, 1.0, 1e6]), cap=st.sampled_from([None, 2]),
       per_round=st.sampled_from([None, 1, 3]))
def test_cosine_client_vectors_sum_to_the_noise_free_round(seed, n_clients, standardize, clip,
                                                           cap, per_round):
    emb, cids, syn = _clients(seed, 40, n_clients, 11, 5)
    codes, clients = participation.factorize(cids)
    part = participation.sample_clients(len(clients), make_rng(seed, stream="sampling"),
                                        clients_per_round=min(per_round or len(clients),
                                                              len(clients)))
    keep = participation.cap_per_client(codes, cap, make_rng(seed, stream="cap"))
    rows = np.zeros((len(part.members), len(syn)), np.float32)
    total = cosine.cosine_round(emb, codes, part, syn, noise_multiplier=0.0, clip=clip,
                                standardize=standardize, noise_rng=make_rng(0), keep=keep,
                                rows_out=rows)
    mine = [(codes == i) & (True if keep is None else keep) for i in part.members]
    vecs = np.array([cosine.client_vector(emb[m], syn, clip=clip, standardize=standardize,
                                          max_per_client=cap) for m in mine])
    assert np.allclose(vecs.sum(axis=0), total, atol=1e-6 * max(1.0, np.abs(total).max()))
    assert np.allclose(vecs, rows, atol=1e-5 * max(1.0, clip))  # each client's upload
    assert (np.linalg.norm(vecs, axis=1) <= clip * (1 + 1e-9)).all()


@FAST
@given(seed=st.integers(0, 10_000), n_clients=st.integers(1, 8), cap=st.sampled_from([1, 3, None]))
def test_histogram_client_vectors_sum_to_the_noise_free_round(seed, n_clients, cap):
    emb, cids, syn = _clients(seed, 50, n_clients, 9, 6, clustered=True)
    codes, clients = participation.factorize(cids)
    part = participation.sample_clients(len(clients), make_rng(seed, stream="sampling"))
    keep = participation.cap_per_client(codes, cap, make_rng(seed, stream="cap"))
    total = histogram.histogram_round(emb, codes, part, syn, noise_multiplier=0.0,
                                      max_per_client=cap or 10**6, keep=keep,
                                      noise_rng=make_rng(0))
    index = histogram.nn_index(syn)
    vecs = [histogram.client_vector(emb[(codes == i) & (True if keep is None else keep)], syn,
                                    max_per_client=cap, index=index) for i in part.members]
    assert np.array_equal(np.sum(vecs, axis=0), total)
    assert all(v.sum() <= (cap or 10**6) and np.linalg.norm(v) <= (cap or 10**6) for v in vecs)


def test_client_vector_caps_its_own_samples():
    emb, _, syn = _clients(0, 20, 1, 5, 4, clustered=True)
    v = histogram.client_vector(emb, syn, max_per_client=3, rng=make_rng(1))
    assert v.sum() == 3
    assert np.array_equal(v, histogram.client_vector(emb, syn, max_per_client=3,
                                                     rng=make_rng(1)))
    with pytest.raises(ValueError, match="rng"):
        cosine.client_vector(emb, syn, clip=1.0, standardize=True, max_per_client=3)
    u = cosine.client_vector(emb, syn, clip=1.0, standardize=True, max_per_client=3,
                             rng=make_rng(1))
    assert np.isclose(np.linalg.norm(u), 1.0)


def test_aggregation_finish_and_public_denominator():
    total = np.array([4.0, -2.0, 10.0])
    assert aggregation.public_denominator("cosine", "fixed", 0.5, 4, None) == ("mean", 4.0)
    assert aggregation.public_denominator("cosine", "poisson", 0.5, 3, 10) == ("mean", 5.0)
    assert aggregation.public_denominator("cosine", "none", 1.0, 9, None) == ("sum", None)
    assert aggregation.public_denominator("nn-histogram", "fixed", 0.5, 4, 10) == ("sum", None)
    assert np.allclose(aggregation.finish(total, reduce="mean", denominator=2.0, threshold=1.0),
                       [1.0, 0.0, 4.0])
