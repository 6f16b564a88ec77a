"""What a report shows across runs: the methods' downstream accuracy side by side, privacy
against utility, and each run's results table.

    python -m pytest -q tests/test_report.py -k two_runs
"""

from __future__ import annotations

import numpy as np

from popri.report import style
from popri.report.read import (as_dict, num as _num)
from popri.pipeline.results import results_table
from popri.report.figures import Z95, new_fig
from popri.report.page import Report
from popri.report.runs import Run

# --------------------------------------------------------------------------- across runs


def _acc_rows(runs: list[Run]) -> list[dict]:
    rows = []
    for run in runs:
        r = run.results or {}
        if r.get("mode") == "release":
            continue
        methods = as_dict(r.get("methods"))
        own = r.get("method")
        order = [own] + [k for k in ("t0", "eps0", "epsinf") if k != own] + \
            [k for k in methods if k not in (own, "t0", "eps0", "epsinf")]
        for k in order:
            m = methods.get(k)
            if not isinstance(m, dict) or _num(m.get("accuracy")) is None:
                continue
            n = m.get("clients") if isinstance(m.get("clients"), int) else None
            rows.append({"run": run.label, "method": k, "own": k == own,
                         "label": style.method_label(k), "acc": m["accuracy"],
                         "se": _num(m.get("accuracy_se")), "clients": n})
    return rows


def fig_methods(runs: list[Run]):
    rows = _acc_rows(runs)
    if len(rows) < 2:  # one accuracy: the verdict says it
        return None
    n = len(rows)
    fig, axes = new_fig(1, width=10.0, height=max(2.4, 0.45 * n + 1.3))
    ax = axes[0]
    ys = list(range(n))[::-1]
    for y, r in zip(ys, rows):
        col = style.colour(r["method"])
        se = r["se"]
        ax.errorbar([r["acc"]], [y], xerr=[[Z95 * se], [Z95 * se]] if se else None,
                    fmt="o", ms=7, capsize=4, color=col)
        ax.annotate(f"{r['acc']:.4f}" + (f" ± {Z95 * se:.4f}" if se else " (no SE)"),
                    (r["acc"], y), textcoords="offset points", xytext=(0, 7), ha="center",
                    fontsize=8)
    multi = len({r["run"] for r in rows}) > 1

    def tick(r):
        lab = r["label"] + (f" ({r['clients']} test clients)" if r["clients"] is not None
                            else "")
        return f"{r['run']}: {lab}" if multi else lab

    ax.set_yticks(ys, [tick(r) for r in rows])
    for t, r in zip(ax.get_yticklabels(), rows):
        t.set_color(style.colour(r["method"]))
    ax.set_ylim(-0.8, n - 0.3)
    ax.margins(x=0.15)
    ax.set_xlabel("next-token accuracy on the private test split\n"
                  "(bars: each model's own 95% interval, ±1.96 SE over test clients)")
    ax.set_title("Accuracy of each model" + ("" if multi else f": {rows[0]['run']}")
                 + "\n(overlapping intervals do not mean no difference: see the paired "
                 "differences)", fontsize=10)
    ax.grid(axis="y", alpha=0)
    return fig


