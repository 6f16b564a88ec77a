"""A stage's child process: started from the stage zygote or as a new interpreter, its stderr
forwarded and kept in RUN/logs/STAGE.log, a heartbeat while it is silent, its one-line error
kept for the run's own.

    python -m pytest -q tests/test_zygote.py tests/test_run.py -k "log or heartbeat"

Split out of :mod:`popri.pipeline.stages` (issue 68): :class:`ChildProcesses` is the runner's
part that runs a command; the zygote is :mod:`popri.pipeline.zygote`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from popri.core import log, runtime
from popri.core.io import annotate_write_error
from popri.kit import Stage
from popri.pipeline import zygote as Z
from popri.pipeline.keys import KEYED_ENV, PASSED_ENV

#: set in a stage's environment to popri run's pid: the stage dies with it (popri.cli.process)
PARENT_ENV = runtime.PARENT_ENV


def child_argv(args: list[str]) -> list[str]:
    """``python -m popri ARGS`` without the current directory on sys.path (``-P``, Python >=
    3.11; before, a bootstrap that drops it): a directory named ``popri`` where the user stands
    -- ``popri run --run-dir popri`` makes one -- would otherwise shadow the package (its
    ``data/`` became ``popri.data``)."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "popri", *args]
    boot = ("import runpy, sys; del sys.path[0]; "
            "runpy.run_module('popri', run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", boot, *args]


def stage_env(base: dict, extra: dict | None = None) -> dict:
    """The environment of a stage: ``base`` without any ``POPRI_*`` variable except
    :data:`KEYED_ENV` and :data:`PASSED_ENV`, plus ``extra`` (the runner's own settings)."""
    keep = set(KEYED_ENV) | set(PASSED_ENV)
    env = {k: v for k, v in base.items() if not k.startswith("POPRI_") or k in keep}
    env.update(extra or {})
    return env


