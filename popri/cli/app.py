"""The ``popri`` command: one Typer app, one thin module per subcommand in ``popri/cli/commands/``.

    popri --help
    popri bench fetch sotu --out data/sotu
    popri embed data/sotu --out runs/priv.npy
    popri score --mode cosine --private runs/priv.npy --synthetic syn.jsonl ... --out scores.npy
    popri account ledger runs/

Global options: ``--config FILE.yaml`` gives defaults for any subcommand (flags override),
``--threads N`` sets torch/BLAS threads, ``--quiet`` silences progress.  Bad input exits 2 with
one line naming file, line and field; a missing model or index exits 3.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Optional

import click
import typer

from popri.core.version import __version__
from popri.core.errors import PopriError


app = typer.Typer(
    name="popri",
    help=(
        "Differentially private synthetic text from federated data (POPri, PrE-Text / "
        "Private Evolution).\n\nStages read and write JSONL / .npy and compose with pipes: "
        "'-' is stdin/stdout, stdout carries data only, logs go to stderr. Every DP stage "
        "appends what it spent to a ledger.jsonl next to its outputs; 'popri account ledger' "
        "totals them."
    ),
    no_args_is_help=True,
    add_completion=True,  # popri --install-completion bash|zsh|fish
    pretty_exceptions_enable=False,
    # help is Rich markup on every typer version popri admits (older ones defaulted to none):
    # popri.cli.options.escape / unwrap escape the brackets of the texts, e.g. 'popri[flower]'
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


def _load_config(path: str, command=None) -> dict:
    """The global ``--config FILE.yaml`` as click's ``default_map``, checked against the command
    tree: a section per subcommand (nested for groups: ``bench: {fetch: {...}}``), a key per
    parameter (its name or its long option, '-' or '_': ``noise_multiplier``,
    ``noise-multiplier``, ``json`` for ``--json``).  An unknown section or key is a ConfigError
    (exit 2) naming the file and the dotted key, with the known ones: a typo must not fall back
    silently to the default."""
    from popri.pipeline.config import load_yaml_mapping
    from popri.core.errors import ConfigError

    data = load_yaml_mapping(path)
    if command is None:
        command = typer.main.get_command(app)

    def known_params(cmd) -> tuple[dict, list]:
        """{accepted key: parameter name}, and the keys to show (long option names)."""
        names, shown = {}, []
        for p in getattr(cmd, "params", []):
            if not p.name or getattr(p, "expose_value", True) is False:
                continue
            longs = [o[2:].replace("-", "_") for o in getattr(p, "opts", []) if o.startswith("--")]
            for n in [p.name, *longs]:
                names.setdefault(n, p.name)
            shown.append(longs[0] if longs else p.name)
        return names, shown

    def walk(cmd, d, where: str) -> dict:
        if not isinstance(d, dict):
            raise ConfigError(f"must be a mapping of options (got {d!r})", path=path,
                              field=where or None)
        subs = dict(getattr(cmd, "commands", {}) or {})
        params, shown = known_params(cmd)
        out = {}
        for k, v in d.items():
            key = str(k)
            dotted = f"{where}.{key}" if where else key
            sub = next((n for n in (key, key.replace("_", "-"), key.replace("-", "_"))
                        if n in subs), None)
            if sub is not None:
                out[sub] = walk(subs[sub], v, dotted)
            elif key.replace("-", "_") in params and where:
                out[params[key.replace("-", "_")]] = v
            else:
                known = sorted(subs) if not where else sorted(set(subs) | set(shown))
                what = "section (a subcommand)" if not where or subs else "key"
                raise ConfigError(f"unknown {what} (known: {', '.join(known)})", path=path,
                                  field=dotted)
        return out

    return walk(command, data, "")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"popri {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    config: Optional[str] = typer.Option(
        None, "--config", envvar="POPRI_CONFIG",
        help="YAML file of defaults, keyed by subcommand (e.g. 'score: {noise_multiplier: 1.05}'). "
             "Flags on the command line override it."),
    threads: Optional[int] = typer.Option(
        None, "--threads", envvar="POPRI_THREADS", min=1,
        help="torch / BLAS threads (default: all cores). 1 is faster when another process "
             "shares the CPU."),
    quiet: bool = typer.Option(False, "--quiet", "-q", envvar="POPRI_QUIET",
                               help="No progress bars or info logs on stderr."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    from popri.core import log, runtime

    runtime.set_threads(threads)
    log.set_quiet(quiet)
    if config:
        ctx.default_map = _load_config(config, ctx.command)


# Order in `popri --help`: the pipeline order.  Every module in popri.cli.commands that has a
# register() is added; an import error there is a bug and is not swallowed.
_ORDER = ("run", "bench", "instruct", "embed", "gen", "vary", "expand", "score", "aggregate", "pe", "prefs",
          "dpo", "sft", "train_downstream", "eval", "fl", "fewfedpit", "account", "audit", "report",
          "runs", "fred")


def _register() -> None:
    import importlib
    import pkgutil

    from popri.cli import commands

    names = [m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_")]
    names.sort(key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))
    for name in names:
        mod = importlib.import_module(f"{commands.__name__}.{name}")
        if hasattr(mod, "register"):
            mod.register(app)


_register()


# --------------------------------------------------------------------------- process edges
# What main() adds around the app so that every failure is one line and an exit code: closed
# standard streams, OSError (disk full, read-only directory, /dev/full), a closed pipe, SIGTERM,
# non-finite numbers in float options.

_SIGNALLED: list[int] = []  # the terminating signal caught (SIGTERM / SIGHUP), if any
_WRITE_ERRNOS = {"ENOSPC", "EDQUOT", "EFBIG", "EROFS", "EPIPE", "EIO"}
_TMP_NAME = None  # compiled lazily: the temporary names of popri.core.io (mkstemp, 8 chars)


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

    from popri.core.errors import InputError

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
    from popri.core.errors import InputError

    v = os.environ.get("POPRI_RELEASE")
    if v is not None and v.strip().lower() not in _RELEASE_ON + _RELEASE_OFF:
        raise InputError(f"must be one of 1/true/yes/on (release mode) or 0/false/no/off/empty "
                         f"(research mode), got {v!r}", field="POPRI_RELEASE")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: run the app, turning PopriError into one line + exit code.

    Also one line (exit 2) for an OSError (``PATH: cannot write: No space left on device``), a
    quiet exit 0 when the reader of stdout went away (``popri ... | head``), and SIGTERM/SIGHUP
    handled like Ctrl-C (temporary files removed) with exit 128 + signal."""
    _guard_std_streams()
    _install_signal_handlers()
    if not sys.stderr.isatty():
        # a pipe or a CI log: no library progress bar (datasets', the hub's, tqdm's) writes
        # carriage-return lines into it; popri's own progress becomes heartbeat lines
        for k in ("HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS",
                  "TQDM_DISABLE"):
            os.environ.setdefault(k, "1")
    # peft asks transformers >= 5 for `is_gradient_checkpointing`, which warns on every model
    # load: two lines per stage that say nothing to a popri user and bury the CI log
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated",
                            category=FutureWarning)
    cmd = typer.main.get_command(app)
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
    except KeyboardInterrupt:
        code = 130
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
    if _SIGNALLED:
        import signal

        sys.stderr.write(f"popri: terminated ({signal.Signals(_SIGNALLED[0]).name})\n")
        code = 128 + _SIGNALLED[0]
    sys.exit(code)


if __name__ == "__main__":
    main()
