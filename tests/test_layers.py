"""The layer rule of docs/architecture.md holds, and keeps holding (issue 27).

    python -m pytest -q tests/test_layers.py
    lint-imports                      # the same contracts, as scripts/test.sh runs them

- the import-linter contracts in pyproject.toml pass on the package, and fail on a copy with one
  upward import hidden in a function (so the check sees function-local imports);
- no import cycle between popri's modules (every import, function-local ones included);
- nothing below the package root imports the root (whose ``__getattr__`` reaches the API);
- the version is declared once (pyproject.toml and popri.core.version agree).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "popri"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "lint-imports"
    if not exe.exists():
        pytest.fail("lint-imports is not installed: pip install -e '.[test]'")
    return subprocess.run([str(exe), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_import_contracts_hold():
    p = lint_imports(ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 kept, 0 broken" in p.stdout


def test_import_contracts_catch_a_function_local_upward_import(tmp_path):
    shutil.copytree(PKG, tmp_path / "popri", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "popri" / "data" / "splits.py", "a") as f:
        f.write("\n\ndef _sneaky():\n    from popri.methods.pe import recipe\n\n    return recipe\n")
    p = lint_imports(tmp_path)
    assert p.returncode != 0
    assert "popri.data is not allowed to import popri.methods" in p.stdout
    assert "popri.data.splits -> popri.methods.pe.recipe" in p.stdout


# --------------------------------------------------------------------------- the import graph
def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[tuple[str, int]]]:
    """module -> {(imported popri module, line)}: every import statement, at any depth."""
    files = sorted(PKG.rglob("*.py"))
    mods = {_module(f) for f in files}

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[tuple[str, int]]] = {}
    for f in files:
        me = _module(f)
        pkg = me if f.name == "__init__.py" else me.rpartition(".")[0]
        out = graph.setdefault(me, set())
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                # `from popri.x import y` imports the module popri.x.y when there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            for t in targets:
                if t.split(".")[0] == "popri" and (r := resolve(t)) and r != me:
                    out.add((r, node.lineno))
    return graph


def cycles(graph: dict[str, set[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    succ = {m: {t for t, _ in e} for m, e in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(succ):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    g = {"a": {("b", 1)}, "b": {("c", 1)}, "c": {("a", 1)}, "d": {("a", 1)}}
    assert cycles(g) == [["a", "b", "c"]]
    assert cycles({"a": {("b", 1)}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_nothing_below_the_root_imports_the_root():
    g = import_graph()
    bad = sorted((m, line) for m, edges in g.items() for t, line in edges
                 if t == "popri" and m not in ("popri", "popri.api"))
    assert bad == [], f"import popri.core.version (not the root package): {bad}"


def test_the_version_is_declared_once():
    from popri.core.version import __version__

    import popri

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert meta["project"]["version"] == __version__ == popri.__version__


def test_the_driver_is_method_agnostic():
    """No method-name branch outside the method's own package: what differs between methods is a
    hook of popri.methods.base.Method, overridden by the method's own subclass (issue 27)."""
    import re

    from popri.pipeline.recipes import METHODS

    names = "|".join(re.escape(m) for m in METHODS)
    pat = re.compile(rf"""\b(method|mode)\b\s*(==|!=|\bin\b|\bnot in\b)\s*[\(\[\{{]?\s*["']({names})["']""")
    own = {"fewfedpit.py"}  # cli/commands/fewfedpit.py: FewFedPIT's own steps (its --mode)
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
            for p in sorted(PKG.rglob("*.py"))
            if "methods" not in p.relative_to(PKG).parts[:1] and p.name not in own
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if pat.search(line)]
    assert hits == []
    # and the check would see one
    assert pat.search('if cfg.method in ("popri", "pe-sft") and x:')


def test_every_method_is_a_subclass_in_its_own_package():
    """Each registered method is an instance of a Method subclass defined in its own package
    (popri/methods/NAME/), and the registry holds nothing else: what differs between methods
    lives in their hooks, not in the driver."""
    import inspect

    from popri.methods.base import Method
    from popri.pipeline.recipes import METHODS

    for name, m in METHODS.items():
        assert isinstance(m, Method) and type(m) is not Method and m.name == name, name
        mod = type(m).__module__
        assert mod.startswith("popri.methods.") and mod.count(".") == 3, (name, mod)
        assert m.label and m.summary, name
        assert not inspect.isabstract(type(m)), name
    # the base class cannot be instantiated without a recipe
    with pytest.raises(TypeError):
        Method()
