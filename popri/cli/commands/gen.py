"""popri gen: the server LLM writes K prompts x J samples (library: popri/models/generation.py).

    popri gen data/c4-init.jsonl --prompts 1800 --samples-per-prompt 10 --seed 0 --out r0.jsonl
    popri gen data/c4-init.jsonl -K 4 -J 2 | popri score --synthetic - --private data/sotu ...
    popri gen data/c4-init.jsonl --num-samples 1000 --adapter runs/r5/adapter --out final.jsonl
"""

from __future__ import annotations

from typing import Optional

import typer

_HELP = """The server LLM writes K prompts x J samples (POPri Algorithm 1; PrE-Text 'Expand').

Each prompt shows --shots (3) distinct random texts of OMEGA, the public initial population, in
the few-shot template of POPri (B.2, Figure 5; the reference code's generation_prompt.txt) and
PrE-Text (Figure 3): "List of 6 diverse original text samples:" then "Original Text Sample 1..3"
with the examples, ending with "Original Text Sample 4" for the model to continue. --template FILE
replaces it: placeholders {sample1}..{sampleN} (or {0}..{N-1}, the reference file's form), N =
--shots, each used; literal braces as {{ }}.

Each generation is cut at the next "Original Text Sample" (--marker; generation also stops there),
whitespace-normalised and truncated to --max-tokens (64, POPri's trunc_len) tokens of the
generator's tokenizer. Degenerate samples are regenerated up to --max-retries times: empty; fewer
than --min-words words; repetitive (one word > 50% of the words, or from 10 words on < 50% distinct
word trigrams); or a copy (equal to an example, or its first 8 words found verbatim in the prompt).
One still degenerate is KEPT with "degenerate": true, so every prompt keeps exactly J samples
(preference pairs need them); counts go to stderr and --stats-out.

Sampling defaults are the POPri reference code's (vllm_sampling): temperature 1.0, top-p 1.0, no
top-k, 85 new tokens; POPri B.1 uses K=1800 prompts x J=10 per round.

Output: JSONL on stdout (or --out FILE, written atomically), ordered by prompt then sample:
{"id": "r{round}-p{prompt_id}-s{sample_idx}", "round", "prompt_id", "sample_idx", "prompt", "text",
"model"} (+ "adapter" when given, + "degenerate": true). --num-samples N sets K = ceil(N / J) and
keeps the first N (the final synthetic set). Same inputs + --seed give the same file (on the same
machine and --threads; under bf16 autocast also the same --batch-size); the stats file also holds
timings. Each sample is drawn with its own generator seeded from (seed, attempt, prompt, sample),
in both backends."""
# one line per paragraph: rich re-flows the text to the terminal width
HELP = "\n\n".join(" ".join(par.split()) for par in _HELP.split("\n\n"))


