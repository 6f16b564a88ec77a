"""Why does DPO on the clients' scores make POPri's synthetic text worse to learn from?  The
diagnosis of issue 44, on finished `popri run`s of benchmarks/learning_study.py.

    python benchmarks/learning_study.py --only ood-eps1-rpo --set draws=1   # a run to diagnose
    python benchmarks/fluency_diagnosis.py runs/study/ood-eps1-rpo-s0         # its diagnosis
    python benchmarks/fluency_diagnosis.py runs/study/*-s0 --no-train         # the cheap part only

Per run, each number cached in RUN/diagnosis/ (a killed diagnosis resumes):

1. **pairs** (every round): the public model's NLL of the chosen and of the rejected sample of
   each preference pair (`popri eval fluency`, first 128 tokens, the text alone), their paired
   difference (positive: the chosen one is the less fluent), how many pairs chose the less
   fluent text, words and degenerate share; and, over all K x J samples of the round, the
   within-prompt Spearman correlation of the score with the NLL -- for the released (DP) scores
   and for the noise-free scores (a private diagnostic: is it the reward or the noise that
   favours disfluent text?).
2. **shift** (every round): the NLL of the untuned generator's own final set (synthetic_t0.jsonl,
   the base model's typical text) under round t's DPO adapter minus under the base model,
   paired over the texts: how far the tuning moved the base model's typical text.
3. **final**: the NLL distribution of the final set and of its T = 0 control under the base
   model (quantiles, the share above the control's 90th percentile, degenerate share).
4. **trim** (trains): both sets without their least fluent ``--trim`` share (by each set's own
   NLL quantile, the same N left in both), trained and evaluated as the run's final set was:
   method minus T = 0 paired over the test clients.  Does the final set lose through its tail?
5. **big-n** (trains): ``--big-n`` samples of each generator (the run's final-set `popri gen`
   with --num-samples changed, same seed), trained and evaluated: is N = 96 enough to show what
   a distribution is worth?

Results: stdout and benchmarks/results/NAME.md / .json (``--name``, default fluency_diagnosis).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from learning_study import moved  # noqa: E402  (benchmarks/ is not a package)


def popri(argv: list[str], out: Path | None = None) -> None:
    """Run ``popri ARGV`` (stdout to ``out``, written atomically); exit on failure."""
    cmd = [sys.executable, "-m", "popri.cli.app", *argv]
    p = subprocess.run(cmd, stdout=subprocess.PIPE if out else None, text=True)
    if p.returncode != 0:
        sys.exit(f"fluency_diagnosis: failed ({p.returncode}): {shlex.join(argv)}")
    if out is not None:
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(p.stdout)
        os.replace(tmp, out)


def fluency(src: Path, dest: Path, *, adapter: Path | None = None) -> dict:
    """`popri eval fluency SRC` (cached in DEST.json, per text in DEST.jsonl)."""
    js = dest.with_suffix(".json")
    if not js.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        popri(["eval", "fluency", str(src), "--out", str(dest.with_suffix(".jsonl")), "--json",
               *(["--adapter", str(adapter)] if adapter else [])], out=js)
    return json.loads(js.read_text())


def _per_text(dest: Path) -> list[dict]:
    return [json.loads(x) for x in dest.with_suffix(".jsonl").read_text().splitlines() if x]


def _rounds(run: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in run.glob("round*") if p.name[5:].isdigit()
                  and (p / "prefs.jsonl").is_file())


def _scores(path: Path, samples: list[dict]) -> np.ndarray:
    from popri.methods.popri.prefs import align_scores, load_score_vector

    arr, ids = load_score_vector(str(path))
    return align_scores(samples, arr, ids, path=str(path))


def within_prompt_spearman(samples: list[dict], score: np.ndarray, nll: np.ndarray) -> dict:
    """Mean over prompts of the Spearman correlation of score with NLL among that prompt's J
    samples (positive: the higher-scored samples are the less fluent), its SE over prompts."""
    from scipy.stats import spearmanr

    groups: dict[object, list[int]] = {}
    for n, s in enumerate(samples):
        groups.setdefault(s["prompt_id"], []).append(n)
    rho = []
    for idx in groups.values():
        a, b = score[idx], nll[idx]
        ok = np.isfinite(b)
        if ok.sum() >= 3 and np.ptp(a[ok]) > 0 and np.ptp(b[ok]) > 0:
            rho.append(float(spearmanr(a[ok], b[ok]).statistic))
    r = np.array(rho)
    return {"prompts": len(r), "rho": float(r.mean()) if len(r) else None,
            "rho_se": float(r.std(ddof=1) / math.sqrt(len(r))) if len(r) > 1 else None}


def pairs_and_reward(run: Path, out: Path) -> list[dict]:
    from popri.core.io import read_jsonl

    rows = []
    for t in _rounds(run):
        rd = run / f"round{t}"
        pr = fluency(rd / "prefs.jsonl", out / f"round{t}_pairs")
        sm = fluency(rd / "samples.jsonl", out / f"round{t}_samples")
        samples = read_jsonl(rd / "samples.jsonl")
        nll = np.array([np.nan if r["nll"] is None else r["nll"]
                        for r in _per_text(out / f"round{t}_samples")])
        row = {"round": t, **{k: pr[k] for k in (
            "pairs", "nll_chosen_minus_rejected", "nll_chosen_minus_rejected_se",
            "chosen_less_fluent", "words_chosen_minus_rejected", "degenerate_chosen",
            "degenerate_rejected")},
            "samples_nll": sm["mean_nll"], "samples_nll_p90": sm["nll_p90"],
            "samples_degenerate": sm["degenerate_share"],
            "ppl_chosen": math.exp(pr["chosen"]["mean_nll"]),
            "ppl_rejected": math.exp(pr["rejected"]["mean_nll"]),
            "released": within_prompt_spearman(samples, _scores(rd / "scores.npy", samples), nll)}
        exact = run / "diagnostics" / f"round{t}" / "exact.npy"
        if exact.is_file():  # private diagnostic: the noise-free mean cosine
            row["exact"] = within_prompt_spearman(samples, _scores(exact, samples), nll)
        rows.append(row)
    return rows


def shift(run: Path, out: Path) -> list[dict]:
    """NLL of the untuned generator's final set under each round's adapter minus under the base."""
    typical = run / "synthetic_t0.jsonl"
    base = fluency(typical, out / "t0_base")
    b = np.array([r["nll"] if r["nll"] is not None else np.nan for r in _per_text(out / "t0_base")])
    rows = []
    for t in _rounds(run):
        ad = run / f"round{t}" / "dpo" / "adapter"
        if not ad.is_dir():
            continue
        fluency(typical, out / f"t0_round{t}", adapter=ad)
        a = np.array([r["nll"] if r["nll"] is not None else np.nan
                      for r in _per_text(out / f"t0_round{t}")])
        d = (a - b)[np.isfinite(a - b)]
        rows.append({"round": t, "base_nll": base["mean_nll"], "nll_shift": float(d.mean()),
                     "nll_shift_se": float(d.std(ddof=1) / math.sqrt(len(d))),
                     "texts": int(len(d))})
    return rows


_KEYS = ("mean_nll", "mean_nll_se", "perplexity", "nll_p10", "nll_p50", "nll_p90",
         "degenerate_share", "mean_words")


def _tokens(dest: Path) -> float:
    return float(np.mean([r["tokens"] for r in _per_text(dest)]))


def final(run: Path, out: Path, method: str) -> dict:
    m = fluency(run / "synthetic.jsonl", out / f"{method}_base")
    c = fluency(run / "synthetic_t0.jsonl", out / "t0_base")
    mn = np.array([r["nll"] for r in _per_text(out / f"{method}_base") if r["nll"] is not None])
    return {"method": {**{k: m[k] for k in _KEYS}, "mean_tokens": _tokens(out / f"{method}_base")},
            "t0": {**{k: c[k] for k in _KEYS}, "mean_tokens": _tokens(out / "t0_base")},
            "method_above_t0_p90": float((mn > c["nll_p90"]).mean())}


def reference(run: Path, out: Path, n: int = 200) -> dict:
    """The same measures of real text: the first ``n`` records of the private validation split
    (a private diagnostic, read without noise) and of Omega's training split."""
    from popri.core.io import read_jsonl, write_jsonl

    res = {}
    for key, src in (("private_val", run / "data" / "private" / "val.jsonl"),
                     ("public", run / "data" / "public" / "train.jsonl")):
        if not src.is_file():
            continue
        head = out / f"{key}_head.jsonl"
        if not head.is_file():
            write_jsonl(read_jsonl(src)[:n], head)
        f = fluency(head, out / f"{key}_ref")
        res[key] = {**{k: f[k] for k in _KEYS}, "mean_tokens": _tokens(out / f"{key}_ref")}
    return res


