"""popri embed: texts -> embedding set (the papers' all-MiniLM-L6-v2 by default).

    popri embed data/sotu --split train --out runs/private.npy
    popri embed samples.jsonl --out runs/syn.npy
    cat samples.jsonl | popri embed - --out - | popri score --synthetic - ...
"""

from __future__ import annotations

import typer

from popri.cli.options import spec_options
from popri.core.guard import check_outputs
from popri.models.embed import embed_file
from popri.specs.data import EmbedSpec


@spec_options(EmbedSpec)
def embed(
    input: str = typer.Argument(..., help="Federated dataset directory, JSONL with 'text' "
                                          "(and 'id', 'client_id'), or '-' for stdin."),
    out: str = typer.Option(..., "--out", "-o",
                            help="NAME.npy (writes NAME.npy + NAME.jsonl + NAME.meta.json) or '-' "
                                 "for JSONL rows with an 'embedding' list on stdout."),
    split: str = typer.Option("train", help="Split to embed when INPUT is a federated dataset."),
    cache: bool = typer.Option(True, "--cache/--no-cache",
                               help="Re-use embeddings cached by content hash (POPRI_CACHE)."),
    *, spec: EmbedSpec,
) -> None:
    """Embed texts with a sentence-transformers model into an embedding set."""
    check_outputs([out], [input], companions="embeddings")
    embed_file(input, out, spec, split=split, use_cache=cache)


def register(app: typer.Typer) -> None:
    app.command("embed")(embed)
