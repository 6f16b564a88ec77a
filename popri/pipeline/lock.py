"""The run directory's lock: one ``popri run`` at a time on a run directory (its budget check,
its stages and their ledgers), held from the budget check to the last stage marker.

    python -m pytest -q tests/test_run.py -k lock

Split out of :mod:`popri.pipeline.stages` (issue 68); the runner takes it in
:meth:`popri.pipeline.driver.Run.execute`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from popri.core.errors import InputError


class RunLock:
    """An exclusive lock on a run directory (``fcntl.flock`` on the directory itself: nothing
    is written) held by one ``popri run`` from its budget check to its last stage marker, so
    two runs can never both pass the budget guard on one ledger.  A second run is refused at
    once (exit 2), not queued, after a short grace; the lock dies with its process (a SIGKILLed
    run leaves none).  Every stage inherits the locked descriptor (:meth:`StageRunner._child`),
    so the directory stays locked while a stage of the run still lives: a stage outliving its
    popri run (it is told to die with it, :data:`PARENT_ENV`) cannot race a rerun."""

    #: seconds a busy lock is waited for before the run is refused
    GRACE = 5.0

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir)
        self.fd: int | None = None
        self.created = False

    def __enter__(self) -> "RunLock":
        import fcntl

        self.created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        deadline = time.time() + self.GRACE
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() < deadline:  # a stopped run's stage may still be exiting
                    time.sleep(0.2)
                    continue
                os.close(fd)
                self._cleanup()
                raise InputError("is in use by another popri run (or by a stage of a stopped "
                                 "one that is still exiting): wait for it to finish, or use "
                                 "another run_dir", path=str(self.path),
                                 field="run_dir") from None
        self.fd = fd
        return self

    def _cleanup(self) -> None:
        """A run refused before writing anything leaves no directory it created."""
        if self.created:
            try:
                self.path.rmdir()  # only if still empty
            except OSError:
                pass

    def __exit__(self, exc_type, *exc) -> None:
        if self.fd is None:
            return
        if exc_type is not None:
            self._cleanup()
        os.close(self.fd)  # releases the lock
        self.fd = None