def _replay(run: Path, method: str, edit) -> None:
    """Run the run's own final-set commands (learning_study's), each passed through
    ``edit(argv) -> argv | None`` (None: skip)."""
    from learning_study import _stage_lines, run_line

    for argv in _stage_lines(run, method):
        argv = edit(list(argv))
        if argv is not None and not run_line(argv):
            sys.exit(f"fluency_diagnosis: failed: {shlex.join(argv)}")


def trim(run: Path, out: Path, method: str, share: float) -> dict:
    """Both final sets without their least fluent ``share``, trained and evaluated."""
    from popri.core.io import read_jsonl, write_jsonl

    dest = out / f"trim{share:g}"
    done = dest / "eval" / "control.json"
    if not done.is_file():
        (dest / "eval").mkdir(parents=True, exist_ok=True)
        for name, flu in (("synthetic", f"{method}_base"), ("synthetic_t0", "t0_base")):
            recs = read_jsonl(run / f"{name}.jsonl")
            nll = np.array([np.inf if r["nll"] is None else r["nll"]
                            for r in _per_text(out / flu)])
            keep = int(round(len(recs) * (1.0 - share)))
            order = np.argsort(nll, kind="stable")[:keep]
            write_jsonl([recs[i] for i in sorted(order)], dest / f"{name}.jsonl")

        def edit(argv):
            if argv[1] == "gen":
                return None  # the trimmed sets are written above
            return moved(argv, run, dest)

        _replay(run, method, edit)
    for w in (dest / "downstream").glob("*/model.safetensors"):
        w.unlink()
    return json.loads(done.read_text())


