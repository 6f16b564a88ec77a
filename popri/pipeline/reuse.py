"""``popri run --reuse-from OTHER``: copy a stage another run directory already finished,
instead of running it again.

    popri run examples/learning.yaml --run-dir runs/a
    popri run examples/learning.yaml --run-dir runs/b --set dpo.pair_rule=fluent --reuse-from runs/a

Two runs that differ in one setting share every stage before it, and usually the controls after
it (the T = 0 synthetic sets, the eps = 0 / inf baselines).  A stage of this run is copied from
the lender (:class:`Loan`) only when the lender's marker (``OTHER/.stages/NAME.json``) proves
it is the same computation:

- the lender's key equals the key this stage would have *had it been run in the lender's
  directory*: the stage's command with every path under this run directory moved to the
  lender's (:func:`translator`), the same popri version and keyed environment, and the same
  content hash of every input (:meth:`popri.pipeline.stages.StageRunner.key` -- an input of an
  earlier stage is known by the hash recorded when it was written, wherever it was);
- every declared output in the lender still has the hash its marker recorded, and the copy
  here has it too (checked after copying; otherwise the stage runs).

What is copied is everything the command writes (:func:`written_paths`): its declared outputs,
its ``--out`` / ``--*-out`` arguments (``gen --stats-out``, ``dpo --out`` with its
checkpoints) and their companion files (:func:`popri.core.guard.companion_files`).  Each file
is copied through a temporary name (popri.core.io) and a directory through a staging directory
swapped into place (popri.core.outdir), so a kill leaves the old output or the new one; the stage's
marker, written last, says ``reused_from``.  The marker's ``seconds`` are the lender's: what
computing the result cost.

Never copied: a DP release (a stage with a ledger entry: each run makes its own releases, on
its own ledger, under its own budget) and nothing at all in release mode (its stages draw from
the OS's CSPRNG; sharing one run's draws with another would couple two releases that are
accounted apart).  Copies are real copies, not hard links: a later stage that rewrote a
checkpoint in place would otherwise change the lender's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from popri.core import outdir
from popri.core.errors import ConfigError
from popri.core.guard import companion_files
from popri.core.io import atomic_write
from popri.kit import Stage


#: how :meth:`popri.pipeline.stages.StageRunner.survey` says a stage will be copied
COPIED = "copied from "


@dataclass
class Loan:
    """A finished stage of another run directory that is this stage's result."""

    lender: Path                    # the lender's run directory, as given
    files: list[tuple[Path, Path]]  # (the lender's file or directory, this run's)
    hashes: dict[str, str]          # this stage's declared outputs -> their recorded hashes
    seconds: float | None           # what computing it cost, in the lender


def lenders_of(paths: Iterable[str | os.PathLike], run_dir: str | os.PathLike,
               release: bool) -> list[Path]:
    """The ``--reuse-from`` directories, checked: each a run directory (``.stages/`` in it) other
    than ``run_dir``; none in release mode.  A :class:`ConfigError` naming the flag (exit 2)."""
    paths = list(paths)
    if release and paths:
        raise ConfigError("release mode copies no stage from another run: its stages draw "
                          "from the OS's CSPRNG, and one run's draws reused by another would "
                          "couple releases that are accounted apart", path="--reuse-from")
    out: list[Path] = []
    for p in paths:
        d = Path(p)
        if not (d / ".stages").is_dir():
            raise ConfigError(f"{os.fspath(p)!r} is not a popri run directory (no .stages/ in "
                              "it): give a directory a 'popri run' wrote", path="--reuse-from")
        if Path(run_dir).exists() and os.path.samefile(d, run_dir):
            raise ConfigError(f"{os.fspath(p)!r} is this run's own directory (its finished "
                              "stages are reused anyway)", path="--reuse-from")
        if d not in out:
            out.append(d)
    return out


def translator(ours: str, theirs: str) -> Callable[[str], str]:
    """A path under the run directory ``ours`` (or ``ours`` itself) moved under ``theirs``;
    any other string as it is."""
    def tr(s: str) -> str:
        if s == ours or s.startswith(ours + os.sep):
            return theirs + s[len(ours):]
        return s
    return tr


def translate(obj: Any, tr: Callable[[str], str]) -> Any:
    """``obj`` (a stage's key fields: dicts, lists, tuples, strings, paths, numbers) with
    :func:`translator`'s ``tr`` applied to every string and path in it."""
    if isinstance(obj, str):
        return tr(obj)
    if isinstance(obj, os.PathLike):
        return tr(os.fspath(obj))
    if isinstance(obj, dict):
        return {k: translate(v, tr) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [translate(v, tr) for v in obj]
    return obj


def written_paths(stage: Stage) -> list[str]:
    """Every path ``stage`` writes: its declared outputs, its stdout file, its ``out`` /
    ``*_out`` arguments, and their companion files; never one of its inputs; a path inside
    another of the list left out (the outer one is copied whole)."""
    paths = [*stage.outputs, *([stage.stdout_to] if stage.stdout_to else [])]
    for f in dataclasses.fields(stage.call):
        if f.name == "out" or f.name.endswith("_out"):
            v = getattr(stage.call, f.name)
            if isinstance(v, (str, os.PathLike)) and os.fspath(v) not in ("", "-"):
                paths.append(os.fspath(v))
    paths += [c for p in list(paths) for c in companion_files(p)]
    inputs = set(stage.inputs)
    paths = [p for p in dict.fromkeys(paths) if p not in inputs]
    return [p for p in paths if not any(p.startswith(q + os.sep) for q in paths if q != p)]


def read_marker(path: Path) -> dict:
    """A stage marker as a dict ({} when missing, unreadable or not an object)."""
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def copy_in(src: Path, dst: Path) -> None:
    """Copy the lender's file or directory ``src`` to ``dst``, replacing what is there: a file
    through popri's atomic writer, a directory as every directory output is written -- into a
    staging directory next to ``dst``, then swapped into place (:mod:`popri.core.outdir`:
    :func:`~popri.core.outdir.staging_dir` sweeps what a killed copy left)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not src.is_dir():
        if dst.is_dir() and not dst.is_symlink():
            shutil.rmtree(dst)
        with open(src, "rb") as fin, atomic_write(dst, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
        return
    tmp = outdir.staging_dir(dst)
    try:
        shutil.copytree(src, tmp, symlinks=True, dirs_exist_ok=True)
        outdir.swap(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
