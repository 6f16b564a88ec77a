"""Arguments and options generated from a command's Call (popri/cli/options.py: command), issues
27 and 46.

    python -m pytest -q tests/test_cli_options.py
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import typer
from typer.testing import CliRunner

from popri.cli.options import command
from popri.core.errors import ConfigError
from popri.core.spec import Call, Spec, out_param, param, same, seed_param

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Toy(Spec):
    alpha: float = param(0.5, "Alpha.", lo=0, hi=1)
    count: int = param(3, "A count.", lo=1)
    name: str = param("x", "A name.", choices=("x", "y"))
    flag: bool = param(False, "A flag.")

    def check(self) -> None:
        if self.flag and self.count > 5:
            raise ConfigError("must be <= 5 with --flag", field="count")


@dataclass(frozen=True)
class Other(Spec):
    depth: int = param(2, "Depth.", lo=1)


def _app(fn) -> typer.Typer:
    app = typer.Typer()
    app.command()(fn)
    app.command("noop")(lambda: None)  # two commands: the first is a subcommand, by name
    return app


def _run(app, *args):
    return CliRunner().invoke(app, list(args))


@dataclass(frozen=True, kw_only=True)
class ToyCall(Toy, Call):
    command: ClassVar[str] = "cmd"
    into: ClassVar[dict] = {"spec": Toy}
    src: str = param(help="The input.", positional=True)
    out: str = out_param("Where to write.", "-")
    seed: int = seed_param("Seeds it.")
    files: tuple[str, ...] = param((), "Repeatable.", flag="--file")


def test_every_field_is_an_argument_or_option_and_the_command_gets_the_built_spec():
    got = {}

    @command(ToyCall)
    def cmd(src: str, out: str, files: list, *, spec: Toy) -> None:
        got.update(src=src, out=out, files=files, spec=spec)

    r = _run(_app(cmd), "cmd", "in.jsonl", "--alpha", "0.25", "--count", "4", "--name", "y",
             "--flag", "-o", "o", "--file", "a", "--file", "b")
    assert r.exit_code == 0, r.output
    assert got == {"src": "in.jsonl", "out": "o", "files": ["a", "b"],
                   "spec": Toy(alpha=0.25, count=4, name="y", flag=True)}
    help_text = _run(_app(cmd), "cmd", "--help").output
    for flag in ("--alpha", "--count", "--name", "--flag", "--no-flag", "--out", "--seed",
                 "--file"):
        assert flag in help_text
    assert "src" in help_text.lower().split("usage:")[1].split("\n")[0]
    # the command's own arguments first, in declaration order, then the settings
    assert help_text.index("--out") < help_text.index("--seed") < help_text.index("--alpha")


def test_a_call_renders_the_command_line_the_command_parses_back():
    """One declaration both ways: Call.argv() of any instance, parsed by the command, gives the
    same instance (the stage of popri run and the command agree by construction)."""
    got = {}

    @command(ToyCall)
    def cmd(src: str, out: str, seed: int, files: list, *, spec: Toy) -> None:
        got["call"] = ToyCall(src=src, out=out, seed=seed, files=tuple(files),
                              **spec.to_dict())

    for call in (ToyCall(src="x"), ToyCall(src="a b", out="o", seed=7, files=("p", "q"),
                                           alpha=0.125, count=2, name="y", flag=True)):
        argv = call.argv()
        assert argv[:2] == ["cmd", call.src]
        r = _run(_app(cmd), *argv)
        assert r.exit_code == 0, r.output
        assert got["call"] == call
    argv = dataclasses.replace(ToyCall(src="x"), seed=3).argv()
    i = argv.index("--seed")
    assert argv[i + 1] == "3" and argv.count("--seed") == 1


def test_subset_settings_and_two_specs_each_go_to_their_keyword():
    """A Call may take a subset of a spec's fields (declared with ``same``) and two specs."""
    got = {}

    @dataclass(frozen=True, kw_only=True)
    class TwoCall(Other, Call):
        command: ClassVar[str] = "cmd"
        into: ClassVar[dict] = {"other": Other, "spec": Toy}
        count: int = same(Toy, "count")

    @command(TwoCall)
    def cmd(*, spec: Toy, other: Other) -> None:
        got.update(spec=spec, other=other)

    r = _run(_app(cmd), "cmd", "--count", "7", "--depth", "9")
    assert r.exit_code == 0, r.output
    assert got == {"spec": Toy(count=7), "other": Other(depth=9)}
    h = _run(_app(cmd), "cmd", "--help").output
    assert "--name" not in h and "--flag" not in h


def test_the_specs_validation_names_the_flag(monkeypatch):
    """A range, a choice or a combination the spec refuses is one InputError naming the option
    (popri's main() prints it as one line and exits 2)."""
    from popri.core.errors import InputError

    @command(ToyCall)
    def cmd(*, spec: Toy) -> None:
        pass

    for args, flag in ((["--alpha", "2"], "--alpha"), (["--name", "z"], "--name"),
                       (["--flag", "--count", "9"], "--count")):
        r = _run(_app(cmd), "cmd", "x", *args)
        assert isinstance(r.exception, InputError), (args, r.output)
        assert r.exception.field == flag, (args, r.exception)


def test_no_command_lists_spec_fields_by_hand_and_builds_the_spec():
    """Issue 27: a command takes its spec through its Call, not a hand-written option per
    field plus a build(Spec, x=x, ...) call (22 such pairs before, 0 now)."""
    hits = []
    for p in sorted((ROOT / "popri" / "cli" / "commands").glob("*.py")):
        src = p.read_text(encoding="utf-8")
        hits += [f"{p.name}: {m.group(0)}" for m in re.finditer(r"\bbuild\(\w+Spec\b", src)]
        hits += [f"{p.name}: build_spec" for _ in re.finditer(r"\bbuild_spec\(", src)]
    assert hits == []


def test_options_are_declared_once():
    """Issue 46: the commands' options come from their Calls; popri/cli keeps at most 40
    hand-written ``typer.Option`` (the root command's and the generic ones), and ``--seed``,
    ``--out`` and ``--json`` are spelled in one place each (popri/core/spec.py)."""
    cli = [p for p in (ROOT / "popri" / "cli").rglob("*.py")]
    n = sum(p.read_text(encoding="utf-8").count("typer.Option") for p in cli)
    assert n <= 40, n
    spelled = [str(p.relative_to(ROOT)) for p in
               cli + list((ROOT / "popri" / "specs").rglob("*.py"))
               if any(f"\"{x}\"" in p.read_text(encoding="utf-8")
                      or f"'{x}'" in p.read_text(encoding="utf-8")
                      for x in ("--seed", "--json"))]
    assert spelled == []
