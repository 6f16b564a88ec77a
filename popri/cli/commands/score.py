"""popri score: one round of DP client feedback on synthetic samples.

    popri score --mode cosine --private runs/priv.npy --synthetic runs/syn.npy \\
        --noise-multiplier 1.05 --clients-per-round 1000 --seed 0 --out runs/scores.npy
    popri embed syn.jsonl --out - | popri score --synthetic - --private data/sotu \\
        --noise-multiplier 1 --seed 0 --out runs/scores.npy

Settings: :class:`popri.specs.feedback.ScoreSpec`; the release: :func:`popri.feedback.release.
release_scores`; the maths: :mod:`popri.feedback.cosine`, :mod:`popri.feedback.histogram`,
:mod:`popri.federated.participation`, :mod:`popri.federated.aggregation`.
"""

from __future__ import annotations

from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core import io
from popri.core.errors import InputError
from popri.feedback.release import release_scores
from popri.specs.feedback import ScoreSpec
from popri.cli.options import command
from popri.specs.commands.score import ScoreCall

HELP = """Score synthetic samples with DP feedback from private clients (one round).

cosine (POPri, arXiv:2504.16438, section 4.1, Algorithm 1): each participating client scores every
synthetic sample by the mean cosine similarity to its private samples, z-scores its vector
(--standardize, as the POPri reference code does), clips it to L2 norm C (--clip, default 1) and
adds N(0, Z^2 C^2 / L); the output is the noisy SUM over clients, or the MEAN when the count is
public: a fixed --clients-per-round L, or --public-clients N (divided by q*N under Poisson
sampling). The realised client count is private under add/remove neighbours and never divides a
release.

nn-histogram (PrE-Text / Private Evolution, arXiv:2406.02958, section 3, Algorithm 1): each private
sample (at most M per client, --max-samples-per-client, default 8 as PrE-Text) votes for its
nearest synthetic sample (L2, faiss); noise N(0, Z^2 M^2) on the SUM, then max(hist - H, 0)
(--threshold). Lookahead (PrE-Text): pass the embedding set of the lookahead means as --synthetic.

Without --per-client-out the noise is drawn once on the sum, N(0, Z^2 s^2) (s = C or M), which is
distributed exactly as the sum of the L per-client draws.  With --per-client-out every client's
noised upload is written ([L, n_syn] float32; sum them with 'popri aggregate').

Outputs: SCORES.npy (float32, row-aligned with the synthetic ids) + SCORES.json (ids, mode, round,
params, ledger entry); the ledger entry is appended (under a file lock, before the outputs appear)
to ledger.jsonl next to the output. --out - prints JSONL {"id", "score"} on stdout; the ledger then
goes next to --per-client-out or into --ledger DIR (one of them is required).  Default delta 3e-6
(POPri B.1, PrE-Text).

Research mode (default): the noise comes from --seed, which the sidecar records, so anyone with the
sidecar can regenerate it; fine for experiments, not for publishing.  Release mode (--release): OS
randomness, no seed and no exact client counts in any file, and a discretised Gaussian (the sum
snapped to a power-of-two grid plus discrete Gaussian noise, immune to floating-point attacks); the
ledger records its effective noise multiplier (at most 1e-4 below -z). --diagnostic writes noise-free
scores marked NOT PRIVATE with no ledger entry (recovery-rate diagnostics).

--engine flower computes the same round on Flower's simulation runtime: the participants spread
over --supernodes virtual SuperNodes, each uploading its clients' vectors plus a noise share
through SecAgg+ (derived shares, threshold and quantisation), the distributed discrete Gaussian
by default (--secagg-mechanism); same outputs and ledger (docs/flower.md)."""


@command(ScoreCall)
def score(
    private: Optional[str], synthetic: str, noise_multiplier: float, seed: int, out: Optional[str],
    per_client_out: Optional[str], ledger_dir: Optional[str], model: Optional[str], split: str,
    round_: int, *, spec: ScoreSpec
) -> None:
    """Every ScoreCall field is an option (:func:`popri.cli.options.command`)."""
    if spec.diagnostic and out == io.STDIO:  # a pipe carries no provenance (issue 66)
        raise InputError("noise-free scores go to a file, whose provenance marks them not-dp "
                         "(a pipe carries no mark): give --out FILE", field="--diagnostic")
    r = release_scores(private, synthetic, spec, out=out, per_client_out=per_client_out,
                       ledger_dir=ledger_dir, seed=seed, round_=round_, model=model, split=split)
    if out == io.STDIO:
        io.write_jsonl(({"id": i, "score": float(s)} for i, s in zip(r["ids"], r["scores"])), "-")


def register(app: typer.Typer) -> None:
    app.command("score", help=unwrap(HELP))(score)
