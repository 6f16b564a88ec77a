"""The instrument of issue 65: where the variance of `method - T=0` comes from, and the design of
every later comparison (its minimum detectable effect), as `popri run`s.

    python benchmarks/power_study.py --plan                        # the runs and the design rule
    python benchmarks/power_study.py --run sotu generation         # one corpus x source (resumable)
    python benchmarks/power_study.py --run-all                     # every run, in ORDER (resumable)
    python benchmarks/power_study.py --table                       # power.json / power.md
    python benchmarks/power_study.py --cost runs/cost --name cost  # a run's stage costs by kind

**Decomposition.** For each corpus (one in domain: private sotu from 1900, public sotu before;
one out of domain: private shakespeare roles, public sotu), POPri at eps = 1 under add/remove
one client (Poisson sampling; examples/learning.yaml) is tuned ONCE, then its final set and its
T = 0 control are drawn ``REPS + 1`` times at N with ``draw_sources`` naming ONE source, the
others held at draw 0's (popri/methods/steps.py draw_stages):

- ``generation``: both final sets' sampling seeds (and so the downstream model's data);
- ``training``: the downstream initialisation and batch order, on draw 0's two sets;
- ``test``: which ``downstream.eval_max_samples`` test records both arms are evaluated on;
- ``all``: the three together (what a draw of a comparison redraws): a check that the
  sources' variances add up.

The SD of the paired difference over a source's draws is that source's SD (``reps`` = draws).
The four runs of a corpus share its rounds (``--reuse-from`` the first: the same tuned
generator); each corpus has its own run seed (``SEEDS``), so no two corpora share a draw.

**Design.** The primary endpoint is the mean over corpora of each seed's mean over draws; its
test is a one-sample t-test on the seeds' endpoint values (draws nested within seeds, seeds
independent; two-sided 5 %).  With sd_seed the SD between seeds of a seed's true difference
(the tuning's randomness: DP noise, rounds) and sd_draw the SD of one draw's difference about
its seed's, a seed's endpoint has variance (sd_seed^2 + sd_draw^2 / D) / C over C corpora, and
the MDE at 80 % power is the effect whose noncentral t has that power (:func:`mde`, exact, by
scipy's ``nct``).  Per corpus the same with C = 1.  **The verdict**, fixed before any run:
*beats* / *loses* when the seeds' 95 % t interval excludes 0 (above / below); otherwise
*equivalent* when their 90 % t interval lies within +-0.005; otherwise *inconclusive*
(:func:`verdict`).
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
sys.path.insert(0, str(HERE))

from learning_study import CONFIG, OOD  # noqa: E402  (the study's corpora and config)

from popri.core.io import atomic_write  # noqa: E402

RESULTS = HERE / "results"
RUNS = Path(os.environ.get("POPRI_POWER_RUNS", "runs/power"))

#: the decomposition's corpora: overrides of examples/learning.yaml
CORPORA = {"sotu": [], "ood": OOD}
#: each corpus's own run seed: independent draws, generation seeds and DP noise per corpus
SEEDS = {"sotu": 6501, "ood": 6502}
SOURCES = {"generation": "generation", "training": "training", "test": "test",
           "all": "generation,training,test"}
#: draws beyond draw 0 of each source: reps = REPS + 1 = 6 values of the difference (the issue's
#: ">= 6 repetitions"; 5 degrees of freedom per SD)
REPS = 5
#: the final set's size the decomposition runs at (the comparisons' primary size)
N = 1536
#: the cost levers, chosen before any run of the decomposition (docs/results.md "Cost today";
#: each measured as a ratio in one process): generation at batch 96 (x1.37 over 24), bf16 on
#: this CPU's avx512_bf16 in every stage that computes it (generation x1.76, downstream
#: training x1.65, evaluation x1.98; results.json `precision` says bf16), one downstream epoch
#: at N = 1536 (96 steps of 16) instead of two.  Every comparison that reads power.json runs
#: with the same levers, so that its variances are the ones measured here.
LEVERS = ["generator.batch_size=96", "downstream.epochs=1"]
ENV = {"POPRI_CPU_BF16": "1", "POPRI_THREADS": "2"}
#: the order of --run-all: both corpora's three sources first (the design can be read from
#: their sum), then each corpus's `all` (the check that the sources add up)
ORDER = [(c, s) for c in ("sotu", "ood") for s in ("generation", "training", "test")] + \
    [(c, "all") for c in ("sotu", "ood")]
#: the design's goal (80 % power, two-sided 5 %) for the primary endpoint
GOAL = 0.004
#: the equivalence margin of the verdict
MARGIN = 0.005


# --------------------------------------------------------------------------- the maths
def power(effect: float, se: float, df: int, alpha: float = 0.05) -> float:
    """Power of the two-sided one-sample t-test at level ``alpha`` with ``df`` degrees of
    freedom when the true mean is ``effect`` and the mean's SE is ``se`` (noncentral t)."""
    from scipy import stats

    t = stats.t.ppf(1 - alpha / 2, df)
    nc = effect / se
    lower = stats.nct.cdf(-t, df, nc)  # the wrong tail: NaN where it underflows far out
    return float(stats.nct.sf(t, df, nc) + (0.0 if math.isnan(lower) else lower))


