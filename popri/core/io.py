"""File formats the stages exchange, and atomic writes.

Formats (see ``docs/formats.md`` for the full reference):

- **Text samples**: JSONL, one object per line with at least ``id`` and ``text``.
- **Federated dataset**: a directory with ``train.jsonl``/``val.jsonl``/``test.jsonl``
  (records ``{"client_id", "text", ...}``) and ``manifest.json``.
- **Embedding set**: ``NAME.npy`` (float32, ``[N, d]``) + row-aligned sidecar ``NAME.jsonl``
  (``id``; ``client_id`` for private data) + optional ``NAME.meta.json`` (model, normalisation).
  On a pipe an embedding set travels as JSONL whose rows carry an ``embedding`` list.
- **Score vector**: ``NAME.npy`` + ``NAME.json`` sidecar (ids in order, mode, parameters, ledger).

``-`` means stdin / stdout everywhere; stdout carries data only.

Every writer here goes through :func:`atomic_write` / :class:`AtomicOutputs`: data is written
to a temporary file in the destination directory and renamed into place only when the whole
output is complete, so a failed or killed stage never leaves a half file and never clobbers
an earlier good one.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import io
import json
import math
import os
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Sequence

import numpy as np

from popri.core import provenance
from popri.core.errors import InputError

STDIO = "-"


# --------------------------------------------------------------------------- atomic writes
# Every temporary file this process made and has neither renamed into place nor removed:
# path -> the pid that made it.  A name is entered *before* the file is created, so a signal
# (SIGTERM/SIGHUP become KeyboardInterrupt in popri.cli.process) that lands anywhere -- inside
# the creation, or between it and the caller's ``try`` -- cannot leave an untracked file: the
# sweep at exit removes what no ``with`` block cleaned up (CI saw one such file, 2026-11-30).
_LIVE_TMP: dict[str, int] = {}


def sweep_temporaries() -> None:
    """Remove the temporary files this process made and never committed (at exit: atexit;
    zygote children run atexit too).  A forked child forgets its parent's."""
    pid = os.getpid()
    for name, owner in list(_LIVE_TMP.items()):
        if owner == pid:
            with contextlib.suppress(OSError):
                os.unlink(name)
        _LIVE_TMP.pop(name, None)


atexit.register(sweep_temporaries)


def _forget_tmp(tmp: Path) -> None:
    _LIVE_TMP.pop(str(tmp), None)


