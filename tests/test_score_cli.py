"""`popri score` / `popri aggregate` through a real process: outputs, ledger, pipes, bad input.

    python -m pytest -q tests/test_score_cli.py
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import emb_set, write_jsonl




@pytest.fixture
def sets(tmp_path):
    rng = np.random.default_rng(0)
    priv = rng.normal(size=(120, 16)).astype(np.float32)
    cids = [f"c{rng.integers(0, 15)}" for _ in range(120)]
    syn = rng.normal(size=(40, 16)).astype(np.float32)
    return (emb_set(tmp_path / "priv.npy", priv, cids), emb_set(tmp_path / "syn.npy", syn),
            priv, cids, syn)


def score_args(priv, syn, out, *extra, z="1"):
    return ["score", "--private", priv, "--synthetic", syn, "--noise-multiplier", z, "--seed", "3",
            "--out", out, *extra]


def read_ledger(path):
    return [json.loads(l) for l in open(path)]


def test_cosine_zero_noise_equals_brute_force_and_records_everything(sets, tmp_path, run_popri):
    priv_p, syn_p, priv, cids, syn = sets
    out = tmp_path / "o" / "scores.npy"
    p = run_popri(score_args(priv_p, syn_p, out, "--no-standardize", "--clip", "1e6",
                             "--public-clients", "15", z="0"), check=True)
    assert p.stdout == "" and "NO PRIVACY" in p.stderr
    clients = sorted(set(cids))
    want = np.mean([[np.mean([e @ y / np.linalg.norm(e) / np.linalg.norm(y)
                              for e, c in zip(priv.astype(float), cids) if c == k])
                     for y in syn.astype(float)] for k in clients], axis=0)
    got = np.load(out)
    assert got.dtype == np.float32 and np.allclose(got, want, atol=1e-6)
    # without a public count the realised count (private) never divides: the sum is released
    run_popri(score_args(priv_p, syn_p, tmp_path / "u" / "s.npy", "--no-standardize", "--clip",
                         "1e6", z="0"), check=True)
    assert np.allclose(np.load(tmp_path / "u" / "s.npy"), want * 15, atol=1e-4)
    assert json.loads((tmp_path / "u" / "s.json").read_text())["params"]["reduce"] == "sum"
    side = json.loads((tmp_path / "o" / "scores.json").read_text())
    assert side["ids"] == [f"r{i}" for i in range(40)] and side["mode"] == "cosine"
    assert side["round"] == 0
    prm = side["params"]
    assert prm["noise_multiplier"] == 0 and prm["standardize"] is False and prm["clip"] == 1e6
    assert prm["sampling"] == "none" and prm["participating_clients"] == prm["total_clients"] == 15
    assert prm["embedding_model"] == "test-model" and prm["seed"] == 3 and prm["release"] is False
    (entry,) = read_ledger(tmp_path / "o" / "ledger.jsonl")
    assert side["ledger"] == [entry]
    assert entry["stage"] == "score" and entry["mechanism"] == "gaussian"
    assert entry["noise_multiplier"] == 0 and entry["sensitivity"] == 1e6
    assert entry["sample_rate"] == 1 and entry["steps"] == 1 and entry["delta"] == 3e-6


def test_same_seed_same_bytes_other_seed_differs(sets, tmp_path, run_popri):
    priv_p, syn_p, *_ = sets
    outs = []
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        out = tmp_path / name / "s.npy"
        args = score_args(priv_p, syn_p, out, "--clients-per-round", "6", "--round", "2")
        args[args.index("--seed") + 1] = seed
        run_popri(args, check=True)
        outs.append((out.read_bytes(), (tmp_path / name / "s.json").read_bytes()))
    assert outs[0] == outs[1] and outs[0][0] != outs[2][0]
    side = json.loads(outs[0][1])
    assert side["round"] == 2 and side["params"]["participating_clients"] == 6
    assert side["ledger"][0]["sampling"] == "fixed"
    assert side["ledger"][0]["sample_rate"] == pytest.approx(6 / 15)
    assert side["ledger"][0]["mechanism"] == "subsampled_gaussian"
    # re-running the identical command does not add a second ledger entry
    run_popri(score_args(priv_p, syn_p, tmp_path / "a" / "s.npy", "--clients-per-round", "6",
                         "--round", "2"), check=True)
    assert len(read_ledger(tmp_path / "a" / "ledger.jsonl")) == 1


def test_per_client_uploads_aggregate_to_the_same_scores(sets, tmp_path, run_popri):
    priv_p, syn_p, *_ = sets
    out, pc = tmp_path / "r" / "scores.npy", tmp_path / "r" / "clients.npy"
    run_popri(score_args(priv_p, syn_p, out, "--per-client-out", pc, "--sample-rate", "0.5",
                         "--block-size", "2", "--public-clients", "15"), check=True)
    rows = np.load(pc)
    side = json.loads((tmp_path / "r" / "clients.json").read_text())
    L = side["params"]["participating_clients"]
    assert rows.shape == (L, 40) and len(side["clients"]) == L and side["kind"] == "per-client"
    assert side["noise_std_per_row"] == pytest.approx(1.0 / np.sqrt(L))
    assert np.allclose(np.load(out), rows.astype(float).sum(axis=0) / (0.5 * 15), atol=1e-6)

    agg = tmp_path / "server" / "agg.npy"
    p = run_popri(["aggregate", pc, "--out", agg], check=True)
    assert p.stdout == ""
    assert np.allclose(np.load(agg), np.load(out), atol=1e-6)
    aside = json.loads((tmp_path / "server" / "agg.json").read_text())
    assert aside["params"]["reduce"] == "mean" and aside["params"]["denominator"] == 7.5
    (e1,) = read_ledger(tmp_path / "r" / "ledger.jsonl")
    (e2,) = read_ledger(tmp_path / "server" / "ledger.jsonl")
    assert e1 == e2 == aside["ledger"][0]  # the same release, counted once

    run_popri(["aggregate", pc, "--out", tmp_path / "server" / "sum.npy", "--reduce", "sum"],
              check=True)
    assert np.allclose(np.load(tmp_path / "server" / "sum.npy"), rows.astype(float).sum(0), atol=1e-5)
    assert len(read_ledger(tmp_path / "server" / "ledger.jsonl")) == 1
    # two shards of the round = the whole round
    for name, part in (("s0", slice(0, L // 2)), ("s1", slice(L // 2, L))):
        np.save(tmp_path / f"{name}.npy", rows[part])
        (tmp_path / f"{name}.json").write_text(json.dumps({**side, "clients": side["clients"][part]}))
    run_popri(["aggregate", tmp_path / "s0.npy", tmp_path / "s1.npy", "--out",
               tmp_path / "shards.npy"], check=True)
    assert np.allclose(np.load(tmp_path / "shards.npy"), np.load(agg), atol=1e-6)
    p = run_popri(["aggregate", tmp_path / "s0.npy", tmp_path / "s0.npy", "--out",
                   tmp_path / "twice.npy"])
    assert p.returncode == 2 and "more than one shard" in p.stderr
    assert not (tmp_path / "twice.npy").exists()


def test_nn_histogram_counts_threshold_and_aggregate(tmp_path, run_popri):
    rng = np.random.default_rng(1)
    syn = rng.normal(size=(30, 8)).astype(np.float32)
    priv = (syn[rng.integers(0, 30, 200)] + 0.01 * rng.normal(size=(200, 8))).astype(np.float32)
    cids = [f"u{i % 10}" for i in range(200)]  # 20 samples each
    pp, sp = emb_set(tmp_path / "p.npy", priv, cids), emb_set(tmp_path / "s.npy", syn)
    nn = ((priv[:, None] - syn[None]) ** 2).sum(-1).argmin(1)
    counts = np.bincount(nn, minlength=30)
    out = tmp_path / "h.npy"
    run_popri(score_args(pp, sp, out, "--mode", "nn-histogram", "--max-samples-per-client", "50",
                         z="0"), check=True)
    assert np.array_equal(np.load(out), counts.astype(np.float32))
    # default cap M = 8 (PrE-Text): 10 clients x 8 votes; the sensitivity is M
    out2, pc = tmp_path / "h2.npy", tmp_path / "pc.npy"
    run_popri(score_args(pp, sp, out2, "--mode", "nn-histogram", "--threshold", "2",
                         "--per-client-out", pc, z="0"), check=True)
    rows = np.load(pc)
    assert rows.shape == (10, 30) and (rows.sum(1) == 8).all()
    assert np.array_equal(np.load(out2), np.maximum(rows.sum(0) - 2, 0))
    entry = read_ledger(tmp_path / "ledger.jsonl")[-1]
    assert entry["sensitivity"] == 8 and entry["params"]["threshold"] == 2
    run_popri(["aggregate", pc, "--out", tmp_path / "agg.npy"], check=True)  # sum + recorded H
    assert np.array_equal(np.load(tmp_path / "agg.npy"), np.load(out2))
    p = run_popri(score_args(pp, sp, out2, "--mode", "nn-histogram", "--clip", "1"))
    assert p.returncode == 2 and "--clip" in p.stderr


def test_out_dash_prints_jsonl_and_needs_a_ledger(sets, tmp_path, run_popri):
    priv_p, syn_p, *_ = sets
    p = run_popri(score_args(priv_p, syn_p, "-"))
    assert p.returncode == 2 and "--ledger" in p.stderr and p.stdout == ""
    p = run_popri(score_args(priv_p, syn_p, "-", "--ledger", tmp_path / "led"), check=True)
    lines = [json.loads(l) for l in p.stdout.splitlines()]
    assert len(lines) == 40 and lines[0]["id"] == "r0" and isinstance(lines[0]["score"], float)
    file_run = run_popri(score_args(priv_p, syn_p, tmp_path / "f.npy"), check=True)
    assert np.allclose([l["score"] for l in lines], np.load(tmp_path / "f.npy"))
    assert len(read_ledger(tmp_path / "led" / "ledger.jsonl")) == 1
    del file_run


def test_release_mode_uses_fresh_randomness(sets, tmp_path, run_popri):
    priv_p, syn_p, *_ = sets
    for name in ("a", "b"):
        run_popri(score_args(priv_p, syn_p, tmp_path / f"{name}.npy", "--sample-rate", "0.5"),
                  env={"POPRI_RELEASE": "1"}, check=True)
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert not np.array_equal(a, b)
    entries = read_ledger(tmp_path / "ledger.jsonl")
    assert len(entries) == 2 and entries[0]["release_id"] != entries[1]["release_id"]
    assert entries[0]["params"]["release"] is True


def test_pipe_embed_into_score(tiny_st_model, tmp_path):
    texts = ["the state of the union is strong", "taxes and the budget", "war and peace",
             "schools and teachers", "roads bridges and rail", "health care for all"]
    write_jsonl(tmp_path / "priv.jsonl", [{"client_id": f"c{i % 3}", "text": t}
                                          for i, t in enumerate(texts * 2)])
    write_jsonl(tmp_path / "syn.jsonl", [{"id": f"s{i}", "text": t[::-1] if i % 2 else t}
                                         for i, t in enumerate(texts)])
    cli = f"{sys.executable} -m popri.cli.app"
    common = (f"--private priv.jsonl --model {tiny_st_model} --noise-multiplier 0.5 --seed 1 "
              "--clients-per-round 2")
    env = {**os.environ, "POPRI_THREADS": "1"}
    p = subprocess.run(f"{cli} embed syn.jsonl --out - --model {tiny_st_model} | "
                       f"{cli} score --synthetic - {common} --out piped.npy",
                       shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""
    assert json.loads((tmp_path / "piped.json").read_text())["ids"] == [f"s{i}" for i in range(6)]
    # the same round from the text file directly: byte-identical (same embeddings, seed, release)
    p = subprocess.run(f"{cli} score --synthetic syn.jsonl {common} --out direct.npy", shell=True,
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "piped.npy").read_bytes() == (tmp_path / "direct.npy").read_bytes()
    assert len(read_ledger(tmp_path / "ledger.jsonl")) == 1


# --------------------------------------------------------------------------- bad input
def _jsonl_rows(emb, cids=None):
    return [{"id": f"r{i}", **({"client_id": cids[i]} if cids else {}),
             "embedding": [float(x) for x in v]} for i, v in enumerate(emb)]


def _bad_case(name, tmp_path):
    """Build one broken input; return (score args, text expected in the error line)."""
    rng = np.random.default_rng(0)
    e16 = rng.normal(size=(6, 16)).astype(np.float32)
    cids = ["a", "b", "a", "c", "b", "c"]
    syn = emb_set(tmp_path / "syn.npy", rng.normal(size=(5, 16)).astype(np.float32))
    good = emb_set(tmp_path / "good.npy", e16, cids)
    if name == "malformed-jsonl":
        f = tmp_path / "priv.jsonl"
        lines = [json.dumps(r) for r in _jsonl_rows(e16, cids)]
        lines[2] = lines[2][:-5]
        f.write_text("\n".join(lines) + "\n")
        return ["--private", f, "--synthetic", syn], [f"{f}:3", "malformed JSON"]
    if name == "wrong-dimension":
        p32 = emb_set(tmp_path / "p32.npy", rng.normal(size=(6, 32)).astype(np.float32), cids)
        return ["--private", p32, "--synthetic", syn], [syn, "field 'embedding'", "16", "32"]
    if name == "nan-private-set":
        bad = e16.copy()
        bad[4, 3] = np.nan
        p = emb_set(tmp_path / "nan.npy", bad, cids)
        return ["--private", p, "--synthetic", syn], [f"{p}:5", "field 'embedding'", "NaN"]
    if name == "nan-synthetic-stdin":
        rows = _jsonl_rows(rng.normal(size=(3, 16)))
        rows[1]["embedding"][0] = float("nan")
        return (["--private", good, "--synthetic", "-"],
                ["<stdin>:2", "field 'embedding'"], "\n".join(json.dumps(r) for r in rows) + "\n")
    if name == "missing-client-jsonl":
        rows = _jsonl_rows(e16, cids)
        del rows[1]["client_id"]
        f = write_jsonl(tmp_path / "priv.jsonl", rows)
        return ["--private", f, "--synthetic", syn], [f"{f}:2", "field 'client_id'"]
    if name == "missing-client-sidecar":
        p = emb_set(tmp_path / "nocid.npy", e16, cids)
        rows = [json.loads(l) for l in open(tmp_path / "nocid.jsonl")]
        del rows[3]["client_id"]
        write_jsonl(tmp_path / "nocid.jsonl", rows)
        return ["--private", p, "--synthetic", syn], [f"{tmp_path / 'nocid.jsonl'}:4",
                                                      "field 'client_id'"]
    if name == "empty-client-set":
        f = tmp_path / "empty.jsonl"
        f.write_text("\n")
        return ["--private", f, "--synthetic", syn], [str(f), "client set is empty"]
    if name == "empty-synthetic":
        f = tmp_path / "nosyn.jsonl"
        f.write_text("")
        return ["--private", good, "--synthetic", f], [str(f), "no synthetic samples"]
    if name == "missing-sidecar":
        np.save(tmp_path / "lonely.npy", e16)
        return (["--private", tmp_path / "lonely.npy", "--synthetic", syn],
                [str(tmp_path / "lonely.npy"), "missing sidecar"])
    if name == "exclusive-sampling":
        return (["--private", good, "--synthetic", syn, "--sample-rate", "0.5",
                 "--clients-per-round", "2"], ["mutually exclusive"])
    if name == "too-many-clients":
        return (["--private", good, "--synthetic", syn, "--clients-per-round", "4"],
                [good, "exceeds the 3 clients"])
    raise AssertionError(name)


BAD = ["malformed-jsonl", "wrong-dimension", "nan-private-set", "nan-synthetic-stdin",
       "missing-client-jsonl", "missing-client-sidecar", "empty-client-set", "empty-synthetic",
       "missing-sidecar",
       "exclusive-sampling", "too-many-clients"]


@pytest.mark.parametrize("name", BAD)
def test_bad_input_one_line_no_output(name, tmp_path, run_popri):
    case = _bad_case(name, tmp_path)
    args, expect, stdin = (case + (None,))[:3]
    outdir = tmp_path / "out"
    outdir.mkdir()
    old = outdir / "scores.npy"
    np.save(old, np.arange(3, dtype=np.float32))
    before = old.read_bytes()
    p = run_popri(["score", *args, "--noise-multiplier", "1", "--seed", "0", "--out", old,
                   "--per-client-out", outdir / "clients.npy"], input=stdin)
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    err = p.stderr.strip()
    assert err.startswith("popri: error:") and "\n" not in err, err
    for piece in expect:
        assert str(piece) in err, (piece, err)
    assert sorted(x.name for x in outdir.iterdir()) == ["scores.npy"]  # nothing new, no temp files
    assert old.read_bytes() == before


def test_aggregate_refuses_a_threshold_on_cosine_uploads(sets, tmp_path, run_popri):
    """Hostile case J04 (issue 66): `aggregate --threshold 1` on cosine uploads applied
    max(x - 1, 0) and zeroed most scores; now refused as `score -H 1` is, nothing written."""
    priv_p, syn_p, *_ = sets
    run_popri(score_args(priv_p, syn_p, tmp_path / "a.npy", "--per-client-out",
                         tmp_path / "pa.npy"), check=True)
    p = run_popri(["aggregate", tmp_path / "pa.npy", "--threshold", "1", "--out",
                   tmp_path / "j04.npy"])
    assert p.returncode == 2 and "field 'threshold'" in p.stderr
    assert "nn-histogram only" in p.stderr and p.stderr.count("\n") == 1
    assert not (tmp_path / "j04.npy").exists() and not (tmp_path / "j04.json").exists()
    assert len(read_ledger(tmp_path / "ledger.jsonl")) == 1  # score's release alone


def test_aggregate_rejects_mismatched_shards(sets, tmp_path, run_popri):
    priv_p, syn_p, *_ = sets
    run_popri(score_args(priv_p, syn_p, tmp_path / "a.npy", "--per-client-out", tmp_path / "pa.npy"),
              check=True)
    run_popri(score_args(priv_p, syn_p, tmp_path / "b.npy", "--per-client-out", tmp_path / "pb.npy",
                         "--clip", "2"), check=True)
    p = run_popri(["aggregate", tmp_path / "pa.npy", tmp_path / "pb.npy", "--out", tmp_path / "x.npy"])
    assert p.returncode == 2 and "field 'clip'" in p.stderr and str(tmp_path / "pb.json") in p.stderr
    p = run_popri(["aggregate", tmp_path / "a.npy", "--out", tmp_path / "x.npy"])
    assert p.returncode == 2 and "field 'kind'" in p.stderr
    assert not (tmp_path / "x.npy").exists()


def test_dataset_dir_private_input_equals_embedding_set(sets, tmp_path, run_popri):
    priv_p, syn_p, priv, cids, _ = sets
    ds = tmp_path / "ds"
    ds.mkdir()
    write_jsonl(ds / "train.jsonl", [{"client_id": c, "embedding": [float(x) for x in v],
                                      "embedding_model": "test-model"} for c, v in zip(cids, priv)])
    (ds / "manifest.json").write_text("{}")
    run_popri(score_args(str(ds), syn_p, tmp_path / "d.npy", "--sample-rate", "0.4"), check=True)
    run_popri(score_args(priv_p, syn_p, tmp_path / "e.npy", "--sample-rate", "0.4"), check=True)
    assert np.array_equal(np.load(tmp_path / "d.npy"), np.load(tmp_path / "e.npy"))


def test_poisson_round_with_no_client_is_server_noise(sets, tmp_path, run_popri):
    priv_p, syn_p, *_ = sets
    pc = tmp_path / "pc.npy"
    p = run_popri(score_args(priv_p, syn_p, tmp_path / "s.npy", "--sample-rate", "1e-9",
                             "--per-client-out", pc), check=True)
    assert "drew no client" in p.stderr
    side = json.loads((tmp_path / "pc.json").read_text())
    assert side["clients"] == [] and side["server_noise_rows"] == 1
    rows = np.load(pc)
    assert rows.shape == (1, 40) and rows.std() > 0.3  # N(0, 1) noise, nothing else
    scores = np.load(tmp_path / "s.npy")
    assert np.allclose(scores, rows[0], rtol=1e-5)  # the noisy sum: no public count given
    run_popri(["aggregate", pc, "--out", tmp_path / "a.npy"], check=True)
    assert np.allclose(np.load(tmp_path / "a.npy"), scores, rtol=1e-5)


def test_per_client_out_alone_records_the_release(sets, tmp_path, run_popri):
    priv_p, syn_p, *_ = sets
    pc = tmp_path / "up" / "clients.npy"
    run_popri(["score", "--private", priv_p, "--synthetic", syn_p, "--noise-multiplier", "2",
               "--seed", "0", "--per-client-out", pc], check=True)
    (entry,) = read_ledger(tmp_path / "up" / "ledger.jsonl")
    assert json.loads((tmp_path / "up" / "clients.json").read_text())["ledger"] == [entry]
    assert entry["noise_multiplier"] == 2 and entry["sensitivity"] == 1.0
    assert sorted(x.name for x in (tmp_path / "up").iterdir()) == [
        "clients.json", "clients.npy", "clients.npy.provenance.json", "ledger.jsonl"]
    # the uploads are the clients' own: private, and no size of theirs is kept (issue 66)
    prov = json.loads((tmp_path / "up" / "clients.npy.provenance.json").read_text())
    assert prov["status"] == "private" and prov["file"] is None


def test_a_text_that_is_not_a_string_is_named_as_such_before_any_release(sets, tmp_path,
                                                                         run_popri):
    """Hostile case P07 (issue 66): `"text": 12345` in --synthetic said "missing required
    field"; it is there, and not a string: one line naming file, line and field, no release."""
    priv_p, *_ = sets
    bad = write_jsonl(tmp_path / "textnum.jsonl", [{"id": "a", "text": "fine"},
                                                   {"id": "b", "text": 12345}])
    p = run_popri(score_args(priv_p, bad, tmp_path / "s.npy"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"{bad}:2: field 'text': must be a string (got int)" in p.stderr
    assert not (tmp_path / "s.npy").exists() and not (tmp_path / "ledger.jsonl").exists()


def test_duplicate_synthetic_ids_are_refused_before_the_release(sets, tmp_path, run_popri):
    """Hostile case P06 (issue 66): all ids `same` -- `score` spent a release (a ledger entry)
    and `prefs build` refused the file afterwards; now `score` refuses it first."""
    priv_p, *_ = sets
    dup = write_jsonl(tmp_path / "dupid.jsonl", [{"id": "same", "text": f"sample {i}"}
                                                 for i in range(3)])
    p = run_popri(score_args(priv_p, dup, tmp_path / "p06" / "scores.npy"))
    assert p.returncode == 2 and p.stderr.count("popri: error:") == 1, p.stderr
    assert "Traceback" not in p.stderr and p.stderr.rstrip("\n").splitlines()[-1].startswith(
        "popri: error:")
    assert f"{dup}:2: field 'id': id 'same' appears twice (rows 1 and 2)" in p.stderr
    assert not (tmp_path / "p06").exists() or not any((tmp_path / "p06").iterdir())


def test_an_unfinished_run_shows_the_epsilon_its_ledgers_hold(sets, tmp_path, run_popri):
    """Hostile case F02 (issue 66): `runs list` / `runs show` of a run killed after its first
    release said "(unfinished)" / nothing of the epsilon, while `account ledger` counted the
    release; both now show the epsilon spent so far and its relation."""
    priv_p, syn_p, *_ = sets
    run = tmp_path / "killed"
    (run / "round1").mkdir(parents=True)
    (run / "config.resolved.json").write_text(json.dumps(
        {"method": "popri", "privacy": {"epsilon": 1.0, "accountant": "rdp"}}))
    run_popri(score_args(priv_p, syn_p, run / "round1" / "scores.npy", "--sample-rate", "0.5",
                         z="2"), check=True)
    acc = json.loads(run_popri(["account", "ledger", run, "--json"], check=True).stdout)
    eps = acc["epsilon"]
    assert eps > 0
    p = run_popri(["runs", "list", tmp_path, "--json"], check=True)
    (row,) = json.loads(p.stdout)
    assert row["finished"] is False and row["epsilon"] == pytest.approx(eps)
    assert "add/remove" in row["neighbouring"]
    p = run_popri(["runs", "list", tmp_path], check=True)
    assert f"{eps:.4g}"[:4] in p.stdout and "(unfinished)" in p.stdout
    p = run_popri(["runs", "show", run], check=True)
    assert "epsilon spent so far: " in p.stdout and "unknown" not in p.stdout
    assert "add/remove" in p.stdout
