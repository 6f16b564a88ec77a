"""Downstream LM speed on CPU: eval tokens/s and training seconds/step, bf16 autocast vs fp32,
full fine-tuning vs LoRA, in one process (ratios against fp32 / full as the baseline).

    POPRI_THREADS=2 python benchmarks/bench_downstream.py --data data/sotu
    POPRI_THREADS=2 python benchmarks/bench_downstream.py --data data/sotu --model distilgpt2

Eval: popri_cli.downstream.evaluate_next_token on --eval-n test records (batch 32, 64 tokens).
Train: --steps optimizer steps of --batch sequences from the train split (one micro-batch per
step), timed after one warm-up step, for full and LoRA (r=4, alpha=8) with bf16 on and off; the
configurations are interleaved --repeats times and the median is reported (the CPU may be
shared).  Results: a table on stdout and benchmarks/results/downstream.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from popri_cli import downstream as ds, llm, runtime  # noqa: E402
from popri_cli.embed import text_records  # noqa: E402


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
    times = []
    for s in range(steps + 1):
        chunk = seqs[(s * batch) % len(seqs):][:batch]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, _, _, loss = ds.token_stats(m, *ds.make_batch(chunk, ds._pad_id(tok)), bf16=bf16,
                                       device="cpu")
        (loss / ds.count_targets(chunk)).backward()
        opt.step()
        if s:  # the first step warms up allocators and kernels
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


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
    for _ in range(args.repeats):
        for bf16 in (False, True):
            r = ds.evaluate_next_token(args.model, test, bf16=bf16, bootstrap=0)
            ev[bf16].append(r["tokens_per_s"])
            acc[bf16] = r["accuracy"]
        for (lora, bf16) in tr:
            tr[(lora, bf16)].append(train_steps(args.model, train, lora=lora, bf16=bf16,
                                                batch=args.batch, steps=args.steps))
    res = {"model": args.model, "threads": torch.get_num_threads(), "cpu": platform.processor(),
           "eval_records": len(test), "eval_tokens_per_s": {}, "eval_accuracy": {},
           "train_batch": args.batch, "train_s_per_step": {}}
    print(f"{args.model}, {res['threads']} threads")
    for bf16 in (False, True):
        k = "bf16" if bf16 else "fp32"
        res["eval_tokens_per_s"][k] = statistics.median(ev[bf16])
        res["eval_accuracy"][k] = acc[bf16]
    ratio = res["eval_tokens_per_s"]["bf16"] / res["eval_tokens_per_s"]["fp32"]
    print(f"eval  tokens/s  fp32 {res['eval_tokens_per_s']['fp32']:.0f}  bf16 "
          f"{res['eval_tokens_per_s']['bf16']:.0f}  (bf16/fp32 {ratio:.2f}x)  accuracy fp32 "
          f"{acc[False]:.4f} bf16 {acc[True]:.4f}")
    base = statistics.median(tr[(False, False)])
    for (lora, bf16), v in tr.items():
        k = f"{'lora' if lora else 'full'}-{'bf16' if bf16 else 'fp32'}"
        res["train_s_per_step"][k] = statistics.median(v)
        print(f"train {k:10s} {statistics.median(v):6.2f} s/step of {args.batch}  "
              f"(speed-up vs full-fp32 {base / statistics.median(v):.2f}x)")
    out = Path(__file__).parent / "results" / "downstream.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
