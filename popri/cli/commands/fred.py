"""popri fred: FreD, a DP Frechet distance between public candidates and federated client data.

    popri fred stats --private data/sotu --epsilon 0.6 --delta 2e-6 --clip 1 --out runs/fred/stats.npz
    popri fred stats --private data/sotu --non-private --out runs/fred/exact.npz
    popri fred compare --stats runs/fred/stats.npz cand_a.jsonl cand_b.npy data/other
    popri embed cand.jsonl --out - | popri fred compare --stats runs/fred/stats.npz - --json

Settings: :class:`popri.specs.privacy.FredStatsSpec`; the steps:
:func:`popri.methods.fred.steps.release_stats` and
:func:`~popri.methods.fred.steps.rank_candidates`; the maths (relations, sensitivities): :mod:`popri.methods.fred.stats`; the calibration:
:func:`popri.privacy.calibration.gaussian_multiplier`.
"""

from __future__ import annotations

from typing import List, Optional

import typer

from popri.cli.options import param_error, unwrap
from popri.core.io import dumps
from popri.methods.fred.steps import OPTION, rank_candidates, release_stats
from popri.privacy.accounting import ParameterError
from popri.specs.privacy import FredStatsSpec
from popri.cli.options import command
from popri.specs.commands.fred import FredCompareCall, FredStatsCall

fred_app = typer.Typer(
    help="FreD (arXiv:2302.09042, Algorithm 1): release the clients' embedding mean and "
         "covariance once under DP ('stats'), then rank any number of public candidate datasets "
         "by their Frechet distance to them ('compare', no further privacy cost).",
    no_args_is_help=True)

STATS_HELP = """Release the clients' embedding mean and covariance under DP, once (FreD:
"Privately Customizing Prefinetuning to Better Match User Data in Federated Learning",
arXiv:2302.09042, Algorithm 1 and Proposition 3.1).

Client side, pass 1: every client clips its embeddings to L2 norm c (--clip) and uploads the sum
of the clipped vectors; the server adds Gaussian noise to the sum and divides by n: the DP mean.
Pass 2: clients centre the clipped embeddings on the DP mean, clip again to c and upload the sum
of their outer products; the server adds noise to the upper triangle (diagonal included),
mirrors it, divides by n and projects to the nearest PSD matrix (eigenvalues clipped at 0).
Each release is (eps, delta)-DP; both together (2 eps, 2 delta)-DP by basic composition
(Proposition 3.1).  The ledger records both as Gaussian releases, so 'popri account ledger'
composes them (more tightly than 2 eps).

Neighbouring relation.  A record is one sample (--level sample, as the paper) or one client's
data (--level user; each client keeps at most M samples, --max-samples-per-client, default 8 as
PrE-Text, a seeded choice).  --relation replace-one (default): the neighbours have as many
records and differ in one record's content.  add-remove: one record more or less (the paper's
Definition 2.1).  With m = 1 at sample level and m = M at user level, the L2 sensitivities of
the two sums are:

Mean, replace-one: 2 m c (each of the two records' sums has norm <= m c).  At sample level n is
fixed by the relation, hence public: noise std on the mean tau1 = 2c z / n, the paper's tau1.  At
user level the number of samples is private and is released as one more coordinate g n_k of the
same sum with g = c, which keeps the sensitivity at 2 m c (in general sqrt(max(4 m^2 c^2,
(m+1)^2 c^2 + g^2 (m-1)^2))).

Mean, add-remove: n is private and rides along as the coordinate g n_k with g = c/2: sensitivity
m sqrt(c^2 + g^2) = 1.118 m c; the count's noise std is (that noise std) / g.

Covariance (the released upper triangle has L2 norm <= the Frobenius norm of the symmetric
matrix; a record's sum of y y^T is PSD with Frobenius norm <= trace <= m c^2): add-remove m c^2
(sample level: the paper's tau2 = c^2 z / n); replace-one sqrt(2) m c^2, since ||V - V'||_F^2 <=
||V||^2 + ||V'||^2 for PSD V, V', attained by orthogonal y, y'.  The paper's c^2/n is the
add/remove bound: under replace-one, which its tau1 = 2c/n assumes, popri adds sqrt(2) c^2 z / n.

Calibration (--calibration): classic z = sqrt(2 ln(1.25/delta)) / eps (the paper; Dwork & Roth
2014, Theorem A.1, proven for eps < 1 only, so larger eps is refused) or analytic (Balle & Wang
2018: the smallest z with Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z) <= delta, from
dp-accounting's exact solver; always below classic).  Noise std on each sum = z x its
sensitivity.

Covariance estimate: the nearest PSD matrix (the paper; default) keeps the positive half of the
noise, which dominates every eigenvalue below the noise edge 2 tau2 sqrt(d); candidates with
more spread then look closer.  --denoise sets those eigenvalues to 0 and debiases the ones above
the edge (spiked Wigner model), from the same release at no privacy cost.  Measured
(examples/fred_mixture.py, SOTU, n = 39277, d = 384, eps = 0.6, delta = 2e-6): 99% vs 100%
SOTU candidates are ordered rightly in 0/5 seeds with the projection and 5/5 with --denoise.

Outputs: STATS.npz (float64: mean of length d, cov d x d, n), STATS.json (kind "fred-stats", dim, n and
whether it is public, embedding model, every parameter, sensitivities, the noise stds tau1/tau2
on the mean/covariance, the ledger entries) and both entries appended to ledger.jsonl next to
STATS.  No file holds an exact count when n is private.  --non-private writes the exact mean
and (N-1) covariance of all embeddings instead (no clipping, no noise: what 'popri eval fid'
fits), "private": false and no ledger entry: a reference, with no privacy at all."""

