"""Downstream LM speed on CPU: eval tokens/s and training seconds/step, bf16 autocast vs fp32,
full fine-tuning vs LoRA, in one process (ratios against fp32 / full as the baseline).

    POPRI_THREADS=2 python benchmarks/bench_downstream.py --data data/sotu
    POPRI_THREADS=2 python benchmarks/bench_downstream.py --data data/sotu --model distilgpt2

Eval: popri.eval.downstream.evaluate_next_token on --eval-n test records (batch 32, 64 tokens).
Train: --steps optimizer steps of --batch sequences from the train split (one micro-batch per
step), timed after one warm-up step, for full and LoRA (r=4, alpha=8) with bf16 on and off; the
configurations are interleaved --repeats times and the median is reported.  Both wall seconds
and process CPU seconds (all threads; time.process_time) are reported: on a shared machine the
CPU seconds are the steadier figure (wall ~ CPU / threads when the machine is idle).  Results:
a table on stdout and benchmarks/results/downstream.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from popri.eval import downstream as ds
from popri.models import llm
from popri.core import runtime  # noqa: E402
from popri.data.records import text_records  # noqa: E402


def train_steps(model_name, recs, *, lora, bf16, batch, steps):
    torch = runtime.configure_torch()
    torch.manual_seed(0)
    m, tok = ds.load_model(model_name)
    if lora:
        from peft import LoraConfig, get_peft_model

        m = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                         target_modules="all-linear", task_type="CAUSAL_LM"))
    m.train()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=2e-4)
    seqs = ds.encode(tok, [r["text"] for r in recs], 64)
    times, cpu = [], []
    for s in range(steps + 1):
        chunk = seqs[(s * batch) % len(seqs):][:batch]
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        _, _, _, loss = ds.token_stats(m, *ds.make_batch(chunk, ds.padding_id(tok)), bf16=bf16,
                                       device="cpu")
        (loss / ds.count_targets(chunk)).backward()
        opt.step()
        if s:  # the first step warms up allocators and kernels
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return statistics.median(times), statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--eval-n", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    runtime.configure_torch()
    import torch

    test, _ = text_records(args.data, "test")
    train, _ = text_records(args.data, "train")
    test, train = test[:args.eval_n], train[:args.batch * (args.steps + 1)]
    llm.resolve(args.model)  # materialise an alias before timing
    ev = {True: [], False: []}
    tr = {(l, b): [] for l in (False, True) for b in (False, True)}
    acc = {}
    evc = {True: [], False: []}
    for _ in range(args.repeats):
        for bf16 in (False, True):
            c0 = time.process_time()
            r = ds.evaluate_next_token(args.model, test, bf16=bf16, bootstrap=0)
            ev[bf16].append(r["tokens_per_s"])
            evc[bf16].append(r["tokens"] / (time.process_time() - c0))
            acc[bf16] = r["accuracy"]
        for (lora, bf16) in tr:
            tr[(lora, bf16)].append(train_steps(args.model, train, lora=lora, bf16=bf16,
                                                batch=args.batch, steps=args.steps))
    res = {"model": args.model, "threads": torch.get_num_threads(), "cpu": platform.processor(),
           "eval_records": len(test), "eval_tokens_per_s": {}, "eval_accuracy": {},
           "eval_tokens_per_cpu_s": {}, "train_batch": args.batch, "train_s_per_step": {},
           "train_cpu_s_per_step": {}, "load_average": list(os.getloadavg())}
    print(f"{args.model}, {res['threads']} threads")
    for bf16 in (False, True):
        k = "bf16" if bf16 else "fp32"
        res["eval_tokens_per_s"][k] = statistics.median(ev[bf16])
        res["eval_tokens_per_cpu_s"][k] = statistics.median(evc[bf16])
        res["eval_accuracy"][k] = acc[bf16]
    ratio = res["eval_tokens_per_s"]["bf16"] / res["eval_tokens_per_s"]["fp32"]
    print(f"eval  tokens/s  fp32 {res['eval_tokens_per_s']['fp32']:.0f}  bf16 "
          f"{res['eval_tokens_per_s']['bf16']:.0f}  (bf16/fp32 {ratio:.2f}x)  accuracy fp32 "
          f"{acc[False]:.4f} bf16 {acc[True]:.4f}")
    e = res["eval_tokens_per_cpu_s"]
    print(f"eval  tokens/CPU-s  fp32 {e['fp32']:.0f}  bf16 {e['bf16']:.0f}  "
          f"(bf16/fp32 {e['bf16'] / e['fp32']:.2f}x)")
    base = statistics.median(c for _, c in tr[(False, False)])
    for (lora, bf16), v in tr.items():
        k = f"{'lora' if lora else 'full'}-{'bf16' if bf16 else 'fp32'}"
        wall, cpu = statistics.median(w for w, _ in v), statistics.median(c for _, c in v)
        res["train_s_per_step"][k], res["train_cpu_s_per_step"][k] = wall, cpu
        print(f"train {k:10s} {wall:6.2f} s/step of {args.batch} ({cpu:6.2f} CPU-s)  "
              f"(CPU speed-up vs full-fp32 {base / cpu:.2f}x)")
    print(f"load average during the run: {res['load_average']}")
    out = Path(__file__).parent / "results" / "downstream.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
