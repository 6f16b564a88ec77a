"""What a finished ``popri run`` reports: RUN/results.json (:func:`collect`, :func:`identity`)
and its text (:func:`results_table`, the verdict lines), apart from the driver that runs the
stages (:mod:`popri.pipeline.driver`).

    popri run examples/default.yaml          # prints results_table(results.json) at the end
    popri runs show runs/default             # the same table from the run directory

``run`` below is the driver's ``Run`` (read only: its config, paths, method, runner).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterable

from popri.core import provenance
from popri.core.io import read_json
from popri.core.version import __version__
from popri.eval.stats import MIN_DRAWS
from popri.kit import fmt, released_line, selection_note
from popri.methods.steps import curve_sizes, draw_streams
from popri.models import llm
from popri.pipeline.config import to_dict
from popri.pipeline.recipes import METHODS
from popri.privacy.plan import Noise

MODE_NOTES = {
    "research": ("research mode: noise is seeded and reproducible from the sidecars; "
                 "not for release"),
    "release": ("release mode: OS CSPRNG, discretised Gaussian; the run stops at its release "
                "(no evaluation on the private splits: that is research mode's)"),
}

def collect(run, noise: Noise | None) -> dict:
    """RUN/results.json (schema: docs/formats.md): the budget and what was spent, the
    method's own fields, accuracy per method, gap closed, FID, recovery rates, timings."""
    c = run.cfg
    priv = read_json(run.run / "privacy.json")
    out = {"run_dir": str(run.run), "epsilon": priv.get("epsilon"), "delta": priv.get("delta"),
           "accountant": priv.get("accountant"),
           # the relation the total holds under, and whether it is a DP guarantee at all
           # (False only under privacy.convention: papers)
           "neighbouring": priv.get("neighbouring"),
           "dp_guarantee": priv.get("dp_guarantee", True),
           "guarantee": priv.get("guarantee"),
           "noise_multiplier": noise.z if noise else None,
           "sample_rate": noise.sample_rate if noise else None, "rounds": c.rounds,
           "prompts": c.prompts,
           "samples_per_prompt": c.samples_per_prompt, "num_synthetic": c.num_synthetic,
           "generator": c.generator.model, "downstream": c.downstream.model,
           # the numeric path of the stages: fp32 on every CPU unless POPRI_CPU_BF16=1
           "precision": run_precision(),
           "method": c.method, "seed": c.seed, "methods": {},
           "budget": {"epsilon": c.privacy.epsilon, "delta": c.privacy.delta,
                      "accountant": c.privacy.accountant,
                      "convention": c.privacy.convention},
           "mode": "release" if run.release else "research",
           "mode_note": MODE_NOTES["release" if run.release else "research"]}
    out.update(run.method.results(run, noise))
    take = run.paths.root / "synthetic_take.json"
    if c.final_match_tokens and take.is_file():  # the final set's size in tokens and samples
        out["final_match_tokens"] = read_json(take)
    model = run.method.model_out(run)
    out["release_provenance"] = release_provenance(
        model if model is not None else run.paths.synthetic, c.privacy.convention)
    if run.release:  # what the run releases; no evaluation (downstream_stages), and
        # none read back from an earlier research run in the same directory
        out["released"] = str(model if model is not None else run.paths.synthetic)
    else:
        _evaluation_results(run, out)
        out["research_reads"] = research_reads(run)
    out["stage_seconds"] = run.runner.stage_seconds()
    return out

def release_provenance(path, convention: str | None) -> dict:
    """What the run's release (its final synthetic set, or the model a DP-FL run trains) may
    be published as (issue 66): its provenance (popri.core.provenance: dp / public / not-dp
    with the links of its chain) and ``dp_guarantee``, False when a link is not-dp or the
    total is under a convention.  results.json's ``release_provenance``."""
    prov = provenance.status_of(path) if Path(path).exists() else provenance.PUBLIC
    links = list(prov.links) if not prov.guarantee else []
    if convention and not any("convention" in x for x in links):
        links.append(f"epsilon accounted under the {convention!r} convention, not a proven "
                     "relation")
    return {"path": str(path), "status": prov.status, "entries": list(prov.entries),
            "links": links, "dp_guarantee": not links}


