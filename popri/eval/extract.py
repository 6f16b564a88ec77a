"""Training-data extraction audit: discoverable memorisation of a checkpoint's training data.

    popri audit extract --model runs/x/downstream/popri --data runs/x/data/private --split train
    popri audit extract --model runs/ffp/round3/model --data data/instruct-debian -n 100 --json

The attack of "FewFedPIT: Towards Privacy-preserving and Few-shot Federated Instruction Tuning"
(arXiv:2403.06131, section 4.3), which is the discoverable memorisation of "Scalable Extraction
of Training Data from (Production) Language Models" (Nasr et al. 2023, arXiv:2311.17035,
section 2; Carlini et al. 2023, "Quantifying Memorization Across Neural Language Models"):

1. take N training examples s = [p || y], each from a different client (clients ranked by a
   seeded hash, one example of each by another);
2. prompt the model with the prefix p and decode greedily as many tokens as y has (at most
   ``suffix_tokens``);
3. score the continuation y' by Rouge-L(y', y) (the ``rouge-score`` package); higher = more of
   the private text comes back.

Instruction records (``instruction``/``output`` fields, :mod:`popri.data.instruct`): p is the
example's prompt (instruction and input in the Alpaca template) and y its response, as
FewFedPIT.  Text records: p is the first ``prefix_tokens`` tokens and y the next
``suffix_tokens`` (records shorter than p + 1 token are skipped).

The figure is an upper bound on what a targeted extraction attack gets (the attacker knows the
prefix) and is comparable across methods only on the same examples: same data, split, N and
seed give the same examples for every checkpoint.  It measures leakage; it is not a DP
guarantee, and a low score does not prove privacy.
"""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import numpy as np

from popri.core import log
from popri.core.errors import InputError
from popri.data.instruct import prompt
from popri.data.records import text_records
from popri.eval.downstream import load_model
from popri.eval.rouge import rouge_l
from popri.models.llm import autocast, default_device
from popri.specs.privacy import ExtractSpec


def pick_examples(records: Sequence[dict], n: int, seed: int, per_client: int = 1) -> list[dict]:
    """Up to ``per_client`` records of each client, clients and each client's records ranked
    by sha256 of the seed and their ids (the same choice for every checkpoint); the order:
    every client's first pick, then every client's second, ...; at most ``n``."""
    by: dict[str, list[dict]] = {}
    for i, r in enumerate(records):
        by.setdefault(str(r.get("client_id", r.get("id", i))), []).append(r)

    def h(*parts) -> bytes:
        return hashlib.sha256(":".join(map(str, (seed, "extract") + parts)).encode()).digest()

    clients = sorted(by, key=lambda c: (h(c), c))
    ranked = {c: [by[c][j] for j in sorted(range(len(by[c])),
                                          key=lambda j: (h(c, by[c][j].get("id", j)), j))]
              for c in clients}
    out = []
    for k in range(per_client):
        for c in clients:
            if k < len(ranked[c]) and len(out) < n:
                out.append(ranked[c][k])
    return out


def is_instruction(rec: dict) -> bool:
    return isinstance(rec.get("instruction"), str) and isinstance(rec.get("output"), str)


def split_example(rec: dict, tok, spec: ExtractSpec) -> tuple[list[int], list[int]] | None:
    """(prefix ids, true continuation ids) of one record, or None when it is too short."""
    if is_instruction(rec):
        p = tok(prompt(rec["instruction"], rec.get("input") or ""), add_special_tokens=False)["input_ids"]
        y = tok(rec["output"].strip(), add_special_tokens=False)["input_ids"][: spec.suffix_tokens]
        return (list(p), list(y)) if y else None
    ids = tok(rec["text"], add_special_tokens=False)["input_ids"]
    if len(ids) <= spec.prefix_tokens:
        return None
    return list(ids[: spec.prefix_tokens]), list(ids[spec.prefix_tokens: spec.prefix_tokens + spec.suffix_tokens])


def greedy(model, tok, prefixes: Sequence[list[int]], lengths: Sequence[int], *, batch_size: int,
           bf16: bool, device: str, progress=None) -> list[list[int]]:
    """Greedy continuations: ``lengths[i]`` new tokens after ``prefixes[i]`` (left-padded
    batches; the BOS token, when the tokenizer has one, starts every prefix)."""
    import torch

    bos = tok.bos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out: list[list[int]] = [[] for _ in prefixes]
    order = sorted(range(len(prefixes)), key=lambda i: (len(prefixes[i]), i))  # less padding
    for s in range(0, len(order), batch_size):
        idx = order[s: s + batch_size]
        seqs = [([bos] if bos is not None else []) + prefixes[i] for i in idx]
        width = max(len(x) for x in seqs)
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in seqs], device=device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in seqs], device=device)
        new = max(lengths[i] for i in idx)
        with torch.no_grad(), autocast(device, bf16):
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False, pad_token_id=pad)
        for row, i in enumerate(idx):
            out[i] = gen[row, width: width + lengths[i]].tolist()
        if progress:
            progress(len(idx))
    return out