def endpoint_se(sd_seed: float, sd_draw: float, seeds: int, draws: int, corpora: int = 1
                ) -> float:
    """SE of the mean over ``seeds`` of each seed's endpoint (mean over ``corpora`` of its mean
    over ``draws``), corpora independent: sqrt((sd_seed^2 + sd_draw^2 / D) / C / S)."""
    return math.sqrt((sd_seed ** 2 + sd_draw ** 2 / draws) / corpora / seeds)


def mde(sd_seed: float, sd_draw: float, seeds: int, draws: int, corpora: int = 1, *,
        alpha: float = 0.05, target: float = 0.8) -> float:
    """The smallest effect the design detects with probability ``target``: the root of
    :func:`power` - target in the effect (brentq), with S - 1 degrees of freedom."""
    from scipy.optimize import brentq

    if seeds < 2:
        return math.inf
    se = endpoint_se(sd_seed, sd_draw, seeds, draws, corpora)
    if se == 0:
        return 0.0
    hi = se
    while power(hi, se, seeds - 1, alpha) < target:  # bracket the root (nct is NaN far out)
        hi *= 1.5
    return float(brentq(lambda e: power(e, se, seeds - 1, alpha) - target, 0.0, hi))


def verdict(values: list[float], *, margin: float = MARGIN) -> dict:
    """The verdict on the seeds' endpoint values (fixed before the runs): beats / loses when
    the 95 % t interval excludes 0, else equivalent when the 90 % t interval lies within
    +-margin, else inconclusive; with the mean, its SE and both intervals."""
    from scipy import stats

    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return {"verdict": "inconclusive", "mean": mean, "se": None, "n": n,
                "why": "fewer than 2 seeds"}
    se = statistics.stdev(values) / math.sqrt(n)
    t95, t90 = stats.t.ppf(0.975, n - 1), stats.t.ppf(0.95, n - 1)
    ci95, ci90 = (mean - t95 * se, mean + t95 * se), (mean - t90 * se, mean + t90 * se)
    if ci95[0] > 0:
        v = "beats"
    elif ci95[1] < 0:
        v = "loses"
    elif -margin < ci90[0] and ci90[1] < margin:
        v = "equivalent"
    else:
        v = "inconclusive"
    return {"verdict": v, "mean": mean, "se": se, "n": n, "ci95": list(ci95),
            "ci90": list(ci90), "margin": margin}


def source_sd(rows: list[dict]) -> dict:
    """One source's SD from a run's results.json ``draws``: the paired difference's SD over
    the draws (each redraws that source alone), and each arm's accuracy SD (what common
    random numbers save: the arms' SDs against their difference's)."""
    d = [float(r["acc_minus_control"]) for r in rows if r.get("acc_minus_control") is not None]
    out = {"reps": len(d), "sd": statistics.stdev(d) if len(d) >= 2 else None,
           "mean": statistics.fmean(d) if d else None}
    for arm in sorted({a for r in rows for a in r.get("arms", {})}):
        acc = [float(r["arms"][arm]["accuracy"]) for r in rows
               if r.get("arms", {}).get(arm, {}).get("accuracy") is not None]
        out[f"sd_{arm}"] = statistics.stdev(acc) if len(acc) >= 2 else None
    return out


def designs(sd_seed: float, sd_draw: float, corpora: int, cost_seed_min: float,
            cost_draw_min: float, *, seeds=range(2, 17), draws=range(1, 9)) -> list[dict]:
    """Every (seeds, draws per seed) with its MDE (all corpora and per corpus) and its CPU
    cost on this box: seeds x corpora x (one tuning + draws x one draw), in minutes."""
    out = []
    for s in seeds:
        for d in draws:
            out.append({"seeds": s, "draws": d, "corpora": corpora,
                        "mde": mde(sd_seed, sd_draw, s, d, corpora),
                        "mde_per_corpus": mde(sd_seed, sd_draw, s, d, 1),
                        "minutes": s * corpora * (cost_seed_min + d * cost_draw_min)})
    return out


def cheapest(rows: list[dict], goal: float = GOAL) -> dict | None:
    """The cheapest design whose MDE meets the goal (ties: fewer seeds)."""
    ok = [r for r in rows if r["mde"] <= goal]
    return min(ok, key=lambda r: (r["minutes"], r["seeds"])) if ok else None


# --------------------------------------------------------------------------- the runs
def run_dir(corpus: str, source: str) -> Path:
    return RUNS / f"{corpus}-{source}"


def command(corpus: str, source: str) -> list[str]:
    """The `popri run` of one corpus x source; the corpus's first source lends its rounds."""
    first = next(iter(SOURCES))
    cmd = [sys.executable, "-m", "popri.cli.app", "run", str(CONFIG),
           *[f"--set={o}" for o in CORPORA[corpus]],
           "--set=privacy.epsilon=1", f"--set=seed={SEEDS[corpus]}", "--set=probe.enabled=false",
           f"--set=num_synthetic={N}", f"--set=draws={REPS + 1}",
           f"--set=draw_sources={SOURCES[source]}", *[f"--set={o}" for o in LEVERS],
           f"--set=run_dir={run_dir(corpus, source)}"]
    if source != first:
        cmd += ["--reuse-from", str(run_dir(corpus, first))]
    return cmd