COMPARE_HELP = """Frechet distance of each candidate to the statistics of 'popri fred stats',
ranked ascending (closest first).  No privacy is spent: only the released statistics are used.

d = ||m_c - m||^2 + Tr(C_c + C - 2 (C_c C)^(1/2)), with the candidate's mean and (N-1)
covariance; the square-root trace comes from the symmetric form sqrt(C_c) C sqrt(C_c) by
eigen-decompositions with round-off eigenvalues clipped at 0 (popri/models/fid.py, the same code as
'popri eval fid' and DPO checkpoint selection): no complex parts, no negative covariance term.

Candidates: JSONL texts, JSONL rows with 'embedding', embedding sets .npy, federated dataset
directories (their --split), or '-' (stdin, once).  Texts are embedded with the model recorded
in STATS.json (override with --model; it must match).  Prints a table (rank, fred, n,
candidate) or, with --json, a JSON list of {"candidate", "fred"}."""


@command(FredStatsCall)
def stats(
    private: str, out: str, seed: int, split: str, model: Optional[str], *, spec: FredStatsSpec
) -> None:
    try:
        release_stats(private, out, spec, seed=seed, split=split, model=model)
    except ParameterError as e:
        raise param_error(e, OPTION) from None


@command(FredCompareCall)
def compare(
    candidates: List[str], stats_path: str, json_out: bool, model: Optional[str], split: str
) -> None:
    rows = rank_candidates(candidates, stats_path, model=model, split=split)
    if json_out:
        typer.echo(dumps([{"candidate": r["candidate"], "fred": r["fred"]} for r in rows]))
        return
    table = [("rank", "fred", "n", "candidate")] + [
        (str(i), f"{r['fred']:.6f}", str(r["n"]), r["candidate"])
        for i, r in enumerate(rows, start=1)]
    width = [max(len(t[j]) for t in table) for j in range(3)]
    for t in table:
        typer.echo("  ".join(x.ljust(w) for x, w in zip(t[:3], width)) + "  " + t[3])


def register(app: typer.Typer) -> None:
    fred_app.command("stats", help=unwrap(STATS_HELP))(stats)
    fred_app.command("compare", help=unwrap(COMPARE_HELP))(compare)
    app.add_typer(fred_app, name="fred")
