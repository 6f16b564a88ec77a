"""popri expand: PrE-Text's Expand, the DP seed set -> N synthetic samples in shards
(library: popri/methods/pe/expand.py).

    popri expand runs/pe/seeds.jsonl --num-samples 2000 --out runs/expand
    popri expand seeds.jsonl --num-samples 1000000 --backend vllm --model meta-llama/Llama-2-7b-hf --out runs/expand
    cat seeds.jsonl | popri expand - -N 64 --shard-size 16 --out runs/x --merged-out - | wc -l
"""

from __future__ import annotations

from typing import Optional

import typer

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
HELP = "\n\n".join(" ".join(par.split()) for par in _HELP.split("\n\n"))


def expand(
    seeds: str = typer.Argument(..., help="The DP seed set: JSONL with 'text' (and 'id'; else the "
                                          "0-based row number), a dataset directory, or '-'."),
    num_samples: int = typer.Option(..., "--num-samples", "-N", min=1,
                                    help="Samples to keep (PrE-Text 4.1: 2,000,000)."),
    out: str = typer.Option(..., "--out", "-o", help="Output directory (shards + manifest.json)."),
    model: str = typer.Option("smollm2-135m", "--model", "-m", envvar="POPRI_GEN_MODEL",
                              help="Generator: alias smollm2-135m / gemma3-270m (offline), a local "
                                   "checkpoint or hub id (PrE-Text D.2: meta-llama/Llama-2-7b-hf)."),
    adapter: Optional[str] = typer.Option(None, "--adapter", help="PEFT LoRA adapter directory on "
                                          "top of --model."),
    backend: str = typer.Option("transformers", "--backend",
                                help="transformers (CPU/GPU) or vllm (GPU, PrE-Text D.2's engine; "
                                     "pip install 'popri\\[gpu]')."),
    adapter_mode: str = typer.Option("lora", "--adapter-mode", help="vllm: serve the adapter as a "
                                     "LoRARequest ('lora') or merge it first ('merge')."),
    seed: int = typer.Option(0, "--seed", help="Seeds the choice of examples and the sampling."),
    shard_size: int = typer.Option(10000, "--shard-size", min=1, help="Rows per shard file."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="Prompts per engine "
                                             "call (default: transformers 8, vllm 2048). Part of the "
                                             "config: it sets the chunks a shard is drawn in."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="PrE-Text D.2: 1.0."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="PrE-Text D.2: 1.0."),
    max_new_tokens: int = typer.Option(85, "--max-new-tokens", min=1, help="Tokens generated per "
                                       "sample (PrE-Text's expansion script: 85)."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Truncate samples to this many "
                                   "tokens (64: the private data's chunk length)."),
    min_words: int = typer.Option(4, "--min-words", min=0, help="Drop samples with fewer words."),
    attempt_factor: float = typer.Option(3.0, "--attempt-factor", min=1.0, help="Give up after "
                                         "this many prompts per wanted sample (per shard)."),
    allow_short: bool = typer.Option(False, "--allow-short", help="A shortfall exits 0 (warning)."),
    template: Optional[str] = typer.Option(None, "--template", help="Prompt template file "
                                           "({sample1}..{sample3} placeholders)."),
    bf16: bool = typer.Option(True, "--bf16/--no-bf16", help="bf16 autocast on CPU, bf16 weights "
                              "on GPU/vllm."),
    device: Optional[str] = typer.Option(None, "--device", help="transformers: cpu, cuda "
                                         "(default: cuda if available)."),
    merged_out: Optional[str] = typer.Option(None, "--merged-out", help="Also write all shards as "
                                             "one JSONL here ('-' = stdout)."),
    force: bool = typer.Option(False, "--force", help="Start over when DIR holds another "
                                                      "expansion (its shards are removed)."),
) -> None:
    from pathlib import Path

    from popri.core import log
    from popri.models.embed import text_records
    from popri.core.errors import InputError, PopriError
    from popri.methods.pe.expand import expand as run_expand
    from popri.methods.pe.expand import write_merged
    from popri.models.generation import BACKENDS
    from popri.core.io import STDIO

    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}; one of {', '.join(BACKENDS)}", field="backend")
    if adapter_mode not in ("lora", "merge"):
        raise InputError(f"unknown adapter mode {adapter_mode!r}; lora or merge", field="adapter-mode")
    if top_p <= 0:
        raise InputError("--top-p must be in (0, 1]", field="top-p")
    if adapter and not (Path(adapter) / "adapter_config.json").exists():
        raise InputError("not a PEFT adapter directory (no adapter_config.json)", path=adapter)
    if out == STDIO:
        raise InputError("--out is a directory; use --merged-out - for stdout", field="out")
    from popri.methods.pe.expand import MANIFEST, SHARD_RE
    from popri.core.guard import check_outputs

    # --out DIR's files: its manifest and shards (--force removes those there; a shard name
    # that --merged-out would take is one it will write)
    shards = {str(f) for f in Path(out).glob("shard-*.jsonl") if SHARD_RE.fullmatch(f.name)}
    if merged_out and merged_out != STDIO and SHARD_RE.fullmatch(Path(merged_out).name):
        shards.add(str(Path(out) / Path(merged_out).name))
    check_outputs([out, str(Path(out) / MANIFEST), *sorted(shards), merged_out],
                  [seeds, template, adapter, model if Path(model).exists() else None])
    from popri.models.generation import check_template, read_template

    tmpl = read_template(template, lambda t: check_template(t, 3))

    recs, src = text_records(seeds)
    manifest = run_expand(
        recs, num_samples=num_samples, out_dir=out, model=model, adapter=adapter, backend=backend,
        seed=seed, shard_size=shard_size, batch_size=batch_size, temperature=temperature,
        top_p=top_p, max_new_tokens=max_new_tokens, max_tokens=max_tokens, min_words=min_words,
        template=tmpl, bf16=bf16, device=device, adapter_mode=adapter_mode,
        attempt_factor=attempt_factor, force=force, source=src)
    c = manifest["counts"]
    rate = manifest["samples_per_s"]
    log.info(f"expand: {manifest['rows']}/{num_samples} samples in {manifest['shards_done']} "
             f"shard(s) under {out}; {c['prompts']} prompts, filtered {c['filtered'] or 0}, "
             f"{c['duplicates']} duplicates; {rate if rate is not None else 0:.2f} samples/s, "
             f"{manifest['tokens_per_s'] or 0:.1f} tokens/s")
    if manifest["status"] == "short":
        msg = (f"shortfall: {manifest['rows']} of {num_samples} samples after "
               f"--attempt-factor {attempt_factor:g} x the prompts of the last shard "
               f"(see {Path(out) / 'manifest.json'})")
        if not allow_short:
            raise PopriError(msg + "; --allow-short accepts it")
        log.warn(msg)
    if merged_out:
        write_merged(out, manifest, merged_out)
    if merged_out != STDIO:
        typer.echo(out)


def register(app: typer.Typer) -> None:
    app.command("expand", help=HELP)(expand)
