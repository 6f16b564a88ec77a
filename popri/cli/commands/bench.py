"""popri bench: benchmark corpora -> federated datasets (train/val/test.jsonl + manifest.json).

    popri bench list
    popri bench fetch sotu --out data/sotu
    popri bench fetch shakespeare --out data/shakespeare --max-samples-per-client 8
    popri bench fetch debian --out data/debian --max-clients 500
    popri bench fetch my.csv --client-column user --out data/mine
    popri bench stats data/sotu [--json]
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core.guard import check_outputs
from popri.data.build import FILES
from popri.data.build import fetch as do_fetch
from popri.data.sources import SOURCES, list_sources
from popri.data.stats import dataset_stats, stats_table
from popri.specs.data import FetchSpec
from popri.cli.options import command
from popri.specs.commands.bench import BenchFetchCall, BenchListCall, BenchStatsCall

bench_app = typer.Typer(
    help="Benchmark corpora as federated datasets: list the sources, fetch one into a "
         "directory (train/val/test.jsonl + manifest.json), print its statistics.",
    no_args_is_help=True)

_FETCH_HELP = """Fetch a corpus, chunk it and split it by client into DIR.

NAME is a registered source ('popri bench list' says which are available here) or a local
.jsonl/.json/.csv/.parquet file (--client-column names the client): {sources}.  biorxiv and
congress are the POPri authors' LargeFedBench (arXiv:2504.16438, section 4), pubmed Aug-PE's
abstracts (POPri D.2.2).

Writes DIR/train.jsonl, val.jsonl, test.jsonl (records id, client_id, text, date if
the source has one, source fields) and DIR/manifest.json (source + version, chunking, tokenizer, split rule, seed, counts,
sha256 of every file, popri version).  Same inputs and options give byte-identical files.
A non-empty DIR that is not an earlier popri dataset is refused unless --force.

Chunking: whitespace normalised, whole sentences packed greedily into samples of at most
--max-tokens tokens (64: the sequence length of POPri B.1 / PrE-Text), longer sentences cut at
token boundaries; the original text is cut at character offsets, so casing survives the uncased
default tokenizer; samples under --min-words words are dropped."""


@command(BenchFetchCall)
def fetch(
    name: str, out: str, seed: int, force: bool, source: Optional[str], hub_id: Optional[str],
    revision: Optional[str], hub_split: Optional[str], client_column: Optional[str],
    text_column: Optional[str], date_column: Optional[str], *, spec: FetchSpec
) -> None:
    from pathlib import Path

    check_outputs([out, *(Path(out) / f for f in (*FILES, "manifest.json"))],
                  [name if Path(name).is_file() else None, source])
    do_fetch(name, out, spec, seed=seed, force=force, source=source, hub_id=hub_id,
             revision=revision, hub_split=hub_split, client_column=client_column,
             text_column=text_column, date_column=date_column)


def _fetch_help() -> str:
    """The help, its list of sources from the registry (one line each there)."""
    names = "; ".join(f"{s.name} (client = {s.client}; {s.origin})" for s in SOURCES.values())
    # one line per paragraph: the help formatter re-wraps them to the terminal
    return unwrap(_FETCH_HELP.replace("{sources}", names))


fetch.__doc__ = _fetch_help()


@command(BenchStatsCall)
def stats(dir: str, as_json: bool, tokenizer: Optional[str]) -> None:
    """Statistics of a dataset directory, per split.

    Clients, samples, samples per client, tokens per sample (counted with the manifest's tokenizer) and words per sample, each as mean / median / max; the files' sha256 are checked against the manifest. A table (or --json) on stdout.
    """
    import json

    from rich.console import Console

    st = dataset_stats(dir, tokenizer)
    if as_json:
        sys.stdout.write(json.dumps(st, indent=2) + "\n")
    else:
        Console(file=sys.stdout, width=160).print(stats_table(st))


@command(BenchListCall)
def list_(as_json: bool) -> None:
    """The known sources, their client unit, and whether each is available offline here."""

    import json

    from rich.console import Console
    from rich.table import Table

    rows = list_sources()
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    t = Table()
    for c in ("name", "client", "origin", "available", "detail"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["name"], r["client"], r["origin"], "yes" if r["available"] else "no", r["detail"])
    Console(file=sys.stdout, width=160).print(t)


bench_app.command("fetch")(fetch)
bench_app.command("stats")(stats)
bench_app.command("list")(list_)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
