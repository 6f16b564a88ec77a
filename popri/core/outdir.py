"""One rule for every directory a command writes (``--out DIR``): what may be replaced, and how.

    popri fl round --data runs/x/data/private --round 1 -z 1 -L 8 --out runs/x/fl/round1
    python -m pytest -q tests/test_outdir.py

A directory output (a DP-FL round, a FewFedPIT weights directory, a downstream model, a
training run directory) is written into a staging directory ``.NAME.tmpPID`` next to it
(:func:`staging_dir`) and moved into place in one step (:func:`replace`).  Before a command
reads anything, :func:`check` refuses an output

- named ``-`` or ``''`` (``-`` is stdout elsewhere; a directory has no stdout);
- that exists and is not a directory (a user's file, a device such as ``/dev/full``, a FIFO) or
  is a symbolic link;
- that is, or contains, one of the command's inputs (replacing it would delete them);
- that contains a privacy ledger (``ledger.jsonl`` anywhere inside it): replacing it would
  lose recorded releases and ``popri account`` would under-count;
- that is a non-empty directory popri did not write: ours are the directories holding the
  marker file :data:`MARKER` (written into every directory :func:`replace` commits) or, for
  directories written before the marker existed (popri <= 0.2.0), the files the command always
  writes (``legacy``).  ``force=True`` (a command's ``--force``) takes a non-empty foreign
  directory; nothing takes a file, a device, a link, an input or a ledger.

:func:`replace` checks ownership again at the moment of the swap (a library caller that skipped
:func:`check` still cannot delete a foreign directory) and swaps the staging directory and the
old output: on Linux with ``renameat2(RENAME_EXCHANGE)`` (one atomic step; the old output then
sits in the staging name and is removed), elsewhere by two renames through ``.NAME.oldPID``.
A process killed at any point leaves the old output or the new one: :func:`sweep` (run by
:func:`check` and :func:`staging_dir`, so by every rerun) removes the staging directories of
dead processes and moves a ``.NAME.oldPID`` back into place when ``NAME`` is missing.
"""

from __future__ import annotations

import ctypes
import filecmp
import errno
import glob
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterable, Sequence, Union

from popri.core import log, provenance
from popri.core.errors import InputError
from popri.core.runtime import fault_point
from popri.core.version import __version__

#: the file that marks a directory as popri's own output (safe to replace)
MARKER = ".popri-output"
#: a privacy ledger: an output directory holding one is never replaced
LEDGER_NAME = "ledger.jsonl"
STDIO = "-"
#: how an output written before the marker existed is recognised: the files it always holds,
#: or a predicate on the directory
Legacy = Union[Sequence[str], Callable[[Path], bool]]


# --------------------------------------------------------------------------- ownership
def is_ours(path: str | os.PathLike, legacy: Legacy = ()) -> bool:
    """``path`` is a directory popri wrote: it holds :data:`MARKER` or passes ``legacy`` (every
    one of the files an older popri always wrote there, or a predicate)."""
    p = Path(path)
    if (p / MARKER).is_file():
        return True
    if callable(legacy):
        return bool(legacy(p))
    return bool(legacy) and all((p / f).exists() for f in legacy)


def mark(path: str | os.PathLike, kind: str) -> None:
    """Write :data:`MARKER` into the (staging) directory ``path``, with the names of the
    files popri wrote there (:func:`foreign_files` finds any other on a rerun)."""
    p = Path(path)
    files = sorted(str(f.relative_to(p)) for f in p.rglob("*")
                   if f.is_file() and f.name != MARKER)
    (p / MARKER).write_text(
        json.dumps({"format": "popri-output", "kind": kind, "popri_version": __version__,
                    "files": files}) + "\n", encoding="utf-8")


