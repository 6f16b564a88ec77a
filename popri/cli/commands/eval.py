"""popri eval: downstream next-token accuracy, Frechet distance, and the "gap closed" figure
(library: popri/eval/downstream.py, popri/models/fid.py; settings: popri/specs/training.py
EvalSpec, GapSpec).

    popri eval accuracy --model runs/ds --data data/sotu --split test --per-client-out m.jsonl --json
    popri eval fid samples.jsonl data/sotu --split val
    popri eval fluency runs/x/round1/prefs.jsonl --json
    popri eval gap --method m.jsonl --eps0 e0.jsonl --epsinf ei.jsonl
    popri eval gap --acc 0.41 --eps0 0.35 --epsinf 0.45
"""

from __future__ import annotations

from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core import log
from popri.core.errors import InputError
from popri.core.guard import check_outputs
from popri.core.io import dumps, iter_jsonl, read_jsonl, write_jsonl
from popri.eval import fluency as F
from popri.eval import probe as P
from popri.eval.downstream import (
    control_diff,
    evaluate_next_token,
    gap_closed,
    gap_from_files,
    micro_accuracy,
    read_per_client,
)
from popri.eval.instruct import evaluate
from popri.models import llm
from popri.models.embed import as_embedding_set, check_compatible
from popri.models.fid import fid as fid_fn
from popri.specs.training import EvalSpec, GapSpec
from popri.cli.options import command
from popri.specs.commands.eval import (
    EvalAccuracyCall,
    EvalDiffCall,
    EvalFidCall,
    EvalFluencyCall,
    EvalGapCall,
    EvalInstructCall,
    EvalProbeCall,
    EvalQualityCall,
)
from popri.eval import quality as Q
from popri.eval.downstream import load_records

eval_app = typer.Typer(
    help="Utility of synthetic data: next-token accuracy of the downstream model (POPri / "
         "PrE-Text's metric), Frechet distance of embedding sets, and the share of the "
         "eps=0 -> eps=inf accuracy gap a method closes (POPri's headline figure).",
    no_args_is_help=True)

_ACC_HELP = """Next-token prediction accuracy and loss of a causal LM on a dataset split.

Each text is [BOS] + tokens + [EOS] cut to --max-length (POPri B.1); BOS is the tokenizer's
(its EOS if it has none; the tokenizer never adds one itself). A chat-turn marker (SmolLM2-Instruct's <|im_start|> / <|im_end|>) is replaced by <|endoftext|>, the
document separator of pretraining (eps=0 on SmolLM2, 400 sotu test records: 0.2825 accuracy with the markers, 0.2913 without).  Position j >= 1 is predicted
from positions < j: a sequence of n tokens has n - 1 targets -- BOS is never a target, padding
never counts, the EOS counts unless --no-count-eos (the POPri and PrE-Text evaluation code count
it; a text filling the window has no EOS).  accuracy = argmax hits / targets and loss = mean
cross-entropy, micro-averaged over all targets; macro_accuracy averages per client;
accuracy_se is the standard deviation of the micro accuracy over --bootstrap resamples of the
test clients (records without client_id are each a client).  --per-client-out writes
{client_id, tokens, correct, loss_sum, sequences} per client for paired comparisons
('popri eval gap').  stdout: one summary line, or the JSON object with --json."""


@command(EvalAccuracyCall)
def accuracy(
    model: str, adapter: Optional[str], data: str, split: str, seed: int,
    per_client_out: Optional[str], json_out: bool, *, spec: EvalSpec
) -> None:
    from pathlib import Path

    check_outputs([per_client_out], [data, adapter, model if Path(model).exists() else None])
    res = evaluate_next_token(model, data, spec, adapter=adapter, split=split, seed=seed)
    per = res.pop("per_client")
    # timings go to stderr only, so the JSON result is reproducible byte for byte
    seconds, rate = res.pop("seconds"), res.pop("tokens_per_s")
    log.info(f"eval: {res['tokens']} tokens in {seconds:.1f}s ({rate} tokens/s), "
             + llm.compute_words(spec.bf16, llm.default_device()))
    if per_client_out:
        write_jsonl(per, per_client_out)
    if json_out:
        typer.echo(dumps(res))
    else:
        se = f" +- {res['accuracy_se']:.4f}" if res["accuracy_se"] is not None else ""
        typer.echo(f"accuracy {res['accuracy']:.4f}{se}  loss {res['loss']:.4f}  tokens "
                   f"{res['tokens']}  clients {res['clients']}  model {res['model']}")


