"""DP client feedback on synthetic samples: the maths behind ``popri score`` / ``popri aggregate``.

    popri score --mode cosine --private runs/priv.npy --synthetic runs/syn.npy \\
        --noise-multiplier 1.05 --clients-per-round 1000 --seed 0 --out runs/scores.npy
    popri score --mode nn-histogram --private data/sotu --synthetic runs/lookahead.npy \\
        --noise-multiplier 10 --threshold 20 --seed 0 --out runs/hist.npy
    python -m pytest -q tests/test_scoring.py

One round: draw the participating clients (:func:`sample_clients`), let each score every
synthetic sample, clip, add Gaussian noise, sum (secure aggregation), reduce (:func:`finish`).

cosine (POPri, Algorithm 1 lines 16-20 and Algorithm 2), client i with private embeddings E_i::

    s_i[j]   = mean_{e in E_i} cos(e, y_j)                  (y_j: synthetic embedding j)
    z_i      = (s_i - mean(s_i)) / std(s_i)                  only with --standardize
    v_i      = z_i * min(1, C / |z_i|)                       clip to L2 norm C: sensitivity C
    upload_i = v_i + N(0, Z^2 C^2 / L)                       L participating clients
    scores   = sum_i upload_i / D                            D = q*N (Poisson) or L

Because cos(e, y) = <e/|e|, y/|y|>, s_i = Y m_i with Y the row-normalised synthetic matrix and
m_i the mean of the client's normalised embeddings.  Standardising and clipping only rescale and
shift s_i, by scalars that need mean(s_i) = ybar.m_i and var(s_i) = m_i' K m_i (K: the d x d
covariance of the rows of Y).  So v_i = a_i Y m_i - b_i, and the whole round is
Y (sum_i a_i m_i) - sum_i b_i: O(L d^2 + n d) instead of the O(L n d) of scoring client by
client.  Per-client rows (--per-client-out) are materialised block by block with the same a_i, b_i.

nn-histogram (PE / PrE-Text, Algorithm 2 "Histogram"): each client keeps at most M private samples
(seeded choice); each votes for its nearest synthetic sample in L2 distance (faiss IndexFlatL2, on
every GPU when faiss sees one), so a client's histogram has L2 norm <= M (sensitivity M).
Noise N(0, Z^2 M^2) on the sum, then threshold: max(hist - H, 0).  The output is a sum.

Noise placement: with per-client rows each row gets N(0, (Z s)^2 / L); without them one draw of
N(0, (Z s)^2) is added to the sum, which has exactly the same distribution.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
from scipy import sparse

from popri.core.errors import InputError

BLOCK_BYTES = 256 << 20  # a client block's [L_b, n_syn] float32 matrix is about this big
ROW_BLOCK = 32768  # private rows read at a time


# --------------------------------------------------------------------------- clients and sampling
@dataclass
class Sample:
    """The clients taking part in one round."""

    members: np.ndarray  # sorted indices into the client list
    total: int  # N: all clients
    sampling: str  # "none" | "poisson" | "fixed"
    sample_rate: float  # q: Poisson rate, L/N for a fixed count, 1 for everyone

    @property
    def denominator(self) -> float:
        """What the mean divides by: the expected count q*N under Poisson, else L."""
        if self.sampling == "poisson":
            return self.sample_rate * self.total
        return float(len(self.members))


def factorize(client_ids: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Row -> client index, with clients in sorted order (independent of row order)."""
    first: dict[str, int] = {}
    codes = np.fromiter((first.setdefault(c, len(first)) for c in client_ids), dtype=np.int64,
                        count=len(client_ids))
    clients = sorted(first)
    remap = np.empty(len(first), dtype=np.int64)
    remap[[first[c] for c in clients]] = np.arange(len(clients))
    return remap[codes], clients


def sample_clients(n_clients: int, rng, *, sample_rate: float | None = None,
                   clients_per_round: int | None = None) -> Sample:
    """Poisson sampling at rate q, exactly L clients without replacement, or everyone."""
    if sample_rate is not None and clients_per_round is not None:
        raise ValueError("sample_rate and clients_per_round are mutually exclusive")
    everyone = Sample(np.arange(n_clients), n_clients, "none", 1.0)
    if sample_rate is not None:
        if not 0 < sample_rate <= 1:
            raise ValueError("sample_rate must be in (0, 1]")
        if sample_rate == 1:
            return everyone
        return Sample(np.flatnonzero(rng.random(n_clients) < sample_rate), n_clients, "poisson",
                      float(sample_rate))
    if clients_per_round is not None:
        if not 1 <= clients_per_round <= n_clients:
            raise ValueError(f"clients_per_round must be in [1, {n_clients}]")
        if clients_per_round == n_clients:
            return everyone
        members = np.sort(np.asarray(rng.choice(n_clients, clients_per_round, replace=False)))
        return Sample(members, n_clients, "fixed", clients_per_round / n_clients)
    return everyone