def research_reads(run) -> list[str]:
    """What a research-mode run read of the private splits OUTSIDE the ledger (exact
    statistics, not covered by epsilon; release mode plans none of them): results.json's
    ``research_reads``, one line of the results table and the report."""
    E, reads = run.paths.eval, []
    if (E / f"{run.cfg.method}.json").exists():
        extra = [what for f, what in (("epsinf.json", "the eps = 0 / eps = inf rows"),
                                      ("control.json", "the T = 0 control"))
                 if (E / f).exists()]
        draws = len(list(E.glob("control-d*.json")))
        if draws:
            extra.append(f"{draws} more draws of both sets")
        reads.append("the evaluation on the private test split (accuracy per test client"
                     + "".join(f", {x}" for x in extra) + ")")
    if (E / "fid.json").exists():
        reads.append("the FID to the private validation split")
    if any(E.glob("quality-*.json")):
        reads.append("MAUVE of the synthetic sets against the private test split")
    if (run.run / "probe").is_dir() and any((run.run / "probe").glob("round*.json")):
        reads.append("the per-round probe (the private validation split)")
    if run.select == "private":
        reads.append("checkpoint selection on the exact private validation split "
                     "(POPri B.1)")
    return reads

def _evaluation_results(run, out: dict) -> None:
    """results.json's evaluation (research mode): the control and its draws, accuracy per
    model, the gap closed and FID, read from RUN/eval."""
    c, E = run.cfg, run.paths.eval
    if (E / "control.json").exists():
        out["control"] = read_json(E / "control.json")
        draws = [out["control"]] + [read_json(E / f"control-d{k}.json")
                                    for k in range(1, c.draws)
                                    if (E / f"control-d{k}.json").exists()]
        if len(draws) > 1:
            out["control"]["draws"] = draws_summary(draws)
        out["draws"] = draw_rows(run)
    q = {who: quality_at(run, who, 0) for who in (c.method, "t0")}
    if any(q.values()):
        out["quality"] = {who: v for who, v in q.items() if v}
    if c.curve:
        out["curve"] = curve_rows(run)
        out["scaling"] = scaling_summary(out["curve"])
    for name in (c.method, "t0", "eps0", "epsinf"):
        f = E / f"{name}.json"
        if f.exists():
            r = read_json(f)
            out["methods"][name] = {k: r.get(k) for k in ("accuracy", "accuracy_se", "loss",
                                                            "tokens", "clients")}
    if (E / "gap.json").exists():
        out["gap_closed"] = read_json(E / "gap.json")
    if (E / "fid.json").exists():
        out["fid_to_val"] = read_json(E / "fid.json").get("fid")

ARM_FIELDS = ("accuracy", "accuracy_se", "loss", "tokens", "clients", "sample_seed")

#: what results.json keeps of ``popri eval quality`` (downstream.quality) per arm, draw and n
QUALITY_FIELDS = ("mauve", "distinct_1", "distinct_2", "distinct_3", "self_cosine",
                  "embedding_spread", "mean_words")


def quality_at(run, who: str, k: int, n: int | None = None) -> dict:
    """Arm ``who``'s quality at draw ``k`` and size ``n`` (None: N), from
    RUN/eval/quality-WHO[-dK].json (held sets: draw 0's); {} when not measured."""
    E = run.paths.eval
    f = E / f"quality-{who}{'' if k == 0 else f'-d{k}'}.json"
    if not f.exists() and "generation" not in run.cfg.draw_sources:
        f = E / f"quality-{who}.json"  # the draw's sets are draw 0's
    if not f.exists():
        return {}
    q = read_json(f)
    n = run.cfg.num_synthetic if n is None else n
    row = next((r for r in q.get("sizes") or [] if r.get("n") == n), None)
    if row is None and n == run.cfg.num_synthetic:
        row = q
    return {x: row.get(x) for x in QUALITY_FIELDS} if row else {}


