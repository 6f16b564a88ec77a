"""The figures of one run: probe, tuning, scores, preference pairs, the method's own rounds,
downstream training (matplotlib, panels of per-round series).

    python -m pytest -q tests/test_report.py tests/test_report_verdict.py -k panels
"""

from __future__ import annotations

import math
import re
from typing import Callable

import numpy as np

from popri.core.io import read_json_lenient as _read_json
from popri.core.io import read_jsonl_lenient as _read_jsonl
from popri.report import style
from popri.report.read import (as_dict, num as _num, round_dirs as _round_dirs)
from popri.report.verdict import Z95  # the normal 97.5 % quantile, one definition
from popri.methods.base import RoundPanels
from popri.report.runs import Run

#: line styles of the series of one panel (one colour: the run's method)
_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]


def new_fig(ncols: int = 1, nrows: int = 1, width: float = 10.0, height: float = 3.8):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    return fig, axes


def _int_x(ax, xs=None) -> None:
    """Integer ticks: the values themselves when there are few."""
    from matplotlib.ticker import MaxNLocator

    u = sorted({float(x) for x in xs}) if xs else []
    if u and len(u) <= 12 and all(x == int(x) for x in u):
        ax.set_xticks(u, [str(int(x)) for x in u])
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(u) == 1:
        ax.set_xlim(u[0] - 1, u[0] + 1)


def _flat_y(ax) -> None:
    """A y axis whose values barely differ (a loss of 0.69314718 +- 1e-7) is drawn flat around
    them, not as a steep line on an offset axis."""
    ys = [y for ln in ax.get_lines() for y in np.asarray(ln.get_ydata(), dtype=float).ravel()
          if np.isfinite(y)]
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    if not ys:
        return
    lo, hi = min(ys), max(ys)
    mid = (lo + hi) / 2
    if hi - lo <= 1e-4 * max(1.0, abs(mid)):
        pad = max(0.05 * abs(mid), 0.01)
        ax.set_ylim(mid - pad, mid + pad)


def _series(rows: list[dict], key: str, se: str | None = None):
    xs, ys, es = [], [], []
    for r in rows:
        y = _num(r.get(key))
        if y is None:
            continue
        xs.append(r["round"])
        ys.append(y)
        es.append(_num(r.get(se)) or 0.0 if se else 0.0)
    return xs, ys, es


def _n_of(rows: list[dict], key: str | None, values_key: str) -> list[int]:
    """The sample sizes (``key``) of the rows that have a value of ``values_key``."""
    if not key:
        return []
    return [int(v) for r in rows if _num(r.get(values_key)) is not None
            and (v := _num(r.get(key))) is not None]


def _n_words(ns: list[int], unit: str) -> str:
    if not ns:
        return ""
    lo, hi = min(ns), max(ns)
    return f"n = {lo} {unit}" if lo == hi else f"n = {lo}-{hi} {unit}"


