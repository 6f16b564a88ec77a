"""A run's per-round metrics read back from the files the kit's steps write, for a run made
without RUN/metrics.jsonl (earlier versions): the default of
:meth:`popri.methods.base.Method.metrics_from_files`, which ``popri report`` asks.

    python -m pytest -q tests/test_report.py -k derived
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from popri.core.io import read_json_lenient, read_jsonl_lenient
from popri.core.readback import num, round_dirs
from popri.kit.notes import pair_fields


def metrics_from_files(run_dir: Path, results: dict | None, notes: list[str], *,
                       release: bool) -> list[dict]:
    """The rows of RUN/metrics.jsonl rebuilt from the files of the kit's steps (as
    :func:`popri.methods.popri.recipe.round_metrics` writes them), for a run without one: the
    probe (probe/roundT.json), the released scores and the preference pairs (roundT/scores.npy,
    roundT/prefs.jsonl), the recovery rate (roundT/prefs_report.json, else results.json; not in
    release mode) and the tuning (roundT/dpo|sft/metrics.json).  What could not be read is a
    line of ``notes``."""
    rows: list[dict] = []
    P = run_dir / "probe"
    probe = {}
    for f in (P.iterdir() if P.is_dir() else []):
        m = re.fullmatch(r"round(\d+)\.json", f.name)
        if m:
            probe[int(m.group(1))] = read_json_lenient(f, notes)
    for t, p in sorted(probe.items()):
        if isinstance(p, dict):
            rows.append({"round": t, "stage": "probe", "private_diagnostic": True,
                         **{k: p.get(k) for k in ("mean_cosine", "mean_cosine_se", "mmd2",
                                                  "mmd2_se", "self_cosine", "distinct_1",
                                                  "distinct_2", "perplexity", "loss", "samples")}})
    for t, R in round_dirs(run_dir):
        row: dict = {}
        if (R / "scores.npy").is_file():
            try:
                s = np.load(R / "scores.npy", allow_pickle=False)
                if s.size:
                    row |= {"released_mean": float(np.mean(s)), "samples": int(s.size)}
            except (OSError, ValueError):
                notes.append(f"{R / 'scores.npy'}: unreadable, ignored")
        pairs = read_jsonl_lenient(R / "prefs.jsonl", notes)
        ch = [v for p in pairs if (v := num(p.get("chosen_score"))) is not None]
        rj = [v for p in pairs if (v := num(p.get("rejected_score"))) is not None]
        if ch and rj:
            row |= {"chosen_mean": float(np.mean(ch)), "rejected_mean": float(np.mean(rj)),
                    "pairs": len(pairs)}
        if row:
            rows.append({"round": t, "stage": "score", **row})
        rep = read_json_lenient(R / "prefs_report.json")
        if isinstance(rep, dict) and num(rep.get("recovery_rate")) is not None:
            rows.append({"round": t, "stage": "prefs", "private_diagnostic": True,
                         "recovery_rate": rep["recovery_rate"]})
        for kind in ("dpo", "sft"):
            d = read_json_lenient(R / kind / "metrics.json")
            if isinstance(d, dict):
                ep = (d.get("epochs") or [{}])[-1] if isinstance(d.get("epochs"), list) else {}
                row2 = {"round": t, "stage": kind, "train_loss": d.get("train_loss"),
                        "last_epoch_loss": ep.get("loss") if isinstance(ep, dict) else None,
                        "steps": d.get("global_step")}
                row2 |= pair_fields(d)
                rows.append(row2)
    if not any(r["stage"] == "prefs" for r in rows) and isinstance(results, dict):
        for t, v in enumerate(results.get("recovery_rate_per_round") or [], start=1):
            if release:
                break
            if num(v) is not None:
                rows.append({"round": t, "stage": "prefs", "recovery_rate": v})
    return rows


__all__ = ["metrics_from_files"]
