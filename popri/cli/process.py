"""The process edges of ``popri``: what :func:`popri.cli.app.main` adds around the Typer app so
that every failure is one line on stderr and an exit code.

    popri score ... > /dev/full          # popri: error: <stdout>: cannot write: No space left ...
    popri gen ... | head -1              # a reader that went away: exit 0, no traceback
    kill -TERM <pid>                     # temporary files removed, exit 143
    python -m pytest -q tests/test_hostile.py

Closed standard streams, OSError (disk full, read-only directory, /dev/full), a closed pipe,
SIGTERM / SIGHUP, non-finite numbers in float options, a typo in POPRI_RELEASE.  The app itself
(subcommands, global options, config files) is :mod:`popri.cli.app`.
"""

from __future__ import annotations

import os
import sys
import warnings

import click
import typer

from popri.core.errors import InputError, PopriError
from popri.core.io import as_write_error
from popri.core.runtime import die_with_parent

_SIGNALLED: list[int] = []  # the terminating signal caught (SIGTERM / SIGHUP), if any
_INTERRUPTED: list[bool] = []  # run() ended on a KeyboardInterrupt (Ctrl-C, SIGTERM, SIGHUP)
_WRITE_ERRNOS = {"ENOSPC", "EDQUOT", "EFBIG", "EROFS", "EPIPE", "EIO"}
_TMP_NAME = None  # compiled lazily: the temporary names of popri.core.io (8 random characters)


class _ClosedStream:
    """Stands in for a standard stream whose descriptor was closed (``popri ... >&-``): any
    read or write raises EBADF naming it, so the command fails with one line instead of an
    AttributeError on None.  The descriptor itself is held by /dev/null, so no file opened later
    can take descriptor 0, 1 or 2 and receive stray output."""

    def __init__(self, name: str):
        self.name = f"<{name}>"
        self._what = name

    def _fail(self, *_a, **_k):
        import errno

        raise OSError(errno.EBADF, f"Bad file descriptor ({self._what} is closed)", self.name)

    read = readline = readlines = write = writelines = fileno = __iter__ = __next__ = _fail

    @property
    def buffer(self):
        self._fail()

    def flush(self) -> None:  # nothing is ever buffered
        pass

    def isatty(self) -> bool:
        return False

    def readable(self) -> bool:
        return self._what == "stdin"

    def writable(self) -> bool:
        return self._what != "stdin"

    closed = False
    encoding = "utf-8"
    errors = "strict"


def _guard_std_streams() -> None:
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if name == "stderr":  # logs have nowhere to go: drop them
            sys.stderr = open(fd, "w", encoding="utf-8", closefd=False)
        else:
            setattr(sys, name, _ClosedStream(name))


def _on_signal(signum, _frame) -> None:
    """SIGTERM / SIGHUP: unwind like Ctrl-C, so every ``atomic_write`` / ``AtomicOutputs``
    removes its temporary files; main() then exits 128 + signum."""
    if not _SIGNALLED:
        _SIGNALLED.append(signum)
    raise KeyboardInterrupt


def _install_signal_handlers() -> None:
    import signal

    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        try:
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, _on_signal)
        except (ValueError, OSError):  # not the main thread (main() called from a library)
            pass


def _display_path(path) -> str:
    """An OSError's file name as the user knows it: a temporary name of popri.core.io
    (``.NAME.xxxxxxxx.tmp[.npy]``) is shown as the output ``NAME`` it stands for."""
    global _TMP_NAME
    import re

    if _TMP_NAME is None:
        _TMP_NAME = re.compile(r"^\.(.+)\.[A-Za-z0-9_]{8}\.tmp(\.[A-Za-z0-9]+)?$")
    p = os.fsdecode(path) if not isinstance(path, str) else path
    head, tail = os.path.split(p)
    m = _TMP_NAME.match(tail)
    return os.path.join(head, m.group(1)) if m else p


def _from_stdout(e: BaseException) -> bool:
    """True when the OSError came from writing stdout (``> /dev/full``): the frame that raised
    it holds the stdout stream (``out.write``, ``sys.stdout.write``, click's echo)."""
    tb, last = e.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return False
    streams = {id(sys.stdout), id(sys.__stdout__)}
    for v in list(last.tb_frame.f_locals.values()):
        if id(v) in streams or getattr(v, "name", None) == "<stdout>":
            return True
    return False


