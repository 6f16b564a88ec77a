"""popri vary: Private Evolution's Variation API (library: popri/methods/pe/variation.py).

    popri vary runs/pe/round1/survivors.jsonl --method mask-fill --round 2 --seed 0 --out pop2.jsonl
    popri vary pop.jsonl --lookahead 4 --lookahead-out la.npy --out - | head
    popri gen omega.jsonl -K 4 -J 2 | popri vary - --method paraphrase --variations 2
"""

from __future__ import annotations

from typing import Optional

import typer

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
HELP = "\n\n".join(" ".join(par.split()) for par in _HELP.split("\n\n"))


def vary(
    input: str = typer.Argument(..., help="JSONL with 'text' (and 'id'), or '-' for stdin."),
    method: str = typer.Option("mask-fill", "--method", help="mask-fill (PrE-Text) or "
                               "paraphrase (Aug-PE)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="mask-fill: masked LM "
                                        "(default roberta-large, PrE-Text D.2). paraphrase: causal "
                                        "LM (default smollm2-135m)."),
    variations: int = typer.Option(1, "--variations", "-V", min=1,
                                   help="Variations per input written to --out (PE: 1)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seeds masks, fills and sampling."),
    round_: int = typer.Option(0, "--round", min=0, help="Round number, recorded in every row."),
    out: str = typer.Option("-", "--out", "-o", help="Variations JSONL ('-' = stdout)."),
    lookahead: int = typer.Option(0, "--lookahead", "-K", min=0, help="K variations per input "
                                  "averaged in embedding space (PrE-Text lookahead; 0 = off)."),
    lookahead_out: Optional[str] = typer.Option(None, "--lookahead-out", help="SET.npy for the "
                                                "lookahead means (with --lookahead)."),
    embedder: Optional[str] = typer.Option(None, "--embedder", envvar="POPRI_EMBED_MODEL",
                                           help="Sentence embedder for --lookahead (default "
                                                "all-MiniLM-L6-v2, PrE-Text D.2)."),
    mask_ratio: float = typer.Option(0.3, "--mask-ratio", help="MASK%: share of tokens masked "
                                     "per step (PrE-Text D.2: 30%)."),
    steps: int = typer.Option(2, "--steps", min=1, help="W_steps mask-fill rounds (PrE-Text D.2: "
                              "2)."),
    fill: str = typer.Option("parallel", "--fill", help="parallel (one forward pass per step) or "
                             "sequential (PrE-Text's code: one per mask)."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="0 = argmax (PrE-Text "
                                      "D.2: 1.0)."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="Nucleus sampling "
                                "(PrE-Text D.2: 1.0)."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Texts cut to this many "
                                   "tokens (PrE-Text seq_len / POPri trunc_len 64)."),
    max_new_tokens: int = typer.Option(85, "--max-new-tokens", min=1, help="paraphrase: tokens "
                                       "generated (as popri gen)."),
    min_words: int = typer.Option(3, "--min-words", min=0, help="paraphrase: shorter is "
                                  "degenerate."),
    max_retries: int = typer.Option(2, "--max-retries", min=0, help="paraphrase: regenerations "
                                    "of a degenerate one."),
    template: Optional[str] = typer.Option(None, "--template", help="paraphrase prompt file with "
                                           "{text}."),
    chat: Optional[bool] = typer.Option(None, "--chat/--no-chat", help="paraphrase: the model's "
                                        "chat template (default: when it has one) or the plain "
                                        "prompt."),
    adapter: Optional[str] = typer.Option(None, "--adapter", help="paraphrase: PEFT LoRA adapter "
                                          "directory on top of --model."),
    fallback: bool = typer.Option(True, "--fallback/--no-fallback", help="mask-fill without a "
                                  "loadable MLM: paraphrase instead (warned) or exit 3."),
    fallback_model: str = typer.Option("smollm2-135m", "--fallback-model", help="Causal LM of "
                                       "the fallback."),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="Sequences per forward pass / "
                                   "generate() call."),
    bf16: bool = typer.Option(True, "--bf16/--no-bf16", help="bf16 autocast on CPU, bf16 weights "
                              "on GPU."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu, cuda, cuda:1 (default: "
                                         "cuda if available)."),
    stats_out: Optional[str] = typer.Option(None, "--stats-out", help="Counts, fallback and "
                                            "timings as JSON."),
) -> None:
    import json
    import time
    from pathlib import Path

    from popri.core import log
    from popri.core.errors import InputError
    from popri.core.io import STDIO, AtomicOutputs, dumps, save_embedding_set, write_jsonl
    from popri.methods.pe.variation import (
        FILL_MODES,
        METHODS,
        check_paraphrase_template,
        lookahead_means,
        variation_rows,
    )
    from popri.methods.pe.variation import vary as run_vary

    t_start = time.perf_counter()
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; one of {', '.join(METHODS)}", field="method")
    if fill not in FILL_MODES:
        raise InputError(f"unknown fill {fill!r}; one of {', '.join(FILL_MODES)}", field="fill")
    if not 0 < mask_ratio <= 1:
        raise InputError(f"--mask-ratio must be in (0, 1] (got {mask_ratio})", field="mask-ratio")
    if top_p <= 0:
        raise InputError("--top-p must be in (0, 1]", field="top-p")
    if lookahead and not lookahead_out:
        raise InputError("--lookahead K needs --lookahead-out SET.npy", field="lookahead-out")
    if lookahead_out and not lookahead:
        raise InputError("--lookahead-out needs --lookahead K >= 1", field="lookahead")
    if lookahead_out and not lookahead_out.endswith(".npy"):
        raise InputError("must end in .npy (an embedding set)", path=lookahead_out,
                         field="lookahead-out")
    if stats_out == STDIO or lookahead_out == STDIO:
        raise InputError("stdout carries the variations; give a file name",
                         field="stats-out" if stats_out == STDIO else "lookahead-out")
    if adapter and not (Path(adapter) / "adapter_config.json").exists():
        raise InputError("not a PEFT adapter directory (no adapter_config.json)", path=adapter)
    from popri.core.guard import check_outputs

    check_outputs([out, stats_out, lookahead_out],
                  [input, template, adapter,
                   *(m for m in (model, embedder, fallback_model) if m and Path(m).exists())],
                  companions="embeddings")
    from popri.models.generation import read_template

    tmpl = read_template(template, check_paraphrase_template)

    ids, texts, src = _read(input)
    n_per = max(variations, lookahead)
    res = run_vary(texts, method=method, model=model, n_per=n_per, seed=seed, fallback=fallback,
                   fallback_model=fallback_model, mask_ratio=mask_ratio, steps=steps, fill=fill,
                   temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                   max_new_tokens=max_new_tokens, min_words=min_words, max_retries=max_retries,
                   template=tmpl, chat=chat, adapter=adapter, batch_size=batch_size, bf16=bf16,
                   device=device)
    rows = variation_rows(ids, res, variations, round_)
    stats = {"input": src, "inputs": len(texts), "variations": variations,
             "lookahead": lookahead, "generated_per_input": n_per, "rows": len(rows),
             "method": res["method"], "model": res["model"], **res["stats"],
             "params": {"seed": seed, "round": round_, "mask_ratio": mask_ratio, "steps": steps,
                        "fill": fill, "temperature": temperature, "top_p": top_p,
                        "max_tokens": max_tokens, "max_new_tokens": max_new_tokens,
                        "min_words": min_words, "max_retries": max_retries,
                        "template": template or "builtin", "chat": chat,
                        "batch_size": batch_size, "bf16": bf16}}
    la = None
    if lookahead:
        from popri.models.embed import model_meta

        t0 = time.perf_counter()
        emb = lookahead_means(res["texts"], lookahead, embedder=embedder)
        la = (emb, [{"id": i, "text": t} for i, t in zip(ids, texts)],
              {**model_meta(embedder, True), "lookahead": lookahead, "method": res["method"],
               "variation_model": res["model"], "seed": seed, "round": round_,
               "mean_of": "L2-normalised embeddings of variations 0..K-1 (not re-normalised)"})
        stats["embed_seconds"] = round(time.perf_counter() - t0, 3)
    stats["total_seconds"] = round(time.perf_counter() - t_start, 3)
    with AtomicOutputs() as staged:
        if out != STDIO:
            with open(staged.path(out), "w", encoding="utf-8") as fh:
                fh.writelines(dumps(r) + "\n" for r in rows)
        if la is not None:
            save_embedding_set(lookahead_out, *la, out=staged)
        if stats_out:
            with open(staged.path(stats_out), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(stats, indent=2) + "\n")
    if out == STDIO:
        write_jsonl(rows, STDIO)
    fb = stats["fallback"]
    log.info(f"vary: {len(rows)} variations of {len(texts)} inputs by {res['method']} "
             f"({res['model']})" + (f", {n_per} per input for lookahead K={lookahead}"
                                     if lookahead else "")
             + (f"; fell back from mask-fill ({fb['from_model']})" if fb else "")
             + (f"; {stats['kept_degenerate']} still degenerate (kept, flagged)"
                if "kept_degenerate" in stats else "")
             + f"; {stats['total_seconds']:.1f}s")


def _read(path: str):
    """(ids, texts, source) of the input JSONL; ids unique, errors located."""
    from popri.core.errors import InputError
    from popri.core.io import iter_jsonl

    ids, texts, first = [], [], {}
    for pos, r in enumerate(iter_jsonl(path, required=("text",), locate=True)):
        line = r["_line"]
        rid = r.get("id", str(pos))
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise InputError("must be a string or an integer", path=path, line=line, field="id")
        if str(rid) in first:
            raise InputError(f"duplicate id {rid!r} (first on line {first[str(rid)]}); variation "
                             "ids are '<id>-v<k>' and must be unique", path=path, line=line,
                             field="id")
        first[str(rid)] = line
        ids.append(rid)
        texts.append(r["text"])
    if not texts:
        raise InputError("no samples to vary", path=path)
    return ids, texts, path


def register(app: typer.Typer) -> None:
    app.command("vary", help=HELP)(vary)