@command(EvalFidCall)
def fid(a: str, b: str, split: str, model: Optional[str], normalize: bool, json_out: bool) -> None:
    """Frechet distance between Gaussians fitted to two embedding sets (FID on sentence
    embeddings; popri.models.fid).  Prints the number, or JSON with --json."""
    sa = as_embedding_set(a, model=model, normalize=normalize, split=split, what="A")
    sb = as_embedding_set(b, model=model, normalize=normalize, split=split, what="B")
    check_compatible(sa, sb)
    for s, p in ((sa, a), (sb, b)):
        if len(s) < 2:
            raise InputError(f"need at least 2 rows for a covariance, got {len(s)}", path=p)
    d = fid_fn(sa.embeddings, sb.embeddings)
    if json_out:
        typer.echo(dumps({"fid": d, "n_a": len(sa), "n_b": len(sb), "dim": sa.dim,
                          "model": sa.meta.get("model") or sb.meta.get("model") or model,
                          "a": sa.source, "b": sb.source}))
    else:
        typer.echo(f"{d:.6f}")


def _number_or_file(v: str):
    try:
        return float(v)
    except ValueError:
        return None


@command(EvalGapCall)
def gap(
    method: str, eps0: str, epsinf: str, seed: int, json_out: bool, control: Optional[str], *,
    spec: GapSpec
) -> None:
    """Gap closed = (acc - acc_eps0) / (acc_epsinf - acc_eps0), POPri's headline metric.

    Give three numbers, or three per-client files from 'popri eval accuracy --per-client-out'
    on the same test clients: then the accuracies are recomputed from them and a paired
    bootstrap over test clients (the same resample for all three) gives gap_closed_se and a
    95% percentile interval."""
    import math

    nums = [_number_or_file(v) for v in (method, eps0, epsinf)]
    if all(n is not None for n in nums):
        g = gap_closed(*nums)
        if math.isnan(g) and not spec.allow_undefined:
            raise InputError("eps=inf and eps=0 accuracies are equal: the gap is undefined",
                             field="epsinf")
        res = {"gap_closed": None if math.isnan(g) else g, "gap_closed_se": None, "acc": nums[0],
               "acc_eps0": nums[1], "acc_epsinf": nums[2]}
    elif control is not None and not all(n is None for n in nums):
        raise InputError("--control needs the per-client files, not numbers", field="--control")
    elif all(n is None for n in nums):
        res = gap_from_files(method, eps0, epsinf, n_boot=spec.bootstrap, seed=seed,
                             allow_undefined=spec.allow_undefined, control=control)
    else:
        raise InputError("give --method/--eps0/--epsinf all as numbers or all as per-client files")
    if json_out:
        typer.echo(dumps(res))
    elif res["gap_closed"] is None:
        typer.echo(f"gap closed undefined: eps=0 and eps=inf both {res['acc_eps0']:.4f} (acc "
                   f"{res['acc']:.4f})")
    else:
        se = f" +- {res['gap_closed_se']:.4f}" if res.get("gap_closed_se") is not None else ""
        typer.echo(f"gap closed {res['gap_closed']:.4f}{se}  (acc {res['acc']:.4f}, eps0 "
                   f"{res['acc_eps0']:.4f}, epsinf {res['acc_epsinf']:.4f})")


@command(EvalInstructCall)
def instruct(
    model: str, data: str, split: str, max_samples: Optional[int], max_new_tokens: int,
    max_length: int, no_generate: bool, bf16: bool, bootstrap: int, seed: int,
    per_client_out: Optional[str], json_out: bool
) -> None:
    """Instruction-following utility: response-token accuracy (teacher-forced argmax on the
    reference response after the Alpaca prompt) and Rouge-L of the greedy response to the
    reference, with bootstrap SEs over test clients. FewFedPIT (arXiv:2403.06131, 4.1) uses a
    GPT-4 judge, which does not run offline: these two stand in for it."""
    from pathlib import Path

    check_outputs([per_client_out], [data, model if Path(model).exists() else None])
    res = evaluate(model, data, split, max_samples=max_samples, max_new_tokens=max_new_tokens,
                   max_length=max_length, bf16=bf16, bootstrap=bootstrap, seed=seed,
                   generate=not no_generate)
    per = res.pop("per_client")
    log.info(f"eval instruct: {res['examples']} examples in {res.pop('seconds'):.1f}s")
    if per_client_out:
        write_jsonl(per, per_client_out)
    if json_out:
        typer.echo(dumps(res))
    else:
        f = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
        typer.echo(f"response-token accuracy {f(res['accuracy'])} +- {f(res['accuracy_se'])}  "
                   f"Rouge-L {f(res['rouge_l'])} +- {f(res['rouge_l_se'])}  examples "
                   f"{res['examples']}  clients {res['clients']}  model {res['model']}")


