"""Issue 37: the `popri run` cases of the hostile test of 0.3.0 that failed
(/work/shared/probes/hostile-0.3.0.md), each reproduced through a real process.

    python -m pytest -q tests/test_hostile_run.py

K11 readable UTF-8 in --show-config; K27 --set ints exact (or refused); K32 / D03 a split too
small for what the run reads stops with one line before any stage reads it; K33 a mapping
--set merges into its section; K48 control characters in a --set value refused; D05 / D06
full participation runs, and a release kept after a stop is checked; D11 / D12 a rerun that
would repeat a finished DP release is refused before anything is touched; I4 stages die with a
SIGKILLed popri run; F01 / F03 a full disk is one line naming the file, and a rerun resumes;
P24 an empty samples file is named.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_one_line_error, _run, write_jsonl
from test_run_e2e import tiny_inputs, tiny_overrides  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "examples" / "smoke.yaml")
#: smoke.yaml as it is run here: Poisson sampling whatever the version's default L per round
RUN_SMOKE = ["run", SMOKE, "--set", "score.clients_per_round=null"]


def _env(**extra) -> dict:
    e = dict(os.environ, POPRI_THREADS="1", PYTHONIOENCODING="utf-8")
    e.update(extra)
    return e


def _popri(args, *, env=None, cwd=None, timeout=900) -> subprocess.CompletedProcess:
    """``python -m popri.cli.app ARGS``, output decoded as UTF-8 (conftest's run: forked from
    the worker's zygote when it can be)."""
    return _run(args, full_env=env or _env(), cwd=cwd, timeout=timeout, encoding="utf-8")


def _one_line(p, code: int = 2) -> str:
    """The error contract, the run's stage logs allowed before the line (conftest)."""
    return assert_one_line_error(p, code=code, logs=True)


def _minimal(run, data, pub, lm, st, *extra) -> list[str]:
    """The tiny run of tests/test_run_e2e.py, one round, nothing optional: the fewest stages."""
    return [*tiny_overrides(run, data, pub, lm, st), "rounds=1", "control=false",
            "baselines=false", "probe.enabled=false", "dpo.select_on=none",
            "score.recovery_rate=false", "score.clients_per_round=null", "score.sample_rate=0.5",
            "generator.max_new_tokens=8", *extra]


def _run_args(overrides) -> list[str]:
    return ["run", *[f"--set={o}" for o in overrides]]


def _train_clients(data) -> int:
    return json.loads((Path(data) / "manifest.json").read_text())["counts"]["train"]["clients"]


# --------------------------------------------------------------------------- config (fast)
def test_k11_show_config_prints_readable_utf8():
    p = _popri([*RUN_SMOKE, "--set", "generator.model=模型🙂", "--show-config"])
    assert p.returncode == 0, p.stderr
    assert "model: 模型🙂" in p.stdout and "\\u" not in p.stdout and "\\U" not in p.stdout


def test_k27_set_keeps_ints_exact_or_refuses_them():
    p = _popri([*RUN_SMOKE, "--set", "prompts=9007199254740993", "--show-config"])
    assert p.returncode == 0, p.stderr
    assert "\nprompts: 9007199254740993\n" in p.stdout  # was ...992 (a float round trip)
    for v in ("99999999999999999999999", "9007199254740993"):
        p = _popri([*RUN_SMOKE, "--set", f"seed={v}", "--show-config"])
        if p.returncode == 0:
            assert f"\nseed: {v}\n" in p.stdout
        else:
            line = _one_line(p)
            assert "field 'seed'" in line and v in line and "e+" not in line, line


def test_k33_a_mapping_set_on_a_section_merges_into_it():
    p = _popri([*RUN_SMOKE, "--set", "data={max_clients: 5}", "--show-config"])
    assert p.returncode == 0, p.stderr
    assert "  max_clients: 5\n" in p.stdout
    # the YAML's other data keys are kept (before: reset to the defaults 1900-01-01, 16, 8)
    assert "date_from: '1990-01-01'" in p.stdout and "  max_samples_per_client: 4\n" in p.stdout
    assert "public_max_samples_per_client: 2" in p.stdout


def test_k48_control_characters_in_a_set_value_are_refused(tmp_path):
    p = _popri([*RUN_SMOKE, "--set", f"run_dir={tmp_path}/nl\ndir", "--dry-run"])
    line = _one_line(p)
    assert "--set run_dir" in line and "newline" in line, line
    assert not (tmp_path / "nl dir").exists() and p.stdout == ""
    cfg = tmp_path / "c.yaml"  # a YAML escape puts one in a path too
    text = Path(SMOKE).read_text().replace("run_dir: runs/smoke\n", "")
    cfg.write_text(text + f'\nrun_dir: "{tmp_path}/a\\tb"\n', encoding="utf-8")
    line = _one_line(_popri(["run", cfg, *RUN_SMOKE[2:], "--dry-run"]))
    assert "field 'run_dir'" in line and "tab" in line, line


def test_p24_an_empty_samples_file_is_named(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    scores = write_jsonl(tmp_path / "scores.jsonl", [{"id": "r1-p0-s0", "score": 1.0}])
    for cmd in (["prefs", "build", "--samples", empty, "--scores", scores, "--out", "-"],
                ["prefs", "pool", "--samples", empty, "--scores", scores, "--base", scores,
                 "--round", "1", "--pool", "union", "--out", tmp_path / "pool.jsonl"]):
        line = _one_line(_popri(cmd))
        assert f"{empty}: no samples" in line and "scores.jsonl" not in line, line


# --------------------------------------------------------------------------- the data (fetch)
def test_k32_an_empty_validation_split_stops_before_a_stage_reads_it(tmp_path):
    """sotu at max_clients 12 and seed 3 puts no client in the validation split: one line
    naming it, right after the fetch (before: every stage ran on to a traceback at probe0)."""
    run = tmp_path / "r"
    p = _popri([*RUN_SMOKE, "--run-dir", run, "--set", "seed=3"])
    line = _one_line(p)
    assert f"{run}/data/private/val.jsonl" in line and "0 samples" in line, line
    assert {f.name for f in (run / ".stages").glob("*.json")} <= {"fetch-private.json",
                                                                  "fetch-public.json"}


def test_d03_control_with_one_test_client_is_refused_before_a_stage_runs(tmp_path):
    """smoke's fetch leaves one test client: control: true cannot pair the method with its
    T = 0 row over test clients; refused right after the fetch (before: every stage ran, then
    control-diff failed and no results.json was written)."""
    run = tmp_path / "r"
    p = _popri([*RUN_SMOKE, "--run-dir", run, "--set", "control=true"])
    line = _one_line(p)
    assert "test.jsonl" in line and "1 client;" in line and "control" in line, line
    assert {f.name for f in (run / ".stages").glob("*.json")} <= {"fetch-private.json",
                                                                  "fetch-public.json"}


# --------------------------------------------------------------------------- DP stages
def test_d05_full_participation_runs(tiny_inputs, tiny_lm, tiny_st_model, tmp_path):
    """Every client every round (PrE-Text's q = 1): plan and record agree, the run finishes;
    a rerun reports the same check (D06's first half)."""
    from popri.privacy.ledger import read_ledger

    data, pub = tiny_inputs
    n = _train_clients(data)
    run = tmp_path / "all"
    ov = _minimal(run, data, pub, tiny_lm, tiny_st_model, f"score.clients_per_round={n}",
                  "score.sample_rate=null")
    p = _popri(_run_args(ov))
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((run / "results.json").read_text())
    chk = res["ledger_check"]
    assert chk["agree"] is True and chk["stages"]["round1-score"]["recorded"] == 1, chk
    (e,) = read_ledger(run / "round1" / "ledger.jsonl")
    # a fixed L = N is still L drawn of N: replace one client at q = 1 (issue 43)
    assert e.sample_rate == 1.0 and e.sampling == "fixed"
    assert e.neighbouring == "replace one client"
    p = _popri(_run_args(ov))
    assert p.returncode == 0 and "0 to run" in p.stderr, p.stderr[-2000:]
    again = json.loads((run / "results.json").read_text())["ledger_check"]
    assert again == chk
    # sample_rate: 1.0 too (stopped right after round 1's check: rc 2 from the test hook)
    run2 = tmp_path / "rate1"
    ov2 = _minimal(run2, data, pub, tiny_lm, tiny_st_model, "score.sample_rate=1.0")
    p = _popri(_run_args(ov2), env=_env(POPRI_FAULT="before-marker:round1-score"))
    assert "injected fault at before-marker:round1-score" in p.stderr, p.stderr[-3000:]
    assert "differ from the ones the budget guard planned" not in p.stderr


def test_d06_a_release_kept_after_a_stop_is_checked(tiny_inputs, tiny_lm, tiny_st_model,
                                                    tmp_path):
    """popri run killed after round 1's release committed, before its marker: the rerun keeps
    the release and checks it against the plan; results.json never says 'agree' for a DP
    stage nobody checked (before: ledger_check {"stages": {}, "agree": true})."""
    data, pub = tiny_inputs
    run = tmp_path / "r"
    ov = _minimal(run, data, pub, tiny_lm, tiny_st_model)
    p = _popri(_run_args(ov), env=_env(POPRI_FAULT="kill-before-marker:round1-score"))
    assert p.returncode == -9, p.stderr[-3000:]
    p = _popri(_run_args(ov))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "its release was committed" in p.stderr
    chk = json.loads((run / "results.json").read_text())["ledger_check"]
    assert "round1-score" in chk["stages"], chk
    st = chk["stages"]["round1-score"]
    assert st["agree"] is True and st["recorded"] == st["planned"] == 1, chk
    assert chk["agree"] is True


def test_d11_d12_a_rerun_of_a_finished_release_is_refused_before_touching_the_run(
        tiny_inputs, tiny_lm, tiny_st_model, tmp_path):
    """A changed generator (D12: generator.temperature; D11: pool) would regenerate round 1's
    samples and release their scores again: refused before anything runs, the finished run
    untouched (before: round1/samples.jsonl and config.resolved.json were overwritten, then
    the budget guard refused round1-score); --rerun does not get past the budget either."""
    data, pub = tiny_inputs
    run = tmp_path / "r"
    ov = _minimal(run, data, pub, tiny_lm, tiny_st_model)
    p = _popri(_run_args(ov), env=_env(POPRI_FAULT="before-marker:round1-prefs"))
    assert "injected fault" in p.stderr and (run / ".stages" / "round1-score.json").is_file()
    files = [run / "round1" / "samples.jsonl", run / "round1" / "scores.npy",
             run / "config.resolved.json", run / "commands.sh", run / "round1" / "ledger.jsonl"]
    before = {f: f.read_bytes() for f in files}
    stages = sorted(f.name for f in (run / ".stages").iterdir())
    p = _popri(_run_args(ov + ["generator.temperature=0.7"]))
    assert [f for f, b in before.items() if f.read_bytes() != b] == []
    line = _one_line(p)
    assert "round1-score (inputs changed: round1-gen runs again)" in line, line
    assert "--rerun" in line, line
    p = _popri(_run_args(ov + ["generator.temperature=0.7"]) + ["--rerun"])
    assert [f for f, b in before.items() if f.read_bytes() != b] == []
    line = _one_line(p)
    assert "budget" in line and "privacy.epsilon" in line, line
    assert sorted(f.name for f in (run / ".stages").iterdir()) == stages


# --------------------------------------------------------------------------- processes
def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return st != "Z"


def _wait_for(path: Path, text: str, p: subprocess.Popen, limit: float = 600) -> None:
    t0 = time.time()
    while text not in (path.read_text(errors="replace") if path.exists() else ""):
        assert p.poll() is None, path.read_text(errors="replace")[-3000:]
        assert time.time() - t0 < limit, f"never saw {text!r}"
        time.sleep(0.1)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_i4_a_sigkilled_run_takes_its_stage_with_it(tiny_inputs, tiny_lm, tiny_st_model,
                                                    tmp_path):
    """SIGKILL popri run (only it) right after round1-dpo started: the dpo stage dies with it
    (before: it ran on, orphaned, while a rerun wrote into the same round1/dpo)."""
    data, pub = tiny_inputs
    run = tmp_path / "r"
    ov = _minimal(run, data, pub, tiny_lm, tiny_st_model)
    err = tmp_path / "err.txt"
    with open(err, "wb") as fh:
        p = subprocess.Popen([sys.executable, "-m", "popri.cli.app", *_run_args(ov)],
                             stdout=subprocess.DEVNULL, stderr=fh, env=_env())
    kids: list[int] = []
    fd = None
    try:
        _wait_for(err, "round1-dpo: popri dpo", p)
        time.sleep(0.5)
        kids = _children(p.pid)
        assert kids, "no stage process"
        p.send_signal(signal.SIGKILL)
        p.wait()
        # the run directory is free for a rerun only once the stage is gone (before: at once,
        # while the orphan went on writing round1/dpo)
        fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
        t0 = time.time()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.time() - t0 < 10, "the stage outlived its popri run"
                time.sleep(0.05)
        t1 = time.time()  # its descriptors are closed: it is exiting
        while any(_alive(k) for k in kids) and time.time() - t1 < 1:
            time.sleep(0.01)
        assert not [k for k in kids if _alive(k)], "the directory was free while the stage ran"
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        if fd is not None:
            os.close(fd)
        for k in kids:
            if _alive(k):
                os.kill(k, signal.SIGKILL)
        if p.poll() is None:
            p.kill()
    r = _popri(_run_args(ov))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "round1-score up to date, skipped" in r.stderr


# --------------------------------------------------------------------------- full disks
@pytest.fixture
def tmpfs(tmp_path):
    """``mount(size)``: a tmpfs of that size of its own (root and mount(8) needed, else the
    test is skipped); ``mount.grow(size)`` remounts it larger."""
    where = tmp_path / "fs"
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")

    def mount(size: str) -> Path:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
        return where

    def grow(size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)

    mount.grow = grow
    yield mount
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _no_half_written(run: Path) -> None:
    left = [str(f) for f in run.rglob("*") if ".tmp" in f.name or f.name.startswith(
        "tmp-checkpoint") or (f.name.startswith("checkpoint-") and f.is_dir()
                              and not (f / "trainer_state.json").exists())]
    assert not left, left


def test_f03_f04_a_disk_full_during_dpo_is_one_line_and_a_rerun_resumes(
        tiny_inputs, tiny_lm, tiny_st_model, tmpfs):
    """A 1 MB disk: round1-dpo's checkpoint (a few MB) does not fit.  One line naming the file,
    exit 2, no half-written checkpoint (before: the dpo stage's trainer._save traceback, an
    'Exception in thread (pump)' traceback in popri run itself, and a last line naming no
    file); after the disk grows the rerun resumes from the last finished stage (F04)."""
    data, pub = tiny_inputs
    fs = tmpfs("1m")
    run = fs / "r"
    ov = _minimal(run, data, pub, tiny_lm, tiny_st_model)
    p = _popri(_run_args(ov))
    line = _one_line(p)
    assert "No space left on device" in line and str(fs) in line, line
    assert (run / ".stages" / "round1-score.json").is_file()
    assert not (run / ".stages" / "round1-dpo.json").exists()
    _no_half_written(run)
    tmpfs.grow("64m")
    r = _popri(_run_args(ov))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "round1-score up to date, skipped" in r.stderr
    assert json.loads((run / "results.json").read_text())["ledger_check"]["agree"] is True


def test_f01_a_disk_full_while_saving_the_downstream_model_is_one_line(
        tiny_inputs, tiny_lm, tiny_st_model, tmpfs):
    """An 8 MB disk: everything fits up to the downstream model (13 MB, saved by
    safetensors).  One line naming the file or directory, exit 2, nothing half-written
    (before: a SafetensorError traceback, exit 1)."""
    data, pub = tiny_inputs
    fs = tmpfs("8m")
    run = fs / "r"
    ov = _minimal(run, data, pub, tiny_lm, tiny_st_model)
    p = _popri(_run_args(ov))
    line = _one_line(p)
    assert "No space left on device" in line and str(fs) in line, line
    assert "downstream-popri" in line, line
    assert not (run / "downstream" / "popri").exists()
    _no_half_written(run)
