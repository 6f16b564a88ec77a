"""The stage zygote of ``popri run``: one process that imports the heavy libraries once and
forks a child for every stage, so a stage starts in milliseconds instead of re-importing torch,
transformers, sentence-transformers and peft (5-10 s a stage on 2 CPU cores, most of a small
run's time).  Started by :mod:`popri.pipeline.zygote` (the client; see there for when it is
used and how to turn it off, ``POPRI_ZYGOTE=0``):

    python -P -m popri.cli.zygote        # with POPRI_ZYGOTE_FD=<one end of a socketpair>

Protocol over that ``AF_UNIX`` ``SOCK_SEQPACKET`` socket (one JSON object per message):

* zygote -> client, once: ``{"ready": true, "pid": ..., "added": {...}}`` after the imports
  (``added``: the environment variables the imports set), or
  ``{"error": "..."}`` (then it exits; the client starts stages as processes).
* client -> zygote: ``{"argv": [...], "env": {...}, "cwd": "...", "path0": null}`` (``path0``: a
  directory to put first on sys.path, as ``python -m`` without ``-P``) with the stage's stdin,
  stdout, stderr and any further descriptors to keep open (the run directory's lock) as
  ``SCM_RIGHTS``.
* zygote -> client: ``{"pid": N}`` once forked, then ``{"pid": N, "returncode": R}`` when it
  exited (``R`` as ``subprocess.Popen.returncode``: negative for a signal).  One stage at a time.

The child is the process ``python -P -m popri ARGV`` would have been: the stage's environment
(``os.environ`` replaced), working directory, standard streams (new ``sys.std*`` objects on the
received descriptors), default signal dispositions, and ``popri``'s ``__main__`` run by
``runpy``; it exits as an interpreter does (threads joined, ``atexit``, streams flushed).  It
dies with the zygote (``POPRI_DIE_WITH``: ``PR_SET_PDEATHSIG``), which dies with ``popri run``,
so a SIGKILLed run still takes its stage with it.  Forking is safe only from a process whose
Python code runs in one thread: the zygote checks after its imports and refuses (``error``)
otherwise; the native threads the imports leave (OpenBLAS's idle pools, jemalloc's background
thread) have fork handlers of their own.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import sys

from popri.pipeline.zygote import FD_ENV, MAX_MSG

#: imported once, in this order (a missing one is skipped: not every install has every extra)
PRELOAD = ("numpy", "torch", "transformers", "sentence_transformers", "peft", "trl",
           "popri.cli.app")


def _send(sock: socket.socket, obj: dict) -> None:
    sock.send(json.dumps(obj).encode())


def _std_streams(unbuffered: bool) -> None:
    """New sys.stdin / stdout / stderr on descriptors 0-2, made as the interpreter makes them at
    start-up (line-buffered on a terminal; stderr always; write-through under -u)."""
    import io

    enc = getattr(sys.__stdout__, "encoding", None) or "utf-8"

    def out(fd: int, errors: str) -> io.TextIOWrapper:
        tty = os.isatty(fd)
        raw = io.FileIO(fd, "wb", closefd=False)
        buf = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(buf, encoding=enc, errors=errors,
                                line_buffering=tty or fd == 2, write_through=unbuffered)

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb",
                                                                              closefd=False)),
                                                 encoding=enc, errors="strict")
    sys.stdout = sys.__stdout__ = out(1, "strict")
    sys.stderr = sys.__stderr__ = out(2, "backslashreplace")


def _child(sock: socket.socket, req: dict, fds: list[int]) -> None:
    """In the forked child: become the stage, run it, exit.  Never returns."""
    code = 1
    try:
        sock.close()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in zip((0, 1, 2), fds[:3]):
            os.dup2(fd, target)
        for fd in fds[:3]:
            if fd > 2 and fd not in fds[3:]:
                os.close(fd)
        from popri.core.runtime import PARENT_ENV as _PARENT_ENV

        env = dict(req["env"])
        env[_PARENT_ENV] = str(os.getppid())  # die with the zygote, which dies with popri run
        os.environ.clear()
        os.environ.update(env)
        os.chdir(req["cwd"])
        if req.get("path0"):  # python -m without -P: the working directory first on sys.path
            sys.path.insert(0, req["path0"])
        _std_streams(bool(env.get("PYTHONUNBUFFERED")))
        sys.argv = ["popri", *req["argv"]]
        import runpy

        try:
            runpy.run_module("popri", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            code = 128 + signal.SIGINT
        except BaseException:  # as the interpreter: the traceback, exit 1
            import traceback

            traceback.print_exc()
            code = 1
        import threading

        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()  # non-daemon threads, as at interpreter exit
        import atexit

        atexit._run_exitfuncs()
    finally:
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:
                code = code or 120  # as the interpreter when flushing stdout fails
        os._exit(code & 0xFF if code >= 0 else 1)


def serve(sock: socket.socket) -> int:
    from popri.cli.process import quiet_library_progress

    start = dict(os.environ)
    quiet_library_progress()  # a stage's stderr is a pipe (popri.cli.process.prepare)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the run's and the stage's
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        except Exception as e:  # a broken library: the stages will say so themselves
            _send(sock, {"error": f"importing {name}: {type(e).__name__}: {e}"[:500]})
            return 1
    import threading

    if threading.active_count() != 1:  # a Python thread holding a lock would hang the child
        _send(sock, {"error": f"{threading.active_count()} Python threads after the imports: "
                              "forking is not safe"})
        return 1
    # native threads may remain: OpenBLAS's idle pools (numpy's, scipy's) and jemalloc's
    # background thread (pyarrow), each with pthread_atfork handlers that make fork safe
    # what the imports themselves set (torch: KMP_DUPLICATE_LIB_OK, TORCHINDUCTOR_CACHE_DIR, ...):
    # a caller that imported them too has these in its environment (zygote.compatible)
    added = {k: v for k, v in os.environ.items() if start.get(k) != v}
    _send(sock, {"ready": True, "pid": os.getpid(), "added": added})
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_MSG, 16)
        except OSError:
            return 0
        if not msg:  # the client went away
            for fd in fds:
                os.close(fd)
            return 0
        try:
            req = json.loads(msg)
            pid = os.fork()
        except Exception as e:
            for fd in fds:
                os.close(fd)
            _send(sock, {"pid": None, "error": f"{type(e).__name__}: {e}"[:500]})
            continue
        if pid == 0:
            _child(sock, req, fds)
        for fd in fds:
            os.close(fd)
        _send(sock, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send(sock, {"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})


def main() -> int:
    from popri.cli.process import _die_with_parent

    fd = int(os.environ.pop(FD_ENV))
    sock = socket.socket(fileno=fd)
    _die_with_parent()  # POPRI_DIE_WITH: popri run
    try:
        return serve(sock)
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
