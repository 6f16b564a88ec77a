"""Hostile cases of ``popri report`` (issue 37; rows R06, R07md, R21, R23, R27, R29, R32 of the
0.3.0 hostile probe): each a reproduction through a real ``popri report`` process.

    python -m pytest -q tests/test_hostile_report.py
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_one_line_error

from test_report import fake_run

pytest.importorskip("matplotlib")


def _one_line_error(p) -> str:
    """The error contract, the report's logs allowed before the line (conftest)."""
    return assert_one_line_error(p, logs=True)


def _complete_or_absent(out: Path) -> None:
    """Nothing half-written: no --out, or a whole report of popri's."""
    if out.exists():
        assert (out / ".popri-output").is_file() and (out / "report.html").is_file(), \
            sorted(x.name for x in out.iterdir())


def test_R06_results_json_of_wrong_types_is_a_note_not_a_traceback(tmp_path, run_popri):
    run = tmp_path / "bad"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({
        "methods": "x", "run": "y", "budget": 5, "control": [1], "gap_closed": "z",
        "probe": 3, "method": "popri", "epsilon": 1.0, "recovery_rate_per_round": "no"}))
    out = tmp_path / "rep6"
    p = run_popri(["report", run, "--out", out, "--json"])
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    res = json.loads(p.stdout)
    assert any("'methods' is not an object" in n for n in res["notes"])
    assert (out / "report.md").is_file() and (out / ".popri-output").is_file()


def test_R07md_report_md_escapes_html_in_every_text_cell(tmp_path, run_popri):
    run = fake_run(tmp_path / "runs", "inj", 1.0, 0.300, 3.0)
    r = json.loads((run / "results.json").read_text())
    r |= {"run_dir": "</p><script>alert(3)</script>", "generator": "<img src=x onerror=alert(4)>",
          "mode_note": "<script>alert(5)</script>"}
    (run / "results.json").write_text(json.dumps(r))
    out = tmp_path / "rep7"
    p = run_popri(["report", run, "--out", out])
    assert p.returncode == 0, p.stderr
    md = (out / "report.md").read_text(encoding="utf-8").lower()
    assert "<script" not in md and "</p>" not in md and "<img" not in md
    assert "&lt;script&gt;alert(3)" in md


def test_R21_out_dash_says_out_must_be_a_directory(tmp_path, run_popri):
    run = fake_run(tmp_path / "runs", "smoke", 1.0, 0.300, 3.0)
    err = _one_line_error(run_popri(["report", run, "--out", "-"]))
    assert "<stdin>" not in err and "--out must be a directory" in err


@pytest.mark.parametrize("names", [("r 1", "r-1"), ("ε1", "δ1")])
def test_R23_runs_whose_names_slug_alike_keep_their_own_figures(tmp_path, run_popri, names):
    a = fake_run(tmp_path / "coll", names[0], 1.0, 0.300, 3.0)
    b = fake_run(tmp_path / "coll", names[1], 4.0, 0.305, 1.0)
    out = tmp_path / "rep23"
    p = run_popri(["report", a, b, "--out", out, "--json"])
    assert p.returncode == 0, p.stderr
    figs = json.loads(p.stdout)["figures"]
    assert len(set(figs)) == len(figs), figs
    assert len(list(out.glob("*.png"))) == len(figs)
    per_run = [f for f in figs if f.endswith("-epsilon.png")]
    assert len(per_run) == 2  # one each, not one overwriting the other


def _fsize_limit(n: int):
    def pre():
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))
    return pre


def test_R27_a_write_error_leaves_nothing_half_written_and_the_rerun_works(tmp_path, run_popri):
    """A file-size limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as ENOSPC on a full
    disk) that every PNG fits under and report.html does not: the report fails at its last
    file; before issue 37 report.md and the PNGs stayed, unmarked, and the rerun was refused."""
    run = fake_run(tmp_path / "runs", "smoke", 1.0, 0.300, 3.0)
    big = tmp_path / "sizes"
    assert run_popri(["report", run, "--out", big]).returncode == 0
    pngs = max(f.stat().st_size for f in big.glob("*.png"))
    page = (big / "report.html").stat().st_size
    assert page > pngs + 4096
    out = tmp_path / "rep27"
    env = dict(os.environ, POPRI_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "popri.cli.app", "report", str(run), "--out",
                        str(out)], capture_output=True, text=True, env=env, timeout=600,
                       preexec_fn=_fsize_limit((pngs + page) // 2))
    err = _one_line_error(p)
    assert "cannot write" in err and "report" in err
    _complete_or_absent(out)
    assert not list(tmp_path.glob(".rep27.*"))  # no staging directory left either
    p = run_popri(["report", run, "--out", out])  # space freed: the rerun works
    assert p.returncode == 0, p.stderr
    assert (out / "report.html").is_file() and (out / ".popri-output").is_file()


def _can_mount() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("mount") is not None


def test_R27_full_tmpfs_then_freed(tmp_path, run_popri):
    """The probe's own case on a real small file system (root and mount only)."""
    if not _can_mount():
        pytest.skip("needs root and mount")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("mount -t tmpfs refused here")
    try:
        run = fake_run(tmp_path / "runs", "smoke", 1.0, 0.300, 3.0)
        filler = disk / "filler"
        filler.write_bytes(b"\0" * (4 * 1024 * 1024 - 300 * 1024))
        out = disk / "rep"
        err = _one_line_error(run_popri(["report", run, "--out", out]))
        assert "No space left on device" in err
        _complete_or_absent(out)
        filler.unlink()
        p = run_popri(["report", run, "--out", out])
        assert p.returncode == 0, p.stderr
        assert (out / ".popri-output").is_file()
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_R29_a_torn_ledger_line_never_drops_the_whole_round(tmp_path, run_popri):
    from popri.privacy.accounting import compose
    from popri.privacy.ledger import read_ledger

    run = fake_run(tmp_path / "runs", "ledbad", 1.0, 0.300, 3.0)
    e1 = read_ledger(run / "round1" / "ledger.jsonl")
    e2 = read_ledger(run / "round2" / "ledger.jsonl")
    with open(run / "round2" / "ledger.jsonl", "a") as fh:
        fh.write('{"stage": "score", "mechan\n')  # a torn line, then a newline
    spent = compose(e1 + e2, 3e-6, "rdp").epsilon
    p = run_popri(["report", run, "--out", tmp_path / "rep29", "--json"])
    assert p.returncode == 0, p.stderr
    md = (tmp_path / "rep29" / "report.md").read_text()
    assert f"after round 2: {spent:.4f}" in md  # round 2's valid entry counted
    res = json.loads(p.stdout)
    assert res["epsilon"]["ledbad"]["epsilon"][-1] == pytest.approx(spent)  # and drawn
    assert any("malformed line" in n for n in res["notes"])


def test_R32_sigterm_mid_figures_leaves_nothing_half_written(tmp_path, run_popri):
    runs = [fake_run(tmp_path / "runs", f"r{i}", 1.0 + i, 0.300, 3.0 - 0.5 * i) for i in range(4)]
    out = tmp_path / "rep32"
    env = dict(os.environ, POPRI_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "popri.cli.app", "report", *map(str, runs),
                             "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if any(tmp_path.glob("rep32/*.png")) or any(tmp_path.glob(".rep32.tmp*/*.png")):
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the report ended before a figure was seen"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode in (143, -signal.SIGTERM)
    _complete_or_absent(out)
    p = run_popri(["report", *runs, "--out", out])  # the rerun works
    assert p.returncode == 0, p.stderr
    assert (out / ".popri-output").is_file()
    assert not list(tmp_path.glob(".rep32.*"))
