"""Atomic writes: every file popri writes goes to a temporary file in its destination directory
and is renamed into place only when complete (:func:`atomic_write`, :class:`AtomicOutputs` for a
stage's several outputs, :func:`open_memmap` for a large array), so a failed or killed stage
never leaves a half file nor clobbers an earlier good one; write errors (a full disk, a
read-only directory) become one line naming the file (:func:`as_write_error`).

    python -c "from popri.core.atomic import atomic_write; f = atomic_write('x.txt').__enter__(); f.write('hi')"
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import secrets
from pathlib import Path
from typing import IO, Iterator

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
