"""The verdict of one run, the block every ``popri report`` opens with: the method, what its
epsilon is (its relation, or NOT A DP GUARANTEE), the paired difference to its control (the
untuned generator, T = 0) and to eps = 0 with 95 % intervals, and one sentence in words.

    from popri.report.verdict import verdict, verdict_markdown, verdict_html

The numbers are ``results.json``'s (docs/formats.md):

- against the control: from one draw, ``control.acc_minus_control`` with the interval stored
  beside it (``acc_minus_control_ci``: the paired bootstrap's over test clients; +- 1.96
  ``acc_minus_control_se`` where a results.json has none); with ``control.draws`` (n >= 2 draws
  of both synthetic sets), the mean over draws +- t(0.975, n - 1) x ``se_between`` (Student's
  t: the SE between draws has n - 1 degrees of freedom);
- against eps = 0: ``gap_closed.acc_minus_eps0`` +- 1.96 ``acc_minus_eps0_se`` (paired over test
  clients); where results.json has none, the same paired bootstrap on ``RUN/eval/METHOD
  .clients.jsonl`` and ``RUN/eval/eps0.clients.jsonl`` if both exist
  (:func:`popri.eval.stats.paired_bootstrap`), else the unpaired difference of the two
  accuracies with their SEs combined as if independent (said so).

Only draws decide (issue 43: one draw's interval over test clients leaves out the randomness of
generation and training, and a second machine's draw landed outside it).  From one draw -- and
from two -- the verdict never says "beat": it gives the draw's difference, says what its
interval leaves out and how to get a verdict (``draws: 3``).  From n >= 3 draws it says whether
the t interval between draws excludes 0 (:data:`MIN_DRAWS`).

A release-mode run evaluates nothing on the private data: its verdict says what was released and
at which epsilon, and nothing about accuracy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from popri.eval.stats import MIN_DRAWS
from popri.report.read import as_dict, num
from popri.pipeline.recipes import METHODS
from popri.report.style import colour, h, md_text, method_label, role
from popri.eval.stats import paired_bootstrap
from popri.eval.stats import read_per_client

Z95 = 1.959963984540054
#: what one draw's interval over test clients leaves out
ONE_DRAW = ("its interval is over test clients and leaves out the randomness of generation and "
            "training, so a second draw can land outside it")


@dataclass
class Diff:
    """The method minus a comparison row, with its 95 % interval."""

    against: str            # "t0" | "eps0"
    label: str              # the comparison's human name
    value: float
    se: float | None
    low: float | None
    high: float | None
    how: str                # how the interval was made, with its sample size
    paired: bool = True
    n: int | None = None    # test clients or draws
    unit: str = "test clients"
    per_draw: list[float] = field(default_factory=list)

    @property
    def interval(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def decides(self) -> bool:
        """Can this difference carry a verdict?  Only a mean over >= MIN_DRAWS draws."""
        return self.unit == "draws" and (self.n or 0) >= MIN_DRAWS and self.interval

    def text(self) -> str:
        """'-0.0022, 95% CI [-0.0089, +0.0045]'"""
        s = f"{self.value:+.4f}"
        if self.interval:
            s += f", 95% CI [{self.low:+.4f}, {self.high:+.4f}]"
        return s


def t_quantile(n: int) -> float:
    """The 0.975 quantile of Student's t with n - 1 degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1))