def big_n(run: Path, out: Path, method: str, n: int, variant: dict | None = None) -> dict:
    """``n`` samples of each generator, trained and evaluated; ``variant``: a final-set
    variant's options (learning_study.final_variant: ``gen`` flags of both final sets,
    ``match``: the method's set a pool of 3 n cut to its control's tokens)."""
    from learning_study import _matched, _stage_lines, _tag, run_line, with_flags

    from popri.kit import take_call

    def take_argv(*a):
        return take_call(*a).argv()
    from popri.methods.popri.recipe import MATCH_POOL

    v = variant or {"gen": [], "match": False}
    tag = _tag(v["gen"], v["match"])
    dest = out / (f"n{n}-{tag}" if tag else f"n{n}")
    done = dest / "eval" / "control.json"
    if not done.is_file():
        (dest / "eval").mkdir(parents=True, exist_ok=True)
        lines = []
        for argv in _stage_lines(run, method):
            argv = moved(list(argv), run, dest)
            if argv[1] == "gen":
                argv[argv.index("--num-samples") + 1] = str(n)
                with_flags(argv, v["gen"])
            if argv[1] == "train-downstream" and "--max-samples" in argv:
                argv[argv.index("--max-samples") + 1] = str(n)
            lines.append(argv)
        if v["match"]:
            lines = _matched(lines, run, dest, 0, MATCH_POOL, take_argv, reuse=False)
        for argv in lines:
            if not run_line(argv):
                sys.exit(f"fluency_diagnosis: failed: {shlex.join(argv)}")
    for w in (dest / "downstream").glob("*/model.safetensors"):
        w.unlink()
    return json.loads(done.read_text())