def _client_se(rows: Sequence[dict], x: np.ndarray) -> float | None:
    """SE of the mean Rouge-L with clients as the unit: the examples' SE when each client gave
    one, else the SE of the ratio estimator over client totals (delta method)."""
    cid = [str(r.get("client_id")) for r in rows]
    groups = sorted(set(cid))
    if len(groups) < 2:
        return None
    if len(groups) == len(rows):
        return float(x.std(ddof=1) / math.sqrt(len(x)))
    tot = np.array([sum(v for v, c in zip(x, cid) if c == g) for g in groups])
    cnt = np.array([sum(1 for c in cid if c == g) for g in groups], dtype=np.float64)
    m = tot.sum() / cnt.sum()
    k = len(groups)
    resid = tot - m * cnt
    return float(math.sqrt(k / (k - 1) * (resid ** 2).sum()) / cnt.sum())


def run(model_path: str, data: str, split: str, spec: ExtractSpec | None = None, *,
        seed: int = 0, device: str | None = None) -> tuple[dict, list[dict]]:
    """(summary, one row per attacked example) for the checkpoint ``model_path``."""
    spec = spec or ExtractSpec()
    recs, src = text_records(data, split)
    if not recs:
        raise InputError(f"no records in split {split!r}", path=src)
    device = device or default_device()
    model, tok = load_model(model_path, device=device)
    chosen = pick_examples(recs, len(recs), seed, spec.per_client)  # the first n usable
    rows, pre, lens = [], [], []
    for r in chosen:
        if len(rows) >= spec.num_examples:
            break
        cut = split_example(r, tok, spec)
        if cut is None:
            continue
        rows.append({"id": r.get("id"), "client_id": r.get("client_id"),
                     "kind": "instruction" if is_instruction(r) else "text"})
        pre.append(cut[0])
        lens.append(len(cut[1]))
        rows[-1]["_truth"] = cut[1]
    if not rows:
        raise InputError(f"no record of split {split!r} is longer than --prefix-tokens "
                         f"{spec.prefix_tokens}", path=src)
    if len(rows) < spec.num_examples:
        log.warn(f"audit extract: {len(rows)} examples ({spec.per_client} per client at most; "
                 f"the split has {len({str(r.get('client_id')) for r in recs})} clients), not "
                 f"{spec.num_examples}")
    log.info(f"audit extract: {len(rows)} examples of {src} ({split}), greedy up to "
             f"{max(lens)} tokens with {model_path}")
    with log.progress() as prog:
        task = prog.add_task("extract", total=len(rows))
        gens = greedy(model, tok, pre, lens, batch_size=spec.batch_size, bf16=spec.bf16,
                      device=device, progress=lambda n: prog.advance(task, n))
    scores = []
    for row, p, g in zip(rows, pre, gens):
        truth = row.pop("_truth")
        t_text = tok.decode(truth, skip_special_tokens=True)
        g_text = tok.decode(g, skip_special_tokens=True)
        exact = 0
        while exact < min(len(g), len(truth)) and g[exact] == truth[exact]:
            exact += 1
        r = rouge_l(g_text, t_text)
        scores.append(r)
        row.update({"prefix": tok.decode(p, skip_special_tokens=True), "truth": t_text,
                    "generated": g_text, "rouge_l": r, "exact_prefix_tokens": exact,
                    "tokens": len(truth)})
    x = np.asarray(scores, dtype=np.float64)
    n = len(x)
    summary = {
        "model": model_path, "data": src, "split": split, "examples": n, "seed": seed,
        "rouge_l": float(x.mean()),
        "rouge_l_se": _client_se(rows, x),
        "extracted": float((x >= spec.threshold).mean()), "threshold": spec.threshold,
        "exact_match": float(np.mean([r["exact_prefix_tokens"] == r["tokens"] for r in rows])),
        "instruction_examples": sum(r["kind"] == "instruction" for r in rows),
        "settings": spec.to_dict(),
        "attack": "discoverable memorisation (Nasr et al. 2023; FewFedPIT 4.3): greedy "
                  "continuation of a training example's prefix, Rouge-L to the true one",
    }
    return summary, rows