def _control_diff(r: dict, own: dict) -> Diff | None:
    c = as_dict(r.get("control"))
    label = method_label("t0")
    dr = as_dict(c.get("draws"))
    per = [v for v in (dr.get("acc_minus_control") or []) if num(v) is not None] \
        if isinstance(dr.get("acc_minus_control"), list) else []
    n = dr.get("n") if isinstance(dr.get("n"), int) and not isinstance(dr.get("n"), bool) \
        else len(per)
    mean, se = num(dr.get("mean")), num(dr.get("se_between"))
    if n >= 2 and mean is None and len(per) >= 2:
        import statistics

        mean = statistics.fmean(per)
        se = statistics.stdev(per) / len(per) ** 0.5
    if n >= 2 and mean is not None:
        if se is None:
            return Diff("t0", label, mean, None, None, None, f"mean over {n} draws of both "
                        "synthetic sets (no SE between draws)", n=n, unit="draws",
                        per_draw=per)
        t = t_quantile(n)
        return Diff("t0", label, mean, se, mean - t * se, mean + t * se,
                    f"mean over {n} draws of both synthetic sets; 95% interval: mean +- "
                    f"t({n - 1} d.o.f.) = {t:.3f} x SE between draws {se:.4f}", n=n,
                    unit="draws", per_draw=per)
    v = num(c.get("acc_minus_control"))
    if v is None:
        return None
    se = num(c.get("acc_minus_control_se"))
    k = own.get("clients") if isinstance(own.get("clients"), int) else None
    who = f"{k} test client{'s' if k != 1 else ''}" if k is not None else "the test clients"
    if se is None or se == 0 and (k or 0) < 2:
        return Diff("t0", label, v, None, None, None,
                    f"one draw, paired over {who}; no SE (fewer than 2 test clients): no "
                    "interval", n=k)
    ci = c.get("acc_minus_control_ci")  # the interval the evaluation stored: read, not remade
    if isinstance(ci, list) and len(ci) == 2 and all(num(x) is not None for x in ci) \
            and ci[0] <= ci[1]:
        return Diff("t0", label, v, se, float(ci[0]), float(ci[1]),
                    f"one draw, paired over {who}; 95% interval of the paired bootstrap "
                    f"(results.json), SE {se:.4f}", n=k)
    return Diff("t0", label, v, se, v - Z95 * se, v + Z95 * se,
                f"one draw, paired over {who}; 95% interval +-1.96 x bootstrap SE {se:.4f}",
                n=k)


def _paired_from_files(run_path: Path, method: str, seed: int) -> dict | None:
    E = run_path / "eval"
    a, b = E / f"{method}.clients.jsonl", E / "eps0.clients.jsonl"
    if not (a.is_file() and b.is_file()):
        return None
    try:
        return paired_bootstrap([read_per_client(str(a)), read_per_client(str(b))],
                                lambda x, z: x - z, n_boot=1000, seed=seed)
    except Exception:  # noqa: BLE001 -- damaged per-client files: the unpaired difference
        return None


def _eps0_diff(run_path: Path, r: dict, method: str, own: dict) -> Diff | None:
    label = method_label("eps0")
    g = as_dict(r.get("gap_closed"))
    v, se = num(g.get("acc_minus_eps0")), num(g.get("acc_minus_eps0_se"))
    k = g.get("clients") if isinstance(g.get("clients"), int) else own.get("clients")
    k = k if isinstance(k, int) and not isinstance(k, bool) else None
    who = f"{k} test client{'s' if k != 1 else ''}" if k is not None else "the test clients"
    if v is not None:
        if se is None:
            return Diff("eps0", label, v, None, None, None,
                        f"paired over {who}; no SE: no interval", n=k)
        return Diff("eps0", label, v, se, v - Z95 * se, v + Z95 * se,
                    f"paired over {who}; 95% interval +-1.96 x bootstrap SE {se:.4f}", n=k)
    e0 = as_dict(as_dict(r.get("methods")).get("eps0"))
    if num(e0.get("accuracy")) is None or num(own.get("accuracy")) is None:
        return None
    seed = r.get("seed") if isinstance(r.get("seed"), int) else 0
    b = _paired_from_files(run_path, method, seed)
    if b is not None and num(b.get("value")) is not None:
        v, se, k = b["value"], num(b.get("se")), b.get("clients")
        how = f"paired over {k} test clients (bootstrap of RUN/eval/*.clients.jsonl, here)"
        if se is None:
            return Diff("eps0", label, v, None, None, None, how + "; no SE: no interval", n=k)
        return Diff("eps0", label, v, se, v - Z95 * se, v + Z95 * se,
                    how + f"; 95% interval +-1.96 x SE {se:.4f}", n=k)
    v = float(own["accuracy"]) - float(e0["accuracy"])
    s1, s0 = num(own.get("accuracy_se")), num(e0.get("accuracy_se"))
    if s1 is None or s0 is None:
        return Diff("eps0", label, v, None, None, None, "UNPAIRED (no per-client files) and "
                    "without SEs: no interval", paired=False, n=k)
    se = math.hypot(s1, s0)
    return Diff("eps0", label, v, se, v - Z95 * se, v + Z95 * se,
                "UNPAIRED (no per-client files): the two accuracies' SEs combined as if "
                f"independent, +-1.96 x {se:.4f}", paired=False, n=k)


