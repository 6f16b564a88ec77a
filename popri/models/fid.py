"""Frechet distance between Gaussians fitted to embedding sets (FID on sentence embeddings).

    popri eval fid samples.jsonl data/sotu --split val

One implementation serves checkpoint selection ("Private Federated Learning using
Preference-Optimized Synthetic Data", POPri, arXiv:2504.16438, appendix B.1: per round keep the
checkpoint whose samples have the lowest FID to the validation split), `popri eval fid`, and
FreD ("Privately Customizing Prefinetuning to Better Match User Data in Federated Learning",
arXiv:2302.09042: the Frechet distance to DP statistics of the clients' embeddings).

    d^2 = ||m1 - m2||^2 + Tr(C1 + C2 - 2 (C1 C2)^(1/2))

The trace of the matrix square root is computed in a numerically safe symmetric form:
Tr((C1 C2)^(1/2)) = Tr((S1 C2 S1)^(1/2)) with S1 = C1^(1/2), and both square roots come from
eigen-decompositions of symmetric PSD matrices with negative round-off eigenvalues clipped to 0.
No complex parts, and the covariance term is clipped at 0 (round-off can make it slightly
negative).
"""

from __future__ import annotations

import numpy as np


def gaussian_stats(emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (unbiased, N-1) covariance of the rows, in float64."""
    x = np.asarray(emb, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"need at least 2 embeddings of shape [N, d], got {x.shape}")
    return x.mean(axis=0), np.atleast_2d(np.cov(x, rowvar=False))  # [d, d], also at d = 1


def _psd_sqrt(c: np.ndarray) -> np.ndarray:
    c = (c + c.T) / 2
    w, v = np.linalg.eigh(c)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def trace_sqrt_product(c1: np.ndarray, c2: np.ndarray) -> float:
    """Tr((C1 C2)^(1/2)) for symmetric PSD C1, C2, via the symmetric form S1 C2 S1."""
    s1 = _psd_sqrt(c1)
    m = s1 @ c2 @ s1
    w = np.linalg.eigvalsh((m + m.T) / 2)
    return float(np.sqrt(np.clip(w, 0, None)).sum())


def frechet_distance(mu1, c1, mu2, c2) -> float:
    """||mu1 - mu2||^2 + Tr(C1 + C2 - 2 (C1 C2)^(1/2)) for symmetric PSD C1, C2 (FID, FreD).

    The covariance term is a squared Bures-Wasserstein distance, >= 0: it is clipped at 0 on
    its own, so round-off in it never eats into the mean term."""
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    c1, c2 = np.asarray(c1, np.float64), np.asarray(c2, np.float64)
    d = mu1.shape[0] if mu1.ndim == 1 else -1
    if mu1.shape != mu2.shape or c1.shape != (d, d) or c2.shape != (d, d):
        raise ValueError(f"dimension mismatch: means {mu1.shape}, {mu2.shape}; "
                         f"covariances {c1.shape}, {c2.shape}")
    cov_term = np.trace(c1) + np.trace(c2) - 2 * trace_sqrt_product(c1, c2)
    return float(np.sum((mu1 - mu2) ** 2)) + max(float(cov_term), 0.0)


def fid(emb_a: np.ndarray, emb_b: np.ndarray) -> float:
    """Frechet distance between two embedding sets."""
    return frechet_distance(*gaussian_stats(emb_a), *gaussian_stats(emb_b))
