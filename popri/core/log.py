"""Logs and progress bars go to stderr; stdout is for data only."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

console = Console(stderr=True, highlight=False)

_quiet = os.environ.get("POPRI_QUIET", "") not in ("", "0")


def set_quiet(q: bool) -> None:
    global _quiet
    _quiet = q


def info(msg: str) -> None:
    if not _quiet:
        console.print(msg, markup=False, soft_wrap=True)


def warn(msg: str) -> None:
    console.print(f"popri: warning: {msg}", markup=False, style="yellow", soft_wrap=True)


def progress() -> Progress:
    """A rich progress bar on stderr (silent under --quiet)."""
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=console, disable=_quiet or not sys.stderr.isatty() and os.environ.get("POPRI_PROGRESS") != "1",
        transient=False,
    )
