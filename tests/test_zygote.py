"""The stage zygote (popri/cli/zygote.py, popri/pipeline/zygote.py): a stage forked from it is the
process `python -P -m popri ARGS` would have been -- same outputs byte for byte, stdout, stderr,
exit status, working directory, environment -- and it dies with the zygote, which dies with
`popri run`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import write_jsonl

from popri.kit import Stage
from popri.pipeline import zygote as Z
from popri.pipeline.stages import StageRunner, child_argv
from popri.specs.commands.account import AccountEpsilonCall

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
    assert zyg.usable_for(dict(zyg.env, POPRI_RELEASE="1"))  # read when the command runs
    assert not zyg.usable_for(dict(zyg.env, OMP_NUM_THREADS="1"))  # read by the imports
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


# --- Zygote.run: subprocess.run for popri commands (the test suite's own CLI calls) ---------

def test_run_is_subprocess_run_input_exit_streams_and_cwd(zyg, tmp_path):
    """Input larger than a pipe's buffer (1.7 MB), a bad last line: the same exit 2, the same one
    line naming <stdin> and the line, nothing on stdout -- forked and as a new process."""
    import json

    rows = [json.dumps({"id": f"r{i}", "text": "x" * 60}) for i in range(20000)] + ["not json"]
    data = ("\n".join(rows) + "\n").encode()
    args = ["embed", "-", "-o", "e.npy"]
    p = zyg.run(args, env=zyg.env, cwd=tmp_path, input=data, timeout=300)
    q = subprocess.run(child_argv(args), input=data, capture_output=True, env=zyg.env,
                       cwd=tmp_path, timeout=300)
    assert (p.returncode, p.stdout, p.stderr) == (q.returncode, q.stdout, q.stderr)
    assert p.returncode == 2 and b"<stdin>:20001" in p.stderr, p.stderr
    assert not (tmp_path / "e.npy").exists()
    ok = zyg.run(["--version"], env=zyg.env, timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip().startswith(b"popri")


def test_run_timeout_kills_the_command_and_the_zygote_serves_the_next(zyg, tmp_path):
    """A timeout shorter than a fork takes: TimeoutExpired, the child killed and reaped, and the
    zygote free for the next call."""
    t = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        zyg.run(["embed", "-", "-o", str(tmp_path / "e.npy")], env=zyg.env,
                input=b'{"id": "a", "text": "b"}\n' * 1000, timeout=0.0001)
    assert time.monotonic() - t < 60
    assert not zyg.busy and zyg.usable_for(zyg.env)
    assert not (tmp_path / "e.npy").exists()
    assert zyg.run(["--version"], env=zyg.env, timeout=60).returncode == 0


def test_compatible_lets_only_unread_variables_differ(tmp_path):
    """The rule that decides whether a fork is the process an environment would start."""
    h1, h2 = tmp_path / "h1", tmp_path / "h2"
    h1.mkdir(), h2.mkdir()
    z = {"PATH": "/usr/bin", "HOME": str(h1), "HF_HOME": "/hf", "POPRI_THREADS": "1"}
    assert Z.compatible(dict(z), z)
    assert Z.compatible(dict(z, POPRI_RELEASE="1", POPRI_THREADS="2",
                             PYTEST_CURRENT_TEST="t"), z)
    assert Z.compatible(dict(z, HOME=str(h2), XDG_CACHE_HOME=str(h2 / ".cache")), z)
    for bad in ({"PATH": "/bin"}, {"OMP_NUM_THREADS": "1"}, {"HF_HOME": "/other"},
                {"PYTHONPATH": "/x"}, {"POPRI_ZYGOTE": "0"}, {"TMPDIR": "/t"}):
        assert not Z.compatible(dict(z, **bad), z), bad
    # HOME may differ only while HF_HOME pins the hub caches ...
    no_hf = {k: v for k, v in z.items() if k != "HF_HOME"}
    assert not Z.compatible(dict(no_hf, HOME=str(h2)), no_hf)
    # ... and neither home holds what an import reads (user site-packages, fsspec's config)
    (h2 / ".local" / "lib").mkdir(parents=True)
    assert not Z.compatible(dict(z, HOME=str(h2)), z)
    (h1 / ".config" / "fsspec").mkdir(parents=True)
    assert not Z.compatible(dict(z, HOME=str(h1), XDG_CACHE_HOME="/c"), dict(z, HOME=str(h1)))
    # what the zygote's own imports set, at the value they set it to
    added = {"KMP_DUPLICATE_LIB_OK": "True"}
    assert Z.compatible(dict(z, KMP_DUPLICATE_LIB_OK="True"), z, added)
    assert not Z.compatible(dict(z, KMP_DUPLICATE_LIB_OK="False"), z, added)
    assert not Z.compatible(dict(z, KMP_DUPLICATE_LIB_OK="True"), z)


AUDIT = r'''
import importlib, os, pkgutil, sys, types
import popri
from popri.pipeline.zygote_server import PRELOAD
for n in PRELOAD:
    try:
        importlib.import_module(n)
    except ImportError:
        pass
for m in pkgutil.walk_packages(popri.__path__, "popri."):
    if ".gpu" in m.name or m.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(m.name)
    except ImportError:
        pass
MARK, NUMS = "zzprobe", (7.123456, 777777, 9876)
hits = set()
def scan(v, where, depth=0):
    if type(v) in (int, float) and v in NUMS:
        hits.add(where)
    elif isinstance(v, (str, os.PathLike)):
        if MARK in os.fspath(v):
            hits.add(where)
    elif depth < 2 and type(v) in (list, tuple, set, frozenset):
        for x in list(v)[:1000]:
            scan(x, where, depth + 1)
    elif depth < 2 and type(v) is dict:
        for k, x in list(v.items())[:5000]:
            scan(k, where, depth + 1)
            scan(x, where, depth + 1)
    elif (depth < 1 and str(getattr(type(v), "__module__", "")).split(".")[0] in
          ("popri", "rich", "torch", "transformers", "huggingface_hub", "sentence_transformers",
           "peft", "trl", "numpy", "tqdm", "datasets", "fsspec")
          and isinstance(getattr(v, "__dict__", None), dict)):
        for x in list(vars(v).values())[:200]:
            scan(x, where, depth + 1)
for name, m in list(sys.modules.items()):
    if name in ("__main__", "__mp_main__") or not isinstance(getattr(m, "__dict__", None), dict):
        continue
    for k, v in list(m.__dict__.items()):
        if (name, k) in (("sys", "orig_argv"), ("sys", "argv")):
            continue
        scan(v, f"{name}.{k}")
print("\n".join(sorted(hits)))
'''

#: where the zygote's imports keep a value derived from HOME / XDG_*, and why a fork with
#: another HOME is still the process it would start (popri.pipeline.zygote._homes_free)
HOME_DERIVED = {
    "site.USER_SITE": "user site-packages: _homes_free requires ~/.local/lib absent",
    "site.USER_BASE": "the same",
    "sysconfig._CONFIG_VARS": "userbase, the same",
    "huggingface_hub.constants.default_home": "unused when HF_HOME is set (required)",
    "fsspec.config.default_conf_dir": "_homes_free requires ~/.config/fsspec absent",
    "fsspec.config.conf_dir": "the same",
    "datasets.config.XDG_CACHE_HOME": "only the default of HF_HOME (required)",
    "datasets.config.DEFAULT_HF_CACHE_HOME": "the same",
    # transformers at its lowest admitted version (test-min): defined there, read by nothing
    "transformers.utils.hub.torch_cache_home": "a module constant no code of transformers reads",
}


def test_the_preloaded_imports_keep_no_variable_a_fork_may_change(tmp_path):
    """After the zygote's imports and every popri module's, no module-level value holds what
    HOME, XDG_* or a POPRI_* setting said -- but the ones HOME_DERIVED lists and accounts for.
    A library that starts reading one at import fails this test (then: not free)."""
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), PYTHONWARNINGS="ignore")
    env.update({k: f"/tmp/zzprobe-{k.lower()}" for k in Z.HOME_ENV})
    for k in ("POPRI_CACHE", "POPRI_QUIET", "POPRI_RELEASE", "POPRI_EMBED_MODEL",
              "POPRI_GEN_MODEL", "POPRI_CONFIG", "POPRI_FAULT", "POPRI_CPU_BF16",
              "POPRI_PROGRESS", "POPRI_VLLM_KV_GIB", "POPRI_FLOWER_JOB", "POPRI_TEST_TAG"):
        env[k] = "zzprobe"
    env.update(POPRI_HEARTBEAT="7.123456", POPRI_MAX_LINE_BYTES="777777", POPRI_THREADS="9876",
               POPRI_OPENAI_RETRIES="9876", PYTEST_CURRENT_TEST="zzprobe")
    p = subprocess.run([sys.executable, "-P", "-c", AUDIT], capture_output=True, text=True,
                       env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    hits = {h for h in p.stdout.split() if h}
    assert hits <= set(HOME_DERIVED), sorted(hits - set(HOME_DERIVED))


def test_no_popri_module_reads_the_environment_at_import():
    """Module-level code never reads os.environ / os.getenv (a fork from the zygote imported it
    under another environment): read it when a command runs."""
    import ast
    from pathlib import Path

    bad = []
    for f in sorted(Path(Z.__file__).resolve().parents[1].rglob("*.py")):
        tree = ast.parse(f.read_text(), str(f))
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                nodes = [d for d in getattr(stmt, "decorator_list", [])]
                nodes += [a for a in ast.walk(stmt.args)] if hasattr(stmt, "args") else []
                if isinstance(stmt, ast.ClassDef):  # a class body runs at import
                    nodes += [n for s in stmt.body if not isinstance(
                        s, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(s)]
            elif isinstance(stmt, ast.If) and "__main__" in ast.unparse(stmt.test):
                continue
            else:
                nodes = list(ast.walk(stmt))
            for n in nodes:
                if (isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv")
                        and isinstance(n.value, ast.Name) and n.value.id == "os"):
                    bad.append(f"{f}:{n.lineno}")
    assert not bad, bad


FORK_PATH = r'''
import json, os, sys, threading
from popri.pipeline import zygote as Z
from popri.pipeline.zygote_server import PRELOAD
import importlib
for n in PRELOAD:
    try:
        importlib.import_module(n)
    except ImportError:
        pass
# what a process forked from a zygote holds (popri.pipeline.zygote_server.serve sets it)
from popri.pipeline import zygote_server
zygote_server.PRELOADED = {"env": dict(os.environ), "added": {}}
assert threading.active_count() == 1
z = Z.Zygote(dict(os.environ))
out = {"server": type(z.proc).__name__, "server_pid": z.proc.pid}
p = z.run(["--version"], env=dict(os.environ), timeout=60)
out["version"] = [p.returncode, p.stdout.decode(), p.stderr.decode()]
p = z.run(["embed", "-", "-o", "e.npy"], env=dict(os.environ), input=b"not json\n",
          timeout=60)
out["bad"] = [p.returncode, p.stdout.decode(), p.stderr.decode()]
if sys.argv[1] == "close":
    z.close()
    out["closed_rc"] = z.proc.returncode
print(json.dumps(out), flush=True)
os._exit(0)  # "leave": no close -- the server must die with us
'''


@pytest.mark.parametrize("end", ["close", "leave"])
def test_a_fork_of_a_zygote_forks_its_own_zygote_which_dies_with_it(tmp_path, end):
    """A process forked from a zygote (a popri run called by the test suite) starts its stage
    zygote as a fork of itself: no new interpreter, the same answers as a new process, reaped
    by close(), and gone once its parent is, closed or not."""
    import json

    p = subprocess.run([sys.executable, "-P", "-c", FORK_PATH, end], capture_output=True,
                       text=True, env=_env(), cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["server"] == "_Child"
    q = subprocess.run(child_argv(["--version"]), capture_output=True, text=True, env=_env())
    assert out["version"] == [0, q.stdout, q.stderr]
    q = subprocess.run(child_argv(["embed", "-", "-o", "e.npy"]), input="not json\n",
                       capture_output=True, text=True, env=_env(), cwd=tmp_path)
    assert out["bad"] == [2, q.stdout, q.stderr] and "<stdin>:1" in q.stderr
    if end == "close":
        assert out["closed_rc"] is not None
    end_by = time.monotonic() + 10
    while Path(f"/proc/{out['server_pid']}").exists() and time.monotonic() < end_by:
        time.sleep(0.1)  # (a zombie until init reaps it: its state says so)
        st = Path(f"/proc/{out['server_pid']}/stat")
        if st.exists() and st.read_text().split(") ")[-1].startswith("Z"):
            break
    st = Path(f"/proc/{out['server_pid']}/stat")
    assert not st.exists() or st.read_text().split(") ")[-1].startswith("Z")


def test_a_runner_without_a_plan_starts_the_zygote_only_for_its_third_stage(tmp_path):
    """A StageRunner nobody told how many stages will run (a caller of the class, not `popri
    run`, which sets ``planned_to_run``) starts its first MIN_STAGES - 1 stages as new
    processes and the zygote for the MIN_STAGES-th: a stage or two pay no zygote imports."""
    def eps(k):
        out = tmp_path / f"e{k}.json"
        return Stage(f"e{k}", AccountEpsilonCall(noise_multiplier=1.0 + k, sample_rate=1.0,
                                                 steps=1, as_json=True),
                     outputs=[str(out)], stdout_to=str(out))

    r = StageRunner(tmp_path)
    try:
        for k in range(Z.MIN_STAGES - 1):
            assert r.run(eps(k)) is True and r._zygote is None
        assert r.run(eps(Z.MIN_STAGES)) is True and r._zygote is not None
        # told a plan: as before, the zygote when MIN_STAGES or more are left
        told = StageRunner(tmp_path / "told")
        told.planned_to_run = Z.MIN_STAGES
        assert told.run(eps(9)) is True and told._zygote is not None
        told.close_zygote()
    finally:
        r.close_zygote()
    assert [json.loads((tmp_path / f"e{k}.json").read_text())["noise_multiplier"]
            for k in (0, 1, Z.MIN_STAGES)] == [1.0, 2.0, 1.0 + Z.MIN_STAGES]


def test_a_stage_treats_sigint_as_the_run_does(zyg, tmp_path, tiny_lm):
    """Hostile case S-IGN (issue 66): `popri run ... &` in a script starts with SIGINT ignored,
    and so does every stage it execs; a forked stage reset it to the default and died on
    `kill -INT -PGID` (the run: "stage round1-score failed (exit 130)").  A forked stage now
    ignores it when the run does, and is interrupted by it when the run is."""
    omega = write_jsonl(tmp_path / "omega.jsonl", [{"id": f"o{i}", "text": t}
                                                   for i, t in enumerate(TEXTS)])
    long_gen = ["gen", omega, "-K", 6, "-J", 50, "--model", tiny_lm, "--max-new-tokens", 200,
                "--min-words", 0, "--out", tmp_path / "s.jsonl"]

    def interrupted(ignored: bool) -> int | None:
        keep = signal.signal(signal.SIGINT, signal.SIG_IGN if ignored
                             else signal.default_int_handler)
        try:
            with open(os.devnull, "wb") as dn:
                p = zyg.spawn([str(a) for a in long_gen], env=zyg.env, stdout_fd=dn.fileno())
        finally:
            signal.signal(signal.SIGINT, keep)
        time.sleep(1.5)
        os.kill(p.pid, signal.SIGINT)
        try:
            return p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=30)
            return None  # still running: SIGINT ignored

    assert interrupted(ignored=True) is None
    assert interrupted(ignored=False) == 128 + signal.SIGINT
