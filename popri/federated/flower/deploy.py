"""Flower deployment runtime for popri's apps: certificates, the app directory, a loopback run.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_flower_deploy.py          # unit
    .venv/bin/python -m pytest -q -p no:cacheprovider -m slow tests/test_flower_deploy.py

A multi-machine run of popri's client feedback (issue 12) is Flower's *deployment runtime*
(flwr 1.41): one ``flower-superlink`` (server machine), one ``flower-supernode`` per client
machine (its private data named by ``--node-config "data-path='...'"``), and ``flwr run APP_DIR
CONNECTION`` submitting the ServerApp/ClientApp pair.  docs/flower.md has the recipe; this module
is the same recipe as code, and :func:`run_loopback` plays it on 127.0.0.1 (tests, drills):

* the files a deployment needs -- certificates, SuperNode keys, the app directory, the ``flwr``
  connection config, the node config argument -- are :mod:`popri.federated.flower.deploy_files`
  (``make_certs``, ``make_node_keys``, ``app_dir``, ``write_flwr_config``, ``node_config_arg``).
* :class:`Flwr` / :func:`submit` -- ``flwr run APP CONNECTION --stream`` on a running deployment,
  bounded in time (``flwr stop`` on timeout), the final status from ``flwr ls --format json``.
* :class:`Loopback` / :func:`run_loopback` -- SuperLink + N SuperNodes as child processes (each
  its own process group, free ports, logs in a work dir, a private ``FLWR_HOME`` each), with TLS
  and SuperNode authentication by default, then :meth:`Flwr.run`; every process it started --
  and the SuperExec / app processes those start, some in sessions of their own -- ended in
  ``finally``.  :func:`loopback_job` runs an engine job directory
  (:mod:`popri.federated.flower.engine`) this way with popri's own apps.

Secure aggregation is SecAgg+ (Bell et al., "Secure Single-Server Aggregation with (Poly)
Logarithmic Overhead", CCS 2020, arXiv:2009.08248), run by the apps, not by this module.
Flower binaries are taken from this interpreter's ``bin`` directory, never from ``PATH``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from popri.federated.flower.deploy_files import (
    CONNECTION,
    flat_keys,
    app_config_keys,
    app_dir,
    make_certs,
    make_node_keys,
    node_config_arg,
    toml_table,
    write_flwr_config,
)

FLWR_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
MARK_ENV = "POPRI_FLOWER_LOOPBACK"  # set in every child's environment; found again at cleanup
# --------------------------------------------------------------------------- processes
def flower_bin(name: str) -> Path:
    """A Flower executable next to this interpreter (``flower-superlink``, ``flwr``, ...)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: install flwr==1.41.* into {sys.prefix}")
    return path


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _descendants(pids: list[int]) -> set[int]:
    kids, out, todo = _children_map(), set(), list(pids)
    while todo:
        for child in kids.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _marked(token: str) -> set[int]:
    """Processes (ours to read) whose environment carries ``MARK_ENV=token``."""
    needle = f"{MARK_ENV}={token}".encode()
    out = set()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    out.add(int(entry))
        except OSError:
            continue
    out.discard(os.getpid())
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen
    log: Path


@dataclass
class RunResult:
    """What a Flower run left: its run id and status, timings, and where the logs are."""

    run_id: int | None
    status: str
    seconds: float  # `flwr run` submit -> run finished
    startup_seconds: float  # loopback: processes started -> all SuperNodes connected
    work_dir: Path
    logs: dict[str, Path] = field(default_factory=dict)
    run_info: dict[str, Any] = field(default_factory=dict)  # `flwr ls --format json` row
    token: str = ""  # the MARK_ENV value every process started for it carried
    leftover: set[int] = field(default_factory=set)  # PIDs alive after stop (should be none)

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"


LoopbackResult = RunResult


class DeployError(RuntimeError):
    """A deployment step failed; the message names the log file to read."""


