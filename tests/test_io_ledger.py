"""File formats, atomic writes, the ledger and the noise sources."""

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from popri.core import io
from popri.privacy import ledger
from popri.core.errors import InputError
from popri.privacy.noise import SecureRandom, make_rng


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    p = tmp_path / "out.jsonl"
    p.write_text("old\n")
    with pytest.raises(RuntimeError):
        with io.atomic_write(p) as fh:
            fh.write("half")
            raise RuntimeError("killed")
    assert p.read_text() == "old\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.jsonl"]


def test_atomic_outputs_all_or_nothing(tmp_path):
    with pytest.raises(ValueError):
        with io.AtomicOutputs() as out:
            np.save(out.path(tmp_path / "a.npy", suffix=".npy"), np.zeros(3))
            raise ValueError
    assert list(tmp_path.iterdir()) == []
    with io.AtomicOutputs() as out:
        np.save(out.path(tmp_path / "a.npy", suffix=".npy"), np.ones(3))
        (out.path(tmp_path / "a.json")).write_text("{}")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.json", "a.npy"]
    assert np.load(tmp_path / "a.npy").sum() == 3


def test_jsonl_errors_name_line_and_field(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"id": 1, "text": "a"}\n\n{"id": 2}\n')
    with pytest.raises(InputError) as e:
        io.read_jsonl(p, required=("id", "text"))
    assert e.value.line == 3 and e.value.field == "text" and str(p) in str(e.value)
    p.write_text('{"id": 1, "text": 5}\n')
    with pytest.raises(InputError, match="must be a string"):
        io.read_jsonl(p, required=("text",))
    p.write_text('[1, 2]\n')
    with pytest.raises(InputError, match="JSON object"):
        io.read_jsonl(p)


def test_embedding_set_roundtrip_and_checks(tmp_path):
    emb = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    rows = [{"id": str(i), "client_id": f"c{i % 2}"} for i in range(5)]
    io.save_embedding_set(tmp_path / "e.npy", emb, rows, {"model": "m", "normalize": False})
    es = io.load_embedding_set(tmp_path / "e.npy")
    assert np.array_equal(es.embeddings, emb) and es.rows == rows and es.meta["model"] == "m"
    assert es.client_ids() == ["c0", "c1", "c0", "c1", "c0"]
    # NaN is refused with the row number
    bad = emb.copy()
    bad[3, 1] = np.nan
    np.save(tmp_path / "n.npy", bad)
    (tmp_path / "n.jsonl").write_text((tmp_path / "e.jsonl").read_text())
    with pytest.raises(InputError) as e:
        io.load_embedding_set(tmp_path / "n.npy")
    assert e.value.line == 4
    # missing sidecar
    np.save(tmp_path / "lone.npy", emb)
    with pytest.raises(InputError, match="missing sidecar"):
        io.load_embedding_set(tmp_path / "lone.npy")
    # row count mismatch
    (tmp_path / "n.jsonl").write_text('{"id": "0"}\n')
    np.save(tmp_path / "n.npy", emb)
    with pytest.raises(InputError, match="sidecar has 1 rows"):
        io.load_embedding_set(tmp_path / "n.npy")


def test_embedding_rows_dimension_mismatch():
    with pytest.raises(InputError) as e:
        io.embedding_rows_to_set([{"id": 1, "embedding": [0.1, 0.2]}, {"id": 2, "embedding": [0.1]}], "-")
    assert e.value.line == 2 and e.value.field == "embedding"


def _entry(z=1.0, q=0.1, rid="", steps=1):
    return ledger.LedgerEntry(stage="score", mechanism="subsampled_gaussian", noise_multiplier=z,
                              sample_rate=q, steps=steps, delta=3e-6, sensitivity=1.0,
                              sampling="poisson", release_id=rid)


def test_ledger_append_dedupes_release_ids(tmp_path):
    out = tmp_path / "scores.npy"
    ledger.append(out, [_entry(rid="a")])
    ledger.append(out, [_entry(rid="a"), _entry(z=2.0, rid="b")])
    entries = ledger.read_ledger(tmp_path / "ledger.jsonl")
    assert [e.release_id for e in entries] == ["a", "b"]
    # the same release copied into a sidecar is counted once by collect()
    (tmp_path / "s.json").write_text(json.dumps({"ledger": [_entry(z=2.0, rid="b").to_dict()]}))
    got = ledger.collect([tmp_path / "ledger.jsonl", tmp_path / "s.json"])
    assert [e.release_id for e in got] == ["a", "b"]
    # ... but one id with a different noise multiplier is a conflict, never merged (issue 9)
    (tmp_path / "t.json").write_text(json.dumps({"ledger": [_entry(rid="b").to_dict()]}))
    with pytest.raises(InputError, match="recorded twice with different noise_multiplier"):
        ledger.collect([tmp_path / "ledger.jsonl", tmp_path / "t.json"])
    with pytest.raises(InputError, match="recorded twice"):
        ledger.append(out, [_entry(rid="b")])


