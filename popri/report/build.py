"""One report of one or more run directories: a verdict per run, samples of the synthetic
text, tables and figures, as Markdown and as one self-contained HTML file (``popri report
RUN_DIR... --out DIR``).

    popri report runs/study/oracle-s0 runs/compare23/dp-fedavg-s0 --out runs/report

The report opens with a verdict block per run (:mod:`popri.report.verdict`): the
method, its epsilon and the relation it holds under (or NOT A DP GUARANTEE), the paired
difference to its control (the untuned generator, T = 0) and to eps = 0 with 95 % intervals,
one sentence in words, and a figure of those paired differences.  Then a page of samples
(:mod:`popri.report.samples`: the final synthetic set's first samples, a few chosen /
rejected pairs with their released scores), the figures across runs and each run's results
table, per-round values and figures.  Every method has one colour and one label in every figure
(:mod:`popri.report.style`).

Reads only what the runs wrote (docs/formats.md; :mod:`popri.report.read`):
``results.json``, ``metrics.jsonl`` or, where a run has none (older runs, DP-FL runs), the
stages' own files: ``roundT/{dpo,sft}/metrics.json``, ``roundT/scores.npy`` and
``roundT/prefs.jsonl`` (released scores), ``probe/roundT.json``, ``fl/roundT/round.json``,
``downstream/NAME/metrics.json``; every ``ledger.jsonl`` under the run (epsilon spent per round,
composed cumulatively with :func:`popri.privacy.accounting.compose`); ``embeddings/val.npy`` and
an embedding of the synthetic set that already exists on disk (no model is ever loaded here).

What does not apply to a run (a DP-FL figure of a POPri run, a curve of a one-round run) is not
drawn and not mentioned (one round's values are a table line); what could not be read is a note;
a partial run never fails the report.  The report is built in a staging directory next to
``--out`` and swapped into place in one step (:mod:`popri.core.outdir`): a failure or a kill
leaves the earlier report or none, never half of one.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from popri.core.io import read_json_lenient as _read_json
from popri.core.io import read_jsonl_lenient as _read_jsonl
from popri.kit import pair_fields
from popri.report import style
from popri.report.html import CSS, md_to_html
from popri.report.read import (as_dict, clean_results, num as _num, round_dirs as _round_dirs,
                               run_ledger)
from popri.core.errors import InputError
from popri.privacy.accounting import common_delta
from popri.privacy.accounting import compose
from popri.report.verdict import privacy_words
from popri.report.samples import samples_html
from popri.report.samples import samples_markdown
from popri.report.verdict import verdict_html
from popri.report.verdict import verdict_markdown
from popri.core.io import atomic_write
from popri.report.samples import samples as read_samples
from popri.report.verdict import fig_paired_differences
from popri.report.verdict import verdict
from popri.core import outdir
from popri.core.io import writing
from popri.core import runtime
from popri.models.embed import cache_key
from popri.models.embed import embed_spec
from popri.pipeline.results import results_table

#: a directory holding one of these is a run directory (config.resolved.json: a run in progress)
RUN_FILES = ("results.json", "metrics.jsonl", "config.resolved.json")
#: the files of a report (an earlier report's are replaced; anything else in --out is kept)
REPORT_FILES = ("report.md", "report.html")

_RC = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
       "xtick.labelsize": 9, "ytick.labelsize": 9, "figure.titlesize": 12,
       "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
       "axes.spines.right": False, "figure.dpi": 100, "savefig.dpi": 100,
       "savefig.facecolor": "white", "figure.facecolor": "white"}
#: line styles of the series of one panel (one colour: the run's method)
_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]
_Z95 = 1.959963984540054


def is_run_dir(path: str | Path) -> bool:
    """A directory ``popri run`` wrote: it holds results.json, metrics.jsonl or (a run still
    in progress) config.resolved.json."""
    p = Path(path)
    return p.is_dir() and any((p / f).is_file() for f in RUN_FILES)


# --------------------------------------------------------------------------- reading
@dataclass
class _Run:
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


def _derived_metrics(run: _Run) -> list[dict]:
    """The rows of metrics.jsonl rebuilt from the stages' files (as
    :func:`popri.methods.popri.recipe.round_metrics` writes them), for runs without one."""
    rows: list[dict] = []
    P = run.path / "probe"
    probe = {}
    for f in (P.iterdir() if P.is_dir() else []):
        m = re.fullmatch(r"round(\d+)\.json", f.name)
        if m:
            probe[int(m.group(1))] = _read_json(f, run.notes)
    for t, p in sorted(probe.items()):
        if isinstance(p, dict):
            rows.append({"round": t, "stage": "probe", "private_diagnostic": True,
                         **{k: p.get(k) for k in ("mean_cosine", "mean_cosine_se", "mmd2",
                                                  "mmd2_se", "self_cosine", "distinct_1",
                                                  "distinct_2", "perplexity", "loss", "samples")}})
    for t, R in _round_dirs(run.path):
        row: dict = {}
        if (R / "scores.npy").is_file():
            try:
                s = np.load(R / "scores.npy", allow_pickle=False)
                if s.size:
                    row |= {"released_mean": float(np.mean(s)), "samples": int(s.size)}
            except (OSError, ValueError):
                run.notes.append(f"{R / 'scores.npy'}: unreadable, ignored")
        pairs = _read_jsonl(R / "prefs.jsonl", run.notes)
        ch = [v for p in pairs if (v := _num(p.get("chosen_score"))) is not None]
        rj = [v for p in pairs if (v := _num(p.get("rejected_score"))) is not None]
        if ch and rj:
            row |= {"chosen_mean": float(np.mean(ch)), "rejected_mean": float(np.mean(rj)),
                    "pairs": len(pairs)}
        if row:
            rows.append({"round": t, "stage": "score", **row})
        rep = _read_json(R / "prefs_report.json")
        if isinstance(rep, dict) and _num(rep.get("recovery_rate")) is not None:
            rows.append({"round": t, "stage": "prefs", "private_diagnostic": True,
                         "recovery_rate": rep["recovery_rate"]})
        for kind in ("dpo", "sft"):
            d = _read_json(R / kind / "metrics.json")
            if isinstance(d, dict):
                ep = (d.get("epochs") or [{}])[-1] if isinstance(d.get("epochs"), list) else {}
                row2 = {"round": t, "stage": kind, "train_loss": d.get("train_loss"),
                        "last_epoch_loss": ep.get("loss") if isinstance(ep, dict) else None,
                        "steps": d.get("global_step")}
                row2 |= pair_fields(d)
                rows.append(row2)
    if not any(r["stage"] == "prefs" for r in rows) and isinstance(run.results, dict):
        for t, v in enumerate(run.results.get("recovery_rate_per_round") or [], start=1):
            if run.release:
                break
            if _num(v) is not None:
                rows.append({"round": t, "stage": "prefs", "recovery_rate": v})
    return rows


def _load_run(path: str, label: str, slug: str) -> _Run:
    p = Path(path)
    run = _Run(p, label, slug)
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
        run.metrics = _derived_metrics(run)
        run.metrics_source = "the stages' files (no metrics.jsonl)"
    return run


def _slugs(labels: list[str]) -> list[str]:
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


def _labels(paths: list[str]) -> list[str]:
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


# --------------------------------------------------------------------------- figures
@dataclass
class _Fig:
    name: str
    title: str
    caption: str
    section: str


class _Report:
    def __init__(self, out: Path):
        self.out = out
        self.figures: list[_Fig] = []
        self.notes: list[tuple[str, str]] = []  # (section, text)
        self.facts: list[tuple[str, str, str]] = []  # (section, what, value): one-round values
        self.not_shown: list[tuple[str, str]] = []  # nothing to show: not in the report
        self.palette: dict[str, dict[str, str]] = {}  # figure -> {method key: colour}

    def note(self, section: str, text: str) -> None:
        self.notes.append((section, text))

    def fact(self, section: str, what: str, value: str) -> None:
        self.facts.append((section, what, value))

    def figure(self, section: str, name: str, title: str, caption: str,
               draw: Callable[[], Any]) -> None:
        """Run ``draw()`` -> a matplotlib Figure, None (nothing to show: not drawn, not said)
        or a str (why it could not be drawn: a note); save it.  An error while drawing is a
        note (a partial run never fails the report); an error while writing (a full disk) is
        not: the report fails whole."""
        import matplotlib

        used = {f.name for f in self.figures}
        stem, k = name[:-4], 2
        while name in used:
            name, k = f"{stem}-{k}.png", k + 1
        with matplotlib.rc_context(_RC), style.recording() as pal:
            try:
                fig = draw()
            except Exception as e:  # noqa: BLE001 -- a partial run must never fail the report
                self.note(section, f"{title}: not drawn ({type(e).__name__}: {e})")
                return
            if fig is None:
                self.not_shown.append((section, f": {title}"))
                return
            if isinstance(fig, str):
                self.note(section, f"{title}: not drawn ({fig})")
                return

            with writing(self.out / name):  # an OSError names the file
                fig.savefig(self.out / name, format="png")
        self.palette[name] = dict(pal)
        self.figures.append(_Fig(name, title, caption, section))


def _new_fig(ncols: int = 1, nrows: int = 1, width: float = 10.0, height: float = 3.8):
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
    fig, axes = _new_fig(len(have), width=min(13.0, 4.6 * len(have) + 0.8), height=4.3)
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


def _fig_probe_distance(run: _Run, facts):
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


def _fig_probe_quality(run: _Run, facts):
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


def _fig_tuning(run: _Run, facts):
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


def _fig_steps(run: _Run):
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
    fig, axes = _new_fig(2 if margins else 1, width=11.0 if margins else 7.5)
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


def _fig_scores(run: _Run, facts):
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


def _fig_prefs_hist(run: _Run):
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
    fig, axes = _new_fig(len(got), width=min(15.0, 3.9 * len(got) + 1.0), height=3.6)
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


def _fl_rounds(run: _Run) -> list[dict]:
    rows = []
    for t, R in _round_dirs(run.path / "fl"):
        d = _read_json(R / "round.json")
        if isinstance(d, dict):
            pd = as_dict(d.get("private_diagnostics"))
            rows.append({"round": t, **{k: pd.get(k) for k in (
                "local_loss", "update_norm_mean", "update_norm_max", "clipped_share",
                "participants")},
                "clip": as_dict(d.get("spec")).get("clip")})
    fl = as_dict((run.results or {}).get("fl"))
    if not rows and isinstance(fl.get("rounds"), list):
        for r in fl["rounds"]:
            if isinstance(r, dict) and _num(r.get("round")) is not None:
                rows.append({"round": r["round"], **as_dict(r.get("private_diagnostics")),
                             "clip": fl.get("clip")})
    return rows


def _fig_fl(run: _Run, facts):
    if run.release:  # exact client statistics: never in a release-mode report
        return None
    rows = _fl_rounds(run)
    if not rows:
        return None
    clip = next((c for r in rows if (c := _num(r.get("clip"))) is not None), None)
    return _panels(rows, [
        {"title": "Clients' local training loss", "ylabel": "mean local loss",
         "lines": [("local_loss", None, "local loss", "participants", "clients")]},
        {"title": "Client update norms", "ylabel": "L2 norm of the update",
         "lines": [("update_norm_mean", None, "mean", "participants", "clients"),
                   ("update_norm_max", None, "max")],
         "hline": (clip, f"clip = {clip:g}") if clip is not None else None},
        {"title": "Share of updates clipped", "ylabel": "clipped share",
         "lines": [("clipped_share", None, "clipped share", "participants", "clients")],
         "ylim": (-0.02, 1.05)},
    ], f"{run.label}: DP-FL rounds (private diagnostics: exact client statistics, never publish)",
        "round", method=run.method, facts=facts)


def _fig_downstream(run: _Run):
    D = run.path / "downstream"
    if run.release:
        return None
    runs = []
    if D.is_dir():
        for d in sorted(D.iterdir()):
            m = _read_json(d / "metrics.json") if d.is_dir() else None
            if isinstance(m, dict) and isinstance(m.get("history"), list) and m["history"]:
                runs.append((d.name, m))
    if not runs:
        return None
    order = {k: i for i, k in enumerate([run.method, "t0", "eps0", "epsinf"])}
    runs.sort(key=lambda x: (re.sub(r"-d\d+$", "", x[0]) not in order,
                             order.get(re.sub(r"-d\d+$", "", x[0]), 0), x[0]))
    fig, axes = _new_fig(2, width=11.0, height=4.4)
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


# ------------------------------------------------------------------ embeddings (PCA)
def _load_set(p: Path) -> tuple[np.ndarray, dict] | None:
    if not p.is_file():
        return None
    try:
        e = np.load(p, allow_pickle=False)
    except (OSError, ValueError):
        return None
    if not (isinstance(e, np.ndarray) and e.ndim == 2 and e.shape[0] >= 1
            and np.issubdtype(e.dtype, np.floating)):
        return None
    meta = _read_json(p.with_name(p.stem + ".meta.json"))
    return np.asarray(e, dtype=np.float64), meta if isinstance(meta, dict) else {}


def _cached_embedding(texts_file: Path, meta: dict) -> np.ndarray | None:
    """The embedding of ``texts_file`` that a stage left in popri's embedding cache (same
    model, normalisation and max length as the validation set), if any: never computed."""
    rows = _read_jsonl(texts_file)
    texts = [r.get("text") for r in rows]
    if not texts or not all(isinstance(t, str) for t in texts):
        return None
    try:
        specs = [embed_spec(meta.get("model"), normalize=meta.get("normalize"),
                            max_length=meta.get("max_length")), embed_spec(meta.get("model"))]
        for spec in specs:
            f = runtime.cache_dir() / "embeddings" / f"{cache_key(spec, texts)}.npy"
            if f.is_file():
                e = np.load(f, allow_pickle=False)
                if e.ndim == 2 and len(e) == len(texts):
                    return np.asarray(e, dtype=np.float64)
    except Exception:  # noqa: BLE001 -- only a lookup
        return None
    return None


def _synthetic_embeddings(run: _Run, meta: dict) -> tuple[np.ndarray, str, str] | None:
    """(embeddings, what they are, a short legend label), or None."""
    P = run.path
    for name in ("embeddings/synthetic.npy", "synthetic.npy", "embeddings/syn.npy"):
        s = _load_set(P / name)
        if s is not None:
            return s[0], f"the synthetic set ({name})", "synthetic"
    if (P / "synthetic.jsonl").is_file():
        e = _cached_embedding(P / "synthetic.jsonl", meta)
        if e is not None:
            return e, "the synthetic set (synthetic.jsonl, embedding from the cache)", "synthetic"
    probes = sorted(((int(m.group(1)), f) for f in ((P / "probe").iterdir()
                     if (P / "probe").is_dir() else [])
                     if (m := re.fullmatch(r"round(\d+)\.jsonl", f.name))), reverse=True)
    for t, f in probes:
        s = _load_set(f.with_suffix(".npy"))
        e = s[0] if s is not None else _cached_embedding(f, meta)
        if e is not None:
            return e, f"the round-{t} probe sample (probe/round{t}.jsonl)", f"probe round {t}"
    return None


def _fig_pca(run: _Run):
    if run.release:  # the private validation split: a private diagnostic
        return None
    val = _load_set(run.path / "embeddings" / "val.npy")
    if val is None:
        return None
    V, meta = val
    got = _synthetic_embeddings(run, meta)
    if got is None:
        return None
    S, what, short = got
    if S.shape[1] != V.shape[1]:
        return f"dimensions differ ({S.shape[1]} vs {V.shape[1]})"
    if len(V) + len(S) < 3:
        return None
    rng = np.random.default_rng(0)
    cap = 3000
    V = V[rng.choice(len(V), cap, replace=False)] if len(V) > cap else V
    S = S[rng.choice(len(S), cap, replace=False)] if len(S) > cap else S
    X = np.concatenate([V, S])
    mu = X.mean(axis=0)
    _, sv, vt = np.linalg.svd(X - mu, full_matrices=False)
    var = sv ** 2 / max(float((sv ** 2).sum()), 1e-300)
    W = vt[:2].T if vt.shape[0] >= 2 else np.pad(vt.T, ((0, 0), (0, 2 - vt.shape[0])))
    pv, ps = (V - mu) @ W, (S - mu) @ W
    fig, axes = _new_fig(1, width=7.5, height=6.0)
    ax = axes[0]
    cv, cs = style.colour("epsinf"), style.colour(run.method)  # the private data; the method
    ax.scatter(pv[:, 0], pv[:, 1], s=12, alpha=0.4, color=cv,
               label=f"private validation split (n = {len(V)})")
    ax.scatter(ps[:, 0], ps[:, 1], s=14, alpha=0.55, color=cs, marker="^",
               label=f"{short} (n = {len(S)})")
    for P_, col, lab in ((pv, cv, "private validation split: mean"), (ps, cs, f"{short}: mean")):
        ax.scatter(*P_.mean(axis=0), s=180, color=col, edgecolor="white", marker="X", zorder=5,
                   label=lab)
    ax.set_xlabel(f"PC1 ({100 * var[0]:.1f}% of variance)")
    ax.set_ylabel(f"PC2 ({100 * (var[1] if len(var) > 1 else 0):.1f}% of variance)")
    # wrapped: the synthetic set's description is long and the axes are square
    ax.set_title(f"{run.label}: PCA of sentence embeddings (a private diagnostic)\n{what}\n"
                 "vs the private validation split", fontsize=10)
    ax.legend(loc="best")
    ax.set_aspect("equal", adjustable="datalim")
    return fig


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


def _privacy_spent(run: _Run, report: _Report, section: str) -> dict | None:
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


def _fig_epsilon(run: _Run, d: dict | None):
    if d is None:
        return None
    xs, eps = d["x"], d["epsilon"]
    fin = [(x, e) for x, e in zip(xs, eps) if math.isfinite(e)]
    if len(fin) < 2:  # one round: the table line says it
        return None
    fx, fe = zip(*fin)
    inc = [fe[0]] + [b - a for a, b in zip(fe, fe[1:])]
    fig, axes = _new_fig(1, width=8.0, height=4.2)
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
                 + ("" if dp else "\nNOT A DP GUARANTEE (papers' convention)"))
    ax.margins(y=0.15)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3, frameon=False)
    return fig


# --------------------------------------------------------------------------- across runs
def _acc_rows(runs: list[_Run]) -> list[dict]:
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


def _fig_methods(runs: list[_Run]):
    rows = _acc_rows(runs)
    if len(rows) < 2:  # one accuracy: the verdict says it
        return None
    n = len(rows)
    fig, axes = _new_fig(1, width=10.0, height=max(2.4, 0.45 * n + 1.3))
    ax = axes[0]
    ys = list(range(n))[::-1]
    for y, r in zip(ys, rows):
        col = style.colour(r["method"])
        se = r["se"]
        ax.errorbar([r["acc"]], [y], xerr=[[_Z95 * se], [_Z95 * se]] if se else None,
                    fmt="o", ms=7, capsize=4, color=col)
        ax.annotate(f"{r['acc']:.4f}" + (f" ± {_Z95 * se:.4f}" if se else " (no SE)"),
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


def _fig_privacy_utility(runs: list[_Run], report: _Report, section: str):
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
    fig, axes = _new_fig(2 if gaps else 1, width=12.0 if gaps else 7.5, height=5.0)
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
def _table_text(r: dict) -> str:
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


# --------------------------------------------------------------------------- writing
#: the report's sections, in order
_VERDICT, _ACROSS = "\0verdict", "\0across"  # no run label (a path) holds a NUL
_SAMPLES = "Samples (synthetic text)"
_TITLES = {_VERDICT: "Verdict", _ACROSS: "Across runs"}


def _md_results(text: str) -> str:
    """A results table (popri's own Markdown, run-derived values inside) safe to render: HTML
    special characters as entities, link and code brackets escaped."""
    return "\n".join(re.sub(r"([\[\]`])", r"\\\1", style.md_html_only(line))
                     for line in text.splitlines())


def _figure_md(f: _Fig) -> list[str]:
    return [f"![{style.md_text(f.title)}]({f.name})", "",
            f"*{style.md_text(f.title)}* ({style.md_text(f.name)}): {style.md_text(f.caption)}",
            ""]


def _figure_html(report: _Report, f: _Fig) -> str:
    data = base64.b64encode((report.out / f.name).read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(f.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>{html.escape(f.title)}</b> ({html.escape(f.name)}): "
            f"{html.escape(f.caption)}</figcaption></figure>")


def _write(report: _Report, runs: list[_Run], tables: dict[str, str], verdicts: list[dict],
           samples: dict[str, dict]) -> tuple[Path, Path]:
    md = ["# popri report", "",
          "Runs: " + ", ".join(style.md_text(r.path) for r in runs), ""]
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         '<meta name="viewport" content="width=device-width, initial-scale=1">',
         "<title>popri report</title>", f"<style>{CSS}</style></head><body>",
         "<h1>popri report</h1>",
         '<p class="meta">Runs: ' + ", ".join(f"<code>{html.escape(str(r.path))}</code>"
                                              for r in runs) + "</p>"]

    def figures_and_notes(sec: str) -> None:
        for f in (f for f in report.figures if f.section == sec):
            md.extend(_figure_md(f))
            h.append(_figure_html(report, f))
        notes = [n for s, n in report.notes if s == sec]
        if notes:
            md.extend(["#### Notes", ""] + [f"- {style.md_text(n)}" for n in notes] + [""])
            h.extend(["<h4>Notes</h4>", '<ul class="notes">']
                     + [f"<li>{html.escape(n)}</li>" for n in notes] + ["</ul>"])

    md += ["## Verdict", ""]
    h.append("<h2>Verdict</h2>")
    for v in verdicts:
        md += verdict_markdown(v)
        h.append(verdict_html(v))
    figures_and_notes(_VERDICT)
    if samples:
        md += [f"## {_SAMPLES}", ""]
        h.append(f"<h2>{html.escape(_SAMPLES)}</h2>")
        for run in runs:
            if run.label in samples:
                md += [f"### {style.md_text(run.label)}", ""] + samples_markdown(samples[run.label])
                h += [f"<h3>{html.escape(run.label)}</h3>", samples_html(samples[run.label])]
    if any(f.section == _ACROSS for f in report.figures) or \
            any(s == _ACROSS for s, _ in report.notes):
        md += ["## Across runs", ""]
        h.append("<h2>Across runs</h2>")
        figures_and_notes(_ACROSS)
    for run in runs:
        sec = run.label
        title = f"Run {sec}"
        md += [f"## {style.md_text(title)}", "",
               f"Directory: {style.md_text(run.path)}; per-round metrics from "
               f"{style.md_text(run.metrics_source)}.", ""]
        h += [f"<h2>{html.escape(title)}</h2>",
              f'<p class="meta">Directory: <code>{html.escape(str(run.path))}</code>; '
              f"per-round metrics from {html.escape(run.metrics_source)}.</p>"]
        if sec in tables:
            md += ["### Results", "", _md_results(tables[sec]), ""]
            h += ["<h3>Results</h3>", md_to_html(tables[sec])]
        facts = [(w, v) for s, w, v in report.facts if s == sec]
        if facts:
            md += ["### Per-round values", "", "| what | value |", "|---|---|"]
            md += [f"| {style.md_text(w)} | {style.md_text(v)} |" for w, v in facts] + [""]
            h += ["<h3>Per-round values</h3>", "<table><tbody>"]
            h += [f"<tr><th>{html.escape(w)}</th><td>{html.escape(v)}</td></tr>"
                  for w, v in facts] + ["</tbody></table>"]
        if any(f.section == sec for f in report.figures):
            md += ["### Figures", ""]
            h.append("<h3>Figures</h3>")
        figures_and_notes(sec)
    h.append("</body></html>")
    md_path, html_path = report.out / "report.md", report.out / "report.html"

    with atomic_write(md_path) as fh:
        fh.write("\n".join(md).rstrip() + "\n")
    with atomic_write(html_path) as fh:
        fh.write("\n".join(h) + "\n")
    return md_path, html_path


def _run_section(report: _Report, run: _Run, tables: dict[str, str]) -> dict | None:
    """One run's table, per-round values and figures; returns its epsilon per round."""
    sec, s = run.label, run.slug
    for n in run.notes:
        report.note(sec, n)
    run.notes.clear()
    if run.results is not None:
        tables[sec] = _table_text(run.results)
    elif not (run.path / "results.json").is_file():
        report.note(sec, "no results.json (the run has not finished): no results table")
    if not run.metrics and (run.path / "metrics.jsonl").is_file():
        report.note(sec, "metrics.jsonl has no rows")

    def facts(what: str, value: str) -> None:
        report.fact(sec, what, value)

    fig = report.figure
    fig(sec, f"{s}-probe-distance.png", "Probe: distance to the private validation split",
        "mean-embedding cosine and unbiased MMD² of the round's generator sample (fixed "
        "prompts and seeds) against the private validation embeddings; error bars ±1 "
        "bootstrap SE; n: the probe's samples. A private diagnostic, never a release.",
        lambda: _fig_probe_distance(run, facts))
    fig(sec, f"{s}-probe-quality.png", "Probe: diversity and fluency",
        "distinct-1/2 n-gram shares, the public model's perplexity and the mean pairwise "
        "cosine of the probe sample per round.", lambda: _fig_probe_quality(run, facts))
    fig(sec, f"{s}-tuning.png", "DPO / SFT per round",
        "training loss, exact reward margin and preference accuracy on the training and "
        "the held-out preference pairs (n: pairs), per round.", lambda: _fig_tuning(run, facts))
    fig(sec, f"{s}-tuning-steps.png", "DPO / SFT per step",
        "loss (and DPO reward margin) at each logging step of each round's tuning, from "
        "roundT/dpo|sft/metrics.json; darker = earlier round.", lambda: _fig_steps(run))
    rec = bool(run.rows("prefs")) and not run.release
    fig(sec, f"{s}-scores.png", "Released scores" + (" and recovery rate" if rec else ""),
        "mean DP-released score of the round's samples and of the preference pairs' "
        "chosen / rejected samples; n: samples or pairs" + (
            "; recovery rate: share of pairs whose order the noise-free scores agree with (a "
            "private diagnostic, POPri Fig. 6)." if rec else "."),
        lambda: _fig_scores(run, facts))
    fig(sec, f"{s}-prefs-hist.png", "Chosen vs rejected released scores",
        "histograms of the released scores of the chosen and rejected samples of the "
        "preference pairs (roundT/prefs.jsonl); at most four rounds shown.",
        lambda: _fig_prefs_hist(run))
    fig(sec, f"{s}-fl-rounds.png", "DP-FL rounds",
        "clients' local loss, update norms (against the clip) and the share clipped, per "
        "round (fl/roundT/round.json private_diagnostics: never publish); n: clients.",
        lambda: _fig_fl(run, facts))
    fig(sec, f"{s}-downstream.png", "Downstream training",
        "validation next-token accuracy and loss per epoch of each downstream model "
        "(downstream/NAME/metrics.json), in the colour of its method.",
        lambda: _fig_downstream(run))
    fig(sec, f"{s}-pca.png", "PCA of embeddings",
        "the first two principal components (numpy SVD of both sets together) of the "
        "synthetic set's and the private validation split's sentence embeddings (a private "
        "diagnostic).", lambda: _fig_pca(run))
    spent = _privacy_spent(run, report, sec)
    fig(sec, f"{s}-epsilon.png", "Privacy spent per round",
        "epsilon of every ledger.jsonl under the run, composed cumulatively round by round "
        "(popri.privacy.accounting.compose; entries deduplicated by release id).",
        lambda: _fig_epsilon(run, spent))
    return spent


def _build(run_dirs: list[str], outp: Path) -> dict:
    """Write the report into the (staging) directory ``outp``."""
    report = _Report(outp)
    labels = _labels(list(run_dirs))
    runs = [_load_run(p, lab, slug) for p, lab, slug in zip(run_dirs, labels, _slugs(labels))]

    verdicts, samples, spent = [], {}, {}
    for run in runs:
        try:
            verdicts.append(verdict(run.path, run.label, run.results))
        except Exception as e:  # noqa: BLE001 -- a partial run never fails the report
            report.note(run.label, f"verdict: not made ({type(e).__name__}: {e})")
            verdicts.append(verdict(run.path, run.label, None))
        try:
            got = read_samples(run.path, run.results, run.notes)
        except Exception as e:  # noqa: BLE001
            run.notes.append(f"samples: not shown ({type(e).__name__}: {e})")
            got = None
        if got is not None:
            samples[run.label] = got
    report.figure(_VERDICT, "paired-differences.png", "Paired differences",
                  "each run's method minus its untuned generator (T = 0; circles) and minus "
                  "the public model (eps = 0; squares), with 95% intervals; the interval "
                  "excludes 0 only where the method's difference is clear. Filled: paired over "
                  "the same test clients (or over draws, Student's t); open: unpaired or no "
                  "interval.", lambda: fig_paired_differences(verdicts, _new_fig))
    tables: dict[str, str] = {}
    for run in runs:
        d = _run_section(report, run, tables)
        if d is not None:
            spent[run.label] = {"x": d["x"], "epsilon": d["epsilon"], "by_round": d["by_round"],
                                "entries": d["entries"]}
    report.figure(_ACROSS, "method-comparison.png", "Accuracy of each model",
                  "next-token accuracy of each run's method and of its untuned generator "
                  "(T = 0), public model (eps = 0) and private-data (eps = inf) rows, each with "
                  "its own 95% interval (±1.96 SE over test clients). Whether a method beat its "
                  "comparison is the paired difference (Verdict), not the overlap of these.",
                  lambda: _fig_methods(runs))
    report.figure(_ACROSS, "privacy-utility.png", "Privacy-utility",
                  "accuracy (and gap closed, where present) against each run's epsilon, error "
                  "bars ±1 SE; dashed lines: the eps = 0 and eps = inf accuracies.",
                  lambda: _fig_privacy_utility(runs, report, _ACROSS))
    md_path, html_path = _write(report, runs, tables, verdicts, samples)
    return {"figures": [f.name for f in report.figures],
            "notes": [f"{_TITLES.get(s, s)}: {n}" for s, n in report.notes],
            "not_shown": [_TITLES.get(s, s) + t for s, t in report.not_shown],
            "verdicts": [{k: v[k] for k in ("run", "method", "mode", "privacy", "dp_guarantee",
                                            "sentence", "control", "eps0", "gap_closed")}
                         for v in verdicts],
            "epsilon": spent, "palette": report.palette,
            "html": html_path.name, "md": md_path.name}


def check_out(out: str | os.PathLike, run_dirs: list[str]) -> Path:
    """Refuse an --out the report must not replace (popri.core.outdir.check: '-', a file, an
    input, a ledger, a foreign non-empty directory; and popri's other outputs): InputError."""
    if os.fspath(out) in ("", "-"):
        raise InputError("--out must be a directory (the report is report.md, report.html and "
                         "its PNG figures): it cannot go to stdout ('-')")
    dest = outdir.check(out, inputs=run_dirs)
    if dest.is_dir() and any(dest.iterdir()):
        kind = _kind(dest / outdir.MARKER)
        if kind != "report":  # another output of popri's (a model, a round): not ours to mix
            raise InputError(f"holds popri's {kind or 'unmarked'} output, not a report; choose "
                             "another --out", path=str(out))
    return dest


def _kind(marker: Path) -> str | None:
    import json

    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("kind")
    except (OSError, ValueError, AttributeError):
        return None


def _carry_over(old: Path, new: Path) -> None:
    """What the user keeps in an earlier report's directory (their notes, anything not the
    report's own files: report.md, report.html, the PNGs, popri's marker) moves into the new
    report unchanged (hard links where possible; links copied as links)."""
    if not old.is_dir() or old.is_symlink():
        return

    def link_or_copy(src, dst):
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            shutil.copy2(src, dst, follow_symlinks=False)

    for e in old.iterdir():
        if e.name in (*REPORT_FILES, outdir.MARKER) or e.suffix.lower() == ".png" \
                or e.name.startswith(".") or (new / e.name).exists():
            continue
        if e.is_symlink():
            os.symlink(os.readlink(e), new / e.name)
        elif e.is_dir():
            shutil.copytree(e, new / e.name, symlinks=True, copy_function=link_or_copy)
        else:
            link_or_copy(e, new / e.name)


def build_report(run_dirs: list[str], out: str) -> dict:
    """Write report.md, report.html and the figures (PNG) of ``run_dirs`` into ``out``.
    Returns {"figures": [file names], "notes": [...], "not_shown", "verdicts", "epsilon",
    "palette", "html": path, "md": path}.

    ``out`` is checked (:func:`check_out`), the report built in a staging directory next to it
    and swapped into place in one step (:func:`popri.core.outdir.replace`, with the marker): an
    error or a signal leaves the earlier report (or nothing), never part of one, and a rerun
    works.  The user's own files in an earlier report's directory are kept."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    dest = check_out(out, list(run_dirs))
    tmp = outdir.staging_dir(dest)
    try:
        res = _build(list(run_dirs), tmp)
        _carry_over(dest, tmp)
        outdir.replace(tmp, dest, kind="report")
    except BaseException as e:
        if isinstance(e, OSError) and e.filename is not None:  # name the output, not the stage
            f = os.fspath(e.filename)
            if f.startswith(str(tmp)):
                e.filename = str(dest) + f[len(str(tmp)):]
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    res["html"], res["md"] = str(dest / res["html"]), str(dest / res["md"])
    return res


__all__ = ["build_report", "check_out", "is_run_dir", "epsilon_per_round", "RUN_FILES"]