def _quiet_stdout() -> None:
    """Point descriptor 1 at /dev/null, so the interpreter's last flush of stdout cannot fail
    again (and print 'Exception ignored ...') after the error was reported."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass


def _os_error_line(e: OSError) -> str:
    """``PATH: cannot write: No space left on device`` for an OSError nobody mapped."""
    import errno as errno_mod

    reason = e.strerror or (str(e.args[-1]) if e.args else "") or type(e).__name__
    name = errno_mod.errorcode.get(e.errno or -1, "")
    path = e.filename
    if path is None and _from_stdout(e):
        path = "<stdout>"
    where = f"{_display_path(path)}: " if path is not None else ""
    if e.filename2 is not None:
        where = f"{_display_path(path)} -> {_display_path(e.filename2)}: "
    verb = "cannot write: " if name in _WRITE_ERRNOS else ""
    return f"{where}{verb}{reason}"


def _is_epipe(e: BaseException | None) -> bool:
    import errno

    return isinstance(e, OSError) and e.errno == errno.EPIPE


def _guard_floats(command) -> None:
    """Refuse NaN and +-infinity in every float option of every subcommand (one line naming
    the option, exit 2): no option of popri means anything at a non-finite value, and they
    reached sidecars as invalid JSON or outputs as infinite scores."""
    import functools
    import math

    subs = getattr(command, "commands", None)
    if subs:
        for sub in subs.values():
            _guard_floats(sub)
        return
    cb = getattr(command, "callback", None)
    if cb is None or getattr(cb, "_popri_finite", False):
        return
    names = {}
    for p in getattr(command, "params", []):
        longs = [o for o in getattr(p, "opts", []) if o.startswith("--")]
        names[p.name] = longs[0] if longs else (p.opts[0] if getattr(p, "opts", None) else p.name)

    def bad(v) -> bool:
        if isinstance(v, float):
            return not math.isfinite(v)
        if isinstance(v, (list, tuple)):
            return any(bad(x) for x in v)
        return False

    @functools.wraps(cb)
    def checked(*args, **kwargs):
        for k, v in kwargs.items():
            if bad(v):
                raise InputError(f"must be a finite number (got {v})", field=names.get(k, k))
        return cb(*args, **kwargs)

    checked._popri_finite = True
    command.callback = checked


#: what POPRI_RELEASE may say (every --release flag reads it; anything else is a typo)
_RELEASE_ON, _RELEASE_OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _check_release_env() -> None:
    """POPRI_RELEASE must be a clear yes or no: 'maybe' or 'ture' silently meaning research
    mode (or release mode) is the worst kind of typo in a DP tool."""
    v = os.environ.get("POPRI_RELEASE")
    if v is not None and v.strip().lower() not in _RELEASE_ON + _RELEASE_OFF:
        raise InputError(f"must be one of 1/true/yes/on (release mode) or 0/false/no/off/empty "
                         f"(research mode), got {v!r}", field="POPRI_RELEASE")


def quiet_library_progress() -> None:
    """A pipe or a CI log: no library progress bar (datasets', the hub's, tqdm's) writes
    carriage-return lines into it; popri's own progress becomes heartbeat lines.  Set before
    those libraries are imported (they read it then)."""
    for k in ("HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS",
              "TQDM_DISABLE"):
        os.environ.setdefault(k, "1")


def prepare() -> None:
    """Before the app runs: standard streams that exist, signal handlers, no carriage-return
    progress bars of libraries in a pipe or CI log, no warnings that say nothing to a user; a
    stage of popri run dies with it."""
    _guard_std_streams()
    _install_signal_handlers()
    die_with_parent()  # a stage of popri run dies with it (POPRI_DIE_WITH)
    if not sys.stderr.isatty():
        quiet_library_progress()
    # peft asks transformers >= 5 for `is_gradient_checkpointing`, which warns on every model
    # load: two lines per stage that say nothing to a popri user and bury the CI log
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated",
                            category=FutureWarning)


def run(cmd, argv: list[str] | None) -> int:
    """Run the click command ``cmd`` (every float option guarded) and map every way it can end
    to an exit code, with at most one line on stderr: PopriError -> its code (2 bad input, 3
    missing model), usage error -> 2, OSError -> 2, closed pipe -> 0, Ctrl-C -> 130,
    SIGTERM / SIGHUP -> 128 + signal."""
    _guard_floats(cmd)
    try:
        _check_release_env()
        rv = cmd.main(args=argv, prog_name="popri", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except PopriError as e:
        sys.stderr.write(f"popri: error: {e}\n")
        code = e.exit_code
    except (click.exceptions.Exit, typer.Exit) as e:
        code = e.exit_code
    # typer >= 0.2x raises its vendored click's exceptions (typer._click), not click's; older
    # typer (e.g. 0.16, as pyproject admits) raises click's and has no TyperException
    except (click.ClickException, getattr(typer, "TyperException", click.ClickException)) as e:
        if type(e).__name__ == "NoArgsIsHelpError" or not hasattr(e, "format_message"):
            e.show()  # `popri` / `popri fred` alone: the help
        else:  # a usage error: one line too, with where to look
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path} -h')" if ctx is not None else ""
            msg = " ".join(e.format_message().split())
            sys.stderr.write(f"popri: error: {msg}{hint}\n")
        code = e.exit_code
    except (click.exceptions.Abort, typer.Abort):
        sys.stderr.write("popri: aborted\n")
        code = 130
        _INTERRUPTED.append(True)
    except KeyboardInterrupt:
        code = 130
        _INTERRUPTED.append(True)
        if not _SIGNALLED:
            sys.stderr.write("popri: interrupted\n")
    except SystemExit as e:
        # click answers EPIPE with sys.exit(1) (and wraps the streams): a reader that went away
        # (`popri ... | head`) is not an error of ours, exit 0 as other Unix tools
        if not _is_epipe(e.__context__):
            raise
        _quiet_stdout()
        code = 0
    except OSError as e:
        if _is_epipe(e):
            _quiet_stdout()
            code = 0
        else:
            line = _os_error_line(e)
            _quiet_stdout()  # anything still buffered for stdout goes nowhere (nothing partial)
            sys.stderr.write(f"popri: error: {line}\n")
            code = 2
    except Exception as e:
        # a library's failed write that is not an OSError (safetensors' SafetensorError, torch's
        # RuntimeError on a full disk): one line too; anything else is a bug -> traceback
        err = as_write_error(e)
        if err is None:
            raise
        _quiet_stdout()
        sys.stderr.write(f"popri: error: {_os_error_line(err)}\n")
        code = 2
    if _SIGNALLED:
        import signal

        sys.stderr.write(f"popri: terminated ({signal.Signals(_SIGNALLED[0]).name})\n")
        code = 128 + _SIGNALLED[0]
    return code


def interrupted() -> bool:
    """True once :func:`run` ended on an interrupt (Ctrl-C, or SIGTERM / SIGHUP turned into one)."""
    return bool(_INTERRUPTED or _SIGNALLED)
