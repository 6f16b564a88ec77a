"""POPri vs PE (PrE-Text) vs PE+SFT vs the eps = 0 / eps = inf baselines, one table.

    python examples/compare.py                                  # embedded default, seeds 0 and 1
    python examples/compare.py --seeds 0 1 2 --runs runs/compare --set rounds=1
    python examples/compare.py --methods popri pe --set privacy.epsilon=7

Each method is a `popri run` of its config in examples/ (default.yaml, pe.yaml, pe-sft.yaml,
optionally popri-nn-histogram.yaml) at the same (eps, delta), per seed, in RUNS/METHOD-sSEED.
The POPri run of each seed also evaluates the baselines (eps = 0: the public downstream model;
eps = inf: the same recipe on the private train split, size-matched); the other methods skip
them and are scored against that seed's baselines.  Every method is evaluated on the same test
records, so the gap closed is paired: `popri eval gap` bootstraps over test clients.

Table (stdout, markdown; RUNS/compare.json has everything): per method, the mean over seeds of
the next-token accuracy, the gap closed (acc - acc_eps0) / (acc_epsinf - acc_eps0) and the FID
of the synthetic set to the private validation split, with standard errors: the bootstrap SE
over test clients of each seed combined as sqrt(sum se^2) / n_seeds (within-seed sampling
error), and the spread over seeds (sd / sqrt(n_seeds)) shown beside it; and the total epsilon
from each run's ledger.  Runs are cached stage by stage: rerunning the script resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = {"popri": "default.yaml", "pe": "pe.yaml", "pe-sft": "pe-sft.yaml",
           "popri-nn": "popri-nn-histogram.yaml"}
LABELS = {"popri": "POPri", "pe": "PE (PrE-Text)", "pe-sft": "PE+SFT",
          "popri-nn": "POPri, nn-histogram votes"}
RUN_METHOD = {"popri": "popri", "pe": "pe", "pe-sft": "pe-sft", "popri-nn": "popri"}


def popri(*args: str, capture: bool = False) -> str:
    exe = shutil.which("popri") or sys.executable
    cmd = [exe] + ([] if exe.endswith("popri") else ["-m", "popri"]) + list(args)
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE if capture else sys.stderr, text=True)
    if p.returncode != 0:
        sys.exit(f"compare: command failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout if capture else ""


def mean_se(values: list[float], ses: list[float]) -> tuple[float, float, float]:
    """(mean over seeds, within-seed SE of the mean, between-seed SE of the mean)."""
    n = len(values)
    m = sum(values) / n
    within = math.sqrt(sum(s * s for s in ses)) / n if all(s is not None for s in ses) else float("nan")
    between = statistics.stdev(values) / math.sqrt(n) if n > 1 else float("nan")
    return m, within, between


def fmt(x: float | None, nd: int = 4) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/compare", help="Directory of the runs.")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--methods", nargs="+", default=["popri", "pe", "pe-sft"],
                    choices=sorted(CONFIGS))
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="Config override for every run (popri run --set).")
    a = ap.parse_args()
    methods = ["popri"] + [m for m in a.methods if m != "popri"]  # POPri runs carry the baselines
    runs = Path(a.runs)
    res: dict = {m: [] for m in methods}
    base: dict = {"eps0": [], "epsinf": []}
    for seed in a.seeds:
        for m in methods:
            d = runs / f"{m}-s{seed}"
            over = [f"--set={s}" for s in a.sets] + [f"--set=seed={seed}", f"--set=run_dir={d}"]
            if m != "popri":
                over.append("--set=baselines=false")
            popri("run", str(HERE / CONFIGS[m]), *over)
            r = json.loads((d / "results.json").read_text())
            name = RUN_METHOD[m]
            ref = runs / f"popri-s{seed}" / "eval"
            gap = json.loads(popri("eval", "gap", "--method", str(d / "eval" / f"{name}.clients.jsonl"),
                                   "--eps0", str(ref / "eps0.clients.jsonl"), "--epsinf",
                                   str(ref / "epsinf.clients.jsonl"), "--seed", str(seed), "--json",
                                   capture=True))
            res[m].append({"seed": seed, "accuracy": r["methods"][name]["accuracy"],
                           "accuracy_se": r["methods"][name]["accuracy_se"],
                           "gap_closed": gap["gap_closed"], "gap_closed_se": gap["gap_closed_se"],
                           "fid": r.get("fid_to_val"), "epsilon": r["epsilon"], "delta": r["delta"]})
            if m == "popri":
                for b in ("eps0", "epsinf"):
                    base[b].append(r["methods"][b])
    setting = "the embedded default" + (f" with {' '.join(a.sets)}" if a.sets else "")
    lines = [f"Methods on {setting}, seeds {' '.join(map(str, a.seeds))} "
             f"({len(a.seeds)} seeds; SE within = bootstrap over test clients, between = over seeds)",
             "", "| method | epsilon (ledger) | accuracy | SE within / between | gap closed | "
             "SE within / between | FID to val |", "|---|---|---|---|---|---|---|"]
    table = {}
    for m in methods:
        rows = res[m]
        acc = mean_se([x["accuracy"] for x in rows], [x["accuracy_se"] for x in rows])
        gap = mean_se([x["gap_closed"] for x in rows], [x["gap_closed_se"] for x in rows])
        fids = [x["fid"] for x in rows if x["fid"] is not None]
        fid = sum(fids) / len(fids) if fids else None
        eps = max(x["epsilon"] for x in rows)
        table[m] = {"accuracy": acc, "gap_closed": gap, "fid": fid, "epsilon": eps, "runs": rows}
        lines.append(f"| {LABELS[m]} | {fmt(eps, 3)} | {fmt(acc[0])} | {fmt(acc[1])} / {fmt(acc[2])} | "
                     f"{fmt(gap[0], 3)} | {fmt(gap[1], 3)} / {fmt(gap[2], 3)} | {fmt(fid, 3)} |")
    for b, label, eps in (("eps0", "eps=0 (public model)", "0"), ("epsinf", "eps=inf (private data)", "inf")):
        acc = mean_se([x["accuracy"] for x in base[b]], [x["accuracy_se"] for x in base[b]])
        table[b] = {"accuracy": acc}
        lines.append(f"| {label} | {eps} | {fmt(acc[0])} | {fmt(acc[1])} / {fmt(acc[2])} | "
                     f"{'0' if b == 'eps0' else '1'} | - | - |")
    out = "\n".join(lines)
    runs.mkdir(parents=True, exist_ok=True)
    tmp = runs / "compare.json.tmp"
    tmp.write_text(json.dumps(table, indent=2) + "\n")
    os.replace(tmp, runs / "compare.json")
    tmp = runs / "compare.md.tmp"
    tmp.write_text(out + "\n")
    os.replace(tmp, runs / "compare.md")
    print(out)


if __name__ == "__main__":
    main()