def _panels(rows: list[dict], panels: list[dict], suptitle: str, xlabel: str, *,
            method: str | None = None, facts: Callable[[str, str], None] | None = None):
    """One axis per panel that has a curve (a series of two or more rounds): ``{"title",
    "ylabel", "lines": [(key, se_key, label[, n_key, unit[, role]])], "hline": (y, label)}``.
    A panel whose series have one round each is not drawn: its values go to ``facts(what,
    value)``.  Lines are drawn in the run's method colour (line styles tell them apart) or in
    a role colour (chosen / rejected).  None when no panel has a curve."""
    have, col = [], style.colour(method) if method else None
    for p in panels:
        lens = [len(_series(rows, ln[0])[0]) for ln in p["lines"]]
        if any(n >= 2 for n in lens):
            have.append(p)
        elif facts is not None:
            for ln, n in zip(p["lines"], lens):
                if n != 1:
                    continue
                xs, ys, es = _series(rows, ln[0], ln[1])
                ns = _n_of(rows, ln[3] if len(ln) > 3 else None, ln[0])
                v = f"{ys[0]:.4g}" + (f" +- {es[0]:.2g} SE" if es[0] else "")
                unit = ln[4] if len(ln) > 4 else ""
                facts(f"{p['title']}: {ln[2]}", f"{v} (round {xs[0]}"
                      + (f", {ns[0]} {unit}" if ns else "") + ")")
    if not have:
        return None
    fig, axes = new_fig(len(have), width=min(13.0, 4.6 * len(have) + 0.8), height=4.3)
    for ax, p in zip(axes, have):
        allx, sized = [], False
        for i, ln in enumerate(p["lines"]):
            key, se, lab = ln[0], ln[1], ln[2]
            xs, ys, es = _series(rows, key, se)
            if not xs:
                continue
            allx += xs
            ns = _n_of(rows, ln[3] if len(ln) > 3 else None, key)
            if ns:
                lab = f"{lab} ({_n_words(ns, ln[4] if len(ln) > 4 else '')})"
                sized = True
            ls, mk = _STYLES[i % len(_STYLES)]
            c = style.role(ln[5]) if len(ln) > 5 and ln[5] else (col or style.colour(None))
            st = dict(marker=mk, ms=5, lw=1.6, ls=ls, color=c, label=lab)
            if se and any(es):
                ax.errorbar(xs, ys, yerr=es, capsize=3, **st)
            else:
                ax.plot(xs, ys, **st)
        if p.get("hline") is not None:
            y, lab = p["hline"]
            ax.axhline(y, color=style.role("reference"), ls=":", lw=1.2, label=lab)
        ax.set_title(p["title"])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(p["ylabel"])
        if p.get("ylim"):
            lo, hi = ax.get_ylim()
            ax.set_ylim(min(lo, p["ylim"][0]), max(hi, p["ylim"][1]))
        _int_x(ax, allx)
        _flat_y(ax)
        if len(p["lines"]) > 1 or p.get("hline") is not None or sized:
            # below the axes: never over a line
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    fig.suptitle(suptitle)
    return fig


def fig_probe_distance(run: Run, facts):
    rows = run.rows("probe")
    if not rows or run.release:
        return None
    return _panels(rows, [
        {"title": "Mean-embedding cosine (higher = closer)", "ylabel": "cosine to private val",
         "lines": [("mean_cosine", "mean_cosine_se", "mean cosine +- SE", "samples",
                    "samples")]},
        {"title": "MMD² (lower = closer)", "ylabel": "unbiased MMD² (RBF)",
         "lines": [("mmd2", "mmd2_se", "MMD² +- SE", "samples", "samples")]},
    ], f"{run.label}: generator's probe sample vs the private validation split "
       "(private diagnostic)", "round (0 = untuned generator)", method=run.method, facts=facts)


def fig_probe_quality(run: Run, facts):
    rows = run.rows("probe")
    if not rows or run.release:
        return None
    return _panels(rows, [
        {"title": "Distinct n-grams (higher = more diverse)", "ylabel": "distinct-n",
         "lines": [("distinct_1", None, "distinct-1", "samples", "samples"),
                   ("distinct_2", None, "distinct-2", "samples", "samples")]},
        {"title": "Fluency: public model's perplexity",
         "ylabel": "perplexity (lower = more fluent)",
         "lines": [("perplexity", None, "perplexity", "samples", "samples")]},
        {"title": "Self-similarity (lower = more diverse)", "ylabel": "mean pairwise cosine",
         "lines": [("self_cosine", None, "self cosine", "samples", "samples")]},
    ], f"{run.label}: diversity and fluency of the probe sample", "round (0 = untuned generator)",
        method=run.method, facts=facts)