def test_ledger_rejects_bad_entries(tmp_path):
    p = tmp_path / "ledger.jsonl"
    p.write_text('{"stage": "x", "mechanism": "gaussian", "noise_multiplier": 1, "sample_rate": 2, "steps": 1}\n')
    with pytest.raises(InputError) as e:
        ledger.read_ledger(p)
    assert e.value.line == 1 and "sample_rate" in str(e.value)
    p.write_text('{"stage": "x", "mechanism": "gaussian", "sample_rate": 1, "steps": 1}\n')
    with pytest.raises(InputError) as e:
        ledger.read_ledger(p)
    assert e.value.field == "noise_multiplier"


@pytest.fixture
def toy():
    """A mechanism registered by a test (with a number of its own, params.repeats): the ledger
    accepts it with no other code changed."""
    from popri.privacy import accounting as A

    @A.register_mechanism
    class Toy(A.GaussianMechanism):
        name = "toy_repeated"
        params_fields = ("repeats",)

    yield A.get_mechanism("toy_repeated")
    A.unregister_mechanism("toy_repeated")


def _toy(rid="t", repeats=3, **kw):
    return {"stage": "toy", "mechanism": "toy_repeated", "noise_multiplier": 2.0,
            "sample_rate": 1.0, "steps": 1, "delta": 3e-6, "release_id": rid,
            "params": {"repeats": repeats}, **kw}


def test_ledger_mechanisms_come_from_the_registry(tmp_path, toy):
    p = tmp_path / "ledger.jsonl"
    p.write_text(json.dumps(_toy()) + "\n")
    (e,) = ledger.read_ledger(p)
    assert e.mechanism == "toy_repeated" and e.params == {"repeats": 3}
    assert "toy_repeated" in ledger.MECHANISMS
    ledger.append(p, [ledger.LedgerEntry.from_dict(_toy(rid="u"))])
    assert len(ledger.collect([tmp_path])) == 2
    # the number the mechanism needs is checked, and counts among the accounting fields
    p.write_text(json.dumps(_toy(repeats=None)) + "\n")
    with pytest.raises(InputError) as err:
        ledger.read_ledger(p)
    assert err.value.field == "params.repeats" and err.value.line == 1
    p.write_text(json.dumps(_toy()) + "\n" + json.dumps(_toy(repeats=4)) + "\n")
    with pytest.raises(InputError, match="recorded twice with different params.repeats"):
        ledger.collect([p])


def test_unknown_mechanism_lists_the_known_ones(tmp_path):
    p = tmp_path / "ledger.jsonl"
    p.write_text(json.dumps(dict(_toy(), mechanism="laplace")) + "\n")
    with pytest.raises(InputError) as err:
        ledger.read_ledger(p)
    assert err.value.field == "mechanism" and err.value.line == 1
    assert "unknown mechanism 'laplace' (known: gaussian, subsampled_gaussian" in err.value.message


def test_release_ids_deterministic_unless_secure():
    a = ledger.make_release_id("score", {"z": 1}, 0)
    assert a == ledger.make_release_id("score", {"z": 1}, 0)
    assert a != ledger.make_release_id("score", {"z": 1}, 1)
    assert ledger.make_release_id("x", secure=True) != ledger.make_release_id("x", secure=True)


def test_seeded_streams_are_reproducible_and_independent():
    a = make_rng(7, stream="noise").normal(size=5)
    assert np.array_equal(a, make_rng(7, stream="noise").normal(size=5))
    assert not np.array_equal(a, make_rng(7, stream="sampling").normal(size=5))
    with pytest.raises(ValueError):
        make_rng(None)


@settings(max_examples=20, deadline=None)
@given(scale=st.floats(0.1, 10.0))
def test_secure_gaussian_moments(scale):
    z = SecureRandom().normal(0.0, scale, size=20000)
    # mean within 5 standard errors, std within 5%
    assert abs(z.mean()) < 5 * scale / np.sqrt(z.size)
    assert abs(z.std() / scale - 1) < 0.05


def test_secure_choice_and_uniform_range():
    r = SecureRandom()
    u = r.random(10000)
    assert u.min() >= 0 and u.max() < 1
    p = np.array([0.0, 0.25, 0.75])
    draws = r.choice(3, 20000, p=p)
    assert (draws != 0).all()
    assert abs((draws == 2).mean() - 0.75) < 0.02
    perm = r.permutation(50)
    assert sorted(perm.tolist()) == list(range(50))
