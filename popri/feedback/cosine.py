"""POPri's client feedback: each client's mean cosine similarity to every synthetic sample.

    popri score --mode cosine --private runs/priv.npy --synthetic runs/syn.npy \\
        --noise-multiplier 1.05 --clients-per-round 1000 --seed 0 --out runs/scores.npy
    python -m pytest -q tests/test_scoring.py tests/test_specs_feedback.py

"Private Federated Learning using Preference-Optimized Synthetic Data" (POPri, arXiv:2504.16438,
section 4.1, Algorithm 1): client i, with private embeddings E_i, scores the n synthetic
embeddings y_j and uploads::

    s_i[j]   = mean_{e in E_i} cos(e, y_j)                  (y_j: synthetic embedding j)
    z_i      = (s_i - mean(s_i)) / std(s_i)                  only with --standardize
    v_i      = z_i * min(1, C / |z_i|)                       clip to L2 norm C: sensitivity C

:func:`client_vector` is exactly that v_i (what one federated client computes); the noise and the
sum are the server's (:func:`popri.federated.aggregation.noisy_sum`)::

    upload_i = v_i + N(0, Z^2 C^2 / L)                       L participating clients
    scores   = sum_i upload_i / D                            D = q*N (Poisson) or L, if public

In-process, :func:`cosine_round` computes the whole round at once.  Because
cos(e, y) = <e/|e|, y/|y|>, s_i = Y m_i with Y the row-normalised synthetic matrix and m_i the
mean of the client's normalised embeddings (:func:`client_means`).  Standardising and clipping
only rescale and shift s_i, by scalars that need mean(s_i) = ybar.m_i and var(s_i) = m_i' K m_i
(K: the d x d covariance of the rows of Y).  So v_i = a_i Y m_i - b_i
(:func:`cosine_coefficients`), and the whole round is Y (sum_i a_i m_i) - sum_i b_i:
O(L d^2 + n d) instead of the O(L n d) of scoring client by client.  Per-client rows
(--per-client-out) are materialised block by block with the same a_i, b_i (:func:`cosine_rows`).
"""

from __future__ import annotations

import numpy as np

from popri.federated.aggregation import Contributions, noisy_sum
from popri.federated.participation import Participation, cap_rows, participating_rows


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (all-zero rows stay zero: cosine 0 with everything)."""
    x = np.array(x, dtype=np.float64)  # a copy
    norm = np.sqrt(np.einsum("ij,ij->i", x, x))
    x /= np.where(norm > 0, norm, np.inf)[:, None]
    return x


def client_means(emb, codes, part: Participation, keep=None, source: str = "") -> np.ndarray:
    """m_i: mean of each participating client's L2-normalised embeddings, float64 [L, d]."""
    from scipy import sparse  # lazy: scipy costs start-up time to every command

    L, d = len(part.members), emb.shape[1]
    sums, counts = np.zeros((L, d)), np.zeros(L)
    for x, who in participating_rows(emb, codes, part, keep, source):
        # sum the block's rows per client: a 0/1 [clients in block, rows] sparse matrix @ rows
        present, inv = np.unique(who, return_inverse=True)
        onehot = sparse.csr_matrix((np.ones(len(who)), (inv, np.arange(len(who)))),
                                   shape=(len(present), len(who)))
        sums[present] += onehot @ normalize_rows(x)
        counts += np.bincount(who, minlength=L)
    sums /= np.maximum(counts, 1)[:, None]
    return sums


