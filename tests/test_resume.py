"""Issue 37: a `popri run` resumes from anything a user plausibly does between attempts.

    python -m pytest -q tests/test_resume.py

- a run directory named ``popri`` in the current directory does not shadow the package
  (stages run ``python -P -m popri``);
- another POPRI_THREADS reuses every finished stage (the thread count is in no stage key:
  :meth:`popri.pipeline.stages.StageRunner.key`), the DP release included;
- a resume that would rerun a finished DP stage says so before anything runs and asks for
  --rerun; with it the rerun is a new release (ledgered, within the budget) unless it
  reproduces its release bit for bit (hash-checked), which is then the same release;
- a stage popri run reruns owns its output directory (dpo's stale checkpoints are no refusal).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_hostile_run import _env, _minimal, _one_line, _popri, _run_args
from test_run_e2e import tiny_inputs  # noqa: F401 (fixture)
from popri.pipeline import stages as S
from popri.specs.commands.score import ScoreCall


def _entry_point() -> list[str]:
    """How a user starts popri: the installed entry point (its directory, not the current
    one, is first on sys.path); else ``python -P``."""
    exe = Path(sys.executable).parent / "popri"
    return [str(exe)] if exe.is_file() else [sys.executable, "-P", "-m", "popri.cli.app"]


def _ids(ledger: Path) -> list[str]:
    from popri.privacy.ledger import read_ledger

    return sorted({e.release_id for e in read_ledger(ledger)})


def test_every_stage_runs_popri_without_the_current_directory():
    """The fast half of the next test: a stage's interpreter never puts the working directory
    first on sys.path (``-P``, or the bootstrap that drops it), where a run directory named
    ``popri`` would shadow the package."""
    argv = S.child_argv(["embed", "x"])
    if sys.version_info >= (3, 11):
        assert argv[:4] == [sys.executable, "-P", "-m", "popri"]
    else:
        assert argv[1] == "-c" and "del sys.path[0]" in argv[2]
    assert argv[-2:] == ["embed", "x"]


@pytest.mark.heavy  # make test-heavy: two popri runs on the tiny models (about 1 min); the
# fast test above checks the -P it rests on
def test_a_run_dir_named_popri_in_the_current_directory(tiny_inputs, tiny_lm, tiny_st_model,
                                                        tmp_path):
    """``popri run ... --run-dir popri`` from the directory that holds it: every stage ran
    ``python -m popri`` with the current directory first on sys.path, so ``popri.data`` was
    the run's data/ folder and every stage failed, on the first attempt and on a resume.
    (Only where popri is installed, as by pip's editable install: a PYTHONPATH entry holding
    the package comes before the shadowing namespace directory.)"""
    import shutil

    data, pub = tiny_inputs
    # the run's data where a fetch puts it (RUN/data/private): the package's own 'popri.data'
    # is what a popri/data directory in the current directory shadowed
    shutil.copytree(data, tmp_path / "popri" / "data" / "private")
    ov = _minimal("popri", "popri/data/private", pub, tiny_lm, tiny_st_model)
    for fault in ("before-marker:round1-gen", "before-marker:round1-score"):
        p = subprocess.run([*_entry_point(), *_run_args(ov)], capture_output=True, text=True,
                           cwd=tmp_path, env=_env(POPRI_FAULT=fault), timeout=900)
        assert f"injected fault at {fault}" in p.stderr, p.stderr[-3000:]
        assert "No module named" not in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "embed-train up to date, skipped" in p.stderr
    assert (tmp_path / "popri" / "round1" / "scores.npy").is_file()


def test_the_thread_count_is_in_no_stage_key_and_is_recorded(tmp_path, monkeypatch):
    """The fast half of the next test: the same stage has the same key at any POPRI_THREADS
    (a resume at another count reuses it), and the runner passes the count on."""
    st = S.Stage("round1-score", ScoreCall(synthetic="s.jsonl", noise_multiplier=2.0,
                                           out=str(tmp_path / "scores.npy")), outputs=[])
    keys = set()
    for n in ("1", "2", "7"):
        monkeypatch.setenv("POPRI_THREADS", n)
        runner = S.StageRunner(tmp_path / "run")
        assert runner.env.get("POPRI_THREADS") == n
        keys.add(runner.key(st))
    assert len(keys) == 1
    assert "POPRI_THREADS" not in S.KEYED_ENV and "POPRI_THREADS" in S.RECORDED_ENV


@pytest.mark.heavy  # make test-heavy: a run killed at 1 thread and resumed at 2 (about 3 min
# on 2 cores); the fast test above checks the key it rests on
def test_a_resume_with_another_thread_count_reuses_every_finished_stage(
        tiny_inputs, tiny_lm, tiny_st_model, tmp_path):
    """Killed after round 1's DP scores at POPRI_THREADS=1, resumed at 2: the finished stages
    (the release among them) are skipped, not rerun -- before, every stage key held the count:
    everything reran, round1-dpo refused its own directory and the rerun of round1-score was a
    second release, over the budget."""
    data, pub = tiny_inputs
    run = tmp_path / "run"
    ov = _minimal(run, data, pub, tiny_lm, tiny_st_model)
    marker = run / ".stages" / "round1-score.json"
    p = subprocess.Popen([sys.executable, "-m", "popri.cli.app", *_run_args(ov)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env=_env(POPRI_THREADS="1"), start_new_session=True)
    t0 = time.time()
    while not marker.exists():
        assert p.poll() is None, p.communicate()[1][-3000:]
        assert time.time() - t0 < 900, "round1-score never finished"
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    done = {f.name: f.read_bytes() for f in (run / ".stages").glob("*.json")
            if not f.name.endswith(".attempt.json")}
    assert {"embed-train.json", "embed-val.json", "round1-gen.json",
            "round1-score.json"} <= set(done)
    scores = (run / "round1" / "scores.npy").read_bytes()
    ids = _ids(run / "round1" / "ledger.jsonl")
    r = _popri(_run_args(ov), env=_env(POPRI_THREADS="2"))
    assert r.returncode == 0, r.stderr[-3000:]
    for name in ("embed-train", "embed-val", "round1-gen", "round1-score"):
        assert f" {name} up to date, skipped" in r.stderr, r.stderr[-3000:]
        assert (run / ".stages" / f"{name}.json").read_bytes() == done[f"{name}.json"]
    assert (run / "round1" / "scores.npy").read_bytes() == scores
    assert _ids(run / "round1" / "ledger.jsonl") == ids and len(ids) == 1
    res = json.loads((run / "results.json").read_text())
    assert res["epsilon"] <= 1.0 * (1 + 1e-6) and res["ledger_check"]["agree"] is True
    assert "holds checkpoints of a different" not in r.stderr
    # each marker says which count its stage ran with; back at 1 thread nothing reruns
    m = json.loads((run / ".stages" / "round1-dpo.json").read_text())
    assert m["env"]["POPRI_THREADS"] == "2"
    r1 = _popri(_run_args(ov), env=_env(POPRI_THREADS="1"))
    assert r1.returncode == 0 and "everything is up to date" in r1.stderr, r1.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["methods"] == res["methods"]


def test_a_resume_that_would_rerun_a_finished_dp_stage_is_said_before_anything_runs(
        tiny_inputs, tiny_lm, tiny_st_model, tmp_path):
    """A finished DP stage that a resume would run again: refused before anything runs, naming
    it and why; with --rerun, a rerun that reproduces its release bit for bit is the same
    release, and any other is a new one (ledgered, within the budget)."""
    data, pub = tiny_inputs
    run = tmp_path / "run"
    # z given, so a larger budget leaves the score command as it was
    ov = _minimal(run, data, pub, tiny_lm, tiny_st_model, "privacy.noise_multiplier=3.0",
                  "privacy.epsilon=3.0")
    stop = _env(POPRI_FAULT="before-marker:round1-prefs")
    p = _popri(_run_args(ov), env=stop)
    assert "injected fault" in p.stderr and (run / ".stages" / "round1-score.json").is_file()
    led = run / "round1" / "ledger.jsonl"
    first = _ids(led)
    keep = [run / "commands.sh", run / "config.resolved.json", run / "round1" / "scores.npy",
            run / "round1" / "samples.jsonl", led]
    before = {f: f.read_bytes() for f in keep}
    logs = sorted(x.name for x in (run / "logs").iterdir())
    # 1. a changed setting of the DP stage itself: said, nothing run or written
    line = _one_line(_popri(_run_args(ov + ["score.clip=0.5"])))
    assert "round1-score (--clip 1.0 -> 0.5)" in line and "--rerun" in line, line
    assert all(f.read_bytes() == b for f, b in before.items())
    assert sorted(x.name for x in (run / "logs").iterdir()) == logs
    # 2. its output edited: said too; with --rerun it reproduces its release bit for bit
    scores = run / "round1" / "scores.npy"
    scores.write_bytes(before[scores][:-8] + b"\0" * 8)
    line = _one_line(_popri(_run_args(ov)))
    assert "round1-score (outputs changed)" in line, line
    p = _popri(_run_args(ov) + ["--rerun"], env=stop)
    assert "injected fault" in p.stderr, p.stderr[-3000:]
    assert scores.read_bytes() == before[scores] and _ids(led) == first
    chk = json.loads((run / ".stages" / "round1-score.json").read_text())["ledger_check"]
    assert "bit for bit" in chk["note"], chk
    # 3. --rerun with another setting: a new release, in the ledger
    p = _popri(_run_args(ov + ["score.clip=0.5"]) + ["--rerun"], env=stop)
    assert "injected fault" in p.stderr, p.stderr[-3000:]
    assert len(_ids(led)) == 2 and set(first) < set(_ids(led))
    chk = json.loads((run / ".stages" / "round1-score.json").read_text())["ledger_check"]
    assert chk["recorded"] == 1 and chk["agree"] is True


def test_a_stage_popri_run_reruns_owns_its_output_directory(tiny_inputs, tiny_lm,
                                                             tiny_st_model, tmp_path):
    """round1-dpo rerun with another learning rate: its directory holds the first attempt's
    checkpoints; the rerun starts over there (before: 'holds checkpoints of a different dpo
    run: choose another --out, or --no-resume', which a popri run user cannot pass)."""
    data, pub = tiny_inputs
    run = tmp_path / "run"
    ov = _minimal(run, data, pub, tiny_lm, tiny_st_model)
    stop = _env(POPRI_FAULT="before-marker:synthetic")
    p = _popri(_run_args(ov), env=stop)
    assert "injected fault" in p.stderr, p.stderr[-3000:]
    assert list((run / "round1" / "dpo").glob("checkpoint-*"))
    p = _popri(_run_args(ov + ["dpo.lr=0.0001"]), env=stop)
    assert "injected fault" in p.stderr, p.stderr[-3000:]
    assert "holds checkpoints of a different" not in p.stderr
    m = json.loads((run / ".stages" / "round1-dpo.json").read_text())
    assert "0.0001" in m["args"] and "--no-resume" not in m["args"]
    assert "round1-score up to date, skipped" in p.stderr


def test_a_dp_rerun_is_the_same_release_only_if_bit_identical(tmp_path):
    """The hash check after a DP stage reran under a release id its ledger already held: the
    same outputs are the same release (nothing appended); other outputs -- floating-point sums
    can differ, e.g. with the thread count -- are a second release, ledgered under a derived id
    so the total counts it."""
    from popri.core.artifacts import path_digest
    from popri.kit import DPRelease, Stage
    from popri.pipeline.stages import StageRunner
    from popri.privacy.accounting import compose
    from popri.privacy.entries import gaussian
    from popri.privacy.ledger import append, read_ledger

    out = tmp_path / "round1" / "scores.npy"
    out.parent.mkdir()
    out.write_bytes(b"first release")
    entry = gaussian("score", noise_multiplier=2.0, sample_rate=1.0, sensitivity=1.0,
                     sampling="none", delta=1e-5, mode="research", params={"round": 1},
                     release_id="abc")
    (tmp_path / "round1" / "scores.json").write_text(json.dumps({"ledger": [entry.to_dict()]}))
    led = append(out, [entry])
    plan = gaussian("score", noise_multiplier=2.0, sample_rate=1.0, sensitivity=1.0,
                    sampling="none", delta=1e-5, mode="research", params={"round": 1})
    st = Stage("round1-score", ScoreCall(synthetic="s.jsonl", noise_multiplier=2.0),
               outputs=[str(out)],
               release=DPRelease([plan], led, lambda e: e.stage == "score"))
    r = StageRunner(tmp_path)
    earlier = {"hashes": {str(out): path_digest(str(out))}}
    # reran and wrote the same bytes (its ledger append deduped): the same release
    chk = r._conform(st, (1, ["abc"]), earlier)
    assert "bit for bit" in chk["note"] and len(read_ledger(led)) == 1
    # reran and wrote other bytes under the same id: a new release, in the ledger
    out.write_bytes(b"other bytes")
    chk = r._conform(st, (1, ["abc"]), earlier)
    assert chk["agree"] is True and chk["recorded"] == 1 and "new release" in chk["note"]
    entries = read_ledger(led)
    assert len({e.release_id for e in entries}) == 2 and entries[1].params["rerun_of"] == "abc"
    one = compose([entries[0]], 1e-5, "rdp").epsilon
    assert compose(entries, 1e-5, "rdp").epsilon > one * 1.2
