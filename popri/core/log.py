"""Logs and progress bars go to stderr; stdout is for data only."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True, highlight=False)

#: set by ``--quiet`` (:func:`set_quiet`); None: POPRI_QUIET decides, read when a line is
#: written (never at import: a stage forked by the zygote of popri/cli/zygote.py imported this
#: module under another environment)
_quiet: bool | None = None


def set_quiet(q: bool) -> None:
    global _quiet
    _quiet = q


def quiet() -> bool:
    if _quiet is not None:
        return _quiet
    return os.environ.get("POPRI_QUIET", "") not in ("", "0")


def info(msg: str) -> None:
    if not quiet():
        console.print(msg, markup=False, soft_wrap=True)


def warn(msg: str) -> None:
    console.print(f"popri: warning: {msg}", markup=False, style="yellow", soft_wrap=True)


def heartbeat() -> float:
    """Seconds between two heartbeat lines of a progress bar when stderr is not a terminal
    (POPRI_HEARTBEAT, default 30; read when used, as :func:`quiet`)."""
    return float(os.environ.get("POPRI_HEARTBEAT", "30"))


class Heartbeat:
    """A progress bar for a log that is not a terminal (a pipe, a CI log, RUN/logs/): no
    carriage returns, one line ``  TASK: 120/288 (42%), 84 s`` every :func:`heartbeat` seconds
    and one when a task completes.  The subset of rich's Progress that popri uses."""

    def __init__(self, every: float | None = None):
        import time

        self._time = time.monotonic
        self.every = heartbeat() if every is None else every
        self._tasks: dict[int, dict] = {}

    def __enter__(self) -> "Heartbeat":
        return self

    def __exit__(self, *exc) -> None:
        for tid, t in self._tasks.items():
            if not t["done"] and t["completed"]:
                self._line(tid, final=True)

    def add_task(self, description: str, total=None, **_kw) -> int:
        tid = len(self._tasks)
        now = self._time()
        self._tasks[tid] = {"description": description, "total": total, "completed": 0,
                            "start": now, "last": now, "done": False}
        return tid

    def advance(self, task: int, advance: float = 1) -> None:
        self.update(task, advance=advance)

    def update(self, task: int, *, advance: float = 0, completed=None, description=None,
               total=None, **_kw) -> None:
        t = self._tasks[task]
        if description is not None:
            t["description"] = description
        if total is not None:
            t["total"] = total
        t["completed"] = completed if completed is not None else t["completed"] + advance
        now = self._time()
        if t["total"] and t["completed"] >= t["total"] and not t["done"]:
            self._line(task, final=True)
        elif now - t["last"] >= self.every:
            self._line(task)

    def _line(self, task: int, final: bool = False) -> None:
        t = self._tasks[task]
        t["last"] = self._time()
        t["done"] = t["done"] or final
        n, tot = t["completed"], t["total"]
        # no total: the count is not shown (a task without a total is one whose count is
        # private, e.g. the participants of a release-mode round): elapsed time only
        of = f"{n:g}/{tot:g} ({100 * n / tot:.0f}%), " if tot else ""
        info(f"  {t['description']}: {of}{t['last'] - t['start']:.0f} s"
             + (" done" if final else ""))


def progress():
    """A rich progress bar on stderr on a terminal; a :class:`Heartbeat` (plain lines, no
    carriage returns) in a pipe or a CI log (``POPRI_PROGRESS=1`` forces the bar); nothing
    under --quiet."""
    tty = sys.stderr.isatty() or os.environ.get("POPRI_PROGRESS") == "1"
    if not tty and not quiet():
        return Heartbeat()
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=console, disable=quiet() or not tty, transient=False,
    )
