"""The ``popri`` command: one Typer app, one thin module per subcommand in ``commands/``.

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
from typing import Optional

import click
import typer

from . import __version__
from .errors import PopriError

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
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


def _load_config(path: str) -> dict:
    from .config import load_yaml_mapping

    data = load_yaml_mapping(path)

    def norm(d):
        if isinstance(d, dict):
            return {str(k).replace("-", "_"): norm(v) if isinstance(v, dict) else v for k, v in d.items()}
        return d

    # click looks sub-command defaults up by the command's name ("fetch", "ledger"), which
    # keeps hyphens; option names use underscores.
    out = {}
    for k, v in data.items():
        out[str(k)] = norm(v) if isinstance(v, dict) else v
        if isinstance(v, dict):
            out[str(k)] = {kk if not isinstance(vv, dict) else kk.replace("_", "-"): vv
                           for kk, vv in norm(v).items()}
    return out


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
    from . import log, runtime

    runtime.set_threads(threads)
    log.set_quiet(quiet)
    if config:
        ctx.default_map = _load_config(config)


# Order in `popri --help`: the pipeline order.  Every module in popri_cli.commands that has a
# register() is added; an import error there is a bug and is not swallowed.
_ORDER = ("run", "bench", "embed", "gen", "vary", "expand", "score", "aggregate", "pe", "prefs",
          "dpo", "sft", "train_downstream", "eval", "account", "fred")


def _register() -> None:
    import importlib
    import pkgutil

    from . import commands

    names = [m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_")]
    names.sort(key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))
    for name in names:
        mod = importlib.import_module(f"{commands.__name__}.{name}")
        if hasattr(mod, "register"):
            mod.register(app)


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: run the app, turning PopriError into one line + exit code."""
    cmd = typer.main.get_command(app)
    try:
        rv = cmd.main(args=argv, prog_name="popri", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except PopriError as e:
        sys.stderr.write(f"popri: error: {e}\n")
        code = e.exit_code
    except (click.exceptions.Exit, typer.Exit) as e:
        code = e.exit_code
    # typer >= 0.2x raises its vendored click's exceptions (typer._click), not click's
    except (click.ClickException, typer.TyperException) as e:
        if hasattr(e, "show"):
            e.show()
        else:
            sys.stderr.write(f"popri: error: {e.format_message()}\n")
        code = e.exit_code
    except (click.exceptions.Abort, typer.Abort):
        sys.stderr.write("popri: aborted\n")
        code = 130
    except KeyboardInterrupt:
        sys.stderr.write("popri: interrupted\n")
        code = 130
    except BrokenPipeError:
        # downstream closed the pipe (e.g. `| head`): not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    main()