def _tmp_in(dest: Path, suffix: str = "") -> Path:
    """Create ``.NAME.xxxxxxxx.tmp[SUFFIX]`` next to ``dest`` (mode 0666 less the umask, as
    any output), registered for the exit sweep before it exists."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            tmp = dest.parent / f".{dest.name}.{secrets.token_hex(4)}.tmp{suffix}"
            _LIVE_TMP[str(tmp)] = os.getpid()
            try:
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                             0o666)
            except FileExistsError:  # another writer's name: not ours to sweep
                _forget_tmp(tmp)
                continue
            except OSError:  # nothing was created (read-only directory, ...)
                _forget_tmp(tmp)
                raise
            # (an interrupt raised as os.open returns may come after the file was made: the
            # name stays registered, and the sweep removes it)
            os.close(fd)
            return tmp
        raise FileExistsError(errno.EEXIST, "no unused temporary name", str(dest.parent))
    except OSError as e:  # read-only directory, no permission, ...: name the output
        annotate_write_error(e, dest)
        raise


def is_special_file(path: str | os.PathLike) -> bool:
    """An existing destination that is not a regular file or directory: a device (/dev/null,
    /dev/full), a FIFO, a socket, or a name under /dev or /proc (/dev/stdout).  Such a file is
    written in place; renaming a temporary file over it would replace the device node."""
    import stat

    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError:
        return False
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        return True
    real = os.path.realpath(p)
    return any(x.startswith(("/dev/", "/proc/")) for x in (os.path.abspath(p), real))


def annotate_write_error(e: BaseException, dest: str | os.PathLike) -> None:
    """Make an OSError raised while writing ``dest`` name it (numpy's short write, "N requested
    and M written", names no file and no errno: on a full disk it becomes ENOSPC)."""
    if not isinstance(e, OSError):
        return
    if e.filename is None:
        try:
            e.filename = os.fspath(dest)
        except (AttributeError, TypeError):
            return
    if e.errno is None:
        import errno

        try:
            st = os.statvfs(os.path.dirname(os.path.abspath(os.fspath(dest))) or ".")
            full = st.f_bavail * st.f_frsize < (1 << 20)
        except OSError:
            full = False
        if full:
            e.errno, e.strerror = errno.ENOSPC, os.strerror(errno.ENOSPC)


#: what libraries that write files say instead of raising an OSError (safetensors'
#: SafetensorError "... (os error 28)", torch's RuntimeError "PytorchStreamWriter failed
#: writing file ...: file write failed"), mapped to the errno they stand for
_LIBRARY_WRITE_ERRORS = (("no space left on device", "ENOSPC"), ("os error 28", "ENOSPC"),
                         ("disk quota exceeded", "EDQUOT"), ("os error 122", "EDQUOT"),
                         ("read-only file system", "EROFS"), ("os error 30", "EROFS"),
                         ("file too large", "EFBIG"), ("os error 27", "EFBIG"))


def as_write_error(e: BaseException, dest: str | os.PathLike | None = None) -> OSError | None:
    """A library's failed write (not an OSError: safetensors' SafetensorError, torch's
    RuntimeError on a full disk) as the OSError it stands for, naming ``dest``; None when
    ``e`` is no such error.  torch says only "file write failed": it counts as a full disk
    when the destination's file system has less than 1 MiB left."""
    import errno as errno_mod

    if isinstance(e, OSError) or not isinstance(e, Exception):
        return None
    text = str(e).lower()
    name = next((n for pat, n in _LIBRARY_WRITE_ERRORS if pat in text), None)
    if name is None and ("file write failed" in text or "failed writing file" in text):
        try:
            where = os.path.dirname(os.path.abspath(os.fspath(dest))) if dest else "."
            st = os.statvfs(where)
            name = "ENOSPC" if st.f_bavail * st.f_frsize < (1 << 20) else "EIO"
        except OSError:
            name = "EIO"
    if name is None:
        return None
    code = getattr(errno_mod, name)
    err = OSError(code, os.strerror(code))
    if dest is not None:
        err.filename = os.fspath(dest)
    return err


@contextlib.contextmanager
def writing(dest: str | os.PathLike) -> Iterator[None]:
    """An OSError raised inside names ``dest`` (see :func:`annotate_write_error`); a library's
    failed write that is not an OSError (safetensors, torch on a full disk) becomes one
    (:func:`as_write_error`)."""
    try:
        yield
    except OSError as e:
        annotate_write_error(e, dest)
        raise
    except Exception as e:
        err = as_write_error(e, dest)
        if err is None:
            raise
        raise err from None


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temp file next to ``path``; rename it over ``path`` only on success.  A device or
    pipe (``/dev/null``, ``/dev/full``, a FIFO) is written in place instead."""
    dest = Path(path)
    enc = None if "b" in mode else "utf-8"
    if is_special_file(dest):
        try:
            with open(dest, mode, encoding=enc) as fh:
                yield fh
                fh.flush()
        except OSError as e:
            annotate_write_error(e, dest)
            raise
        return
    tmp = _tmp_in(dest)
    try:
        with open(tmp, mode, encoding=enc) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        provenance.before_commit(tmp, dest)
        os.replace(tmp, dest)
        _forget_tmp(tmp)
    except BaseException as e:
        annotate_write_error(e, dest)
        tmp.unlink(missing_ok=True)
        _forget_tmp(tmp)
        raise


class AtomicOutputs:
    """Stage several output files and commit them together.

    ``path(dest)`` returns a temporary path to write ``dest`` to; ``commit()`` renames every
    staged file into place; leaving the ``with`` block by an exception removes them all.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []

    def path(self, dest: str | os.PathLike, suffix: str = "") -> Path:
        dest = Path(dest)
        if is_special_file(dest):
            raise InputError("is a device or pipe, not a file: this output is written by renaming "
                             "a finished file into place", path=str(dest))
        # numpy appends .npy to names without it: the name has the suffix from the start (no
        # rename after creation, so a SIGTERM cannot leave an untracked temporary file there)
        tmp = _tmp_in(dest, suffix)
        self._staged.append((tmp, dest))
        return tmp

    def commit(self) -> None:
        """Rename every staged file into place, all or nothing.

        Each existing destination is first hard-linked (or copied) to a backup; if any rename
        fails, the files already moved are put back (or removed where there was none) and the
        error is raised, so a caller never sees some new files next to some old ones."""
        done: list[tuple[Path, Path | None]] = []  # (dest, backup or None if it was new)
        try:
            for tmp, dest in self._staged:
                backup = None
                if dest.is_file() and not dest.is_symlink():
                    backup = dest.with_name(f".{dest.name}.{os.getpid()}.bak")
                    backup.unlink(missing_ok=True)
                    try:
                        os.link(dest, backup)
                    except OSError:
                        import shutil

                        shutil.copy2(dest, backup)
                provenance.before_commit(tmp, dest)
                os.replace(tmp, dest)
                _forget_tmp(tmp)
                done.append((dest, backup))
        except BaseException:
            for dest, backup in reversed(done):
                try:
                    if backup is not None:
                        os.replace(backup, dest)
                    else:
                        dest.unlink(missing_ok=True)
                except OSError:
                    pass
            for tmp, _ in self._staged:
                tmp.unlink(missing_ok=True)
                _forget_tmp(tmp)
            self._staged.clear()
            raise
        for _, backup in done:
            if backup is not None:
                backup.unlink(missing_ok=True)
        self._staged.clear()

    def staged(self) -> list[tuple[Path, Path]]:
        """(temporary path, destination) of every staged file."""
        return list(self._staged)

    def discard(self) -> None:
        for tmp, _ in self._staged:
            tmp.unlink(missing_ok=True)
            _forget_tmp(tmp)
        self._staged.clear()

    def __enter__(self) -> "AtomicOutputs":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            if self._staged:  # most likely the file being written when it failed
                annotate_write_error(exc, self._staged[-1][1])
            self.discard()


def open_memmap(path: str | os.PathLike, dtype, shape: tuple[int, ...]) -> np.ndarray:
    """``np.lib.format.open_memmap(path, "w+")`` with the file's blocks allocated up front: a
    sparse mapped file on a full disk kills the process with SIGBUS on the first page written
    (temporary file left, no message); here it is an ENOSPC OSError naming ``path``."""
    import errno

    arr = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    try:
        with open(path, "r+b") as fh:
            os.posix_fallocate(fh.fileno(), 0, os.fstat(fh.fileno()).st_size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", -1)):
            return arr  # the filesystem cannot preallocate: as numpy does
        del arr
        annotate_write_error(e, path)
        raise
    except AttributeError:  # no posix_fallocate on this platform
        pass
    return arr




# --------------------------------------------------------------------------- JSON / JSONL
def dumps(obj: Any) -> str:
    """Deterministic one-line JSON (field order kept, UTF-8 kept, NaN refused)."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


def _open_in(path: str | os.PathLike) -> IO[str]:
    if str(path) == STDIO:
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8")
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path=str(path))
    if p.is_dir():
        raise InputError("is a directory, expected a file", path=str(path))
    return open(p, "r", encoding="utf-8")


#: the longest JSONL line read (bytes, newline excluded); POPRI_MAX_LINE_BYTES overrides it.  A
#: line is read at most this far, so one runaway line (a 50 MB text, a file without newlines)
#: neither fills memory nor reaches a tokenizer.
MAX_LINE_BYTES = 16 << 20


def max_line_bytes() -> int:
    raw = os.environ.get("POPRI_MAX_LINE_BYTES")
    if raw is None or raw.strip() == "":
        return MAX_LINE_BYTES
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise InputError(f"must be a positive integer (got {raw!r})", field="POPRI_MAX_LINE_BYTES")
    return n


def _open_in_bytes(path: str | os.PathLike) -> IO[bytes]:
    if str(path) == STDIO:
        return sys.stdin.buffer
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path=str(path))
    if p.is_dir():
        raise InputError("is a directory, expected a file", path=str(path))
    return open(p, "rb")


def parse_json(text: str | bytes, path: str | os.PathLike | None = None,
               line: int | None = None) -> Any:
    """``json.loads`` with every failure an :class:`InputError` at ``path:line``: malformed
    JSON, or nesting too deep for the parser (RecursionError).  NaN / Infinity literals are
    read (as Python's json does); the readers of each field refuse them with its name."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON: {e.msg} (column {e.colno})",
                         path=None if path is None else str(path),
                         line=line if line is not None else e.lineno) from None
    except RecursionError:
        raise InputError("JSON nested too deeply", path=None if path is None else str(path),
                         line=line) from None


def iter_jsonl(path: str | os.PathLike, required: Sequence[str] = (),
               locate: bool = False) -> Iterator[dict]:
    """Yield the objects of a JSONL file (``-`` = stdin), validating ``required`` fields.

    Blank lines are skipped.  Any malformed line raises :class:`InputError` naming the file,
    the line number and the field; so does a line longer than :func:`max_line_bytes` (read no
    further than that).  ``locate=True`` adds ``_path`` / ``_line`` to each object so later
    checks can name where a record came from.
    """
    cap = max_line_bytes()
    fh = _open_in_bytes(path)
    close = str(path) != STDIO
    try:
        lineno = 0
        while True:
            raw = fh.readline(cap + 1)
            if not raw:
                break
            lineno += 1
            if len(raw) > cap and not raw.endswith(b"\n"):
                raise InputError(f"line longer than {cap} bytes (the limit; set "
                                 "POPRI_MAX_LINE_BYTES to raise it)", path=str(path), line=lineno)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"not UTF-8 text ({e.reason})", path=str(path),
                                 line=lineno) from None
            if not line.strip():
                continue
            obj = parse_json(line, path, lineno)
            if not isinstance(obj, dict):
                raise InputError("expected a JSON object", path=str(path), line=lineno)
            for f in required:
                if f not in obj or obj[f] is None:
                    raise InputError("missing required field", path=str(path), line=lineno, field=f)
            if "text" in required and not isinstance(obj["text"], str):
                raise InputError("must be a string", path=str(path), line=lineno, field="text")
            if locate:
                obj["_path"], obj["_line"] = str(path), lineno
            yield obj
    finally:
        if close:
            fh.close()


def read_jsonl(path: str | os.PathLike, required: Sequence[str] = ()) -> list[dict]:
    return list(iter_jsonl(path, required))


def write_jsonl(records: Iterable[dict], path: str | os.PathLike) -> int:
    """Write records as JSONL to ``path`` atomically, or to stdout when ``path`` is ``-``."""
    n = 0
    if str(path) == STDIO:
        out = sys.stdout
        for r in records:
            out.write(dumps(r) + "\n")
            n += 1
        out.flush()
        return n
    with atomic_write(path) as fh:
        for r in records:
            fh.write(dumps(r) + "\n")
            n += 1
    return n


def write_json(obj: Any, path: str | os.PathLike, indent: int | None = 2) -> None:
    if str(path) == STDIO:
        sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=indent) + "\n")
        sys.stdout.flush()
        return
    with atomic_write(path) as fh:
        fh.write(json.dumps(obj, ensure_ascii=False, indent=indent) + "\n")


