"""Process-wide settings: torch threads, autocast, the cache directory.

``--threads N`` (or ``POPRI_THREADS``) sets torch's intra-op threads and the BLAS pools; on the
2-core reference box 2 threads beat 1 by 1.6x for SmolLM2 when the machine is idle, and 1 wins
when another process shares the CPU.  Default: all cores torch sees.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

#: set in a stage's environment to the pid of the process it must die with (popri run, or the
#: stage zygote that popri run started): popri.cli.process makes the stage die with it
PARENT_ENV = "POPRI_DIE_WITH"

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def env_on(name: str) -> bool:
    """A switch in the environment: ``1``, ``true``, ``yes`` or ``on`` (any case, spaces
    ignored) turns it on; anything else, or unset, leaves it off."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def set_threads(n: int | None) -> None:
    if not n:
        return
    os.environ["POPRI_THREADS"] = str(int(n))
    for v in _THREAD_VARS:
        os.environ[v] = str(int(n))
    try:  # pools already started (numpy imported) are resized too
        from threadpoolctl import threadpool_limits

        threadpool_limits(int(n))
    except Exception:
        pass


def threads() -> int | None:
    v = os.environ.get("POPRI_THREADS")
    return int(v) if v else None


def configure_torch():
    """Import torch with the configured thread count; returns the module."""
    import torch

    n = threads()
    if n:
        torch.set_num_threads(n)
    return torch


def cache_dir() -> Path:
    """``POPRI_CACHE``, else ``$XDG_CACHE_HOME/popri``, else ``~/.cache/popri``."""
    env = os.environ.get("POPRI_CACHE")
    if env:
        p = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        p = Path(base) / "popri"
    p.mkdir(parents=True, exist_ok=True)
    return p


def fault_point(name: str) -> None:
    """Test hook at a named point of a commit (the release protocol's ``after-ledger``, a
    directory swap's ``after-exchange`` / ``between-renames``): ``POPRI_FAULT=NAME`` raises an
    OSError there, ``POPRI_FAULT=kill-NAME`` kills the process with SIGKILL there, so tests can
    show what a failure or a kill at that point leaves behind."""
    fault = os.environ.get("POPRI_FAULT")
    if fault == name:
        raise OSError(5, f"injected fault at {name} (POPRI_FAULT)")
    if fault == f"kill-{name}":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """A stage of ``popri run`` (its pid in POPRI_DIE_WITH, and it is our parent) dies with
    it: SIGTERM when it goes away, even by SIGKILL (Linux ``prctl(PR_SET_PDEATHSIG)``;
    elsewhere a watchdog thread), so no orphan stage goes on writing into a run directory a
    rerun is already using.  A stage started after its popri run died exits at once.  The
    variable is removed: our own children are not its stages."""
    import signal

    want = os.environ.pop(PARENT_ENV, None)
    try:
        want = int(want) if want else None
    except ValueError:
        want = None
    if want is None:
        return
    if os.getppid() != want:
        try:
            os.kill(want, 0)
            return  # it lives: we are not its direct child (started by one of its stages)
        except ProcessLookupError:
            os._exit(128 + signal.SIGTERM)  # it died before we got here
        except OSError:
            return
    done = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            done = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
        except (OSError, AttributeError):
            done = False
    if done:
        if os.getppid() != want:  # it died between our start and the prctl
            os._exit(128 + signal.SIGTERM)
        return
    import threading
    import time

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != want:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, name="popri-parent-watchdog", daemon=True).start()


def exit_as_interpreter(code: int) -> NoReturn:
    """End the process with CODE as the interpreter would at exit -- non-daemon threads joined,
    ``atexit`` handlers run (popri.core.io.sweep_temporaries among them), standard streams
    flushed (a failed flush turns an exit 0 into 120, as Python's) -- but through ``os._exit``,
    so nothing CPython remembers can change the exit status afterwards.

    Used where that matters: a forked stage of the zygote (popri.pipeline.zygote_server), and
    popri's entry after an interrupt (popri.cli.app.main).  CPython remembers a
    KeyboardInterrupt that passed out of an ``exec``/``eval`` of a string (``run_eval_code_obj``
    sets ``_Py_UnhandledKeyboardInterrupt``; dataclasses and namedtuple build their methods that
    way, so a lazy import can be where a signal lands) even when the caller caught it, and under
    ``python -m`` then kills the process with SIGINT after finalising: a SIGTERMed stage that
    returned 143 was seen to exit -2 (CI, 2026-12-02)."""
    import atexit
    import threading

    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()  # non-daemon threads, as at interpreter exit
        atexit._run_exitfuncs()
    finally:
        for s in (sys.stdout, sys.stderr):
            try:
                if s is not None:
                    s.flush()
            except Exception:
                code = code or 120
        os._exit(code & 0xFF if code >= 0 else 1)
