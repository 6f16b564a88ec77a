"""Private Evolution / PrE-Text: the population, survivor draws and the DP seed set.

    popri pe init data/public --num 64 --seed 0 --out runs/pe/round1/population.jsonl
    popri pe draw --population runs/pe/round1/population.jsonl --scores runs/pe/round1/hist.npy \
        --num 64 --round 1 --seed 0 --out runs/pe/round1/survivors.jsonl
    popri pe seeds runs/pe/round*/survivors.jsonl --out runs/pe/seeds.jsonl

PrE-Text Algorithm 1 (pre-text.txt): S_1 = an initial population of public samples; per round t,
hist_t = Histogram(S_t) (``popri score --mode nn-histogram``, the only step that touches private
data), P_t = hist_t / sum(hist_t), S'_t = N_syn draws from P_t (with replacement: duplicates are
what lets a good sample spread), S_{t+1} = Variation(S'_t) (``popri vary``); after T rounds the
DP seed set is the union of Set(S'_t) over t (PrE-Text's change to PE, which kept only S_T), and
``popri expand`` turns it into the synthetic set.  Everything here is post-processing of the
released histogram: it spends no privacy.

Threshold H (PrE-Text Algorithm 2 line 17, appendix D.2): H = 8 x 1.541 x sqrt(2) at eps 7.58 and
5.9 x 8 x 1.541 x sqrt(2) at eps 1.29 -- in both cases H equals the standard deviation of the noise
on the summed histogram, sensitivity M (8 samples per client) x noise multiplier z.  So the
default is ``default_threshold(z, M) = z * M``.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from popri.core.errors import InputError


def default_threshold(noise_multiplier: float, max_samples_per_client: int) -> float:
    """PrE-Text D.2: H = the noise std on the summed histogram = z * M."""
    return float(noise_multiplier) * float(max_samples_per_client)


def survivor_probabilities(hist: np.ndarray) -> tuple[np.ndarray, bool]:
    """P_t = hist / sum(hist) (negative entries, possible only without a threshold, count as 0).
    When every entry is 0 (the threshold removed all mass) the draw is uniform: returns (P,
    True).  This is post-processing of the released histogram."""
    h = np.asarray(hist, dtype=np.float64)
    if h.ndim != 1 or h.size == 0:
        raise InputError("the histogram must be a non-empty vector")
    if not np.all(np.isfinite(h)):
        raise InputError("the histogram has non-finite entries")
    h = np.maximum(h, 0.0)
    total = h.sum()
    if total <= 0:
        return np.full(h.size, 1.0 / h.size), True
    return h / total, False


def draw_survivors(hist: np.ndarray, num: int, rng) -> tuple[np.ndarray, bool]:
    """Indices of N_syn draws from P_t, with replacement, in draw order (PrE-Text Alg. 1 line 8)."""
    if num < 1:
        raise InputError("the number of survivors must be >= 1")
    p, uniform = survivor_probabilities(hist)
    idx = np.asarray(rng.choice(p.size, size=num, replace=True, p=p), dtype=np.int64)
    return idx, uniform


def initial_population(texts: Sequence[dict], num: int, rng) -> np.ndarray:
    """S_1: ``num`` public records, without replacement when there are enough of them."""
    n = len(texts)
    if n == 0:
        raise InputError("the public population is empty")
    if num <= n:
        return np.sort(np.asarray(rng.permutation(n)[:num], dtype=np.int64))
    return np.asarray(rng.choice(n, size=num, replace=True), dtype=np.int64)


def _norm(text: str) -> str:
    return " ".join(text.split())


def union_of_sets(rounds: Iterable[tuple[int, Sequence[dict]]]) -> list[dict]:
    """The DP seed set: the union over rounds of Set(S'_t) (PrE-Text Alg. 1 line 11).  Texts are
    compared after whitespace normalisation; each keeps its first appearance (round, id) and how
    many draws it received over all rounds."""
    seen: dict[str, dict] = {}
    for t, rows in rounds:
        for r in rows:
            key = _norm(r["text"])
            if not key:
                continue
            if key in seen:
                seen[key]["draws"] += 1
                continue
            seen[key] = {"id": f"seed{len(seen)}", "text": key, "first_round": t,
                         "source_id": r.get("id"), "draws": 1}
    return list(seen.values())
