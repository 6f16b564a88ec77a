"""popri take: the first samples of a synthetic set whose tokens reach a budget (library:
popri/data/records.py first_by_tokens).

    popri take runs/x/synthetic_pool.jsonl --tokens-of runs/x/synthetic_t0.jsonl -o runs/x/synthetic.jsonl
    popri gen data/public --num-samples 300 | popri take - --tokens 4096 > set.jsonl
    popri take runs/x/synthetic_tuned.jsonl --mix-from runs/x/synthetic_t0.jsonl --share 0.25 -o runs/x/synthetic.jsonl
"""

from __future__ import annotations

import json
from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core import log
from popri.core.errors import InputError
from popri.core.guard import check_outputs
from popri.core.io import STDIO, AtomicOutputs, dumps, iter_jsonl, write_jsonl
from popri.data.records import first_by_tokens, mix_by_prompt
from popri.models import llm
from popri.cli.options import command
from popri.specs.commands.take import TakeCall

HELP = """The first samples of SAMPLES whose tokens reach a budget: a synthetic set sized in text,
not in samples.

--tokens B, or --tokens-of REF (the total tokens of REF's texts). Tokens are counted with
--tokenizer (the downstream model's: what it trains on), without special tokens. The output is
the shortest prefix of SAMPLES (in file order: 'popri gen' writes prompt by prompt, so a prefix
is a set of whole prompts' samples but the last) whose tokens reach the budget; a SAMPLES file
that falls short is kept whole, and the shortfall is said on stderr and in --stats-out
("reached": false).

Why (issue 44, docs/results.md): a tuned generator that writes shorter samples hands the
downstream model less text at equal N than its untuned control; 'popri run' with
final_match_tokens: true draws the method's final set from a pool of 3 N and cuts it here to
its T = 0 control's token count. Samples and REF are synthetic (public) text: no privacy cost.

--mix-from OTHER --share S (issue 67, a popri remedy beyond POPri): instead of a budget, the
samples of round(S x P) of SAMPLES' P prompts (a permutation seeded by --seed) are replaced by
OTHER's samples of the same prompt ids: 'popri run' with final_untuned_share: S mixes the tuned
generator's final set with its untuned T = 0 control's, written from the same prompts and
seeds. Each record gains "mixed_from" ("samples" or "other"). Public text: no privacy cost.

Output: the kept records, unchanged, as JSONL on stdout or --out (atomic)."""


@command(TakeCall)
def take(
    samples: str, tokens: Optional[int], tokens_of: Optional[str], mix_from: Optional[str],
    share: Optional[float], seed: int, tokenizer: str, out: str, stats_out: Optional[str]
) -> None:
    if sum(x is not None for x in (tokens, tokens_of, mix_from)) != 1:
        raise InputError("give exactly one of --tokens B, --tokens-of REF and --mix-from OTHER",
                         field="tokens")
    if (share is None) != (mix_from is None):
        raise InputError("--share goes with --mix-from (and --mix-from needs it)", field="share")
    if stats_out == STDIO:
        raise InputError("stdout carries the samples; give a file name", field="stats-out")
    check_outputs([out, stats_out], [samples, tokens_of, mix_from])
    if mix_from is not None:
        return _mix(samples, mix_from, float(share), seed, out, stats_out)

    def texts(path: str) -> list[dict]:
        recs = list(iter_jsonl(path, locate=True))
        for r in recs:
            if not isinstance(r.get("text"), str):
                raise InputError("missing or not a string" if "text" in r else
                                 "missing required field", path=path, line=r.get("_line"),
                                 field="text")
        return recs

    recs = texts(samples)
    ref = texts(tokens_of) if tokens_of is not None else None

    tok = llm.load_tokenizer(tokenizer)

    def count(rs: list[dict]) -> list[int]:
        if not rs:
            return []
        ids = tok([r["text"] for r in rs], add_special_tokens=False)["input_ids"]
        return [len(x) for x in ids]

    budget = int(tokens) if tokens is not None else sum(count(ref))
    counts = count(recs)
    n = first_by_tokens(counts, budget)
    kept = recs[:n]
    got = sum(counts[:n])
    stats = {"budget": budget, "budget_of": tokens_of, "tokenizer": tokenizer,
             "pool": len(recs), "kept": n, "tokens": got, "reached": got >= budget,
             **({"ref_samples": len(ref)} if ref is not None else {})}
    for r in kept:
        r.pop("_line", None)
        r.pop("_path", None)
    _write(kept, stats, out, stats_out)
    msg = (f"take: {n} of {len(recs)} samples, {got} tokens for a budget of {budget}"
           + (f" ({tokens_of}'s {len(ref)} samples)" if ref is not None else ""))
    if got < budget:
        log.warn(msg + f": SAMPLES falls short by {budget - got} tokens, kept whole")
    else:
        log.info(msg)


def _write(kept: list[dict], stats: dict, out: str, stats_out: str | None) -> None:
    with AtomicOutputs() as staged:
        if out != STDIO:
            with open(staged.path(out), "w", encoding="utf-8") as fh:
                fh.writelines(dumps(r) + "\n" for r in kept)
        if stats_out:
            with open(staged.path(stats_out), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(stats, indent=2) + "\n")
    if out == STDIO:
        write_jsonl(kept, STDIO)


def _mix(samples: str, other: str, share: float, seed: int, out: str,
         stats_out: str | None) -> None:
    """``--mix-from``: :func:`popri.data.records.mix_by_prompt`."""
    mixed, stats = mix_by_prompt(list(iter_jsonl(samples, locate=True)),
                                 list(iter_jsonl(other, locate=True)), share, seed,
                                 path=samples, other_path=other)
    stats |= {"samples_path": samples, "other_path": other}
    _write(mixed, stats, out, stats_out)
    log.info(f"take: {stats['prompts_from_other']} of {stats['prompts']} prompts from {other} "
             f"({stats['samples_from_other']} of {stats['samples']} samples)")


def register(app: typer.Typer) -> None:
    app.command("take", help=unwrap(HELP))(take)
