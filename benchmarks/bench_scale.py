"""One POPri round, and PE's DP nearest-neighbour histogram, at the papers' sizes: time, memory and
how each stage grows (issue 45, 5).

    POPRI_THREADS=2 python benchmarks/bench_scale.py                       # 1/100, 1/10, full
    python benchmarks/bench_scale.py --scales 0.01 0.1 --out /tmp/s.json    # a quick look

POPri's bioRxiv setting ("Private Federated Learning using Preference-Optimized Synthetic Data",
arXiv:2504.16438, Appendix B.1 and D.1, Table D.1's full-participation row): K = 1,800 prompts x J = 10 samples a round, 72,000 clients, every client every round
(q = 1), z = 19.3, 1,800 preference pairs.  At scale s every count is multiplied by s: K = 1,800 s
prompts, 72,000 s clients with 3-7 private samples each (about 5), K J samples.  The private
side is synthetic: unit vectors in d = 384 (the dimension of all-MiniLM-L6-v2, the papers'
embedder, which embeds the generated samples), drawn around 64 random centres.  The generator is
popri's tiny random Llama (``tiny-random-llama``: 2 layers, 64-d, SmolLM2's tokenizer): its cost
per token is not a real model's, its shapes (prompts, batches, 85 new tokens, LoRA r = 4) are.

Every stage is the `popri` command `popri run` would run, as a separate process, timed by the
wall clock, its peak RSS from the kernel (os.wait4):

    gen       popri gen: K x J samples (85 new tokens, batch 256, no retries)
    embed     popri embed: the samples with all-MiniLM-L6-v2
    score     popri score: every client scores every sample (mean cosine, standardise, clip 1,
              z = 19.3 on the sum, q = 1)
    prefs     popri prefs build: best vs 5th-best per prompt (K pairs)
    dpo       popri dpo: 1 epoch on the K pairs (LoRA r = 4, batch 8), holding out 25 % and
              selecting the checkpoint by the DP mean of a validation split
    final     popri gen --adapter: the final set, K x J samples from the tuned generator
    pe-hist   popri score --mode nn-histogram: PE's DP nearest-neighbour histogram of the same
              clients over the same samples (faiss; at most 8 votes a client)

The growth exponent between two scales a < b is log(t_b / t_a) / log(b / a) (1: linear); the
one reported is the larger of the two steps' (the smallest scale's times are mostly start-up,
so the 1/10 -> full step is the one that tells).  Results: stdout and
benchmarks/results/scale.json/.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

FULL = {"prompts": 1800, "J": 10, "clients": 72000, "z": 19.3}
STAGES = ("gen", "embed", "score", "prefs", "dpo", "final", "pe-hist")
EMBEDDER = "all-MiniLM-L6-v2"


def client_embeddings(path: Path, clients: int, seed: int, d: int = 384) -> Path:
    """``clients`` clients with 3-7 unit vectors each around 64 centres: an embedding set."""
    import numpy as np

    from popri.core.io import save_embedding_set

    if path.is_file():
        return path
    rng = np.random.default_rng(seed)
    counts = rng.integers(3, 8, size=clients)
    centres = rng.standard_normal((64, d)).astype(np.float32)
    rows, blocks = [], []
    for start in range(0, clients, 4096):
        c = counts[start:start + 4096]
        n = int(c.sum())
        x = centres[rng.integers(0, 64, size=n)] + 0.8 * rng.standard_normal((n, d)).astype(
            np.float32)
        blocks.append(x / np.linalg.norm(x, axis=1, keepdims=True))
        for i, k in enumerate(c):
            cid = f"c{start + i}"
            rows += [{"id": f"{cid}#{j}", "client_id": cid} for j in range(int(k))]
    emb = np.concatenate(blocks)
    save_embedding_set(path, emb, rows, meta={"model": EMBEDDER, "normalize": True,
                                             "max_length": None})
    return path


def timed(cmd: list[str], log: Path, env: dict) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one command, its stderr kept in ``log``."""
    with open(log, "wb") as fh:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"bench_scale: {' '.join(cmd[3:6])} failed ({p.returncode}); its "
                         f"stderr:\n{log.read_text()[-3000:]}")
    return dt, ru.ru_maxrss / 1024.0


