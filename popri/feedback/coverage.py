"""A coverage reward: each client's private samples vote, prompt by prompt, for their nearest
candidate (a popri remedy beyond POPri, issue 67).

    popri score --mode coverage --private runs/priv.npy --synthetic runs/r1/samples.jsonl \\
        --noise-multiplier 4.3 --sample-rate 0.5 --seed 0 --out runs/r1/scores.npy
    python -m pytest -q tests/test_coverage.py

Why.  POPri's reward ("Private Federated Learning using Preference-Optimized Synthetic Data",
arXiv:2504.16438, section 4.1) scores a sample by its mean cosine to a client's data, so summed
over clients it rewards the centre of the clients' distribution; DPO on it narrows the
generator (docs/results.md).  Here a sample wins by being the *closest* candidate to some
client data: Private Evolution's DP nearest-neighbour histogram ("PrE-Text", arXiv:2406.02958,
section 3, Algorithm 1; :mod:`popri.feedback.histogram`) taken per prompt, so that the J
candidates of every prompt are ranked by how much private data each covers best (DP-RFT,
arXiv:2602.18633, uses such votes as a PPO reward; here they rank DPO pairs).

The client vector.  The synthetic samples fall into G groups (their ``prompt_id``: G = K
prompts of J candidates; public).  Client i with kept private embeddings E_i (unit-normalised;
at most M with ``--max-samples-per-client``) uploads::

    v_i[j] = #{e in E_i : j = argmax_{k in group(j)} cos(e, y_k)} / (|E_i| sqrt(G))

Each group's block of v_i is non-negative and sums to 1 / sqrt(G), so its L2 norm is at most
1 / sqrt(G) (all of E_i voting for one candidate) and |v_i|_2 <= 1: the sum's sensitivity is 1
under add/remove one client, with no clipping; under replace one client two such vectors differ
by at most sqrt(2) in L2 (per group, two non-negative vectors of equal sum s differ by at most
s sqrt(2)), the ``nonnegative`` factor of :func:`popri.privacy.relations.factor`.  The noise is
the Gaussian mechanism's on that sum, N(0, z^2 D^2) per coordinate, accounted as every score
round is (:class:`popri.privacy.noise.Noise`).  Ties (a private sample equally close to two
candidates) go to the lower index, as numpy's argmax.  The output is the noisy sum (a ranking;
nothing divides it).

Against the cosine reward at the same z (same epsilon): both sums have sensitivity 1 (C = 1),
so the noise per coordinate is the same, z; the signal differs.  A standardised, clipped cosine
vector spreads its unit norm over all K J coordinates (differences between a prompt's
candidates of order 1 / sqrt(K J) per client); a client's coverage votes put 1 / sqrt(G) on
the candidates of each prompt, all of it on one when the client's data agree.  docs/privacy.md
states both and the measured recovery rates.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from popri.core.errors import InputError
from popri.federated.aggregation import Contributions
from popri.federated.participation import Participation, cap_rows, participating_rows
from popri.feedback.cosine import normalize_rows


def groups_of(rows: Sequence[dict], source: str = "") -> np.ndarray:
    """The group (prompt) index of every synthetic sample, from its ``prompt_id``: int64 [n],
    groups numbered in order of first appearance."""
    index: dict = {}
    out = np.empty(len(rows), dtype=np.int64)
    for n, r in enumerate(rows):
        if r.get("prompt_id") is None:
            raise InputError("missing required field (the coverage reward ranks the candidates "
                             "of each prompt: give 'popri gen' samples, or embeddings whose rows "
                             "keep their prompt_id)", path=source, line=n + 1, field="prompt_id")
        out[n] = index.setdefault(r["prompt_id"], len(index))
    return out


def nearest_in_groups(x: np.ndarray, syn_unit: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """For each row of ``x`` (unit rows [m, d]) the index of its most similar candidate in every
    group: int64 [m, G]."""
    sims = np.asarray(x, dtype=np.float64) @ np.asarray(syn_unit, dtype=np.float64).T
    G = int(groups.max()) + 1 if len(groups) else 0
    out = np.empty((len(x), G), dtype=np.int64)
    for g in range(G):
        members = np.flatnonzero(groups == g)
        out[:, g] = members[np.argmax(sims[:, members], axis=1)]
    return out


def client_vector(emb: np.ndarray, syn: np.ndarray, groups: np.ndarray, *,
                  max_per_client: int | None = None, rng=None) -> np.ndarray:
    """What ONE client computes and uploads (before noise): its per-prompt nearest-candidate
    votes, each weighted 1 / (|E_i| sqrt(G)), float64 [n] (L2 norm <= 1).  ``emb``: this
    client's private embeddings [k, d] (at most ``max_per_client``, chosen with ``rng``)."""
    emb = cap_rows(np.asarray(emb), max_per_client, rng)
    n, G = len(syn), int(groups.max()) + 1 if len(groups) else 0
    if len(emb) == 0 or G == 0:
        return np.zeros(n)
    nn = nearest_in_groups(normalize_rows(emb), normalize_rows(syn), groups)
    return np.bincount(nn.ravel(), minlength=n) / (len(emb) * np.sqrt(G))


def contributions(emb, codes, part: Participation, syn, groups: np.ndarray, *, keep=None,
                  source: str = "") -> Contributions:
    """The participants' coverage vectors (:func:`client_vector` each, L2 norm <= 1), before
    the noise: :func:`~popri.federated.aggregation.noisy_sum` adds it."""
    n, L = len(syn), len(part.members)
    G = int(groups.max()) + 1 if len(groups) else 0
    Y = normalize_rows(syn)
    counts = np.zeros((L, n))
    sizes = np.zeros(L)
    for x, who in participating_rows(emb, codes, part, keep, source):
        nn = nearest_in_groups(normalize_rows(x), Y, groups)
        np.add.at(counts, (np.repeat(who, G), nn.ravel()), 1.0)
        sizes += np.bincount(who, minlength=L)
    weights = 1.0 / (np.maximum(sizes, 1) * np.sqrt(max(G, 1)))
    rows = counts * weights[:, None]
    return Contributions(n, L, exact=lambda: rows.sum(axis=0),
                         rows=lambda c0, c1: rows[c0:c1].astype(np.float32))
