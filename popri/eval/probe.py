"""How close a generator's fixed-prompt sample is to the private data, and how fluent and diverse
it is: the per-round view of POPri's learning (issue 24).

    popri eval probe runs/x/round1/probe.jsonl --target runs/x/embeddings/val.npy \\
        --model smollm2-135m --json

POPri's claim ("Private Federated Learning using Preference-Optimized Synthetic Data",
arXiv:2504.16438, section 4.2) is that DPO on the clients' DP preferences moves the generator
towards the private data.  A round's view of that, on a FIXED set of held prompts and seeds (the
same every round, round 0 = the untuned generator, so rounds are paired):

- **distance** to the private validation split's embeddings (``--target``): the cosine between
  the two mean embeddings, and the unbiased squared maximum mean discrepancy with a Gaussian
  (RBF) kernel at the median-distance bandwidth (Gretton, Borgwardt, Rasch, Schoelkopf, Smola,
  "A kernel two-sample test", JMLR 2012, Lemma 6: MMD^2_u, no diagonal terms; bandwidth: the
  median heuristic of section 8), each with a bootstrap SE over the samples.  FID at n << d (128
  samples, 384 dimensions) is dominated by the covariance's estimation error; these two are
  low-variance at that size.
- **fluency**: the public model's perplexity of the samples (token-level, exp of the mean
  next-token loss); **diversity**: distinct-1 and distinct-2 (Li, Galley, Brockett, Gao, Dolan,
  "A diversity-promoting objective function for neural conversation models", NAACL 2016: distinct
  n-grams over all n-grams), and the mean pairwise cosine of the sample's embeddings.

The distance reads the private validation embeddings without noise: the output is marked
``private_diagnostic: true`` (a research measurement, never a release).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from popri.eval.fluency import text_nll

#: bootstrap resamples of the samples for the distances' SEs
PROBE_BOOT = 200


def distinct_n(texts: Sequence[str], n: int) -> float | None:
    """Distinct n-grams / all n-grams over whitespace tokens of ``texts`` (None: none)."""
    grams, total = set(), 0
    for t in texts:
        w = str(t).split()
        for i in range(len(w) - n + 1):
            grams.add(tuple(w[i:i + n]))
            total += 1
    return len(grams) / total if total else None


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Each row scaled to unit L2 norm (float64; a zero row stays zero)."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def mean_cosine(x: np.ndarray, y: np.ndarray) -> float:
    """Cosine between the mean unit embeddings of ``x`` and ``y``."""
    a, b = unit_rows(x).mean(0), unit_rows(y).mean(0)
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))


def median_bandwidth(x: np.ndarray, y: np.ndarray) -> float:
    """The median heuristic: the median pairwise Euclidean distance over the pooled rows."""
    z = np.concatenate([x, y])
    sq = (z * z).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * z @ z.T, 0.0)
    iu = np.triu_indices(len(z), 1)
    return float(np.sqrt(np.median(d2[iu]))) or 1.0


def mmd2_unbiased(x: np.ndarray, y: np.ndarray, bandwidth: float) -> float:
    """MMD^2_u with k(a, b) = exp(-|a - b|^2 / (2 h^2)) (Gretton et al. 2012, Lemma 6)."""
    def k(a, b):
        sa, sb = (a * a).sum(1), (b * b).sum(1)
        d2 = np.maximum(sa[:, None] + sb[None, :] - 2 * a @ b.T, 0.0)
        return np.exp(-d2 / (2.0 * bandwidth * bandwidth))

    m, n = len(x), len(y)
    if m < 2 or n < 2:
        raise ValueError("MMD^2_u needs at least 2 samples on each side")
    kxx, kyy, kxy = k(x, x), k(y, y), k(x, y)
    return float((kxx.sum() - np.trace(kxx)) / (m * (m - 1))
                 + (kyy.sum() - np.trace(kyy)) / (n * (n - 1)) - 2.0 * kxy.mean())


def distances(samples: np.ndarray, target: np.ndarray, *, n_boot: int = PROBE_BOOT,
              seed: int = 0) -> dict:
    """Mean-embedding cosine and MMD^2_u of ``samples`` to ``target`` (unit-normalised rows),
    with bootstrap SEs over the samples (the target held fixed: it is the same every round, so
    round-to-round differences are paired on it)."""
    x, y = unit_rows(samples), unit_rows(target)
    h = median_bandwidth(x, y)
    cos, mmd = mean_cosine(x, y), mmd2_unbiased(x, y, h)
    rng = np.random.default_rng([int(seed), 0x50524F42])
    bc, bm = [], []
    for _ in range(int(n_boot)):
        idx = rng.integers(0, len(x), len(x))
        bc.append(mean_cosine(x[idx], y))
        xb = x[idx]
        bm.append(mmd2_unbiased(xb, y, h))
    sims = x @ x.T
    iu = np.triu_indices(len(x), 1)
    return {"mean_cosine": cos, "mean_cosine_se": float(np.std(bc, ddof=1)) if n_boot > 1 else None,
            "mmd2": mmd, "mmd2_se": float(np.std(bm, ddof=1)) if n_boot > 1 else None,
            "bandwidth": h, "self_cosine": float(sims[iu].mean()) if len(x) > 1 else None,
            "samples": len(x), "target": len(y)}


def perplexity(model: str, texts: Sequence[str], *, bf16: bool = True,
               device: str | None = None, batch_size: int = 16) -> dict:
    """The public model's token-level perplexity of ``texts`` (each scored from its first
    token; the model's own BOS where it has one; the first 256 tokens of each): exp of the
    token-weighted mean of :func:`popri.eval.fluency.text_nll`."""
    nll, cnt = text_nll(model, texts, bf16=bf16, device=device, batch_size=batch_size,
                        max_tokens=256)
    count = int(cnt.sum())
    mean = float(nll.sum()) / count if count else float("nan")
    return {"loss": mean, "perplexity": math.exp(mean) if count else None, "tokens": count}
