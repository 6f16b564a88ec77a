"""POPri vs PE (PrE-Text) vs PE+SFT vs DP-FedAvg / DP-FTRL vs eps = 0 / eps = inf, one table.

    python examples/compare.py                                  # embedded default, seeds 0 1 2
    python examples/compare.py --seeds 0 1 2 --runs runs/compare --set rounds=1
    python examples/compare.py --methods popri pe --set privacy.epsilon=7
    python examples/compare.py --methods popri dp-fedavg dp-ftrl --seeds 0 1 2

Each method is a `popri run` of its config in examples/ (default.yaml, pe.yaml, pe-sft.yaml,
dpfl.yaml for DP-FedAvg and DP-FTRL, optionally popri-nn-histogram.yaml) at the same (eps,
delta), per seed, in RUNS/METHOD-sSEED.  DP-FedAvg / DP-FTRL train the downstream model itself
(no synthetic set, no FID).
The POPri run of each seed (or the first method's, without POPri) also evaluates the baselines
(eps = 0: the public downstream model; eps = inf: the same recipe on the private train split,
size-matched); the other methods skip them and are scored against that seed's baselines.  Every method is evaluated on the same test
records, so the gap closed is paired: `popri eval gap` bootstraps over test clients.

Table (stdout, markdown; RUNS/compare.json has everything): per method, the mean over seeds of
the next-token accuracy, the gap closed (acc - acc_eps0) / (acc_epsinf - acc_eps0) and the FID
of the synthetic set to the private validation split, with standard errors: the bootstrap SE
over test clients of each seed combined as sqrt(sum se^2) / n_seeds (within-seed sampling
error), and the spread over seeds (sd / sqrt(n_seeds)) shown beside it; and the total epsilon
from each run's ledger; and the minutes a run of the method took on this machine (its stages'
recorded times, data stages included, baselines excluded).  Runs are cached stage by stage:
rerunning the script resumes.
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
           "popri-nn": "popri-nn-histogram.yaml", "dp-fedavg": "dpfl.yaml",
           "dp-ftrl": "dpfl.yaml"}
LABELS = {"popri": "POPri", "pe": "PE (PrE-Text)", "pe-sft": "PE+SFT",
          "popri-nn": "POPri, nn-histogram votes", "dp-fedavg": "DP-FedAvg",
          "dp-ftrl": "DP-FTRL"}
RUN_METHOD = {"popri": "popri", "pe": "pe", "pe-sft": "pe-sft", "popri-nn": "popri",
              "dp-fedavg": "dp-fedavg", "dp-ftrl": "dp-ftrl"}
#: extra overrides of a method that shares another's config file
EXTRA = {"dp-ftrl": ["--set=method=dp-ftrl"]}
#: stages that are the baselines' (eps = 0 / eps = inf), the gap and the total: not a method's time
BASELINE_STAGES = ("eval-eps0", "downstream-epsinf", "eval-epsinf", "gap-closed", "account")


def method_seconds(run: Path) -> float:
    """What a method's run took on this machine: the seconds every stage marker recorded when
    the stage ran (cached reruns keep the first time), data stages included, the baselines'
    stages not."""
    total = 0.0
    for f in (run / ".stages").glob("*.json"):
        if f.stem in BASELINE_STAGES or f.stem.endswith(".guard"):
            continue
        try:
            total += float(json.loads(f.read_text()).get("seconds") or 0.0)
        except (OSError, ValueError):
            pass
    return total


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
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=["popri", "pe", "pe-sft", "dp-fedavg", "dp-ftrl"],
                    choices=sorted(CONFIGS))
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="Config override for every run (popri run --set).")
    a = ap.parse_args()
    # the first method's runs carry the baselines (POPri's when it is in the list): every run of
    # a seed has the same private data and test records, so they are paired for all methods
    methods = (["popri"] if "popri" in a.methods else []) + \
        [m for m in dict.fromkeys(a.methods) if m != "popri"]
    carrier = methods[0]
    runs = Path(a.runs)
    res: dict = {m: [] for m in methods}
    base: dict = {"eps0": [], "epsinf": []}
    for seed in a.seeds:
        for m in methods:
            d = runs / f"{m}-s{seed}"
            over = (EXTRA.get(m, []) + [f"--set={s}" for s in a.sets]
                    + [f"--set=seed={seed}", f"--set=run_dir={d}"])
            if m != carrier:
                over.append("--set=baselines=false")
            popri("run", str(HERE / CONFIGS[m]), *over)
            r = json.loads((d / "results.json").read_text())
            name = RUN_METHOD[m]
            ref = runs / f"{carrier}-s{seed}" / "eval"
            gap = json.loads(popri("eval", "gap", "--method", str(d / "eval" / f"{name}.clients.jsonl"),
                                   "--eps0", str(ref / "eps0.clients.jsonl"), "--epsinf",
                                   str(ref / "epsinf.clients.jsonl"), "--seed", str(seed), "--json",
                                   capture=True))
            res[m].append({"seed": seed, "accuracy": r["methods"][name]["accuracy"],
                           "accuracy_se": r["methods"][name]["accuracy_se"],
                           "gap_closed": gap["gap_closed"], "gap_closed_se": gap["gap_closed_se"],
                           "fid": r.get("fid_to_val"), "epsilon": r["epsilon"], "delta": r["delta"],
                           "seconds": method_seconds(d)})
            if m == carrier:
                for b in ("eps0", "epsinf"):
                    base[b].append(r["methods"][b])
    setting = "the embedded default" + (f" with {' '.join(a.sets)}" if a.sets else "")
    lines = [f"Methods on {setting}, seeds {' '.join(map(str, a.seeds))} "
             f"({len(a.seeds)} seeds; SE within = bootstrap over test clients, between = over seeds)",
             "", "| method | epsilon (ledger) | accuracy | SE within / between | gap closed | "
             "SE within / between | FID to val | minutes per run |",
             "|---|---|---|---|---|---|---|---|"]
    table = {}
    for m in methods:
        rows = res[m]
        acc = mean_se([x["accuracy"] for x in rows], [x["accuracy_se"] for x in rows])
        gap = mean_se([x["gap_closed"] for x in rows], [x["gap_closed_se"] for x in rows])
        fids = [x["fid"] for x in rows if x["fid"] is not None]
        fid = sum(fids) / len(fids) if fids else None
        eps = max(x["epsilon"] for x in rows)
        minutes = sum(x["seconds"] for x in rows) / len(rows) / 60
        table[m] = {"accuracy": acc, "gap_closed": gap, "fid": fid, "epsilon": eps,
                    "minutes": minutes, "runs": rows}
        lines.append(f"| {LABELS[m]} | {fmt(eps, 3)} | {fmt(acc[0])} | {fmt(acc[1])} / {fmt(acc[2])} | "
                     f"{fmt(gap[0], 3)} | {fmt(gap[1], 3)} / {fmt(gap[2], 3)} | {fmt(fid, 3)} | "
                     f"{minutes:.1f} |")
    for b, label, eps in (("eps0", "eps=0 (public model)", "0"), ("epsinf", "eps=inf (private data)", "inf")):
        acc = mean_se([x["accuracy"] for x in base[b]], [x["accuracy_se"] for x in base[b]])
        table[b] = {"accuracy": acc}
        lines.append(f"| {label} | {eps} | {fmt(acc[0])} | {fmt(acc[1])} / {fmt(acc[2])} | "
                     f"{'0' if b == 'eps0' else '1'} | - | - | - |")
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
