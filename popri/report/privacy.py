"""The privacy a run spent, from every ledger.jsonl under it: epsilon per round, composed
cumulatively (:func:`popri.privacy.accounting.compose`), its table line and figure.

    python -m pytest -q tests/test_report.py -k epsilon
"""

from __future__ import annotations

import math
from pathlib import Path

from popri.report import style
from popri.report.read import (as_dict, num as _num, run_ledger)
from popri.core.errors import InputError
from popri.privacy.accounting import common_delta
from popri.privacy.accounting import compose
from popri.report.verdict import privacy_words, provenance_links
from popri.report.figures import new_fig
from popri.report.page import Report
from popri.report.runs import Run

# ------------------------------------------------------------------ privacy ledger


def _round_of(e) -> int | None:
    r = (e.params or {}).get("round") if isinstance(e.params, dict) else None
    return int(r) if _num(r) is not None and float(r) == int(r) else None


def epsilon_per_round(run_dir: str | Path, results: dict | None = None) -> dict:
    """The cumulative epsilon after each round: every ledger.jsonl under the run (read as
    ``popri account ledger`` reads it, deduplicated by release id; a malformed line skipped
    with a note, its file's other entries counted), entries ordered by ``params.round``,
    composed with :func:`popri.privacy.accounting.compose` up to each round (entries without a
    round come last, as one point).  {"x": [...], "labels": [...], "epsilon": [...], "delta",
    "accountant", "by_round", "entries", "notes"}; raises ValueError when there are no entries
    or they cannot be totalled."""
    notes: list[str] = []
    try:
        entries = run_ledger(Path(run_dir), notes)
    except InputError as e:  # one release id recorded twice with different parameters
        raise ValueError(e.format()) from None
    if not entries:
        raise ValueError("no ledger entries under the run" + (f" ({notes[0]})" if notes else ""))
    r = results if isinstance(results, dict) else {}
    b = as_dict(r.get("budget"))
    try:
        delta = _num(r.get("delta")) or _num(b.get("delta")) or common_delta(entries)
        acc = r.get("accountant") or b.get("accountant") or "rdp"
        conv = b.get("convention")
        rounds = sorted({t for e in entries if (t := _round_of(e)) is not None})
        loose = [e for e in entries if _round_of(e) is None]
        xs, labels, eps = [], [], []
        if rounds:
            for t in rounds:
                upto = [e for e in entries if (u := _round_of(e)) is not None and u <= t]
                xs.append(t)
                labels.append(str(t))
                eps.append(compose(upto, delta, acc, alone=False, convention=conv).epsilon)
            if loose:
                xs.append(rounds[-1] + 1)
                labels.append(f"+{len(loose)} w/o round")
                eps.append(compose(entries, delta, acc, alone=False, convention=conv).epsilon)
        else:
            for i in range(1, len(entries) + 1):
                xs.append(i)
                labels.append(str(i))
                eps.append(compose(entries[:i], delta, acc, alone=False,
                                   convention=conv).epsilon)
    except Exception as e:  # noqa: BLE001 -- ParameterError and friends: cannot be totalled
        raise ValueError(f"the ledger entries cannot be totalled: {e}") from None
    return {"x": xs, "labels": labels, "epsilon": eps, "delta": delta, "accountant": acc,
            "by_round": bool(rounds), "entries": len(entries), "notes": notes}


def privacy_spent(run: Run, report: Report, section: str) -> dict | None:
    """The run's epsilon per round as a table line (always: a one-round run's only account of
    it) and the data of its figure; notes for what was not counted.  None without a ledger."""
    try:
        d = epsilon_per_round(run.path, run.results)
    except ValueError as e:
        if "no ledger entries" not in str(e) or (run.results or {}).get("epsilon") is not None:
            report.note(section, f"privacy spent: {e}")
        return None
    for n in d["notes"]:
        report.note(section, n)
    parts = [f"{'after round ' + lab if d['by_round'] else 'release ' + lab}: "
             + (f"{e:.4f}" if math.isfinite(e) else "inf")
             for lab, e in zip(d["labels"], d["epsilon"])]
    n = d["entries"]
    report.fact(section, "epsilon spent (cumulative, from the ledgers)",
                "; ".join(parts) + f" ({d['accountant']}, delta = {d['delta']:g}; {n} ledger "
                f"entr{'y' if n == 1 else 'ies'})")
    stated = _num((run.results or {}).get("epsilon"))
    last = d["epsilon"][-1]
    if stated is not None and math.isfinite(last) and last < stated * (1 - 1e-6):
        report.note(section, f"the ledger entries read here total epsilon {last:.4g}, less than "
                             f"the {stated:.4g} results.json says the run spent: the figure "
                             "marks both")
    d["stated"] = stated
    return d


def fig_epsilon(run: Run, d: dict | None):
    if d is None:
        return None
    xs, eps = d["x"], d["epsilon"]
    fin = [(x, e) for x, e in zip(xs, eps) if math.isfinite(e)]
    if len(fin) < 2:  # one round: the table line says it
        return None
    fx, fe = zip(*fin)
    inc = [fe[0]] + [b - a for a, b in zip(fe, fe[1:])]
    fig, axes = new_fig(1, width=8.0, height=4.2)
    ax = axes[0]
    col = style.colour(run.method)
    ax.bar(fx, inc, width=0.6, color=col, alpha=0.3, label="added by this round")
    ax.plot(fx, fe, marker="o", lw=1.8, color=col, label="cumulative epsilon")
    budget = _num(as_dict((run.results or {}).get("budget")).get("epsilon"))
    if budget is not None:
        ax.axhline(budget, color=style.role("budget"), ls="--", lw=1.4,
                   label=f"budget {budget:g}")
    stated = d.get("stated")
    if stated is not None and fe[-1] < stated * (1 - 1e-6):
        ax.axhline(stated, color=style.role("reference"), ls=":", lw=1.4,
                   label=f"spent per results.json: {stated:.4g}")
    ax.annotate(f"{fe[-1]:.3f}", (fx[-1], fe[-1]), textcoords="offset points", xytext=(0, 7),
                ha="center", fontsize=9)
    pos = [v for v in fe if v > 0]
    if pos and max(pos) / min(pos) > 1e3:  # a cheap first round, then an expensive one
        ax.set_yscale("log")
    ax.set_xticks(list(fx), [lab for x, lab in zip(xs, d["labels"]) if x in fx])
    ax.set_xlabel("round" if d["by_round"] else "release (ledger order)")
    ax.set_ylabel(f"epsilon at delta = {d['delta']:g} ({d['accountant']})")
    n = d["entries"]

    words, dp = privacy_words(run.results or {})
    ax.set_title(f"{run.label}: privacy spent ({n} ledger entr{'y' if n == 1 else 'ies'})"
                 + ("" if dp else "\nNOT A DP GUARANTEE (a not-dp link in its release's chain)"
                    if provenance_links(run.results or {}) else
                    "\nNOT A DP GUARANTEE (papers' convention)"))
    ax.margins(y=0.15)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3, frameon=False)
    return fig