def gen(
    omega: str = typer.Argument(..., help="Initial population Omega: JSONL with 'text' (and 'id'), "
                                          "a federated dataset directory (its --split), or '-'."),
    prompts: Optional[int] = typer.Option(None, "--prompts", "-K", min=1,
                                          help="K prompts (POPri B.1: 1800). Or --num-samples."),
    samples_per_prompt: int = typer.Option(10, "--samples-per-prompt", "-J", min=1,
                                           help="J samples per prompt (POPri B.1: 10)."),
    num_samples: Optional[int] = typer.Option(None, "--num-samples", "-N", min=1,
                                              help="Total samples N instead of --prompts: K = "
                                                   "ceil(N / J), output truncated to N."),
    out: str = typer.Option("-", "--out", "-o", help="Samples JSONL ('-' = stdout)."),
    model: str = typer.Option("smollm2-135m", "--model", "-m", envvar="POPRI_GEN_MODEL",
                              help="Generator: alias smollm2-135m / gemma3-270m (offline), a local "
                                   "checkpoint or a hub id. (POPri used LLaMA-3-8B.)"),
    adapter: Optional[str] = typer.Option(None, "--adapter", help="PEFT LoRA adapter directory "
                                          "on top of --model (e.g. from 'popri dpo')."),
    backend: str = typer.Option("transformers", "--backend",
                                help="transformers (CPU/GPU, batched) or vllm (GPU; pip install "
                                     "'popri[gpu]'; the reference code's engine)."),
    adapter_mode: str = typer.Option("lora", "--adapter-mode", help="vllm: 'lora' serves the "
                                     "adapter with a LoRARequest, 'merge' merges it first (cached)."),
    split: str = typer.Option("train", "--split", help="Split when OMEGA is a dataset directory."),
    shots: int = typer.Option(3, "--shots", min=1, help="Examples per prompt (POPri/PrE-Text: 3)."),
    template: Optional[str] = typer.Option(None, "--template", help="Prompt template file "
                                           "({sample1}..{sampleN} placeholders)."),
    marker: str = typer.Option("Original Text Sample", "--marker",
                               help="Cut (and stop) generations at this string."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="0 = greedy. "
                                      "(POPri E.3 ablation picks 1.0.)"),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="Nucleus sampling."),
    max_new_tokens: int = typer.Option(85, "--max-new-tokens", min=1,
                                       help="Tokens generated per sample (reference code: 85)."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Truncate samples to this many "
                                   "tokens (POPri trunc_len 64: the 64-token chunks of the data)."),
    min_words: int = typer.Option(3, "--min-words", min=0, help="Shorter samples are degenerate."),
    max_retries: int = typer.Option(2, "--max-retries", min=0,
                                    help="Regenerations of a degenerate sample."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="transformers: sequences per "
                                   "generate() call. Each sequence has its own seeded sampler, so "
                                   "with --no-bf16 it does not change the samples (bf16 rounding "
                                   "can)."),
    seed: int = typer.Option(0, "--seed", help="Seeds the choice of Omega examples and sampling."),
    round_: int = typer.Option(0, "--round", min=0, help="Round number, recorded in ids and rows."),
    bf16: bool = typer.Option(True, "--bf16/--no-bf16", help="bf16 autocast on CPU (faster), bf16 "
                              "weights on GPU/vllm."),
    device: Optional[str] = typer.Option(None, "--device", help="transformers: cpu, cuda, cuda:1 "
                                         "(default: cuda if available)."),
    prompts_out: Optional[str] = typer.Option(None, "--prompts-out", help="Write the K prompts "
                                              "as JSONL {prompt_id, prompt, examples (Omega ids)}."),
    stats_out: Optional[str] = typer.Option(None, "--stats-out", help="Write counts (generated, "
                                            "regenerated, kept degenerate) and tokens/s as JSON."),
) -> None:
    import json
    import math
    from pathlib import Path

    from popri.core import log
    from popri.models.embed import text_records
    from popri.core.errors import InputError
    from popri.models.generation import BACKENDS, build_prompts, generate
    from popri.core.io import STDIO, AtomicOutputs, dumps, write_jsonl

    if (prompts is None) == (num_samples is None):
        raise InputError("give exactly one of --prompts K and --num-samples N", field="prompts")
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}; one of {', '.join(BACKENDS)}", field="backend")
    if adapter_mode not in ("lora", "merge"):
        raise InputError(f"unknown adapter mode {adapter_mode!r}; lora or merge", field="adapter-mode")
    if top_p <= 0:
        raise InputError("--top-p must be in (0, 1]", field="top-p")
    if adapter and not (Path(adapter) / "adapter_config.json").exists():
        raise InputError("not a PEFT adapter directory (no adapter_config.json)", path=adapter)
    for name, dest in (("prompts-out", prompts_out), ("stats-out", stats_out)):
        if dest == STDIO:
            raise InputError("stdout carries the samples; give a file name", field=name)
    from popri.core.guard import check_outputs

    check_outputs([out, prompts_out, stats_out],
                  [omega, template, adapter, model if Path(model).exists() else None])
    from popri.models.generation import check_template, read_template

    tmpl = read_template(template, lambda t: check_template(t, shots))

    recs, src = text_records(omega, split)
    k = prompts if prompts is not None else math.ceil(num_samples / samples_per_prompt)
    try:
        plist = build_prompts([r["text"] for r in recs], k, seed=seed, shots=shots, template=tmpl,
                              ids=[r["id"] for r in recs])
    except InputError as e:
        raise InputError(e.message, path=src, field=e.field) from None
    records, stats = generate(
        plist, model=model, adapter=adapter, samples_per_prompt=samples_per_prompt, round=round_,
        backend=backend, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
        max_tokens=max_tokens, min_words=min_words, max_retries=max_retries,
        batch_size=batch_size, seed=seed, bf16=bf16, device=device, num_samples=num_samples,
        marker=marker, adapter_mode=adapter_mode)
    stats["omega"] = {"path": src, "texts": len(recs), "shots": shots,
                      "template": template or "builtin"}
    with AtomicOutputs() as staged:
        if out != STDIO:
            with open(staged.path(out), "w", encoding="utf-8") as fh:
                fh.writelines(dumps(r) + "\n" for r in records)
        if prompts_out:
            with open(staged.path(prompts_out), "w", encoding="utf-8") as fh:
                fh.writelines(dumps({"prompt_id": p["prompt_id"], "prompt": p["prompt"],
                                     "examples": p["examples"]}) + "\n" for p in plist)
        if stats_out:
            with open(staged.path(stats_out), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(stats, indent=2) + "\n")
    if out == STDIO:
        write_jsonl(records, STDIO)
    rate = stats["tokens_per_s"]
    log.info(f"gen: {stats['samples']} samples from {len(plist)} prompts x {samples_per_prompt}; "
             f"{stats['generated_tokens']} tokens in {stats['seconds']:.1f}s "
             f"({rate if rate is not None else 0:.1f} tokens/s); {stats['regenerated']} regenerated; "
             f"{stats['kept_degenerate']} still degenerate (kept, flagged)"
             + (f" {stats['kept_degenerate_reasons']}" if stats["kept_degenerate"] else ""))


def register(app: typer.Typer) -> None:
    app.command("gen", help=HELP)(gen)
