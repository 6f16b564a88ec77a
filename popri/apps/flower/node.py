"""What one SuperNode uploads: its clients' feedback vectors, summed, plus its noise share.

    python -m pytest -q tests/test_flower.py -k node

A SuperNode holds one client (a device in a real deployment) or a group of clients (a simulated
node).  For each of its clients it computes exactly the per-client vector of ``popri score
--per-client-out`` (before noise): :func:`popri.feedback.cosine.client_vector` (POPri, "Private
Federated Learning using Preference-Optimized Synthetic Data", arXiv:2504.16438, section 4.1:
mean cosine, standardised, clipped to C) or :func:`popri.feedback.histogram.client_vector`
(PrE-Text, "PrE-Text: Training Language Models on Private Federated Data in the Age of LLMs",
arXiv:2406.02958, section 3: at most M votes); in a DP-FL round each client's clipped model
update (:mod:`popri.methods.dpfl.rounds`, DP-FedAvg / DP-FTRL).  It sums them and adds its
share of the noise:

- ``gaussian``: N(0, s^2) per coordinate, s = z C / sqrt(n_min) (:mod:`popri.federated.secagg`);
  Flower's SecAgg+ then quantises the float vector;
- ``ddg``: each client vector rounded to the integer grid of :mod:`popri.privacy.ddg`
  (conditional randomised rounding), summed, plus a discrete Gaussian share, reduced to
  [-m/2, m/2) -- integers that pass through Flower's quantisation unchanged.

No Flower import here: the client app (:mod:`popri.apps.flower.client_app`) and the tests
call :func:`upload`.
"""

from __future__ import annotations

import numpy as np

from popri.federated.participation import factorize
from popri.feedback import cosine, histogram
from popri.eval.local import node_updates
from popri.kit import round_seed
from popri.privacy import ddg
from popri.privacy.noise import SecureRandom


def node_rng(settings: dict, index: int):
    """The node's random source (rounding, noise share, caps): the OS CSPRNG in release mode
    and on every deployed SuperNode -- a seeded stream there would be known to the server (it
    sends the seed), which could regenerate every noise share and subtract it from the SecAgg+
    sum; seeded by (seed, round, node) only in a simulation's research mode, where the server
    and the nodes are one process tree anyway and reruns are byte-identical."""
    if settings.get("release") or settings.get("deployed"):
        return SecureRandom()
    # a stream apart from the in-process sampling / cap / noise streams of the same seed
    return np.random.default_rng([int(settings["seed"]), int(settings["round"]), index,
                                  0x666C77])


def client_vectors(settings: dict, syn: np.ndarray, emb, client_ids, rng):
    """Every client's clipped vector (float64 [n]) in first-appearance order: its feedback on
    the synthetic embeddings ``syn``; or, in a DP-FL round (mode ``fl``), its model update from
    the global weights ``syn`` on its texts ``emb``, clipped to C -- yielded one at a time
    (:func:`popri.eval.local.node_updates`: a full-model update is large)."""
    mode = settings["mode"]
    if mode == "fl":
        return node_updates(settings, syn, emb, client_ids, rng,
                            round_seed=round_seed(int(settings["seed"]), int(settings["round"])))
    codes, clients = factorize(list(client_ids))
    cap = settings.get("node_cap")  # deployment: the node caps its own rows (M)
    index = histogram.nn_index(syn) if mode == "nn-histogram" else None
    out = []
    for c in range(len(clients)):
        rows = np.asarray(emb[codes == c])
        if mode == "cosine":
            out.append(cosine.client_vector(rows, syn, clip=settings["clip"],
                                            standardize=settings["standardize"],
                                            max_per_client=cap, rng=rng))
        else:
            out.append(histogram.client_vector(rows, syn, max_per_client=cap, rng=rng,
                                               index=index))
    return out


def upload(settings: dict, syn: np.ndarray, emb: np.ndarray, client_ids, rng) -> np.ndarray:
    """The node's upload, float64 [n_syn]: sum of its clients' vectors + its noise share
    (``gaussian``), or the centred modular integers of the distributed discrete Gaussian
    (``ddg``).  ``rng``: numpy Generator (research) or SecureRandom (release)."""
    vecs = client_vectors(settings, syn, emb, client_ids, rng)
    n = len(syn)
    secagg = settings["secagg"]
    if secagg["mechanism"] == "ddg":
        p = ddg.DDGPlan.from_dict(settings["ddg"])
        ints = np.zeros(p.noise_dim, dtype=np.int64)  # D when the plan rotates
        for v in vecs:
            ints += ddg.round_client(v, p, rng)
        ints += ddg.noise_share(p, rng)
        return ddg.encode(ints, p).astype(np.float64)
    total = np.zeros(n)
    for v in vecs:  # streaming: one client's vector at a time
        total += v
    s = float(secagg["node_std"])
    if s > 0:
        total = total + np.asarray(rng.normal(0.0, s, size=n), dtype=np.float64)
    return np.asarray(total, dtype=np.float64)
