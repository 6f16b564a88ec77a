"""popri pe: Private Evolution / PrE-Text population steps (maths: popri/methods/pe/draw.py).

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


def init(
    public: str = typer.Argument(..., help="Public text: JSONL with 'text', a dataset dir, or '-'."),
    num: int = typer.Option(..., "--num", "-n", min=1, help="Population size N_syn (PrE-Text D.2: "
                            "1024 at eps 1.29, 2048 at eps 7.58)."),
    split: str = typer.Option("train", "--split", help="Split when PUBLIC is a dataset directory."),
    seed: int = typer.Option(0, "--seed", help="Seeds the draw."),
    out: str = typer.Option("-", "--out", "-o", help="Population JSONL, or '-'."),
) -> None:
    from popri.core import io, log
    from popri.models.embed import text_records
    from popri.core.guard import check_outputs
    from popri.methods.pe.draw import initial_population
    from popri.privacy.noise import make_rng

    check_outputs([out], [public])
    recs, src = text_records(public, split)
    idx = initial_population(recs, num, make_rng(seed, stream="pe-init"))
    rows = [{"id": f"r1-p{i}", "round": 1, "text": " ".join(recs[j]["text"].split()),
             "source_id": str(recs[j]["id"])} for i, j in enumerate(idx)]
    io.write_jsonl(rows, out)
    log.info(f"pe init: {len(rows)} samples from {len(recs)} public texts ({src})")


def draw(
    population: str = typer.Option(..., "--population", "-p", help="Population JSONL (round t)."),
    scores: str = typer.Option(..., "--scores", help="HIST.npy (+ .json sidecar) from 'popri score "
                               "--mode nn-histogram' / 'popri aggregate', or JSONL {id, score}."),
    num: int = typer.Option(..., "--num", "-n", min=1, help="Survivors N_syn to draw."),
    round_: int = typer.Option(1, "--round", help="Round t (goes into the ids)."),
    seed: int = typer.Option(0, "--seed", help="Seeds the draw."),
    release: bool = typer.Option(False, "--release", envvar="POPRI_RELEASE",
                                 help="Draw from the OS CSPRNG (seed ignored)."),
    out: str = typer.Option("-", "--out", "-o", help="Survivors JSONL, or '-'."),
    stats_out: Optional[str] = typer.Option(None, "--stats-out", help="JSON: distinct survivors, "
                                            "mass, whether the draw fell back to uniform."),
) -> None:
    import json

    import numpy as np

    from popri.core import io, log
    from popri.core.guard import check_outputs
    from popri.methods.pe.draw import draw_survivors
    from popri.methods.popri.prefs import align_scores, load_score_vector
    from popri.privacy.noise import make_rng

    check_outputs([out, stats_out], [population, scores])
    pop = list(io.iter_jsonl(population, required=("id", "text"), locate=True))
    arr, ids = load_score_vector(scores)
    hist = align_scores(pop, arr, ids, path=scores)
    idx, uniform = draw_survivors(hist, num, make_rng(seed, secure=release, stream="pe-draw"))
    if uniform:
        log.warn("pe draw: the thresholded histogram is all zero; drawing uniformly "
                 "(lower the threshold H or raise the population's quality)")
    rows = [{"id": f"r{round_}-s{i}", "round": round_, "parent_id": str(pop[j]["id"]),
             "text": pop[j]["text"], "votes": float(hist[j])} for i, j in enumerate(idx)]
    distinct = int(np.unique(idx).size)
    stats = {"population": len(pop), "survivors": len(rows), "distinct": distinct,
             "nonzero_bins": int((np.asarray(hist) > 0).sum()), "mass": float(np.maximum(hist, 0).sum()),
             "uniform_fallback": uniform, "round": round_}
    with io.AtomicOutputs() as staged:
        if out != "-":
            with open(staged.path(out), "w", encoding="utf-8") as fh:
                fh.writelines(io.dumps(r) + "\n" for r in rows)
        if stats_out:
            with open(staged.path(stats_out), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(stats, indent=2) + "\n")
    if out == "-":
        io.write_jsonl(rows, "-")
    log.info(f"pe draw: {len(rows)} survivors, {distinct} distinct, from {stats['nonzero_bins']} "
             f"of {len(pop)} samples with votes left after the threshold")


def seeds(
    survivors: List[str] = typer.Argument(..., help="Survivors JSONL of each round ('pe draw')."),
    out: str = typer.Option("-", "--out", "-o", help="Seed set JSONL, or '-'."),
) -> None:
    from popri.core import io, log
    from popri.core.guard import check_outputs
    from popri.methods.pe.draw import union_of_sets

    check_outputs([out], survivors)
    rounds = []
    for k, path in enumerate(survivors, start=1):
        rows = list(io.iter_jsonl(path, required=("text",)))
        t = int(rows[0].get("round", k)) if rows else k
        rounds.append((t, rows))
    seed_rows = union_of_sets(rounds)
    io.write_jsonl(seed_rows, out)
    log.info(f"pe seeds: {len(seed_rows)} distinct texts from {sum(len(r) for _, r in rounds)} "
             f"survivors over {len(rounds)} round(s)")


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Private Evolution / PrE-Text population steps.", no_args_is_help=True)
    group.command("init", help=_INIT)(init)
    group.command("draw", help=_DRAW)(draw)
    group.command("seeds", help=_SEEDS)(seeds)
    app.add_typer(group, name="pe")
