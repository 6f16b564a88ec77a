"""POPri vs PE (PrE-Text) vs PE+SFT vs DP-FedAvg / DP-FTRL vs eps = 0 / eps = inf, one table.

    python examples/compare.py                                  # both tables, seeds 0 1 2
    python examples/compare.py --seeds 0 1 2 --runs runs/compare --set rounds=1
    python examples/compare.py --methods popri pe --set privacy.epsilon=7
    python examples/compare.py --methods popri dp-fedavg dp-ftrl --seeds 0 1 2
    python examples/compare.py --set popri,pe,pe-sft:rounds=1 --set popri,pe,pe-sft:num_synthetic=96
    python examples/compare.py --methods fewfedpit fedit --seeds 0 1 2   # the debian table only

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
recorded times, data stages included, baselines excluded; for eps = 0 / eps = inf, their own
stages in the carrier's run).  Runs are cached stage by stage: rerunning the script resumes.

Leakage (``--leakage``, on by default): every text-data method's model, eps = 0 and eps = inf
get ``popri audit extract`` on their run's private train split (discoverable memorisation: the
same training examples, one per client, for every model of a seed), a column of the table.

FewFedPIT / FedIT / FedMIT (``--methods fewfedpit fedit``) run on debian instruction data
(examples/fewfedpit.yaml, no DP guarantee) and get their own table (RUNS/compare-instruct.md):
response-token accuracy, Rouge-L to the reference, the gap closed on the token accuracy,
extraction Rouge-L, minutes per run; eps = 0 is the base model, eps = inf centralised tuning.

`--set KEY=VALUE` applies to every run; `--set M1,M2:KEY=VALUE` only to the runs of the listed
methods (DP-FedAvg / DP-FTRL read `rounds` as their T, so shrink the synthetic-data methods'
rounds with `--set popri,pe,pe-sft:rounds=1`).
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
           "dp-ftrl": "dpfl.yaml", "fewfedpit": "fewfedpit.yaml", "fedit": "fewfedpit.yaml",
           "fedmit": "fewfedpit.yaml"}
LABELS = {"popri": "POPri", "pe": "PE (PrE-Text)", "pe-sft": "PE+SFT",
          "popri-nn": "POPri, nn-histogram votes", "dp-fedavg": "DP-FedAvg",
          "dp-ftrl": "DP-FTRL", "fewfedpit": "FewFedPIT", "fedit": "FedIT (beta = 1)",
          "fedmit": "FedMIT"}
RUN_METHOD = {"popri": "popri", "pe": "pe", "pe-sft": "pe-sft", "popri-nn": "popri",
              "dp-fedavg": "dp-fedavg", "dp-ftrl": "dp-ftrl", "fewfedpit": "fewfedpit",
              "fedit": "fedit", "fedmit": "fedmit"}
#: extra overrides of a method that shares another's config file
EXTRA = {"popri": ["--set=num_synthetic=96"],  # every text method's N (the demo's is 64)
         "dp-ftrl": ["--set=method=dp-ftrl"], "fedit": ["--set=method=fedit"],
         "fedmit": ["--set=method=fedmit"]}
#: the methods on instruction data (examples/fewfedpit.yaml: debian): their own table
INSTRUCT = ("fewfedpit", "fedit", "fedmit")
#: stages that are the baselines' (eps = 0 / eps = inf), the gap and the total: not a method's time
BASELINE_STAGES = ("eval-eps0", "downstream-epsinf", "eval-epsinf", "gap-closed", "account",
                   "ffp-centralized", "extract-eps0", "extract-epsinf")
#: the stages of each baseline's own work in the carrier's run
BASELINE_OWN = {"eps0": ("eval-eps0", "extract-eps0"),
                "epsinf": ("downstream-epsinf", "eval-epsinf", "ffp-centralized",
                           "extract-epsinf")}


def stage_seconds(run: Path, stages) -> float:
    """Recorded seconds of the named stages of a run (0 for a stage that has no marker)."""
    total = 0.0
    for name in stages:
        try:
            total += float(json.loads((run / ".stages" / f"{name}.json").read_text()).get("seconds") or 0.0)
        except (OSError, ValueError):
            pass
    return total


def scoped_sets(sets: list[str], method: str) -> list[str]:
    """The `--set` overrides that apply to `method`: unscoped ones, and `M1,M2:KEY=VALUE` ones
    whose list names it (an unknown method name in a scope is an error)."""
    out = []
    for s in sets:
        key = s.split("=", 1)[0]
        if ":" in key:
            scope, rest = s.split(":", 1)
            names = [n.strip() for n in scope.split(",") if n.strip()]
            bad = [n for n in names if n not in CONFIGS]
            if bad:
                sys.exit(f"compare: --set {s}: unknown method {bad[0]!r} (one of {', '.join(sorted(CONFIGS))})")
            if method in names:
                out.append(rest)
        else:
            out.append(s)
    return out


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


def model_of(run: Path, name: str) -> str | None:
    """The downstream model a text-data run evaluated: train-downstream's directory, or the
    last DP-FL round's model/."""
    d = run / "downstream" / name
    if d.is_dir():
        return str(d)
    rounds = sorted((run / "fl").glob("round*/model"), key=lambda p: int(p.parent.name[5:]))
    return str(rounds[-1]) if rounds else None


