"""How ``popri run`` starts its stages quickly: the client of the stage zygote (popri/cli/zygote.py,
its entry point, documents the protocol; popri/pipeline/zygote_server.py, the server).

A stage is the command ``python -P -m popri ARGS``; started as a new interpreter it re-imports
torch, transformers, sentence-transformers and peft, 5-10 s on 2 CPU cores before it does
anything -- most of a small run's time (benchmarks/bench_zygote.py times a run with and
without it).  With the zygote
the imports happen once per ``popri run`` and each stage is a fork of that process: the same
command line, environment, working directory, standard streams, run-directory lock and exit
status, and it still dies with the run.

Used on Linux for every stage whose environment is the one the zygote was started with, up to
what the preloaded libraries never read at import (:func:`compatible`); a stage otherwise -- and
every stage once the zygote failed to start or died -- starts as a process, as before.
``POPRI_ZYGOTE=0`` turns it off (each stage a new interpreter).

:meth:`Zygote.run` is ``subprocess.run`` for a ``popri`` command (the test suite's CLI calls,
tests/conftest.py, go through it).
"""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
from typing import Mapping
import time

from popri.core.runtime import PARENT_ENV, die_with_parent
from popri.pipeline import zygote_server as S
from popri.pipeline.zygote_server import MAX_MSG

ENV = "POPRI_ZYGOTE"
#: the zygote's end of the socketpair, in its environment (popri.cli.zygote reads it)
FD_ENV = "POPRI_ZYGOTE_FD"
#: the zygote is started only for a run with at least this many stages still to run (its own
#: imports cost about as much as one stage's start) or an unknown number
MIN_STAGES = 3
#: how long the zygote may take to import the libraries before stages start without it
READY_TIMEOUT = 300.0


#: HOME and the XDG base directories: what the preloaded libraries derive from them at import is
#: pinned by HF_HOME, or absent (tests/test_zygote.py's audit lists every such value)
HOME_ENV = ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")


#: read by the interpreter at start-up for the standard streams, which the child makes anew from
#: the request's environment (popri.pipeline.zygote_server._std_streams)
STREAM_ENV = ("PYTHONIOENCODING", "PYTHONUNBUFFERED")


def _free(key: str) -> bool:
    """A variable the preloaded code never reads at import: popri's own settings (read when a
    command runs: no popri module reads the environment at import), pytest's test name, and
    :data:`STREAM_ENV`."""
    return ((key.startswith("POPRI_") and key not in (ENV, FD_ENV))
            or key == "PYTEST_CURRENT_TEST" or key in STREAM_ENV)


def _homes_free(a: dict, b: dict) -> bool:
    """HOME / XDG_* may differ between two environments when nothing the imports derive from
    them differs: huggingface_hub's and datasets' caches come from HF_HOME (set, and equal);
    fsspec's configuration directory (~/.config/fsspec, read at its import) and Python's user
    site-packages (~/.local/lib, on sys.path at start-up) exist in neither home."""
    if not a.get("HF_HOME") or a.get("HF_HOME") != b.get("HF_HOME"):
        return False
    if a.get("FSSPEC_CONFIG_DIR") != b.get("FSSPEC_CONFIG_DIR"):
        return False
    for e in (a, b):
        home = e.get("HOME")
        if not home or os.path.exists(os.path.join(home, ".local", "lib")):
            return False
        if not e.get("FSSPEC_CONFIG_DIR") and os.path.exists(os.path.join(home, ".config",
                                                                          "fsspec")):
            return False
    return True


def compatible(env: dict, zygote_env: dict, added: dict | None = None) -> bool:
    """A process forked from a zygote started with ``zygote_env`` is the process ``env`` would
    have started: the two differ only in variables nothing imported at the zygote's start read
    (:func:`_free`; HOME and XDG_* under :func:`_homes_free`), or in variables the zygote's
    imports set themselves (``added``: e.g. torch's KMP_DUPLICATE_LIB_OK) to the value ``env``
    has -- a caller that imported torch before passes them on."""
    added = added or {}
    diff = {k for k in set(env) | set(zygote_env)
            if env.get(k) != zygote_env.get(k)} - {PARENT_ENV}
    diff = {k for k in diff if not (k not in zygote_env and k in added and env.get(k) == added[k])}
    if any(k in HOME_ENV for k in diff) and not _homes_free(env, zygote_env):
        return False
    return all(_free(k) or k in HOME_ENV for k in diff)


