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

import sys
from typing import Optional

import typer
import typer.core

from popri.cli import commands, examples, process
from popri.core import log, runtime
from popri.core.errors import ConfigError
from popri.core.version import __version__
from popri.pipeline.config import load_yaml_mapping

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
    # plain help (click's formatter, as simonw/llm): options wrap to the terminal and fit 80
    # columns, where Rich's option tables squeezed the help column into a few words a line;
    # every command's help ends with its examples (popri/cli/examples.py, attached in main());
    # `popri --help` lists the commands in panels by workflow (PANELS, PanelGroup)
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


def _load_config(path: str, command=None) -> dict:
    """The global ``--config FILE.yaml`` as click's ``default_map``, checked against the command
    tree: a section per subcommand (nested for groups: ``bench: {fetch: {...}}``), a key per
    parameter (its name or its long option, '-' or '_': ``noise_multiplier``,
    ``noise-multiplier``, ``json`` for ``--json``).  An unknown section or key is a ConfigError
    (exit 2) naming the file and the dotted key, with the known ones: a typo must not fall back
    silently to the default."""
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
    runtime.set_threads(threads)
    log.set_quiet(quiet)
    if config:
        ctx.default_map = _load_config(config, ctx.command)


#: `popri --help` by workflow (issue 68): each panel's commands in the order of use.  Every
#: command is in exactly one panel (tests/test_cli_help.py).
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Run and inspect", ("run", "report", "runs")),
    ("Generation", ("gen", "vary", "expand", "take")),
    ("Private feedback", ("embed", "score", "aggregate", "pe", "fred")),
    ("Tuning", ("prefs", "dpo", "sft")),
    ("Evaluation", ("train-downstream", "eval")),
    ("Federated learning", ("fl", "fewfedpit", "instruct")),
    ("Privacy", ("account", "audit")),
    ("Data", ("bench",)),
)


class PanelGroup(typer.core.TyperGroup):
    """The root group: its commands listed under PANELS' headings, in their order (plain
    click formatting, as the rest of the help)."""

    def list_commands(self, ctx) -> list[str]:
        order = [n for _, names in PANELS for n in names]
        return sorted(super().list_commands(ctx),
                      key=lambda n: (order.index(n) if n in order else len(order), n))

    def format_commands(self, ctx, formatter) -> None:
        cmds = {n: self.get_command(ctx, n) for n in self.list_commands(ctx)}
        cmds = {n: c for n, c in cmds.items() if c is not None and not c.hidden}
        wide = max((len(n) for n in cmds), default=0)  # one column width for every panel
        width = formatter.width - 6 - wide
        other = tuple(n for n in cmds if not any(n in names for _, names in PANELS))
        for title, names in PANELS + (("Other", other),):
            rows = [(n.ljust(wide), cmds[n].get_short_help_str(width)) for n in names
                    if n in cmds]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


app.info.cls = PanelGroup


def _register() -> None:
    """Every module in popri.cli.commands that has a register() is added; an import error
    there is a bug and is not swallowed."""
    import importlib
    import pkgutil

    names = sorted(m.name for m in pkgutil.iter_modules(commands.__path__)
                   if not m.name.startswith("_"))
    for name in names:
        mod = importlib.import_module(f"{commands.__name__}.{name}")
        if hasattr(mod, "register"):
            mod.register(app)


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: run the app, turning PopriError into one line + exit code.

    Also one line (exit 2) for an OSError (``PATH: cannot write: No space left on device``), a
    quiet exit 0 when the reader of stdout went away (``popri ... | head``), and SIGTERM/SIGHUP
    handled like Ctrl-C (temporary files removed) with exit 128 + signal
    (:mod:`popri.cli.process`)."""
    process.prepare()
    code = process.run(command(), argv)
    if process.interrupted() and argv is None:  # the console script, not a library's call
        # not sys.exit: CPython may turn it into death by SIGINT (see exit_as_interpreter)
        runtime.exit_as_interpreter(code)
    sys.exit(code)


def command():
    """The click command tree of ``popri``, with every command's examples in its help."""
    return examples.attach(typer.main.get_command(app))

if __name__ == "__main__":
    main()
