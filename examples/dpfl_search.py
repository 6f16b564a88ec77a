"""DP-FedAvg / DP-FTRL learning-rate and clip search, as POPri appendix C.1 ("We tune the
learning rate within the range [0.01, 0.06] and the clipping threshold between [0.01, 0.4],
selecting the model with the best performance on the evaluation set").

    python examples/dpfl_search.py                                   # DP-FedAvg, 3 x 3 grid
    python examples/dpfl_search.py --method dp-ftrl --lr 0.01 0.05 --clip 0.05 0.2 --set rounds=4

Each (client lr, clip) pair is one `popri run examples/dpfl.yaml` at the full budget, in
RUNS/lr{LR}-clip{C}; its final model is evaluated on the private VALIDATION split (`popri eval
accuracy --split val`), the pair with the best validation accuracy is selected, and its TEST
accuracy (the run's own evaluation) is reported next to every candidate's.

What the selection costs (said in the output too): the k candidate runs each spend the whole
budget on the train split, so `popri account ledger RUNS` totals k runs; and the selection reads
the validation split without noise.  POPri C.1 treats the search as tuning outside the budget;
popri does the same and says so -- a model chosen this way is eps-DP per candidate, not for
the search as a whole.  Use a held-out public or proxy dataset for the search when that
matters.  Runs are cached stage by stage: rerunning resumes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path

from compare import popri  # noqa: E402  (examples/compare.py: runs one popri command)

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/dpfl-search", help="Directory of the candidate runs.")
    ap.add_argument("--config", default=str(HERE / "dpfl.yaml"))
    ap.add_argument("--method", default="dp-fedavg", choices=["dp-fedavg", "dp-ftrl"])
    ap.add_argument("--lr", type=float, nargs="+", default=[0.01, 0.03, 0.06],
                    help="Client learning rates (POPri C.1: [0.01, 0.06]).")
    ap.add_argument("--clip", type=float, nargs="+", default=[0.01, 0.1, 0.4],
                    help="Clip norms C (POPri C.1: [0.01, 0.4]).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="Config override for every run (popri run --set).")
    a = ap.parse_args()
    runs = Path(a.runs)
    rows = []
    for lr, clip in itertools.product(a.lr, a.clip):
        d = runs / f"{a.method}-lr{lr:g}-clip{clip:g}-s{a.seed}"
        popri("run", a.config, f"--set=method={a.method}", f"--set=fl.client_lr={lr!r}",
              f"--set=fl.clip={clip!r}", f"--set=seed={a.seed}", "--set=baselines=false",
              *[f"--set={s}" for s in a.sets], f"--set=run_dir={d}")
        res = json.loads((d / "results.json").read_text())
        model = d / "fl" / f"round{res['rounds']}" / "model"
        val_file = d / "eval" / "val.json"
        if not val_file.exists():
            cfg = json.loads((d / "config.resolved.json").read_text())
            data = cfg["data"]["dir"] or str(d / "data" / "private")
            out = popri("eval", "accuracy", "--model", str(model), "--data", data,
                        "--split", "val", "--bootstrap", "0",
                        "--seed", str(a.seed), "--json", capture=True)
            tmp = val_file.with_suffix(".tmp")
            tmp.write_text(out)
            os.replace(tmp, val_file)
        val = json.loads(val_file.read_text())
        rows.append({"client_lr": lr, "clip": clip, "run": str(d),
                     "val_accuracy": val["accuracy"],
                     "test_accuracy": res["methods"][a.method]["accuracy"],
                     "test_se": res["methods"][a.method]["accuracy_se"],
                     "epsilon": res["epsilon"], "noise_multiplier": res["noise_multiplier"]})
    best = max(rows, key=lambda r: (r["val_accuracy"], -r["clip"], -r["client_lr"]))
    lines = [f"{a.method} search over client lr x clip ({len(rows)} runs, seed {a.seed}); "
             "selection by validation accuracy", "",
             "| client lr | clip | val accuracy | test accuracy | SE | epsilon (each run) | z |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = " **selected**" if r is best else ""
        lines.append(f"| {r['client_lr']:g} | {r['clip']:g} | {r['val_accuracy']:.4f}{mark} | "
                     f"{r['test_accuracy']:.4f} | {r['test_se']:.4f} | {r['epsilon']:.3f} | "
                     f"{r['noise_multiplier']:.3f} |")
    lines += ["", f"selected: fl.client_lr={best['client_lr']:g} fl.clip={best['clip']:g} "
                  f"(test accuracy {best['test_accuracy']:.4f})",
              f"privacy: each run spends epsilon={best['epsilon']:.3f} on the train split; the "
              f"{len(rows)} runs together are {len(rows)} such releases, and the selection read "
              "the validation split without noise (as POPri C.1): tuning outside the budget"]
    out = "\n".join(lines)
    runs.mkdir(parents=True, exist_ok=True)
    tmp = runs / "search.json.tmp"
    tmp.write_text(json.dumps({"method": a.method, "rows": rows, "selected": best}, indent=2))
    os.replace(tmp, runs / f"search-{a.method}.json")
    print(out)


if __name__ == "__main__":
    main()
