"""The README's shell and Python blocks marked ``<!-- test: runs as written -->`` run as
written (issue 37), on tiny random models: ``POPRI_GEN_MODEL`` / ``POPRI_EMBED_MODEL`` point the
default generator and embedder at them; everything else is the README's text.

    python -m pytest -q tests/test_readme.py -m slow
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- test: runs as written (tests/test_readme.py) -->"


def blocks(lang: str) -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [m.group(1) for m in re.finditer(re.escape(MARK) + r"\n```" + lang + r"\n(.*?)```",
                                            text, re.S)]


def _env(tiny_lm, tiny_st_model) -> dict:
    bindir = str(Path(sys.executable).parent)
    return dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '')}",
                POPRI_GEN_MODEL=tiny_lm, POPRI_EMBED_MODEL=tiny_st_model, POPRI_THREADS="1")


def test_the_readme_marks_its_runnable_blocks():
    assert len(blocks("bash")) == 2 and len(blocks("python")) == 1
    assert "| popri score" in blocks("bash")[1]  # the pipe


@pytest.mark.slow
@pytest.mark.parametrize("i", [0, 1])
def test_readme_shell_block_runs_as_written(i, tmp_path, tiny_lm, tiny_st_model):
    code = "set -euo pipefail\n" + blocks("bash")[i]
    if "examples/" in code:  # the repository's examples, as from a checkout
        (tmp_path / "examples").symlink_to(ROOT / "examples")
    p = subprocess.run(["bash", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env=_env(tiny_lm, tiny_st_model), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    if i == 1:
        assert "(eps, delta)-DP under add/remove one client" in p.stdout
        assert (tmp_path / "runs" / "r1" / "prefs.jsonl").stat().st_size > 0
    else:
        assert (tmp_path / "runs" / "report" / "report.html").is_file()
        assert "runs/smoke" in p.stdout


def test_readme_python_block_runs_as_written(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    p = subprocess.run([sys.executable, "-c", blocks("python")[0]], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