class ChildProcesses:
    """The runner's child processes (mixed into :class:`popri.pipeline.stages.StageRunner`,
    whose run directory, environment, lock descriptor, counts and zygote it reads)."""

    run_dir: Path
    env: dict
    lock_fd: int | None
    total: int | None
    ran: list[str]
    skipped: list[str]
    reused: list[str]
    planned_to_run: int | None
    stage_error: str | None
    _log_error: OSError | None
    _zygote: "Z.Zygote | None"
    _zygote_off: bool

    #: how a stage's own one-line error starts (popri.cli.process)
    ERROR_PREFIX = b"popri: error: "

    def _where(self) -> str:
        """``[5/18 14:02:31]``: the stage's place in the run and the wall clock."""
        n = len(self.ran) + len(self.skipped) + len(self.reused) + 1
        of = f"/{self.total}" if self.total else "/?"  # ? until the data fixes the plan
        return f"[{n}{of} {time.strftime('%H:%M:%S')}]"

    def _log_path(self, stage: Stage) -> Path:
        return self.run_dir / "logs" / f"{stage.name}.log"

    def _child(self, stage: Stage, cmd: list[str], out) -> int:
        """Run a stage's command: its stderr forwarded line by line to ours and kept in
        RUN/logs/STAGE.log, carriage returns (a library's progress bar) turned into line ends;
        when the stage prints nothing for POPRI_HEARTBEAT seconds, a heartbeat line.  Returns the
        exit status; the stage's own one-line error (``popri: error: ...``, kept out of our
        stderr when it failed: the caller reports it as its own) is :attr:`stage_error`.

        The stage dies with this process (:data:`PARENT_ENV`: a SIGKILLed popri run leaves no
        stage running on) and inherits the run directory's lock (:class:`RunLock`).  A log
        that cannot be written (a full disk) stops being written; the stage runs on, and the
        error names the log (:attr:`_log_error`)."""
        import threading

        logf = self._log_path(stage)
        self._log_error = None
        last = [time.time()]
        said: list[bytes] = []
        t0 = time.time()
        fh = None
        try:
            logf.parent.mkdir(parents=True, exist_ok=True)
            fh = open(logf, "wb", buffering=0)
        except OSError as e:
            annotate_write_error(e, logf)
            self._log_error = e
        env = dict(self.env, **{PARENT_ENV: str(os.getpid())})
        fds = (self.lock_fd,) if self.lock_fd is not None else ()

        def keep(ln: bytes) -> None:
            nonlocal fh
            if fh is None:
                return
            try:
                fh.write(ln + b"\n")
            except OSError as e:  # the log is a side file: the stage runs on without it
                annotate_write_error(e, logf)
                self._log_error = e
                try:
                    fh.close()
                except OSError:
                    pass
                fh = None

        def emit(ln: bytes) -> None:
            if ln.strip():
                keep(ln)
                if ln.startswith(self.ERROR_PREFIX):
                    said.append(ln[len(self.ERROR_PREFIX):])
                    return
                try:
                    sys.stderr.buffer.write(ln + b"\n")
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
                last[0] = time.time()

        try:
            p = self._start(cmd, env, out if out is not None else sys.stderr.fileno(), fds)

            err_fd = p.stderr.fileno()  # type: ignore[union-attr]  (stderr=PIPE)

            def pump():
                buf = b""
                while chunk := os.read(err_fd, 65536):
                    buf += chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                    *lines, buf = buf.split(b"\n")
                    for ln in lines:
                        emit(ln)
                emit(buf)

            th = threading.Thread(target=pump, daemon=True)
            th.start()
            try:
                while True:
                    try:
                        rc = p.wait(timeout=1.0)
                        break
                    except subprocess.TimeoutExpired:
                        if time.time() - last[0] >= log.heartbeat():
                            log.info(f"run: {self._where()} {stage.name} running, "
                                     f"{time.time() - t0:.0f} s")
                            last[0] = time.time()
            except BaseException:
                p.kill()
                p.wait()
                raise
            finally:
                th.join(timeout=10)
        finally:
            if fh is not None:
                try:
                    fh.close()
                except OSError:
                    pass
        if rc == 0 and said:  # an error line from a stage that succeeded: shown as it was
            for ln in said:
                try:
                    sys.stderr.buffer.write(self.ERROR_PREFIX + ln + b"\n")
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
        self.stage_error = said[-1].decode("utf-8", "replace").strip() if said else None
        return rc

    def _start(self, cmd: list[str], env: dict, out, fds: tuple[int, ...]):
        """Start a stage's command: forked from the stage zygote when it can be (a ``popri``
        command, the zygote's environment, and at least :data:`~popri.pipeline.zygote.MIN_STAGES`
        stages left to run when it is not up yet: its imports cost about one stage's start --
        unless this process is itself a fork of a zygote, which forks one at no cost;
        popri.pipeline.zygote), else a new process.  A runner that was told no plan
        (``planned_to_run`` None: a caller of this class, not ``popri run``) starts the zygote
        for its ``MIN_STAGES``-th stage: a caller that runs a stage or two (each light, such as
        ``popri account``) pays no zygote's imports (about 4 s on 2 cores) and one that runs many
        pays at most ``MIN_STAGES - 1`` starts without it.  Either way: ``.stderr`` a pipe,
        ``.wait(timeout)``, ``.kill()``."""
        prefix = child_argv([])
        left = (None if self.planned_to_run is None
                else self.planned_to_run - len(self.ran) - len(self.reused))
        nth = len(self.ran) + 1  # this stage is the runner's nth to run (a failed one raises)
        worth = (self._zygote is not None or Z.preloaded()
                 or (nth >= Z.MIN_STAGES if left is None else left >= Z.MIN_STAGES))
        if (worth and not self._zygote_off and cmd[:len(prefix)] == prefix
                and Z.enabled(os.environ)):
            if self._zygote is None or not self._zygote.alive():
                try:
                    self._zygote = Z.Zygote(self.env)
                except (Z.ZygoteError, TimeoutError, OSError) as e:
                    log.info(f"run: stages start as new processes (the stage zygote: "
                             f"{str(e) or type(e).__name__})")
                    self._zygote, self._zygote_off = None, True
            if self._zygote is not None and self._zygote.usable_for(env):
                fd = out if isinstance(out, int) else out.fileno()
                try:
                    return self._zygote.spawn(cmd[len(prefix):], env=env, stdout_fd=fd,
                                              pass_fds=fds)
                except Z.ZygoteError as e:
                    log.info(f"run: stages start as new processes (the stage zygote: {e})")
                    self.close_zygote()
                    self._zygote_off = True
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=env, pass_fds=fds)

    def close_zygote(self) -> None:
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
