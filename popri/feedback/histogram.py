"""Private Evolution's client feedback: every private sample votes for its nearest synthetic one.

    popri score --mode nn-histogram --private data/sotu --synthetic runs/lookahead.npy \\
        --noise-multiplier 10 --threshold 20 --seed 0 --out runs/hist.npy
    python -m pytest -q tests/test_scoring.py -k histogram

"PrE-Text: Training Language Models on Private Federated Data in the Age of LLMs" (PrE-Text,
arXiv:2406.02958, section 3, Algorithm 1), the DP nearest-neighbour histogram of Private
Evolution: each client keeps at most M private samples (a seeded choice,
:func:`popri.federated.participation.cap_per_client`); each kept sample votes for its nearest
synthetic sample in L2 distance (faiss IndexFlatL2, on every GPU when faiss sees one)::

    h_i[j] = #{e in E_i (at most M) : j = argmin_k |e - y_k|}     |h_i|_2 <= |h_i|_1 <= M

so one client's histogram has L2 norm at most M (the sensitivity).  :func:`client_vector` is
exactly h_i (what one federated client computes and uploads).  The server adds N(0, Z^2 M^2)
to the sum and thresholds, max(hist - H, 0)
(:func:`popri.federated.aggregation.noisy_sum`, :func:`~popri.federated.aggregation.finish`);
the output is a sum.  :func:`histogram_round` runs the whole round in-process.
"""

from __future__ import annotations

import numpy as np

from popri.federated.aggregation import Contributions, noisy_sum
from popri.federated.participation import Participation, cap_rows, participating_rows


def nn_index(syn: np.ndarray):
    """Exact L2 index over the synthetic embeddings; on every GPU when faiss sees one."""
    import faiss

    index = faiss.IndexFlatL2(syn.shape[1])
    if hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0:
        index = faiss.index_cpu_to_all_gpus(index)
    index.add(np.ascontiguousarray(syn, dtype=np.float32))
    return index


def nearest_votes(emb, codes, part: Participation, syn, keep=None, source: str = ""):
    """(participant index, nearest synthetic index) of every kept private sample, sorted by
    participant."""
    index = nn_index(syn)
    who_all, lab_all = [], []
    for x, who in participating_rows(emb, codes, part, keep, source):
        _, nn = index.search(np.ascontiguousarray(x, dtype=np.float32), 1)
        who_all.append(who)
        lab_all.append(nn[:, 0].astype(np.int64))
    who = np.concatenate(who_all) if who_all else np.zeros(0, np.int64)
    lab = np.concatenate(lab_all) if lab_all else np.zeros(0, np.int64)
    order = np.argsort(who, kind="stable")
    return who[order], lab[order]


def histogram_rows(who, labels, c0: int, c1: int, n: int) -> np.ndarray:
    """Per-client vote counts for participants c0..c1-1, float32 [c1 - c0, n]."""
    lo, hi = np.searchsorted(who, [c0, c1])
    flat = (who[lo:hi] - c0) * n + labels[lo:hi]
    return np.bincount(flat, minlength=(c1 - c0) * n).reshape(c1 - c0, n).astype(np.float32)


def client_vector(emb: np.ndarray, syn: np.ndarray, *, max_per_client: int | None,
                  rng=None, index=None, source: str = "") -> np.ndarray:
    """What ONE client computes and uploads (before noise): the votes of at most
    ``max_per_client`` of its private embeddings ``emb`` [k, d] (chosen with ``rng``) for their
    nearest synthetic sample, float64 counts [n].  ``index``: a prebuilt :func:`nn_index` of
    ``syn``.  The sum over the round's clients is :func:`histogram_round` without noise."""
    emb = cap_rows(np.asarray(emb), max_per_client, rng)
    n = len(syn)
    if index is None:
        index = nn_index(syn)
    votes = [index.search(np.ascontiguousarray(x, dtype=np.float32), 1)[1][:, 0]
             for x, _ in participating_rows(emb, np.zeros(len(emb), np.int64),
                                            Participation.everyone(1), source=source)]
    labels = np.concatenate(votes).astype(np.int64) if votes else np.zeros(0, np.int64)
    return np.bincount(labels, minlength=n).astype(np.float64)


def contributions(emb, codes, part: Participation, syn, *, keep, source: str = ""
                  ) -> Contributions:
    """The participants' nearest-neighbour vote histograms (:func:`client_vector` each, at most
    M votes, L2 norm <= M), before the noise: :func:`~popri.federated.aggregation.noisy_sum`
    adds it."""
    n = len(syn)
    who, labels = nearest_votes(emb, codes, part, syn, keep, source)
    return Contributions(n, len(part.members),
                         exact=lambda: np.bincount(labels, minlength=n).astype(np.float64),
                         rows=lambda c0, c1: histogram_rows(who, labels, c0, c1, n))


def histogram_round(emb, codes, part: Participation, syn, *, noise_multiplier: float,
                    max_per_client: int, keep, noise_rng, rows_out=None,
                    block: int | None = None, source: str = "",
                    sensitivity: float | None = None) -> np.ndarray:
    """Noisy sum over the participants ``part`` of their :func:`contributions`, float64 [n], of
    noise std z D: ``sensitivity`` D is the sum's sensitivity under the round's relation
    (default M; sqrt 2 M under replace one client:
    :func:`popri.privacy.relations.round_relation`).  ``popri score`` calls the two steps
    itself; this is the one-call form of the audit and the tests."""
    return noisy_sum(contributions(emb, codes, part, syn, keep=keep, source=source),
                     noise_multiplier=noise_multiplier, noise_rng=noise_rng,
                     sensitivity=float(max_per_client if sensitivity is None else sensitivity),
                     rows_out=rows_out, block=block)
