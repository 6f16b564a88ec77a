"""Per-split statistics of a federated dataset directory.

    popri bench stats data/sotu
    popri bench stats data/sotu --json | jq .splits.train

For each split: clients, samples, samples per client (mean/median/max), tokens per sample
(with the tokenizer named in the manifest) and words per sample.  The files' sha256 are
checked against the manifest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from popri.core import log
from popri.core.artifacts import file_digest
from popri.core.errors import InputError
from popri.core.io import iter_jsonl, read_json
from popri.data.splits import SPLITS
from popri.data.tokenize import load_tokenizer


def _summary(x: list[int]) -> dict:
    if not x:
        return {"mean": None, "median": None, "max": None}
    a = np.asarray(x, dtype=np.float64)
    return {"mean": round(float(a.mean()), 2), "median": float(np.median(a)), "max": int(a.max())}


def dataset_stats(path: str, tokenizer: str | None = None) -> dict:
    d = Path(path)
    if not d.is_dir():
        raise InputError("not a directory (expected a dataset written by 'popri bench fetch')",
                         path=path)
    mpath = str(d / "manifest.json")
    man = read_json(mpath, expect=dict)
    for key in ("chunking", "files", "source"):
        if man.get(key) is not None and not isinstance(man[key], dict):
            raise InputError(f"must be an object (got {type(man[key]).__name__})", path=mpath,
                             field=key)
    tinfo = (man.get("chunking") or {}).get("tokenizer") or {}
    if not isinstance(tinfo, dict):
        raise InputError("must be an object", path=mpath, field="chunking.tokenizer")
    for key in ("name", "fingerprint"):
        if tinfo.get(key) is not None and not isinstance(tinfo[key], str):
            raise InputError("must be a string", path=mpath, field=f"chunking.tokenizer.{key}")
    for fname, entry in (man.get("files") or {}).items():
        sha = entry.get("sha256") if isinstance(entry, dict) else 0
        if not isinstance(sha, (str, type(None))):
            raise InputError("must be an object with a string 'sha256'", path=mpath,
                             field=f"files.{fname}")
    tname = tokenizer or tinfo.get("name") or "whitespace"
    tok = load_tokenizer(tname)
    if tinfo.get("fingerprint") and tok.describe()["fingerprint"] != tinfo["fingerprint"]:
        log.warn(f"tokenizer {tname!r} differs from the one that chunked {path}; counts may differ")
    files = man.get("files") or {}
    out = {"dir": str(path), "source": (man.get("source") or {}).get("name"),
           "tokenizer": tname, "max_tokens": (man.get("chunking") or {}).get("max_tokens"),
           "splits": {}}
    bad = []
    for s in SPLITS:
        f = d / f"{s}.jsonl"
        if not f.exists():
            raise InputError("missing split file", path=str(f))
        want = (files.get(f.name) or {}).get("sha256")
        if want and file_digest(f) != want:
            bad.append(f.name)
        per_client: dict[str, int] = {}
        texts = []
        for r in iter_jsonl(f, required=("text", "client_id")):
            per_client[str(r["client_id"])] = per_client.get(str(r["client_id"]), 0) + 1
            texts.append(r["text"])
        out["splits"][s] = {
            "clients": len(per_client), "samples": len(texts),
            "samples_per_client": _summary(list(per_client.values())),
            "tokens_per_sample": _summary(tok.count(texts)),
            "words_per_sample": _summary([len(t.split()) for t in texts]),
        }
    out["sha256_ok"] = not bad
    if bad:
        log.warn(f"{', '.join(bad)} in {path} changed since the manifest was written")
    return out


def stats_table(st: dict):
    from rich.table import Table

    t = Table(title=f"{st['dir']} ({st['source']}; tokens: {st['tokenizer']}, "
                    f"max {st['max_tokens']})")
    t.add_column("split")
    for c in ("clients", "samples", "samp/client mean", "median", "max",
              "tok/sample mean", "median", "max", "words/sample mean", "median", "max"):
        t.add_column(c, justify="right")

    def fmt(v):
        return "-" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))

    for s, r in st["splits"].items():
        row = [s, str(r["clients"]), str(r["samples"])]
        for k in ("samples_per_client", "tokens_per_sample", "words_per_sample"):
            row += [fmt(r[k]["mean"]), fmt(r[k]["median"]), fmt(r[k]["max"])]
        t.add_row(*row)
    return t
