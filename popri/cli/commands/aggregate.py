"""popri aggregate: the server's sum of per-client uploads.

    popri score ... --per-client-out runs/clients.npy
    popri aggregate runs/clients.npy --out runs/scores.npy
    popri aggregate shard0.npy shard1.npy --out runs/scores.npy --reduce sum --threshold 20

Settings: :class:`popri.specs.feedback.AggregateSpec`; the shard reduction:
:func:`popri.federated.aggregation.aggregate_uploads`.
"""

from __future__ import annotations

from typing import List

import typer

from popri.cli.options import unwrap
from popri.core import io
from popri.federated.aggregation import aggregate_uploads
from popri.specs.feedback import AggregateSpec
from popri.cli.options import command
from popri.specs.commands.aggregate import AggregateCall

HELP = """Sum per-client uploads (from 'popri score --per-client-out') into one score vector.

Several files are shards of the same round: they must have the same synthetic ids, mode, round and
mechanism parameters, and disjoint clients. The default --reduce is what 'popri score' chose: a
cosine mean (POPri, arXiv:2504.16438, section 4.1, Algorithm 1) only over a PUBLIC count -- the
fixed L of --clients-per-round, or q*N / N from --public-clients -- else the sum (the number of
uploads is private under add/remove-one-client neighbours); --expected-clients N divides by a count
you declare public. nn-histogram sums, then max(hist - H, 0) with the H recorded by 'popri score'
(PrE-Text, arXiv:2406.02958, section 3), unless --threshold is given.

No new privacy is spent: the output sidecar and the ledger.jsonl next to it get the SAME ledger
entries (same release_id, so 'popri account ledger' counts them once).  --out - prints JSONL
{"id", "score"} and writes no ledger (the release is already recorded next to the inputs)."""

@command(AggregateCall)
def aggregate(files: List[str], out: str, *, spec: AggregateSpec) -> None:
    r = aggregate_uploads(files, spec, out=out)
    if out == io.STDIO:
        io.write_jsonl(({"id": i, "score": float(s)} for i, s in zip(r["ids"], r["scores"])), "-")


def register(app: typer.Typer) -> None:
    app.command("aggregate", help=unwrap(HELP))(aggregate)
