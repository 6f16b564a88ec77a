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


def mix_by_prompt(records: list[dict], other: list[dict], share: float, seed: int, *,
                  path: str = "samples", other_path: str = "other") -> tuple[list[dict], dict]:
    """A final set mixed by prompt (issue 67, a popri remedy beyond POPri): the samples of a
    seeded share of ``records``' prompts (``round(share * P)`` of its P prompt ids, chosen by
    a permutation seeded with ``seed``) replaced by ``other``'s samples of the same prompt ids
    (the untuned generator's, written from the same prompts and seeds: the T = 0 control).
    Records keep their file order, each prompt's block from one of the two sets; every
    record gains ``"mixed_from"``: "samples" or "other".  Both sets must hold the same
    prompt ids with the same prompt texts."""
    import numpy as np

    def by_prompt(rs: list[dict], where: str) -> dict:
        out: dict = {}
        for n, r in enumerate(rs):
            if r.get("prompt_id") is None:
                raise InputError("missing required field", path=where,
                                 line=r.get("_line", n + 1), field="prompt_id")
            out.setdefault(r["prompt_id"], []).append(r)
        return out

    mine, theirs = by_prompt(records, path), by_prompt(other, other_path)
    if set(mine) != set(theirs):
        extra = sorted(map(str, set(mine) ^ set(theirs)))[:3]
        raise InputError(f"the two sets hold different prompt ids (e.g. {', '.join(extra)}): "
                         "mix sets written from the same prompts (same seed, N, J and Omega)",
                         path=other_path, field="prompt_id")
    for pid, rs in mine.items():
        if rs[0].get("prompt") != theirs[pid][0].get("prompt"):
            raise InputError(f"prompt_id {pid!r} has another prompt text than in {path}",
                             path=other_path, line=theirs[pid][0].get("_line"), field="prompt")
    order = list(mine)
    k = int(round(float(share) * len(order)))
    swap = {order[i] for i in np.random.default_rng(seed).permutation(len(order))[:k]}
    out = []
    for pid in order:
        src, tag = (theirs[pid], "other") if pid in swap else (mine[pid], "samples")
        out.extend({**{k2: v for k2, v in r.items() if k2 not in ("_line", "_path")},
                    "mixed_from": tag} for r in src)
    stats = {"prompts": len(order), "prompts_from_other": k, "share": float(share),
             "seed": int(seed), "samples": len(out),
             "samples_from_other": sum(r["mixed_from"] == "other" for r in out)}
    return out, stats
