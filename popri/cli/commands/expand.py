"""popri expand: PrE-Text's Expand, the DP seed set -> N synthetic samples in shards
(library: popri/methods/pe/expand.py, settings: popri/specs/generation.py ExpandSpec).

    popri expand runs/pe/seeds.jsonl --num-samples 2000 --out runs/expand
    popri expand seeds.jsonl --num-samples 1000000 --backend vllm --model meta-llama/Llama-2-7b-hf --out runs/expand
    cat seeds.jsonl | popri expand - -N 64 --shard-size 16 --out runs/x --merged-out - | wc -l
"""

from __future__ import annotations

from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core.io import STDIO
from popri.methods.pe.expand import expand_file
from popri.specs.generation import ExpandSpec
from popri.cli.options import command
from popri.specs.commands.expand import ExpandCall

_HELP = """PrE-Text's Expand (Algorithm 1 line 11; Section 3 (6); Figure 3): an LLM writes N synthetic
samples that imitate the DP seed set. Post-processing of DP output: spends no privacy.

Each prompt shows 3 random distinct texts of SEEDS (whitespace-normalised) in PrE-Text's few-shot
prompt (Figure 3; the same as 'popri gen'): "List of 6 diverse original text samples:", "Original
Text Sample 1..3" with the seeds, then "Original Text Sample 4" for the model to continue. --template
FILE replaces it ({sample1}..{sample3}). The generation is cut at the next "Original Text Sample"
(PrE-Text Fig. 3: the text between samples 4 and 5), whitespace-normalised and truncated to
--max-tokens tokens. Samples are DROPPED when degenerate: empty, fewer than --min-words words,
repetitive (one word > 50% of the words, or from 10 words on < 50% distinct word trigrams), a copy
of a prompt example; or an exact duplicate of any sample already written (8-byte blake2b hashes,
8 MB per million samples). Prompting goes on until N are kept, at most --attempt-factor x N
prompts; fewer is a shortfall: exit 1 unless --allow-short.

Defaults: PrE-Text D.2 samples from LLaMA-2-7B (--model meta-llama/Llama-2-7b-hf --backend vllm on
a GPU) with top-p 1.0 and temperature 1.0, via vLLM, 2 million samples (Section 4.1; 50,000 for
the LLaMA fine-tuning of 4.2); its expansion script uses 85 new tokens. The offline default model
here is smollm2-135m (CPU). 64 tokens = the 64-token chunks of the private data (POPri trunc_len).
--min-words 4 drops samples of 3 words or fewer (the project's PrE-Text post-filter; the paper
does not state one).

Output: DIR/shard-00000.jsonl, shard-00001.jsonl, ... (--shard-size rows each, every one written
atomically when complete) with rows {"id": "x{index}", "text", "seed_ids": (the 3 seed ids),
"model"} (+ "adapter"), and DIR/manifest.json (rewritten after each shard: config, finished shards
with sha256, counts kept / filtered by reason / duplicates, tokens/s, samples/s). Rerunning the same
command continues after the last finished shard, byte-identical to an uninterrupted run (shard k
depends only on --seed, k and the samples before it); another config is refused unless --force
(which starts over). A larger --num-samples continues a run whose shards are all full.
--merged-out PATH also writes all shards as one JSONL ('-': stdout). stdout carries that JSONL, or
else DIR's path. Progress (samples/s, ETA) goes to stderr."""


@command(ExpandCall)
def expand(
    seeds: str, num_samples: int, out: str, adapter: Optional[str], seed: int, allow_short: bool,
    template: Optional[str], device: Optional[str], merged_out: Optional[str], force: bool, *,
    spec: ExpandSpec
) -> None:
    expand_file(seeds, spec, num_samples=num_samples, out=out, adapter=adapter, seed=seed,
                template=template, device=device, merged_out=merged_out, force=force,
                allow_short=allow_short)
    if merged_out != STDIO:
        typer.echo(out)


def register(app: typer.Typer) -> None:
    app.command("expand", help=unwrap(_HELP))(expand)
