"""``popri run --reuse-from``: a stage another run finished is copied, never a different one.

    python -m pytest -q tests/test_reuse.py

The runner's rule (popri/pipeline/reuse.py): the lender's marker key must be this stage's key
with this run's paths moved to the lender's, its outputs must still hash as recorded, and so
must the copy; a DP release is never copied, nor anything in release mode.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from popri.core.errors import ConfigError
from popri.kit import DPRelease, Stage
from popri.pipeline import reuse
from popri.pipeline.stages import StageRunner
from popri.specs.commands.account import AccountEpsilonCall, AccountLedgerCall


def _eps(out, z=2.0):
    return Stage("eps", AccountEpsilonCall(noise_multiplier=float(z), sample_rate=1.0, steps=1,
                                           as_json=True), outputs=[str(out)], stdout_to=str(out))


def _dep(run: Path) -> Stage:
    """A stage reading the first one's output (its input key is that output's hash) and a file
    of its own run directory (a path that moves with the run)."""
    return Stage("dep", AccountLedgerCall(paths=(str(run / "ledger.jsonl"),), as_json=True),
                 outputs=[str(run / "b.json")],
                 inputs=[str(run / "a.json"), str(run / "ledger.jsonl")],
                 stdout_to=str(run / "b.json"))


LEDGER = json.dumps({"stage": "s", "mechanism": "gaussian", "noise_multiplier": 2.0,
                     "sample_rate": 1.0, "steps": 1, "delta": 1e-5, "sensitivity": 1.0,
                     "release_id": "x"}) + "\n"


def _lender(root: Path, z=2.0) -> Path:
    a = root / "a"
    a.mkdir()
    (a / "ledger.jsonl").write_text(LEDGER)
    r = StageRunner(a)
    assert r.run(_eps(a / "a.json", z)) is True
    assert r.run(_dep(a)) is True
    return a


def _borrower(root: Path, lenders, z=2.0) -> tuple[StageRunner, Path]:
    b = root / "b"
    b.mkdir(exist_ok=True)
    (b / "ledger.jsonl").write_text(LEDGER)
    r = StageRunner(b)
    r.lenders = [Path(x) for x in lenders]
    return r, b


def test_the_same_stages_are_copied_with_their_markers_then_cached(tmp_path):
    a = _lender(tmp_path)
    r, b = _borrower(tmp_path, [a])
    assert r.run(_eps(b / "a.json")) is False and r.run(_dep(b)) is False
    assert r.reused == ["eps", "dep"] and r.ran == []
    for name in ("a.json", "b.json"):
        assert (b / name).read_bytes() == (a / name).read_bytes()
    for name in ("eps", "dep"):
        mine = json.loads((b / ".stages" / f"{name}.json").read_text())
        theirs = json.loads((a / ".stages" / f"{name}.json").read_text())
        assert mine["reused_from"] == str(a) and mine["seconds"] == theirs["seconds"]
        # its own key: dep's command names a file of its own run (eps's names none)
        assert (mine["key"] != theirs["key"]) is (name == "dep")
        assert list(mine["hashes"].values()) == list(theirs["hashes"].values())
    assert "# copied from" in (b / "commands.sh").read_text()
    again = StageRunner(b)  # no lender now: both are this run's own cached stages
    assert again.run(_eps(b / "a.json")) is False and again.run(_dep(b)) is False
    assert again.skipped == ["eps", "dep"]


def test_a_different_command_or_input_is_run_not_copied(tmp_path):
    a = _lender(tmp_path)
    r, b = _borrower(tmp_path, [a])
    assert r.run(_eps(b / "a.json", 3.0)) is True        # another argument: runs
    assert r.run(_dep(b)) is True                         # its input differs now: runs too
    assert r.reused == [] and json.loads((b / "a.json").read_text())["noise_multiplier"] == 3.0
    # the same commands, but a file of this run that dep reads differs from the lender's
    x = tmp_path / "x"
    x.mkdir()
    r2, b2 = _borrower(x, [a])
    (b2 / "ledger.jsonl").write_text(LEDGER.replace('"steps": 1', '"steps": 2'))
    assert r2.run(_eps(b2 / "a.json")) is False           # copied
    assert r2.run(_dep(b2)) is True and r2.reused == ["eps"]


def test_a_lender_output_edited_after_its_marker_is_not_copied(tmp_path):
    a = _lender(tmp_path)
    (a / "a.json").write_text('{"epsilon": 0.001}\n')
    r, b = _borrower(tmp_path, [a])
    assert r.run(_eps(b / "a.json")) is True and r.reused == []
    assert json.loads((b / "a.json").read_text())["noise_multiplier"] == 2.0


def test_a_copy_that_does_not_hash_as_recorded_runs_the_stage(tmp_path, monkeypatch):
    a = _lender(tmp_path)
    r, b = _borrower(tmp_path, [a])

    def torn(src, dst):  # the lender changed between the check and the copy
        dst.write_text("{}\n")

    monkeypatch.setattr("popri.pipeline.stages.copy_in", torn)
    assert r.run(_eps(b / "a.json")) is True and r.reused == []
    assert "reused_from" not in json.loads((b / ".stages" / "eps.json").read_text())
    assert json.loads((b / "a.json").read_text())["noise_multiplier"] == 2.0


def test_a_dp_release_is_never_copied(tmp_path):
    a = _lender(tmp_path)
    r, b = _borrower(tmp_path, [a])
    st = _eps(b / "a.json")
    st.release = DPRelease(entries=[], ledger=b / "ledger.jsonl", match=lambda e: False)
    assert r.loan(st) is None
    assert r.loan(_eps(b / "a.json")) is not None


def test_the_lender_may_be_named_relatively_and_have_run_under_another_spelling(
        tmp_path, monkeypatch):
    """The lender ran as ``a`` from its parent (relative paths in its markers); this run is
    absolute, and names the lender through a symlink: the translation follows the lender's
    own markers, the files are read through the name given."""
    monkeypatch.chdir(tmp_path)
    Path("a").mkdir()
    Path("a/ledger.jsonl").write_text(LEDGER)
    r0 = StageRunner("a")
    r0.run(_eps(Path("a") / "a.json"))
    r0.run(_dep(Path("a")))
    (tmp_path / "link").symlink_to(tmp_path / "a")
    r, b = _borrower(tmp_path, [tmp_path / "link"])
    assert r.run(_eps(b / "a.json")) is False and r.run(_dep(b)) is False
    assert r.reused == ["eps", "dep"]


def test_the_first_lender_that_has_it_is_used(tmp_path):
    other = tmp_path / "o"
    other.mkdir()
    _lender(other, z=5.0)  # o/a: another z
    a = _lender(tmp_path)
    r, b = _borrower(tmp_path, [other / "a", a])
    assert r.run(_eps(b / "a.json")) is False
    assert json.loads((b / ".stages" / "eps.json").read_text())["reused_from"] == str(a)


def test_a_dry_run_plans_the_copies_and_writes_nothing(tmp_path):
    a = _lender(tmp_path)
    b = tmp_path / "b"
    b.mkdir()
    (b / "ledger.jsonl").write_text(LEDGER)
    r = StageRunner(b, dry_run=True)
    r.lenders = [a]
    assert r.run(_eps(b / "a.json")) is False and r.run(_dep(b)) is False
    assert [c.endswith(f"# copied from {a}") for c in r.commands] == [True, True]
    assert sorted(p.name for p in b.iterdir()) == ["ledger.jsonl"]
    cached, todo = StageRunner(b).survey([_eps(b / "a.json")])
    assert todo == [("eps", "new")]
    s = StageRunner(b)
    s.lenders = [a]
    assert s.survey([_eps(b / "a.json"), _dep(b)]) == (
        [], [("eps", f"copied from {a}"), ("dep", f"copied from {a}")])


def test_written_paths_take_out_arguments_and_companions():
    from popri.specs.commands.gen import GenCall

    st = Stage("g", GenCall.draft(omega="pub.jsonl", out="r/s.jsonl", stats_out="r/st.json"),
               outputs=["r/s.jsonl"], inputs=["pub.jsonl"])
    assert reuse.written_paths(st) == ["r/s.jsonl", "r/st.json"]
    st = Stage("e", AccountEpsilonCall(noise_multiplier=1.0, sample_rate=1.0, steps=1),
               outputs=["r/x.npy", "r/d"], stdout_to=None)
    assert reuse.written_paths(st) == ["r/x.npy", "r/d", "r/x.jsonl", "r/x.meta.json",
                                       "r/x.json"]
    st = Stage("d", AccountEpsilonCall(noise_multiplier=1.0, sample_rate=1.0, steps=1),
               outputs=["r/dpo/adapter", "r/dpo"])
    assert reuse.written_paths(st) == ["r/dpo"]  # inside a directory copied whole


def test_copy_in_replaces_a_directory_whole_and_sweeps_a_killed_copy(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(b"\x00" * 10)
    (src / "m.json").write_text("{}")
    dst = tmp_path / "run" / "d"
    dst.mkdir(parents=True)
    (dst / "stale.txt").write_text("old attempt")
    dead = tmp_path / "run" / ".d.tmp999999999"  # a killed copy's staging (no such pid)
    dead.mkdir()
    alive = tmp_path / "run" / f".d.tmp{os.getppid()}"  # a running one's: kept
    alive.mkdir()
    reuse.copy_in(src, dst)
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*")) == ["m.json", "sub",
                                                                        "sub/w.bin"]
    assert not dead.exists() and alive.exists()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [alive.name, "d"]
    f = tmp_path / "run" / "f.json"
    f.write_text("old")
    reuse.copy_in(src / "m.json", f)
    assert f.read_text() == "{}" and sorted(p.name for p in f.parent.iterdir()) == [
        alive.name, "d", "f.json"]
    shutil.rmtree(alive)


def test_the_lenders_are_checked(tmp_path):
    a = _lender(tmp_path)
    for bad, what in ((tmp_path / "nope", "not a popri run directory"),
                      (tmp_path, "not a popri run directory")):
        with pytest.raises(ConfigError, match=what):
            reuse.lenders_of([bad], tmp_path / "b", release=False)
    with pytest.raises(ConfigError, match="this run's own directory"):
        reuse.lenders_of([a], a, release=False)
    with pytest.raises(ConfigError, match="release mode copies no stage"):
        reuse.lenders_of([a], tmp_path / "b", release=True)
    assert reuse.lenders_of([a, a], tmp_path / "b", release=False) == [a]


# --------------------------------------------------------------------------- popri run (CLI)
from test_hostile_run import _minimal, _one_line, _popri, _run_args  # noqa: E402
from test_run_e2e import tiny_inputs  # noqa: E402,F401 (fixture)


def test_cli_refuses_a_lender_that_is_no_run_directory(tmp_path):
    p = _popri([*_run_args([f"run_dir={tmp_path / 'b'}"]), "--reuse-from", str(tmp_path),
                "--dry-run"])
    line = _one_line(p)
    assert "--reuse-from" in line and "not a popri run directory" in line, line
    assert not (tmp_path / "b").exists()


def test_a_run_that_changes_dpo_copies_what_comes_before_and_reruns_the_release(
        tiny_inputs, tiny_lm, tiny_st_model, tmp_path):
    """The study's case: run B differs from run A in one DPO setting.  Everything before the
    first DPO is copied except the DP release (score: run again, its own ledger entry, the
    same seeded bits), and prefs, whose inputs are then the same again, is copied too."""
    data, pub = tiny_inputs
    a, b = tmp_path / "a", tmp_path / "b"
    p = _popri(_run_args(_minimal(a, data, pub, tiny_lm, tiny_st_model)))
    assert p.returncode == 0, p.stderr[-3000:]
    ov = _minimal(b, data, pub, tiny_lm, tiny_st_model, "dpo.beta=0.3")
    plan = _popri([*_run_args(ov), "--reuse-from", str(a), "--dry-run"])
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert f"# copied from {a}" in plan.stdout and not b.exists()
    p = _popri([*_run_args(ov), "--reuse-from", str(a)])
    assert p.returncode == 0, p.stderr[-3000:]
    said = [ln for ln in p.stderr.splitlines() if "to copy (--reuse-from)" in ln]
    assert len(said) == 1, p.stderr[-3000:]
    marks = {m.stem: json.loads(m.read_text()) for m in (b / ".stages").glob("*.json")
             if not m.name.endswith(".attempt.json")}
    copied = {n for n, m in marks.items() if m.get("reused_from") == str(a)}
    assert {"embed-train", "round1-gen", "round1-prefs"} <= copied, sorted(copied)
    assert "round1-score" not in copied and "round1-dpo" not in copied
    assert not any("dpo" in n or "score" in n for n in copied), sorted(copied)
    res = json.loads((b / "results.json").read_text())
    assert res["run"]["stages_copied"] == len(copied)
    # the release ran here, on this run's own ledger, with the lender's seeded bits
    ledgers = sorted(b.rglob("ledger.jsonl"))
    assert ledgers and all(json.loads(x) for f in ledgers for x in f.read_text().splitlines())
    assert ((b / "round1" / "scores.npy").read_bytes()
            == (a / "round1" / "scores.npy").read_bytes())
    assert (b / "round1" / "gen_stats.json").is_file()  # an --*-out file comes with its stage
    again = _popri([*_run_args(ov)])  # no lender: every stage is this run's own, cached
    assert again.returncode == 0 and "everything is up to date" in again.stderr, \
        again.stderr[-2000:]
