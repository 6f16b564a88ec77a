"""Every relative link and every referenced repository file in the docs exists.

    python -m pytest -q tests/test_docs_links.py

Checked files: README.md, CHANGELOG.md and every docs/*.md (plus the comments of examples/*.yaml
for repository paths).

- **Links** ``[text](target)`` (and ``![alt](target)``, and ``[label]: target`` definitions)
  whose target is not a URL (``http(s)://``, ``mailto:``, any ``scheme:``): the path before
  ``#`` must exist relative to the Markdown file's folder; an ``#anchor`` into a Markdown file
  (or into the same file) must be the GitHub slug of one of its headings: lowercase, characters
  other than letters, digits, spaces, hyphens and underscores dropped, spaces to hyphens, ``-1``,
  ``-2`` ... on repeats.
- **Repository paths** written in the text, in inline code or in fenced code blocks, that start
  with ``examples/ scripts/ benchmarks/ docs/ tests/ popri/ .ci/`` and end in a file extension
  or ``/`` (``.ci/`` paths always) must exist relative to the repository root. Tokens that are
  patterns or placeholders (followed by ``*``, ``<``, ``{`` or ``[``) are skipped, and so is
  :data:`SKIP` (each entry says why). Run outputs (``runs/...``, ``RUN/...``) never match.
- **Bare file names** in inline code (``pyproject.toml``, ``pe-sft.yaml``; ``.md .py .sh .yaml
  .yml .toml .txt``) must be the name of some file of the repository, unless
  :data:`SKIP_NAMES` lists them (run outputs, the papers' reference code).

Only the standard library and pytest: this runs in a second, without popri importable.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Paths the docs name on purpose although they do not exist in the repository, each with why.
SKIP = {
    # docs/architecture.md, "Adding a method": NAME is a placeholder for the new method's name
    "popri/methods/NAME/",
}

#: Bare file names in inline code that are not files of this repository, each with why.
SKIP_NAMES = {
    "commands.sh",            # RUN/commands.sh: written by `popri run` into the run directory
    "report.md",              # written by `popri report --out DIR`
    "main.py",                # PrE-Text's reference code (houcharlie/PrE-Text)
    "generation_prompt.txt",  # POPri's reference code (its few-shot template)
    "downstream_eval.py",     # POPri's reference code
    "eval_distilgpt2.py",     # PrE-Text's reference code
    "config.toml",            # Flower's $FLWR_HOME/config.toml (docs/flower.md)
}

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
LINK_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
REPO_PATH = re.compile(
    r"(?<![\w./~$-])((?:examples|scripts|benchmarks|docs|tests|popri|\.ci)/[\w./-]*)")
YAML_COMMENT = re.compile(r"(?:^|\s)#(.*)$")
BARE_NAME = re.compile(r"[\w.-]+\.(?:md|py|sh|ya?ml|toml|txt)")
PRUNE = {".git", ".venv", ".venv-min", "runs", "node_modules", "__pycache__", ".pytest_cache",
         ".hypothesis", "build", "dist"}


def repo_file_names(root: Path = REPO) -> set[str]:
    """The base name of every file in the repository (virtualenvs, run outputs, caches pruned)."""
    names = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in PRUNE and not d.endswith(".egg-info")]
        names.update(filenames)
    return names


def markdown_files() -> list[Path]:
    return [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]


def slug(text: str) -> str:
    """GitHub's heading anchor (without the -N suffix of repeated headings)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)   # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text)                        # inline HTML
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def split_lines(text: str) -> list[tuple[int, str, bool]]:
    """(line number, line, inside a fenced code block?) for every line except the fences."""
    out, fence = [], None
    for no, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark
                continue
            if mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip()[len(mark):]:
                fence = None
                continue
        out.append((no, line, fence is not None))
    return out


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line, fenced in split_lines(text):
        if fenced:
            continue
        found.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        found.add(s if n == 0 else f"{s}-{n}")
    return found


def repo_paths(text: str) -> list[str]:
    """Repository file paths written in ``text`` (see the module docstring for the rule)."""
    found = []
    for m in REPO_PATH.finditer(text):
        tok, after = m.group(1), text[m.end():m.end() + 1]
        if after and after in "*<{[":
            continue                              # a pattern or placeholder: popri/specs/<area>.py
        tok = tok.rstrip(".")                     # the full stop of a sentence
        last = tok.rsplit("/", 1)[-1]
        if not (tok.endswith("/") or re.search(r"\.[A-Za-z0-9]+$", last)
                or tok.startswith(".ci/")):
            continue                              # a module or directory named without a slash
        if tok in SKIP:
            continue
        found.append(tok)
    return found