def foreign_files(path: str | os.PathLike) -> list[str]:
    """Files inside popri's output directory ``path`` that popri did not write there (hostile
    case H08, issue 66: a user's note inside a run's downstream model directory was deleted by
    the rerun that replaced it): every file not named in its marker, its marker and privacy
    provenance (written beside the output) aside.  [] for a marker that lists no files (popri
    <= 0.3.0, or a directory written in place)."""
    p = Path(path)
    try:
        files = json.loads((p / MARKER).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(files, list):
        return []
    known = set(map(str, files))
    out = []
    for f in sorted(p.rglob("*")):
        if not f.is_file() or f.name == MARKER or provenance.is_companion(f.name):
            continue
        rel = str(f.relative_to(p))
        if rel not in known:
            out.append(rel)
    return out


def carry_foreign(old: Path, new: Path) -> list[str]:
    """Move the files of :func:`foreign_files` (a user's, inside popri's output ``old``) into
    its replacement ``new`` (hard links where possible), each under its own name, so that the
    swap deletes none of them; said on stderr.  A user's file whose name the new output now
    uses is refused, not overwritten.  Returns their names."""
    extra = foreign_files(old)
    for rel in extra:
        dst = new / rel
        if dst.exists() and _same_file(old / rel, dst):
            continue  # already carried over (popri report keeps the user's files itself)
        if dst.exists():
            raise InputError(f"holds {rel}, which popri did not write, and the new output "
                             "writes a file of that name: move it out first", path=str(old))
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(old / rel, dst, follow_symlinks=False)
        except OSError:
            shutil.copy2(old / rel, dst, follow_symlinks=False)
    if extra:
        log.warn(f"{old}: kept {len(extra)} file(s) popri did not write there ({extra[0]}"
                 + (", ..." if len(extra) > 1 else "") + ") in the new output")
    return extra


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b) or filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def _ledger_inside(p: Path) -> Path | None:
    for root, _dirs, files in os.walk(p):
        if LEDGER_NAME in files:
            return Path(root) / LEDGER_NAME
    return None


def _resolved(path: str | os.PathLike) -> Path:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def _replaceable(p: Path, *, legacy: Legacy, force: bool | None, what: str,
                 whole: bool = True) -> None:
    """Raise unless the existing ``p`` may be replaced (``whole``) or written into (see the
    module docstring)."""
    if p.is_symlink():
        raise InputError(f"is a symbolic link; give the real directory as {what}", path=str(p))
    if not p.is_dir():
        raise InputError(f"exists and is not a directory; choose another {what}", path=str(p))
    ledger = _ledger_inside(p) if whole else None
    if ledger is not None:
        raise InputError(f"holds a privacy ledger ({ledger}); replacing it would lose the "
                         f"releases recorded there: choose another {what}", path=str(p))
    try:
        empty = not any(p.iterdir())
    except OSError as e:
        raise InputError(f"cannot list it: {e.strerror or e}", path=str(p)) from None
    if not empty and not force and not is_ours(p, legacy):
        raise InputError(f"directory is not empty and was not written by popri (no {MARKER}); "
                         f"choose another {what}" + (" or pass --force" if force is not None
                                                     else ""), path=str(p))


def check(out: str | os.PathLike, *, inputs: Iterable[str | os.PathLike | None] = (),
          legacy: Legacy = (), force: bool | None = None, what: str = "--out",
          whole: bool = True) -> Path:
    """Refuse a directory output that popri must not replace (module docstring); sweep the
    leftovers of killed attempts.  ``inputs``: every path the command reads (None and '-'
    skipped); ``force``: the command's ``--force`` (None: it has none); ``whole=False``: the
    command writes into the directory instead of replacing it (:func:`claim`), so a ledger
    inside it is no reason to refuse.  Nothing is written."""
    s = os.fspath(out) if out is not None else ""
    if s in ("", STDIO):
        raise InputError(f"'{s}' is not a directory name ('-' is stdout): give {what} a "
                         "directory", path=s or None, field=what)
    p = Path(s)
    where = _resolved(p)
    for inp in inputs:
        if inp is None or os.fspath(inp) in ("", STDIO):
            continue
        ip = _resolved(inp)
        if ip == where or where in ip.parents:
            raise InputError(f"output would overwrite input {inp} (it is inside {what}); choose "
                             "another name", path=s)
    sweep(p)
    if os.path.lexists(p):
        _replaceable(p, legacy=legacy, force=force, what=what, whole=whole)
    return p


