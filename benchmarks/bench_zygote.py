"""How much the stage zygote saves: the same `popri run` with each stage a new interpreter
(POPRI_ZYGOTE=0, the baseline) and forked from the zygote, alternately, in one process.

    POPRI_THREADS=2 python benchmarks/bench_zygote.py                 # the main job, reduced
    python benchmarks/bench_zygote.py --repeats 3 --set rounds=2       # more, and any override
    python benchmarks/bench_zygote.py --config examples/learning.yaml --set probe.enabled=false

Each repetition runs the configuration (default: examples/default.yaml at 1 round, K = 3 prompts,
N = 12 synthetic samples, 4 texts per client, one downstream epoch on 48 evaluation samples: the
real SmolLM2-135M and MiniLM, so the stages do real work) into a fresh run directory, first
without, then with the zygote.  Reported: each mode's wall time per repetition, the ratio
(zygote / baseline; below 1 is faster), and the per-stage seconds of the last repetition (the
stage markers).  Results: stdout and benchmarks/results/zygote.json/.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
REDUCED = ["rounds=1", "prompts=3", "num_synthetic=12", "data.max_samples_per_client=4",
           "downstream.eval_max_samples=48", "downstream.epochs=1", "dpo.select_checkpoint=false"]


def run_once(config: str, overrides: list[str], run_dir: Path, zygote: bool) -> tuple[float, dict]:
    env = dict(os.environ, POPRI_ZYGOTE="1" if zygote else "0")
    cmd = [sys.executable, "-m", "popri.cli.app", "run", config, f"--run-dir={run_dir}",
           *[f"--set={o}" for o in overrides]]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"bench_zygote: popri run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    stages = {}
    for m in sorted((run_dir / ".stages").glob("*.json")):
        if not m.name.endswith(".attempt.json"):
            stages[m.stem] = round(float(json.loads(m.read_text()).get("seconds", 0.0)), 2)
    return dt, stages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "examples" / "default.yaml"))
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="An override (repeatable), after the reduced defaults.")
    ap.add_argument("--no-reduce", action="store_true", help="The configuration as it is.")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "zygote.json"))
    a = ap.parse_args()
    overrides = ([] if a.no_reduce else REDUCED) + a.sets
    work = Path(tempfile.mkdtemp(prefix="bench-zygote-"))
    times = {"process": [], "zygote": []}
    stages = {}
    for r in range(a.repeats):
        for mode in ("process", "zygote"):
            dt, st = run_once(a.config, overrides, work / f"{mode}-{r}", mode == "zygote")
            times[mode].append(round(dt, 1))
            stages[mode] = st
            print(f"bench_zygote: repetition {r + 1}, {mode}: {dt:.1f} s", file=sys.stderr,
                  flush=True)
    ratios = [z / p for z, p in zip(times["zygote"], times["process"])]
    res = {"config": a.config, "overrides": overrides, "threads": os.environ.get("POPRI_THREADS"),
           "cpus": os.cpu_count(), "seconds": times, "ratio_zygote_to_process": ratios,
           "mean_ratio": statistics.fmean(ratios), "stages_last_repetition": stages}
    lines = [f"`popri run {Path(a.config).name}` with {' '.join(overrides)}; "
             f"{os.cpu_count()} CPUs, POPRI_THREADS={res['threads']}.", "",
             "| repetition | new interpreters (s) | zygote (s) | zygote / new |", "|---|---|---|---|"]
    for i, (p, z) in enumerate(zip(times["process"], times["zygote"])):
        lines.append(f"| {i + 1} | {p:.1f} | {z:.1f} | {z / p:.2f} |")
    lines += ["", "| stage | new interpreter (s) | zygote (s) |", "|---|---|---|"]
    for name in stages["process"]:
        lines.append(f"| {name} | {stages['process'][name]:.1f} | "
                     f"{stages['zygote'].get(name, float('nan')):.1f} |")
    md = "\n".join(lines)
    print(md)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(res, indent=2) + "\n")
    os.replace(tmp, out)
    out.with_suffix(".md").write_text(md + "\n")


if __name__ == "__main__":
    main()
