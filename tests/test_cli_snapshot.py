"""Every command's options and ``--help``, and every shipped config's ``popri run --dry-run``
plan and ``--show-config``, equal tests/fixtures/cli_snapshot (scripts/cli_snapshot.py): a refactor
that changes none of them on purpose changes none of them (issue 46).  After an intended change:

    python scripts/cli_snapshot.py write tests/fixtures/cli_snapshot   # and commit the diff
"""

from __future__ import annotations

import importlib.util
import json
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAP = ROOT / "tests" / "fixtures" / "cli_snapshot"
spec = importlib.util.spec_from_file_location("cli_snapshot", ROOT / "scripts" / "cli_snapshot.py")
cli_snapshot = importlib.util.module_from_spec(spec)
sys.modules["cli_snapshot"] = cli_snapshot
spec.loader.exec_module(cli_snapshot)


def _same_typer() -> None:
    want = json.loads((SNAP / "meta.json").read_text())["typer"]
    if version("typer") != want:  # the rendering of options and help is typer's
        pytest.skip(f"the snapshot was taken with typer {want}, this is {version('typer')}")


def _diff(name: str, now: str) -> str:
    import difflib

    was = (SNAP / name).read_text()
    return "".join(difflib.unified_diff(was.splitlines(True), now.splitlines(True),
                                        f"snapshot/{name}", f"now/{name}", n=1))[:6000]


def test_every_commands_options_and_help_are_the_snapshots():
    _same_typer()
    opts, helps = cli_snapshot.options()
    d = _diff("options.json", json.dumps(opts, indent=1, sort_keys=True) + "\n")
    assert not d, d
    d = _diff("help.txt", "".join(f"===== {k}\n{v}\n" for k, v in sorted(helps.items())))
    assert not d, d


def test_the_snapshot_diff_sees_a_change(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "plan-x.txt").write_text("popri gen --seed 0\n")
    (b / "plan-x.txt").write_text("popri gen --seed 1\n")
    assert cli_snapshot.diff(a, a) == 0
    assert cli_snapshot.diff(a, b) == 1


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy: 26 popri processes (~1 min)
def test_every_shipped_configs_plan_and_config_are_the_snapshots(tmp_path):
    cli_snapshot.write(tmp_path)
    bad = [n.name for n in sorted(SNAP.glob("*-*.txt"))
           if (tmp_path / n.name).read_text() != n.read_text()]
    assert not bad, "\n".join(_diff(n, (tmp_path / n).read_text()) for n in bad)
