"""FewFedPIT's local aggregation sharing and the server's weighted average (Algorithm 1, lines
9 and 12-14).

    python -c "from popri.methods.fewfedpit.weights import mix; import numpy as np; print(mix(np.ones(2), np.zeros(2), 0.5))"

"FewFedPIT" (arXiv:2403.06131), section 3.4: a sampled client k uploads
W^a_k = beta W^l_k + (1 - beta) W^g_k -- its private-data weights mixed with its weights trained
on the synthetic set, both started from the round's global weights W^g_{r-1} (beta = 0.5 by
default; beta = 1 is FedIT: only private training; beta = 0 uploads synthetic-data weights
only).  The server averages W^g_r = sum_k p_k W^a_k with p_k = n_k / sum_i n_i, n_k the
client's local example count.  Weights are the flat trainable vectors (the LoRA A and B
matrices, averaged entrywise as in FedIT, Zhang et al. 2023, arXiv:2305.05644).

:class:`WeightedSum` keeps a running sum so a round never holds every client's weights at once
(streaming, as :mod:`popri.methods.dpfl.rounds`).
"""

from __future__ import annotations

import numpy as np


def mix(w_local: np.ndarray, w_public: np.ndarray, beta: float) -> np.ndarray:
    """beta * W^l + (1 - beta) * W^g, in float64 then back to float32."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if w_local.shape != w_public.shape:
        raise ValueError(f"shapes differ: {w_local.shape} vs {w_public.shape}")
    out = beta * w_local.astype(np.float64) + (1.0 - beta) * w_public.astype(np.float64)
    return out.astype(np.float32)


class WeightedSum:
    """sum_k n_k W_k and sum_k n_k, added one client at a time; :meth:`average` is the FedAvg
    weighted mean."""

    def __init__(self) -> None:
        self.total: np.ndarray | None = None
        self.weight = 0.0
        self.clients = 0

    def add(self, w: np.ndarray, n: float) -> None:
        if n <= 0:
            raise ValueError(f"a client's weight n_k must be > 0, got {n}")
        w = w.astype(np.float64)
        if self.total is None:
            self.total = np.zeros_like(w)
        elif self.total.shape != w.shape:
            raise ValueError(f"shapes differ: {self.total.shape} vs {w.shape}")
        self.total += float(n) * w
        self.weight += float(n)
        self.clients += 1

    def average(self) -> np.ndarray:
        if self.total is None:
            raise ValueError("no client was added")
        return (self.total / self.weight).astype(np.float32)
