"""One POPri round, and PE's DP nearest-neighbour histogram, at the papers' sizes: time, memory and
how each stage grows (issue 45, 5).

    POPRI_THREADS=2 python benchmarks/bench_scale.py                       # 1/100, 1/10, full
    python benchmarks/bench_scale.py --scales 0.01 0.1 --out /tmp/s.json    # a quick look
    python benchmarks/bench_scale.py --scales 1 --add-to /tmp/s.json         # then the full one

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
import resource
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
POPRI = [sys.executable, "-P", "-m", "popri"]


def client_embeddings(path: Path, clients: int, seed: int, d: int = 384,
                      model: str = EMBEDDER) -> Path:
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
    save_embedding_set(path, emb, rows, meta={"model": model, "normalize": True,
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


def score_cmd(name: str, syn: Path, priv: Path, out: Path) -> list[str]:
    """``popri score`` as the round runs it: ``score`` (mean cosine, standardised, clipped) or
    ``pe-hist`` (PE's nearest-neighbour histogram), every client (q = 1), z = 19.3."""
    mode = (["--mode", "cosine", "--standardize", "--clip", "1.0", "--seed", "1"]
            if name == "score" else ["--mode", "nn-histogram", "--seed", "3"])
    return [*POPRI, "score", *mode, "--synthetic", str(syn), "--private", str(priv), "--out",
            str(out), "--noise-multiplier", str(FULL["z"]), "--sample-rate", "1.0", "--round",
            "1", "--delta", "3e-06"]


def run_scale(s: float, work: Path, pub: Path, a: argparse.Namespace, env: dict,
              done=lambda row: None, earlier: dict | None = None) -> dict:
    """Every stage at scale ``s``; ``done(row)`` after each (the partial table is written)."""
    model, seed = a.model, a.seed
    K = max(2, round(FULL["prompts"] * s))
    J, n_clients = FULL["J"], max(10, round(FULL["clients"] * s))
    d = work / f"s{s:g}"
    d.mkdir(parents=True, exist_ok=True)
    tag = "" if a.dim == 384 else f"-d{a.dim}"  # the embedder's dimension (384: MiniLM's)
    priv, val = d / f"private{tag}.npy", d / f"val{tag}.npy"
    # made in a child: a stage's peak RSS from wait4 is the larger of its own and this process's
    # (Linux carries the parent's high-water mark across fork and exec), so this one stays small
    n_priv = helper("clients", str(priv), str(n_clients), str(seed), str(a.dim),
                    str(val), str(max(10, n_clients // 10)), a.embedder)
    # the DP validation mean checkpoint selection reads (not timed: once per run, not per round)
    stats = d / f"val_stats{tag}.npz"
    if not stats.is_file():
        timed([*POPRI, "fred", "stats", "--private", str(val), "--out", str(stats), "--epsilon",
               "0.1", "--delta", "3e-06", "--level", "user", "--relation", "add-remove",
               "--calibration", "analytic", "--statistics", "mean", "--seed", "0"],
              d / "fred.log", env)
    bf16 = ["--bf16" if a.bf16 else "--no-bf16"]
    gen = [*POPRI, "gen", str(pub), "--split", "train", "--model", model, "--max-new-tokens", "85",
           "--max-tokens", "64", "--batch-size", str(a.gen_batch), *bf16, "--max-retries", "0",
           "--min-words", "0"]
    if a.device != "cpu" or a.decoder != "loop":  # (the CPU defaults: the earlier runs' commands)
        gen += ["--device", a.device, "--decoder", a.decoder]
    cmds = {
        "gen": [*gen, "--prompts", str(K), "--samples-per-prompt", str(J), "--round", "1",
                "--seed", "1", "--out", str(d / "samples.jsonl"), "--prompts-out",
                str(d / "prompts.jsonl"), "--stats-out", str(d / "gen-stats.json")],
        "embed": [*POPRI, "embed", str(d / "samples.jsonl"), "--out", str(d / "syn.npy"),
                  "--model", a.embedder, "--no-cache",  # (a rerun's texts are the same)
                  *(["--device", a.device] if a.device != "cpu" else [])],
        "score": score_cmd("score", d / "syn.npy", priv, d / "scores.npy"),
        "prefs": [*POPRI, "prefs", "build", "--samples", str(d / "samples.jsonl"), "--scores",
                  str(d / "scores.npy"), "--rejected-rank", "5", "--out",
                  str(d / "prefs.jsonl")],
        "dpo": [*POPRI, "dpo", "--pairs", str(d / "prefs.jsonl"), "--model", model, "--out",
                str(d / "dpo"), "--lora-r", "4", "--lora-alpha", "8", *bf16, "--lr",
                "0.0005", "--epochs", "1", "--batch-size", str(a.dpo_batch), "--loss", "dpo",
                "--beta",
                "0.01", "--holdout", "0.25", "--seed", "1", "--select-on", str(stats),
                "--select-prompts", str(d / "prompts.jsonl"), "--select-samples", "16",
                "--select-by", "mean-cosine", "--embed-model", a.embedder, "--max-length", "256"],
        "final": [*gen, "--num-samples", str(K * J), "--samples-per-prompt", str(J), "--round",
                  "2", "--seed", "2", "--adapter", str(d / "dpo" / "adapter"), "--out",
                  str(d / "synthetic.jsonl"), "--stats-out", str(d / "final-stats.json")],
        "pe-hist": score_cmd("pe-hist", d / "syn.npy", priv, d / "hist.npy"),
    }
    out = {"scale": s, "prompts": K, "J": J, "samples": K * J, "clients": n_clients,
           "private_samples": n_priv, "stages": {}}
    for name in STAGES:
        if name not in a.stages:
            if name not in (earlier or {}).get("stages", {}):
                raise SystemExit(f"bench_scale: --stages leaves out {name}, and no earlier row "
                                 f"(--add-to) at scale {s:g} has it")
            out["stages"][name] = {**earlier["stages"][name], "run": "earlier"}
            continue
        sec, rss = timed(cmds[name], d / f"{name}.log", env)
        out["stages"][name] = {"seconds": round(sec, 2), "peak_rss_mib": round(rss, 1)}
        print(f"bench_scale: scale {s:g} {name}: {sec:.1f} s, peak RSS {rss:,.0f} MiB",
              file=sys.stderr, flush=True)
        done(out)
    out["counts"] = helper("counts", str(d), model)  # the H200 estimate's token counts
    return out


def helper(*args: str):
    """This script's helper in a child process (``--helper``): its JSON answer."""
    p = subprocess.run([sys.executable, __file__, "--helper", *args], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench_scale: helper {args[0]} failed: {p.stderr[-3000:]}")
    return json.loads(p.stdout)


def run_helper(args: list[str]) -> None:
    if args[0] == "clients":
        priv, n, seed, dim, val, n_val, model = args[1:]
        client_embeddings(Path(priv), int(n), int(seed), int(dim), model)
        client_embeddings(Path(val), int(n_val), int(seed) + 1, int(dim), model)
        import numpy as np

        print(json.dumps(int(np.load(priv, mmap_mode="r").shape[0])))
    elif args[0] == "counts":
        print(json.dumps(counts(Path(args[1]), args[2])))
    elif args[0] == "fetch":
        from bench_gen import fetch

        print(json.dumps(str(fetch(Path(args[1]))[0])))


def counts(d: Path, model: str) -> dict:
    """What the H200 estimate scales: generated tokens and prompt tokens (the model's tokenizer)."""
    from popri.models.llm import load_tokenizer

    tok = load_tokenizer(model)

    def rows(name):
        return [json.loads(line) for line in (d / name).read_text().splitlines() if line.strip()]

    lens = [len(tok(p["prompt"])["input_ids"]) for p in rows("prompts.jsonl")]
    out = {"prompt_tokens_mean": round(sum(lens) / max(1, len(lens)), 1)}
    if (d / "gen-stats.json").is_file():
        st = json.loads((d / "gen-stats.json").read_text())
        out.update(generated_tokens=int(st["generated_tokens"]), samples=int(st["samples"]))
    else:  # a run before --stats-out: the samples' texts re-tokenised (an approximation)
        texts = [r["text"] for r in rows("samples.jsonl")]
        out.update(generated_tokens=sum(len(tok(t, add_special_tokens=False)["input_ids"])
                                        for t in texts), samples=len(texts),
                   generated_tokens_from="the samples' texts, re-tokenised")
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


# score and pe-hist compare every private sample (client) with every synthetic sample: their
# work is the product of the two counts, so in the table above, where both grow together, a
# stage linear in each grows with exponent up to 2.  --cross measures each count alone.
BILINEAR = ("score", "pe-hist")


def cross(rows: list[dict], work: Path, env: dict) -> dict:
    """Exponents of score and pe-hist in clients alone and in samples alone, between the two
    largest complete scales a < b in ``work``: the stage with b's clients and a's samples, and
    with a's clients and b's samples, against b's own time."""
    done = sorted((r for r in rows if set(STAGES) <= set(r["stages"])
                   and (work / f"s{r['scale']:g}" / "syn.npy").is_file()),
                  key=lambda r: r["scale"])
    if len(done) < 2:
        raise SystemExit("bench_scale: --cross needs two complete scales in --work")
    a, b = done[-2], done[-1]
    da, db = (work / f"s{r['scale']:g}" for r in (a, b))
    out = {"scales": [a["scale"], b["scale"]]}
    for name in BILINEAR:
        res = {}
        for what, priv, syn in (("clients", da / "private.npy", db / "syn.npy"),
                                ("samples", db / "private.npy", da / "syn.npy")):
            d = work / "cross" / f"{name}-{what}"
            d.mkdir(parents=True, exist_ok=True)
            for f in d.glob("*"):
                f.unlink()
            sec, rss = timed(score_cmd(name, syn, priv, d / "out.npy"), d / "log.txt", env)
            full = b["stages"][name]["seconds"]
            res[what] = {"seconds_at_small": round(sec, 2), "peak_rss_mib": round(rss, 1),
                         "seconds_at_full": full,
                         "exponent": round(math.log(full / sec)
                                           / math.log(b["scale"] / a["scale"]), 3)}
            print(f"bench_scale: {name} with {what} at {a['scale']:g} (the other at "
                  f"{b['scale']:g}): {sec:.1f} s", file=sys.stderr, flush=True)
        out[name] = res
    return out


# The H200 / 8B estimate: every number it uses, named.  The measured inputs are the full-scale
# row's counts (samples, generated tokens, prompt tokens, pairs); the hardware and model figures
# are assumptions, printed with the table.
ASSUME = {
    "params": 8.0e9,            # an 8B dense decoder (Llama-3.1-8B's shape), bf16 weights: 16 GB
    "peak_flops": 989e12,       # H200 SXM, dense bf16 tensor-core peak (NVIDIA's datasheet)
    "mfu_prefill": 0.5,         # model FLOPs utilisation of a batched prefill
    "mfu_decode": 0.3,          # of vLLM's continuous-batching decode at >= 256 sequences
    "mfu_train": 0.35,          # of a LoRA DPO step (bf16 autocast, batch 8 x 256 tokens)
    "dpo_flops_per_token": 6,   # x params: policy forward 2N + backward through activations 2N
                                # (LoRA's weight gradients are negligible) + reference forward 2N
    "engine_start_s": 60.0,     # vLLM engine start with an 8B model (load 16 GB, CUDA graphs)
    "trainer_start_s": 30.0,    # loading the 8B policy for DPO (16 GB at ~1 GB/s)
    "prefix_cache": True,       # a prompt's J samples share its prefill (vLLM prefix caching)
    "embed_per_s": 20000.0,     # all-MiniLM-L6-v2 sentences/s on one H200 (64 tokens each)
    "cpu_stages": ("score", "prefs", "pe-hist"),  # numpy / faiss-cpu on the host: as measured
}


def h200_estimate(row: dict) -> list[str]:
    """Seconds per stage on one H200 with an 8B generator, from the full-scale row's counts."""
    c = row.get("counts")
    if not c:
        return []
    A, K = ASSUME, row["prompts"]
    n = row["samples"]
    new = c["generated_tokens"] / max(1, c["samples"])   # generated tokens a sample, measured
    prompt = c["prompt_tokens_mean"]
    prefill_tok = (K if A["prefix_cache"] else n) * prompt
    decode_tok = n * new

    def gen_s():
        return (A["engine_start_s"] + 2 * A["params"] * prefill_tok
                / (A["peak_flops"] * A["mfu_prefill"])
                + 2 * A["params"] * decode_tok / (A["peak_flops"] * A["mfu_decode"]))

    pairs = round(K * 0.75)                         # --holdout 0.25
    seq = min(256, prompt + new)                    # --max-length 256
    dpo = (A["trainer_start_s"] + A["dpo_flops_per_token"] * A["params"] * 2 * seq * pairs
           / (A["peak_flops"] * A["mfu_train"]))
    est = {"gen": gen_s(), "embed": 10.0 + n / A["embed_per_s"], "dpo": dpo, "final": gen_s()}
    rows = []
    for name in STAGES:
        if name in est:
            rows.append(f"| {name} | {est[name]:,.0f} | estimated |")
        else:
            rows.append(f"| {name} | {row['stages'][name]['seconds']:,.0f} | measured here "
                        "(2 cores; host CPU work, an upper bound) |")
    total = sum(est.values()) + sum(row["stages"][s]["seconds"] for s in A["cpu_stages"])
    lines = ["", "## One H200 and an 8B generator: an estimate, not a measurement", "",
             f"The full-scale round's counts, measured above: {n:,} samples, {new:.1f} generated "
             f"tokens a sample ({decode_tok:,.0f} in all), {prompt:.0f} prompt tokens a prompt "
             f"(the tiny model's tokenizer, SmolLM2's; an 8B model's larger vocabulary gives "
             f"fewer), {pairs:,} DPO pairs of <= {seq:.0f} tokens a side.  Assumptions:", ""]
    lines += [f"- `{k}` = {v}" for k, v in A.items()]
    lines += ["", "gen / final = engine start + 2 N prefill tokens / (peak x mfu_prefill) + "
              "2 N decode tokens / (peak x mfu_decode); dpo = trainer start + 6 N x 2 x tokens "
              "x pairs / (peak x mfu_train) (the checkpoint selection's 16 samples a checkpoint "
              "left out); embed = 10 s start + samples / embed_per_s.", "",
              "| stage | seconds | basis |", "|---|---|---|", *rows,
              f"| **round** | **{total:,.0f}** | |"]
    return lines


def cell(st: dict) -> str:
    """'seconds / MiB'; a stage kept from an earlier run says so, and an RSS that is only a
    bound says <= (wait4's figure when the measuring process itself was larger)."""
    rss = f"{'<= ' if st.get('rss_bound') else ''}{st['peak_rss_mib']:,.0f}"
    return f"{st['seconds']:.1f} / {rss}" + (" (earlier run)" if st.get("run") else "")


def write(rows: list[dict], a: argparse.Namespace, partial: bool = False) -> str:
    """benchmarks/results/scale.json and .md (atomically) from the rows measured so far."""
    rows = sorted(rows, key=lambda r: r["scale"])
    exps = exponents([r for r in rows if set(STAGES) <= set(r["stages"])])
    info = {"cpus": os.cpu_count(), "threads": os.environ.get("POPRI_THREADS"),
            "machine": platform.processor() or platform.machine(), "full": FULL,
            "model": a.model, "embedder": a.embedder, "dim": a.dim, "device": a.device,
            "decoder": a.decoder,
            "gen_batch": a.gen_batch, "dpo_batch": a.dpo_batch, "bf16": a.bf16,
            "partial": partial,
            # the floor under every stage's peak RSS (wait4 reports the larger of the two)
            "parent_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                         / 1024.0, 1)}
    if getattr(a, "table_only", False):  # the measuring run's own record
        info = a.earlier_json["info"]
    head = "| stage | " + " | ".join(f"scale {r['scale']:g}: s / MiB" for r in rows)
    head += " | growth exponent(s) |"
    lines = [f"One POPri round and PE's histogram at scale s of POPri's bioRxiv setting "
             f"(K = 1,800 s prompts x J = 10, 72,000 s clients, q = 1, z = 19.3); "
             f"{info['cpus']} CPUs, POPRI_THREADS={info['threads']}, generator {a.model} on "
             f"{a.device} (`python benchmarks/bench_scale.py`).", "",
             "| scale | prompts | samples | clients | private samples |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scale']:g} | {r['prompts']:,} | {r['samples']:,} | "
                     f"{r['clients']:,} | {r['private_samples']:,} |")
    for r in rows:
        if r.get("run"):
            lines.append(f"\nScale {r['scale']:g} comes from an {r['run']}, same machine and "
                         "settings.")
    if partial:
        lines.append("\n**Partial**: the run was still going (or was stopped) when this was "
                     "written.")
    lines += ["", head, "|" + "---|" * (len(rows) + 2)]
    for name in STAGES:
        cells = [cell(r["stages"][name]) if name in r["stages"] else "-" for r in rows]
        lines.append(f"| {name} | " + " | ".join(cells) + " | "
                     + ", ".join(f"{e:.2f}" for e in exps.get(name, [])) + " |")
    cx = getattr(a, "cross_result", None)
    if cx:
        sa, sb = cx["scales"]
        lines += ["", f"score and pe-hist compare every private sample with every synthetic one, "
                  f"so their work is the product of the two counts and, with both grown together "
                  f"(above), a stage linear in each can show an exponent up to 2.  Each count "
                  f"alone (`--cross`: the other held at scale {sb:g}; {sa:g} -> {sb:g}):", "",
                  "| stage | s, clients at " f"{sa:g} | s, samples at {sa:g} | s at {sb:g} | "
                  "exponent in clients | exponent in samples |", "|---|---|---|---|---|---|"]
        for name in BILINEAR:
            c, m = cx[name]["clients"], cx[name]["samples"]
            lines.append(f"| {name} | {c['seconds_at_small']:.1f} | {m['seconds_at_small']:.1f}"
                         f" | {c['seconds_at_full']:.1f} | {c['exponent']:.2f} | "
                         f"{m['exponent']:.2f} |")
    full = [r for r in rows if r["scale"] == 1.0 and set(STAGES) <= set(r["stages"])]
    if full and a.model == "tiny-random-llama":
        lines += h200_estimate(full[0])
    md = "\n".join(lines)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, text in ((out, json.dumps({"info": info, "rows": rows, "exponents": exps,
                                        "cross": cx, "assumptions": ASSUME},
                                       indent=2) + "\n"),
                       (out.with_suffix(".md"), md + "\n")):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", type=float, nargs="+", default=[0.01, 0.1, 1.0])
    ap.add_argument("--work", default=None, help="Working directory (default: a temporary one; "
                    "its inputs are reused by a rerun).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results" / "scale.json"))
    ap.add_argument("--add-to", default=None, metavar="JSON",
                    help="An earlier run's JSON on this machine: its scales are kept beside the "
                    "ones measured now (a scale measured now replaces its row), so the full scale "
                    "can be run on its own after a quick look at the small ones.")
    ap.add_argument("--table-only", action="store_true",
                    help="Measure nothing: rewrite the table and the estimate from --add-to "
                    "(its rows' counts taken from --work where they lack them).")
    ap.add_argument("--model", default="tiny-random-llama",
                    help="Generator and DPO policy (gpu_check.sh: smollm2-135m on the GPU).")
    ap.add_argument("--embedder", default=EMBEDDER)
    ap.add_argument("--dim", type=int, default=384,
                    help="The embedder's dimension, of the synthetic client embeddings (384: "
                    "all-MiniLM-L6-v2; gpu_check.sh's CPU fallback: 32, tiny-random-minilm).")
    ap.add_argument("--device", default="cpu", help="gen's and embed's device (DPO: its default).")
    ap.add_argument("--decoder", default="loop", help="popri gen --decoder (loop | slots).")
    ap.add_argument("--gen-batch", type=int, default=256)
    ap.add_argument("--dpo-batch", type=int, default=8)
    ap.add_argument("--bf16", action="store_true", help="bf16 generation and DPO (the GPU).")
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES,
                    help="The stages measured now (their inputs must exist in --work); the "
                    "others' rows come from --add-to's row at the same scale, marked earlier.")
    ap.add_argument("--cross", action="store_true",
                    help="Then measure score and pe-hist with the clients of one scale and the "
                    "samples of another (their exponents in each count alone).")
    ap.add_argument("--helper", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.helper:
        run_helper(a.helper)
        return
    a.earlier_json = json.loads(Path(a.add_to).read_text()) if a.add_to else {"rows": []}
    earlier = a.earlier_json["rows"]
    same = {r["scale"]: r for r in earlier if r["scale"] in a.scales}  # partly rerun now
    if not a.table_only:
        earlier = [r for r in earlier if r["scale"] not in a.scales]
    work = Path(a.work or tempfile.mkdtemp(prefix="bench-scale-"))
    if a.table_only:
        for r in earlier:
            d = work / f"s{r['scale']:g}"
            if "counts" not in r and (d / "prompts.jsonl").is_file():
                r["counts"] = counts(d, a.model)
        a.cross_result = a.earlier_json.get("cross")
        print(write(earlier, a))
        return
    work.mkdir(parents=True, exist_ok=True)
    pub = Path(helper("fetch", str(work / "data")))
    env = dict(os.environ, POPRI_ZYGOTE="0")
    for r in earlier:
        r.setdefault("run", f"earlier run ({a.add_to})")
    rows = list(earlier)
    for s in sorted(a.scales):
        rows.append(run_scale(s, work, pub, a, env, earlier=same.get(s),
                              done=lambda row: write([*rows, row], a, partial=True)))
    a.cross_result = cross(rows, work, env) if a.cross else None
    print(write(rows, a))


if __name__ == "__main__":
    main()