def _words(subject: str, d: Diff) -> str:
    """From >= MIN_DRAWS draws: 'POPri did not beat its untuned generator (T = 0): -0.0022, 95%
    CI [...]'; from fewer, the difference, what its interval leaves out and how to get a
    verdict -- never 'beat'."""
    if not d.interval:
        return (f"{subject} against {_the(d.label)}: {d.value:+.4f} with no interval "
                f"({d.how}): the report cannot tell whether it beat it")
    if d.unit != "draws":
        how = ("run with draws: 3 or more (the t interval between draws) for a verdict"
               if d.against == "t0" else "the comparison with the untuned generator over "
               "draws: 3 or more is the verdict")
        return (f"one draw: {subject} minus {_the(d.label)} is {d.text()}; {ONE_DRAW}: no "
                f"verdict from it ({how})")
    if not d.decides:
        return (f"{subject} minus {_the(d.label)} over {d.n} draws: {d.text()}; {d.n} draws "
                f"are too few for a verdict (run with draws: {MIN_DRAWS} or more)")
    if d.low > 0:
        return f"{subject} beat {_the(d.label)}: {d.text()}"
    if d.high < 0:
        return f"{subject} did not beat {_the(d.label)}, it scored lower: {d.text()}"
    return f"{subject} did not beat {_the(d.label)}: {d.text()}"


def _the(label: str) -> str:
    return f"its {label}" if label.startswith("untuned") else f"the {label}"


def privacy_words(r: dict) -> tuple[str, bool]:
    """('epsilon = 1.000 at delta = 3e-06 (rdp), (eps, delta)-DP under add/remove one client',
    is it a DP guarantee)."""
    eps, delta = num(r.get("epsilon")), num(r.get("delta"))
    raw = r.get("epsilon")
    if eps is None:
        e = ("epsilon = inf: no privacy" if isinstance(raw, (int, float)) and raw == math.inf
             else "epsilon unknown (results.json has none)")
    else:
        e = f"epsilon = {eps:.3f}"
        if delta is not None:
            e += f" at delta = {delta:g}"
        if r.get("accountant"):
            e += f" ({r['accountant']})"
    bad = provenance_links(r)
    if bad:  # the release's chain holds a not-dp link (issue 66)
        return f"{e} -- NOT A DP GUARANTEE ({'; '.join(bad)})", False
    guarantee = r.get("dp_guarantee") is not False
    if not guarantee:
        g = r.get("guarantee") or ""
        rel = g if "NOT A DP GUARANTEE" in g.upper() else "NOT A DP GUARANTEE (papers' convention)"
        return f"{e} -- {rel}", False
    if eps is None:
        return e, guarantee
    rel = r.get("guarantee") or ("(eps, delta)-DP under "
                                 f"{r.get('neighbouring') or 'add/remove one client'}")
    if r.get("neighbouring") and r["neighbouring"] not in rel:
        rel += f" (under {r['neighbouring']})"
    b = as_dict(r.get("budget"))
    tail = f"; budget epsilon = {num(b['epsilon']):g}" if num(b.get("epsilon")) is not None else ""
    return f"{e}, {rel}{tail}", True


