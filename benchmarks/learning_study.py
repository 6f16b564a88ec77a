"""Does POPri's DPO improve the generator at CPU scale?  The study of issue 24, as `popri run`s.

    python benchmarks/learning_study.py --list                       # the study's settings
    python benchmarks/learning_study.py --only oracle                # one setting, seed 0
    python benchmarks/learning_study.py --only oracle --seeds 0 1 2  # three seeds
    python benchmarks/learning_study.py --table                      # the table of what ran

Each setting is `popri run examples/learning.yaml` with `--set` overrides, in
RUNS/SETTING-sSEED (cached stage by stage: a killed study resumes; add settings and rerun).  The
table (stdout, and benchmarks/results/learning_study.md / .json) has, per setting and seed:

- **distance** (the fixed-prompt probe, a private diagnostic): mean-embedding cosine of round 0
  (the untuned generator) and of round T to the private validation split, the change and its
  SE, and the same for MMD^2; the probe's distinct-2 and perplexity at round 0 and round T;
- **DPO**: reward margin and preference accuracy on held-out pairs in the last round;
- **downstream**: the method's accuracy, its T = 0 row's (the untuned generator's synthetic set:
  same prompts, N, seed and recipe), and the method minus T = 0, paired over the test clients,
  with its SE; "beats T = 0" when that difference is above 2 SEs;
- minutes the run took on this machine.

The settings: `oracle` (z ~ 0, every client: is it the tuning or the privacy?) and its knobs
(learning rate, epochs, beta, loss, RPO's NLL term, rejected rank, temperature), `eps7` and `eps1` at the paper's q, and the out-of-domain pair
(`ood-*`: private shakespeare, public sotu); `*-pool`: the evolving few-shot pool (`pool: chosen`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "examples" / "learning.yaml"

#: z ~ 0 and every client: the tuning alone (popri run refuses z = 0 itself)
ORACLE = ["privacy.epsilon=null", "privacy.noise_multiplier=1e-9",
          "score.clients_per_round=null", "score.sample_rate=null"]
#: private shakespeare (roles as clients), public sotu: a public set out of the private domain
OOD = ["data.source=shakespeare", "data.date_from=null", "data.max_samples_per_client=16",
       "data.public_source=sotu", "data.public_date_to=1899-12-31"]

SETTINGS: dict[str, list[str]] = {
    "oracle": ORACLE,
    "oracle-lr1e-4": ORACLE + ["dpo.lr=1e-4"],
    "oracle-epochs1": ORACLE + ["dpo.epochs=1"],
    "oracle-beta0.1": ORACLE + ["dpo.beta=0.1"],
    "oracle-ipo": ORACLE + ["dpo.loss=ipo"],
    "oracle-rank3": ORACLE + ["dpo.rejected_rank=3"],
    "oracle-temp0.7": ORACLE + ["generator.temperature=0.7"],
    # DPO + the chosen sample's NLL (RPO, arXiv:2404.19733, alpha = 1): keeps the generator fluent
    "oracle-rpo": ORACLE + ["dpo.sft_weight=1.0"],
    "ood-oracle-rpo": OOD + ORACLE + ["dpo.sft_weight=1.0"],
    "eps7": ["privacy.epsilon=7"],
    "eps1": ["privacy.epsilon=1"],
    "ood-oracle": OOD + ORACLE,
    "ood-eps1": OOD + ["privacy.epsilon=1"],
    # the best oracle setting (RPO: the largest move, no significant loss against T = 0) under DP
    "eps1-rpo": ["privacy.epsilon=1", "dpo.sft_weight=1.0"],
    "ood-eps1-rpo": OOD + ["privacy.epsilon=1", "dpo.sft_weight=1.0"],
    # beyond the paper: round t+1's few-shot examples are round t's DP-chosen samples
    # (popri/methods/popri/pool.py; post-processing of the released scores)
    "eps1-rpo-pool": ["privacy.epsilon=1", "dpo.sft_weight=1.0", "pool=chosen"],
    "ood-eps1-rpo-pool": OOD + ["privacy.epsilon=1", "dpo.sft_weight=1.0", "pool=chosen"],
}


def run_setting(name: str, seed: int, runs: Path, extra: list[str]) -> dict:
    d = runs / f"{name}-s{seed}"
    cmd = [sys.executable, "-m", "popri.cli.app", "run", str(CONFIG),
           *[f"--set={o}" for o in SETTINGS[name] + extra],
           f"--set=seed={seed}", f"--set=run_dir={d}"]
    t0 = time.time()
    p = subprocess.run(cmd, env=dict(os.environ))
    if p.returncode != 0:
        print(f"learning_study: {name} seed {seed} failed (exit {p.returncode})",
              file=sys.stderr)
    return {"minutes": (time.time() - t0) / 60.0, "rc": p.returncode}


def collect(runs: Path) -> list[dict]:
    rows = []
    for d in sorted(runs.glob("*-s*")):
        f = d / "results.json"
        if not f.is_file():
            continue
        r = json.loads(f.read_text())
        name, seed = d.name.rsplit("-s", 1)
        pr, ctl = r.get("probe") or {}, r.get("control") or {}
        m = r.get("methods", {})
        metrics = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()
                   if x.strip()] if (d / "metrics.jsonl").is_file() else []
        dpo = [x for x in metrics if x["stage"] == "dpo"]
        secs = sum(json.loads(s.read_text()).get("seconds") or 0
                   for s in (d / ".stages").glob("*.json")
                   if not s.name.endswith(".attempt.json"))
        rows.append({
            "setting": name, "seed": int(seed), "epsilon": r.get("epsilon"),
            "rounds": r.get("rounds"), "minutes": secs / 60.0,
            "cos0": pr.get("first_mean_cosine"), "cosT": pr.get("last_mean_cosine"),
            "dcos": pr.get("delta_mean_cosine"), "dcos_se": pr.get("delta_mean_cosine_se"),
            "dmmd": pr.get("delta_mmd2"), "dmmd_se": pr.get("delta_mmd2_se"),
            "d2_0": pr.get("first_distinct_2"), "d2_T": pr.get("last_distinct_2"),
            "ppl0": pr.get("first_perplexity"), "pplT": pr.get("last_perplexity"),
            "hold_margin": dpo[-1].get("holdout_margin") if dpo else None,
            "hold_acc": dpo[-1].get("holdout_accuracy") if dpo else None,
            "acc": (m.get(r.get("method")) or {}).get("accuracy"),
            "acc_t0": (m.get("t0") or {}).get("accuracy"),
            "diff": ctl.get("acc_minus_control"), "diff_se": ctl.get("acc_minus_control_se"),
            "gap": (r.get("gap_closed") or {}).get("gap_closed"),
        })
    return rows


def _f(x, nd=4):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}"


def _eps(x) -> str:
    """The oracle's z = 1e-9 is an epsilon of ~1e18: no privacy, shown as such."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)) or x > 1e6:
        return "none (z ~ 0)"
    return _f(x, 2)