def run_scale(s: float, work: Path, pub: Path, model: str, env: dict, seed: int) -> dict:
    K = max(2, round(FULL["prompts"] * s))
    J, n_clients = FULL["J"], max(10, round(FULL["clients"] * s))
    d = work / f"s{s:g}"
    d.mkdir(parents=True, exist_ok=True)
    priv = client_embeddings(d / "private.npy", n_clients, seed)
    val = client_embeddings(d / "val.npy", max(10, n_clients // 10), seed + 1)
    py = [sys.executable, "-P", "-m", "popri"]
    # the DP validation mean checkpoint selection reads (not timed: once per run, not per round)
    stats = d / "val_stats.npz"
    if not stats.is_file():
        timed([*py, "fred", "stats", "--private", str(val), "--out", str(stats), "--epsilon",
               "0.1", "--delta", "3e-06", "--level", "user", "--relation", "add-remove",
               "--calibration", "analytic", "--statistics", "mean", "--seed", "0"],
              d / "fred.log", env)
    gen = [*py, "gen", str(pub), "--split", "train", "--model", model, "--max-new-tokens", "85",
           "--max-tokens", "64", "--batch-size", "256", "--no-bf16", "--max-retries", "0",
           "--min-words", "0"]
    cmds = {
        "gen": [*gen, "--prompts", str(K), "--samples-per-prompt", str(J), "--round", "1",
                "--seed", "1", "--out", str(d / "samples.jsonl"), "--prompts-out",
                str(d / "prompts.jsonl")],
        "embed": [*py, "embed", str(d / "samples.jsonl"), "--out", str(d / "syn.npy"),
                  "--model", EMBEDDER],
        "score": [*py, "score", "--synthetic", str(d / "syn.npy"), "--private", str(priv),
                  "--out", str(d / "scores.npy"), "--mode", "cosine", "--standardize",
                  "--clip", "1.0", "--noise-multiplier", str(FULL["z"]), "--sample-rate", "1.0",
                  "--seed", "1", "--round", "1", "--delta", "3e-06"],
        "prefs": [*py, "prefs", "build", "--samples", str(d / "samples.jsonl"), "--scores",
                  str(d / "scores.npy"), "--rejected-rank", "5", "--out",
                  str(d / "prefs.jsonl")],
        "dpo": [*py, "dpo", "--pairs", str(d / "prefs.jsonl"), "--model", model, "--out",
                str(d / "dpo"), "--lora-r", "4", "--lora-alpha", "8", "--no-bf16", "--lr",
                "0.0005", "--epochs", "1", "--batch-size", "8", "--loss", "dpo", "--beta",
                "0.01", "--holdout", "0.25", "--seed", "1", "--select-on", str(stats),
                "--select-prompts", str(d / "prompts.jsonl"), "--select-samples", "16",
                "--select-by", "mean-cosine", "--embed-model", EMBEDDER, "--max-length", "256"],
        "final": [*gen, "--num-samples", str(K * J), "--samples-per-prompt", str(J), "--round",
                  "2", "--seed", "2", "--adapter", str(d / "dpo" / "adapter"), "--out",
                  str(d / "synthetic.jsonl")],
        "pe-hist": [*py, "score", "--mode", "nn-histogram", "--synthetic", str(d / "syn.npy"),
                    "--private", str(priv), "--out", str(d / "hist.npy"), "--noise-multiplier",
                    str(FULL["z"]), "--sample-rate", "1.0", "--seed", "3", "--round", "1",
                    "--delta", "3e-06"],
    }
    out = {"scale": s, "prompts": K, "J": J, "samples": K * J, "clients": n_clients,
           "private_samples": None, "stages": {}}
    import numpy as np

    out["private_samples"] = int(np.load(priv, mmap_mode="r").shape[0])
    for name in STAGES:
        sec, rss = timed(cmds[name], d / f"{name}.log", env)
        out["stages"][name] = {"seconds": round(sec, 2), "peak_rss_mib": round(rss, 1)}
        print(f"bench_scale: scale {s:g} {name}: {sec:.1f} s, peak RSS {rss:,.0f} MiB",
              file=sys.stderr, flush=True)
    return out


def exponents(rows: list[dict]) -> dict:
    rows = sorted(rows, key=lambda r: r["scale"])
    res = {}
    for name in STAGES:
        steps = []
        for a, b in zip(rows, rows[1:]):
            ta, tb = a["stages"][name]["seconds"], b["stages"][name]["seconds"]
            steps.append(round(math.log(tb / ta) / math.log(b["scale"] / a["scale"]), 3))
        res[name] = steps
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", type=float, nargs="+", default=[0.01, 0.1, 1.0])
    ap.add_argument("--work", default=None, help="Working directory (default: a temporary one; "
                    "its inputs are reused by a rerun).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results" / "scale.json"))
    a = ap.parse_args()
    from bench_gen import fetch

    work = Path(a.work or tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    pub, _ = fetch(work / "data")
    from popri.models.llm import TINY_LM

    model = TINY_LM  # popri's tiny random Llama (SmolLM2's tokenizer), built once in the cache
    env = dict(os.environ, POPRI_ZYGOTE="0")
    rows = [run_scale(s, work, pub, model, env, a.seed) for s in sorted(a.scales)]
    exps = exponents(rows)
    info = {"cpus": os.cpu_count(), "threads": os.environ.get("POPRI_THREADS"),
            "machine": platform.processor() or platform.machine(), "full": FULL}
    head = "| stage | " + " | ".join(f"scale {r['scale']:g}: s / MiB" for r in rows)
    head += " | growth exponent(s) |"
    lines = [f"One POPri round and PE's histogram at scale s of POPri's bioRxiv setting "
             f"(K = 1,800 s prompts x J = 10, 72,000 s clients, q = 1, z = 19.3); "
             f"{info['cpus']} CPUs, POPRI_THREADS={info['threads']}.", "",
             "| scale | prompts | samples | clients | private samples |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scale']:g} | {r['prompts']:,} | {r['samples']:,} | "
                     f"{r['clients']:,} | {r['private_samples']:,} |")
    lines += ["", head, "|" + "---|" * (len(rows) + 2)]
    for name in STAGES:
        cells = [f"{r['stages'][name]['seconds']:.1f} / {r['stages'][name]['peak_rss_mib']:,.0f}"
                 for r in rows]
        lines.append(f"| {name} | " + " | ".join(cells) + " | "
                     + ", ".join(f"{e:.2f}" for e in exps[name]) + " |")
    md = "\n".join(lines)
    print(md)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"info": info, "rows": rows, "exponents": exps}, indent=2) + "\n")
    os.replace(tmp, out)
    out.with_suffix(".md").write_text(md + "\n")


if __name__ == "__main__":
    main()