def screen_big_n(run: Path, n: int, variant: dict | None, setting: str) -> dict:
    """The screening's N check alone (docs/results.md): ``n`` samples of each generator."""
    res = json.loads((run / "results.json").read_text())
    b = big_n(run, run / "diagnosis", res["method"], n, variant)
    return {"run": run.name, "setting": setting, "n": n, "minus_t0": b["acc_minus_control"],
            "minus_t0_se": b["acc_minus_control_se"], "acc": b["acc"], "acc_t0": b["acc_control"]}


def diagnose(run: Path, *, train: bool, share: float, n: int) -> dict:
    res = json.loads((run / "results.json").read_text())
    method = res["method"]
    out = run / "diagnosis"
    ctl = res.get("control") or {}
    row = {"run": run.name, "method": method, "epsilon": res.get("epsilon"),
           "relation": res.get("neighbouring"),
           "run_minus_t0": ctl.get("acc_minus_control"),
           "run_minus_t0_se": ctl.get("acc_minus_control_se"),
           "pairs": pairs_and_reward(run, out), "shift": shift(run, out),
           "final": final(run, out, method), "reference": reference(run, out)}
    if train:
        t = trim(run, out, method, share)
        row["trim"] = {"share": share, "minus_t0": t["acc_minus_control"],
                       "minus_t0_se": t["acc_minus_control_se"]}
        b = big_n(run, out, method, n)
        row["big_n"] = {"n": n, "minus_t0": b["acc_minus_control"],
                        "minus_t0_se": b["acc_minus_control_se"], "acc": b["acc"],
                        "acc_t0": b["acc_control"]}
    return row


def _f(x, nd=3, sign=False):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:+.{nd}f}" if sign else f"{x:.{nd}f}"