def cap_per_client(codes: np.ndarray, max_per_client: int | None, rng) -> np.ndarray | None:
    """Keep-mask choosing at most M rows per client uniformly at random (None: keep all)."""
    if max_per_client is None:
        return None
    order = np.lexsort((rng.random(len(codes)), codes))
    run = codes[order]
    rank = np.arange(len(run)) - np.searchsorted(run, run, side="left")
    keep = np.zeros(len(codes), dtype=bool)
    keep[order[rank < max_per_client]] = True
    return keep


# --------------------------------------------------------------------------- streaming private rows
def row_blocks(emb: np.ndarray, rows: int = ROW_BLOCK) -> Iterator[tuple[int, np.ndarray]]:
    """(start, float32 block) over the rows of ``emb``.

    A ``.npy`` opened with mmap is read with plain file reads, so resident memory stays one
    block however large the file (mapped pages would otherwise count towards RSS).
    """
    n, d = emb.shape
    if isinstance(emb, np.memmap) and isinstance(emb.base, mmap.mmap) and emb.flags.c_contiguous:
        with open(emb.filename, "rb") as fh:
            for s in range(0, n, rows):
                k = min(rows, n - s)
                fh.seek(emb.offset + s * d * emb.dtype.itemsize)
                blk = np.fromfile(fh, dtype=emb.dtype, count=k * d).reshape(k, d)
                yield s, blk.astype(np.float32, copy=False)
    else:
        for s in range(0, n, rows):
            yield s, np.asarray(emb[s:s + rows], dtype=np.float32)


def _participating_rows(emb, codes, sample: Sample, keep, source: str):
    """Yield (row block, participant index per row) for the rows that take part; checks NaN/inf."""
    member_of = np.full(sample.total, -1, dtype=np.int64)
    member_of[sample.members] = np.arange(len(sample.members))
    for s, blk in row_blocks(emb):
        finite = np.isfinite(blk).all(axis=1)
        if not finite.all():
            row = s + int(np.argmin(finite)) + 1
            raise InputError(f"embedding row {row} contains NaN or infinity", path=source,
                             line=row, field="embedding")
        who = member_of[codes[s:s + len(blk)]]
        if keep is not None:
            who = np.where(keep[s:s + len(blk)], who, -1)
        sel = who >= 0
        if sel.any():
            yield blk[sel], who[sel]


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (all-zero rows stay zero: cosine 0 with everything)."""
    x = np.array(x, dtype=np.float64)  # a copy
    norm = np.sqrt(np.einsum("ij,ij->i", x, x))
    x /= np.where(norm > 0, norm, np.inf)[:, None]
    return x


def client_means(emb, codes, sample: Sample, keep=None, source: str = "") -> np.ndarray:
    """m_i: mean of each participating client's L2-normalised embeddings, float64 [L, d]."""
    L, d = len(sample.members), emb.shape[1]
    sums, counts = np.zeros((L, d)), np.zeros(L)
    for x, who in _participating_rows(emb, codes, sample, keep, source):
        # sum the block's rows per client: a 0/1 [clients in block, rows] sparse matrix @ rows
        present, inv = np.unique(who, return_inverse=True)
        onehot = sparse.csr_matrix((np.ones(len(who)), (inv, np.arange(len(who)))),
                                   shape=(len(present), len(who)))
        sums[present] += onehot @ normalize_rows(x)
        counts += np.bincount(who, minlength=L)
    sums /= np.maximum(counts, 1)[:, None]
    return sums


# --------------------------------------------------------------------------- cosine (POPri)
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


# --------------------------------------------------------------------------- nn-histogram (PE)
def nn_index(syn: np.ndarray):
    """Exact L2 index over the synthetic embeddings; on every GPU when faiss sees one."""
    import faiss

    index = faiss.IndexFlatL2(syn.shape[1])
    if hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0:
        index = faiss.index_cpu_to_all_gpus(index)
    index.add(np.ascontiguousarray(syn, dtype=np.float32))
    return index


def nearest_votes(emb, codes, sample: Sample, syn, keep=None, source: str = ""):
    """(participant index, nearest synthetic index) of every kept private sample, sorted by
    participant."""
    index = nn_index(syn)
    who_all, lab_all = [], []
    for x, who in _participating_rows(emb, codes, sample, keep, source):
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