def draw_rows(run) -> list[dict]:
    """results.json's ``draws`` (issue 65): one row per finished draw of both synthetic sets
    (draw 0 first) with each arm's accuracy, its SE over test clients, loss (mean NLL per
    target token), tokens and test clients, the paired difference and its SE over test
    clients, and which draw of each random source it took (:func:`draw_streams`): the rows a
    variance decomposition reads, for both arms and every draw."""
    c, E = run.cfg, run.paths.eval
    rows = []
    for k in range(c.draws):
        sfx = "" if k == 0 else f"-d{k}"
        if not (E / f"control{sfx}.json").exists():
            continue
        d = read_json(E / f"control{sfx}.json")
        arms = {}
        for who in (c.method, "t0"):
            if (E / f"{who}{sfx}.json").exists():
                r = read_json(E / f"{who}{sfx}.json")
                arms[who] = {f: r.get(f) for f in ARM_FIELDS}
                arms[who]["perplexity"] = _ppl(r.get("loss"))
                arms[who].update(quality_at(run, who, k))
        rows.append({"draw": k, "streams": draw_streams(c, k), "arms": arms,
                     "acc_minus_control": d.get("acc_minus_control"),
                     "acc_minus_control_se": d.get("acc_minus_control_se")})
    return rows


def _ppl(loss) -> float | None:
    """The downstream model's test perplexity: exp of its mean NLL per target token."""
    import math

    try:
        return math.exp(float(loss)) if loss is not None and float(loss) < 700 else None
    except (TypeError, ValueError):
        return None


def _trained_on(run, tag: str) -> dict:
    """The samples and target tokens a downstream model trained on (its metrics.json)."""
    f = run.paths.root / "downstream" / tag / "metrics.json"
    if not f.exists():
        return {}
    m = read_json(f)
    hist = m.get("history") or [{}]
    return {"n_train": m.get("n_train"), "train_tokens": hist[0].get("train_tokens")}


def curve_rows(run) -> list[dict]:
    """results.json's ``curve`` (issue 65): one row per arm, size n and draw: ``arm``, ``n``,
    ``draw``, ``accuracy``, ``accuracy_se`` (over test clients), ``loss``, the ``n_train``
    samples and ``train_tokens`` it trained on, and for the method ``acc_minus_control`` with
    its paired SE; eps = 0 (no training) at every n, and eps = inf on all of the private
    training text as the ``ceiling`` row."""
    c, E = run.cfg, run.paths.eval
    sizes = [*curve_sizes(c), c.num_synthetic]
    rows = []
    for k in range(c.draws):
        sfx = "" if k == 0 else f"-d{k}"
        for n in sizes:
            at = "" if n == c.num_synthetic else f"-n{n}"
            arms = (c.method, "t0") + (("epsinf", "eps0") if k == 0 else ())
            for who in arms:
                tag = "eps0" if who == "eps0" else f"{who}{at}{sfx}"
                f = E / f"{tag}.json"
                if not f.exists():
                    continue
                r = read_json(f)
                row = {"arm": who, "n": n, "draw": k,
                       **{x: r.get(x) for x in ("accuracy", "accuracy_se", "loss")},
                       "perplexity": _ppl(r.get("loss")),
                       **({} if who == "eps0" else _trained_on(run, tag)),
                       **(quality_at(run, who, k, n) if who in (c.method, "t0") else {})}
                d = E / f"control{at}{sfx}.json"
                if who == c.method and d.exists():
                    dd = read_json(d)
                    row.update(acc_minus_control=dd.get("acc_minus_control"),
                               acc_minus_control_se=dd.get("acc_minus_control_se"))
                rows.append(row)
    if (E / "epsinf-all.json").exists():
        r = read_json(E / "epsinf-all.json")
        t = _trained_on(run, "epsinf-all")
        rows.append({"arm": "epsinf", "n": t.get("n_train"), "draw": 0, "ceiling": True,
                     **{x: r.get(x) for x in ("accuracy", "accuracy_se", "loss")}, **t})
    return rows