def leakage(model: str, data: Path, seed: int, out: Path, n: int) -> dict:
    """popri audit extract of ``model`` on the run's private train split (cached in ``out``)."""
    if not out.is_file():
        txt = popri("audit", "extract", "--model", model, "--data", str(data), "--split",
                    "train", "-n", str(n), "--seed", str(seed), "--json", capture=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(txt)
        os.replace(tmp, out)
    return json.loads(out.read_text())


def leak_cell(leak: tuple | None) -> str:
    """The text table's extraction column: mean (SE within / between seeds), or -."""
    return f" {fmt(leak[0])} ({fmt(leak[1])} / {fmt(leak[2])}) |" if leak else " - |"


def write_out(runs: Path, stem: str, table: dict, text: str) -> None:
    runs.mkdir(parents=True, exist_ok=True)
    for suffix, body in ((".json", json.dumps(table, indent=2) + "\n"), (".md", text + "\n")):
        tmp = runs / f"{stem}{suffix}.tmp"
        tmp.write_text(body)
        os.replace(tmp, runs / f"{stem}{suffix}")


def paired_gap(run: Path, name: str, ref: Path, seed: int, *extra: str) -> dict:
    """``popri eval gap`` of a run's per-client table against the seed's baselines in ``ref``."""
    return json.loads(popri("eval", "gap", "--method", str(run / "eval" / f"{name}.clients.jsonl"),
                            "--eps0", str(ref / "eps0.clients.jsonl"), "--epsinf",
                            str(ref / "epsinf.clients.jsonl"), *extra, "--seed", str(seed),
                            "--json", capture=True))


def run_method(a, runs: Path, m: str, seed: int, carrier: str) -> Path:
    d = runs / f"{m}-s{seed}"
    over = (EXTRA.get(m, []) + [f"--set={s}" for s in scoped_sets(a.sets, m)]
            + [f"--set=seed={seed}", f"--set=run_dir={d}"])
    if m != carrier:
        over.append("--set=baselines=false")
    popri("run", str(HERE / CONFIGS[m]), *over)
    return d


def text_table(a, methods: list[str], runs: Path) -> str:
    # the first method's runs carry the baselines (POPri's when it is in the list): every run of
    # a seed has the same private data and test records, so they are paired for all methods
    carrier = methods[0]
    res: dict = {m: [] for m in methods}
    base: dict = {"eps0": [], "epsinf": []}
    base_seconds: dict = {"eps0": [], "epsinf": []}
    base_leak: dict = {"eps0": [], "epsinf": []}
    for seed in a.seeds:
        for m in methods:
            d = run_method(a, runs, m, seed, carrier)
            r = json.loads((d / "results.json").read_text())
            name = RUN_METHOD[m]
            gap = paired_gap(d, name, runs / f"{carrier}-s{seed}" / "eval", seed)
            row = {"seed": seed, "accuracy": r["methods"][name]["accuracy"],
                   "accuracy_se": r["methods"][name]["accuracy_se"],
                   "gap_closed": gap["gap_closed"], "gap_closed_se": gap["gap_closed_se"],
                   "fid": r.get("fid_to_val"), "epsilon": r["epsilon"], "delta": r["delta"],
                   "seconds": method_seconds(d)}
            if a.leakage and model_of(d, name):
                x = leakage(model_of(d, name), d / "data" / "private", seed,
                            d / "eval" / f"{name}.extract.json", a.extract_examples)
                row["leakage"], row["leakage_se"] = x["rouge_l"], x["rouge_l_se"]
            res[m].append(row)
            if m == carrier:
                for b in ("eps0", "epsinf"):
                    base[b].append(r["methods"][b])
                    base_seconds[b].append(stage_seconds(d, BASELINE_OWN[b]))
                    if a.leakage:
                        mdl = (json.loads((d / "config.resolved.json").read_text())["downstream"]
                               ["model"] if b == "eps0" else model_of(d, "epsinf"))
                        x = leakage(mdl, d / "data" / "private", seed,
                                    d / "eval" / f"{b}.extract.json", a.extract_examples)
                        base_leak[b].append((x["rouge_l"], x["rouge_l_se"]))
    setting = "the embedded default" + (f" with {' '.join(a.sets)}" if a.sets else "")
    leak_h = " extraction Rouge-L (SE within / between) |" if a.leakage else ""
    lines = [f"Methods on {setting}, seeds {' '.join(map(str, a.seeds))} "
             f"({len(a.seeds)} seeds; SE within = bootstrap over test clients, between = over seeds)",
             "", "| method | epsilon (ledger) | accuracy | SE within / between | gap closed | "
             f"SE within / between | FID to val |{leak_h} minutes per run (per seed) |",
             "|---|---|---|---|---|---|---|" + ("---|" if a.leakage else "") + "---|"]
    table = {}
    for m in methods:
        rows = res[m]
        acc = mean_se([x["accuracy"] for x in rows], [x["accuracy_se"] for x in rows])
        gap = mean_se([x["gap_closed"] for x in rows], [x["gap_closed_se"] for x in rows])
        fids = [x["fid"] for x in rows if x["fid"] is not None]
        fid = sum(fids) / len(fids) if fids else None
        eps = max(x["epsilon"] for x in rows)
        mins = [x["seconds"] / 60 for x in rows]
        minutes = sum(mins) / len(mins)
        leak = (mean_se([x["leakage"] for x in rows], [x["leakage_se"] for x in rows])
                if a.leakage and all("leakage" in x for x in rows) else None)
        table[m] = {"accuracy": acc, "gap_closed": gap, "fid": fid, "epsilon": eps,
                    "minutes": minutes, "minutes_per_seed": mins, "leakage": leak, "runs": rows}
        leak_c = leak_cell(leak) if a.leakage else ""
        lines.append(f"| {LABELS[m]} | {fmt(eps, 3)} | {fmt(acc[0])} | {fmt(acc[1])} / {fmt(acc[2])} | "
                     f"{fmt(gap[0], 3)} | {fmt(gap[1], 3)} / {fmt(gap[2], 3)} | {fmt(fid, 3)} |"
                     f"{leak_c} {minutes:.1f} ({', '.join(f'{x:.1f}' for x in mins)}) |")
    for b, label, eps in (("eps0", "eps=0 (public model)", "0"), ("epsinf", "eps=inf (private data)", "inf")):
        acc = mean_se([x["accuracy"] for x in base[b]], [x["accuracy_se"] for x in base[b]])
        mins = [x / 60 for x in base_seconds[b]]
        minutes = sum(mins) / len(mins)
        leak = mean_se([x[0] for x in base_leak[b]], [x[1] for x in base_leak[b]]) \
            if base_leak[b] else None
        table[b] = {"accuracy": acc, "minutes": minutes, "minutes_per_seed": mins, "leakage": leak}
        leak_c = leak_cell(leak) if a.leakage else ""
        lines.append(f"| {label} | {eps} | {fmt(acc[0])} | {fmt(acc[1])} / {fmt(acc[2])} | "
                     f"{'0' if b == 'eps0' else '1'} | - | - |{leak_c} {minutes:.1f} "
                     f"({', '.join(f'{x:.1f}' for x in mins)}) |")
    out = "\n".join(lines)
    write_out(runs, "compare", table, out)
    return out


def instruct_table(a, methods: list[str], runs: Path) -> str:
    """FewFedPIT / FedIT / FedMIT on instruction data (examples/fewfedpit.yaml), the first
    method's runs carrying eps = 0 (base model) and eps = inf (centralised tuning)."""
    carrier = methods[0]
    res: dict = {m: [] for m in methods}
    base: dict = {"eps0": [], "epsinf": []}
    for seed in a.seeds:
        for m in methods:
            d = run_method(a, runs, m, seed, carrier)
            r = json.loads((d / "results.json").read_text())
            name = RUN_METHOD[m]
            gap = paired_gap(d, name, runs / f"{carrier}-s{seed}" / "eval", seed,
                             "--allow-undefined")
            mi, lk = r["methods_instruct"][name], r["leakage"][name]
            res[m].append({"seed": seed, **{k: mi[k] for k in ("accuracy", "accuracy_se", "rouge_l",
                                                              "rouge_l_se")},
                           "leakage": lk["rouge_l"], "leakage_se": lk["rouge_l_se"],
                           "gap_closed": gap["gap_closed"], "gap_closed_se": gap["gap_closed_se"],
                           "seconds": method_seconds(d)})
            if m == carrier:
                for b in ("eps0", "epsinf"):
                    mb, lb = r["methods_instruct"][b], r["leakage"][b]
                    base[b].append({**{k: mb[k] for k in ("accuracy", "accuracy_se", "rouge_l",
                                                           "rouge_l_se")},
                                    "leakage": lb["rouge_l"], "leakage_se": lb["rouge_l_se"],
                                    "seconds": stage_seconds(d, BASELINE_OWN[b])})
    lines = [f"Instruction tuning on debian (examples/fewfedpit.yaml), seeds "
             f"{' '.join(map(str, a.seeds))}; no method here has a DP guarantee (eps = inf); "
             "utility without a GPT-4 judge: response-token accuracy and Rouge-L to the reference",
             "", "| method | response-token accuracy | SE within / between | Rouge-L | SE within / "
             "between | gap closed (token acc.) | extraction Rouge-L | SE within / between | "
             "minutes per run |", "|---|---|---|---|---|---|---|---|---|"]
    table = {}

    def row(label, rows, gap=True):
        acc = mean_se([x["accuracy"] for x in rows], [x["accuracy_se"] for x in rows])
        rl = mean_se([x["rouge_l"] for x in rows], [x["rouge_l_se"] for x in rows])
        lk = mean_se([x["leakage"] for x in rows], [x["leakage_se"] for x in rows])
        ok = [x for x in rows if x.get("gap_closed") is not None]
        g = mean_se([x["gap_closed"] for x in ok], [x["gap_closed_se"] for x in ok]) \
            if gap and ok else None
        minutes = sum(x["seconds"] for x in rows) / len(rows) / 60
        lines.append(f"| {label} | {fmt(acc[0])} | {fmt(acc[1])} / {fmt(acc[2])} | {fmt(rl[0])} | "
                     f"{fmt(rl[1])} / {fmt(rl[2])} | {fmt(g[0], 3) if g else '-'} | "
                     f"{fmt(lk[0])} | {fmt(lk[1])} / {fmt(lk[2])} | {minutes:.1f} |")
        return {"accuracy": acc, "rouge_l": rl, "leakage": lk, "gap_closed": g,
                "minutes": minutes, "runs": rows}

    for m in methods:
        table[m] = row(LABELS[m], res[m])
    table["eps0"] = row("eps=0 (base model)", base["eps0"], gap=False)
    table["epsinf"] = row("eps=inf (centralised)", base["epsinf"], gap=False)
    out = "\n".join(lines)
    write_out(runs, "compare-instruct", table, out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/compare", help="Directory of the runs.")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=["popri", "pe", "pe-sft", "dp-fedavg", "dp-ftrl",
                                                     "fewfedpit", "fedit"],
                    choices=sorted(CONFIGS))
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="Config override (popri run --set) for every run, or METHODS:KEY=VALUE "
                         "for the runs of a comma-separated list of methods.")
    ap.add_argument("--leakage", action=argparse.BooleanOptionalAction, default=True,
                    help="Text-data methods: the extraction audit's column (popri audit extract "
                         "of every method's model, eps = 0 and eps = inf; cached).")
    ap.add_argument("--extract-examples", type=int, default=100,
                    help="Training examples (one per client; FewFedPIT's table: round-robin "
                         "over its 12 clients) the extraction audit attacks.")
    a = ap.parse_args()
    for m in CONFIGS:  # validate the scopes before any run starts
        scoped_sets(a.sets, m)
    runs = Path(a.runs)
    chosen = list(dict.fromkeys(a.methods))
    text = (["popri"] if "popri" in chosen else []) + \
        [m for m in chosen if m != "popri" and m not in INSTRUCT]
    instruct = [m for m in chosen if m in INSTRUCT]
    outs = []
    if text:
        outs.append(text_table(a, text, runs))
    if instruct:
        outs.append(instruct_table(a, instruct, runs))
    print("\n\n".join(outs))


if __name__ == "__main__":
    main()
