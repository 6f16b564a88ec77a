"""Source -> federated dataset directory (train/val/test.jsonl + manifest.json).

    popri bench fetch sotu --out data/sotu --max-clients 20
    python -c "from popri.data.build import fetch; from popri.specs.data import FetchSpec; fetch('sotu', 'd', FetchSpec(max_clients=3))"

The settings are a :class:`~popri.specs.data.FetchSpec`; the source comes from the one
registry (:data:`popri.data.sources.SOURCES`).  Pipeline (shared by every source): load
documents -> group by client -> date window (``date_from``/``date_to``) -> seeded client subset
(``max_clients``) -> chunk (``chunking``) -> seeded per-client cap -> drop clients left with
no sample -> client-level split (``splits``) -> write the four files atomically.

Records: ``{"id": f"{client_id}#{k}", "client_id", "text", ["date"], <source fields>}`` with
``k`` the chunk's index within its client before any cap, so ids do not move when the cap
changes.  Clients appear in client_id order, chunks in document order.  The manifest holds no
time stamps or absolute paths: the same inputs and options give byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from popri.core import log
from popri.core.artifacts import file_digest
from popri.core.errors import InputError, PopriError
from popri.core.io import AtomicOutputs, dumps
from popri.core.version import __version__
from popri.data import splits as S
from popri.data.chunking import chunk_texts
from popri.data.sources import SourceData, get_source
from popri.data.tokenize import load_tokenizer
from popri.specs.data import FetchSpec

FORMAT = "popri-federated-dataset"
FORMAT_VERSION = 1
FILES = tuple(f"{s}.jsonl" for s in S.SPLITS)
_RESERVED = ("id", "client_id", "text", "date")


# --------------------------------------------------------------------------- output directory
def is_dataset_dir(path: str | Path) -> bool:
    m = Path(path) / "manifest.json"
    try:
        return m.is_file() and json.loads(m.read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def check_out_dir(out: str, force: bool) -> None:
    if out in ("", "-"):
        raise InputError(f"'{out}' is not a directory name ('-' is stdout): give --out a "
                         "directory", field="--out")
    p = Path(out)
    if p.is_symlink():
        raise InputError("is a symbolic link; give the real directory as --out", path=out)
    if p.exists() and not p.is_dir():
        raise InputError("exists and is not a directory", path=out)
    if p.is_dir() and any(p.iterdir()) and not is_dataset_dir(p) and not force:
        raise InputError("directory is not empty and is not a popri dataset (no manifest.json "
                         "of ours); choose another --out or pass --force", path=out)


# --------------------------------------------------------------------------- build
def _content_sha256(sd: SourceData) -> str:
    h = hashlib.sha256()
    for d in sd.documents:
        h.update(dumps([d.client_id, d.text, d.date, d.fields]).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def _record(cid: str, k: int, text: str, doc) -> dict:
    r = {"id": f"{cid}#{k}", "client_id": cid, "text": text}
    if doc.date:
        r["date"] = doc.date
    for key, v in doc.fields.items():
        r[f"source_{key}" if key in _RESERVED else key] = v
    return r


def build_records(sd: SourceData, opts: FetchSpec, seed: int = 0
                  ) -> tuple[dict[str, list[dict]], dict]:
    """``({split: records}, summary)`` for a loaded source (``opts`` validated by its spec)."""
    by_client: dict[str, list[int]] = {}
    for i, d in enumerate(sd.documents):
        by_client.setdefault(d.client_id, []).append(i)
    if not by_client:
        raise InputError(f"source {sd.name!r} has no documents", field="NAME")
    if opts.date_from or opts.date_to:
        by_client = filter_by_date(sd, by_client, opts.date_from, opts.date_to)
    chosen = S.select_clients(by_client, opts.max_clients, seed)
    if opts.split == "date":  # fail before the expensive part
        S.assign_splits({c: _client_date(sd, by_client[c]) for c in chosen}, "date",
                        opts.val_frac, opts.test_frac, seed, sd.name)
    doc_idx = [i for c in chosen for i in by_client[c]]
    tok = load_tokenizer(opts.tokenizer)
    log.info(f"chunk: {len(doc_idx)} documents of {len(chosen)} clients into <= {opts.max_tokens} "
             f"{opts.tokenizer} tokens")
    with log.progress() as prog:
        task = prog.add_task("chunk", total=len(doc_idx))
        chunks = chunk_texts([sd.documents[i].text for i in doc_idx], tok, opts.max_tokens,
                             opts.min_words, progress=lambda n: prog.advance(task, n))
    chunks_of = dict(zip(doc_idx, chunks))
    per_client: dict[str, list[dict]] = {}
    for c in chosen:
        recs, k = [], 0
        for i in by_client[c]:
            for t in chunks_of[i]:
                recs.append(_record(c, k, t, sd.documents[i]))
                k += 1
        recs = S.cap_samples(recs, [r["id"] for r in recs], opts.max_samples_per_client, seed)
        if recs:
            per_client[c] = recs
    if not per_client:
        raise PopriError(f"no samples left after chunking (min_words={opts.min_words}, "
                         f"max_tokens={opts.max_tokens})")
    assign = S.assign_splits({c: _client_date(sd, by_client[c]) for c in per_client}, opts.split,
                             opts.val_frac, opts.test_frac, seed, sd.name)
    out: dict[str, list[dict]] = {s: [] for s in S.SPLITS}
    for c in sorted(per_client):
        out[assign[c]].extend(per_client[c])
    for s in S.SPLITS:
        if not out[s] and (s == "train" or (s == "val" and opts.val_frac) or
                           (s == "test" and opts.test_frac)):
            log.warn(f"split {s} is empty ({len(per_client)} clients); raise --max-clients")
    summary = {"clients_in_source": len(by_client), "clients_selected": len(chosen),
               "clients_without_samples": len(chosen) - len(per_client),
               "tokenizer": tok.describe()}
    return out, summary


def filter_by_date(sd: SourceData, by_client: dict[str, list[int]], date_from: str | None,
                   date_to: str | None) -> dict[str, list[int]]:
    """Clients whose date (earliest document date, ISO strings compare in time order) lies in
    [date_from, date_to].  E.g. the public record of old addresses vs recent private ones."""
    kept = {}
    for c, idx in by_client.items():
        d = _client_date(sd, idx)
        if d is None:
            raise InputError(f"--date-from/--date-to need dates, but client {c!r} of source "
                             f"{sd.name!r} has none", field="date")
        if (date_from and d[:len(date_from)] < date_from) or (date_to and d[:len(date_to)] > date_to):
            continue
        kept[c] = idx
    if not kept:
        raise InputError(f"no client of {sd.name!r} has a date in [{date_from}, {date_to}]",
                         field="date")
    return kept


def _client_date(sd: SourceData, idx: list[int]) -> str | None:
    dates = [sd.documents[i].date for i in idx if sd.documents[i].date]
    return min(dates) if dates else None


def write_dataset(out: str, records: dict[str, list[dict]], manifest: dict) -> dict:
    """Stage the three splits, hash them, add counts + sha256 to the manifest, commit all four."""
    outp = Path(out)
    created = not outp.exists()
    try:
        with AtomicOutputs() as ao:
            files, counts = {}, {}
            for s, name in zip(S.SPLITS, FILES):
                tmp = ao.path(outp / name)
                with open(tmp, "w", encoding="utf-8") as fh:
                    for r in records[s]:
                        fh.write(dumps(r) + "\n")
                files[name] = {"sha256": file_digest(tmp), "bytes": tmp.stat().st_size}
                counts[s] = {"clients": len({r["client_id"] for r in records[s]}),
                             "samples": len(records[s])}
            manifest = {**manifest, "counts": counts, "files": files}
            with open(ao.path(outp / "manifest.json"), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(manifest, ensure_ascii=False, indent=2) + "\n")
    except BaseException:
        if created and outp.is_dir() and not any(outp.iterdir()):
            outp.rmdir()
        raise
    return manifest


def fetch(name: str, out: str, opts: FetchSpec | None = None, *, seed: int = 0,
          force: bool = False, **source_opts) -> dict:
    """Load source ``name`` (a registered source or a local table file, with its
    ``source_opts``), build the splits with the settings ``opts`` and write ``out``; returns
    the manifest.  ``force``: write into a non-empty directory that is not a popri dataset."""
    opts = opts or FetchSpec()
    src = get_source(name)
    src.check_options({k: v for k, v in source_opts.items() if v not in (None, "")})
    check_out_dir(out, force)
    sd = src.fetch(**source_opts)
    records, summary = build_records(sd, opts, seed)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "popri_version": __version__,
        "source": {"name": sd.name, "version": sd.version, **sd.details,
                   "documents": len(sd.documents), "clients": summary["clients_in_source"],
                   "content_sha256": _content_sha256(sd)},
        "chunking": {"max_tokens": opts.max_tokens, "min_words": opts.min_words,
                     "tokenizer": summary["tokenizer"],
                     "rule": "whitespace normalised; whole sentences packed greedily; a longer "
                             "sentence cut at token boundaries (word starts preferred)"},
        "sampling": {"max_clients": opts.max_clients,
                     "date_from": opts.date_from, "date_to": opts.date_to,
                     "clients_selected": summary["clients_selected"],
                     "clients_without_samples": summary["clients_without_samples"],
                     "max_samples_per_client": opts.max_samples_per_client,
                     "seed": seed},
        "split": {"rule": opts.split, "seed": seed, "val_frac": opts.val_frac,
                  "test_frac": opts.test_frac,
                  "key": "sha256(f'{seed}:{client_id}') thresholds" if opts.split == "hash"
                  else "clients sorted by (date, client_id); latest to test, then val"},
    }
    manifest = write_dataset(out, records, manifest)
    c = manifest["counts"]
    log.info("wrote " + out + ": " + ", ".join(
        f"{s} {c[s]['clients']} clients / {c[s]['samples']} samples" for s in S.SPLITS))
    return manifest