# --------------------------------------------------------------------------- one round
def block_clients(n_syn: int, block: int | None = None) -> int:
    return int(block) if block else max(1, BLOCK_BYTES // (4 * max(n_syn, 1)))


def noisy_sum(n: int, L: int, *, exact, rows, std_sum: float, noise_rng, rows_out=None,
              block: int | None = None, sensitivity: float | None = None) -> np.ndarray:
    """The sum of the L clients' clipped rows plus noise of std ``std_sum`` on the sum, float64 [n].

    Without ``rows_out``: ``exact()`` (the sum, computed without forming the rows) plus one draw
    of N(0, std_sum^2).  With ``rows_out`` ([L, n]): each client's row ``rows(c0, c1)`` plus its own
    N(0, std_sum^2 / L) is written there and summed; if L = 0 (a Poisson draw of nobody),
    ``rows_out`` is [1, n] and holds the server's N(0, std_sum^2).

    Release mode (``noise_rng`` is a :class:`popri.privacy.noise.SecureRandom`): the sum is
    snapped to a grid and gets discrete Gaussian noise
    (:func:`popri.privacy.noise.discrete_gaussian_release`, safe in floating point); its
    effective noise multiplier is :func:`popri.privacy.noise.effective_multiplier`.
    Per-client rows are refused there: the sum of per-client discrete noise shares is not a
    discrete Gaussian (the distributed discrete Gaussian needs its own accounting).
    """
    secure = bool(getattr(noise_rng, "secure", False))
    if secure and std_sum > 0:
        if rows_out is not None:
            raise ValueError("per-client noisy rows are not available in release mode")
        from popri.privacy.noise import discrete_gaussian_release

        return discrete_gaussian_release(exact(), std_sum, float(sensitivity), noise_rng)[0]
    if rows_out is None:
        total = exact()
        return total + std_sum * noise_rng.standard_normal(n) if std_sum > 0 else total
    if L == 0:
        rows_out[0] = std_sum * noise_rng.standard_normal((1, n), dtype=np.float32)
        return np.asarray(rows_out[0], dtype=np.float64)
    total, std_row = np.zeros(n), np.float32(std_sum / np.sqrt(L))
    step = block_clients(n, block)
    for c0 in range(0, L, step):
        r = rows(c0, min(c0 + step, L))
        if std_sum > 0:
            r += std_row * noise_rng.standard_normal(r.shape, dtype=np.float32)
        rows_out[c0:c0 + len(r)] = r
        total += r.sum(axis=0, dtype=np.float64)
    return total


def cosine_round(emb, codes, sample: Sample, syn, *, noise_multiplier: float, clip: float,
                 standardize: bool, noise_rng, keep=None, rows_out=None, block: int | None = None,
                 source: str = "") -> np.ndarray:
    """Noisy sum over participants of clipped (standardised) mean-cosine vectors, float64 [n]."""
    Y = normalize_rows(syn)
    means = client_means(emb, codes, sample, keep, source)
    a, b = cosine_coefficients(means, Y, clip, standardize)
    return noisy_sum(len(Y), len(means), exact=lambda: Y @ (a @ means) - b.sum(),
                     rows=lambda c0, c1: cosine_rows(means[c0:c1], Y, a[c0:c1], b[c0:c1]),
                     std_sum=noise_multiplier * clip, noise_rng=noise_rng, rows_out=rows_out,
                     block=block, sensitivity=clip)


def histogram_round(emb, codes, sample: Sample, syn, *, noise_multiplier: float,
                    max_per_client: int, keep, noise_rng, rows_out=None,
                    block: int | None = None, source: str = "") -> np.ndarray:
    """Noisy sum over participants of nearest-neighbour vote histograms, float64 [n]."""
    n = len(syn)
    who, labels = nearest_votes(emb, codes, sample, syn, keep, source)
    return noisy_sum(n, len(sample.members),
                     exact=lambda: np.bincount(labels, minlength=n).astype(np.float64),
                     rows=lambda c0, c1: histogram_rows(who, labels, c0, c1, n),
                     std_sum=noise_multiplier * max_per_client, noise_rng=noise_rng,
                     rows_out=rows_out, block=block, sensitivity=float(max_per_client))


def finish(total: np.ndarray, *, reduce: str, denominator: float,
           threshold: float | None) -> np.ndarray:
    """Server side: mean (divide by ``denominator``) or sum, then optional max(x - H, 0)."""
    out = total / denominator if reduce == "mean" else np.asarray(total, dtype=np.float64)
    if threshold is not None:
        out = np.maximum(out - threshold, 0.0)
    return out.astype(np.float32)


def sum_rows(arr: np.ndarray) -> np.ndarray:
    """Sum of the rows of a (possibly huge, memory-mapped) [L, n] array, float64."""
    total = np.zeros(arr.shape[1])
    for _, blk in row_blocks(arr, max(1, BLOCK_BYTES // (4 * max(arr.shape[1], 1)))):
        total += blk.sum(axis=0, dtype=np.float64)
    return total