def preloaded() -> bool:
    """This process is a fork of a zygote (its imports done: a stage zygote forks at no cost)."""
    return S.PRELOADED is not None


def enabled(env: Mapping[str, str]) -> bool:
    v = str(env.get(ENV, "1")).strip().lower()
    return sys.platform.startswith("linux") and v not in ("0", "false", "no", "off")


class ZygoteError(RuntimeError):
    pass


class Zygote:
    """One zygote process for one ``popri run``; :meth:`spawn` forks a stage from it."""

    def __init__(self, env: dict, *, timeout: float = READY_TIMEOUT):
        self.env = dict(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        if preloaded() and threading.active_count() == 1:
            # we are a fork of a zygote: the imports are done (its hello gives their env)
            self.proc = _fork_server(ours, theirs)
        else:
            zenv = dict(env, **{FD_ENV: str(theirs.fileno()), PARENT_ENV: str(os.getpid())})
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-P", "-m", "popri.cli.zygote"], env=zenv,
                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            finally:
                theirs.close()
        hello = self._recv(timeout)
        if not hello or not hello.get("ready"):
            self.close()
            raise ZygoteError((hello or {}).get("error") or "it did not start")
        #: the environment the zygote was given and the variables it and its imports set
        #: (:func:`compatible`)
        self.env = dict(hello.get("env") or self.env)
        self.added = dict(hello.get("added") or {})
        self.busy = False
        #: held by :meth:`run`'s caller for one command (one at a time per zygote)
        self.lock = threading.Lock()

    def _recv(self, timeout: float | None) -> dict | None:
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            raise TimeoutError
        msg = self.sock.recv(MAX_MSG)
        return json.loads(msg) if msg else None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def usable_for(self, env: dict) -> bool:
        """Idle, alive, and a fork is what ``env`` would start (:func:`compatible`)."""
        return not self.busy and self.alive() and compatible(env, self.env, self.added)

    def spawn(self, args: list[str], *, env: dict, stdout_fd: int,
              pass_fds: tuple[int, ...] = (), cwd: str | None = None, stdin_fd: int = 0,
              safe_path: bool = True) -> "Forked":
        """Fork a stage running ``popri ARGS`` in ``cwd`` (default ours): stdin ``stdin_fd``
        (default ours), stdout ``stdout_fd``, stderr a pipe (the returned object's ``.stderr``);
        ``pass_fds`` stay open in it.  ``safe_path=False``: the working directory first on
        sys.path, as ``python -m`` without ``-P``."""
        r, w = os.pipe()
        try:
            cwd = os.path.abspath(cwd) if cwd is not None else os.getcwd()
            # a stage treats Ctrl-C as `popri run` does: ignored when the run was started with
            # SIGINT ignored (a background job of a script), as an exec'd stage inherits it
            # (hostile case S-IGN, issue 66)
            req = {"argv": list(map(str, args)), "env": dict(env), "cwd": cwd,
                   "path0": None if safe_path else cwd,
                   "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN}
            socket.send_fds(self.sock, [json.dumps(req).encode()],
                            [stdin_fd, stdout_fd, w, *pass_fds])
        except OSError as e:
            os.close(r)
            raise ZygoteError(f"could not reach it: {e}") from None
        finally:
            os.close(w)
        try:
            ans = self._recv(60.0)
        except TimeoutError:
            ans = None
        if not ans or not ans.get("pid"):
            os.close(r)
            raise ZygoteError((ans or {}).get("error") or "it did not fork")
        self.busy = True
        return Forked(self, int(ans["pid"]), os.fdopen(r, "rb"))

    def run(self, args: list[str], *, env: dict, cwd: str | None = None,
            input: bytes | None = None, timeout: float | None = None,
            safe_path: bool = True) -> subprocess.CompletedProcess:
        """``subprocess.run([python, -m, popri, *ARGS], input=..., capture_output=True,
        timeout=...)`` forked from this zygote: stdout and stderr as bytes, stdin ours when
        ``input`` is None.  The caller holds :attr:`lock` and checked :meth:`usable_for`."""
        out_r, out_w = os.pipe()
        in_r = in_w = None
        if input is not None:
            in_r, in_w = os.pipe()
        try:
            child = self.spawn(args, env=env, stdout_fd=out_w, cwd=cwd,
                               stdin_fd=0 if in_r is None else in_r, safe_path=safe_path)
        except BaseException:
            for fd in (out_r, in_w):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            for fd in (out_w, in_r):
                if fd is not None:
                    os.close(fd)
        err_fd = child.stderr.fileno()
        chunks: dict[int, list[bytes]] = {out_r: [], err_fd: []}
        end = None if timeout is None else time.monotonic() + timeout
        view, sent = memoryview(input or b""), 0
        sel = selectors.DefaultSelector()
        mine = {out_r} | ({in_w} if in_w is not None else set())  # closed here; err_fd: below
        try:
            sel.register(out_r, selectors.EVENT_READ)
            sel.register(err_fd, selectors.EVENT_READ)
            if in_w is not None:
                sel.register(in_w, selectors.EVENT_WRITE)
            while sel.get_map():
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(["popri", *map(str, args)], timeout or 0.0)
                for key, _ in sel.select(left):
                    if in_w is not None and key.fd == in_w:
                        try:
                            sent += os.write(in_w, view[sent:sent + select.PIPE_BUF])
                        except BrokenPipeError:
                            sent = len(view)
                        done = sent >= len(view)
                    else:
                        data = os.read(key.fd, 1 << 16)
                        chunks[key.fd].append(data)
                        done = not data
                    if done:
                        sel.unregister(key.fd)
                        if key.fd in mine:
                            os.close(key.fd)
                            mine.discard(key.fd)
            rc = child.wait(None if end is None else max(0.0, end - time.monotonic()))
        except BaseException:
            child.kill()
            child.wait()
            raise
        finally:
            sel.close()
            for fd in mine:
                os.close(fd)
            child.stderr.close()
        return subprocess.CompletedProcess(["popri", *map(str, args)], rc,
                                           b"".join(chunks[out_r]), b"".join(chunks[err_fd]))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _fork_server(ours: socket.socket, theirs: socket.socket) -> "_Child":
    """The zygote server as a fork of this process (which is itself a fork of a zygote, so has
    imported everything).  The fork keeps no descriptor of ours in use: 0-2 and every other one
    but its socket become /dev/null (the numbers stay taken, so a stale file object of ours that
    is collected later cannot close a descriptor a stage received); it dies with us."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDWR)
            for name in os.listdir("/proc/self/fd"):
                fd = int(name)
                if fd not in (theirs.fileno(), null):
                    try:
                        os.dup2(null, fd)
                    except OSError:
                        pass
            os.environ[PARENT_ENV] = str(os.getppid())
            die_with_parent()
            code = S.serve(theirs)
        finally:
            os._exit(code)
    theirs.close()
    return _Child(pid)


class _Child:
    """The parts of ``subprocess.Popen`` :class:`Zygote` uses, for a forked server."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while (rc := self.poll()) is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired("popri zygote", timeout or 0.0)
            time.sleep(0.01)
        return rc

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


class Forked:
    """A stage forked by the zygote, with the parts of ``subprocess.Popen`` the runner uses:
    ``pid``, ``stderr``, ``wait(timeout)``, ``kill()``, ``returncode``."""

    def __init__(self, zygote: Zygote, pid: int, stderr):
        self.zygote, self.pid, self.stderr = zygote, pid, stderr
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                ans = self.zygote._recv(left)
            except TimeoutError:
                raise subprocess.TimeoutExpired("popri (zygote stage)", timeout or 0.0) from None
            if ans is None:  # the zygote died: the stage died with it (PR_SET_PDEATHSIG)
                self.zygote.busy = False
                self.returncode = -signal.SIGTERM
                return self.returncode
            if ans.get("pid") == self.pid and "returncode" in ans:
                self.zygote.busy = False
                self.returncode = int(ans["returncode"])
                return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