def read_json(path: str | os.PathLike, expect: type | None = None) -> Any:
    """A JSON file; every failure (missing, not UTF-8, malformed, nested too deeply, larger than
    :func:`max_line_bytes` x 16, 256 MiB by default) an :class:`InputError` naming it.
    ``expect=dict`` (or list) also refuses any other top-level type."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path=str(path))
    if p.is_dir():
        raise InputError("is a directory, expected a JSON file", path=str(path))
    cap = 16 * max_line_bytes()
    with open(p, "rb") as fh:
        raw = fh.read(cap + 1)
    if len(raw) > cap:
        raise InputError(f"larger than {cap} bytes (the limit: 16 x POPRI_MAX_LINE_BYTES)",
                         path=str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text ({e.reason})", path=str(path)) from None
    obj = parse_json(text, path)
    if expect is not None and not isinstance(obj, expect):
        want = {dict: "a JSON object", list: "a JSON list"}.get(expect, expect.__name__)
        raise InputError(f"expected {want}, got {type(obj).__name__ if obj is not None else 'null'}"
                         .replace("got dict", "got an object").replace("got list", "got a list")
                         .replace("got str", "got a string"), path=str(path))
    return obj


# --------------------------------------------------------------------------- lenient readers
# For a report of a run that may be partial, older or damaged (popri report): what could not be
# read becomes a note, never an exception.


def read_json_lenient(p: Path, notes: list[str] | None = None) -> Any:
    """A JSON file's value; None when missing or unreadable (with a note in ``notes``): for a
    report of a partial or damaged run, where :func:`read_json` would stop it."""
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        if notes is not None:
            notes.append(f"{p}: unreadable ({type(e).__name__}), ignored")
        return None


def read_jsonl_lenient(p: Path, notes: list[str] | None = None,
                       limit: int | None = None) -> list[dict]:
    """The object rows of a JSONL file (at most ``limit``); unreadable lines skipped, counted in a
    note (:func:`iter_jsonl` refuses the whole file instead)."""
    rows: list[dict] = []
    if not p.is_file():
        return rows
    bad = 0
    try:
        fh = open(p, encoding="utf-8", errors="replace")
    except OSError:
        if notes is not None:
            notes.append(f"{p}: unreadable, ignored")
        return rows
    with fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except (ValueError, RecursionError):
                bad += 1
                continue
            if isinstance(r, dict):
                rows.append(r)
                if limit is not None and len(rows) >= limit:
                    break
            else:
                bad += 1
    if bad and notes is not None:
        notes.append(f"{p}: {bad} unreadable line(s) ignored (a file still being written?)")
    return rows


# --------------------------------------------------------------------------- embedding sets
@dataclass
class EmbeddingSet:
    """Row-aligned embeddings + metadata rows (``id``, maybe ``client_id``, maybe ``text``)."""

    embeddings: np.ndarray  # float32 [N, d]
    rows: list[dict]
    meta: dict = field(default_factory=dict)
    source: str = ""

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    @property
    def ids(self) -> list[str]:
        return [str(r["id"]) for r in self.rows]

    def client_ids(self) -> list[str]:
        out = []
        for i, r in enumerate(self.rows):
            if "client_id" not in r or r["client_id"] is None:
                raise InputError("missing required field (private data needs client ids)",
                                 path=sidecar_path(self.source) if self.source.endswith(".npy")
                                 else self.source, line=i + 1, field="client_id")
            out.append(str(r["client_id"]))
        return out


# companion-file names live in one place (popri.core.artifacts); re-exported for the readers here
from popri.core.artifacts import meta_path, sidecar_path  # noqa: E402


def check_finite(emb: np.ndarray, path: str, what: str = "embedding") -> None:
    bad = ~np.isfinite(emb)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise InputError(f"{what} row {row + 1} contains NaN or infinity", path=path,
                         line=row + 1, field=what)


def load_embedding_set(path: str | os.PathLike, mmap: bool = False) -> EmbeddingSet:
    """Load ``NAME.npy`` + ``NAME.jsonl`` (+ optional ``NAME.meta.json``)."""
    path = str(path)
    if not Path(path).exists():
        raise InputError("no such file", path=path)
    side = sidecar_path(path)
    if not Path(side).exists():
        raise InputError(f"missing sidecar {side} (row-aligned JSONL with 'id' per row)", path=path)
    emb = load_npy(path, mmap=mmap)
    if emb.ndim != 2:
        raise InputError(f"expected a 2-D array [N, d], got shape {tuple(emb.shape)}", path=path)
    if not np.issubdtype(emb.dtype, np.floating):
        raise InputError(f"expected float embeddings, got dtype {emb.dtype}", path=path)
    rows = read_jsonl(side, required=("id",))
    if len(rows) != emb.shape[0]:
        raise InputError(f"sidecar has {len(rows)} rows but {path} has {emb.shape[0]}", path=side)
    if not mmap:
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        check_finite(emb, path)
    meta = read_json(meta_path(path), expect=dict) if Path(meta_path(path)).exists() else {}
    for k, kind in (("model", str), ("model_path", str), ("normalize", bool)):
        if meta.get(k) is not None and not isinstance(meta[k], kind):
            raise InputError(f"must be a {'string' if kind is str else 'boolean'} (got "
                             f"{type(meta[k]).__name__})", path=meta_path(path), field=k)
    return EmbeddingSet(emb, rows, meta, source=path)


_NPY_MAGIC = b"\x93NUMPY"  # numpy.lib.format.MAGIC_PREFIX
_ZIP_MAGIC = b"PK\x03\x04"  # np.savez's zip archive (refused below, by name)


def _npy_head(path: str) -> bytes | None:
    """The first 64 bytes of the regular file ``path``; None for anything else (a pipe, a
    device, a missing file: np.load says what is wrong, and a pipe's bytes are not consumed)."""
    try:
        if not Path(path).is_file():
            return None
        with open(path, "rb") as fh:
            return fh.read(64)
    except OSError:
        return None


def _texty(head: bytes) -> bool:
    """``head`` reads as UTF-8 text (a character cut at its end allowed)."""
    try:
        s = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:
            return False
        s = head[:e.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\r\n" for c in s)


def load_npy(path: str | os.PathLike, mmap: bool = False) -> np.ndarray:
    """One ``.npy`` array (no pickles); anything else -- a zip archive (``np.savez``) named
    ``.npy``, a pickle, text -- is an :class:`InputError` naming the file.  A regular file is
    told by its first bytes (the format's magic string, numpy.lib.format.MAGIC_PREFIX):
    numpy's own message for a file without it is about pickles (allow_pickle=False)."""
    path = str(path)
    head = _npy_head(path)
    if head is not None and not head.startswith((_NPY_MAGIC, _ZIP_MAGIC)):
        what = ("it is empty" if not head else "it is a Python pickle" if head[:1] == b"\x80"
                else "it holds text" if _texty(head) else "it lacks the .npy header")
        raise InputError(f"not a .npy file: {what} (a .npy file starts with \\x93NUMPY, as "
                         "np.save writes it)", path=path)
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise InputError(f"not a .npy array: {e}", path=path) from None
    if not isinstance(arr, np.ndarray):  # np.load opens a zip (.npz) whatever its name
        close = getattr(arr, "close", None)
        if close is not None:
            close()
        raise InputError("is a zip archive (.npz, from np.savez), not a .npy array", path=path)
    if arr.dtype.fields is not None or arr.dtype.kind not in "biufc":
        raise InputError(f"expected a numeric array, got dtype {arr.dtype}", path=path)
    return arr


def save_embedding_set(path: str | os.PathLike, emb: np.ndarray, rows: Sequence[dict],
                       meta: dict | None = None, out: AtomicOutputs | None = None) -> None:
    """Write the three files of an embedding set atomically (all or nothing); with ``out`` only
    stage them (committed with the caller's other outputs)."""
    path = str(path)
    if not path.endswith(".npy"):
        raise InputError("embedding set output must end in .npy", path=path)
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    if emb.shape[0] != len(rows):
        raise ValueError("rows and embeddings differ in length")
    with (contextlib.nullcontext(out) if out is not None else AtomicOutputs()) as out:
        with writing(path):
            np.save(out.path(path, suffix=".npy"), emb, allow_pickle=False)
        with writing(sidecar_path(path)), \
                open(out.path(sidecar_path(path)), "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(dumps(r) + "\n")
        if meta is not None:
            m = dict(meta)
            m.update({"count": int(emb.shape[0]), "dim": int(emb.shape[1]) if emb.ndim == 2 else 0,
                      "dtype": "float32"})
            with writing(meta_path(path)), \
                    open(out.path(meta_path(path)), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(m, ensure_ascii=False, indent=2) + "\n")


def embedding_rows_to_set(records: list[dict], path: str) -> EmbeddingSet:
    """Build an embedding set from JSONL rows that carry an ``embedding`` list (pipe format)."""
    vecs = []
    dim = None
    rows = []
    model = None
    for i, r in enumerate(records, start=1):
        v = r.get("embedding")
        if not isinstance(v, list) or not v:
            raise InputError("expected a non-empty list of numbers", path=path, line=i, field="embedding")
        if dim is None:
            dim = len(v)
        elif len(v) != dim:
            raise InputError(f"embedding has dimension {len(v)}, earlier rows have {dim}",
                             path=path, line=i, field="embedding")
        bad = next((x for x in v if isinstance(x, bool) or not isinstance(x, (int, float))), None)
        if bad is not None or any(isinstance(x, bool) for x in v):
            got = "a nested list" if isinstance(bad, list) else type(bad).__name__
            raise InputError(f"expected a flat list of numbers (found {got})", path=path, line=i,
                             field="embedding")
        try:
            arr = np.asarray(v, dtype=np.float32)
        except (TypeError, ValueError, OverflowError):
            raise InputError("expected a list of numbers", path=path, line=i, field="embedding") from None
        if not np.isfinite(arr).all():
            raise InputError("contains NaN or infinity", path=path, line=i, field="embedding")
        vecs.append(arr)
        em = r.get("embedding_model")
        if em is not None and not isinstance(em, str):
            raise InputError("must be a string", path=path, line=i, field="embedding_model")
        model = r.get("embedding_model", model)
        rows.append({k: val for k, val in r.items() if k not in ("embedding", "embedding_model")})
    emb = np.stack(vecs) if vecs else np.zeros((0, 0), dtype=np.float32)
    meta = {"model": model} if model else {}
    return EmbeddingSet(emb, rows, meta, source=path)


def is_embedding_path(path: str | os.PathLike) -> bool:
    return str(path).endswith(".npy")


# --------------------------------------------------------------------------- score vectors
from popri.core.artifacts import json_sidecar as score_sidecar_path  # noqa: E402


def save_scores(path: str | os.PathLike, scores: np.ndarray, sidecar: dict,
                out: AtomicOutputs | None = None) -> None:
    """Write ``scores`` (.npy) and its ``.json`` sidecar; with ``out`` only stage them."""
    path = str(path)
    if not path.endswith(".npy"):
        raise InputError("score output must end in .npy", path=path)
    own = out is None
    out = out or AtomicOutputs()
    try:
        with writing(path):
            np.save(out.path(path, suffix=".npy"), np.asarray(scores), allow_pickle=False)
        with writing(score_sidecar_path(path)), \
                open(out.path(score_sidecar_path(path)), "w", encoding="utf-8") as fh:
            fh.write(json.dumps(sidecar, ensure_ascii=False, indent=2, allow_nan=False) + "\n")
    except BaseException:
        if own:  # a caller's AtomicOutputs discards its own staged files
            out.discard()
        raise
    if own:
        out.commit()


def load_scores(path: str | os.PathLike) -> tuple[np.ndarray, dict]:
    path = str(path)
    if not Path(path).exists():
        raise InputError("no such file", path=path)
    side = score_sidecar_path(path)
    if not Path(side).exists():
        raise InputError(f"missing sidecar {side}", path=path)
    arr = load_npy(path)
    meta = read_json(side, expect=dict)
    check_score_sidecar(meta, side)
    return arr, meta


def check_score_sidecar(meta: dict, side: str) -> None:
    """The JSON types of a score sidecar's fields (each optional): ``ids`` a list of strings or
    integers, ``params`` an object, ``ledger`` a list of objects, ``mode`` a string, ``round``
    an integer."""
    ids = meta.get("ids")
    if ids is not None:
        if not isinstance(ids, list):
            raise InputError("must be a list", path=side, field="ids")
        for i, x in enumerate(ids):
            if isinstance(x, bool) or not isinstance(x, (str, int)):
                raise InputError(f"item {i + 1} must be a string or an integer (got "
                                 f"{type(x).__name__})", path=side, field="ids")
    for k, kind, what in (("params", dict, "an object"), ("ledger", list, "a list"),
                          ("mode", str, "a string"), ("kind", str, "a string")):
        if meta.get(k) is not None and not isinstance(meta[k], kind):
            raise InputError(f"must be {what} (got {type(meta[k]).__name__})", path=side, field=k)
    if any(not isinstance(e, dict) for e in meta.get("ledger") or []):
        raise InputError("every entry must be an object", path=side, field="ledger")
    r = meta.get("round")
    if r is not None and (isinstance(r, bool) or not isinstance(r, int)):
        raise InputError(f"must be an integer (got {type(r).__name__})", path=side, field="round")


def finite_or_none(x: float) -> float | None:
    return None if (x is None or (isinstance(x, float) and not math.isfinite(x))) else x
