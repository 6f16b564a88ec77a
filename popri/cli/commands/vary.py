"""popri vary: Private Evolution's Variation API (library: popri/methods/pe/variation.py,
settings: popri/specs/generation.py VarySpec).

    popri vary runs/pe/round1/survivors.jsonl --method mask-fill --round 2 --seed 0 --out pop2.jsonl
    popri vary pop.jsonl --lookahead 4 --lookahead-out la.npy --out - | head
    popri gen omega.jsonl -K 4 -J 2 | popri vary - --method paraphrase --variations 2
"""

from __future__ import annotations

from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core import log
from popri.methods.pe.variation import vary_file
from popri.specs.generation import VarySpec
from popri.cli.options import command
from popri.specs.commands.vary import VaryCall

_HELP = """Variations of text samples: PrE-Text's mask-fill or Aug-PE's LLM paraphrase
(PE 'Variation', PrE-Text Algorithm 1 line 9).

INPUT: JSONL with 'text' (and 'id'; its position when missing), e.g. 'popri gen' samples or 'popri
pe draw' survivors, or '-' (stdin). Ids must be unique: a variation's id is '<id>-v<k>'.

--method mask-fill (default; PrE-Text section 3 (4) and appendix D.2): the text is cut to
--max-tokens (64, PrE-Text's seq_len) tokens of the masked LM's tokenizer; each of --steps (2,
W_steps) steps masks --mask-ratio (0.3, MASK%) of the tokens (rounded, at least one; chosen
uniformly) and fills them from softmax(logits / --temperature) with nucleus --top-p (both 1.0,
D.2). --fill parallel (default) fills every mask of a step from one forward pass, positions
independently (Aug-PE's MLM variation); --fill sequential is PrE-Text's reference code: one mask per
forward pass in random order, each conditioned on the ones already filled (~19x the passes at 64
tokens). Special tokens are never drawn. --model: a masked LM, local directory or hub id (default
roberta-large, PrE-Text section 4; needs the network or the local hub cache).

Fallback: if the masked LM cannot be loaded (offline, not cached, not an MLM) a warning names it and
--method paraphrase runs with --fallback-model (smollm2-135m, offline); --no-fallback makes that an
error (exit 3). Each row's "method" and "model" say what actually ran.

--method paraphrase (Aug-PE's rephrase variation): a causal LLM (--model, default smollm2-135m;
alias, local checkpoint or hub id; --adapter LoRA on top) rewrites each text. Prompt: with a chat
model (default when its tokenizer has a chat template; --chat/--no-chat to force) the user message
"Rephrase the following text, keeping its meaning and style. Reply with the rephrased text
only.\\n\\n{text}" in the chat template, the reply running to the end of the turn; otherwise the
plain "Please rephrase the following text, keeping its meaning and style:\\nText:
{text}\\nRephrased text:", cut at a blank line. --template FILE with {text} replaces the message /
prompt. Measured on 16 SOTU chunks (seed 1, temperature 1.0): SmolLM2-135M-Instruct's paraphrases
had mean cosine 0.59 to their input (all-MiniLM-L6-v2; 10/16 >= 0.5; 2 copies regenerated) with the
chat template against 0.40 (4/16; 3 empty and 1 copy regenerated) with the plain prompt, whose
outputs often commented on the text instead. Generation as 'popri gen': batched, temperature/top-p
1.0, --max-new-tokens 85; a lead-in such as "Here's the rephrased text:" dropped, one paragraph
kept, whitespace-normalised, truncated to --max-tokens; degenerate ones (empty, short, repetitive,
a copy of the text) regenerated up to --max-retries times, then kept with "degenerate": true.

--variations V (1): rows written per input. --lookahead K (PrE-Text 'Lookahead', Lin et al. 2023)
also embeds K variations per input (--embedder, default all-MiniLM-L6-v2, PrE-Text D.2) and writes
their mean, one row per INPUT id, as the embedding set --lookahead-out SET.npy (+ .jsonl, .meta.json
with lookahead, method, variation_model; "model" is the embedder) for 'popri score --mode
nn-histogram --synthetic SET.npy'. The first V of those K variations are the --out rows (no extra
work): variation k of input i is seeded from (--seed, i, k) only, so it is the same whether or not
--lookahead is given.

Output: JSONL on stdout or --out (atomic), input order, V rows per input: {"id": "<id>-v<k>",
"parent_id", "round", "variation_idx", "text", "method", "model"} (+ "adapter", + "degenerate").
Same inputs + --seed give byte-identical files (same machine, --threads and --batch-size under
bf16).
Counts, fallback and timings go to stderr and --stats-out. Variation only post-processes public or
already-released samples: it spends no privacy and writes no ledger entry."""


@command(VaryCall)
def vary(
    input: str, seed: int, round_: int, out: str, lookahead_out: Optional[str],
    template: Optional[str], adapter: Optional[str], device: Optional[str],
    stats_out: Optional[str], *, spec: VarySpec
) -> None:
    st = vary_file(input, spec, out=out, lookahead_out=lookahead_out, stats_out=stats_out,
                   template=template, adapter=adapter, seed=seed, round_no=round_,
                   device=device)
    fb = st["fallback"]
    log.info(f"vary: {st['rows']} variations of {st['inputs']} inputs by {st['method']} "
             f"({st['model']})" + (f", {st['generated_per_input']} per input for lookahead "
                                   f"K={spec.lookahead}" if spec.lookahead else "")
             + (f"; fell back from mask-fill ({fb['from_model']})" if fb else "")
             + (f"; {st['kept_degenerate']} still degenerate (kept, flagged)"
                if "kept_degenerate" in st else "")
             + f"; {st['total_seconds']:.1f}s")


def register(app: typer.Typer) -> None:
    app.command("vary", help=unwrap(_HELP))(vary)