def check_markdown(path: Path, text: str | None = None, root: Path = REPO) -> list[str]:
    """Every problem of one Markdown file as 'FILE:LINE: ...'."""
    text = path.read_text(encoding="utf-8") if text is None else text
    rel = path.relative_to(root) if path.is_relative_to(root) else path
    problems: list[str] = []
    cache: dict[Path, set[str]] = {}
    names: set[str] | None = None

    def anchors_of(p: Path) -> set[str]:
        if p not in cache:
            cache[p] = anchors(text if p == path else p.read_text(encoding="utf-8"))
        return cache[p]

    for no, line, fenced in split_lines(text):
        where = f"{rel}:{no}"
        if fenced:
            for tok in repo_paths(line):
                if not (root / tok).exists():
                    problems.append(f"{where}: missing file {tok!r} (in a code block)")
            continue
        spans = [m.group(2) for m in CODE_SPAN.finditer(line)]
        prose = CODE_SPAN.sub(" ", line)
        targets = [m.group(1) for m in LINK.finditer(prose)]
        m = LINK_DEF.match(prose)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if not target or SCHEME.match(target):
                continue                          # http(s)://, mailto: ...
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if file_part and not dest.exists():
                problems.append(f"{where}: broken link {target!r}: {file_part!r} does not exist")
                continue
            if anchor and dest.suffix == ".md" and dest.is_file():
                if anchor not in anchors_of(dest):
                    problems.append(f"{where}: broken link {target!r}: no heading of "
                                    f"{dest.name} has the anchor #{anchor}")
        for tok in [t for s in spans for t in repo_paths(s)]:
            if not (root / tok).exists():
                problems.append(f"{where}: missing file {tok!r}")
        for name in [s.strip() for s in spans if BARE_NAME.fullmatch(s.strip())]:
            if name in SKIP_NAMES or (path.parent / name).exists():
                continue
            names = repo_file_names(root) if names is None else names
            if name not in names:
                problems.append(f"{where}: missing file {name!r} (no file of that name in the "
                                "repository)")
        prose_no_links = LINK.sub(" ", prose)
        for tok in repo_paths(prose_no_links):
            if not (root / tok).exists():
                problems.append(f"{where}: missing file {tok!r} (in the text)")
    return problems


def check_yaml_comments(path: Path, text: str | None = None, root: Path = REPO) -> list[str]:
    text = path.read_text(encoding="utf-8") if text is None else text
    rel = path.relative_to(root) if path.is_relative_to(root) else path
    problems = []
    for no, line in enumerate(text.splitlines(), 1):
        m = YAML_COMMENT.search(line)
        if not m:
            continue
        for tok in repo_paths(m.group(1)):
            if not (root / tok).exists():
                problems.append(f"{rel}:{no}: missing file {tok!r} (in a comment)")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_referenced_file_exists(path):
    assert path.exists(), f"{path.relative_to(REPO)} is missing"
    problems = check_markdown(path)
    assert not problems, "\n".join(problems)


def test_example_configs_name_files_that_exist():
    problems = [p for y in sorted((REPO / "examples").glob("*.yaml"))
                for p in check_yaml_comments(y)]
    assert not problems, "\n".join(problems)


def test_the_docs_pages_the_readme_points_to_exist():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for page in ("docs/stages.md", "docs/loop.md", "docs/privacy.md", "docs/formats.md",
                 "docs/architecture.md", "docs/flower.md", "CHANGELOG.md"):
        assert f"]({page}" in readme, f"README.md does not link {page}"


def test_the_checker_catches_what_it_is_for(tmp_path):
    """The references this test was written for (README's `table3.md`, a stale anchor,
    examples/pe.yaml's `examples/compare.sh`) are reported with file and line."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## The loop: `popri run CONFIG.yaml`\n")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "compare.py").write_text("")
    md = tmp_path / "README.md"
    md.write_text(
        "# T\n\n"
        "See `table3.md` and `examples/table3.md` for every row.\n"      # line 3
        "[ok](docs/a.md#the-loop-popri-run-configyaml) [web](https://x.org/y.md)\n"
        "[stale](#the-loop-popri-run-configyaml) [gone](docs/b.md)\n"     # line 5
        "```sh\npython examples/compare.sh\npython examples/compare.py\n```\n"  # line 7
        "`popri/specs/<area>.py` `runs/demo/results.md` `examples/*.yaml`\n")
    problems = check_markdown(md, root=tmp_path)
    assert any(p.startswith("README.md:3:") and "'table3.md'" in p for p in problems)
    assert any(p.startswith("README.md:3:") and "examples/table3.md" in p for p in problems)
    assert any(p.startswith("README.md:5:") and "#the-loop-popri-run-configyaml" in p
               for p in problems)
    assert any(p.startswith("README.md:5:") and "docs/b.md" in p for p in problems)
    assert any(p.startswith("README.md:7:") and "examples/compare.sh" in p for p in problems)
    assert len(problems) == 5, problems
    y = tmp_path / "examples" / "pe.yaml"
    y.write_text("# the two are comparable (examples/compare.sh runs both)\nmethod: pe  # ok\n")
    assert check_yaml_comments(y, root=tmp_path) == [
        "examples/pe.yaml:1: missing file 'examples/compare.sh' (in a comment)"]


def test_slugs_follow_github():
    assert slug("The loop: `popri run CONFIG.yaml`") == "the-loop-popri-run-configyaml"
    assert (slug("DP federated learning baselines: `popri fl round`, `method: dp-fedavg | "
                 "dp-ftrl`")
            == "dp-federated-learning-baselines-popri-fl-round-method-dp-fedavg--dp-ftrl")
    assert (slug("`RUN/metrics.jsonl` (POPri and PE+SFT runs)")
            == "runmetricsjsonl-popri-and-pesft-runs")
    assert anchors("# A\n## B\n## B\n```\n# not a heading\n```\n") == {"a", "b", "b-1"}
