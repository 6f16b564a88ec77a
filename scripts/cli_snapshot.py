"""What a refactor must leave unchanged (issue 46's before/after): every command's options as
JSON, and every shipped config's ``popri run --dry-run`` plan and ``--show-config``.

    python scripts/cli_snapshot.py write DIR     # take the snapshot into DIR
    python scripts/cli_snapshot.py diff A B      # unified diff of two snapshots (exit 1: differ)
    python scripts/cli_snapshot.py write tests/fixtures/cli_snapshot   # after an intended change

tests/test_cli_snapshot.py holds the code to tests/fixtures/cli_snapshot (the options and help at
the typer version it was taken with; the plans in ``make test-heavy``).

DIR holds ``options.json`` (command path -> its parameters: flags, type, default, required,
help), ``help.txt`` (every command's ``--help`` at 100 columns) and one ``plan-NAME.txt`` / ``config-NAME.txt`` per ``examples/*.yaml`` (and the
embedded default, NAME ``default-embedded``).  The plans are taken in a scratch working
directory, so run directories named relative to it do not depend on where the script runs.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _param(p) -> dict:
    td = getattr(p, "type_descriptor", None)  # typer >= 0.20 (its own click)
    t = getattr(td, "annotation", None) if td is not None else getattr(p, "type", None)
    choices = getattr(getattr(p, "type", None), "choices", None)
    default = p.default
    if callable(default):
        default = f"<callable {getattr(default, '__name__', '?')}>"
    return {"name": p.name, "kind": type(p).__name__, "opts": list(p.opts),
            "secondary_opts": list(getattr(p, "secondary_opts", []) or []),
            "type": getattr(t, "__name__", None) or repr(t),
            "choices": list(choices) if choices else None,
            "default": default if isinstance(default, (str, int, float, bool, type(None)))
            else repr(default),
            "required": bool(p.required), "multiple": bool(getattr(p, "multiple", False)),
            "nargs": p.nargs, "is_flag": bool(getattr(p, "is_flag", False)),
            "hidden": bool(getattr(p, "hidden", False)),
            "envvar": p.envvar, "help": getattr(p, "help", None)}


def options() -> tuple[dict, dict]:
    """(command path -> its parameters, command path -> its rendered ``--help``)."""
    import typer
    from typer.testing import CliRunner

    from popri.cli.app import app

    out: dict = {}
    helps: dict = {}
    runner = CliRunner()

    def walk(cmd, path: str) -> None:
        out[path] = [_param(p) for p in cmd.params]
        argv = path.split()[1:] + ["--help"]
        helps[path] = runner.invoke(app, argv, env={"COLUMNS": "100"}, terminal_width=100).output
        for name in sorted(getattr(cmd, "commands", None) or {}):
            walk(cmd.commands[name], f"{path} {name}")

    walk(typer.main.get_command(app), "popri")
    return out, helps


def _popri(args: list[str], cwd: str) -> str:
    env = dict(os.environ, POPRI_ZYGOTE="0", COLUMNS="100")
    p = subprocess.run([sys.executable, "-m", "popri.cli.app", *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=600)
    text = f"# exit {p.returncode}\n# stdout\n{p.stdout}# stderr\n{p.stderr}"
    return text.replace(os.path.realpath(cwd), "<cwd>").replace(cwd, "<cwd>").replace(
        str(ROOT), "<repo>")


def write(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    from importlib.metadata import version

    (d / "meta.json").write_text(json.dumps({"typer": version("typer")}) + "\n")
    opts, helps = options()
    (d / "options.json").write_text(json.dumps(opts, indent=1, sort_keys=True) + "\n")
    (d / "help.txt").write_text("".join(f"===== {k}\n{v}\n" for k, v in sorted(helps.items())))
    configs = [("default-embedded", None)] + [(p.stem, p) for p in
                                              sorted((ROOT / "examples").glob("*.yaml"))]
    with tempfile.TemporaryDirectory() as cwd:
        for name, path in configs:
            cfg = [] if path is None else [str(path)]
            (d / f"plan-{name}.txt").write_text(_popri(["run", *cfg, "--dry-run"], cwd))
            (d / f"config-{name}.txt").write_text(_popri(["run", *cfg, "--show-config"], cwd))
            print(f"cli_snapshot: {name}", file=sys.stderr)


def diff(a: Path, b: Path) -> int:
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    bad = 0
    for n in names:
        x = (a / n).read_text().splitlines(keepends=True) if (a / n).exists() else []
        y = (b / n).read_text().splitlines(keepends=True) if (b / n).exists() else []
        if x != y:
            bad += 1
            sys.stdout.writelines(difflib.unified_diff(x, y, str(a / n), str(b / n)))
    print(f"cli_snapshot: {bad} of {len(names)} files differ", file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "write":
        write(Path(argv[1]))
        return 0
    if len(argv) == 3 and argv[0] == "diff":
        return diff(Path(argv[1]), Path(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
