"""One report of one or more run directories: tables and figures, as Markdown and as one
self-contained HTML file (``popri report RUN_DIR... --out DIR``).

    popri report runs/study/oracle-s0 runs/compare23/dp-fedavg-s0 --out runs/report

Reads only what the runs wrote (docs/formats.md): ``results.json`` (the results table, the
methods' accuracies with their SEs, gap closed, the control), ``metrics.jsonl`` (per-round
probe distances, diversity and fluency, DPO / SFT losses and held-out margins, the released
scores, the recovery rate) and, where a run has no ``metrics.jsonl`` (older runs, DP-FL runs),
the stages' own files: ``roundT/{dpo,sft}/metrics.json`` (loss per step), ``roundT/scores.npy``
and ``roundT/prefs.jsonl`` (released scores), ``probe/roundT.json``, ``fl/roundT/round.json``
(DP-FL rounds), ``downstream/NAME/metrics.json`` (accuracy per epoch); every ``ledger.jsonl``
under the run (epsilon spent per round, composed cumulatively with
:func:`popri.privacy.accounting.compose`); ``embeddings/val.npy`` and an embedding of the
synthetic set that already exists on disk (a 2-D PCA; no model is ever loaded here).

A figure whose data are missing is skipped with a one-line note; a partial run never fails the
report.  Figures are PNG files (matplotlib, Agg) next to ``report.md``; ``report.html`` embeds
them as data URIs and needs nothing else.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

#: a directory holding one of these is a run directory (config.resolved.json: a run in progress)
RUN_FILES = ("results.json", "metrics.jsonl", "config.resolved.json")

_RC = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
       "xtick.labelsize": 9, "ytick.labelsize": 9, "figure.titlesize": 12,
       "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
       "axes.spines.right": False, "figure.dpi": 100, "savefig.dpi": 100,
       "savefig.facecolor": "white", "figure.facecolor": "white"}
_C = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
      "#bcbd22", "#17becf"]
_METHOD_LABELS = {"t0": "T = 0 (untuned generator)", "eps0": "eps = 0 (public model)",
                  "epsinf": "eps = inf (private data)"}
_Z95 = 1.959963984540054


def is_run_dir(path: str | Path) -> bool:
    """A directory ``popri run`` wrote: it holds results.json, metrics.jsonl or (a run still
    in progress) config.resolved.json."""
    p = Path(path)
    return p.is_dir() and any((p / f).is_file() for f in RUN_FILES)


# --------------------------------------------------------------------------- reading
def _num(x: Any) -> float | None:
    """A finite float, else None (missing, null, NaN, a string)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _read_json(p: Path, notes: list[str] | None = None) -> Any:
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        if notes is not None:
            notes.append(f"{p}: unreadable ({type(e).__name__}), ignored")
        return None


def _read_jsonl(p: Path, notes: list[str] | None = None) -> list[dict]:
    rows: list[dict] = []
    if not p.is_file():
        return rows
    bad = 0
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, ValueError):
        text, bad = "", 1
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(r, dict):
            rows.append(r)
    if bad and notes is not None:
        notes.append(f"{p}: {bad} unreadable line(s) ignored (a file still being written?)")
    return rows


def _round_dirs(base: Path, prefix: str = "round") -> list[tuple[int, Path]]:
    out = []
    if base.is_dir():
        for d in base.iterdir():
            m = re.fullmatch(prefix + r"(\d+)", d.name)
            if m and d.is_dir():
                out.append((int(m.group(1)), d))
    return sorted(out)


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
        if r.get("method"):
            return str(r["method"])
        cfg = _read_json(self.path / "config.resolved.json")
        return str(cfg.get("method")) if isinstance(cfg, dict) and cfg.get("method") else None

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
                ep = (d.get("epochs") or [{}])[-1]
                row2 = {"round": t, "stage": kind, "train_loss": d.get("train_loss"),
                        "last_epoch_loss": ep.get("loss") if isinstance(ep, dict) else None,
                        "steps": d.get("global_step")}
                for key in ("train_eval", "holdout"):
                    if isinstance(d.get(key), dict):
                        row2 |= {f"{key}_margin": d[key].get("margin"),
                                 f"{key}_accuracy": d[key].get("accuracy")}
                rows.append(row2)
    if not any(r["stage"] == "prefs" for r in rows) and isinstance(run.results, dict):
        for t, v in enumerate(run.results.get("recovery_rate_per_round") or [], start=1):
            if _num(v) is not None:
                rows.append({"round": t, "stage": "prefs", "recovery_rate": v})
    return rows


