"""Reading a federated dataset's records: a dataset directory's split, or a JSONL file ('-').

    python -c "from popri.data.records import text_records; print(text_records('runs/default/data/private')[1])"

Every stage that reads texts (embedding, generation's few-shot pool, the downstream model, the
Flower nodes) reads them here: a record without ``id`` gets its row number, and with
``locate=True`` each record carries its file and line for error messages.
"""

from __future__ import annotations

import os
from pathlib import Path

from popri.core.errors import InputError
from popri.core.io import STDIO, iter_jsonl


def is_federated_dir(path: str | os.PathLike) -> bool:
    """A popri dataset directory: one with manifest.json or train.jsonl."""
    p = Path(path)
    return p.is_dir() and ((p / "manifest.json").exists() or (p / "train.jsonl").exists())


def read_records(path: str, split: str = "train", required: tuple[str, ...] = (),
                 locate: bool = False) -> tuple[list[dict], str]:
    """(records, source file) from a federated dataset directory (its ``split``) or a JSONL file
    ('-' = stdin); a record without ``id`` gets its 0-based row number.  ``locate``: each
    record also carries ``_path`` / ``_line`` (:func:`popri.core.io.iter_jsonl`)."""
    src = path
    if path != STDIO and Path(path).is_dir():
        if not is_federated_dir(path):
            raise InputError("directory is not a federated dataset (no manifest.json / train.jsonl)",
                             path=path)
        src = str(Path(path) / f"{split}.jsonl")
    recs = [r if "id" in r else {"id": str(i), **r}
            for i, r in enumerate(iter_jsonl(src, required=required, locate=locate))]
    return recs, src


def text_records(path: str, split: str = "train", require_client: bool = False) -> tuple[list[dict], str]:
    """Records with ``text`` from a federated dataset directory (one split) or a JSONL file."""
    return read_records(path, split, ("text", "client_id") if require_client else ("text",))


def first_by_tokens(counts, budget: int) -> int:
    """How many leading records a set keeps so that their token ``counts`` reach ``budget``:
    the fewest n with sum(counts[:n]) >= budget, or all of them when the whole set falls short.
    ``popri take``: a synthetic set sized in text, not in samples (issue 44)."""
    total = 0
    for n, c in enumerate(counts, start=1):
        total += int(c)
        if total >= budget:
            return n
    return len(counts)
