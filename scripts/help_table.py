"""Regenerate docs/architecture.md's "From `popri --help` to the maths" table from the code.

    python scripts/help_table.py            # print the table
    python scripts/help_table.py --check    # exit 1 when docs/architecture.md's table is stale

For each subcommand module in popri/cli/commands/: the spec module(s) and library modules it
imports from popri (its second and third file: every stage is reachable in three files).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- help-table:begin -->"
END = "<!-- help-table:end -->"
SKIP = ("popri.core", "popri.cli")  # plumbing every command uses


def imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("popri"):
            mods = [node.module]
            if node.module in ("popri.methods.popri", "popri.methods.pe", "popri.methods.fred",
                               "popri.methods.dpfl",
                               "popri.models", "popri.feedback", "popri.federated",
                               "popri.privacy", "popri.eval", "popri.data", "popri.pipeline"):
                mods = [f"{node.module}.{a.name}" for a in node.names]
            for m in mods:
                if not m.startswith(SKIP) and m not in out:
                    out.append(m)
    return out


def as_file(mod: str) -> str:
    p = Path(*mod.split("."))
    return f"`{p}/`" if (ROOT / p).is_dir() else f"`{p}.py`"


def table() -> str:
    cmds = sorted((ROOT / "popri" / "cli" / "commands").glob("[!_]*.py"))
    rows = ["| command module | arguments (its Call) and settings (spec) | library (the maths) |", "|---|---|---|"]
    for f in cmds:
        mods = imports(f)
        # the command's Calls (popri/specs/commands/) and the settings specs they inherit
        specs = []
        for m in mods:
            if m.startswith("popri.specs"):
                specs.append(as_file(m))
                if m.startswith("popri.specs.commands."):
                    specs += [as_file(x) for x in imports(ROOT / (m.replace(".", "/") + ".py"))
                              if x.startswith("popri.specs")]
        libs = [as_file(m) for m in mods if not m.startswith("popri.specs")]
        rows.append(f"| `popri {f.stem.replace('_', '-')}`: `popri/cli/commands/{f.name}` | "
                    f"{', '.join(dict.fromkeys(specs)) or '-'} | "
                    f"{', '.join(dict.fromkeys(libs)) or '-'} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    t = table()
    readme = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    if "--check" in argv:
        i, j = readme.find(BEGIN), readme.find(END)
        cur = readme[i + len(BEGIN):j].strip() if i >= 0 and j > i else None
        if cur != t:
            print("docs/architecture.md's help table is stale: run python scripts/help_table.py "
                  "--write",
                  file=sys.stderr)
            return 1
        return 0
    if "--write" in argv:
        i, j = readme.find(BEGIN), readme.find(END)
        readme = readme[:i + len(BEGIN)] + "\n" + t + "\n" + readme[j:]
        (ROOT / "docs" / "architecture.md").write_text(readme, encoding="utf-8")
        return 0
    print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
