"""Issue 69's table: `popri audit canaries` on POPri, PE and DP-FedAvg at eps = 1 and eps = inf,
and the test that the audit has teeth (``--break no-noise``: the eps = inf run held to eps = 1).

    python benchmarks/canary_audit.py --plan            # the rows and their commands
    python benchmarks/canary_audit.py                   # every row (resumable: runs are cached)
    python benchmarks/canary_audit.py --only dp-fedavg  # one method's rows

Writes benchmarks/results/canary_audit.json: one row per audit (``method``, ``eps_claimed``,
``eps_lower``, ``m``, ``k``, ``correct``, ``break``, and the score, the ledger's epsilon and
relation; an infinite epsilon is null), with the commit and the machine.

**Design.** One offline corpus (sotu: private addresses from 1990, public ones before 1900, so
the canaries' words are the public vocabulary's), m random canaries (200 for POPri and PE, 1,000
for DP-FedAvg: ``M`` below), each its own client with 4 copies of its secret, included w.p. 1/2
by the audit's seeded draw (seed 0 in every row: the same canaries and the same draw across a
method's rows).  Per method two runs: eps = 1 (the ledger's claim, the honest build) and eps =
inf (``--break no-noise`` with ``privacy.epsilon: null``: z = 1e-6, claimed inf).  The break row
re-audits the eps = inf run (the same directory: every stage cached) against the eps = 1 claim:
refuted when the attack finds what no noise lets through.

- POPri: examples/default.yaml (SmolLM2-135M generator, MiniLM embedder: the main job);
- PE: examples/pe.yaml (the same models);
- DP-FedAvg: benchmarks/configs/canary-dpfl.yaml (a tiny random Llama trained in full, settings
  under which a client's update carries its text).

What a row can show: a bound above its claim refutes the claim; a bound at 0 says only that this
attack found nothing (docs/privacy.md, "Auditing a run with canaries").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from popri.core import io

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "canary_audit.json"
#: canaries per method: 200 where the run is the main job (POPri, PE: ~15 min a run on 2 cores);
#: 1,000 for DP-FedAvg's tiny model, where the attack is sharp enough that m limits the bound
M = {"popri": 200, "pe": 200, "dp-fedavg": 1000}
COPIES, SEED = 4, 0
#: per method, settings the audit passes on: DP-FedAvg's declared N_pub follows its m (~12 sotu
#: clients + the ~m/2 included canaries; the config's 120 is for m = 200)
SETS = {"dp-fedavg": ["--set", f"fl.public_clients={12 + M['dp-fedavg'] // 2}"]}
CONFIGS = {"popri": "examples/default.yaml", "pe": "examples/pe.yaml",
           "dp-fedavg": "benchmarks/configs/canary-dpfl.yaml"}
INF = ["--break", "no-noise", "--set", "privacy.epsilon=null"]


def rows(runs: Path, only: list[str] | None) -> list[dict]:
    """The audits, in order: per method eps = 1, eps = inf, and the break (eps = inf's run
    directory, held to the config's eps = 1)."""
    out = []
    for method, cfg in CONFIGS.items():
        if only and method not in only:
            continue
        for name, extra, brk in (("eps1", [], None), ("inf", INF, None),
                                 ("inf", ["--break", "no-noise"], "no-noise")):
            out.append({"method": method, "config": cfg, "dir": runs / f"{method}-{name}",
                        "extra": extra, "break": brk, "claim": "inf" if extra == INF else "1"})
    return out


def argv(r: dict) -> list[str]:
    return ["audit", "canaries", r["config"], "--run-dir", str(r["dir"]), "--canaries", str(M[r["method"]]),
            "--copies", str(COPIES), "--seed", str(SEED), "--json", *SETS.get(r["method"], []),
            *r["extra"]]


def run(r: dict) -> dict:
    p = subprocess.run([sys.executable, "-m", "popri.cli.app", *argv(r)], cwd=ROOT,
                       stdout=subprocess.PIPE, text=True)
    if p.returncode not in (0, 1):  # 1: the claim refuted (a result, not a failure)
        raise SystemExit(f"canary_audit: {r['method']} ({r['claim']}) failed: exit {p.returncode}")
    a = json.loads(p.stdout)
    keep = ("method", "eps_claimed", "eps_lower", "m", "k", "correct", "break", "r", "score",
            "eps_ledger", "neighbouring", "delta", "included", "copies", "style", "refuted")
    row = {k: a[k] for k in keep}
    row |= {"config": r["config"],
            "per_score": {k: {"eps_lower": v["eps_lower"], "k": v["k_plus"],
                              "correct": v["correct"]} for k, v in a["scores"].items()}}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", action="store_true", help="print the audits' commands only")
    ap.add_argument("--only", action="append", choices=list(CONFIGS), help="one method's rows")
    ap.add_argument("--runs", default=str(ROOT / "runs" / "canary-audit"))
    a = ap.parse_args()
    todo = rows(Path(a.runs), a.only)
    if a.plan:
        for r in todo:
            print("popri " + " ".join(argv(r)))
        return
    have = json.loads(OUT.read_text())["rows"] if OUT.exists() else []
    done = []
    for r in todo:
        print(f"canary_audit: {r['method']} claim {r['claim']} break {r['break']}",
              file=sys.stderr, flush=True)
        done.append(run(r))
        claim = "inf" if done[-1]["eps_claimed"] is None else done[-1]["eps_claimed"]
        print(f"canary_audit: -> eps_lower {done[-1]['eps_lower']:.3g} "
              f"({done[-1]['correct']}/{done[-1]['r']}), claimed {claim}",
              file=sys.stderr, flush=True)
    mine = {(d["method"], d["break"], d["eps_claimed"]) for d in done}
    keep = [h for h in have if (h["method"], h["break"], h["eps_claimed"]) not in mine]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True).stdout.strip()
    res = {"issue": 69, "commit": commit, "machine": f"{platform.machine()}, {os.cpu_count()} "
           f"cores", "date": time.strftime("%Y-%m-%d"), "m": M, "copies": COPIES, "seed": SEED,
           "rows": keep + done}
    io.write_json(res, OUT)  # atomic
    print(f"canary_audit: wrote {OUT} ({len(res['rows'])} rows)", file=sys.stderr)


if __name__ == "__main__":
    main()