def claim(out: str | os.PathLike, *, kind: str, inputs: Iterable[str | os.PathLike | None] = (),
          legacy: Legacy = (), what: str = "--out") -> Path:
    """A working directory a command writes into over time (a training run's checkpoints,
    run.json, the adapter): :func:`check` (a non-empty directory must be ours), then created
    and marked as ours, so what the command later removes there (its own stale checkpoints)
    is only ever its own."""
    p = check(out, inputs=inputs, legacy=legacy, what=what, whole=False)
    p.mkdir(parents=True, exist_ok=True)
    if not (p / MARKER).is_file():
        mark(p, kind)
    return p


# --------------------------------------------------------------------------- staging, swap
def _pid_of(name: str, tag: str) -> int | None:
    pid = name.rsplit(tag, 1)[-1]
    return int(pid) if pid.isdigit() else None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def sweep(out: str | os.PathLike) -> None:
    """Repair what killed attempts left next to ``out``: a ``.OUT.oldPID`` of a dead process is
    moved back to ``out`` if ``out`` is missing (the kill fell between two renames), else
    removed; a ``.OUT.tmpPID`` staging directory of a dead process is removed (nothing in it
    was ever committed, or it holds an old output already replaced)."""
    out = Path(out)
    parent = out.parent
    if not parent.is_dir():
        return
    name = glob.escape(out.name)
    for d in sorted(parent.glob(f".{name}.old*")):
        pid = _pid_of(d.name, ".old")
        if pid is None or _alive(pid):
            continue
        if not os.path.lexists(out):
            os.replace(d, out)
        else:
            shutil.rmtree(d, ignore_errors=True)
    for d in parent.glob(f".{name}.tmp*"):
        pid = _pid_of(d.name, ".tmp")
        if pid is None or _alive(pid):
            continue
        shutil.rmtree(d, ignore_errors=True)


def staging_dir(out: str | os.PathLike) -> Path:
    """A fresh directory ``.OUT.tmpPID`` next to ``out`` (stale ones swept) in which a
    command writes its output before :func:`replace` moves it into place."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep(out)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically (Linux renameat2 RENAME_EXCHANGE); False where the
    system or file system cannot (the caller falls back to two renames)."""
    if os.environ.get("POPRI_NO_EXCHANGE") == "1":  # test hook: the fallback path
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace(src: str | os.PathLike, dest: str | os.PathLike, *, kind: str,
            legacy: Legacy = (), force: bool | None = None) -> None:
    """Move the finished staging directory ``src`` to ``dest``, replacing an older output of
    ours there (module docstring).  Writes :data:`MARKER` into ``src`` first."""
    src, dest = Path(src), Path(dest)
    mark(src, kind)
    if os.path.isdir(dest) and not os.path.islink(dest):
        carry_foreign(dest, src)
    provenance.before_commit(src, dest)  # its provenance moves in with it
    if not os.path.lexists(dest):
        os.replace(src, dest)  # fails on a non-empty directory that appeared meanwhile
        return
    _replaceable(dest, legacy=legacy, force=force, what="the output")
    swap(src, dest)


def swap(src: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Put the directory ``src`` (a :func:`staging_dir`) in the place of ``dest`` and remove
    what was there: one atomic exchange where the system has it, else two renames through
    ``.DEST.oldPID`` (:func:`sweep` repairs a kill between them).  No ownership check and no
    marker: :func:`replace` does both first; ``popri run --reuse-from`` swaps in a stage's own
    output copied from another run, marker and all (popri.pipeline.reuse)."""
    src, dest = Path(src), Path(dest)
    if not os.path.lexists(dest):
        os.replace(src, dest)
        return
    if _exchange(src, dest):
        fault_point("after-exchange")
        shutil.rmtree(src, ignore_errors=True)  # src now holds the old output
        return
    old = dest.with_name(f".{dest.name}.old{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(dest, old)
    fault_point("between-renames")
    os.replace(src, dest)
    shutil.rmtree(old, ignore_errors=True)


class DirOutput:
    """A staged directory output as the release protocol commits it
    (:class:`popri.privacy.release.Release` ``outputs``): :func:`replace` on commit, removed on
    discard."""

    def __init__(self, dest: str | os.PathLike, *, kind: str, legacy: Legacy = ()):
        self.dest, self.kind, self.legacy = Path(dest), kind, legacy
        self.tmp = staging_dir(self.dest)

    def commit(self) -> None:
        replace(self.tmp, self.dest, kind=self.kind, legacy=self.legacy)

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