class Flwr:
    """The ``flwr`` CLI against one SuperLink connection, its processes ended on exit.

    ``flwr_home`` is the CLI's ``FLWR_HOME`` (``config.toml`` with the connection, see
    :func:`write_flwr_config`); ``None`` keeps the caller's (``$FLWR_HOME`` or ``~/.flwr``).
    Every process started carries ``MARK_ENV=<token>`` in its environment and runs in its own
    session/process group with output in ``work_dir/logs/NAME.log``; :meth:`stop` (also on
    ``__exit__``, whatever the exit) ends them and all their descendants, also those that left
    the group (SIGTERM, SIGKILL after ``grace`` s).
    """

    def __init__(self, work_dir: str | Path, *, flwr_home: str | Path | None = None,
                 connection: str = CONNECTION, env: dict[str, str] | None = None,
                 grace: float = 5.0):
        self.work_dir = Path(work_dir).resolve()
        self.flwr_home = Path(flwr_home).resolve() if flwr_home is not None else None
        self.connection = connection
        self.extra_env = dict(env or {})
        self.grace = grace
        self.token = secrets.token_hex(8)
        self.procs: list[_Proc] = []
        self.seen: set[int] = set()
        self.logs: dict[str, Path] = {}
        self.startup_seconds = 0.0

    # -- processes ------------------------------------------------------------------------
    def _env(self, home: Path | None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(FLWR_ENV)
        env.update(self.extra_env)
        # flwr starts flower-superexec / flwr-serverapp / flwr-clientapp by name: this venv first
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        if home is not None:
            home.mkdir(parents=True, exist_ok=True)
            env["FLWR_HOME"] = str(home)
        env[MARK_ENV] = self.token
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _start(self, name: str, argv: list[str], home: Path | None) -> _Proc:
        log = self.work_dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as fh:
            fh.write(f"$ {shlex.join(argv)}\n".encode())
            fh.flush()
            popen = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self._env(home),
                                     cwd=self.work_dir, start_new_session=True)
        proc = _Proc(name, popen, log)
        self.procs.append(proc)
        self.logs[name] = log
        return proc

    def _track(self) -> None:
        """Remember descendants now (a child re-parented to init later is still found)."""
        self.seen |= _descendants([p.popen.pid for p in self.procs])

    def _check(self) -> None:
        """Called while waiting; raise when something the run needs has died."""

    def _kill(self, procs: list[_Proc] | None = None) -> None:
        """End ``procs`` (default: all) and every descendant / marked process; reap."""
        everyone = procs is None
        procs = self.procs if procs is None else procs
        pids = {p.popen.pid for p in procs}
        extra = _descendants(list(pids))
        if everyone:
            extra |= self.seen | _marked(self.token)
        extra -= {os.getpid()}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in procs:
                # only while not reaped: a reaped leader's pid may be reused; its group's
                # survivors are in `extra` (descendants / marked)
                if p.popen.poll() is None:
                    try:
                        os.killpg(p.popen.pid, sig)  # own session: pgid == pid
                    except (ProcessLookupError, PermissionError):
                        pass
            for pid in extra:
                try:
                    if _alive(pid):
                        os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + (self.grace if sig == signal.SIGTERM else 5.0)
            while time.monotonic() < deadline:
                for p in procs:
                    p.popen.poll()
                if all(p.popen.returncode is not None for p in procs) and \
                        not any(_alive(pid) for pid in extra):
                    return
                time.sleep(0.1)

    def stop(self) -> None:
        """End every process started (and their descendants)."""
        self._track()
        self._kill()

    def survivors(self) -> set[int]:
        """PIDs still alive among everything started (empty after :meth:`stop`)."""
        pids = {p.popen.pid for p in self.procs} | self.seen | _marked(self.token)
        return {pid for pid in pids if _alive(pid)}

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the flwr CLI ---------------------------------------------------------------------
    def cli(self, *args: str, timeout: float = 120.0, name: str = "flwr") -> str:
        """Run ``flwr ARGS``, bounded in time; its output, or :class:`DeployError`."""
        log = self.work_dir / "logs" / f"{name}.log"
        offset = log.stat().st_size if log.exists() else 0  # the log appends per call
        proc = self._start(name, [str(flower_bin("flwr")), *args], self.flwr_home)
        try:
            proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired as err:
            self._kill([proc])
            raise DeployError(f"`flwr {' '.join(args)}` timed out after {timeout:.0f}s; "
                              f"read {proc.log}") from err
        if proc.popen.returncode != 0:
            raise DeployError(f"`flwr {' '.join(args)}` exited {proc.popen.returncode}; "
                              f"read {proc.log}")
        with open(proc.log, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")

    def run(self, app: str | Path, run_config: dict[str, Any] | None = None, *,
            timeout: float = 600.0) -> RunResult:
        """``flwr run APP CONNECTION --stream [--run-config FILE]``; wait; the final status.

        ``run_config`` overrides keys of the app's ``[tool.flwr.app.config]`` (others are an
        error).  The streamed log (the ServerApp's) is ``logs/flwr-run.log``.  On timeout the
        run is stopped on the SuperLink (``flwr stop``).  Raises :class:`DeployError` (naming the
        log files) unless the run ends ``finished:completed``.
        """
        app = Path(app).resolve()
        run_config = dict(run_config or {})
        unknown = set(flat_keys(run_config)) - app_config_keys(app)
        if unknown:
            raise ValueError(f"run config keys {sorted(unknown)} are not in "
                             f"{app / 'pyproject.toml'} [tool.flwr.app.config]")
        args = ["run", str(app), self.connection, "--stream"]
        if run_config:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            overrides = self.work_dir / "run-config.toml"
            overrides.write_text(toml_table(run_config), encoding="utf-8")
            args += ["--run-config", str(overrides)]
        t0 = time.monotonic()
        proc = self._start("flwr-run", [str(flower_bin("flwr")), *args], self.flwr_home)
        where = f"read {proc.log} (the ServerApp's log)" + (
            f" and {self.logs['superlink']}" if "superlink" in self.logs else "")
        deadline = t0 + timeout
        while proc.popen.poll() is None:
            if time.monotonic() > deadline:
                self._track()
                self._kill([proc])
                m = re.search(r"Successfully started run (\d+)",
                              proc.log.read_text(errors="replace"))
                if m:
                    try:
                        self.cli("stop", m.group(1), self.connection, timeout=30,
                                 name=f"stop-{m.group(1)}")
                    except DeployError:
                        pass
                raise DeployError(f"run did not finish within {timeout:.0f}s; {where}")
            self._check()
            self._track()
            time.sleep(0.5)
        seconds = time.monotonic() - t0
        m = re.search(r"Successfully started run (\d+)", proc.log.read_text(errors="replace"))
        if proc.popen.returncode != 0 or not m:
            raise DeployError(f"`flwr run` exited {proc.popen.returncode} without a run; "
                              f"read {proc.log}")
        run_id = int(m.group(1))
        info = self.run_info(run_id)
        result = RunResult(run_id=run_id, status=str(info.get("status", "?")), seconds=seconds,
                           startup_seconds=self.startup_seconds, work_dir=self.work_dir,
                           logs=dict(self.logs), run_info=info, token=self.token)
        if not result.ok:
            raise DeployError(f"run {run_id} ended {result.status!r} "
                              f"({info.get('status-details')}); {where}")
        return result

    def run_info(self, run_id: int) -> dict[str, Any]:
        """``flwr ls CONNECTION --run-id RUN_ID --format json``: the run's status row."""
        out = self.cli("ls", self.connection, "--run-id", str(run_id), "--format", "json",
                       name=f"ls-{run_id}")
        body = out.split("\n", 1)[1] if out.startswith("$ ") else out  # past the header
        runs = json.loads(body[body.index("{"):]).get("runs", [])
        return runs[0] if runs else {}


class Loopback(Flwr):
    """SuperLink + SuperNodes on 127.0.0.1, as a context manager; ``run()`` submits an app.

    ``node_configs[i]`` is SuperNode i's node config (e.g. ``{"data-path": "/data/i.jsonl"}``).
    With ``tls`` the SuperLink serves HTTPS with a fresh CA (:func:`make_certs`); with ``auth``
    (needs ``tls``) it runs ``--enable-supernode-auth`` and each SuperNode's public key is
    registered with ``flwr supernode register`` before that SuperNode starts.  Each process has
    its own ``FLWR_HOME`` under ``work_dir/homes`` (as on separate machines; the CLI's is
    ``work_dir/cli-home``) and logs to ``work_dir/logs/NAME.log``.  On exit (normal, exception,
    timeout, Ctrl-C) every process started and all their descendants are ended.
    ``env`` adds variables to every process (e.g. ``PYTHONPATH``).
    """

    def __init__(self, work_dir: str | Path, node_configs: list[dict[str, Any]], *,
                 tls: bool = True, auth: bool = True, startup_timeout: float = 120.0,
                 env: dict[str, str] | None = None, grace: float = 5.0):
        if auth and not tls:
            raise ValueError("SuperNode authentication needs TLS (flwr refuses it with "
                             "--insecure)")
        if not node_configs:
            raise ValueError("at least one SuperNode")
        work = Path(work_dir).resolve()
        super().__init__(work, flwr_home=work / "cli-home", connection=CONNECTION, env=env,
                         grace=grace)
        self.node_configs = [dict(c) for c in node_configs]
        self.tls, self.auth = tls, auth
        self.startup_timeout = startup_timeout
        self.certs: dict[str, Path] = {}
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _check(self) -> None:
        for p in self.procs:
            if p.name.startswith(("superlink", "supernode")) and p.popen.poll() is not None:
                raise DeployError(f"{p.name} exited with code {p.popen.returncode}; "
                                  f"read {p.log}")

    def _wait_port(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        raise DeployError(f"SuperLink not listening on {self.address} after "
                          f"{self.startup_timeout:.0f}s; read {self.logs['superlink']}")

    def _wait_nodes(self, deadline: float) -> None:
        pending = {f"supernode-{i}" for i in range(len(self.node_configs))}
        while pending and time.monotonic() < deadline:
            self._check()
            for name in sorted(pending):
                if "SuperNode ID:" in self.logs[name].read_text(errors="replace"):
                    pending.discard(name)
            if pending:
                time.sleep(0.3)
        if pending:
            first = sorted(pending)[0]
            raise DeployError(f"{len(pending)} SuperNode(s) did not connect within "
                              f"{self.startup_timeout:.0f}s; read {self.logs[first]} and "
                              f"{self.logs['superlink']}")

    def start(self) -> "Loopback":
        """Start the SuperLink, register and start the SuperNodes, wait until all connected."""
        t0 = time.monotonic()
        deadline = t0 + self.startup_timeout
        self.work_dir.mkdir(parents=True, exist_ok=True)
        n = len(self.node_configs)
        ports = free_ports(1 + n)
        self.port = ports[0]
        link = [str(flower_bin("flower-superlink")), "--host", "127.0.0.1",
                "--port", str(self.port), "--disable-runtime-dependency-installation"]
        if self.tls:
            self.certs = make_certs(self.work_dir / "certs")
            link += ["--ssl-ca-certfile", str(self.certs["ca_cert"]),
                     "--ssl-certfile", str(self.certs["server_cert"]),
                     "--ssl-keyfile", str(self.certs["server_key"])]
        else:
            link.append("--insecure")
        if self.auth:
            link.append("--enable-supernode-auth")
        assert self.flwr_home is not None
        write_flwr_config(self.flwr_home, self.address,
                          root_certificates=self.certs.get("ca_cert"))
        self._start("superlink", link, self.work_dir / "homes" / "superlink")
        self._wait_port(deadline)

        for i, cfg in enumerate(self.node_configs):
            node = [str(flower_bin("flower-supernode")), "--superlink", self.address,
                    "--host", "127.0.0.1", "--port", str(ports[1 + i])]
            node += (["--root-certificates", str(self.certs["ca_cert"])] if self.tls
                     else ["--insecure"])
            if self.auth:
                keys = make_node_keys(self.work_dir / "keys", f"supernode-{i}")
                self.cli("supernode", "register", str(keys["public"]), self.connection,
                         timeout=max(5.0, deadline - time.monotonic()),
                         name=f"register-{i}")
                node += ["--auth-supernode-private-key", str(keys["private"])]
            if cfg:
                node += ["--node-config", node_config_arg(cfg)]
            self._start(f"supernode-{i}", node, self.work_dir / "homes" / f"supernode-{i}")
        self._wait_nodes(deadline)
        self._track()
        self.startup_seconds = time.monotonic() - t0
        return self

    def __enter__(self) -> "Loopback":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise


def submit(app: str | Path, run_config: dict[str, Any] | None = None, *,
           connection: str = CONNECTION, flwr_home: str | Path | None = None,
           timeout: float = 600.0, work_dir: str | Path | None = None) -> RunResult:
    """Run ``app`` on a running deployment (the SuperLink named ``connection`` in
    ``$FLWR_HOME/config.toml``) and wait for it: ``flwr run --stream``, then ``flwr ls``.

    What ``popri`` runs on the SuperLink host for a multi-machine round (docs/flower.md).
    Logs in ``work_dir/logs`` (default: a fresh ``/tmp/popri-flower-*``).
    """
    import tempfile

    work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(
        prefix="popri-flower-"))
    fl = Flwr(work, flwr_home=flwr_home, connection=connection)
    with fl:
        result = fl.run(app, run_config, timeout=timeout)
    result.leftover = fl.survivors()
    return result


def run_loopback(app: str | Path, node_data: list[str | Path], run_config: dict[str, Any]
                 | None = None, *, tls: bool = True, auth: bool = True, timeout: float = 600.0,
                 startup_timeout: float = 120.0, work_dir: str | Path | None = None,
                 env: dict[str, str] | None = None) -> RunResult:
    """One run of the Flower app ``app`` on a loopback deployment, everything ended after.

    One SuperNode per ``node_data`` entry, with ``--node-config "data-path='PATH'"``.
    ``run_config`` overrides keys of the app's ``[tool.flwr.app.config]``.  ``work_dir``
    (default: a fresh ``/tmp/popri-flower-*``) keeps certificates, keys, ``FLWR_HOME``\\ s and the
    logs (``logs/superlink.log``, ``logs/supernode-I.log``, ``logs/flwr-run.log`` = the
    ServerApp's streamed log).  ``timeout`` bounds the run, ``startup_timeout`` the start-up.
    """
    import tempfile

    work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(
        prefix="popri-flower-"))
    configs = [{"data-path": str(Path(p).resolve())} for p in node_data]
    lb = Loopback(work, configs, tls=tls, auth=auth, startup_timeout=startup_timeout, env=env)
    with lb:
        result = lb.run(app, run_config, timeout=timeout)
    result.leftover = lb.survivors()
    return result