def scaling_summary(rows: list[dict]) -> list[dict]:
    """results.json's ``scaling``: per arm and n, the accuracy's mean over the draws and its SE
    -- between draws from 2 draws on (``se_kind: between draws``), else one draw's SE over
    test clients (``over test clients``: no verdict) -- and the method minus its control the
    same way; the rows ``popri report`` draws as the curve."""
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if not r.get("ceiling"):
            groups.setdefault((r["arm"], r["n"]), []).append(r)
    out = []
    for (arm, n), rs in groups.items():
        for what, key, se_key in (("accuracy", "accuracy", "accuracy_se"),
                                  ("minus_control", "acc_minus_control",
                                   "acc_minus_control_se"),
                                  ("perplexity", "perplexity", None),
                                  ("mauve", "mauve", None), ("distinct_2", "distinct_2", None),
                                  ("self_cosine", "self_cosine", None)):
            vals = [float(r[key]) for r in rs if r.get(key) is not None]
            if not vals:
                continue
            if len(vals) >= 2:
                se, kind = statistics.stdev(vals) / len(vals) ** 0.5, "between draws"
            else:
                se = rs[0].get(se_key) if se_key else None
                kind = "over test clients" if se_key else "one draw"
            toks = [r["train_tokens"] for r in rs if r.get("train_tokens") is not None]
            out.append({"arm": arm, "n": n, "what": what, "mean": statistics.fmean(vals),
                        "se": se, "se_kind": kind, "draws": len(vals),
                        "train_tokens": statistics.fmean(toks) if toks else None})
    return sorted(out, key=lambda r: (r["what"], r["arm"], r["n"]))


