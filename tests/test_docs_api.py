"""docs/api.md's runnable example runs as written (issue 37: a short Python-API page with a
runnable example).

    python -m pytest -q tests/test_docs_api.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_page_example_runs_as_written(tmp_path):
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text.split("## A runnable example", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert lines[0] == "epsilon = 0.9617 under add/remove one client"
    assert lines[1].startswith("fixed-size: epsilon = ") and "replace one client" in lines[1]
    assert lines[2].startswith("# popri run ") and "plan (dry run" in lines[2]
    assert lines[3] == "2 0.25"
    assert not any(tmp_path.iterdir()), "the dry run wrote something"
