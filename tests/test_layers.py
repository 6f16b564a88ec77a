"""The layer rule of docs/architecture.md holds, and keeps holding (issue 27).

    python -m pytest -q tests/test_layers.py
    lint-imports                      # the same contracts, as scripts/test.sh runs them

- the import-linter contracts in pyproject.toml pass on the package, and fail on a copy with one
  upward import hidden in a function (so the check sees function-local imports);
- no import cycle between popri's modules (every import, function-local ones included);
- nothing below the package root imports the root (whose ``__getattr__`` reaches the API);
- no popri module is imported inside a function (issue 46; the root's ``__getattr__`` is the one
  exception), so a module's header says what it depends on;
- the version is declared once (pyproject.toml and popri.core.version agree);
- the contract has no exception (no ``ignore_imports``), and no module under popri/methods
  imports a private name of another package or reads anything of the run but the members of
  :class:`popri.methods.base.RunContext` (issue 39: what a method may ask of a run is written
  down, and is all it asks).
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
    assert "1 kept, 0 broken" in p.stdout


def test_the_layer_contract_has_no_exception():
    """Each folder is one layer (the recipe kit below the methods, the driver above them, the
    report above the driver): the contract carves out nothing."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["importlinter"]["contracts"]
    assert [c.get("ignore_imports") for c in contracts] == [None] * len(contracts)
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    assert layers.index("popri.report") < layers.index("popri.pipeline") \
        < layers.index("popri.methods") < layers.index("popri.kit") < layers.index("popri.eval")
    # every package of popri is a layer (or the API / the entry point)
    pkgs = {f"popri.{p.name}" for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    assert pkgs <= set(layers), pkgs - set(layers)


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


# --------------------------------------------------------------------------- what a method may use
def _own_package(module: str) -> str:
    """``popri.methods.pe.recipe`` -> ``popri.methods.pe`` (a method's own package)."""
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["popri", "methods"] else ".".join(parts[:2])


def private_imports(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """(line, what) for every private name (``_x``) this module takes from another package: a
    ``from popri.X import _x``, or ``mod._x`` read on a name bound to another package's
    module (``from popri.eval import probe; probe._unit(...)``)."""
    own = _own_package(module)
    bad, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith("popri") and _own_package(node.module) != own:
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    bad.append((node.lineno, f"from {node.module} import {a.name}"))
                modules[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("popri") and _own_package(a.name) != own:
                    modules[a.asname or a.name.split(".")[0]] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            bad.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return bad


def run_reads(tree: ast.AST, param: str = "run") -> list[tuple[int, str]]:
    """(line, attribute) of every attribute read on the run: on ``run`` inside any function or
    lambda that takes a parameter of that name (a recipe, a hook, a builder)."""
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        a = fn.args
        if param not in {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}:
            continue
        for node in ast.walk(fn):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == param):
                out.append((node.lineno, node.attr))
    return sorted(set(out))


def run_context_members() -> set[str]:
    from popri.methods.base import RunContext

    return {n for n in dir(RunContext) if not n.startswith("_")} | set(
        RunContext.__annotations__)


def test_the_checks_of_what_a_method_uses_see_a_violation():
    tree = ast.parse("from popri.pipeline.stages import _fmt\n"
                     "from popri.eval import probe\n"
                     "from popri.methods.pe import _own\n"
                     "def recipe(run):\n"
                     "    n = run._clients()\n"
                     "    yield probe._unit(run.paths), run.cfg, run.runner\n"
                     "def other(x):\n"
                     "    return x._y, run._z\n")
    assert private_imports(tree, "popri.methods.pe.recipe") == [
        (1, "from popri.pipeline.stages import _fmt"), (6, "probe._unit")]
    assert run_reads(tree) == [(5, "_clients"), (6, "cfg"), (6, "paths"), (6, "runner")]
    assert "runner" not in run_context_members() and "paths" in run_context_members()


def test_methods_use_no_private_name_of_another_package_and_only_the_run_context():
    """No module under popri/methods imports a private name of another package or reads a
    private attribute of the run; every attribute a method reads of the run is a member of
    RunContext (methods/base.py): the few typed things a recipe may use."""
    members = run_context_members()
    private, private_run, unknown = [], [], []
    for f in sorted((PKG / "methods").rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        where = f.relative_to(ROOT)
        private += [f"{where}:{line}: {what}" for line, what in private_imports(tree, _module(f))]
        for line, attr in run_reads(tree):
            if attr.startswith("_"):
                private_run.append(f"{where}:{line}: run.{attr}")
            elif attr not in members:
                unknown.append(f"{where}:{line}: run.{attr}")
    assert private == [], "private names of another package"
    assert private_run == [], "private attributes of the run"
    assert unknown == [], f"not members of RunContext ({sorted(members)})"


def test_the_driver_run_is_a_run_context():
    from popri.methods.base import RunContext
    from popri.pipeline import config as C
    from popri.pipeline.driver import Run

    r = Run(C.load(None, ["run_dir=/nonexistent/popri-layers"]), dry_run=True)
    assert isinstance(r, RunContext)
    for name in run_context_members():
        assert hasattr(Run, name) or name in vars(r), name


# --------------------------------------------------------------------------- imports at the top
#: the one function-local import of a popri module: the root package's lazy API attribute
#: (importing any popri module imports the root first, so ``import popri.core.io`` must not
#: import the whole API: PEP 562's module ``__getattr__``)
LOCAL_IMPORT_ALLOWED = {("popri/__init__.py", "__getattr__")}


def local_popri_imports(pkg: Path = PKG) -> list[str]:
    """``file:line: import`` of every import of a popri module inside a function or class body,
    outside ``if TYPE_CHECKING:`` (issue 46: a module's header says what it depends on)."""
    out = []
    for f in sorted(pkg.rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        parent = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        rel = f.relative_to(pkg.parent).as_posix()
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else ["popri"] if isinstance(node, ast.ImportFrom) else [])
            if not any(n.split(".")[0] == "popri" for n in names) or parent.get(node) is tree:
                continue
            q, where, typing_only = node, None, False
            while q in parent:
                q = parent[q]
                if isinstance(q, ast.If) and "TYPE_CHECKING" in ast.unparse(q.test):
                    typing_only = True
                if where is None and isinstance(q, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                    ast.ClassDef)):
                    where = q.name
            if not typing_only and (rel, where) not in LOCAL_IMPORT_ALLOWED:
                out.append(f"{rel}:{node.lineno}: {ast.unparse(node)} (in {where})")
    return out


def test_no_popri_module_is_imported_inside_a_function():
    assert local_popri_imports() == []


def test_the_local_import_check_sees_one(tmp_path):
    (tmp_path / "popri").mkdir()
    (tmp_path / "popri" / "m.py").write_text(
        "import json\n\ndef f():\n    import torch\n    from popri.core import io\n\n"
        "    return io, torch\n")
    assert local_popri_imports(tmp_path / "popri") == [
        "popri/m.py:5: from popri.core import io (in f)"]


def test_no_function_in_popri_is_over_120_lines():
    """Issue 46: a function a reader can hold (the longest were split: ``release_scores``,
    ``train_downstream``, PE's ``expand``, DDG's ``plan``, DP-FL's ``run_round``)."""
    long = []
    for p in sorted((ROOT / "popri").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 120:
                    long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert long == []


def test_the_report_names_no_method():
    """Issue 46: the report knows each method through the registry (its label, colour,
    variants, whether it writes N synthetic samples), never by name: no string in
    popri/report is a method's key."""
    from popri.pipeline.recipes import METHODS

    keys = set(METHODS) | {k for m in METHODS.values() for k in m.variants}
    hits = []
    for p in sorted((ROOT / "popri" / "report").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in keys:
                hits.append(f"{p.name}:{node.lineno} {node.value!r}")
    assert hits == []


def test_no_popri_module_imports_a_private_name_of_another():
    """Issue 68: a name one module shares with another is public (no leading underscore):
    `from popri.core.io import _annotate_write_error` and its like are refused."""
    crossing = []
    for p in sorted((ROOT / "popri").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("popri"):
                crossing += [f"{p.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}"
                             for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert crossing == []
