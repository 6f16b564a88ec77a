"""One guard against a command overwriting its own inputs (or one output another).

Every command that writes files calls :func:`check_outputs` first, before it reads or writes
anything, with every path it will write and every path it will read.  A clash is an
:class:`~popri.core.errors.InputError` with one wording everywhere::

    popri: error: OUT: output would overwrite input IN; choose another name

What counts as written / read besides the paths themselves:

- **Companion files** written next to an output: an embedding set ``NAME.npy`` also writes
  ``NAME.jsonl`` and ``NAME.meta.json`` (:func:`io.sidecar_path`, :func:`io.meta_path`), a
  score vector ``NAME.npy`` writes ``NAME.json`` (:func:`artifacts.json_sidecar`), FreD
  statistics ``NAME.npz`` write ``NAME.json`` (:func:`fred.sidecar_path`).  The
  ``ledger.jsonl`` next to a DP stage's output is appended to, never overwritten: not counted.
- **Companion files** next to an input ``NAME.npy`` (``.jsonl``, ``.meta.json``, ``.json``) or
  ``NAME.npz`` (``.json``) that exist: a missing one cannot be overwritten, and an input's
  format is not known here (``fred stats --private e.npy --out e.npz`` may write ``e.json``).
- A **directory input** (a federated dataset, a checkpoint): ``train.jsonl``, ``val.jsonl``,
  ``test.jsonl`` and ``manifest.json`` in it (whether they exist or not: an output there would
  add a split to the dataset) and every file directly inside it (``--split NAME`` reads any
  ``NAME.jsonl``); an output that *is* the directory clashes as well.

Two paths are the same file when :func:`os.path.samefile` says so (both exist: symlinks and hard
links are caught), otherwise when their resolved paths are equal.  Temporary names need no
check: they are created with ``O_EXCL`` (popri.core.io), which never opens an existing file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable, Literal

from popri.core.artifacts import json_sidecar
from popri.core.errors import InputError
from popri.core.io import STDIO, meta_path, sidecar_path

#: what a file output is named (an existing directory of such a name is refused)
FILE_SUFFIXES = (".npy", ".npz", ".jsonl", ".json", ".md", ".csv", ".txt", ".tsv")
#: the files a reader takes from a federated dataset directory (besides ``--split NAME.jsonl``)
DATASET_FILES = ("train.jsonl", "val.jsonl", "test.jsonl", "manifest.json")


def _given(paths: Iterable[str | os.PathLike | None]) -> list[str]:
    """The real paths of ``paths``: None, '' and '-' (stdin / stdout) dropped."""
    return [os.fspath(p) for p in paths if p is not None and os.fspath(p) not in ("", STDIO)]


def companion_files(path: str, kind: bool | str = True) -> list[str]:
    """The files written (or read) next to ``path`` by the embedding-set, score-vector and
    FreD-statistics formats.  ``kind``: True = every format the suffix allows, False = none,
    ``"embeddings"`` / ``"scores"`` = that format's companions of a ``.npy`` only."""
    if kind is False:
        return []
    if path.endswith(".npy"):
        out = []
        if kind in (True, "embeddings"):
            out += [sidecar_path(path), meta_path(path)]
        if kind in (True, "scores"):
            out.append(json_sidecar(path))
        return out
    if path.endswith(".npz"):
        return [json_sidecar(path)]
    return []


def _read_files(path: str) -> list[str]:
    """``path`` and every file a reader may take with it (companions; a directory's files)."""
    files = [path, *(f for f in companion_files(path) if os.path.lexists(f))]
    p = Path(path)
    if p.is_dir():
        names: set[str] = set(DATASET_FILES)
        try:
            names.update(f.name for f in p.iterdir() if f.is_file())
        except OSError:
            pass
        files += [str(p / n) for n in sorted(names)]
    return files


def _key(path: str):
    """What :func:`os.path.samefile` compares (device, inode) when ``path`` exists; otherwise
    the resolved path (symlinked parent directories followed)."""
    try:
        st = os.stat(path)
        return ("inode", st.st_dev, st.st_ino)
    except (OSError, ValueError):
        pass
    try:
        return ("path", str(Path(path).resolve()))
    except (OSError, RuntimeError, ValueError):
        return ("path", os.path.abspath(path))