def provenance_links(r: dict) -> list[str]:
    """The not-dp links of a run's release (results.json ``release_provenance``), the
    convention's aside (said apart); [] when its chain is dp or public."""
    rp = r.get("release_provenance")
    if not isinstance(rp, dict) or rp.get("dp_guarantee") is not False:
        return []
    return [str(x) for x in rp.get("links") or () if "convention" not in str(x)]


def _not_dp_sentence(v: dict) -> str:
    why = v.get("privacy") or ""
    if "papers' convention" in why or "NOT A DP GUARANTEE (" not in why:
        return ("this run's epsilon is totalled under the papers' convention, not a proven "
                "relation.")
    return "its release's chain " + why.split("NOT A DP GUARANTEE ", 1)[1] + "."


def _count_lines(p: Path) -> int | None:
    try:
        with open(p, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return None


def verdict(run_path: Path, label: str, r: dict | None, *, release_path: Path | None = None
            ) -> dict:
    """The verdict of one run (``r``: its cleaned results.json, None when it has none):
    {"run", "method", "method_label", "mode", "privacy", "dp_guarantee", "accuracy",
    "control", "eps0", "gap_closed", "sentence", "sentences", "released", "rows"} (Diffs as
    dicts)."""
    out: dict[str, Any] = {"run": label, "path": str(run_path)}
    if r is None:
        out |= {"method": None, "method_label": None, "mode": None, "privacy": None,
                "dp_guarantee": None, "sentence": "No readable results.json (the run has not "
                "finished, or its results.json is damaged: see the notes): no verdict.",
                "sentences": [], "rows": [], "control": None, "eps0": None, "gap_closed": None,
                "accuracy": None, "released": None}
        return out
    method = r.get("method")
    name = method_label(method) if method else "The method"
    out["method"], out["method_label"] = method, name
    out["mode"] = r.get("mode")
    out["privacy"], out["dp_guarantee"] = privacy_words(r)
    rows = [("method", _method_cell(r, name)), ("privacy", out["privacy"])]
    methods = as_dict(r.get("methods"))
    own = as_dict(methods.get(method)) if method else {}
    out["released"] = None
    if r.get("mode") == "release":
        rel = r.get("released") or ""
        p = Path(rel) if rel else None
        what = _released_words(p, release_path or run_path)
        out["released"] = rel or None
        sent = (f"{name} released {what} under {out['privacy']}. Release mode evaluates nothing on "
                "the private data: no accuracy is reported.")
        rows.append(("released", what))
        out |= {"control": None, "eps0": None, "gap_closed": None, "accuracy": None,
                "sentences": [sent], "sentence": sent, "rows": rows}
        return out
    ctl = _control_diff(r, own)
    e0 = _eps0_diff(run_path, r, method, own) if method else None
    out["control"] = asdict(ctl) if ctl else None
    out["eps0"] = asdict(e0) if e0 else None
    sentences = []
    for d in (ctl, e0):
        if d is not None:
            rows.append((f"{name} minus {d.label}", f"{d.text()} ({d.how})"))
            sentences.append(_words(name, d))
    if ctl is not None and ctl.per_draw:
        rows.append(("per draw", ", ".join(f"{x:+.4f}" for x in ctl.per_draw)))
    g = as_dict(r.get("gap_closed"))
    gc = None
    if num(g.get("gap_closed")) is not None:
        ci = g.get("gap_closed_ci")
        k = g.get("clients")
        gc = {"value": g["gap_closed"], "se": num(g.get("gap_closed_se")),
              "ci": ci if isinstance(ci, list) and len(ci) == 2
              and all(num(x) is not None for x in ci) else None,
              "clients": k if isinstance(k, int) else None}
        txt = f"{gc['value']:.3f}"
        if gc["ci"]:
            txt += f", 95% CI [{gc['ci'][0]:.3f}, {gc['ci'][1]:.3f}]"
        elif gc["se"] is not None:
            txt += f" +- {gc['se']:.3f} SE"
        txt += (" ((acc - eps0) / (epsinf - eps0); paired bootstrap over "
                f"{gc['clients'] if gc['clients'] is not None else 'the'} test clients)")
        rows.append(("gap closed", txt))
    elif g.get("undefined"):
        rows.append(("gap closed", f"undefined ({g['undefined']})"))
    out["gap_closed"] = gc
    acc = []
    for k in dict.fromkeys([method, "t0", "eps0", "epsinf", *methods]):
        m = as_dict(methods.get(k))
        a = num(m.get("accuracy"))
        if a is None:
            continue
        se = num(m.get("accuracy_se"))
        n = m.get("clients") if isinstance(m.get("clients"), int) else None
        tok = m.get("tokens") if isinstance(m.get("tokens"), int) else None
        acc.append({"key": k, "label": method_label(k), "accuracy": a, "se": se, "clients": n,
                    "tokens": tok})
    out["accuracy"] = acc
    if acc:
        rows.append(("next-token accuracy", "; ".join(
            f"{x['label']} {x['accuracy']:.4f}" + (f" +- {x['se']:.4f}" if x["se"] is not None
                                                   else "")
            + _n_text(x) for x in acc)))
    if not sentences:
        if acc:
            sentences.append(f"{name}: accuracy {acc[0]['accuracy']:.4f}{_n_text(acc[0])}, but "
                             "this run has no control (T = 0) and no eps = 0 row: the report "
                             "cannot say whether the method worked (run with control: true "
                             "and baselines: true).")
        else:
            sentences.append(f"{name}: no accuracy in results.json (not evaluated, or the "
                             "evaluation has not finished): no verdict.")
    else:
        sentences = [s + "." for s in sentences]
    out["sentences"] = sentences
    out["sentence"] = " ".join(sentences)
    out["rows"] = rows
    return out


def _n_text(x: dict) -> str:
    parts = []
    if x.get("clients") is not None:
        parts.append(f"{x['clients']} test client{'s' if x['clients'] != 1 else ''}")
    if x.get("tokens") is not None:
        parts.append(f"{x['tokens']:,} tokens")
    return f" ({', '.join(parts)})" if parts else ""


def _method_cell(r: dict, name: str) -> str:
    bits = [name]
    if r.get("mode"):
        bits.append(f"{r['mode']} mode")
    if isinstance(r.get("seed"), int):
        bits.append(f"seed {r['seed']}")
    if isinstance(r.get("rounds"), int):
        bits.append(f"{r['rounds']} round{'s' if r['rounds'] != 1 else ''}")
    m = METHODS.get(r.get("method"))
    if isinstance(r.get("num_synthetic"), int) and (m is None or m.writes_synthetic):
        bits.append(f"N = {r['num_synthetic']} synthetic samples")
    return ", ".join(bits)


def _released_words(p: Path | None, run_path: Path) -> str:
    if p is None:
        return "its output"
    q = p if p.is_absolute() else run_path / p
    if q.is_file() and q.suffix == ".jsonl":
        n = _count_lines(q)
        return f"{n if n is not None else 'the'} synthetic samples ({p.name})"
    if q.is_dir():
        return f"a DP-trained model ({p.name})"
    return str(p)


# --------------------------------------------------------------------------- rendering
def verdict_markdown(v: dict) -> list[str]:
    """The verdict block as Markdown lines (every run-derived text escaped)."""
    head = f"### {md_text(v['run'])}" + (f": {md_text(v['method_label'])}"
                                          if v.get("method_label") else "")
    lines = [head, ""]
    if v.get("dp_guarantee") is False:
        lines += [f"**NOT A DP GUARANTEE:** {md_text(_not_dp_sentence(v))}", ""]
    lines += [f"**{md_text(' '.join(v['sentences']) or v['sentence'])}**", ""]
    if v["rows"]:
        lines += ["| | |", "|---|---|"]
        lines += [f"| {md_text(k)} | {md_text(val)} |" for k, val in v["rows"]]
        lines.append("")
    return lines


def verdict_html(v: dict) -> str:
    kind = "none"
    c = v.get("control")
    if c and c.get("low") is not None and c.get("unit") == "draws" \
            and (c.get("n") or 0) >= MIN_DRAWS:  # only draws decide (Diff.decides)
        kind = "good" if c["low"] > 0 else ("bad" if c["high"] < 0 else "flat")
    head = h(v["run"]) + (f": {h(v['method_label'])}" if v.get("method_label") else "")
    out = [f'<div class="verdict v-{kind}"><h3>{head}</h3>']
    if v.get("dp_guarantee") is False:
        out.append(f'<p class="notdp">NOT A DP GUARANTEE: {h(_not_dp_sentence(v))}</p>')
    out.append(f'<p class="sentence">{h(" ".join(v["sentences"]) or v["sentence"])}</p>')
    if v["rows"]:
        out.append("<table>" + "".join(f"<tr><th>{h(k)}</th><td>{h(val)}</td></tr>"
                                       for k, val in v["rows"]) + "</table>")
    out.append("</div>")
    return "\n".join(out)


# --------------------------------------------------------------------------- figure
def fig_paired_differences(verdicts: list[dict], new_fig):
    """Each run's method minus its untuned generator and minus eps = 0, with 95 % intervals
    and a line at 0 (the answer to 'did it work'); None when no run has a difference."""
    rows = []
    for v in verdicts:
        for key in ("control", "eps0"):
            d = v.get(key)
            if d:
                rows.append((v, d))
    if not rows:
        return None
    n = len(rows)
    fig, axes = new_fig(1, width=10.0, height=max(2.4, 0.55 * n + 1.5))
    ax = axes[0]
    ys = list(range(n))[::-1]
    multi = len({v["run"] for v, _ in rows}) > 1
    labels = []
    for y, (v, d) in zip(ys, rows):
        col = colour(v["method"])
        mk = "o" if d["against"] == "t0" else "s"
        if d["low"] is not None:
            ax.errorbar([d["value"]], [y], xerr=[[d["value"] - d["low"]],
                                                 [d["high"] - d["value"]]],
                        fmt=mk, ms=8, capsize=5, lw=2.0, color=col,
                        mfc=col if d["paired"] else "white")
        else:
            ax.plot([d["value"]], [y], mk, ms=8, color=col, mfc="white")
        ci = (f"[{d['low']:+.4f}, {d['high']:+.4f}]" if d["low"] is not None
              else "no interval")
        n_txt = (f"{d['n']} {d['unit']}" if d.get("n") is not None else "")
        ax.annotate(f"{d['value']:+.4f}  {ci}" + (f"  ({n_txt})" if n_txt else "")
                    + ("" if d["paired"] else "  UNPAIRED"),
                    (d["value"], y), textcoords="offset points", xytext=(0, 9), ha="center",
                    fontsize=8)
        lab = f"{v['method_label']} minus {d['label']}"
        labels.append(f"{v['run']}: {lab}" if multi else lab)
    ax.axvline(0.0, color=role("reference"), ls="--", lw=1.2)
    ax.set_yticks(ys, labels)
    ax.set_ylim(-0.8, n - 0.2)
    ax.margins(x=0.25)
    ax.set_xlabel("difference in next-token accuracy on the private test split\n"
                  "(bars: 95% interval; right of 0: the method is better)")
    if any(d.get("unit") != "draws" for _, d in rows):
        ax.set_title("Paired differences of one draw (intervals over test clients: they leave "
                     "out\nthe randomness of generation and training; a verdict needs draws >= "
                     f"{MIN_DRAWS})", fontsize=10)
    else:
        ax.set_title("Paired differences over draws: did the method beat its comparison?")
    ax.grid(axis="y", alpha=0)
    return fig


__all__ = ["verdict", "verdict_markdown", "verdict_html", "fig_paired_differences",
           "privacy_words", "t_quantile", "Diff", "Z95", "MIN_DRAWS"]
