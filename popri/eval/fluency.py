"""How fluent a set of synthetic samples is under the public model, sample by sample, and whether
a round's preference pairs teach DPO that the less fluent text is the better one (issue 44).

    popri eval fluency runs/x/round1/samples.jsonl --out runs/x/round1/fluency.jsonl --json
    popri eval fluency runs/x/round1/prefs.jsonl --json          # chosen vs rejected, paired
    popri eval fluency runs/x/probe/round0.jsonl --adapter runs/x/round3/dpo/adapter --json

POPri ("Private Federated Learning using Preference-Optimized Synthetic Data", arXiv:2504.16438,
section 4.2) rewards a sample by its mean cosine to the clients' embeddings; nothing in that
reward asks for fluent text, and DPO (Rafailov et al., "Direct Preference Optimization",
arXiv:2305.18290, section 4) moves the generator's log-probability ratio of chosen to rejected
whatever else separates the two.  Per text this measures:

- **nll**: the public model's mean next-token negative log-likelihood of the text on its own
  (no prompt: how likely it is as language), over its first ``max_tokens`` tokens; exp(nll) is
  the text's perplexity.  Under ``--adapter`` the same for a tuned generator (how far DPO moved
  the log-probability of a fixed set of texts);
- **words**, **distinct_2** (distinct word bigrams over all bigrams inside the text: Li, Galley,
  Brockett, Gao, Dolan, "A diversity-promoting objective function for neural conversation
  models", NAACL 2016) and **degenerate**: fewer than :data:`MIN_WORDS` words, or at least
  :data:`REPEAT_SHARE` of the text's word trigrams repeats of an earlier one (a loop).

Every text here is a synthetic sample (or a pair of them) generated from public prompts and,
for pairs, ranked by released DP scores: the output is post-processing of public data and
releases nothing about the clients.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from popri.models import llm

#: a text with fewer words than this is degenerate (an empty or cut-off sample)
MIN_WORDS = 3
#: a text whose word trigrams repeat an earlier trigram at least this often is degenerate
REPEAT_SHARE = 0.5
#: the tokens of each text scored (the issue's measurement: the first 128)
MAX_TOKENS = 128


def repeat_share(text: str, n: int = 3) -> float:
    """Share of the word n-grams of ``text`` that repeat an earlier n-gram of it (0: none)."""
    w = str(text).split()
    grams = [tuple(w[i:i + n]) for i in range(len(w) - n + 1)]
    return (len(grams) - len(set(grams))) / len(grams) if grams else 0.0


def text_distinct(text: str, n: int = 2) -> float | None:
    """Distinct word n-grams / all word n-grams inside one text (None: shorter than n words)."""
    w = str(text).split()
    grams = [tuple(w[i:i + n]) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


def degenerate(text: str) -> bool:
    """Fewer than MIN_WORDS words, or a loop (REPEAT_SHARE of the word trigrams repeat)."""
    return len(str(text).split()) < MIN_WORDS or repeat_share(text) >= REPEAT_SHARE


def text_nll(model: str, texts: Sequence[str], *, adapter: str | None = None, bf16: bool = False,
             device: str | None = None, batch_size: int = 16,
             max_tokens: int = MAX_TOKENS) -> tuple[np.ndarray, np.ndarray]:
    """(sum of next-token NLL, number of predicted tokens) per text under the public model (plus
    ``adapter``).  Each text is scored from its first token (the model's own BOS where its
    tokenizer adds one), cut to ``max_tokens`` tokens; an empty text has 0 tokens and NLL 0."""
    import torch

    device = device or llm.default_device()
    m, tok = llm.load_causal_lm(model, adapter, device=device)
    m.eval()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    nll = np.zeros(len(texts), dtype=np.float64)
    cnt = np.zeros(len(texts), dtype=np.int64)
    idx = [i for i, t in enumerate(texts) if str(t).strip()]
    # length-sorted batches: less padding, and each text's numbers do not depend on its order
    idx.sort(key=lambda i: len(str(texts[i])))
    with torch.no_grad():
        for b in range(0, len(idx), batch_size):
            rows = idx[b:b + batch_size]
            enc = tok([str(texts[i]) for i in rows], return_tensors="pt", padding=True,
                      truncation=True, max_length=int(max_tokens))
            ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
            with llm.autocast(device, bf16):
                logits = m(input_ids=ids, attention_mask=mask).logits.float()
            lp = torch.log_softmax(logits[:, :-1], -1)
            per = -lp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            w = mask[:, 1:].float()
            nll[rows] = (per * w).sum(1).double().cpu().numpy()
            cnt[rows] = w.sum(1).long().cpu().numpy()
    return nll, cnt


def per_text(texts: Sequence[str], nll_sum: np.ndarray, tokens: np.ndarray,
             ids: Sequence[object] | None = None) -> list[dict]:
    """One record per text: id, nll (mean per token; None for an empty text), tokens, words,
    distinct_2, repeat_3, degenerate."""
    out = []
    for i, t in enumerate(texts):
        n = int(tokens[i])
        out.append({"id": ids[i] if ids is not None else i,
                    "nll": float(nll_sum[i] / n) if n else None, "tokens": n,
                    "words": len(str(t).split()), "distinct_2": text_distinct(t),
                    "repeat_3": repeat_share(t), "degenerate": degenerate(t)})
    return out


def _q(x: np.ndarray, p: float) -> float | None:
    return float(np.quantile(x, p)) if len(x) else None


def summary(rows: Sequence[dict]) -> dict:
    """The set's fluency: mean per-text NLL and its SE, token-weighted perplexity, NLL quantiles,
    mean words, degenerate share."""
    nll = np.array([r["nll"] for r in rows if r["nll"] is not None], dtype=np.float64)
    tok = np.array([r["tokens"] for r in rows if r["nll"] is not None], dtype=np.float64)
    words = np.array([r["words"] for r in rows], dtype=np.float64)
    total = float((nll * tok).sum())
    return {"texts": len(rows), "scored": int(len(nll)),
            "mean_nll": float(nll.mean()) if len(nll) else None,
            "mean_nll_se": float(nll.std(ddof=1) / math.sqrt(len(nll))) if len(nll) > 1 else None,
            "perplexity": math.exp(total / tok.sum()) if tok.sum() else None,
            "nll_p10": _q(nll, 0.1), "nll_p50": _q(nll, 0.5), "nll_p90": _q(nll, 0.9),
            "mean_words": float(words.mean()) if len(words) else None,
            "degenerate_share": (sum(bool(r["degenerate"]) for r in rows) / len(rows)
                                 if rows else None)}


def paired(chosen: Sequence[dict], rejected: Sequence[dict]) -> dict:
    """Chosen minus rejected over the pairs where both texts were scored: mean NLL difference
    and its SE (positive: the chosen text is the less fluent one), how many pairs have the less
    fluent text chosen, and the same differences of words, distinct-2 and degenerate share."""
    keep = [k for k in range(len(chosen))
            if chosen[k]["nll"] is not None and rejected[k]["nll"] is not None]
    d = np.array([chosen[k]["nll"] - rejected[k]["nll"] for k in keep], dtype=np.float64)
    dw = np.array([chosen[k]["words"] - rejected[k]["words"] for k in range(len(chosen))],
                  dtype=np.float64)
    d2 = np.array([chosen[k]["distinct_2"] - rejected[k]["distinct_2"] for k in range(len(chosen))
                   if chosen[k]["distinct_2"] is not None
                   and rejected[k]["distinct_2"] is not None], dtype=np.float64)

    def se(x):
        return float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else None

    return {"pairs": len(chosen), "scored_pairs": len(keep),
            "nll_chosen_minus_rejected": float(d.mean()) if len(d) else None,
            "nll_chosen_minus_rejected_se": se(d),
            "chosen_less_fluent": int((d > 0).sum()),
            "words_chosen_minus_rejected": float(dw.mean()) if len(dw) else None,
            "words_chosen_minus_rejected_se": se(dw),
            "distinct_2_chosen_minus_rejected": float(d2.mean()) if len(d2) else None,
            "degenerate_chosen": sum(bool(r["degenerate"]) for r in chosen),
            "degenerate_rejected": sum(bool(r["degenerate"]) for r in rejected)}
