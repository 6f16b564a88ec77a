"""The stage zygote's server: import the heavy libraries once, then fork a child per request
that becomes ``python -P -m popri ARGV`` (the protocol: popri/cli/zygote.py, its entry point;
the client: popri/pipeline/zygote.py)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import sys

from popri.core.runtime import PARENT_ENV, exit_as_interpreter

#: the longest message either side sends (a stage's argv and environment)
MAX_MSG = 1 << 20

#: set in a zygote by :func:`serve` after its imports, and so in every process forked from it:
#: ``{"env": the environment it was given, "added": what it and its imports set}`` (what its
#: hello message says).  A ``popri run`` forked from a zygote (the test suite's calls) starts its
#: own stage zygote as a fork of itself instead of a new interpreter: the imports are done.
PRELOADED: dict | None = None

#: imported once, in this order (a missing one is skipped: not every install has every extra)
PRELOAD = ("numpy", "torch", "transformers", "sentence_transformers", "peft", "trl",
           "popri.cli.app")


def _send(sock: socket.socket, obj: dict) -> None:
    sock.send(json.dumps(obj).encode())


def _std_streams(unbuffered: bool, ioencoding: str = "") -> None:
    """New sys.stdin / stdout / stderr on descriptors 0-2, made as the interpreter makes them at
    start-up (line-buffered on a terminal; stderr always; write-through under -u;
    PYTHONIOENCODING's ``encoding[:errors]`` for stdin and stdout, its encoding for stderr)."""
    import io

    enc = getattr(sys.__stdout__, "encoding", None) or "utf-8"
    errors = "strict"
    if ioencoding:
        e, _, err = ioencoding.partition(":")
        enc, errors = e or enc, err or errors

    def out(fd: int, errors: str) -> io.TextIOWrapper:
        tty = os.isatty(fd)
        raw = io.FileIO(fd, "wb", closefd=False)
        buf = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(buf, encoding=enc, errors=errors,
                                line_buffering=tty or fd == 2, write_through=unbuffered)

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb",
                                                                              closefd=False)),
                                                 encoding=enc, errors=errors)
    sys.stdout = sys.__stdout__ = out(1, errors)
    sys.stderr = sys.__stderr__ = out(2, "backslashreplace")


def _child(sock: socket.socket, req: dict, fds: list[int]) -> None:
    """In the forked child: become the stage, run it, exit.  Never returns."""
    code = 1
    try:
        sock.close()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN if req.get("sigint_ignored")
                      else signal.default_int_handler)
        for target, fd in zip((0, 1, 2), fds[:3]):
            os.dup2(fd, target)
        for fd in fds[:3]:
            if fd > 2 and fd not in fds[3:]:
                os.close(fd)
        env = dict(req["env"])
        env[PARENT_ENV] = str(os.getppid())  # die with the zygote, which dies with popri run
        os.environ.clear()
        os.environ.update(env)
        os.chdir(req["cwd"])
        if req.get("path0"):  # python -m without -P: the working directory first on sys.path
            sys.path.insert(0, req["path0"])
        _std_streams(bool(env.get("PYTHONUNBUFFERED")), env.get("PYTHONIOENCODING", ""))
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
        exit_as_interpreter(code)  # threads joined, atexit, streams flushed; never returns
    finally:  # only when becoming the stage failed: no atexit of a stage that never ran
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:
                pass
        os._exit(code & 0xFF if code >= 0 else 1)


def serve(sock: socket.socket, *, given: dict | None = None) -> int:
    """Import :data:`PRELOAD`, say ready, and fork a child for each request until the client
    goes away.  ``given``: the environment we were started with, before we set anything
    (popri.cli.zygote.main: the progress switches a stage sets too); what differs from it
    after the imports is ``added`` (popri.pipeline.zygote.compatible).  None: we are a fork of
    a zygote (popri.pipeline.zygote._fork_server), the imports are done, PRELOADED says all."""
    global PRELOADED
    preloaded = given is None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the run's and the stage's
    if not preloaded:
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
    if given is not None:  # not preloaded
        added = {k: v for k, v in os.environ.items() if given.get(k) != v}
        PRELOADED = {"env": dict(given), "added": added}  # inherited by every fork
    _send(sock, {"ready": True, "pid": os.getpid(), **(PRELOADED or {})})
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