def tables(rows: list[dict]) -> str:
    out = ["### Preference pairs under the public model (positive: the chosen text is the less "
           "fluent)", "",
           "| run | round | all K x J samples: NLL mean / p90 (degenerate) | NLL chosen - "
           "rejected +- SE | chosen less fluent | ppl chosen / rejected | words chosen - "
           "rejected | degenerate chosen / rejected | rho(released score, NLL) +- SE | "
           "rho(noise-free score, NLL) +- SE (private diagnostic) |",
           "|" + "---|" * 10]
    for r in rows:
        for p in r["pairs"]:
            ex = p.get("exact") or {}
            out.append(
                f"| {r['run']} | {p['round']} | {_f(p['samples_nll'])} / "
                f"{_f(p['samples_nll_p90'])} ({_f(p['samples_degenerate'], 2)}) | "
                f"{_f(p['nll_chosen_minus_rejected'], sign=True)} "
                f"+- {_f(p['nll_chosen_minus_rejected_se'])} | {p['chosen_less_fluent']} of "
                f"{p['pairs']} | {p['ppl_chosen']:.0f} / {p['ppl_rejected']:.0f} | "
                f"{_f(p['words_chosen_minus_rejected'], 1, True)} | {p['degenerate_chosen']} / "
                f"{p['degenerate_rejected']} | {_f(p['released']['rho'], sign=True)} +- "
                f"{_f(p['released']['rho_se'])} | {_f(ex.get('rho'), sign=True)} +- "
                f"{_f(ex.get('rho_se'))} |")
    out += ["", "### How far DPO moved the untuned generator's typical text (its final set, under "
            "round t's adapter minus under the base model; nats per token)", "",
            "| run | base NLL | " + " | ".join(f"round {t}" for t in range(1, 1 + max(
                (len(r["shift"]) for r in rows), default=0))) + " |",
            "|" + "---|" * (2 + max((len(r["shift"]) for r in rows), default=0))]
    for r in rows:
        if r["shift"]:
            out.append(f"| {r['run']} | {_f(r['shift'][0]['base_nll'])} | " + " | ".join(
                f"{_f(s['nll_shift'], sign=True)} +- {_f(s['nll_shift_se'])}"
                for s in r["shift"]) + " |")
    out += ["", "### The final set against its T = 0 control under the base model, and real text "
            "(the private validation split's first 200 records: a private diagnostic; Omega's)",
            "", "| run | set | NLL mean +- SE | p10 | p50 | p90 | ppl | tokens | words | "
            "degenerate |", "|" + "---|" * 10]
    for r in rows:
        sets = [("method", r["final"]["method"]), ("T = 0", r["final"]["t0"]),
                *(((k, v) for k, v in (r.get("reference") or {}).items()))]
        for name, m in sets:
            out.append(
                f"| {r['run']} | {name} | {_f(m['mean_nll'])} +- {_f(m['mean_nll_se'])} | "
                f"{_f(m['nll_p10'])} | {_f(m['nll_p50'])} | {_f(m['nll_p90'])} | "
                f"{_f(m['perplexity'], 0)} | {_f(m.get('mean_tokens'), 1)} | "
                f"{_f(m['mean_words'], 1)} | {_f(m['degenerate_share'], 2)} |")
        out.append(f"| {r['run']} | method above T = 0's p90 | "
                   f"{_f(r['final']['method_above_t0_p90'], 2)} | | | | | | | |")
    trained = [r for r in rows if "trim" in r]
    if trained:
        out += ["", "### Downstream: the run's final sets, the same without their least fluent "
                "share, and a bigger N (method minus T = 0, paired over test clients; one draw)",
                "", "| run | as run (N) | trimmed (share) | bigger N |", "|---|---|---|---|"]
        for r in trained:
            t, b = r["trim"], r["big_n"]
            out.append(
                f"| {r['run']} | {_f(r['run_minus_t0'], 4, True)} +- "
                f"{_f(r['run_minus_t0_se'], 4)} | {_f(t['minus_t0'], 4, True)} +- "
                f"{_f(t['minus_t0_se'], 4)} ({t['share']:g}) | {_f(b['minus_t0'], 4, True)} +- "
                f"{_f(b['minus_t0_se'], 4)} (N = {b['n']}; acc {_f(b['acc'], 4)} / "
                f"{_f(b['acc_t0'], 4)}) |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="Finished `popri run` directories.")
    ap.add_argument("--no-train", dest="train", action="store_false",
                    help="Skip the trim and bigger-N downstream trainings.")
    ap.add_argument("--trim", type=float, default=0.25,
                    help="Share of each final set left out by NLL (default 0.25).")
    ap.add_argument("--big-n", type=int, default=384, help="Samples of each generator for the "
                    "bigger-N training (default 384).")
    ap.add_argument("--name", default="fluency_diagnosis")
    ap.add_argument("--big-n-only", metavar="SETTING", default=None,
                    help="Only the bigger-N check of the screening, for this study setting "
                         "(a final-set variant, e.g. ood-eps1-tokens, replays its options on "
                         "its base run RUN); a line per run, JSON to results/NAME.json.")
    a = ap.parse_args()
    if not 0 < a.trim < 1:
        sys.exit("fluency_diagnosis: --trim is a share in (0, 1)")
    if a.big_n_only:
        from learning_study import SETTINGS, final_variant

        if a.big_n_only not in SETTINGS:
            sys.exit(f"fluency_diagnosis: unknown setting {a.big_n_only!r}")
        var = final_variant(a.big_n_only)
        rows = [screen_big_n(r, a.big_n, var[1] if var else None, a.big_n_only) for r in a.runs]
        for r in rows:
            print(f"{r['setting']} ({r['run']}), N = {r['n']}: {r['acc']:.4f} vs T = 0 "
                  f"{r['acc_t0']:.4f}, {r['minus_t0']:+.4f} +- {r['minus_t0_se']:.4f}")
        res = HERE / "results" / f"{a.name}.json"
        old = json.loads(res.read_text()) if res.is_file() else []
        keep = [o for o in old if (o.get("run"), o.get("setting")) not in
                {(r["run"], r["setting"]) for r in rows}]
        res.write_text(json.dumps(keep + rows, indent=2) + "\n")
        return
    rows = [diagnose(r, train=a.train, share=a.trim, n=a.big_n) for r in a.runs]
    md = tables(rows)
    print(md)
    res = HERE / "results"
    (res / f"{a.name}.md").write_text(md + "\n")
    (res / f"{a.name}.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
