"""popri pe: Private Evolution / PrE-Text population steps (library: popri/methods/pe/draw.py;
no settings beyond sizes, seeds and rounds, hence no spec).

    popri pe init data/public --num 64 --seed 0 --out runs/pe/round1/population.jsonl
    popri pe draw --population runs/pe/round1/population.jsonl --scores runs/pe/round1/hist.npy \
        --num 64 --round 1 --seed 0 --out runs/pe/round1/survivors.jsonl
    popri pe seeds runs/pe/round1/survivors.jsonl runs/pe/round2/survivors.jsonl --out seeds.jsonl

The whole loop (``popri run`` with ``method: pe``): init -> per round [vary --lookahead (or
embed) -> score --mode nn-histogram -> pe draw -> vary] -> pe seeds -> expand.
"""

from __future__ import annotations

from typing import List, Optional

import typer

from popri.cli.options import unwrap
from popri.core import log
from popri.methods.pe.draw import draw_file, init_file, seeds_file
from popri.cli.options import command
from popri.specs.commands.pe import PeDrawCall, PeInitCall, PeSeedsCall

_INIT = """The initial population S_1 (PrE-Text Algorithm 1, line 2): --num records drawn from public
text (a JSONL with "text", or a federated dataset directory's --split), without replacement when
there are enough, seeded.  Output JSONL {"id": "r1-p{i}", "round": 1, "text", "source_id"} on
stdout or --out (atomic).  No private data is read."""

_DRAW = """The survivors S'_t (PrE-Text Algorithm 1, lines 7-8): P_t = hist / sum(hist) from the DP
histogram of 'popri score --mode nn-histogram' (already thresholded at H by score / aggregate),
then --num draws with replacement (PE keeps duplicates: a popular sample gets several
variations).  If the threshold removed all mass the draw is uniform (warned, recorded).
Post-processing of the released histogram: no privacy is spent, no ledger entry.

--population: the population JSONL whose ids the histogram's sidecar lists (matched by id,
else row-aligned).  Output JSONL, in draw order: {"id": "r{round}-s{i}", "round",
"parent_id", "text", "votes"} (votes = the histogram value of the parent).  Seeded by --seed;
--release draws from the OS CSPRNG instead (PrE-Text's P_t is DP already: this only matters
to users who want no seeded randomness at all)."""

_SEEDS = """The DP seed set: the union of Set(S'_t) over all rounds (PrE-Text Algorithm 1, line 11;
PE kept only the last population).  Texts are deduplicated after whitespace normalisation, in
order of first appearance.  Output JSONL {"id": "seed{i}", "text", "first_round", "source_id",
"draws"} on stdout or --out (atomic) -- the input of 'popri expand'."""


@command(PeInitCall)
def init(public: str, num: int, split: str, seed: int, out: str) -> None:
    st = init_file(public, num, split=split, seed=seed, out=out)
    log.info(f"pe init: {st['samples']} samples from {st['public']} public texts ({st['source']})")


@command(PeDrawCall)
def draw(
    population: str, scores: str, num: int, round_: int, seed: int, release: bool, out: str,
    stats_out: Optional[str]
) -> None:
    st = draw_file(population, scores, num, round_no=round_, seed=seed, release=release, out=out,
                   stats_out=stats_out)
    log.info(f"pe draw: {st['survivors']} survivors, {st['distinct']} distinct, from "
             f"{st['nonzero_bins']} of {st['population']} samples with votes left after the "
             "threshold")


@command(PeSeedsCall)
def seeds(survivors: List[str], out: str) -> None:
    st = seeds_file(survivors, out=out)
    log.info(f"pe seeds: {st['seeds']} distinct texts from {st['survivors']} survivors over "
             f"{st['rounds']} round(s)")


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Private Evolution / PrE-Text population steps.", no_args_is_help=True)
    group.command("init", help=unwrap(_INIT))(init)
    group.command("draw", help=unwrap(_DRAW))(draw)
    group.command("seeds", help=unwrap(_SEEDS))(seeds)
    app.add_typer(group, name="pe")
