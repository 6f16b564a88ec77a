"""Who takes part in a round: client sampling, per-client caps, and the private rows they bring.

    popri score --private runs/priv.npy --synthetic runs/syn.npy -z 1.05 \\
        --clients-per-round 1000 --max-samples-per-client 8 --seed 0 --out runs/scores.npy
    python -m pytest -q tests/test_scoring.py -k "sampling or cap or factorize or row_blocks"

One round draws its participants with :func:`sample_clients`, the same three schemes as the
accountant knows them (:mod:`popri.privacy.accounting`)::

    Poisson     each client independently with probability q       (--sample-rate)
    fixed       exactly L of the N clients, without replacement    (--clients-per-round)
    none        everyone

Neither the realised count of a round nor N is public under add/remove-one-client neighbours
(the count changes with the data), so a release never divides by them: what a released sum may
be divided by is :func:`popri.federated.aggregation.public_count` (a fixed L, or q times a
declared public N).

A client contributes at most M of its samples (:func:`cap_per_client`, a seeded uniform choice):
the cap bounds one client's influence, the sensitivity of PrE-Text's vote ("PrE-Text: Training
Language Models on Private Federated Data in the Age of LLMs", arXiv:2406.02958, section 3) and
of FreD's user-level statistics ("Privately Customizing Prefinetuning to Better Match User Data in
Federated Learning", arXiv:2302.09042).

The private rows of a round are streamed (:func:`row_blocks`, :func:`participating_rows`), so
a private set larger than memory costs one block of resident memory.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from popri.core.errors import InputError

ROW_BLOCK = 32768  # private rows read at a time


@dataclass
class Participation:
    """The clients taking part in one round (the participants, not the texts they hold)."""

    members: np.ndarray  # sorted indices into the client list
    total: int  # N: all clients
    #: "none" | "poisson" | "fixed" | "bins" (DP-FTRL: each client independently to one of R
    #: rounds of an epoch, :func:`popri.methods.dpfl.rounds.epoch_bins`)
    sampling: str
    sample_rate: float  # q: Poisson rate, L/N for a fixed count, 1/R for bins, 1 for everyone

    @classmethod
    def everyone(cls, n_clients: int) -> "Participation":
        return cls(np.arange(n_clients), n_clients, "none", 1.0)


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
                   clients_per_round: int | None = None) -> Participation:
    """Poisson sampling at rate q, exactly L clients without replacement, or everyone."""
    if sample_rate is not None and clients_per_round is not None:
        raise ValueError("sample_rate and clients_per_round are mutually exclusive")
    everyone = Participation.everyone(n_clients)
    if sample_rate is not None:
        if not 0 < sample_rate <= 1:
            raise ValueError("sample_rate must be in (0, 1]")
        if sample_rate == 1:
            return everyone
        return Participation(np.flatnonzero(rng.random(n_clients) < sample_rate), n_clients,
                             "poisson", float(sample_rate))
    if clients_per_round is not None:
        if not 1 <= clients_per_round <= n_clients:
            raise ValueError(f"clients_per_round must be in [1, {n_clients}]")
        if clients_per_round == n_clients:  # L = N: still the fixed-L algorithm (q = 1), not
            # "everyone": on an add/remove neighbour with N + 1 clients it samples L of N + 1,
            # so it holds under replace one client (2C), as every fixed L (issue 43)
            return Participation(everyone.members, n_clients, "fixed", 1.0)
        members = np.sort(np.asarray(rng.choice(n_clients, clients_per_round, replace=False)))
        return Participation(members, n_clients, "fixed", clients_per_round / n_clients)
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


def cap_rows(rows: np.ndarray, max_per_client: int | None, rng=None) -> np.ndarray:
    """One client's own cap: at most M of its rows, chosen uniformly (``rng``), order kept."""
    if max_per_client is None or len(rows) <= max_per_client:
        return rows
    if rng is None:
        raise ValueError("capping a client's rows needs an rng")
    return rows[np.sort(rng.choice(len(rows), max_per_client, replace=False))]


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


def participating_rows(emb, codes, part: Participation, keep=None, source: str = ""):
    """Yield (row block, participant index per row) for the rows that take part (members of
    ``part``, kept by the cap); a NaN or infinite row is an InputError naming its line."""
    member_of = np.full(part.total, -1, dtype=np.int64)
    member_of[part.members] = np.arange(len(part.members))
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
