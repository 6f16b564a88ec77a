"""popri embed: texts -> embedding set (the papers' all-MiniLM-L6-v2 by default).

    popri embed data/sotu --split train --out runs/private.npy
    popri embed samples.jsonl --out runs/syn.npy
    cat samples.jsonl | popri embed - --out - | popri score --synthetic - ...
"""

from __future__ import annotations

import typer

from popri.core.guard import check_outputs
from popri.models.embed import embed_file
from popri.specs.data import EmbedSpec
from popri.cli.options import command
from popri.specs.commands.embed import EmbedCall


@command(EmbedCall)
def embed(input: str, out: str, split: str, cache: bool, *, spec: EmbedSpec) -> None:
    """Embed texts with a sentence-transformers model into an embedding set."""
    check_outputs([out], [input], companions="embeddings")
    embed_file(input, out, spec, split=split, use_cache=cache)


def register(app: typer.Typer) -> None:
    app.command("embed")(embed)
