"""The run directories of a report, read: results.json, metrics.jsonl (or, for a run without
one, the rows its method reads back from its stages' files:
:meth:`popri.methods.base.Method.metrics_from_files`), the labels and file-name slugs.

    python -m pytest -q tests/test_report.py
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from popri.core.io import read_json_lenient as _read_json
from popri.core.io import read_jsonl_lenient as _read_jsonl
from popri.report.read import (clean_results, num as _num)
from popri.methods.base import Method
from popri.pipeline.recipes import METHODS

#: a directory holding one of these is a run directory (config.resolved.json: a run in progress)
RUN_FILES = ("results.json", "metrics.jsonl", "config.resolved.json")


def is_run_dir(path: str | Path) -> bool:
    """A directory ``popri run`` wrote: it holds results.json, metrics.jsonl or (a run still
    in progress) config.resolved.json."""
    p = Path(path)
    return p.is_dir() and any((p / f).is_file() for f in RUN_FILES)


# --------------------------------------------------------------------------- reading


@dataclass
class Run:
    path: Path
    label: str
    slug: str
    results: dict | None = None
    metrics: list[dict] = field(default_factory=list)
    metrics_source: str = "metrics.jsonl"
    notes: list[str] = field(default_factory=list)

    @property
    def method(self) -> str | None:
        r = self.results or {}
        if isinstance(r.get("method"), str) and r["method"]:
            return r["method"]
        cfg = _read_json(self.path / "config.resolved.json")
        m = cfg.get("method") if isinstance(cfg, dict) else None
        return m if isinstance(m, str) and m else None

    @property
    def release(self) -> bool:
        """A release-mode run: nothing private (no diagnostic, no exact score) is shown."""
        r = self.results or {}
        if r.get("mode") is not None:
            return r.get("mode") == "release"
        cfg = _read_json(self.path / "config.resolved.json")
        return isinstance(cfg, dict) and cfg.get("mode") == "release"

    def rows(self, stage: str) -> list[dict]:
        rows = [r for r in self.metrics
                if r.get("stage") == stage and _num(r.get("round")) is not None]
        return sorted(rows, key=lambda r: r["round"])


def method_of(run: Run) -> Method:
    """The run's method from the registry (an unknown or missing one: the base's defaults)."""
    m = METHODS.get(run.method or "")
    return m if m is not None else _Unknown()


class _Unknown(Method):
    """A run of a method this version does not know: the kit's files, nothing of its own."""

    name = "unknown"

    def recipe(self, run):  # pragma: no cover -- never run, only asked for its read-back
        return []


def load_run(path: str, label: str, slug: str) -> Run:
    p = Path(path)
    run = Run(p, label, slug)
    f = p / "results.json"
    if f.is_file():
        r = _read_json(f, run.notes)
        if isinstance(r, dict):
            run.results = clean_results(r, run.notes)
        elif r is not None:
            run.notes.append(f"results.json is not a JSON object ({type(r).__name__}): no "
                             "results table and no verdict")
    if (p / "metrics.jsonl").is_file():
        run.metrics = [m for m in _read_jsonl(p / "metrics.jsonl", run.notes)
                       if isinstance(m.get("stage"), str)]
    else:
        run.metrics = method_of(run).metrics_from_files(p, run.results, run.notes,
                                                          release=run.release)
        run.metrics_source = "the stages' files (no metrics.jsonl)"
    return run


def run_slugs(labels: list[str]) -> list[str]:
    """File-name prefixes of the runs' figures: [A-Za-z0-9._-], at most 60 characters, unique
    even on a case-insensitive file system ('coll/r 1' and 'coll/r-1', 'uni/ε1' and 'uni/δ1'
    each keep their own figures)."""
    out: list[str] = []
    seen: set[str] = set()
    for lab in labels:
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", lab).strip("-.")[:60].strip("-.") or "run"
        s, k = base, 2
        while s.lower() in seen:
            s, k = f"{base}-{k}", k + 1
        seen.add(s.lower())
        out.append(s)
    return out


def run_labels(paths: list[str]) -> list[str]:
    """Short unique names: the directory name, with as many parents as needed."""
    parts = [Path(p).resolve().parts for p in paths]
    depth = 1
    while True:
        labels = ["/".join(pp[-depth:]) for pp in parts]
        if len(set(labels)) == len(labels) or depth >= max(len(pp) for pp in parts):
            break
        depth += 1
    seen: dict[str, int] = {}
    out = []
    for lab in labels:  # the same directory twice
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab} ({seen[lab]})")
    return out
