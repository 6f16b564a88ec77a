"""A second opinion on a synthetic set that does not share the reward's eyes (issue 65): MAUVE
against the private test text on the downstream language model's features, and the set's
diversity.

    popri eval quality runs/x/synthetic.jsonl --reference runs/x/data/private --split test \\
        --max-reference 400 --model smollm2-135m --sizes 96,384 --json

POPri's reward and the probe both read all-MiniLM-L6-v2 embeddings, so a set that games that
embedder would look good to both.  Here:

- **MAUVE** (Pillutla, Swayamdipta, Zellers, Thickstun, Welleck, Choi, Harchaoui, "MAUVE:
  Measuring the Gap Between Neural Text and Human Text using Divergence Frontiers", NeurIPS
  2021, arXiv:2102.01454, section 3 / 4.1): the area under the divergence frontier of the two
  quantised distributions, computed by the ``mauve-text`` package from features we give it.
  The features are the *downstream* model's (``--model``, SmolLM2-135M by default): the final
  layer's hidden state at each text's last token, as MAUVE featurises with GPT-2 (its section
  4.1), on ``[START] + tokens + [EOS]`` cut to 128 tokens (popri.eval.downstream.encode).  The
  reference is the private test text, the same records the accuracy is evaluated on (a
  research read, never a release).
- **diversity**: distinct-1/2/3 (Li et al., NAACL 2016) over whitespace tokens, and the mean
  pairwise cosine of the set's MiniLM embeddings (``self_cosine``; lower = more spread), with
  ``embedding_spread`` = the root mean squared distance of the unit embeddings to their centroid.

With ``--sizes``, every measure is also computed on each prefix of the set (the learning curve's
nested prefixes, issue 65): one model load and one featurisation for all sizes.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from popri.core import log, runtime
from popri.eval.downstream import encode, load_model, make_batch, padding_id
from popri.eval.probe import distinct_n, unit_rows
from popri.models import llm

#: tokens of each text the features read (the texts are short: 64 tokens in training)
FEATURE_TOKENS = 128


def lm_features(model: str, texts: Sequence[str], *, max_length: int = FEATURE_TOKENS,
                batch_size: int = 32, device: str | None = None, bf16: bool = False
                ) -> np.ndarray:
    """The final-layer hidden state at each text's last token under ``model`` (MAUVE's
    featurisation, arXiv:2102.01454 section 4.1), float64 [n, d]; texts framed as the
    downstream model sees them (popri.eval.downstream.encode)."""
    (out,) = lm_features_of(model, [texts], max_length=max_length, batch_size=batch_size,
                            device=device, bf16=bf16)
    return out


def lm_features_of(model: str, groups: Sequence[Sequence[str]], *,
                   max_length: int = FEATURE_TOKENS, batch_size: int = 32,
                   device: str | None = None, bf16: bool = False) -> list[np.ndarray]:
    """:func:`lm_features` of several groups of texts (a set and its reference) with one
    load of ``model``."""
    torch = runtime.configure_torch()
    device = device or llm.default_device()
    m, tok = load_model(model, device=device)
    m.eval()
    return [_features(m, tok, torch, list(texts), max_length, batch_size, device, bf16)
            for texts in groups]


def _features(m, tok, torch, texts: list[str], max_length: int, batch_size: int, device: str,
              bf16: bool) -> np.ndarray:
    seqs = encode(tok, texts, max_length)
    pad = padding_id(tok)
    out = np.zeros((len(seqs), int(m.config.hidden_size)), dtype=np.float64)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
    with torch.no_grad(), log.progress() as prog:
        task = prog.add_task("features", total=len(seqs))
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            ids, mask, _ = make_batch([seqs[i] for i in idx], pad)  # right-padded
            with llm.autocast(device, bf16):
                h = m(input_ids=ids.to(device), attention_mask=mask.to(device),
                      output_hidden_states=True).hidden_states[-1]
            last = mask.sum(1) - 1
            feats = h[torch.arange(len(idx)), last.to(h.device)].float().cpu().numpy()
            out[idx] = feats
            prog.advance(task, len(idx))
    return out


def mauve_score(p: np.ndarray, q: np.ndarray, *, seed: int = 0) -> dict:
    """MAUVE of features ``p`` (the synthetic set) against ``q`` (the reference) with the
    ``mauve-text`` package at its defaults (k-means on PCA features keeping 90 % of the
    variance, ``num_buckets`` = min(n_p, n_q) / 10, scaling c = 5), its k-means seeded: {mauve,
    buckets}."""
    import mauve

    n = min(len(p), len(q))
    buckets = max(2, int(round(n / 10)))
    r = mauve.compute_mauve(p_features=np.asarray(p, dtype=np.float32),
                            q_features=np.asarray(q, dtype=np.float32), num_buckets=buckets,
                            seed=int(seed), verbose=False)
    return {"mauve": float(r.mauve), "buckets": buckets}


def diversity(texts: Sequence[str], emb: np.ndarray) -> dict:
    """distinct-1/2/3, the mean pairwise cosine of the unit embeddings (``self_cosine``) and
    their RMS distance to the centroid (``embedding_spread``)."""
    u = unit_rows(emb)
    n = len(u)
    if n > 1:
        s = u.sum(0)
        # mean over i != j of u_i . u_j = (|sum u|^2 - n) / (n (n - 1)) for unit rows
        self_cos = float((s @ s - float((u * u).sum())) / (n * (n - 1)))
    else:
        self_cos = None
    spread = float(np.sqrt(((u - u.mean(0)) ** 2).sum(1).mean())) if n else None
    words = [len(str(t).split()) for t in texts]
    return {"distinct_1": distinct_n(texts, 1), "distinct_2": distinct_n(texts, 2),
            "distinct_3": distinct_n(texts, 3), "self_cosine": self_cos,
            "embedding_spread": spread, "mean_words": float(np.mean(words)) if words else None}


def set_quality(texts: Sequence[str], feats: np.ndarray, ref_feats: np.ndarray,
                emb: np.ndarray, sizes: Sequence[int], *, seed: int = 0) -> list[dict]:
    """One row per size n (the first n texts): n, MAUVE against the reference, diversity."""
    rows = []
    for n in sorted({int(x) for x in sizes if int(x) <= len(texts)} or {len(texts)}):
        row = {"n": n, **diversity(texts[:n], emb[:n])}
        row.update(mauve_score(feats[:n], ref_feats, seed=seed) if n >= 2 else
                   {"mauve": None, "buckets": None})
        rows.append(row)
        log.info("quality: n = %d: MAUVE %s, distinct-2 %s, self-cosine %s"
                 % (n, fmt(row["mauve"]), fmt(row["distinct_2"]), fmt(row["self_cosine"])))
    return rows


def fmt(x, nd: int = 4) -> str:
    """``x`` to ``nd`` decimals, or "-" for None."""
    return "-" if x is None else f"{x:.{nd}f}"


__all__ = ["FEATURE_TOKENS", "lm_features", "lm_features_of", "mauve_score", "diversity", "set_quality", "fmt"]