def cosine_coefficients(means: np.ndarray, syn_unit: np.ndarray, clip: float,
                        standardize: bool) -> tuple[np.ndarray, np.ndarray]:
    """a_i, b_i such that client i's clipped score vector is a_i * (Y m_i) - b_i."""
    Y = np.asarray(syn_unit, dtype=np.float64)
    n = len(Y)
    ybar = Y.mean(axis=0)
    mu = means @ ybar  # mean(s_i)
    Yc = Y - ybar
    var = np.maximum(np.einsum("ij,ij->i", means @ (Yc.T @ Yc / n), means), 0.0)  # var(s_i)
    sq = n * (var + mu ** 2)  # |s_i|^2
    if standardize:
        # a row whose spread is at rounding level is constant: standardising it gives zeros
        const = var <= 1e-10 * np.maximum(var + mu ** 2, np.finfo(float).tiny)
        scale = np.where(const, 0.0, 1.0 / np.sqrt(np.where(const, 1.0, var)))
        norm = np.where(const, 0.0, np.sqrt(n))  # |z_i| = sqrt(n)
        shift = mu
    else:
        scale, shift, norm = np.ones(len(means)), np.zeros(len(means)), np.sqrt(sq)
    factor = np.minimum(1.0, clip / np.where(norm > 0, norm, np.inf))  # clip to norm C
    a = scale * factor
    return a, a * shift


def cosine_rows(means, syn_unit, a, b) -> np.ndarray:
    """The clipped score vectors of a block of clients, float32 [L_b, n]."""
    rows = np.asarray(means, dtype=np.float32) @ np.asarray(syn_unit, dtype=np.float32).T
    rows *= a.astype(np.float32)[:, None]
    rows -= b.astype(np.float32)[:, None]
    return rows


def client_vector(emb: np.ndarray, syn: np.ndarray, *, clip: float, standardize: bool,
                  max_per_client: int | None = None, rng=None, source: str = "") -> np.ndarray:
    """What ONE client computes and uploads (before noise): its mean-cosine vector over the
    synthetic samples, standardised (``standardize``) and clipped to L2 norm ``clip``, float64
    [n].  ``emb``: this client's private embeddings [k, d] (at most ``max_per_client`` of them
    are used, chosen with ``rng``).  The sum over the round's clients is :func:`cosine_round`
    without noise."""
    emb = cap_rows(np.asarray(emb), max_per_client, rng)
    Y = normalize_rows(syn)
    means = client_means(emb, np.zeros(len(emb), np.int64), Participation.everyone(1),
                         source=source)
    a, b = cosine_coefficients(means, Y, clip, standardize)
    return a[0] * (Y @ means[0]) - b[0]


def contributions(emb, codes, part: Participation, syn, *, clip: float, standardize: bool,
                  keep=None, source: str = "", clip_to: float | None = None) -> Contributions:
    """The participants' clipped (standardised) mean-cosine vectors (:func:`client_vector`
    each, L2 norm <= C), before the noise: :func:`~popri.federated.aggregation.noisy_sum` adds
    it.  ``clip_to``: the L2 norm the vectors are clipped to, when not C (the privacy audit's
    broken variant ``no-clip`` passes the largest float: the noise is still that of C, and the
    audit must flag the release)."""
    Y = normalize_rows(syn)
    means = client_means(emb, codes, part, keep, source)
    a, b = cosine_coefficients(means, Y, clip if clip_to is None else clip_to, standardize)
    return Contributions(len(Y), len(means), exact=lambda: Y @ (a @ means) - b.sum(),
                         rows=lambda c0, c1: cosine_rows(means[c0:c1], Y, a[c0:c1], b[c0:c1]))


def cosine_round(emb, codes, part: Participation, syn, *, noise_multiplier: float, clip: float,
                 standardize: bool, noise_rng, keep=None, rows_out=None, block: int | None = None,
                 source: str = "", sensitivity: float | None = None,
                 clip_to: float | None = None) -> np.ndarray:
    """Noisy sum over the participants ``part`` of their :func:`contributions`, float64 [n], of
    noise std z D: ``sensitivity`` D is the sum's sensitivity under the round's relation
    (default C; 2C under replace one client: :func:`popri.privacy.relations.round_relation`).
    ``popri score`` calls the two steps itself (:func:`popri.feedback.release.release_scores`);
    this is the one-call form of the audit and the tests."""
    return noisy_sum(contributions(emb, codes, part, syn, clip=clip, standardize=standardize,
                                   keep=keep, source=source, clip_to=clip_to),
                     noise_multiplier=noise_multiplier, noise_rng=noise_rng,
                     sensitivity=clip if sensitivity is None else sensitivity,
                     rows_out=rows_out, block=block)