def _load_run(path: str, label: str) -> _Run:
    p = Path(path)
    run = _Run(p, label, re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-") or "run")
    r = _read_json(p / "results.json", run.notes)
    if isinstance(r, dict):
        run.results = r
    elif (p / "results.json").is_file():
        run.notes.append("results.json is not a JSON object: no results table")
    if (p / "metrics.jsonl").is_file():
        run.metrics = _read_jsonl(p / "metrics.jsonl", run.notes)
    else:
        run.metrics = _derived_metrics(run)
        run.metrics_source = "the stages' files (no metrics.jsonl)"
    return run


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

    def note(self, section: str, text: str) -> None:
        self.notes.append((section, text))

    def figure(self, section: str, name: str, title: str, caption: str,
               draw: Callable[[], Any]) -> None:
        """Run ``draw()`` -> a matplotlib Figure or a str (the reason to skip); save it."""
        import matplotlib

        try:
            with matplotlib.rc_context(_RC):
                fig = draw()
                if isinstance(fig, str) or fig is None:
                    self.note(section, f"{title}: skipped ({fig or 'no data'})")
                    return
                fig.savefig(self.out / name, format="png")
        except Exception as e:  # noqa: BLE001 -- a partial run must never fail the report
            self.note(section, f"{title}: skipped ({type(e).__name__}: {e})")
            return
        self.figures.append(_Fig(name, title, caption, section))


def _new_fig(ncols: int = 1, nrows: int = 1, width: float = 10.0, height: float = 3.8):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    return fig, axes


def _int_x(ax, xs=None) -> None:
    """Integer ticks: the values themselves when there are few (one round alone gets a
    centred axis, not matplotlib's +-0.05 around it)."""
    from matplotlib.ticker import MaxNLocator

    u = sorted({float(x) for x in xs}) if xs else []
    if u and len(u) <= 12 and all(x == int(x) for x in u):
        ax.set_xticks(u, [str(int(x)) for x in u])
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(u) == 1:
        ax.set_xlim(u[0] - 1, u[0] + 1)


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


def _panels(rows: list[dict], panels: list[dict], suptitle: str, xlabel: str):
    """One axis per panel that has data: ``{"title", "ylabel", "lines": [(key, se_key, label)],
    "hline": (y, label)}``; a str when no panel has data."""
    have = [p for p in panels if any(_series(rows, k)[0] for k, _, _ in p["lines"])]
    if not have:
        return "no values in the rows"
    fig, axes = _new_fig(len(have), width=min(12.0, 4.6 * len(have) + 0.8), height=4.3)
    for ax, p in zip(axes, have):
        allx = []
        for i, (key, se, lab) in enumerate(p["lines"]):
            xs, ys, es = _series(rows, key, se)
            if not xs:
                continue
            allx += xs
            style = dict(marker="o", ms=5, lw=1.6, color=_C[i % len(_C)], label=lab)
            if se and any(es):
                ax.errorbar(xs, ys, yerr=es, capsize=3, **style)
            else:
                ax.plot(xs, ys, **style)
        if p.get("hline") is not None:
            y, lab = p["hline"]
            ax.axhline(y, color="grey", ls=":", lw=1.2, label=lab)
        ax.set_title(p["title"])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(p["ylabel"])
        if p.get("ylim"):
            lo, hi = ax.get_ylim()
            ax.set_ylim(min(lo, p["ylim"][0]), max(hi, p["ylim"][1]))
        _int_x(ax, allx)
        if len(p["lines"]) > 1 or p.get("hline") is not None:
            # below the axes: never over a line
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    fig.suptitle(suptitle)
    return fig


def _fig_probe_distance(run: _Run):
    rows = run.rows("probe")
    if not rows:
        return "no probe rows: probe disabled, or no round probed yet"
    return _panels(rows, [
        {"title": "Mean-embedding cosine (higher = closer)", "ylabel": "cosine to private val",
         "lines": [("mean_cosine", "mean_cosine_se", "mean cosine +- SE")]},
        {"title": "MMD² (lower = closer)", "ylabel": "unbiased MMD² (RBF)",
         "lines": [("mmd2", "mmd2_se", "MMD² +- SE")]},
    ], f"{run.label}: generator's probe sample vs the private validation split "
       "(private diagnostic)", "round (0 = untuned generator)")


def _fig_probe_quality(run: _Run):
    rows = run.rows("probe")
    if not rows:
        return "no probe rows"
    return _panels(rows, [
        {"title": "Distinct n-grams (higher = more diverse)", "ylabel": "distinct-n",
         "lines": [("distinct_1", None, "distinct-1"), ("distinct_2", None, "distinct-2")]},
        {"title": "Fluency: public model's perplexity",
         "ylabel": "perplexity (lower = more fluent)",
         "lines": [("perplexity", None, "perplexity")]},
        {"title": "Self-similarity (lower = more diverse)", "ylabel": "mean pairwise cosine",
         "lines": [("self_cosine", None, "self cosine")]},
    ], f"{run.label}: diversity and fluency of the probe sample", "round (0 = untuned generator)")


def _fig_tuning(run: _Run):
    rows = run.rows("dpo") or run.rows("sft")
    if not rows:
        return "no dpo / sft rows"
    kind = rows[0]["stage"].upper()
    return _panels(rows, [
        {"title": f"{kind} training loss", "ylabel": "loss",
         "lines": [("train_loss", None, "mean over training"),
                   ("last_epoch_loss", None, "last epoch")]},
        {"title": "Reward margin (chosen - rejected)", "ylabel": "margin",
         "lines": [("train_eval_margin", None, "training pairs"),
                   ("holdout_margin", None, "held-out pairs")], "hline": (0.0, "no preference")},
        {"title": "Preference accuracy", "ylabel": "share of pairs ranked right",
         "lines": [("train_eval_accuracy", None, "training pairs"),
                   ("holdout_accuracy", None, "held-out pairs")], "hline": (0.5, "chance")},
    ], f"{run.label}: {kind} tuning per round", "round")


def _fig_steps(run: _Run):
    """DPO / SFT loss (and DPO reward margin) per logging step, one line per round."""
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
    if not per:
        return "no roundT/dpo/metrics.json or roundT/sft/metrics.json with 'steps'"
    margins = any(_num(s.get("rewards/margins")) is not None for _, _, st in per for s in st)
    fig, axes = _new_fig(2 if margins else 1, width=11.0 if margins else 7.5)
    for i, (t, kind, st) in enumerate(per):
        xs = [s.get("step", j + 1) for j, s in enumerate(st)]
        axes[0].plot(xs, [s["loss"] for s in st], marker=".", lw=1.4, color=_C[i % len(_C)],
                     label=f"round {t} ({kind.upper()})")
        if margins:
            pts = [(x, _num(s.get("rewards/margins"))) for x, s in zip(xs, st)]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                axes[1].plot(*zip(*pts), marker=".", lw=1.4, color=_C[i % len(_C)],
                             label=f"round {t}")
    axes[0].set_title("Training loss per logging step")
    axes[0].set_xlabel("optimizer step (within the round)")
    axes[0].set_ylabel("loss")
    axes[0].legend(loc="best", ncol=1 + len(per) // 6)
    allx = [s.get("step", j + 1) for _, _, st in per for j, s in enumerate(st)]
    _int_x(axes[0], allx)
    if margins:
        axes[1].axhline(0.0, color="grey", ls=":", lw=1.2)
        axes[1].set_title("DPO reward margin per logging step")
        axes[1].set_xlabel("optimizer step (within the round)")
        axes[1].set_ylabel("rewards/margins (chosen - rejected)")
        axes[1].legend(loc="best", ncol=1 + len(per) // 6)
        _int_x(axes[1], allx)
    fig.suptitle(f"{run.label}: tuning curves per step")
    return fig


def _fig_scores(run: _Run):
    rows, rec = run.rows("score"), run.rows("prefs")
    panels = [{"title": "Released (DP) scores per round", "ylabel": "mean released score",
               "lines": [("chosen_mean", None, "chosen (pairs)"),
                         ("rejected_mean", None, "rejected (pairs)"),
                         ("released_mean", None, "all samples")]},
              {"title": "Recovery rate (private diagnostic)",
               "ylabel": "pairs whose order the exact scores keep",
               "lines": [("recovery_rate", None, "recovery rate")], "hline": (0.5, "chance")}]
    if not rows and not rec:
        return "no score / prefs rows: no DP feedback in this run (yet)"
    return _panels(rows + rec, panels, f"{run.label}: DP feedback", "round")


def _fig_prefs_hist(run: _Run):
    got = []
    for t, R in _round_dirs(run.path):
        pairs = _read_jsonl(R / "prefs.jsonl")
        ch = [v for p in pairs if (v := _num(p.get("chosen_score"))) is not None]
        rj = [v for p in pairs if (v := _num(p.get("rejected_score"))) is not None]
        if ch and rj:
            got.append((t, np.asarray(ch), np.asarray(rj)))
    if not got:
        return "no roundT/prefs.jsonl with chosen_score / rejected_score"
    if len(got) > 4:  # first, last and two between
        idx = sorted({int(round(i)) for i in np.linspace(0, len(got) - 1, 4)})
        got = [got[i] for i in idx]
    allv = np.concatenate([np.concatenate([c, r]) for _, c, r in got])
    lo, hi = float(allv.min()), float(allv.max())
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    bins = np.linspace(lo, hi, 25)
    fig, axes = _new_fig(len(got), width=min(15.0, 3.9 * len(got) + 1.0), height=3.6)
    for ax, (t, c, r) in zip(axes, got):
        ax.hist(c, bins=bins, alpha=0.6, color=_C[2], label=f"chosen (mean {c.mean():.3g})")
        ax.hist(r, bins=bins, alpha=0.6, color=_C[1], label=f"rejected (mean {r.mean():.3g})")
        ax.set_title(f"round {t}: {len(c)} pairs")
        ax.set_xlabel("released (DP) score")
        ax.set_ylabel("pairs")
        ax.legend(loc="best")
    fig.suptitle(f"{run.label}: released scores of the preference pairs")
    return fig


def _fl_rounds(run: _Run) -> list[dict]:
    rows = []
    for t, R in _round_dirs(run.path / "fl"):
        d = _read_json(R / "round.json")
        if isinstance(d, dict):
            pd = d.get("private_diagnostics") or {}
            rows.append({"round": t, **{k: pd.get(k) for k in (
                "local_loss", "update_norm_mean", "update_norm_max", "clipped_share")},
                "clip": (d.get("spec") or {}).get("clip") if isinstance(d.get("spec"), dict)
                else None})
    if not rows and isinstance(run.results, dict) and isinstance(run.results.get("fl"), dict):
        for r in run.results["fl"].get("rounds") or []:
            if isinstance(r, dict) and _num(r.get("round")) is not None:
                rows.append({"round": r["round"], **(r.get("private_diagnostics") or {}),
                             "clip": run.results["fl"].get("clip")})
    return rows


def _fig_fl(run: _Run):
    rows = _fl_rounds(run)
    if not rows:
        return "no fl/roundT/round.json"
    clip = next((c for r in rows if (c := _num(r.get("clip"))) is not None), None)
    return _panels(rows, [
        {"title": "Clients' local training loss", "ylabel": "mean local loss",
         "lines": [("local_loss", None, "local loss")]},
        {"title": "Client update norms", "ylabel": "L2 norm of the update",
         "lines": [("update_norm_mean", None, "mean"), ("update_norm_max", None, "max")],
         "hline": (clip, f"clip = {clip:g}") if clip is not None else None},
        {"title": "Share of updates clipped", "ylabel": "clipped share",
         "lines": [("clipped_share", None, "clipped share")], "ylim": (-0.02, 1.05)},
    ], f"{run.label}: DP-FL rounds (private diagnostics: exact client statistics, never publish)",
        "round")


def _fig_downstream(run: _Run):
    D = run.path / "downstream"
    runs = []
    if D.is_dir():
        for d in sorted(D.iterdir()):
            m = _read_json(d / "metrics.json") if d.is_dir() else None
            if isinstance(m, dict) and isinstance(m.get("history"), list) and m["history"]:
                runs.append((d.name, m))
    if not runs:
        return "no downstream/NAME/metrics.json with 'history'"
    fig, axes = _new_fig(2, width=11.0)
    allx: list = []
    for i, (name, m) in enumerate(runs):
        hist = [h for h in m["history"] if isinstance(h, dict)]
        init = m.get("initial") if isinstance(m.get("initial"), dict) else {}
        ep = ([0] if _num(init.get("val_accuracy")) is not None else []) + \
            [h.get("epoch", j + 1) for j, h in enumerate(hist)]
        acc = ([init["val_accuracy"]] if _num(init.get("val_accuracy")) is not None else []) + \
            [h.get("val_accuracy") for h in hist]
        pts = [(x, y) for x, y in zip(ep, acc) if _num(x) is not None and _num(y) is not None]
        allx += [x for x, _ in pts]
        col = _C[i % len(_C)]
        if pts:
            axes[0].plot(*zip(*pts), marker="o", lw=1.6, color=col, label=name)
        best = _num(m.get("best_epoch"))
        if best is not None and pts and best in [p[0] for p in pts]:
            axes[0].plot([best], [dict(pts)[best]], marker="*", ms=14, color=col, ls="none")
        vl = ([(0, init["val_loss"])] if _num(init.get("val_loss")) is not None else []) + \
            [(h.get("epoch", j + 1), h.get("val_loss")) for j, h in enumerate(hist)]
        vl = [(x, y) for x, y in vl if _num(x) is not None and _num(y) is not None]
        if vl:
            axes[1].plot(*zip(*vl), marker="o", lw=1.6, color=col, label=f"{name}: val")
        tl = [(h.get("epoch", j + 1), h.get("train_loss")) for j, h in enumerate(hist)]
        tl = [(x, y) for x, y in tl if _num(x) is not None and _num(y) is not None]
        allx += [x for x, _ in vl + tl]
        if tl:
            axes[1].plot(*zip(*tl), marker="s", lw=1.2, ls="--", color=col,
                         label=f"{name}: train")
    if not allx:
        return "downstream metrics.json has no per-epoch accuracy or loss"
    axes[0].set_title("Validation next-token accuracy (star: epoch kept)")
    axes[0].set_ylabel("accuracy")
    axes[1].set_title("Loss")
    axes[1].set_ylabel("cross-entropy")
    for ax in axes:
        ax.set_xlabel("epoch (0 = before training)")
        _int_x(ax, allx)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best")
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
        from popri.core import runtime
        from popri.models.embed import cache_key, embed_spec

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


def _fig_pca(run: _Run, report: _Report, section: str):
    val = _load_set(run.path / "embeddings" / "val.npy")
    if val is None:
        return "no embeddings/val.npy"
    V, meta = val
    got = _synthetic_embeddings(run, meta)
    if got is None:
        return ("no embedding of the synthetic set (or of a probe sample) on disk; the "
                "report loads no model")
    S, what, short = got
    if S.shape[1] != V.shape[1]:
        return f"dimensions differ ({S.shape[1]} vs {V.shape[1]})"
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
    ax.scatter(pv[:, 0], pv[:, 1], s=12, alpha=0.45, color=_C[0], label=f"private val ({len(V)})")
    ax.scatter(ps[:, 0], ps[:, 1], s=12, alpha=0.45, color=_C[3], marker="^",
               label=f"{short} ({len(S)})")
    for P_, col, lab in ((pv, _C[0], "val mean"), (ps, _C[3], f"{short} mean")):
        ax.scatter(*P_.mean(axis=0), s=180, color=col, edgecolor="black", marker="X", zorder=5,
                   label=lab)
    ax.set_xlabel(f"PC1 ({100 * var[0]:.1f}% of variance)")
    ax.set_ylabel(f"PC2 ({100 * (var[1] if len(var) > 1 else 0):.1f}% of variance)")
    # wrapped: the synthetic set's description is long and the axes are square
    ax.set_title(f"{run.label}: PCA of sentence embeddings\n{what}\nvs the private validation "
                 "split", fontsize=10)
    ax.legend(loc="best")
    ax.set_aspect("equal", adjustable="datalim")
    report.note(section, f"PCA of {what} against embeddings/val.npy (a private diagnostic)")
    return fig


# ------------------------------------------------------------------ privacy ledger
def _ledger_entries(run: _Run) -> list:
    from popri.privacy.ledger import dedupe, read_ledger

    out = []
    for f in sorted(run.path.rglob("ledger.jsonl")):
        rel = f.relative_to(run.path).parts[:-1]
        if any(part.startswith(".") for part in rel):  # staging directories of killed stages
            continue
        try:
            out.extend(read_ledger(f))
        except Exception as e:  # noqa: BLE001
            run.notes.append(f"{f}: {e}; not counted in the epsilon figure")
    return dedupe(out)


def _round_of(e) -> int | None:
    r = (e.params or {}).get("round")
    return int(r) if _num(r) is not None and float(r) == int(r) else None


def epsilon_per_round(run_dir: str | Path, results: dict | None = None) -> dict:
    """The cumulative epsilon after each round: every ledger.jsonl under the run (deduplicated
    by release id), entries ordered by ``params.round``, composed with
    :func:`popri.privacy.accounting.compose` up to each round (entries without a round come
    last, as one point).  {"x": [...], "labels": [...], "epsilon": [...], "delta",
    "accountant"}; raises ValueError when there are no entries."""
    from popri.privacy.accounting import common_delta, compose

    run = _Run(Path(run_dir), "", "")
    entries = _ledger_entries(run)
    if not entries:
        raise ValueError("no ledger entries under the run")
    r = results or {}
    delta = _num(r.get("delta")) or _num((r.get("budget") or {}).get("delta")) \
        or common_delta(entries)
    acc = r.get("accountant") or (r.get("budget") or {}).get("accountant") or "rdp"
    conv = (r.get("budget") or {}).get("convention")
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
            eps.append(compose(entries[:i], delta, acc, alone=False, convention=conv).epsilon)
    return {"x": xs, "labels": labels, "epsilon": eps, "delta": delta, "accountant": acc,
            "by_round": bool(rounds), "entries": len(entries), "notes": run.notes}


def _fig_epsilon(run: _Run, report: _Report, section: str):
    try:
        d = epsilon_per_round(run.path, run.results)
    except ValueError as e:
        return str(e)
    for n in d["notes"]:
        report.note(section, n)
    xs, eps = d["x"], d["epsilon"]
    fin = [(x, e) for x, e in zip(xs, eps) if math.isfinite(e)]
    if not fin:
        return "epsilon is infinite (noise multiplier ~ 0: a non-private run)"
    if len(fin) < len(xs):
        report.note(section, f"epsilon figure: {len(xs) - len(fin)} point(s) with infinite "
                             "epsilon not drawn")
    fx, fe = zip(*fin)
    inc = [fe[0]] + [b - a for a, b in zip(fe, fe[1:])]
    fig, axes = _new_fig(1, width=8.0, height=4.2)
    ax = axes[0]
    ax.bar(fx, inc, width=0.6, color=_C[0], alpha=0.35, label="added by this round")
    ax.plot(fx, fe, marker="o", lw=1.8, color=_C[0], label="cumulative epsilon")
    budget = _num(((run.results or {}).get("budget") or {}).get("epsilon"))
    if budget is not None:
        ax.axhline(budget, color=_C[1], ls="--", lw=1.4, label=f"budget {budget:g}")
    ax.annotate(f"{fe[-1]:.4g}", (fx[-1], fe[-1]), textcoords="offset points", xytext=(0, 7),
                ha="center", fontsize=9)
    pos = [v for v in fe if v > 0]
    if pos and max(pos) / min(pos) > 1e3:  # a cheap first round, then an expensive one
        ax.set_yscale("log")
    ax.set_xticks(list(fx), [lab for x, lab in zip(xs, d["labels"]) if x in fx])
    ax.set_xlabel("round (params.round of the ledger entries)" if d["by_round"]
                  else "release (ledger order)")
    ax.set_ylabel(f"epsilon at delta = {d['delta']:g} ({d['accountant']})")
    n = d["entries"]
    from popri.pipeline.driver import epsilon_words

    ax.set_title(f"{run.label}: privacy spent ({n} ledger entr{'y' if n == 1 else 'ies'}; "
                 f"{epsilon_words(run.results or {})})")
    ax.legend(loc="upper left")
    return fig


# --------------------------------------------------------------------------- across runs
def _acc_rows(runs: list[_Run]) -> list[dict]:
    rows = []
    for run in runs:
        r = run.results or {}
        methods = r.get("methods") if isinstance(r.get("methods"), dict) else {}
        own = r.get("method")
        order = [own] + [k for k in ("t0", "eps0", "epsinf") if k != own] + \
            [k for k in methods if k not in (own, "t0", "eps0", "epsinf")]
        for k in order:
            m = methods.get(k)
            if not isinstance(m, dict) or _num(m.get("accuracy")) is None:
                continue
            rows.append({"run": run.label, "method": k, "own": k == own,
                         "label": _METHOD_LABELS.get(k, k), "acc": m["accuracy"],
                         "se": _num(m.get("accuracy_se"))})
    return rows


def _fig_methods(runs: list[_Run]):
    rows = _acc_rows(runs)
    if not rows:
        return "no run has accuracies in results.json"
    n = len(rows)
    fig, axes = _new_fig(1, width=10.0, height=max(2.6, 0.42 * n + 1.4))
    ax = axes[0]
    ys = list(range(n))[::-1]
    kinds = {}
    for y, r in zip(ys, rows):
        key = r["method"] if r["method"] in ("t0", "eps0", "epsinf") else "method"
        col = {"method": _C[0], "t0": _C[4], "eps0": _C[7], "epsinf": _C[2]}[key]
        lab = {"method": "the run's method", "t0": "T = 0 control", "eps0": "eps = 0",
               "epsinf": "eps = inf"}[key]
        se = r["se"]
        ax.errorbar([r["acc"]], [y], xerr=[[_Z95 * se], [_Z95 * se]] if se else None,
                    fmt="o", ms=7, capsize=4, color=col,
                    label=None if lab in kinds else lab)
        kinds[lab] = col
        ax.annotate(f"{r['acc']:.4f}" + (f" ± {se:.4f}" if se else ""), (r["acc"], y),
                    textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
    multi = len({r["run"] for r in rows}) > 1
    ax.set_yticks(ys, [f"{r['run']}: {r['label']}" if multi else r["label"] for r in rows])
    ax.set_ylim(-0.8, n - 0.3)
    ax.set_xlabel("next-token accuracy on the private test split "
                  "(bars: 95% interval = ±1.96 SE over test clients)")
    ax.set_title("Method comparison" + ("" if multi else f": {rows[0]['run']}"))
    fig.legend(loc="outside lower center", ncol=4)
    ax.grid(axis="y", alpha=0)
    return fig


def _fig_privacy_utility(runs: list[_Run], report: _Report, section: str):
    pts, refs = [], {"eps0": [], "epsinf": []}
    for run in runs:
        r = run.results or {}
        methods = r.get("methods") if isinstance(r.get("methods"), dict) else {}
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
        g = r.get("gap_closed") if isinstance(r.get("gap_closed"), dict) else {}
        pts.append({"run": run.label, "method": r.get("method"), "eps": eps,
                    "acc": own["accuracy"], "se": _num(own.get("accuracy_se")),
                    "gap": _num(g.get("gap_closed")), "gse": _num(g.get("gap_closed_se"))})
    if len(runs) < 2:
        return "needs two or more runs"
    if len(pts) < 2:
        return (f"{len(pts)} run(s) with a finite epsilon and an accuracy in results.json; "
                "needs two")
    gaps = any(p["gap"] is not None for p in pts)
    fig, axes = _new_fig(2 if gaps else 1, width=12.0 if gaps else 7.5, height=5.0)
    methods = list(dict.fromkeys(p["method"] for p in pts))
    marks = "osD^vP*X"
    epss = [p["eps"] for p in pts]
    logx = max(epss) / min(epss) > 20
    for ax, key, se, ylabel, title in (
            (axes[0], "acc", "se", "next-token accuracy", "Accuracy vs epsilon"),
            *(((axes[1], "gap", "gse", "gap closed (acc - eps0) / (epsinf - eps0)",
                "Gap closed vs epsilon"),) if gaps else ())):
        for i, m in enumerate(methods):
            mp = sorted((p for p in pts if p["method"] == m and p[key] is not None),
                        key=lambda p: p["eps"])
            if not mp:
                continue
            ax.errorbar([p["eps"] for p in mp], [p[key] for p in mp],
                        yerr=[p[se] or 0 for p in mp], marker=marks[i % len(marks)], ms=7,
                        capsize=4, lw=1.4, color=_C[i % len(_C)], label=str(m))
            if len(pts) <= 8:
                for p in mp:
                    ax.annotate(p["run"], (p["eps"], p[key]), textcoords="offset points",
                                xytext=(6, -10), fontsize=7, color="#444444")
        if key == "acc":
            for k, col, lab in (("eps0", _C[7], "eps = 0 (public model)"),
                                ("epsinf", _C[2], "eps = inf (private data)")):
                if refs[k]:
                    ax.axhline(float(np.mean(refs[k])), color=col, ls="--", lw=1.2,
                               label=lab + (" (mean over runs)" if len(refs[k]) > 1 else ""))
        else:
            ax.axhline(0.0, color=_C[7], ls="--", lw=1.2, label="0: the eps = 0 accuracy")
            ax.axhline(1.0, color=_C[2], ls="--", lw=1.2, label="1: the eps = inf accuracy")
        ax.margins(y=0.12)
        if logx:
            ax.set_xscale("log")
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
        from popri.pipeline.driver import results_table

        text = results_table(r)
    except Exception:  # noqa: BLE001 -- an older or partial results.json
        lines = [f"{r.get('method', '?')} on {r.get('run_dir', '?')}", "",
                 "| method | epsilon | next-token accuracy | SE (clients) | loss |",
                 "|---|---|---|---|---|"]
        for k, m in (r.get("methods") or {}).items():
            if isinstance(m, dict):
                e = {"eps0": "0", "epsinf": "inf"}.get(k, r.get("epsilon"))
                lines.append(f"| {_METHOD_LABELS.get(k, k)} | {_fmt(e)} | {_fmt(m.get('accuracy'))}"
                             f" | {_fmt(m.get('accuracy_se'))} | {_fmt(m.get('loss'))} |")
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


def _md_to_html(text: str) -> str:
    """The few Markdown shapes of a results table: pipe tables and paragraphs."""
    out, table = [], []

    def flush():
        if not table:
            return
        cells = [[c.strip() for c in row.strip().strip("|").split("|")] for row in table]
        body = [c for c in cells if not all(re.fullmatch(r":?-{3,}:?", x) for x in c)]
        h = "".join(f"<th>{html.escape(x)}</th>" for x in body[0])
        rows = "".join("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in row) + "</tr>"
                       for row in body[1:])
        out.append(f"<table><thead><tr>{h}</tr></thead><tbody>{rows}</tbody></table>")
        table.clear()

    for line in text.splitlines():
        if line.strip().startswith("|"):
            table.append(line)
            continue
        flush()
        if line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    flush()
    return "\n".join(out)


# --------------------------------------------------------------------------- writing
_CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;max-width:1240px;
margin:24px auto;padding:0 20px;color:#222;line-height:1.45}
h1{font-size:1.7em;border-bottom:2px solid #ddd;padding-bottom:6px}
h2{font-size:1.35em;margin-top:2.2em;border-bottom:1px solid #eee;padding-bottom:4px}
h3{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;margin:10px 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:4px 9px;text-align:left}
th{background:#f3f3f3}
tr:nth-child(even) td{background:#fafafa}
figure{margin:18px 0 28px}
figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.9em;color:#555;margin-top:4px}
.notes li{color:#665;font-size:.92em}
.meta{color:#666;font-size:.9em}
code{background:#f5f5f5;padding:1px 4px;border-radius:3px}
"""


def _write(report: _Report, runs: list[_Run], tables: dict[str, str]) -> tuple[Path, Path]:
    sections = ["Across runs"] + [r.label for r in runs]
    md = ["# popri report", "",
          "Runs: " + ", ".join(f"`{r.path}`" for r in runs), ""]
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         '<meta name="viewport" content="width=device-width, initial-scale=1">',
         "<title>popri report</title>", f"<style>{_CSS}</style></head><body>",
         "<h1>popri report</h1>",
         '<p class="meta">Runs: ' + ", ".join(f"<code>{html.escape(str(r.path))}</code>"
                                              for r in runs) + "</p>"]
    for sec in sections:
        run = next((r for r in runs if r.label == sec), None)
        figs = [f for f in report.figures if f.section == sec]
        notes = [n for s, n in report.notes if s == sec]
        if run is None and not figs and not notes:
            continue
        title = sec if run is None else f"Run {sec}"
        md += [f"## {title}", ""]
        h.append(f"<h2>{html.escape(title)}</h2>")
        if run is not None:
            md += [f"Directory: `{run.path}`; per-round metrics from {run.metrics_source}.", ""]
            h.append(f'<p class="meta">Directory: <code>{html.escape(str(run.path))}</code>; '
                     f"per-round metrics from {html.escape(run.metrics_source)}.</p>")
            if sec in tables:
                md += ["### Results", "", tables[sec], ""]
                h += ["<h3>Results</h3>", _md_to_html(tables[sec])]
        if figs:
            md += ["### Figures", ""]
            h.append("<h3>Figures</h3>")
        for f in figs:
            md += [f"![{f.title}]({f.name})", "", f"*{f.title}* (`{f.name}`): {f.caption}", ""]
            data = base64.b64encode((report.out / f.name).read_bytes()).decode("ascii")
            h.append(f'<figure><img alt="{html.escape(f.title)}" '
                     f'src="data:image/png;base64,{data}"><figcaption><b>'
                     f"{html.escape(f.title)}</b> ({html.escape(f.name)}): "
                     f"{html.escape(f.caption)}</figcaption></figure>")
        if notes:
            md += ["### Notes", ""] + [f"- {n}" for n in notes] + [""]
            h += ["<h3>Notes</h3>", '<ul class="notes">'] + \
                [f"<li>{html.escape(n)}</li>" for n in notes] + ["</ul>"]
    h.append("</body></html>")
    md_path, html_path = report.out / "report.md", report.out / "report.html"
    from popri.core.io import atomic_write

    with atomic_write(md_path) as fh:
        fh.write("\n".join(md).rstrip() + "\n")
    with atomic_write(html_path) as fh:
        fh.write("\n".join(h) + "\n")
    return md_path, html_path


def build_report(run_dirs: list[str], out: str) -> dict:
    """Write report.md, report.html and the figures (PNG) of ``run_dirs`` into ``out``
    (created).  Returns {"figures": [file names], "notes": [...], "html": path, "md": path}.
    Nothing is validated here beyond reading: the CLI refuses non-run directories."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    report = _Report(outp)
    runs = [_load_run(p, lab) for p, lab in zip(run_dirs, _labels(list(run_dirs)))]
    tables: dict[str, str] = {}
    for run in runs:
        sec, s = run.label, run.slug
        for n in run.notes:
            report.note(sec, n)
        run.notes.clear()
        if run.results is not None:
            tables[sec] = _table_text(run.results)
        else:
            report.note(sec, "no results.json (the run has not finished): no results table")
        if not run.metrics and (run.path / "metrics.jsonl").is_file():
            report.note(sec, "metrics.jsonl has no rows")
        fig = report.figure
        fig(sec, f"{s}-probe-distance.png", "Probe: distance to the private validation split",
            "mean-embedding cosine and unbiased MMD² of the round's generator sample (fixed "
            "prompts and seeds) against the private validation embeddings; error bars ±1 "
            "bootstrap SE. A private diagnostic, never a release.",
            lambda: _fig_probe_distance(run))
        fig(sec, f"{s}-probe-quality.png", "Probe: diversity and fluency",
            "distinct-1/2 n-gram shares, the public model's perplexity and the mean pairwise "
            "cosine of the probe sample per round.", lambda: _fig_probe_quality(run))
        fig(sec, f"{s}-tuning.png", "DPO / SFT per round",
            "training loss, exact reward margin and preference accuracy on the training and "
            "the held-out preference pairs, per round.", lambda: _fig_tuning(run))
        fig(sec, f"{s}-tuning-steps.png", "DPO / SFT per step",
            "loss (and DPO reward margin) at each logging step of each round's tuning, from "
            "roundT/dpo|sft/metrics.json.", lambda: _fig_steps(run))
        fig(sec, f"{s}-scores.png", "Released scores and recovery rate",
            "mean DP-released score of the round's samples and of the preference pairs' "
            "chosen / rejected samples; recovery rate: share of pairs whose order the "
            "noise-free scores agree with (a private diagnostic, POPri Fig. 6).",
            lambda: _fig_scores(run))
        fig(sec, f"{s}-prefs-hist.png", "Chosen vs rejected released scores",
            "histograms of the released scores of the chosen and rejected samples of the "
            "preference pairs (roundT/prefs.jsonl); at most four rounds shown.",
            lambda: _fig_prefs_hist(run))
        fig(sec, f"{s}-fl-rounds.png", "DP-FL rounds",
            "clients' local loss, update norms (against the clip) and the share clipped, per "
            "round (fl/roundT/round.json private_diagnostics: never publish).",
            lambda: _fig_fl(run))
        fig(sec, f"{s}-downstream.png", "Downstream training",
            "validation next-token accuracy and loss per epoch of each downstream model "
            "(downstream/NAME/metrics.json).", lambda: _fig_downstream(run))
        fig(sec, f"{s}-pca.png", "PCA of embeddings",
            "the first two principal components (numpy SVD of both sets together) of the "
            "synthetic set's and the private validation split's sentence embeddings.",
            lambda: _fig_pca(run, report, sec))
        fig(sec, f"{s}-epsilon.png", "Privacy spent per round",
            "epsilon of every ledger.jsonl under the run, composed cumulatively round by round "
            "(popri.privacy.accounting.compose; entries deduplicated by release id).",
            lambda: _fig_epsilon(run, report, sec))
    cross = "Across runs"
    report.figure(cross, "method-comparison.png", "Method comparison",
                  "next-token accuracy of each run's method and of its T = 0 / eps = 0 / "
                  "eps = inf rows, with 95% intervals (±1.96 SE over test clients).",
                  lambda: _fig_methods(runs))
    report.figure(cross, "privacy-utility.png", "Privacy-utility",
                  "accuracy (and gap closed, where present) against each run's epsilon, error "
                  "bars ±1 SE; dashed lines: the eps = 0 and eps = inf accuracies.",
                  lambda: _fig_privacy_utility(runs, report, cross))
    md_path, html_path = _write(report, runs, tables)
    return {"figures": [f.name for f in report.figures],
            "notes": [f"{s}: {n}" for s, n in report.notes],
            "html": str(html_path), "md": str(md_path)}


__all__ = ["build_report", "is_run_dir", "epsilon_per_round", "RUN_FILES"]
