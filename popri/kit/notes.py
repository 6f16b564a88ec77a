"""The lines a run's plan and results table share across methods: what a release-mode run
released, what checkpoint selection read, and how a number is shown.

    from popri.kit import fmt, released_line, selection_note
"""

from __future__ import annotations

import math


def released_line(path: str) -> str:
    """A release-mode run's results table in place of its evaluation (``results.json``'s
    ``released``; the driver plans no evaluation in release mode)."""
    return (f"released: {path} (release mode evaluates nothing on the private splits; the same "
            f"config without release gives the benchmark's table)")


def selection_note(on: str, cfg=None) -> str:
    """The checkpoint-selection line of the results table (what it reads, what it costs)."""
    if on == "private":
        return ("checkpoint selection: the EXACT private validation split, NOT covered by "
                "epsilon (as POPri B.1; a research read outside the ledger)")
    if on == "public":
        return "checkpoint selection: public Omega embeddings (no privacy cost)"
    if on == "dp":
        e = f"{cfg.dpo.select_epsilon:g}, {cfg.selection_delta:g}" if cfg else "eps_s, delta_s"
        what = ("mean + covariance" if cfg is not None and cfg.dpo.select_by == "fid"
                else "mean" if cfg is not None else "statistics")
        return (f"checkpoint selection: DP {what} of the private validation split "
                f"('popri fred stats', ({e})-DP per release), included in the total epsilon")
    return "checkpoint selection: none (the last epoch's adapter)"


def fmt(x, nd=4):
    """A results-table cell: a float to ``nd`` decimals, ``-`` for None or NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def pair_fields(d: dict) -> dict:
    """A DPO stage's metrics.json preference-pair evaluations (``train_eval``, ``holdout``),
    flattened: ``{KEY}_margin``, ``{KEY}_accuracy``, ``{KEY}_pairs`` for each one present."""
    return {f"{key}_{f}": d[key].get(f) for key in ("train_eval", "holdout")
            if isinstance(d.get(key), dict) for f in ("margin", "accuracy", "pairs")}