def check_one_stdin(**inputs: str | os.PathLike | None) -> None:
    """Refuse two inputs given as '-' (hostile case B07, issue 66): standard input can be read
    only once, so the second would read nothing; the error names both options."""
    dash = [name.replace("_", "-") for name, v in inputs.items() if v is not None
            and str(v) == "-"]
    if len(dash) > 1:
        opts = [f"--{d}" for d in dash]
        said = (" and ".join(opts) + " are both" if len(opts) == 2
                else ", ".join(opts) + " are all")
        raise InputError(f"only one input can be '-' (standard input is read once): {said} "
                         f"'-'; give the others as files", field=dash[1])


def check_outputs(outputs: Iterable[str | os.PathLike | None],
                  inputs: Iterable[str | os.PathLike | None], *,
                  companions: bool | Literal["embeddings", "scores"] = True) -> None:
    """Refuse to run a command whose outputs would overwrite one of its inputs or each other.

    ``outputs``: every path the command writes (None and '-' are ignored); each also stands for
    its companion files (``companions=True``: those of every format its suffix allows;
    ``"embeddings"`` or ``"scores"``: only that format's, for a ``.npy``; False: none).
    ``inputs``: every path the command reads, with its existing companion files and, for a
    directory, the files in it (see the module docstring).

    Raises :class:`InputError` ``output would overwrite input IN; choose another name`` (or
    ``... another output OTHER ...``) with ``path`` = the output as given.  Nothing is read or
    written: call it first.
    """
    outs = _given(outputs)
    for out in outs:  # a file output named like a file that is a directory: refuse it now,
        # before any work (and before a ledger is put "next to" it, i.e. inside it)
        if Path(out).suffix.lower() in FILE_SUFFIXES and Path(out).is_dir():
            raise InputError("is a directory; give a file name", path=out)
    read: dict = {}
    for inp in _given(inputs):
        for f in _read_files(inp):
            read.setdefault(_key(f), f)
    written: dict = {}  # key -> (index of the output, file)
    for i, out in enumerate(outs):
        files = [out, *companion_files(out, companions)]
        keys = [_key(f) for f in files]
        for k in keys:
            if k in read:
                raise InputError(f"output would overwrite input {read[k]}; choose another name",
                                 path=out)
        for k in keys:
            other = written.get(k)
            if other is not None and other[0] != i:
                raise InputError(f"output would overwrite another output {other[1]}; choose "
                                 "another name", path=out)
        for f, k in zip(files, keys):
            written.setdefault(k, (i, f))
        # a companion already there without its output beside it was not written with it:
        # a user's file of that name (hostile case D02, issue 66: `embed other.jsonl --out
        # victim.npy` replaced the user's victim.jsonl with the set's row sidecar)
        if not os.path.lexists(out):
            for f in files[1:]:
                if os.path.lexists(f):
                    raise InputError(f"would overwrite {f}, which popri did not write with "
                                     f"{out} (there is no {Path(out).name} beside it): move it "
                                     "or choose another name", path=out)


def _why(where: Path) -> str:
    """The system's words for a directory popri cannot write into."""
    try:
        if os.statvfs(where).f_flag & os.ST_RDONLY:
            return "Read-only file system"
    except OSError:
        pass
    return f"Permission denied ({where} is not writable)"


#: Linux's /dev/full: every write fails with ENOSPC
_DEV_FULL = (1, 7)


def check_writable(outputs: Iterable[str | os.PathLike | None]) -> None:
    """Refuse, before any work, an output that cannot be written (hostile case I06, issue 66:
    `gen --out /dev/full` generated everything, then failed): a device that is always full,
    one opened read-only, or a path whose nearest existing directory is not writable.  Each
    error names the output; nothing is opened for writing but a device, which opening does
    not change."""
    for out in _given(outputs):
        p = Path(out)
        try:
            st = os.stat(p)
        except OSError:
            st = None
        if st is not None and not p.is_dir() and not p.is_file():
            if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) \
                    == _DEV_FULL:
                raise InputError("cannot write: No space left on device (it is always full)",
                                 path=out)
            if stat.S_ISFIFO(st.st_mode):
                continue  # opening a FIFO for writing would wait for its reader
            try:
                os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as e:
                raise InputError(f"cannot write: {e.strerror or e}", path=out) from None
            continue
        where = p if st is not None and p.is_dir() else p.parent
        while not where.exists() and where != where.parent:
            where = where.parent
        if where.is_dir() and not os.access(where, os.W_OK | os.X_OK):
            raise InputError(f"cannot write: {_why(where)}", path=out)
