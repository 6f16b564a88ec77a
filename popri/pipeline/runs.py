"""Finished runs as data: list them, show one, diff two (``popri runs``), load one in Python.

    popri runs list runs/                    # one line per run directory below runs/
    popri runs show runs/demo                # its results table, identity and settings
    popri runs diff runs/e1 runs/e7          # settings and metrics side by side (dvc-style)
    >>> run = popri.load_run("runs/demo"); run.results["epsilon"]; run.metrics   # a DataFrame

A run directory is what ``popri run`` writes (docs/formats.md): ``config.resolved.json`` (the
settings), ``results.json`` (the metrics and the run's identity: popri version, git commit,
command line, config hash, start and end) and ``metrics.jsonl`` (per round).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from popri.core.errors import InputError


@dataclass
class LoadedRun:
    """One run directory: ``config`` (config.resolved.json), ``results`` (results.json, {} when
    the run has not finished), ``metrics`` (metrics.jsonl: a pandas DataFrame where pandas is
    installed, else a list of dicts)."""

    path: Path
    config: dict
    results: dict
    metrics: Any = field(repr=False, default=None)

    @property
    def finished(self) -> bool:
        return bool(self.results)


def _read(p: Path) -> Any:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise InputError(f"not JSON: {e}", path=str(p)) from None


def is_run_dir(path: str | Path) -> bool:
    p = Path(path)
    return (p / "config.resolved.json").is_file() or (p / "results.json").is_file()


def load_run(path: str | Path) -> LoadedRun:
    """The run in ``path`` (config, results, metrics); an InputError for a directory that is
    not a popri run."""
    p = Path(path)
    if not is_run_dir(p):
        raise InputError("not a popri run directory (no config.resolved.json or results.json)",
                         path=str(p))
    cfg = _read(p / "config.resolved.json") if (p / "config.resolved.json").is_file() else {}
    res = _read(p / "results.json") if (p / "results.json").is_file() else {}
    rows = []
    if (p / "metrics.jsonl").is_file():
        for line in (p / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    break  # a torn last line of a killed run
    metrics: Any = rows
    try:
        import pandas as pd

        metrics = pd.DataFrame(rows)
    except ImportError:
        pass
    return LoadedRun(p, cfg if isinstance(cfg, dict) else {}, res if isinstance(res, dict)
                     else {}, metrics)


def find_runs(dirs: Iterable[str | Path]) -> list[Path]:
    """Run directories among ``dirs`` and below them (sorted)."""
    out = set()
    for d in dirs:
        d = Path(d)
        if not d.exists():
            raise InputError("no such directory", path=str(d))
        if is_run_dir(d):
            out.add(d)
        if d.is_dir():
            for f in d.rglob("config.resolved.json"):
                out.add(f.parent)
            for f in d.rglob("results.json"):
                if (f.parent / ".stages").is_dir():
                    out.add(f.parent)
    return sorted(out)


def _method_row(res: dict) -> dict:
    m = (res.get("methods") or {}).get(res.get("method")) or {}
    g = res.get("gap_closed") or {}
    c = res.get("control") or {}
    return {"accuracy": m.get("accuracy"), "accuracy_se": m.get("accuracy_se"),
            "gap_closed": g.get("gap_closed"), "gap_closed_se": g.get("gap_closed_se"),
            "minus_t0": c.get("acc_minus_control"), "minus_t0_se": c.get("acc_minus_control_se")}


def summary(run: LoadedRun) -> dict:
    """One line of ``popri runs list``: where, what, how private, how good, when."""
    r, c = run.results, run.config
    ident = r.get("run") or {}
    return {"run_dir": str(run.path), "method": r.get("method") or c.get("method"),
            "finished": run.finished, "epsilon": r.get("epsilon"),
            "neighbouring": r.get("neighbouring"),
            "dp_guarantee": r.get("dp_guarantee", True) if r else None,
            "budget": ((r.get("budget") or {}).get("epsilon")
                       if r else (c.get("privacy") or {}).get("epsilon")),
            "mode": r.get("mode"), "rounds": r.get("rounds") or c.get("rounds"),
            **_method_row(r), "seed": r.get("seed", c.get("seed")),
            "popri_version": ident.get("popri_version"), "git_commit": ident.get("git_commit"),
            "started": ident.get("started"), "ended": ident.get("ended"),
            "config_hash": ident.get("config_hash")}


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists of scalars kept whole, lists of objects by
    index (``a[0].b``)."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(d, list) and any(isinstance(x, (dict, list)) for x in d):
        for i, v in enumerate(d):
            out.update(flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = d
    return out


#: results.json fields that are not metrics (identity, timings, notes, settings echoed)
_NOT_METRICS = ("run.", "stage_seconds.", "run_dir", "budget.", "mode_note", "note")


def diff(a: LoadedRun, b: LoadedRun) -> dict:
    """Settings and metrics that differ between two runs (``dvc params diff`` / ``dvc metrics
    diff`` side by side): {"params": [(key, a, b)], "metrics": [(key, a, b, change)]}."""
    pa, pb = flatten(a.config), flatten(b.config)
    params = [(k, pa.get(k), pb.get(k)) for k in sorted(set(pa) | set(pb))
              if pa.get(k) != pb.get(k) and k != "run_dir"]
    ma = {k: v for k, v in flatten(a.results).items() if not k.startswith(_NOT_METRICS)}
    mb = {k: v for k, v in flatten(b.results).items() if not k.startswith(_NOT_METRICS)}
    metrics = []
    for k in sorted(set(ma) | set(mb)):
        x, y = ma.get(k), mb.get(k)
        if x == y:
            continue
        ch = (y - x) if all(isinstance(v, (int, float)) and not isinstance(v, bool)
                            for v in (x, y)) else None
        metrics.append((k, x, y, ch))
    return {"a": str(a.path), "b": str(b.path), "params": params, "metrics": metrics}


def fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.4g}"
    return str(x)
