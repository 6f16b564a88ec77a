"""popri gen: the server LLM writes K prompts x J samples (library: popri/models/generation.py,
settings: popri/specs/generation.py GenSpec).

    popri gen data/c4-init.jsonl --prompts 1800 --samples-per-prompt 10 --seed 0 --out r0.jsonl
    popri gen data/c4-init.jsonl -K 4 -J 2 | popri score --synthetic - --private data/sotu ...
    popri gen data/c4-init.jsonl --num-samples 1000 --adapter runs/r5/adapter --out final.jsonl
"""

from __future__ import annotations

from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core import log
from popri.models.generation import generate_file
from popri.specs.generation import GenSpec
from popri.cli.options import command
from popri.specs.commands.gen import GenCall

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
machine and --threads; in bf16 also the same --batch-size); the stats file also holds timings.
Each sample is drawn with its own generator seeded from (seed, attempt, prompt, sample) in the
in-process backends; --backend openai asks the server for a prompt's J samples with one seed
(per-row seeds when the server ignores n); a server's own batching decides whether it repeats.

Backends: transformers (default; popri's decoding loop: bf16 weights, each prompt encoded once
for its J samples, finished rows leave the batch; on CUDA the slot engine of --decoder slots:
a static KV cache whose finished rows are replaced by waiting ones, the decode step in a CUDA
graph, a counter-based sampler per row; docs/gpu.md), transformers-generate (model.generate, the
older and slower path), vllm (GPU, in-process), openai (an OpenAI-compatible server at
--base-url: vLLM, SGLang, transformers serve, llama.cpp; docs/serving.md)."""


@command(GenCall)
def gen(
    omega: str, prompts: Optional[int], num_samples: Optional[int], out: str,
    adapter: Optional[str], split: str, template: Optional[str], seed: int, round_: int,
    device: Optional[str], prompts_out: Optional[str], stats_out: Optional[str], *, spec: GenSpec
) -> None:
    stats = generate_file(omega, spec, prompts=prompts, num_samples=num_samples, out=out,
                          split=split, template=template, adapter=adapter, seed=seed,
                          round_no=round_, device=device, prompts_out=prompts_out,
                          stats_out=stats_out)
    rate = stats["tokens_per_s"]
    log.info(f"gen: {stats['samples']} samples from {stats['prompts']} prompts x "
             f"{spec.samples_per_prompt}; {stats['generated_tokens']} tokens in "
             f"{stats['seconds']:.1f}s ({rate if rate is not None else 0:.1f} tokens/s); "
             f"{stats['regenerated']} regenerated; {stats['kept_degenerate']} still degenerate "
             "(kept, flagged)"
             + (f" {stats['kept_degenerate_reasons']}" if stats["kept_degenerate"] else ""))


def register(app: typer.Typer) -> None:
    app.command("gen", help=unwrap(_HELP))(gen)
