"""scripts/wheelhouse.sh: the air-gapped install (issue 38; docs/gpu.md).

    python -m pytest -q tests/test_wheelhouse.py              # the parts' logic (seconds)
    python -m pytest -q -m slow tests/test_wheelhouse.py      # build here, install offline (minutes)

Fast: packing wheels into parts of at most PART_BYTES with SHA-256 sums, a missing or damaged
part refused in one line (exit 2), joining back to the same bytes, the same parts from the same
wheels.  Slow: the wheelhouse of this machine built from the package index, then popri installed
from it alone (``pip install --no-index``) into a fresh venv, which runs ``popri --version`` and
one tiny command.
"""

import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "wheelhouse.sh"
NAME = "popri-wheelhouse.tar"


def wh(*args, env=None, cwd=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=e, cwd=cwd, timeout=1800)


@pytest.fixture
def wheels(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = __import__("random").Random(0)
    for i, n in enumerate((70_000, 140_000, 210_000)):
        (src / f"pkg{i}-0.1-py3-none-any.whl").write_bytes(rng.randbytes(n))
    return src


def test_pack_splits_into_checked_parts_and_joins_to_the_same_bytes(wheels, tmp_path):
    out = tmp_path / "out"
    p = wh("pack", wheels, out, env={"PART_BYTES": "100000"})
    assert p.returncode == 0, p.stderr
    parts = sorted(out.glob(f"{NAME}.*"))
    assert [x.name[-3:] for x in parts] == ["000", "001", "002", "003", "004"]
    assert all(x.stat().st_size <= 100_000 for x in parts)
    sums = dict(reversed(line.split()) for line in (out / "SHA256SUMS").read_text().splitlines())
    for x in parts:
        assert sums[x.name] == hashlib.sha256(x.read_bytes()).hexdigest()
    whole = b"".join(x.read_bytes() for x in parts)
    assert sums[NAME] == hashlib.sha256(whole).hexdigest()
    man = (out / "MANIFEST.txt").read_text()
    assert "3 wheels" in man and "5 parts of <= 100000 bytes" in man and "pkg2-0.1" in man
    assert wh("check", out).returncode == 0
    j = wh("join", out)
    assert j.returncode == 0, j.stderr
    for w in wheels.iterdir():
        assert (out / "wheels" / w.name).read_bytes() == w.read_bytes()
    assert not list(out.glob(".join*")) and not list(out.glob(".pack*"))  # no leftovers
    # the same wheels give the same parts (a rebuilt wheelhouse can be checked part by part)
    again = tmp_path / "again"
    assert wh("pack", wheels, again, env={"PART_BYTES": "100000"}).returncode == 0
    assert (again / "SHA256SUMS").read_text() == (out / "SHA256SUMS").read_text()


def test_a_missing_or_damaged_part_is_one_line_and_exit_2(wheels, tmp_path):
    out = tmp_path / "out"
    assert wh("pack", wheels, out, env={"PART_BYTES": "100000"}).returncode == 0
    part = out / f"{NAME}.002"
    keep = part.read_bytes()
    part.unlink()
    for cmd in ("check", "join", "install"):
        p = wh(cmd, out)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, (cmd, p.stderr)
        assert "4 of 5 parts present (carry the missing ones)" in p.stderr
    part.write_bytes(keep[:-1] + bytes([keep[-1] ^ 1]))
    p = wh("join", out)
    assert p.returncode == 2 and "SHA-256 differs" in p.stderr and p.stderr.count("\n") == 1
    assert not (out / "wheels").exists() or not list((out / "wheels").iterdir())
    p = wh("check", tmp_path)
    assert p.returncode == 2 and "no SHA256SUMS" in p.stderr
    p = wh("frobnicate")
    assert p.returncode == 2 and p.stderr.startswith("wheelhouse: usage:")


def test_an_output_that_is_a_file_or_an_input_that_is_missing_is_one_line(wheels, tmp_path):
    """hostile-0.4 N12, N13: an OUT that is a file or cannot be made, a wheelhouse folder that
    does not exist: exit 2 and one `wheelhouse:` line (before: exit 1 with mkdir's own line, or
    bash's `cd:` error before the line); nothing written."""
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    for args, needle in ((("build", afile), f"{afile}: exists and is not a folder"),
                         (("pack", wheels, afile), f"{afile}: exists and is not a folder"),
                         (("build", "/dev/null/x"), "cannot create the folder /dev/null/x"),
                         (("join", tmp_path / "nonexist"), "no such folder"),
                         (("install", tmp_path / "nonexist"), "no such folder")):
        p = wh(*args, cwd=tmp_path)
        assert p.returncode == 2 and p.stdout == "", (args, p.stderr)
        assert p.stderr.count("\n") == 1 and p.stderr.startswith("wheelhouse: "), (args, p.stderr)
        assert needle in p.stderr, (args, p.stderr)
    assert afile.read_text() == "x\n" and not (tmp_path / "nonexist").exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["afile", "src"]


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (left out of CI)
def test_build_here_and_install_popri_offline_into_a_fresh_venv(tmp_path):
    """The whole air-gapped path on this machine: build (the package index), then a fresh venv
    that installs from the parts alone and runs popri."""
    out = tmp_path / "wh"
    b = wh("build", out, env={"TMPDIR": str(tmp_path)})
    assert b.returncode == 0, b.stderr[-3000:]
    parts = sorted(out.glob(f"{NAME}.*"))
    assert parts and all(x.stat().st_size <= 60_000_000 for x in parts)
    there = tmp_path / "there"  # what travels: the parts and the sums, nothing else
    there.mkdir()
    for x in [*parts, out / "SHA256SUMS", out / "MANIFEST.txt"]:
        shutil.copy(x, there)
    venv = tmp_path / "venv"
    env = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": "",
           "PIP_EXTRA_INDEX_URL": "", "PIP_CONFIG_FILE": os.devnull, "PYTHON": sys.executable}
    i = wh("install", there, "--venv", venv, env=env)
    assert i.returncode == 0, i.stderr[-3000:]
    py = venv / "bin" / "python"
    e = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    v = subprocess.run([str(py), "-m", "popri.cli.app", "--version"], capture_output=True,
                       text=True, cwd=tmp_path, env=e, timeout=300)
    assert v.returncode == 0 and "popri" in v.stdout.lower() + v.stderr.lower(), v.stderr
    loc = subprocess.run([str(py), "-c", "import popri; print(popri.__file__)"], capture_output=True,
                         text=True, cwd=tmp_path, env=e, timeout=300)
    assert str(venv) in loc.stdout  # the installed wheel, not this checkout
    t = subprocess.run([str(venv / "bin" / "popri"), "bench", "fetch", "sotu", "--out",
                        str(tmp_path / "sotu"), "--max-clients", "3", "--max-samples-per-client",
                        "2", "--seed", "0"], capture_output=True, text=True, cwd=tmp_path,
                       env={**e, "POPRI_THREADS": "1", "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert t.returncode == 0, t.stderr[-2000:]
    assert (tmp_path / "sotu" / "manifest.json").is_file()
    shutil.rmtree(venv)
