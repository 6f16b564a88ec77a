"""The one rule for directory outputs (popri/core/outdir.py): what may be replaced, and a
replace that a kill at any point leaves with the old output or the new one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from popri.core import outdir
from popri.core.errors import InputError


def _ours(d: Path, payload: str = "old") -> Path:
    d.mkdir(parents=True)
    (d / "x.txt").write_text(payload)
    outdir.mark(d, "test")
    return d


def test_missing_and_empty_outputs_are_fine(tmp_path):
    outdir.check(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    outdir.check(tmp_path / "empty")


@pytest.mark.parametrize("name", ["-", ""])
def test_stdout_is_not_a_directory_name(name):
    with pytest.raises(InputError, match="not a directory name"):
        outdir.check(name)


def test_a_file_a_device_and_a_link_are_refused(tmp_path):
    f = tmp_path / "afile"
    f.write_text("thesis")
    with pytest.raises(InputError, match="not a directory"):
        outdir.check(f)
    with pytest.raises(InputError, match="not a directory"):
        outdir.check("/dev/null")
    link = tmp_path / "link"
    link.symlink_to(_ours(tmp_path / "real"))
    with pytest.raises(InputError, match="symbolic link"):
        outdir.check(link)
    assert f.read_text() == "thesis"


def test_a_foreign_non_empty_directory_is_refused_unless_forced(tmp_path):
    d = tmp_path / "precious"
    d.mkdir()
    (d / "thesis.txt").write_text("years of work")
    with pytest.raises(InputError, match="not written by popri"):
        outdir.check(d)
    outdir.check(d, force=True)
    # the replace itself re-checks: a caller that skipped check() deletes nothing either
    src = outdir.staging_dir(d)
    with pytest.raises(InputError, match="not written by popri"):
        outdir.replace(src, d, kind="test")
    assert (d / "thesis.txt").read_text() == "years of work"


def test_legacy_outputs_are_recognised_by_their_files(tmp_path):
    d = tmp_path / "round1"
    d.mkdir()
    for f in ("theta.npy", "round.json"):
        (d / f).write_text("x")
    outdir.check(d, legacy=("theta.npy", "round.json"))
    with pytest.raises(InputError):
        outdir.check(d, legacy=("theta.npy", "server.npz"))


def test_an_output_holding_an_input_or_a_ledger_is_refused(tmp_path):
    d = _ours(tmp_path / "d")
    (d / "data.jsonl").write_text("{}\n")
    with pytest.raises(InputError, match="would overwrite input"):
        outdir.check(d, inputs=[d / "data.jsonl"])
    with pytest.raises(InputError, match="would overwrite input"):
        outdir.check(tmp_path, inputs=[d / "data.jsonl"])
    (d / "sub").mkdir()
    (d / "sub" / "ledger.jsonl").write_text("")
    with pytest.raises(InputError, match="privacy ledger"):
        outdir.check(d)
    # a directory a command writes into (claim) may hold a ledger: nothing is replaced
    outdir.check(d, whole=False)


@pytest.mark.parametrize("exchange", [True, False])
def test_replace_swaps_in_the_new_output(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setenv("POPRI_NO_EXCHANGE", "1")
    d = _ours(tmp_path / "out")
    src = outdir.staging_dir(d)
    (src / "x.txt").write_text("new")
    outdir.replace(src, d, kind="test")
    assert (d / "x.txt").read_text() == "new" and (d / outdir.MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


_KILLED = textwrap.dedent("""
    import sys
    from popri.core import outdir
    d = sys.argv[1]
    src = outdir.staging_dir(d)
    (src / "x.txt").write_text("new")
    outdir.replace(src, d, kind="test")
""")


@pytest.mark.parametrize("point,env", [("kill-after-exchange", {}),
                                       ("kill-between-renames", {"POPRI_NO_EXCHANGE": "1"})])
def test_a_kill_inside_replace_leaves_old_or_new_and_a_rerun_repairs(tmp_path, point, env):
    d = _ours(tmp_path / "out")
    e = dict(os.environ, POPRI_FAULT=point, **env)
    p = subprocess.run([sys.executable, "-c", _KILLED, str(d)], env=e)
    assert p.returncode == -9
    left = sorted(x.name for x in tmp_path.iterdir())
    assert len(left) == 2  # the output (or its moved-aside copy) and the staging directory
    outdir.check(d)  # the next command's check sweeps: the old output back, or the new one
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out"]
    assert (d / "x.txt").read_text() in ("old", "new")
    if point == "kill-between-renames":
        assert (d / "x.txt").read_text() == "old"  # moved back into place
    else:
        assert (d / "x.txt").read_text() == "new"  # the swap had happened


def test_claim_marks_a_working_directory_and_refuses_a_foreign_one(tmp_path):
    d = outdir.claim(tmp_path / "train", kind="dpo")
    assert (d / outdir.MARKER).is_file()
    (d / "checkpoint-1").mkdir()
    outdir.claim(d, kind="dpo")  # ours: fine again
    f = tmp_path / "mine"
    f.mkdir()
    (f / "checkpoint-7").mkdir()  # a user's directory that merely looks like a run
    with pytest.raises(InputError, match="not written by popri"):
        outdir.claim(f, kind="dpo")