def table(rows: list[dict]) -> str:
    head = ("| setting | seed | eps | T | cos r0 -> rT (change +- SE) | MMD^2 change +- SE | "
            "distinct-2 r0 -> rT | ppl r0 -> rT | held-out margin / acc | acc | acc T=0 | "
            "minus T=0 +- SE | beats T=0 | minutes |")
    out = [head, "|" + "---|" * 14]
    for r in rows:
        beats = (r["diff"] is not None and r["diff_se"] is not None and r["diff_se"] > 0
                 and r["diff"] > 2 * r["diff_se"])
        out.append(
            f"| {r['setting']} | {r['seed']} | {_eps(r['epsilon'])} | {r['rounds']} | "
            f"{_f(r['cos0'])} -> {_f(r['cosT'])} ({_f(r['dcos'])} +- {_f(r['dcos_se'])}) | "
            f"{_f(r['dmmd'], 5)} +- {_f(r['dmmd_se'], 5)} | {_f(r['d2_0'], 3)} -> "
            f"{_f(r['d2_T'], 3)} | {_f(r['ppl0'], 1)} -> {_f(r['pplT'], 1)} | "
            f"{_f(r['hold_margin'])} / {_f(r['hold_acc'], 2)} | {_f(r['acc'])} | "
            f"{_f(r['acc_t0'])} | {_f(r['diff'])} +- {_f(r['diff_se'])} | "
            f"{'yes' if beats else 'no'} | {r['minutes']:.1f} |")
    # per setting, over seeds: the mean change and the spread
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["setting"], []).append(r)
    multi = {k: v for k, v in groups.items() if len(v) > 1}
    if multi:
        out += ["", "| setting | seeds | cos change (mean, SE over seeds) | minus T=0 (mean, "
                "SE within / between seeds) |", "|---|---|---|---|"]
        for k, v in multi.items():
            dc = [x["dcos"] for x in v if x["dcos"] is not None]
            dd = [x["diff"] for x in v if x["diff"] is not None]
            se_w = [x["diff_se"] for x in v if x["diff_se"] is not None]
            out.append(
                f"| {k} | {len(v)} | {statistics.mean(dc):.4f} "
                f"({statistics.stdev(dc) / math.sqrt(len(dc)) if len(dc) > 1 else float('nan'):.4f}) | "
                f"{statistics.mean(dd):+.4f} ({math.sqrt(sum(s * s for s in se_w)) / len(se_w):.4f}"
                f" / {statistics.stdev(dd) / math.sqrt(len(dd)) if len(dd) > 1 else float('nan'):.4f}) |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/study")
    ap.add_argument("--only", nargs="+", default=None, help="Settings to run (default: all).")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="Extra override for every run.")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--table", action="store_true", help="Only tabulate what ran.")
    a = ap.parse_args()
    runs = Path(a.runs)
    if a.list:
        for k, v in SETTINGS.items():
            print(f"{k}: {' '.join(v)}")
        return
    if not a.table:
        for name in a.only or list(SETTINGS):
            if name not in SETTINGS:
                sys.exit(f"unknown setting {name!r}: see --list")
            for seed in a.seeds:
                run_setting(name, seed, runs, a.sets)
    rows = collect(runs)
    md = table(rows)
    print(md)
    res = HERE / "results"
    res.mkdir(exist_ok=True)
    (res / "learning_study.md").write_text(md + "\n")
    (res / "learning_study.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