@command(EvalDiffCall)
def diff(method: str, control: str, bootstrap: int, seed: int, json_out: bool) -> None:
    """The method's accuracy minus its control's, paired over the same test clients (one
    bootstrap resample of clients for both), with the SE and a 95% percentile interval: e.g.
    POPri minus its untuned generator (T = 0), what the DP feedback and DPO bought."""
    res = {"acc": micro_accuracy(read_per_client(method)),
           **control_diff(method, control, n_boot=bootstrap, seed=seed),
           "bootstrap": int(bootstrap), "seed": int(seed)}
    if json_out:
        typer.echo(dumps(res))
    else:
        se = res["acc_minus_control_se"]
        typer.echo(f"{res['acc_minus_control']:+.4f}" + (f" +- {se:.4f}" if se is not None else "")
                   + f"  (acc {res['acc']:.4f}, control {res['acc_control']:.4f})")


@command(EvalProbeCall)
def probe(
    samples: str, target: str, split: str, model: Optional[str], embed_model: Optional[str],
    bf16: bool, seed: int, json_out: bool
) -> None:
    """A generator's fixed-prompt sample against the private validation split (popri/eval/
    probe.py): mean-embedding cosine and unbiased MMD^2 (RBF, median bandwidth) with bootstrap
    SEs, the public model's perplexity (fluency), distinct-1/2 and the mean pairwise cosine
    (diversity).  Reads the private validation embeddings without noise: the output says
    private_diagnostic true (a research measurement, never a release)."""
    recs = read_jsonl(samples, ("text",))
    texts = [r["text"] for r in recs]
    if len(texts) < 2:
        raise InputError(f"need at least 2 samples, got {len(texts)}", path=samples)
    sa = as_embedding_set(samples, records=recs, model=embed_model, what="samples")
    tb = as_embedding_set(target, model=embed_model, split=split, what="target")
    check_compatible(sa, tb)
    res = {"private_diagnostic": True, "note": "reads the private validation split without "
           "noise: a research measurement, never a release",
           **P.distances(sa.embeddings, tb.embeddings, seed=seed),
           "distinct_1": P.distinct_n(texts, 1), "distinct_2": P.distinct_n(texts, 2)}
    if model:
        res |= {"ppl_model": model, **P.perplexity(model, texts, bf16=bf16)}
    if json_out:
        typer.echo(dumps(res))
    else:
        typer.echo(f"mean cosine {res['mean_cosine']:.4f} +- {res['mean_cosine_se']:.4f}  MMD^2 "
                   f"{res['mmd2']:.5f} +- {res['mmd2_se']:.5f}  distinct-1/2 "
                   f"{res['distinct_1']:.3f}/{res['distinct_2']:.3f}"
                   + (f"  perplexity {res['perplexity']:.2f}" if model else ""))


@command(EvalFluencyCall)
def fluency(
    samples: str, model: str, adapter: Optional[str], max_tokens: int, batch_size: int, bf16: bool,
    out: Optional[str], json_out: bool
) -> None:
    """Per-text fluency of synthetic samples under the public model (popri/eval/fluency.py):
    mean next-token NLL of the text alone (its first --max-tokens tokens), words, distinct-2
    and a degenerate flag (fewer than 3 words, or a loop: half its word trigrams repeat); the
    set's mean NLL, perplexity, quantiles and degenerate share.  Given preference pairs, the
    same for the chosen and the rejected texts and their paired difference: is DPO taught that
    the less fluent text is the better one?  Post-processing of public samples: releases
    nothing about the clients."""
    recs = list(iter_jsonl(samples, locate=True))
    if not recs:
        raise InputError("no records", path=samples)
    pairs = "chosen" in recs[0] or "rejected" in recs[0]
    fields = ("chosen", "rejected") if pairs else ("text",)
    for r in recs:
        for f in fields:
            if not isinstance(r.get(f), str):
                raise InputError("missing or not a string" if f in r else "missing required field",
                                 path=samples, line=r.get("_line"), field=f)
    texts = [r[f] for r in recs for f in fields]
    nll, cnt = F.text_nll(model, texts, adapter=adapter, bf16=bf16, batch_size=batch_size,
                          max_tokens=max_tokens)
    rows = F.per_text(texts, nll, cnt)
    res: dict = {"model": model, "adapter": adapter, "max_tokens": int(max_tokens),
                 "public": True}
    if pairs:
        ch, rj = rows[0::2], rows[1::2]
        res |= {"chosen": F.summary(ch), "rejected": F.summary(rj), **F.paired(ch, rj)}
        per = [{"pair": k, "prompt_id": r.get("prompt_id"),
                **{f"chosen_{a}": v for a, v in c.items() if a != "id"},
                **{f"rejected_{a}": v for a, v in j.items() if a != "id"}}
               for k, (r, c, j) in enumerate(zip(recs, ch, rj))]
    else:
        res |= F.summary(rows)
        per = [{**row, "id": r.get("id", k)} for k, (r, row) in enumerate(zip(recs, rows))]
    if out:
        write_jsonl(per, out)
    if json_out:
        typer.echo(dumps(res))
    elif pairs:
        se = res["nll_chosen_minus_rejected_se"]
        typer.echo(f"NLL chosen {res['chosen']['mean_nll']:.3f} rejected "
                   f"{res['rejected']['mean_nll']:.3f}  chosen minus rejected "
                   f"{res['nll_chosen_minus_rejected']:+.3f}"
                   + (f" +- {se:.3f}" if se is not None else "")
                   + f"  chosen less fluent in {res['chosen_less_fluent']} of "
                     f"{res['scored_pairs']} pairs")
    else:
        typer.echo(f"mean NLL {res['mean_nll']:.3f}  perplexity {res['perplexity']:.1f}  "
                   f"degenerate {res['degenerate_share']:.3f}  texts {res['texts']}")


