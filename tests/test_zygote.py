"""The stage zygote (popri/cli/zygote.py, popri/pipeline/zygote.py): a stage forked from it is the
process `python -P -m popri ARGS` would have been -- same outputs byte for byte, stdout, stderr,
exit status, working directory, environment -- and it dies with the zygote, which dies with
`popri run`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import write_jsonl

from popri.pipeline import zygote as Z
from popri.pipeline.stages import child_argv

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

TEXTS = ["The budget of the nation must be balanced.", "Our navy protects commerce on every sea.",
         "I recommend a revision of the tariff.", "Education is the foundation of freedom.",
         "The post office has extended its service.", "The treaties have been kept."]


def _env(**kw) -> dict:
    e = dict(os.environ, POPRI_THREADS="1")
    e.update(kw)
    return e


@pytest.fixture(scope="module")
def zyg():
    z = Z.Zygote(_env())
    yield z
    z.close()


def _spawn(z, args, tmp_path, env=None):
    out = tmp_path / f"stdout-{time.monotonic_ns()}"
    with open(out, "wb") as fh:
        p = z.spawn([str(a) for a in args], env=env or z.env, stdout_fd=fh.fileno())
    err = p.stderr.read()
    rc = p.wait(timeout=300)
    return rc, out.read_bytes(), err.decode()


def _proc(args, tmp_path, env=None):
    p = subprocess.run(child_argv([str(a) for a in args]), capture_output=True, env=env or _env(),
                       timeout=300)
    return p.returncode, p.stdout, p.stderr.decode()


def test_a_forked_stage_writes_what_a_new_process_writes(zyg, tmp_path, tiny_lm, tiny_st_model):
    """gen (tiny Llama, seeded per row), embed and score: the same bytes either way."""
    omega = write_jsonl(tmp_path / "omega.jsonl", [{"id": f"o{i}", "text": t,
                                                    "client_id": f"c{i % 3}"}
                                                   for i, t in enumerate(TEXTS)])
    for how, run in (("z", lambda a: _spawn(zyg, a, tmp_path)),
                     ("p", lambda a: _proc(a, tmp_path))):
        d = tmp_path / how
        d.mkdir()
        rc, _, err = run(["gen", omega, "-K", 2, "-J", 2, "--model", tiny_lm,
                          "--max-new-tokens", 8, "--min-words", 0, "--seed", 3,
                          "--out", d / "s.jsonl"])
        assert rc == 0, err
        rc, _, err = run(["embed", omega, "--out", d / "e.npy", "--model", tiny_st_model])
        assert rc == 0, err
        rc, _, err = run(["score", "--synthetic", d / "s.jsonl", "--private", d / "e.npy",
                          "--out", d / "sc.npy", "--model", tiny_st_model, "--seed", 1,
                          "--noise-multiplier", 0.5])
        assert rc == 0, err
    for f in ("s.jsonl", "e.npy", "sc.npy"):
        assert (tmp_path / "z" / f).read_bytes() == (tmp_path / "p" / f).read_bytes(), f


def test_stdout_stderr_exit_status_cwd_and_environment(zyg, tmp_path, tiny_st_model):
    rc, out, err = _spawn(zyg, ["--version"], tmp_path)
    assert rc == 0 and out.decode().startswith("popri ") and err == ""
    # a missing input: one line naming it, exit 2 -- as from a new process
    z = _spawn(zyg, ["account", "ledger", tmp_path / "nowhere"], tmp_path)
    p = _proc(["account", "ledger", tmp_path / "nowhere"], tmp_path)
    assert z[0] == p[0] == 2 and z[2] == p[2] and "nowhere" in z[2]
    # the working directory is the caller's at spawn time; the environment the one given
    sub = tmp_path / "sub"
    sub.mkdir()
    write_jsonl(sub / "omega.jsonl", [{"id": str(i), "text": t} for i, t in enumerate(TEXTS)])
    here = os.getcwd()
    try:
        os.chdir(sub)
        rc, out, err = _spawn(zyg, ["embed", "omega.jsonl", "--out", "e.npy", "--model",
                                    tiny_st_model], tmp_path)
    finally:
        os.chdir(here)
    assert rc == 0, err
    assert (sub / "e.npy").is_file() and "6 x 32" in err
    rc, _, err = _spawn(zyg, ["--version"], tmp_path, env=dict(zyg.env, POPRI_RELEASE="maybe"))
    assert rc == 2 and "POPRI_RELEASE" in err
    assert not zyg.usable_for(dict(zyg.env, POPRI_RELEASE="1"))
    assert zyg.usable_for(dict(zyg.env, POPRI_DIE_WITH="1"))


def test_a_killed_stage_and_a_killed_zygote(tmp_path, tiny_lm):
    """kill() is SIGKILL (-9, as Popen); the zygote's death takes its stage with it."""
    omega = write_jsonl(tmp_path / "omega.jsonl", [{"id": f"o{i}", "text": t}
                                                   for i, t in enumerate(TEXTS)])
    long_gen = ["gen", omega, "-K", 6, "-J", 50, "--model", tiny_lm, "--max-new-tokens", 200,
                "--min-words", 0, "--out", tmp_path / "s.jsonl"]
    z = Z.Zygote(_env())
    try:
        with open(os.devnull, "wb") as dn:
            p = z.spawn([str(a) for a in long_gen], env=z.env, stdout_fd=dn.fileno())
        time.sleep(1.0)
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=0.1)
        p.kill()
        assert p.wait(timeout=30) == -signal.SIGKILL
        with open(os.devnull, "wb") as dn:
            p = z.spawn([str(a) for a in long_gen], env=z.env, stdout_fd=dn.fileno())
        time.sleep(1.0)
        os.kill(z.proc.pid, signal.SIGKILL)
        assert p.wait(timeout=30) == -signal.SIGTERM
        t0 = time.time()
        while time.time() - t0 < 10:
            try:
                os.kill(p.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the stage outlived its zygote")
        assert not (tmp_path / "s.jsonl").exists()
    finally:
        z.close()


def test_it_can_be_turned_off_and_a_broken_one_is_not_used(monkeypatch):
    assert not Z.enabled({"POPRI_ZYGOTE": "0"}) and not Z.enabled({"POPRI_ZYGOTE": "off"})
    assert Z.enabled({}) == sys.platform.startswith("linux")
    # an interpreter that cannot start the zygote: one error, no hang
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(Z.ZygoteError):
        Z.Zygote(_env(), timeout=30)
