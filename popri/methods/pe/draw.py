"""Private Evolution / PrE-Text: the population, survivor draws and the DP seed set.

    popri pe init data/public --num 64 --seed 0 --out runs/pe/round1/population.jsonl
    popri pe draw --population runs/pe/round1/population.jsonl --scores runs/pe/round1/hist.npy \
        --num 64 --round 1 --seed 0 --out runs/pe/round1/survivors.jsonl
    popri pe seeds runs/pe/round*/survivors.jsonl --out runs/pe/seeds.jsonl

"PrE-Text: Training Language Models on Private Federated Data in the Age of LLMs" (PrE-Text,
arXiv:2406.02958), Algorithm 1: S_1 = an initial population of public samples; per round t,
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

from popri.core import io, log
from popri.core.errors import InputError
from popri.core.guard import check_outputs
from popri.data.records import text_records
from popri.methods.popri.prefs import align_scores, load_score_vector
from popri.privacy.noise import make_rng


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


# --------------------------------------------------------------------------- the steps
def init_file(public: str, num: int, *, split: str = "train", seed: int = 0,
              out: str = "-") -> dict:
    """``popri pe init``: S_1, ``num`` records of ``public`` (JSONL, a dataset directory's
    ``split``, or '-'), seeded -> JSONL ``{"id": "r1-p{i}", "round": 1, "text", "source_id"}``
    at ``out`` ('-': stdout, else atomically).  Returns counts for the log line."""
    check_outputs([out], [public])
    recs, src = text_records(public, split)
    idx = initial_population(recs, num, make_rng(seed, stream="pe-init"))
    rows = [{"id": f"r1-p{i}", "round": 1, "text": _norm(recs[j]["text"]),
             "source_id": str(recs[j]["id"])} for i, j in enumerate(idx)]
    io.write_jsonl(rows, out)
    return {"samples": len(rows), "public": len(recs), "source": src}


def draw_file(population: str, scores: str, num: int, *, round_no: int = 1, seed: int = 0,
              release: bool = False, out: str = "-", stats_out: str | None = None) -> dict:
    """``popri pe draw``: S'_t, ``num`` draws from P_t of the histogram ``scores`` over the
    ``population`` (matched by id, else row-aligned) -> JSONL ``{"id": "r{round}-s{i}", "round",
    "parent_id", "text", "votes"}`` at ``out`` and the draw's stats at ``stats_out`` (atomic).
    ``release``: the OS CSPRNG instead of ``seed``.  Returns the stats."""
    import json

    check_outputs([out, stats_out], [population, scores])
    pop = list(io.iter_jsonl(population, required=("id", "text"), locate=True))
    arr, ids = load_score_vector(scores)
    hist = align_scores(pop, arr, ids, path=scores)
    idx, uniform = draw_survivors(hist, num, make_rng(seed, secure=release, stream="pe-draw"))
    if uniform:
        log.warn("pe draw: the thresholded histogram is all zero; drawing uniformly "
                 "(lower the threshold H or raise the population's quality)")
    rows = [{"id": f"r{round_no}-s{i}", "round": round_no, "parent_id": str(pop[j]["id"]),
             "text": pop[j]["text"], "votes": float(hist[j])} for i, j in enumerate(idx)]
    stats = {"population": len(pop), "survivors": len(rows), "distinct": int(np.unique(idx).size),
             "nonzero_bins": int((np.asarray(hist) > 0).sum()),
             "mass": float(np.maximum(hist, 0).sum()), "uniform_fallback": uniform,
             "round": round_no}
    with io.AtomicOutputs() as staged:
        if out != "-":
            with open(staged.path(out), "w", encoding="utf-8") as fh:
                fh.writelines(io.dumps(r) + "\n" for r in rows)
        if stats_out:
            with open(staged.path(stats_out), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(stats, indent=2) + "\n")
    if out == "-":
        io.write_jsonl(rows, "-")
    return stats


def seeds_file(survivors: Sequence[str], *, out: str = "-") -> dict:
    """``popri pe seeds``: the DP seed set, :func:`union_of_sets` of the survivor files (one per
    round; a file's round is its rows' "round", else its position) -> JSONL at ``out``.  Returns
    counts for the log line."""
    check_outputs([out], survivors)
    rounds = []
    for k, path in enumerate(survivors, start=1):
        rows = list(io.iter_jsonl(path, required=("text",)))
        t = int(rows[0].get("round", k)) if rows else k
        rounds.append((t, rows))
    seed_rows = union_of_sets(rounds)
    io.write_jsonl(seed_rows, out)
    return {"seeds": len(seed_rows), "survivors": sum(len(r) for _, r in rounds),
            "rounds": len(rounds)}