def loopback_job(job: str | Path, *, timeout: float = 600.0, tls: bool = True,
                 auth: bool = True, startup_timeout: float = 120.0) -> RunResult:
    """Run an engine job directory (:mod:`popri.federated.flower.engine`) on a loopback
    deployment of popri's own apps instead of the simulation runtime.

    One SuperNode per ``node-K.npy`` (``settings["secagg"]["nodes"]`` of them), each with
    ``data-path`` = its file; the app directory ``JOB/flower-app`` points at popri's installed
    ServerApp/ClientApp with run config ``job`` = JOB; logs under ``JOB/deploy/logs``.  The
    ServerApp leaves ``result.json`` / ``result.npy`` in JOB, as with ``simulate``.
    """
    job = Path(job).resolve()
    settings = json.loads((job / "settings.json").read_text(encoding="utf-8"))
    nodes = int(settings["secagg"]["nodes"])
    data = [job / f"node-{k}.npy" for k in range(nodes)]
    missing = [str(p) for p in data if not p.exists()]
    if missing:
        raise FileNotFoundError(f"job {job} lacks node data: {missing[:3]}")
    app = app_dir(job / "flower-app", config={"job": str(job)})
    # the ServerApp prefers $POPRI_FLOWER_JOB to the run config: never let a stale one win
    return run_loopback(app, data, {"job": str(job)}, tls=tls, auth=auth, timeout=timeout,
                        startup_timeout=startup_timeout, work_dir=job / "deploy",
                        env={"POPRI_FLOWER_JOB": str(job)})
