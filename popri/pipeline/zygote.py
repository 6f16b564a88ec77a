"""How ``popri run`` starts its stages quickly: the client of the stage zygote (popri/cli/zygote.py,
the server, documents the protocol).

A stage is the command ``python -P -m popri ARGS``; started as a new interpreter it re-imports
torch, transformers, sentence-transformers and peft, 5-10 s on 2 CPU cores before it does
anything -- most of a small run's time (benchmarks/bench_zygote.py times a run with and
without it).  With the zygote
the imports happen once per ``popri run`` and each stage is a fork of that process: the same
command line, environment, working directory, standard streams, run-directory lock and exit
status, and it still dies with the run.

Used on Linux for every stage whose environment is the one the zygote was started with; a stage
otherwise -- and every stage once the zygote failed to start or died -- starts as a process, as
before.  ``POPRI_ZYGOTE=0`` turns it off (each stage a new interpreter).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

from popri.core.runtime import PARENT_ENV

ENV = "POPRI_ZYGOTE"
#: the zygote's end of the socketpair, in its environment (popri.cli.zygote reads it)
FD_ENV = "POPRI_ZYGOTE_FD"
#: the longest message either side sends (a stage's argv and environment)
MAX_MSG = 1 << 20
#: the zygote is started only for a run with at least this many stages still to run (its own
#: imports cost about as much as one stage's start) or an unknown number
MIN_STAGES = 3
#: how long the zygote may take to import the libraries before stages start without it
READY_TIMEOUT = 300.0


def enabled(env: dict) -> bool:
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
        self.busy = False

    def _recv(self, timeout: float | None) -> dict | None:
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            raise TimeoutError
        msg = self.sock.recv(MAX_MSG)
        return json.loads(msg) if msg else None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def usable_for(self, env: dict) -> bool:
        """The stage's environment is the zygote's (what its imports read), and it lives."""
        return (not self.busy and self.alive()
                and {k: v for k, v in env.items() if k != PARENT_ENV}
                == {k: v for k, v in self.env.items() if k != PARENT_ENV})

    def spawn(self, args: list[str], *, env: dict, stdout_fd: int,
              pass_fds: tuple[int, ...] = ()) -> "Forked":
        """Fork a stage running ``popri ARGS``: stdin the caller's, stdout ``stdout_fd``, stderr
        a pipe (the returned object's ``.stderr``); ``pass_fds`` stay open in it."""
        r, w = os.pipe()
        try:
            req = {"argv": list(args), "env": dict(env), "cwd": os.getcwd()}
            socket.send_fds(self.sock, [json.dumps(req).encode()],
                            [0, stdout_fd, w, *pass_fds])
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
                raise subprocess.TimeoutExpired("popri (zygote stage)", timeout) from None
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
