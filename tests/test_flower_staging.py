"""A Flower round's job directory holds the clients' private data (embeddings, texts): it is
private (0700), removed on every exit path, and swept by the next round after a SIGKILL
(issue 22, cases fw05-06, fw20, fw30).

    python -m pytest -q tests/test_flower_staging.py     # needs the flower extra
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import emb_set, write_jsonl

pytestmark = pytest.mark.skipif(__import__("importlib").util.find_spec("flwr") is None,
                                reason="the flower extra is not installed")


def _private_left(root: Path) -> list[str]:
    """Anything of a Flower job left under ``root``: job directories, node files."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name.startswith(".popri-flower-") and p.is_dir()
                  or p.name.startswith("node-"))


@pytest.fixture
def fed(tmp_path):
    rng = np.random.default_rng(0)
    cid = [f"c{i % 12}" for i in range(48)]
    emb_set(tmp_path / "priv.npy", rng.normal(size=(48, 8)).astype(np.float32), cid)
    emb_set(tmp_path / "syn.npy", rng.normal(size=(10, 8)).astype(np.float32))
    return tmp_path


def _popen(args, **env):
    e = dict(os.environ, POPRI_THREADS="2", **env)
    return subprocess.Popen([sys.executable, "-m", "popri.cli.app", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)


def _wait_for_job(where: Path, proc, timeout=120.0) -> Path:
    t0 = time.time()
    while time.time() - t0 < timeout:
        jobs = [d for d in where.glob(".popri-flower-*") if d.is_dir()
                and any(d.glob("node-*"))]
        if jobs:
            return jobs[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError("no Flower job directory appeared")


def _score_args(fed, out, *more):
    return ["score", "--engine", "flower", "--supernodes", "3", "--private", fed / "priv.npy",
            "--synthetic", fed / "syn.npy", "-z", "1", "-L", "9", "--out", out, *more]


def test_fw05_06_sigterm_leaves_no_private_data_and_the_job_is_private(fed):
    out = fed / "term" / "scores.npy"
    out.parent.mkdir()
    p = _popen(_score_args(fed, out))
    job = _wait_for_job(out.parent, p)
    assert job.stat().st_mode & 0o077 == 0  # only the owner can read the clients' data
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err
    assert _private_left(fed / "term") == [] and not out.exists()


def test_fw20_a_timeout_keeps_only_the_log(fed):
    out = fed / "o20" / "scores.npy"
    p = subprocess.run([sys.executable, "-m", "popri.cli.app",
                        *map(str, _score_args(fed, out, "--flower-timeout", "3"))],
                       capture_output=True, text=True, env=dict(os.environ, POPRI_THREADS="2"))
    assert p.returncode == 1 and "--flower-timeout" in p.stderr, p.stderr
    assert _private_left(fed / "o20") == []
    logs = list((fed / "o20").glob(".popri-flower-*.log"))
    assert len(logs) == 1 and str(logs[0]) in p.stderr


def test_fw30_sigterm_of_an_fl_round_on_flower_leaves_no_texts(tiny_lm, tmp_path):
    data = write_jsonl(tmp_path / "data.jsonl", [
        {"client_id": f"c{i % 6}", "text": f"a private sentence number {i}"} for i in range(24)])
    out = tmp_path / "FT" / "round1"
    p = _popen(["fl", "round", "--data", data, "--model", tiny_lm, "--round", "1", "-z", "1",
                "-L", "6", "--engine", "flower", "--supernodes", "3", "--no-bf16", "--out", out])
    _wait_for_job(tmp_path / "FT", p)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err
    assert _private_left(tmp_path / "FT") == [] and not out.exists()


def test_a_sigkilled_rounds_job_is_swept_by_the_next_round(fed):
    out = fed / "kill" / "scores.npy"
    out.parent.mkdir()
    p = _popen(_score_args(fed, out))
    _wait_for_job(out.parent, p)
    p.kill()
    p.communicate(timeout=60)
    assert _private_left(fed / "kill")  # SIGKILL cannot clean up ...
    r = subprocess.run([sys.executable, "-m", "popri.cli.app",
                        *map(str, _score_args(fed, out))], capture_output=True, text=True,
                       env=dict(os.environ, POPRI_THREADS="2"))
    assert r.returncode == 0, r.stderr
    assert _private_left(fed / "kill") == []  # ... the next round there removes it