def run_one(corpus: str, source: str) -> int:
    """One corpus x source, with the levers' environment; its wall time on stderr."""
    t0 = time.time()
    env = {**os.environ, **ENV}
    rc = subprocess.run(command(corpus, source), env=env).returncode
    print(f"power_study: {corpus} {source}: rc {rc} in {(time.time() - t0) / 60:.1f} min",
          file=sys.stderr, flush=True)
    return rc


def plan() -> str:
    lines = [f"power study (issue 65): N = {N}, {REPS + 1} draws per source, corpora "
             f"{', '.join(CORPORA)} (seeds {', '.join(map(str, SEEDS.values()))}); the goal: "
             f"MDE <= {GOAL} (80 % power, two-sided 5 %) for the mean over corpora; env "
             + " ".join(f"{k}={v}" for k, v in ENV.items())]
    for c, s in ORDER:
        lines.append(" ".join(command(c, s)[2:]))
    return "\n".join(lines)


def cost(run: Path) -> dict:
    """A finished run's stage seconds grouped by kind (results.json ``stage_seconds``): the
    rounds, the final sets' generation, downstream training and evaluation at each size, the
    second opinion; minutes."""
    r = json.loads((run / "results.json").read_text())
    sec = r.get("stage_seconds") or {}
    c = r.get("num_synthetic")

    def kind(name: str) -> str:
        if name.startswith("round"):
            return "rounds (tuning, DP scores)"
        if name in ("synthetic", "synthetic-t0") or name.startswith("synthetic"):
            return f"final sets' generation (N = {c}, both arms)"
        for pre, what in (("downstream-", "training"), ("eval-", "evaluation"),
                          ("quality-", "quality (MAUVE, diversity)")):
            if name.startswith(pre):
                rest = name[len(pre):]
                n = rest.split("-n")[1].split("-")[0] if "-n" in rest else (
                    "all" if rest.endswith("-all") else str(c))
                return f"{what} at N = {n}"
        return "data, embeddings, baselines' bookkeeping, diffs"

    groups: dict[str, float] = {}
    for name, s in sec.items():
        groups[kind(name)] = groups.get(kind(name), 0.0) + float(s or 0)
    return {"run": str(run), "num_synthetic": c, "curve": (r.get("config") or {}).get("curve"),
            "minutes_total": sum(float(s or 0) for s in sec.values()) / 60,
            "minutes": {k: v / 60 for k, v in sorted(groups.items())},
            "stages": {k: sec[k] for k in sorted(sec)}}


def table() -> dict:
    """power.json from the runs that finished: per corpus x source the SD, reps and each arm's
    SD; the total (the three sources' variances added) beside the measured `all`."""
    rows = []
    for c in CORPORA:
        for s in SOURCES:
            f = run_dir(c, s) / "results.json"
            if f.exists():
                rows.append({"corpus": c, "source": s, "n": N,
                             **source_sd(json.loads(f.read_text()).get("draws") or [])})
        parts = [r for r in rows if r["corpus"] == c and r["source"] in
                 ("generation", "training", "test") and r["sd"] is not None]
        if len(parts) == 3:
            rows.append({"corpus": c, "source": "sum of the three", "n": N,
                         "sd": math.sqrt(sum(r["sd"] ** 2 for r in parts)),
                         "reps": min(r["reps"] for r in parts)})
    return {"rows": rows}


def _write(path: Path, text: str) -> None:
    with atomic_write(path) as fh:
        fh.write(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--run", nargs=2, metavar=("CORPUS", "SOURCE"))
    ap.add_argument("--run-all", action="store_true", help="every run in ORDER; stops at the "
                    "first that fails (rerun to resume: the stages' caches survive a kill)")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--cost", type=Path, metavar="RUN")
    ap.add_argument("--name", default="power")
    a = ap.parse_args(argv)
    if a.plan:
        print(plan())
    if a.run:
        c, s = a.run
        if c not in CORPORA or s not in SOURCES:
            ap.error(f"corpus one of {', '.join(CORPORA)}, source one of {', '.join(SOURCES)}")
        return run_one(c, s)
    if a.run_all:
        for c, s in ORDER:
            rc = run_one(c, s)
            if rc:
                return rc
    if a.cost:
        out = cost(a.cost)
        _write(RESULTS / f"{a.name}.json", json.dumps(out, indent=1) + "\n")
        for k, v in out["minutes"].items():
            print(f"{v:7.2f} min  {k}")
        print(f"{out['minutes_total']:7.2f} min  in all")
    if a.table:
        out = table()
        _write(RESULTS / f"{a.name}.json", json.dumps(out, indent=1) + "\n")
        for r in out["rows"]:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