def fig_privacy_utility(runs: list[Run], report: Report, section: str):
    pts, refs = [], {"eps0": [], "epsinf": []}
    for run in runs:
        r = run.results or {}
        methods = as_dict(r.get("methods"))
        own = methods.get(r.get("method")) if r.get("method") else None
        for k in refs:
            if isinstance(methods.get(k), dict) and _num(methods[k].get("accuracy")) is not None:
                refs[k].append(methods[k]["accuracy"])
        eps = _num(r.get("epsilon"))
        if not isinstance(own, dict) or _num(own.get("accuracy")) is None:
            continue
        if eps is None or eps <= 0:
            report.note(section, f"privacy-utility: {run.label} not drawn (epsilon "
                                 f"{r.get('epsilon')!r}: not a finite positive number)")
            continue
        g = as_dict(r.get("gap_closed"))
        pts.append({"run": run.label, "method": r.get("method"), "eps": eps,
                    "acc": own["accuracy"], "se": _num(own.get("accuracy_se")),
                    "gap": _num(g.get("gap_closed")), "gse": _num(g.get("gap_closed_se")),
                    "dp": r.get("dp_guarantee") is not False})
    if len({f"{p['eps']:.3g}" for p in pts}) < 2:  # one epsilon: no trade-off to draw
        return None
    gaps = any(p["gap"] is not None for p in pts)
    fig, axes = new_fig(2 if gaps else 1, width=12.0 if gaps else 7.5, height=5.0)
    methods = list(dict.fromkeys(p["method"] for p in pts))
    epss = [p["eps"] for p in pts]
    logx = max(epss) / min(epss) > 20
    for ax, key, se, ylabel, title in (
            (axes[0], "acc", "se", "next-token accuracy", "Accuracy vs epsilon"),
            *(((axes[1], "gap", "gse", "gap closed (acc - eps0) / (epsinf - eps0)",
                "Gap closed vs epsilon"),) if gaps else ())):
        for m in methods:
            mp = sorted((p for p in pts if p["method"] == m and p[key] is not None),
                        key=lambda p: p["eps"])
            if not mp:
                continue
            ax.errorbar([p["eps"] for p in mp], [p[key] for p in mp],
                        yerr=[p[se] or 0 for p in mp], marker="o", ms=7, capsize=4, lw=1.4,
                        color=style.colour(m), label=style.method_label(m))
            if len(pts) <= 8:
                for p in mp:
                    ax.annotate(p["run"] + ("" if p["dp"] else " (NOT DP)"),
                                (p["eps"], p[key]), textcoords="offset points",
                                xytext=(6, -10), fontsize=7, color="#444444")
        if key == "acc":
            for k in ("eps0", "epsinf"):
                if refs[k]:
                    ax.axhline(float(np.mean(refs[k])), color=style.colour(k), ls="--", lw=1.2,
                               label=style.method_label(k)
                               + (" (mean over runs)" if len(refs[k]) > 1 else ""))
        else:
            ax.axhline(0.0, color=style.colour("eps0"), ls="--", lw=1.2,
                       label="0: " + style.method_label("eps0"))
            ax.axhline(1.0, color=style.colour("epsinf"), ls="--", lw=1.2,
                       label="1: " + style.method_label("epsinf"))
        ax.margins(x=0.08, y=0.12)
        if logx:
            ax.set_xscale("log")
        else:
            ax.ticklabel_format(axis="x", useOffset=False, style="plain")
        ax.set_xlabel("epsilon spent (from the ledger)" + (", log scale" if logx else ""))
        ax.set_ylabel(ylabel)
        ax.set_title(title + " (error bars: ±1 SE)")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.suptitle("Privacy-utility trade-off")
    return fig


# --------------------------------------------------------------------------- tables


def table_text(r: dict) -> str:
    """The run's results table as ``popri run`` prints it, plus the intervals results.json
    has; a plain table of the accuracies when the driver's table cannot be made."""
    try:
        text = results_table(r)
    except Exception:  # noqa: BLE001 -- an older or partial results.json
        lines = [f"{r.get('method', '?')} on {r.get('run_dir', '?')}", "",
                 "| method | epsilon | next-token accuracy | SE (clients) | loss | test clients |",
                 "|---|---|---|---|---|---|"]
        for k, m in (r.get("methods") or {}).items():
            if isinstance(m, dict):
                e = {"eps0": "0", "epsinf": "inf"}.get(k, r.get("epsilon"))
                lines.append(f"| {style.method_label(k)} | {_fmt(e)} | "
                             f"{_fmt(m.get('accuracy'))} | {_fmt(m.get('accuracy_se'))} | "
                             f"{_fmt(m.get('loss'))} | {_fmt(m.get('clients'))} |")
        text = "\n".join(lines)
    extra = []
    g = r.get("gap_closed") if isinstance(r.get("gap_closed"), dict) else {}
    ci = g.get("gap_closed_ci")
    if isinstance(ci, list) and len(ci) == 2 and all(_num(x) is not None for x in ci):
        extra.append(f"gap closed 95% interval (paired bootstrap): [{ci[0]:.3f}, {ci[1]:.3f}]")
    c = r.get("control") if isinstance(r.get("control"), dict) else {}
    ci = c.get("acc_minus_control_ci")
    if isinstance(ci, list) and len(ci) == 2 and all(_num(x) is not None for x in ci):
        n = (c.get("draws") or {}).get("n") if isinstance(c.get("draws"), dict) else None
        extra.append(f"method minus T = 0{f', draw 0 of {n}' if n else ''}, 95% interval "
                     f"(paired bootstrap over test clients): [{ci[0]:+.4f}, {ci[1]:+.4f}]")
    return text + ("\n" + "\n".join(extra) if extra else "")


def _fmt(x, nd: int = 4) -> str:
    v = _num(x)
    if v is None:
        return "-" if x is None else str(x)
    return f"{v:.{nd}f}" if isinstance(x, float) else str(x)