def fig_tuning(run: Run, facts):
    rows = run.rows("dpo") or run.rows("sft")
    if not rows:
        return None
    kind = rows[0]["stage"].upper()
    return _panels(rows, [
        {"title": f"{kind} training loss", "ylabel": "loss",
         "lines": [("train_loss", None, "mean over training"),
                   ("last_epoch_loss", None, "last epoch")]},
        {"title": "Reward margin (chosen - rejected)", "ylabel": "margin",
         "lines": [("train_eval_margin", None, "training pairs", "train_eval_pairs", "pairs"),
                   ("holdout_margin", None, "held-out pairs", "holdout_pairs", "pairs")],
         "hline": (0.0, "no preference")},
        {"title": "Preference accuracy", "ylabel": "share of pairs ranked right",
         "lines": [("train_eval_accuracy", None, "training pairs", "train_eval_pairs", "pairs"),
                   ("holdout_accuracy", None, "held-out pairs", "holdout_pairs", "pairs")],
         "hline": (0.5, "chance")},
    ], f"{run.label}: {kind} tuning per round", "round", method=run.method, facts=facts)


def fig_steps(run: Run):
    """DPO / SFT loss (and DPO reward margin) per logging step, one line per round (shades of
    the method's colour); None unless some round logged two or more steps."""
    per: list[tuple[int, str, list[dict]]] = []
    for t, R in _round_dirs(run.path):
        for kind in ("dpo", "sft"):
            d = _read_json(R / kind / "metrics.json")
            steps = d.get("steps") if isinstance(d, dict) else None
            if isinstance(steps, list):
                steps = [s for s in steps
                         if isinstance(s, dict) and _num(s.get("loss")) is not None]
                if steps:
                    per.append((t, kind, steps))
    if not per or max(len(st) for _, _, st in per) < 2:
        return None
    margins = any(_num(s.get("rewards/margins")) is not None for _, _, st in per for s in st)
    fig, axes = new_fig(2 if margins else 1, width=11.0 if margins else 7.5)
    base = style.colour(run.method)
    for i, (t, kind, st) in enumerate(per):
        c = style.shade(base, i, len(per))
        xs = [s.get("step", j + 1) for j, s in enumerate(st)]
        axes[0].plot(xs, [s["loss"] for s in st], marker=".", lw=1.4, color=c,
                     label=f"round {t} ({kind.upper()})")
        if margins:
            pts = [(x, _num(s.get("rewards/margins"))) for x, s in zip(xs, st)]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                axes[1].plot(*zip(*pts), marker=".", lw=1.4, color=c, label=f"round {t}")
    axes[0].set_title("Training loss per logging step")
    axes[0].set_xlabel("optimizer step (within the round)")
    axes[0].set_ylabel("loss")
    axes[0].legend(loc="best", ncol=1 + len(per) // 6)
    allx = [s.get("step", j + 1) for _, _, st in per for j, s in enumerate(st)]
    _int_x(axes[0], allx)
    if margins:
        axes[1].axhline(0.0, color=style.role("reference"), ls=":", lw=1.2)
        axes[1].set_title("DPO reward margin per logging step")
        axes[1].set_xlabel("optimizer step (within the round)")
        axes[1].set_ylabel("rewards/margins (chosen - rejected)")
        axes[1].legend(loc="best", ncol=1 + len(per) // 6)
        _int_x(axes[1], allx)
    fig.suptitle(f"{run.label}: tuning curves per step")
    return fig


def fig_scores(run: Run, facts):
    rows = run.rows("score")
    rec = [] if run.release else run.rows("prefs")
    pairs = {r["round"]: r.get("pairs") for r in rows}
    rec = [{**r, "pairs": r.get("pairs", pairs.get(r["round"]))} for r in rec]
    panels = [{"title": "Released (DP) scores per round", "ylabel": "mean released score",
               "lines": [("chosen_mean", None, "chosen (pairs)", "pairs", "pairs", "chosen"),
                         ("rejected_mean", None, "rejected (pairs)", "pairs", "pairs",
                          "rejected"),
                         ("released_mean", None, "all samples", "samples", "samples")]}]
    if rec:
        panels.append({"title": "Recovery rate (private diagnostic)",
                       "ylabel": "pairs whose order the exact scores keep",
                       "lines": [("recovery_rate", None, "recovery rate", "pairs", "pairs")],
                       "hline": (0.5, "chance")})
    if not rows and not rec:
        return None
    return _panels(rows + rec, panels, f"{run.label}: DP feedback", "round", method=run.method,
                   facts=facts)


def fig_prefs_hist(run: Run):
    got = []
    for t, R in _round_dirs(run.path):
        pairs = _read_jsonl(R / "prefs.jsonl")
        ch = [v for p in pairs if (v := _num(p.get("chosen_score"))) is not None]
        rj = [v for p in pairs if (v := _num(p.get("rejected_score"))) is not None]
        if ch and rj:
            got.append((t, np.asarray(ch), np.asarray(rj)))
    if not got:
        return None
    if len(got) > 4:  # first, last and two between
        idx = sorted({int(round(i)) for i in np.linspace(0, len(got) - 1, 4)})
        got = [got[i] for i in idx]
    allv = np.concatenate([np.concatenate([c, r]) for _, c, r in got])
    lo, hi = float(allv.min()), float(allv.max())
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    nb = int(min(25, max(6, 2 * math.sqrt(max(len(c) for _, c, _ in got)))))
    bins = np.linspace(lo, hi, nb + 1)
    fig, axes = new_fig(len(got), width=min(15.0, 3.9 * len(got) + 1.0), height=3.6)
    for ax, (t, c, r) in zip(axes, got):
        ax.hist(c, bins=bins, alpha=0.6, color=style.role("chosen"),
                label=f"chosen (mean {c.mean():.3g})")
        ax.hist(r, bins=bins, alpha=0.6, color=style.role("rejected"),
                label=f"rejected (mean {r.mean():.3g})")
        ax.set_title(f"round {t}: {len(c)} pair{'s' if len(c) != 1 else ''}")
        ax.set_xlabel("released (DP) score")
        ax.set_ylabel("pairs")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.legend(loc="best")
    fig.suptitle(f"{run.label}: released scores of the preference pairs")
    return fig


def fig_method_rounds(run: Run, panels: RoundPanels | None, facts):
    """The method's own per-round figure (:meth:`~popri.methods.base.Method.round_panels`)."""
    if panels is None or (panels.private and run.release):  # exact client statistics
        return None
    return _panels(panels.rows, panels.panels, f"{run.label}: {panels.suptitle}", "round",
                   method=run.method, facts=facts)


def fig_downstream(run: Run):
    D = run.path / "downstream"
    if run.release:
        return None
    runs = []
    if D.is_dir():
        for d in sorted(D.iterdir()):
            m = _read_json(d / "metrics.json") if d.is_dir() else None
            if isinstance(m, dict) and isinstance(m.get("history"), list) and m["history"]:
                runs.append((d.name, m))
    # a learning curve's models (NAME-nN, epsinf-all) are drawn by fig_curve, not here
    runs = [(n, m) for n, m in runs if not re.search(r"-n\d+(-d\d+)?$", n)
            and n != "epsinf-all"]
    if not runs:
        return None
    order = {k: i for i, k in enumerate([run.method, "t0", "eps0", "epsinf"])}
    runs.sort(key=lambda x: (re.sub(r"-d\d+$", "", x[0]) not in order,
                             order.get(re.sub(r"-d\d+$", "", x[0]), 0), x[0]))
    fig, axes = new_fig(2, width=11.0, height=4.4)
    allx: list = []
    longest = 0
    for name, m in runs:
        # downstream/NAME: the method's key (popri, t0, eps0, epsinf); NAME-dK: its draw K
        dm = re.fullmatch(r"(.+)-d(\d+)", name)
        key = dm.group(1) if dm and (dm.group(1) in style.LABELS
                                     or dm.group(1) == run.method) else name
        lab = style.method_label(key) + (f" (draw {dm.group(2)})" if key != name else "")
        dash = (0, (1, 1.5)) if key != name else "-"
        hist = [h for h in m["history"] if isinstance(h, dict)]
        init = as_dict(m.get("initial"))
        ep = ([0] if _num(init.get("val_accuracy")) is not None else []) + \
            [h.get("epoch", j + 1) for j, h in enumerate(hist)]
        acc = ([init["val_accuracy"]] if _num(init.get("val_accuracy")) is not None else []) + \
            [h.get("val_accuracy") for h in hist]
        pts = [(x, y) for x, y in zip(ep, acc) if _num(x) is not None and _num(y) is not None]
        allx += [x for x, _ in pts]
        longest = max(longest, len(pts))
        col = style.colour(key)
        if pts:
            axes[0].plot(*zip(*pts), marker="o", lw=1.6, ls=dash, color=col, label=lab)
        best = _num(m.get("best_epoch"))
        if best is not None and pts and best in [p[0] for p in pts]:
            axes[0].plot([best], [dict(pts)[best]], marker="*", ms=14, color=col, ls="none")
        vl = ([(0, init["val_loss"])] if _num(init.get("val_loss")) is not None else []) + \
            [(h.get("epoch", j + 1), h.get("val_loss")) for j, h in enumerate(hist)]
        vl = [(x, y) for x, y in vl if _num(x) is not None and _num(y) is not None]
        if vl:
            axes[1].plot(*zip(*vl), marker="o", lw=1.6, ls=dash, color=col,
                         label=f"{lab}: validation")
        tl = [(h.get("epoch", j + 1), h.get("train_loss")) for j, h in enumerate(hist)]
        tl = [(x, y) for x, y in tl if _num(x) is not None and _num(y) is not None]
        allx += [x for x, _ in vl + tl]
        longest = max(longest, len(vl), len(tl))
        if tl:
            axes[1].plot(*zip(*tl), marker="s", ms=4, lw=1.0, ls="--", color=col, alpha=0.6,
                         label=f"{lab}: training")
    if longest < 2:  # one epoch and no value before training: single dots
        return None
    axes[0].set_title("Validation next-token accuracy (star: epoch kept)")
    axes[0].set_ylabel("accuracy")
    axes[1].set_title("Loss (solid: validation, dashed: training)")
    axes[1].set_ylabel("cross-entropy")
    for ax in axes:
        ax.set_xlabel("epoch (0 = before training)")
        _int_x(ax, allx)
        _flat_y(ax)
    hs, ls_ = axes[0].get_legend_handles_labels()
    if hs:  # one legend for both panels, below them: never over a line
        fig.legend(hs, ls_, loc="outside lower center", ncol=min(4, len(hs)), frameon=False)
    fig.suptitle(f"{run.label}: downstream model training")
    return fig


def fig_curve(run: Run, facts=None):
    """The learning curve in N (issue 65; results.json ``scaling`` and ``curve``): accuracy
    against the final set's size on a log axis, one line per arm with a band of +-1 SE (between
    draws from two draws on, else one draw's SE over test clients), each draw a faint dot,
    eps = 0 a dashed level and eps = inf on all the private training text a star; beside it the
    method minus its T = 0 control at each n, paired, with its band."""
    res = run.results or {}
    summ = [r for r in res.get("scaling") or [] if isinstance(r, dict)]
    rows = [r for r in res.get("curve") or [] if isinstance(r, dict)]
    acc = [r for r in summ if r.get("what") == "accuracy" and _num(r.get("mean")) is not None]
    if len({r.get("n") for r in acc}) < 2:
        return None
    diff = [r for r in summ if r.get("what") == "minus_control"
            and _num(r.get("mean")) is not None]
    fig, axes = new_fig(2 if diff else 1, width=11.5 if diff else 7.0, height=4.4)
    ax = axes[0]
    arms = [a for a in dict.fromkeys([run.method, "t0", "epsinf", "eps0"]
                                     + [r["arm"] for r in acc]) if any(r["arm"] == a for r in acc)]
    kinds = {r.get("se_kind") for r in acc}
    for arm in arms:
        pts = sorted((r["n"], r["mean"], _num(r.get("se")) or 0.0) for r in acc
                     if r["arm"] == arm)
        col, lab = style.colour(arm), style.method_label(arm)
        xs, ys, ses = (np.array(v, dtype=float) for v in zip(*pts))
        if arm == "eps0":  # no training: one level
            ax.axhline(ys.mean(), color=col, ls="--", lw=1.2, label=lab)
            continue
        ax.plot(xs, ys, marker="o", lw=1.8, color=col, label=lab)
        ax.fill_between(xs, ys - ses, ys + ses, color=col, alpha=0.18, lw=0)
        dots = [(r["n"], r["accuracy"]) for r in rows if r.get("arm") == arm
                and not r.get("ceiling") and _num(r.get("accuracy")) is not None]
        if len(dots) > len(pts):  # more than one draw: each a dot
            ax.plot(*zip(*dots), ls="none", marker=".", ms=5, color=col, alpha=0.45)
    top = [r for r in rows if r.get("ceiling") and _num(r.get("accuracy")) is not None]
    for r in top:
        ax.plot([r["n"]], [r["accuracy"]], marker="*", ms=14, ls="none",
                color=style.colour("epsinf"),
                label=f"{style.method_label('epsinf')}, all {r['n']} private texts")
    ns = sorted({float(r["n"]) for r in acc} | {float(r["n"]) for r in top})
    ax.set_xscale("log")
    ax.set_xticks(ns, [str(int(x)) for x in ns])
    ax.minorticks_off()
    ax.set_xlabel("final synthetic set size N (log scale)")
    ax.set_ylabel("next-token accuracy (test)")
    one = [style.method_label(a) for a in arms if a != "eps0" and all(
        r.get("se_kind") != "between draws" for r in acc if r["arm"] == a)]
    band = ("+-1 SE between draws" if not one else
            "+-1 SE over test clients: one draw, no verdict" if kinds == {"over test clients"}
            else f"+-1 SE between draws;\n{', '.join(one)}: one draw's SE over test clients")
    ax.set_title(f"Accuracy vs N (band: {band})", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="best")
    if diff:
        bx = axes[1]
        pts = sorted((r["n"], r["mean"], _num(r.get("se")) or 0.0) for r in diff)
        xs, ys, ses = (np.array(v, dtype=float) for v in zip(*pts))
        col = style.colour(run.method)
        bx.axhline(0, color="0.5", lw=1)
        bx.plot(xs, ys, marker="o", lw=1.8, color=col,
                label=f"{style.method_label(run.method)} minus T = 0")
        bx.fill_between(xs, ys - ses, ys + ses, color=col, alpha=0.18, lw=0)
        bx.set_xscale("log")
        bx.set_xticks(xs, [str(int(x)) for x in xs])
        bx.minorticks_off()
        bx.set_xlabel("final synthetic set size N (log scale)")
        bx.set_ylabel("accuracy difference (paired)")
        dk = {r.get("se_kind") for r in diff}
        bx.set_title("Method minus its T = 0 control (band: +-1 SE "
                     + ("between draws)" if dk == {"between draws"}
                        else "over test clients: one draw, no verdict)"), fontsize=10)
        bx.legend(fontsize=8, frameon=False, loc="best")
        if facts is not None:
            for n, y, se in pts:
                facts(f"minus T = 0 at N = {int(n)}", f"{y:+.4f} +- {se:.4f}")
    fig.suptitle(f"{run.label}: learning curve in N")
    return fig