def identity(run) -> dict:
    """results.json's ``run``: which popri, which code, which command, which settings, and
    when (docs/formats.md); every invocation is also a line of RUN/logs/invocations.jsonl."""
    import hashlib
    import sys

    cfg = json.dumps(to_dict(run.cfg), sort_keys=True)
    ident = {"popri_version": __version__, "git_commit": git_commit(),
             "command": " ".join(sys.argv) if sys.argv and sys.argv[0] else None,
             "config_hash": hashlib.sha256(cfg.encode()).hexdigest()[:16],
             "started": _iso(getattr(run, "started", time.time())), "ended": _iso(time.time()),
             "stages_ran": len(run.runner.ran), "stages_cached": len(run.runner.skipped),
             "stages_copied": len(run.runner.reused)}
    log_dir = run.run / "logs"
    log_dir.mkdir(exist_ok=True)
    with open(log_dir / "invocations.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(ident) + "\n")
    ident["invocations"] = sum(1 for _ in open(log_dir / "invocations.jsonl",
                                               encoding="utf-8"))
    return ident


def draws_summary(draws: list[dict]) -> dict:
    """``results.json``'s ``control.draws``: the method minus its control per draw of both
    synthetic sets (draw 0 first), their mean and its SE between draws (the sampling noise of
    the synthetic sets and of the downstream training seed; issue 24)."""
    import statistics

    d = [float(x["acc_minus_control"]) for x in draws]
    return {"n": len(d), "acc_minus_control": d,
            "acc": [x.get("acc") for x in draws], "acc_control": [x.get("acc_control")
                                                                 for x in draws],
            "mean": statistics.fmean(d),
            "se_between": statistics.stdev(d) / len(d) ** 0.5,
            "se_within": (sum(float(x.get("acc_minus_control_se") or 0) ** 2 for x in draws)
                          ** 0.5 / len(d))}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


def git_commit() -> str | None:
    """The commit of the popri source checkout (with ``+dirty`` when it has uncommitted
    changes), or None for an installed package outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def epsilon_words(r: dict) -> str:
    """What a run's total epsilon is: its relation, or NOT A DP GUARANTEE (results.json's
    ``guarantee``; runs before 0.4 recorded none: add/remove as they claimed)."""
    if r.get("dp_guarantee") is False:
        return r.get("guarantee") or "NOT A DP GUARANTEE"
    return f"under {r.get('neighbouring') or 'add/remove one client'}"


def strings_of(x) -> Iterable[str]:
    """Every non-empty string in a nested mapping / list (a config's values)."""
    if isinstance(x, dict):
        for v in x.values():
            yield from strings_of(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from strings_of(v)
    elif isinstance(x, str) and x:
        yield x


def draws_verdict(label: str, dr: dict) -> str:
    """The learning line's verdict over draws: from >= MIN_DRAWS, whether the 95% t interval
    between draws excludes 0 (popri.report.verdict's rule); from fewer, that there is none."""
    n, mean, se = dr.get("n"), dr.get("mean"), dr.get("se_between")
    if not isinstance(n, int) or n < MIN_DRAWS or mean is None or se is None:
        return f"{n} draws are too few for a verdict (draws >= {MIN_DRAWS})"
    from scipy import stats

    t = float(stats.t.ppf(0.975, n - 1))
    lo, hi = mean - t * se, mean + t * se
    word = ("beat" if lo > 0 else "did not beat, it scored lower than" if hi < 0
            else "did not beat")
    return (f"verdict over {n} draws: {label} {word} its untuned generator (95% t interval "
            f"[{lo:+.4f}, {hi:+.4f}], t({n - 1}) = {t:.3f})")


def run_precision() -> str:
    """'cpu fp32' (every CPU by default), 'cpu bf16' (POPRI_CPU_BF16=1 on a CPU with native
    bf16) or 'cuda bf16' / 'cuda fp32': :func:`popri.models.llm.precision` on this machine,
    where the run's stages ran."""
    device = llm.default_device()
    return f"{device} {llm.precision(device)}"


def results_table(r: dict) -> str:
    """The markdown results table of one run (stdout and RUN/results.md)."""
    eps = r.get("epsilon")
    method = r.get("method", "popri")
    m = METHODS.get(method)
    own = m.table(r) if m is not None else None
    if own is not None:
        return own
    label = m.label if m else method
    shape = m.shape(r) if m else f"{method} on {r['run_dir']}"
    prec = f", precision {r['precision']}" if isinstance(r.get("precision"), str) else ""
    lines = [f"{shape}, generator {r['generator']}, downstream {r['downstream']}{prec}", "",
             "| method | epsilon | delta | next-token accuracy | SE (clients) | loss | FID to val |",
             "|---|---|---|---|---|---|---|"]
    if r.get("released") and not r["methods"]:
        lines[1:] = ["", released_line(r["released"])]
    eps_cell = fmt(eps, 3) + ("" if r.get("dp_guarantee") is not False else " (NOT DP)")
    labels = {method: (label, eps_cell),
              "t0": (f"{label}, T = 0 (untuned generator)", eps_cell),
              "eps0": ("eps=0 (public model)", "0"), "epsinf": ("eps=inf (private data)", "inf")}
    for k, (lab, e) in labels.items():
        mm = r["methods"].get(k)
        if mm:
            fid = fmt(r.get("fid_to_val"), 3) if k == method else "-"
            lines.append(f"| {lab} | {e} | {r.get('delta') if k == method else '-'} | "
                         f"{fmt(mm.get('accuracy'))} | {fmt(mm.get('accuracy_se'))} | "
                         f"{fmt(mm.get('loss'))} | {fid} |")
    ctl = r.get("control")
    if ctl and ctl.get("acc_minus_control") is not None:
        se, dr = ctl.get("acc_minus_control_se"), ctl.get("draws")
        head = (f"learning: {label} minus its T = 0 row (the untuned generator, same prompts, N "
                f"and recipe)")
        if dr:
            per_draw = ", ".join(f"{x:+.4f}" for x in dr["acc_minus_control"])
            lines += ["", f"{head}, over {dr['n']} draws of both synthetic sets: "
                          f"{dr['mean']:+.4f} +- {dr['se_between']:.4f} accuracy (SE between "
                          f"draws; per draw {per_draw}; SE over test clients "
                          f"{dr['se_within']:.4f})", draws_verdict(label, dr)]
        else:
            lines += ["", f"{head}: {ctl['acc_minus_control']:+.4f}"
                          + (f" +- {se:.4f}" if se is not None else "")
                          + " accuracy (one draw, paired over test clients)",
                      "one draw is no verdict: its SE over test clients leaves out the randomness "
                      "of generation and training (a second draw, or another machine, can land "
                      f"outside it); --set draws={MIN_DRAWS} gives one (the t interval between "
                      "draws)"]
    pr = r.get("probe")
    if pr and pr.get("delta_mean_cosine") is not None:
        lines.append(f"distance to the private validation split (fixed-prompt probe, a private "
                     f"diagnostic): mean-embedding cosine {pr['first_mean_cosine']:.4f} at round "
                     f"0 -> {pr['last_mean_cosine']:.4f} at round {pr['last_round']} "
                     f"({pr['delta_mean_cosine']:+.4f} +- {pr['delta_mean_cosine_se']:.4f}); "
                     f"distinct-2 {pr['first_distinct_2']:.3f} -> {pr['last_distinct_2']:.3f}")
    g = r.get("gap_closed")
    if g and g.get("gap_closed") is None:
        lines += ["", f"gap closed: undefined ({g.get('undefined', 'eps=0 = eps=inf')})"]
    elif g:
        lines += ["", f"gap closed (acc - acc_eps0) / (acc_epsinf - acc_eps0): "
                      f"{fmt(g.get('gap_closed'), 3)} +- {fmt(g.get('gap_closed_se'), 3)} "
                      f"(paired bootstrap over test clients)"]
    rr = [x for x in r.get("recovery_rate_per_round", []) if x is not None]
    if rr:
        lines.append("recovery rate of preference pairs per round (POPri Fig. 6): "
                     + ", ".join(f"{x:.2f}" for x in rr))
    lines.append(f"noise multiplier z={r['noise_multiplier']:.4f}, q={r['sample_rate']:.4g}; "
                 f"total epsilon from the ledger ({r.get('accountant')}): {fmt(eps, 4)} "
                 f"({epsilon_words(r)})")
    b = r.get("budget") or {}
    if b.get("epsilon") is not None:
        lines.append(f"budget: epsilon={b['epsilon']:g} at delta={b['delta']:g} "
                     f"({b['accountant']}), every ledger.jsonl under the run directory")
    mode = r.get("mode")
    if mode:
        lines.append(str(r.get("mode_note") or MODE_NOTES.get(mode, mode)))
    sel = r.get("checkpoint_selection")
    if sel:
        lines.append(sel.get("note") or selection_note(sel.get("on", "private")))
    rp = r.get("release_provenance")
    if isinstance(rp, dict) and rp.get("dp_guarantee") is False:
        lines.append(f"{provenance.NOT_DP} for {rp.get('path')}: "
                     + "; ".join(map(str, rp.get("links") or ())))
    if r.get("research_reads"):
        lines.append("NOT covered by epsilon (research reads of the private splits, outside the "
                     "ledger): " + "; ".join(r["research_reads"]))
    if r.get("recovery_rate_note"):
        lines.append(f"recovery rate: {r['recovery_rate_note']}")
    return "\n".join(lines)
