"""popri's vLLM engines put vLLM's ZMQ socket files in a private directory removed at exit
(popri.models.backends.private_ipc_dir), not in /tmp for good; the real engine's check is in
tests/test_vllm_real.py.

    python -m pytest -q tests/test_vllm_ipc.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import os, sys
from popri.models.backends import private_ipc_dir
d = private_ipc_dir(sys.argv[1] if len(sys.argv) > 1 else None)
print(d)
print(os.environ.get("VLLM_RPC_BASE_PATH"))
open(os.path.join(d, "sock"), "w").close() if d else None
if os.environ.get("FORK") and os.fork() == 0:
    sys.exit(0)  # a fork exits (its atexit runs): the parent's directory stays
if os.environ.get("FORK"):
    os.wait()
    print(os.path.isdir(d))
"""


def _child(*args, **env) -> list[str]:
    e = {k: v for k, v in os.environ.items() if k != "VLLM_RPC_BASE_PATH"}
    p = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True,
                       env={**e, **env}, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_the_private_directory_is_vllms_and_removed_at_exit_not_by_a_fork():
    base = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))  # short: a socket path fits under it
    try:
        d, said, alive = _child(str(base), FORK="1")
        assert said == d and Path(d).parent == base and Path(d).name.startswith("pv")
        assert alive == "True" and not Path(d).exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_base_too_long_for_a_socket_path_falls_back_to_tmp(tmp_path):
    deep = tmp_path / ("x" * 60)
    deep.mkdir()
    d, said = _child(str(deep))
    assert said == d and Path(d).parent == Path("/tmp") and not Path(d).exists()
    assert len(d) + 1 + 36 <= 107


def test_the_users_own_setting_is_kept(tmp_path):
    d, said = _child(str(tmp_path), VLLM_RPC_BASE_PATH=str(tmp_path / "mine"))
    assert d == "None" and said == str(tmp_path / "mine")


def test_inprocess_asks_vllm_for_no_engine_processes_and_keeps_the_users_setting(monkeypatch):
    """POPRI_VLLM_INPROCESS=1: the engine is built with VLLM_ENABLE_V1_MULTIPROCESSING=0 in
    the environment vLLM reads at its start (the engine core and worker in popri's process); a
    value the user set is kept; unset, nothing is asked.  A stand-in LLM records what it saw
    (the real engine's samples in both modes: tests/test_vllm_real.py)."""
    from popri.models import backends

    seen = []

    class LLM:
        def __init__(self, **kw):
            seen.append((os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"), kw))

    monkeypatch.setattr(backends, "import_vllm", lambda: (LLM, object))
    monkeypatch.setattr(backends.llm, "resolve", lambda m: m)
    monkeypatch.setattr(backends, "private_ipc_dir", lambda: None)

    def build(**env):
        monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
        monkeypatch.delenv("POPRI_VLLM_INPROCESS", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        backends.VllmBackend("m", None, bf16=False, params={}, seed=0, marker="x")
        return seen[-1][0]

    assert build() is None
    assert build(POPRI_VLLM_INPROCESS="0") is None
    assert build(POPRI_VLLM_INPROCESS="1") == "0"
    assert build(POPRI_VLLM_INPROCESS="yes", VLLM_ENABLE_V1_MULTIPROCESSING="1") == "1"
