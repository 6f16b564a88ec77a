"""Utility of an instruction-tuned checkpoint: response-token accuracy and Rouge-L of the greedy
response to the reference (``popri eval instruct``).

    popri eval instruct --model runs/ffp/fl/round3/model --data data/instruct-debian --split test --json

FewFedPIT (arXiv:2403.06131, section 4.1) judges responses with GPT-4 against reference answers;
no judge model runs offline here, so popri reports two automatic stand-ins, and says so:

- **response-token accuracy**: teacher-forced, the share of the reference response's tokens
  (+ EOS) that are the model's argmax after [BOS] + the Alpaca prompt + the reference so far
  (micro-averaged; the loss is their mean cross-entropy);
- **Rouge-L**: the greedy response (at most ``max_new_tokens``, stopped at EOS) against the
  reference, Rouge-L F-measure (``rouge-score``), averaged over examples.

Standard errors: a bootstrap over test clients (each client's examples resampled together), the
same client-level bootstrap as ``popri eval accuracy``; ``--per-client-out`` rows (client_id,
tokens, correct, examples, rouge_sum) feed ``popri eval gap`` for paired comparisons of the
token accuracy.
"""

from __future__ import annotations

import time

import numpy as np

from popri.core.errors import InputError
from popri.data.instruct import prompt, read_examples
from popri.eval.downstream import load_model, paired_bootstrap
from popri.eval.rouge import rouge_l
from popri.models.instruct import encode, greedy_texts
from popri.models.llm import autocast, default_device


def evaluate(model_path: str, data: str, split: str = "test", *, max_samples: int | None = None,
             max_new_tokens: int = 96, max_length: int = 256, bf16: bool = True,
             bootstrap: int = 1000, seed: int = 0, device: str | None = None,
             generate: bool = True) -> dict:
    """{accuracy, accuracy_se, loss, rouge_l, rouge_l_se, examples, clients, per_client, ...}."""
    import torch

    t0 = time.perf_counter()
    device = device or default_device()
    recs, src = read_examples(data, split)
    if not recs:  # an empty split (instruct build with too few clients) scores nothing
        raise InputError(f"no examples in split {split!r}: nothing to evaluate", path=src)
    if max_samples is not None:
        recs = recs[:max_samples]
    model, tok = load_model(model_path, device=device)
    model.eval()
    seqs = encode(tok, recs, max_length)
    per: dict[str, dict] = {}
    tot_tok = tot_hit = 0
    tot_ce = 0.0
    with torch.no_grad():
        for r, (ids, n_p) in zip(recs, seqs):
            x = torch.tensor([ids], device=device)
            with autocast(device, bf16):
                logits = model(input_ids=x).logits
            lp = torch.log_softmax(logits[0, n_p - 1: len(ids) - 1].float(), dim=-1)
            tgt = x[0, n_p:]
            hit = int((lp.argmax(-1) == tgt).sum())
            ce = float(-lp.gather(1, tgt[:, None]).sum())
            row = per.setdefault(str(r.get("client_id", r.get("id"))),
                                 {"tokens": 0, "correct": 0, "loss_sum": 0.0, "examples": 0,
                                  "rouge_sum": 0.0})
            row["tokens"] += len(tgt)
            row["correct"] += hit
            row["loss_sum"] += ce
            row["examples"] += 1
            tot_tok += len(tgt)
            tot_hit += hit
            tot_ce += ce
    rouges: list[float] = []
    if generate:
        outs = greedy_texts(model, tok, [prompt(r["instruction"], r.get("input") or "") for r in recs],
                            max_new_tokens, device=device, bf16=bf16)
        for r, o in zip(recs, outs):
            s = rouge_l(o.strip(), r["output"])
            rouges.append(s)
            per[str(r.get("client_id", r.get("id")))]["rouge_sum"] += s
    rows = [{"client_id": c, **v} for c, v in per.items()]
    acc_se = rouge_se = None
    if bootstrap >= 2 and len(rows) >= 2:
        acc_se = paired_bootstrap([rows], lambda a: a, n_boot=bootstrap, seed=seed)["se"]
        if generate:
            rr = [{"client_id": r["client_id"], "tokens": r["examples"], "correct": r["rouge_sum"]}
                  for r in rows]
            rouge_se = paired_bootstrap([rr], lambda a: a, n_boot=bootstrap, seed=seed)["se"]
    return {"model": str(model_path), "data": src, "split": split, "examples": len(recs),
            "clients": len(rows), "tokens": tot_tok,
            "accuracy": tot_hit / tot_tok if tot_tok else None, "accuracy_se": acc_se,
            "loss": tot_ce / tot_tok if tot_tok else None,
            "rouge_l": float(np.mean(rouges)) if rouges else None, "rouge_l_se": rouge_se,
            "max_new_tokens": max_new_tokens,
            "judge": "none offline: response-token accuracy and Rouge-L to the reference stand "
                     "in for FewFedPIT's GPT-4 judge",
            "per_client": rows, "seconds": round(time.perf_counter() - t0, 2)}
