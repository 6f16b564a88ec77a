"""Issue 37: every command's help has an example that still parses, fits 80 columns, and the
step count is accepted as --rounds where configs call it rounds.

    python -m pytest -q tests/test_cli_help.py
"""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

from popri.cli.app import command
from popri.cli.examples import EXAMPLES, walk

TREE = command()
LEAVES = dict(walk(TREE))


def test_every_command_has_an_example_and_every_example_names_a_command():
    assert set(LEAVES) - set(EXAMPLES) == set(), "commands without an example"
    assert set(EXAMPLES) - set(LEAVES) == set(), "examples of commands that do not exist"


@pytest.mark.parametrize("path", sorted(EXAMPLES))
def test_every_example_uses_only_options_its_command_has(path):
    cmd = LEAVES[path]
    opts = {o for p in cmd.params for o in (*getattr(p, "opts", ()),
                                            *getattr(p, "secondary_opts", ()))}
    for ex in EXAMPLES[path]:
        words = shlex.split(ex.split("  #")[0].split(" | ")[0], comments=True)
        assert words[:1 + len(path.split())] == ["popri", *path.split()], ex
        flags = {w.split("=")[0] for w in words if w.startswith("-") and w != "-"}
        assert flags <= opts, (ex, sorted(flags - opts))


@pytest.mark.parametrize("path", sorted(LEAVES))
def test_help_fits_80_columns_and_ends_with_examples(path):
    r = CliRunner().invoke(TREE, [*path.split(), "--help"], terminal_width=80)
    assert r.exit_code == 0, r.output
    long = [line for line in r.output.splitlines() if len(line) > 80]
    assert not long, long
    first = " ".join(EXAMPLES[path][0].split("  #")[0].split()[:3])
    assert "Examples:\n" in r.output and f"\n    {first}" in r.output
    # the examples close the help, after the options (issue 68): its last lines are examples
    tail = r.output[r.output.index("Examples:"):]
    assert r.output.index("Options:") < r.output.index("Examples:")
    assert all(line.startswith("    ") for line in tail.rstrip().splitlines()[1:]), tail


def test_popri_help_lists_every_command_in_one_workflow_panel():
    """Issue 68: `popri --help` groups the commands by workflow, each in exactly one panel, in
    the panels' order; nothing falls into 'Other'."""
    from popri.cli.app import PANELS

    r = CliRunner().invoke(TREE, ["--help"], terminal_width=80)
    assert r.exit_code == 0, r.output
    listed = [n for _, names in PANELS for n in names]
    assert sorted(listed) == sorted(TREE.commands) and len(set(listed)) == len(listed)
    assert "Other:" not in r.output and "Commands:" not in r.output
    at = [r.output.index(f"\n{title}:\n") for title, _ in PANELS]
    assert at == sorted(at)
    for (title, names), start, end in zip(PANELS, at, at[1:] + [len(r.output)]):
        rows = [line.split()[0] for line in r.output[start:end].splitlines()[2:] if line.strip()]
        assert rows == list(names), title


def test_the_real_entry_point_shows_the_examples(run_popri):
    p = run_popri(["score", "--help"], env={"COLUMNS": "80"}, check=True)
    assert "Examples:\n    popri score --private" in p.stdout
    assert max(map(len, p.stdout.splitlines())) <= 80
    # plain text: no Rich escapes left in the help ('popri[flower]' as written)
    assert "popri[flower]" in " ".join(p.stdout.split()) and "\\[" not in p.stdout


def test_rounds_is_accepted_where_a_step_count_is_meant(run_popri):
    a = run_popri(["account", "epsilon", "-z", "2.5", "-q", "0.1", "--rounds", "20"],
                  check=True).stdout
    b = run_popri(["account", "epsilon", "-z", "2.5", "-q", "0.1", "--steps", "20"],
                  check=True).stdout
    assert a == b and "0.9617" in a
    s = run_popri(["account", "sigma", "--epsilon", "1", "-q", "0.5", "--rounds", "1"],
                  check=True).stdout
    assert s.strip()


def test_run_help_lists_every_method_of_the_registry():
    from popri.pipeline.recipes import METHODS

    r = CliRunner().invoke(TREE, ["run", "--help"], terminal_width=80)
    listed = [line.split()[0] for line in r.output.split("method (the config's")[1]
              .split("\n\n")[0].splitlines()[1:] if line.startswith("    ") and
              not line.startswith("     ")]
    assert listed == list(METHODS)