@command(EvalQualityCall)
def quality(
    samples: str, samples_split: str, reference: str, split: str,
    max_reference: Optional[int], reference_seed: Optional[int], model: str,
    embed_model: Optional[str], sizes: Optional[tuple], bf16: bool, seed: int, json_out: bool
) -> None:
    """MAUVE of a synthetic set against reference text on a language model's features (the
    downstream model's, not the reward's embedder), and the set's diversity: distinct-1/2/3,
    the mean pairwise cosine and spread of its sentence embeddings (popri/eval/quality.py);
    with --sizes, also at each prefix of the set.  The reference of 'popri run' is the private
    test split: the output says private_diagnostic true (a research read, never a release)."""
    recs, src = load_records(samples, samples_split)
    texts = [r["text"] for r in recs]
    if len(texts) < 2:
        raise InputError(f"need at least 2 samples, got {len(texts)}", path=src)
    ref, ref_src = load_records(reference, split, max_samples=max_reference,
                                sample_seed=reference_seed)
    if len(ref) < 2:
        raise InputError(f"need at least 2 reference records, got {len(ref)}", path=ref_src)
    try:
        sizes = tuple(int(x) for v in (sizes or ()) for x in str(v).split(",") if x.strip())
    except ValueError:
        raise InputError(f"expects comma-separated sample counts, got {sizes!r}",
                         field="sizes") from None
    if sizes and any(n < 2 or n > len(texts) for n in sizes):
        raise InputError(f"every size must be in 2 .. {len(texts)} (the samples), got "
                         f"{', '.join(map(str, sizes))}", field="sizes")
    feats, ref_feats = Q.lm_features_of(model, [texts, [r["text"] for r in ref]], bf16=bf16)
    emb = as_embedding_set(samples, records=recs, model=embed_model, what="samples").embeddings
    rows = Q.set_quality(texts, feats, ref_feats, emb, [*(sizes or ()), len(texts)], seed=seed)
    res = {"private_diagnostic": True, "note": "MAUVE reads the reference (popri run: the "
           "private test split) without noise: a research measurement, never a release",
           "samples": src, "reference": ref_src, "n_reference": len(ref),
           "reference_seed": reference_seed, "features": f"{model}: final hidden state, last "
           "token", "seed": seed, **rows[-1], "sizes": rows}
    if json_out:
        typer.echo(dumps(res))
    else:
        for r in rows:
            typer.echo(f"n {r['n']}: MAUVE {Q.fmt(r['mauve'])}  distinct-1/2/3 "
                       f"{Q.fmt(r['distinct_1'], 3)}/{Q.fmt(r['distinct_2'], 3)}/"
                       f"{Q.fmt(r['distinct_3'], 3)}  self-cosine {Q.fmt(r['self_cosine'], 3)}")


def register(app: typer.Typer) -> None:
    eval_app.command("accuracy", help=unwrap(_ACC_HELP.strip()))(accuracy)
    eval_app.command("probe", help=unwrap(probe.__doc__.strip()))(probe)
    eval_app.command("fluency", help=unwrap(fluency.__doc__.strip()))(fluency)
    eval_app.command("diff", help=unwrap(diff.__doc__.strip()))(diff)
    eval_app.command("fid", help=unwrap(fid.__doc__.strip()))(fid)
    eval_app.command("gap", help=unwrap(gap.__doc__.strip()))(gap)
    eval_app.command("instruct", help=unwrap(instruct.__doc__.strip()))(instruct)
    eval_app.command("quality", help=unwrap(quality.__doc__.strip()))(quality)
    app.add_typer(eval_app, name="eval")
