"""Issue 22's hostile cases on what popri writes: directory outputs never delete what popri did
not write, broken weights directories are one-line errors, release mode writes no exact
statistic of the clients' data, Flower staging leaves no private data, and two release runs
cannot overspend one budget.  Each test is named by its case ID in
``shared/probes/hostile-0.2.0.md`` (fl83, ff31, rr08 ...).

    python -m pytest -q tests/test_hostile_outputs.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error, write_jsonl
from test_run_privacy import dataset  # noqa: F401  (fixture)

FAST_FL = ["--no-bf16", "-z", "1", "-L", "3", "--seed", "0"]
FFP_LORA = ["--lora-r", "8", "--lora-alpha", "16"]


def _one_line(p, *needles):
    return assert_one_line_error(p, *needles)


def _fl_data(d: Path, clients: int = 6, per: int = 3, text=None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    rows = [{"client_id": f"c{i % clients}",
             "text": text if text is not None else f"the quick brown fox {i} jumps"}
            for i in range(clients * per)]
    return write_jsonl(d / "data.jsonl", rows)


def _fifo(path: Path) -> Path:
    """A special file standing in for /dev/full (deleting the real one would break the box)."""
    os.mkfifo(path)
    return path


def _fl(run_popri, data, out, tiny_lm, *more, env=None):
    return run_popri(["fl", "round", "--data", data, "--model", tiny_lm, "--round", "1",
                      *FAST_FL, "--out", out, *more], env=env)


@pytest.fixture(scope="module")
def fl_round1(tiny_lm, tmp_path_factory):
    """run/round1 and run/round2 with run/ledger.jsonl (2 entries)."""
    from conftest import _run

    d = tmp_path_factory.mktemp("flrun")
    data = _fl_data(d / "in")
    run = d / "run"
    _run(["fl", "round", "--data", data, "--model", tiny_lm, "--round", "1", *FAST_FL,
          "--out", run / "round1"], check=True)
    _run(["fl", "round", "--data", data, "--round", "2", "--init", run / "round1", *FAST_FL,
          "--out", run / "round2"], check=True)
    return data, run


# --------------------------------------------------------------------------- directory outputs
def test_fl83_a_special_file_as_out_is_refused_and_kept(tiny_lm, tmp_path, run_popri):
    data = _fl_data(tmp_path / "in")
    dev = _fifo(tmp_path / "full")
    p = _fl(run_popri, data, dev, tiny_lm)
    _one_line(p, "not a directory")
    assert dev.exists() and not dev.is_dir() and Path(dev).is_fifo()
    assert not (tmp_path / "ledger.jsonl").exists()


def test_fl84_an_existing_file_as_out_is_refused_and_kept(tiny_lm, tmp_path, run_popri):
    data = _fl_data(tmp_path / "in")
    f = tmp_path / "afile"
    f.write_text("my notes")
    _one_line(_fl(run_popri, data, f, tiny_lm), "not a directory")
    assert f.read_text() == "my notes" and not (tmp_path / "ledger.jsonl").exists()


def test_fl87_a_users_directory_as_out_is_refused_and_kept(tiny_lm, tmp_path, run_popri):
    data = _fl_data(tmp_path / "in")
    d = tmp_path / "precious"
    d.mkdir()
    (d / "thesis.txt").write_text("years")
    (d / "data.jsonl").write_text("{}\n")
    _one_line(_fl(run_popri, data, d, tiny_lm), "not written by popri")
    assert sorted(x.name for x in d.iterdir()) == ["data.jsonl", "thesis.txt"]


def test_fl88_an_out_holding_the_private_data_is_refused(tiny_lm, tmp_path, run_popri):
    data = _fl_data(tmp_path / "precious2")
    before = data.read_bytes()
    _one_line(_fl(run_popri, data, tmp_path / "precious2", tiny_lm), "would overwrite input")
    assert data.read_bytes() == before


def test_fl90_93_an_out_holding_the_ledger_is_refused_and_the_ledger_kept(fl_round1, tiny_lm,
                                                                        run_popri):
    from popri.privacy.ledger import read_ledger

    data, run = fl_round1
    assert len(read_ledger(run / "ledger.jsonl")) == 2
    _one_line(_fl(run_popri, data, run, tiny_lm), str(run))
    assert len(read_ledger(run / "ledger.jsonl")) == 2
    assert (run / "round1" / "theta.npy").is_file() and (run / "round2" / "theta.npy").is_file()
    p = run_popri(["account", "ledger", run, "--json"], check=True)
    assert json.loads(p.stdout)["entries"] == 2


def test_rerunning_a_round_into_its_own_output_replaces_it(fl_round1, tiny_lm, run_popri,
                                                           tmp_path):
    """The rule refuses what is not ours, not a rerun: a round directory popri wrote is
    replaced (atomically) by the same command again."""
    data, run = fl_round1
    out = tmp_path / "r" / "round1"
    _fl(run_popri, data, out, tiny_lm)
    (out / "theta.npy").write_bytes(b"garbage")
    assert _fl(run_popri, data, out, tiny_lm).returncode == 0
    assert np.load(out / "theta.npy").ndim == 1
    assert sorted(x.name for x in out.parent.iterdir()) == ["ledger.jsonl", "round1"]


@pytest.fixture(scope="module")
def ffp(tiny_lm, tmp_path_factory):
    """A FewFedPIT round's inputs: r0 (global), c0/local, c0/public, c0/mixed, c1/mixed, the
    private data and a synthetic set."""
    from popri.methods.fewfedpit import client as C
    from popri.specs.fewfedpit import FewFedPITSpec
    from test_fewfedpit import _data, _synthetic

    d = tmp_path_factory.mktemp("ffp")
    spec = FewFedPITSpec(lora_r=8, lora_alpha=16, bf16=False)
    C.init_global(tiny_lm, str(d / "R" / "r0"), spec, seed=0, device="cpu")
    theta0, st0 = C.read_state(d / "R" / "r0")
    for c in ("c0", "c1"):
        for kind, shift in (("local", 0.01), ("public", -0.01), ("mixed", 0.005)):
            C.write_state(d / "R" / "r1" / c / kind, theta0 + shift,
                          {**st0, "kind": kind, "round": 1, "client": c, "n_examples": 2})
    return {"dir": d, "R": d / "R", "data": _data(d), "syn": _synthetic(d)}


def _ffp_cmd(ffp, cmd, out):
    R = ffp["R"]
    base = ["--round", "1", "--init", R / "r0"]
    return {
        "init": ["fewfedpit", "init", "--model", "TINY", "--seed", "0", "--out", out, *FFP_LORA],
        "local": ["fewfedpit", "local", "--data", ffp["data"], "--client", "c0", *base, "--out",
                  out, "--no-bf16", *FFP_LORA],
        "mix": ["fewfedpit", "mix", "--local", R / "r1" / "c0" / "local", "--public",
                R / "r1" / "c0" / "public", *base, "--out", out],
        "aggregate": ["fewfedpit", "aggregate", R / "r1" / "c0" / "mixed",
                      R / "r1" / "c1" / "mixed", *base, "--out", out, *FFP_LORA],
        "train": ["fewfedpit", "train", "--synthetic", ffp["syn"], "--client", "c0", *base,
                  "--out", out, "--no-bf16", *FFP_LORA],
    }[cmd]


@pytest.mark.parametrize("cmd", ["init", "local", "mix", "aggregate", "train"])
def test_ff20_23_25_fewfedpit_refuses_a_special_file_as_out(ffp, tiny_lm, tmp_path, run_popri,
                                                           cmd):
    dev = _fifo(tmp_path / "full")
    argv = [tiny_lm if a == "TINY" else a for a in _ffp_cmd(ffp, cmd, dev)]
    _one_line(run_popri(argv), "not a directory")
    assert dev.is_fifo() and not (tmp_path / "ledger.jsonl").exists()


def test_ff26_init_refuses_a_users_directory(tiny_lm, tmp_path, run_popri):
    d = tmp_path / "prec"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    _one_line(run_popri(["fewfedpit", "init", "--model", tiny_lm, "--out", d, *FFP_LORA]),
              "not written by popri")
    assert (d / "notes.txt").read_text() == "mine"


def test_ff27_mix_refuses_an_existing_file(ffp, tmp_path, run_popri):
    f = tmp_path / "afile"
    f.write_text("mine")
    _one_line(run_popri(_ffp_cmd(ffp, "mix", f)), "not a directory")
    assert f.read_text() == "mine"


def test_ff30_mix_refuses_an_out_holding_its_inputs(ffp, run_popri):
    c1 = ffp["R"] / "r1" / "c0"
    before = {k: (c1 / k / "theta.npy").read_bytes() for k in ("local", "public")}
    _one_line(run_popri(_ffp_cmd(ffp, "mix", c1)), "would overwrite input")
    assert {k: (c1 / k / "theta.npy").read_bytes() for k in ("local", "public")} == before


def test_ff31_aggregate_refuses_the_round_directory_and_keeps_ledger_and_uploads(ffp, run_popri):
    r1 = ffp["R"] / "r1"
    (r1 / "ledger.jsonl").write_text("")  # the round's ledger, as a run leaves it
    _one_line(run_popri(_ffp_cmd(ffp, "aggregate", r1)), "would overwrite input")
    assert (r1 / "ledger.jsonl").exists()
    assert all((r1 / c / k / "theta.npy").is_file() for c in ("c0", "c1")
               for k in ("local", "public", "mixed"))


def test_ib23_a_dataset_named_dash_is_refused(tmp_path, run_popri):
    src = write_jsonl(tmp_path / "ok.jsonl", [
        {"client_id": f"c{i}", "instruction": f"Describe item {i}.", "input": "",
         "output": f"Item {i} is a small useful object for many people."} for i in range(6)])
    p = run_popri(["instruct", "build", src, "--out", "-"], cwd=tmp_path)
    _one_line(p, "'-' is not a directory name")
    assert not (tmp_path / "-").exists()


# --------------------------------------------------------------------------- broken inputs
def test_fl95_a_truncated_init_theta_is_one_line(fl_round1, tmp_path, run_popri):
    import shutil

    data, run = fl_round1
    bad = tmp_path / "trunc_init"
    shutil.copytree(run / "round1", bad)
    (bad / "theta.npy").write_bytes((bad / "theta.npy").read_bytes()[:1000])
    p = run_popri(["fl", "round", "--data", data, "--round", "2", "--init", bad, *FAST_FL,
                   "--out", tmp_path / "o" / "round2"])
    _one_line(p, "theta.npy")


def test_fl96_a_malformed_init_round_json_is_one_line(fl_round1, tmp_path, run_popri):
    import shutil

    data, run = fl_round1
    bad = tmp_path / "badround"
    shutil.copytree(run / "round1", bad)
    (bad / "round.json").write_text('{"round": 1, "spec": ')
    p = run_popri(["fl", "round", "--data", data, "--round", "2", "--init", bad, *FAST_FL,
                   "--out", tmp_path / "o" / "round2"])
    _one_line(p, "round.json")


def _bad_upload(ffp, tmp_path, change) -> Path:
    import shutil

    u = tmp_path / "bad"
    shutil.copytree(ffp["R"] / "r1" / "c1" / "mixed", u)
    change(u)
    return u


def _set_state(**kv):
    def change(u):
        st = json.loads((u / "state.json").read_text())
        st.update(kv)
        (u / "state.json").write_text(json.dumps(st))
    return change


def _truncate(u):
    (u / "theta.npy").write_bytes((u / "theta.npy").read_bytes()[:100])


def _object_array(u):
    np.save(u / "theta.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)


@pytest.mark.parametrize("case,change,field", [
    ("badtrunc", _truncate, "theta.npy"),
    ("badobj", _object_array, "theta.npy"),
    ("badstate3", _set_state(n_examples=float("nan")), "n_examples"),
    ("badstate4", _set_state(n_examples="abc"), "n_examples"),
    ("badstate5", _set_state(n_examples=1e300), "n_examples"),
    ("badstate6", _set_state(lora="x"), "lora"),
])
def test_ffa_broken_uploads_are_one_line(ffp, tmp_path, run_popri, case, change, field):
    u = _bad_upload(ffp, tmp_path, change)
    p = run_popri(["fewfedpit", "aggregate", ffp["R"] / "r1" / "c0" / "mixed", u, "--round",
                   "1", "--init", ffp["R"] / "r0", "--out", tmp_path / "g" / "r1", *FFP_LORA])
    _one_line(p, field)
    assert not (tmp_path / "g").exists() or not any((tmp_path / "g").iterdir())


def test_ff67_aggregate_delta_out_of_range_is_one_line(ffp, tmp_path, run_popri):
    argv = _ffp_cmd(ffp, "aggregate", tmp_path / "g" / "r1")
    _one_line(run_popri([*argv, "--clip", "1", "-z", "1", "--delta", "2"]), "--delta")


def test_fl_emptytext_training_on_nothing_is_refused(tiny_lm, tmp_path, run_popri):
    data = _fl_data(tmp_path / "in", text="")
    _one_line(_fl(run_popri, data, tmp_path / "o" / "round1", tiny_lm), "empty")
    assert not (tmp_path / "o" / "ledger.jsonl").exists()


# --------------------------------------------------------------------------- popri run, budgets
def _dpfl_release(run, dataset, tiny_lm):
    from test_dpfl import _run_args

    return _run_args(run, dataset, tiny_lm, "dp-fedavg", "--release")


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (left out of CI: a kept release checked: test_hostile_run.py::test_d06)
def test_rr04_05_a_release_committed_before_a_stop_is_kept_and_the_run_finishes(
        tmp_path, dataset, tiny_lm, run_popri):
    """popri run --release stopped after round 1's release committed (ledger entry and round
    directory) but before its stage marker: the rerun keeps that release instead of refusing
    the run as over budget (or releasing round 1 twice)."""
    from popri.privacy.ledger import read_ledger

    run = tmp_path / "run"
    p = run_popri(_dpfl_release(run, dataset, tiny_lm),
                  env={"POPRI_FAULT": "kill-before-marker:fl-round1"})
    assert p.returncode == -9
    assert len(read_ledger(run / "fl" / "ledger.jsonl")) == 1
    assert (run / "fl" / "round1" / "theta.npy").is_file()
    assert not (run / ".stages" / "fl-round1.json").exists()
    p = run_popri(_dpfl_release(run, dataset, tiny_lm), check=True)
    assert "[fl-round1] its release was committed" in p.stderr
    entries = read_ledger(run / "fl" / "ledger.jsonl")
    assert [e.params["round"] for e in entries] == [1, 2]
    res = json.loads((run / "results.json").read_text())
    assert res["epsilon"] <= 1.0 * (1 + 1e-6)


def test_rr08_09_two_release_runs_on_one_run_dir_cannot_overspend(tmp_path, dataset, tiny_lm):
    from popri.privacy.ledger import read_ledger

    run = tmp_path / "run"
    env = dict(os.environ, POPRI_THREADS="1")
    argv = [sys.executable, "-m", "popri.cli.app", *map(str, _dpfl_release(run, dataset,
                                                                           tiny_lm))]
    a = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    t0 = time.time()
    while not (run / ".stages").exists() and time.time() - t0 < 120:
        time.sleep(0.1)
    b = subprocess.run(argv, capture_output=True, text=True, env=env)
    a_out, a_err = a.communicate(timeout=600)
    assert a.returncode == 0, a_err
    _one_line(b, "in use by another popri run")
    assert len(read_ledger(run / "fl" / "ledger.jsonl")) == 2
    assert json.loads((run / "results.json").read_text())["epsilon"] <= 1.0 * (1 + 1e-6)
