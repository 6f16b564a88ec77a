"""Options generated from specs (popri/cli/options.py: spec_options), issue 27.

    python -m pytest -q tests/test_cli_options.py
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from popri.cli.options import spec_options
from popri.core.errors import ConfigError
from popri.core.spec import Spec, param

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


def test_every_field_is_an_option_and_the_command_gets_the_built_spec():
    got = {}

    @spec_options(Toy)
    def cmd(out: str = typer.Option("-", "--out"), *, spec: Toy) -> None:
        got.update(out=out, spec=spec)

    r = _run(_app(cmd), "cmd", "--alpha", "0.25", "--count", "4", "--name", "y", "--flag",
             "--out", "o")
    assert r.exit_code == 0, r.output
    assert got == {"out": "o", "spec": Toy(alpha=0.25, count=4, name="y", flag=True)}
    help_text = _run(_app(cmd), "cmd", "--help").output
    for flag in ("--alpha", "--count", "--name", "--flag", "--no-flag", "--out"):
        assert flag in help_text


def test_only_takes_a_subset_in_its_order_and_the_rest_keep_their_defaults():
    got = {}

    @spec_options(Toy, only=("count", "alpha"))
    def cmd(*, spec: Toy) -> None:
        got["spec"] = spec

    r = _run(_app(cmd), "cmd", "--count", "2")
    assert r.exit_code == 0, r.output
    assert got["spec"] == Toy(count=2)
    h = _run(_app(cmd), "cmd", "--help").output
    assert "--name" not in h and "--flag" not in h
    assert h.index("--count") < h.index("--alpha")
    with pytest.raises(TypeError, match="no field nope"):
        spec_options(Toy, only=("nope",))


def test_stacked_specs_each_go_to_their_keyword():
    got = {}

    @spec_options(Toy, only=("count",))
    @spec_options(Other, into="other")
    def cmd(*, spec: Toy, other: Other) -> None:
        got.update(spec=spec, other=other)

    r = _run(_app(cmd), "cmd", "--count", "7", "--depth", "9")
    assert r.exit_code == 0, r.output
    assert got == {"spec": Toy(count=7), "other": Other(depth=9)}


def test_the_specs_validation_names_the_flag(monkeypatch):
    """A range, a choice or a combination the spec refuses is one InputError naming the option
    (popri's main() prints it as one line and exits 2)."""
    from popri.core.errors import InputError

    @spec_options(Toy)
    def cmd(*, spec: Toy) -> None:
        pass

    for args, flag in ((["--alpha", "2"], "--alpha"), (["--name", "z"], "--name"),
                       (["--flag", "--count", "9"], "--count")):
        r = _run(_app(cmd), "cmd", *args)
        assert isinstance(r.exception, InputError), (args, r.output)
        assert r.exception.field == flag, (args, r.exception)


def test_no_command_lists_spec_fields_by_hand_and_builds_the_spec():
    """Issue 27: a command takes its spec through spec_options, not a hand-written option per
    field plus a build(Spec, x=x, ...) call (22 such pairs before, 0 now)."""
    hits = []
    for p in sorted((ROOT / "popri" / "cli" / "commands").glob("*.py")):
        src = p.read_text(encoding="utf-8")
        hits += [f"{p.name}: {m.group(0)}" for m in re.finditer(r"\bbuild\(\w+Spec\b", src)]
        hits += [f"{p.name}: build_spec" for _ in re.finditer(r"\bbuild_spec\(", src)]
    assert hits == []
