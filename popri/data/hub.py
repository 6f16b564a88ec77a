"""Tables through the ``datasets`` library: the LargeFedBench of "Private Federated Learning
using Preference-Optimized Synthetic Data" (POPri, arXiv:2504.16438, section 4), Aug-PE's
PubMed, and any local .jsonl/.json/.csv/.parquet file.

    popri bench fetch biorxiv --out data/biorxiv --revision main
    popri bench fetch congress --out data/congress
    popri bench fetch pubmed --source aug-pe/data/pubmed/train.csv --out data/pubmed
    popri bench fetch reviews.csv --client-column user --date-column date --out data/reviews

Hub ids (POPri README and paper footnotes; the collection code is hazylavender/fl_llm_benchmark_dataset):

- ``biorxiv``  -> ``hazylavender/biorxiv-abstract``: bioRxiv API records; text ``abstract``,
  client ``doi`` (one abstract per client, POPri section 4), date ``date``.
- ``congress`` -> ``hazylavender/CongressionalDataset``: US/UK/Canada speeches; text ``data``,
  date ``date_str``, fields speaker/country/chamber/title; each speech is its own client
  (``@row``; ``--client-column speaker`` groups by speaker instead).
- ``pubmed``: Aug-PE distributes its PubMed abstracts (2023-08-01..07) as ``train.csv`` with a
  ``text`` column on Google Drive (aug-pe ``scripts/download_data.sh``), not on the hub: pass it
  with ``--source`` (or a hub copy with ``--hub-id``).  One abstract per client (POPri D.2.2).

The column names of the two hub datasets come from their collection code, not from a download
here; every one of them can be overridden (``--text-column``, ``--client-column``,
``--date-column``; ``@none`` = no date).  ``@row`` as client column makes every row its own
client (id = sha256 of the row's text, date and fields: stable under re-ordering and additions).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path

from popri.core import log, runtime
from popri.core.artifacts import file_digest
from popri.core.errors import InputError, MissingResourceError
from popri.data.sources import TABLE_BUILDERS, Document, SourceData

ROW = "@row"
NONE = "@none"  # --date-column @none: ignore the default date column

#: the columns of each hub dataset (its name in the source registry, popri.data.sources.SOURCES)
HUB_DEFAULTS: dict[str, dict] = {
    "biorxiv": {"hub_id": "hazylavender/biorxiv-abstract", "text": "abstract", "client": "doi",
                "date": "date", "fields": ["title", "category"]},
    "congress": {"hub_id": "hazylavender/CongressionalDataset", "text": "data", "client": ROW,
                 "date": "date_str", "fields": ["speaker", "country", "chamber", "title"]},
    "pubmed": {"hub_id": None, "text": "text", "client": ROW, "date": None, "fields": []},
}


def hub_offline() -> bool:
    return any(runtime.env_on(v) for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def available(name: str) -> tuple[bool, str]:
    """For ``popri bench list``: is the hub dataset of source ``name`` cached here?"""
    hub_id = HUB_DEFAULTS[name]["hub_id"]
    if hub_id is None:
        return False, "needs --source train.csv (Aug-PE's Google Drive file) or --hub-id"
    if hub_cached(hub_id):
        return True, f"{hub_id} is in the Hugging Face cache"
    return False, f"{hub_id}: not cached; needs the hub" + \
        (" (HF_HUB_OFFLINE is set)" if hub_offline() else "")


def hub_cached(hub_id: str) -> bool:
    """Is some revision of the dataset in the local hub or datasets cache?"""
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    name = "datasets--" + hub_id.replace("/", "--")
    roots = [Path(constants.HF_HUB_CACHE)]
    try:
        import datasets

        roots.append(Path(datasets.config.HF_DATASETS_CACHE))
    except (ImportError, AttributeError):
        pass
    return any((r / name).exists() or any(r.glob(hub_id.replace("/", "___") + "*"))
               for r in roots if r.exists())


def _str_date(v) -> str | None:
    if v is None or v == "":
        return None
    if isinstance(v, datetime.datetime) and v.tzinfo is None and v.time() == datetime.time():
        return v.date().isoformat()  # JSON/CSV readers turn "2024-01-03" into a timestamp
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def table_documents(ds, *, where: str, text: str, client: str, date: str | None,
                    fields: list[str], optional_fields: bool = False) -> list[Document]:
    """Documents from a ``datasets.Dataset``; unknown columns are one located InputError."""
    cols = list(ds.column_names)
    for role, c in (("text column", text), ("client column", client), ("date column", date)):
        if c and c != ROW and c not in cols:
            raise InputError(f"no {role} {c!r} (columns: {', '.join(cols)})", path=where, field=c)
    keep = [f for f in fields if f in cols] if optional_fields else list(fields)
    for f in keep:
        if f not in cols:
            raise InputError(f"no column {f!r} (columns: {', '.join(cols)})", path=where, field=f)
    need = [c for c in dict.fromkeys([text, client, date, *keep]) if c and c != ROW]
    docs: list[Document] = []
    seen: set[tuple[str, str]] = set()
    i = 0
    for batch in ds.select_columns(need).iter(batch_size=1000):
        n = len(batch[text])
        for k in range(n):
            i += 1
            t = batch[text][k]
            if t is None:
                continue
            if not isinstance(t, str):
                raise InputError(f"row {i}: expected a string, got {type(t).__name__}",
                                 path=where, field=text)
            d = _str_date(batch[date][k]) if date else None
            extra = {f: batch[f][k] for f in keep if f not in (text, client, date)}
            extra = {f: (v if isinstance(v, (str, int, float, bool)) or v is None else str(v))
                     for f, v in extra.items()}
            if client == ROW:
                cid = "r" + hashlib.sha256(json.dumps([t, d, extra], sort_keys=True, default=str)
                                           .encode("utf-8")).hexdigest()[:16]
            else:
                cv = batch[client][k]
                if cv is None or str(cv).strip() == "":
                    raise InputError(f"row {i}: empty client id", path=where, field=client)
                cid = str(cv).strip()
            if (cid, t) in seen:  # the same text twice for one client (versions, re-crawls)
                continue
            seen.add((cid, t))
            docs.append(Document(cid, t, d, extra))
    return docs


def load_local(path: str, *, client: str | None, text: str = "text", date: str | None = None,
               fields: list[str] | None = None, optional_fields: bool = False) -> SourceData:
    """A local table via ``datasets.load_dataset("json"|"csv"|"parquet", data_files=path)``."""
    p = Path(path)
    if not p.is_file():
        raise InputError("no such file", path=path)
    builder = TABLE_BUILDERS.get(p.suffix.lower())
    if builder is None:
        raise InputError(f"unsupported file type {p.suffix!r} (use {', '.join(TABLE_BUILDERS)})",
                         path=path)
    if not client:
        raise InputError(f"a local file needs --client-column (a column of the file, or {ROW} "
                         "for one client per row)", path=path, field="client_column")
    import datasets

    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(builder, data_files=str(p.resolve()), split="train")
    except Exception as e:
        raise InputError(f"cannot read as {builder}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}", path=path) from None
    docs = table_documents(ds, where=path, text=text, client=client, date=date,
                           fields=fields or [], optional_fields=optional_fields)
    digest = file_digest(p)
    log.info(f"{p.name}: {len(ds)} rows, {len(docs)} documents")
    return SourceData(p.name, f"file sha256 {digest[:16]}", docs,
                      {"file": p.name, "sha256": digest, "builder": builder,
                       "columns": {"text": text, "client": client, "date": date}})


def load_table(path: str, *, client_column: str | None = None, text_column: str | None = None,
               date_column: str | None = None) -> SourceData:
    """``popri bench fetch FILE``: a local table, its columns given by the options."""
    return load_local(path, client=client_column, text=text_column or "text",
                      date=date_column)


def load_hub(name: str, *, source: str | None = None, hub_id: str | None = None,
             revision: str | None = None, hub_split: str | None = None,
             client_column: str | None = None, text_column: str | None = None,
             date_column: str | None = None) -> SourceData:
    """biorxiv / congress / pubmed with their defaults; ``source`` = a local copy of the table.
    The keywords are the ``popri bench fetch`` options of the same names."""
    d = HUB_DEFAULTS[name]
    hub_split = hub_split or "train"
    text = text_column or d["text"]
    client = client_column or d["client"]
    date = None if date_column == NONE else (date_column if date_column is not None
                                             else d["date"])
    if source:
        sd = load_local(source, client=client, text=text, date=date, fields=d["fields"],
                        optional_fields=True)
        sd.name, sd.details = name, {**sd.details, "dataset": name}
        return sd
    hub_id = hub_id or d["hub_id"]
    if hub_id is None:
        raise MissingResourceError(
            f"{name}: no hub copy is known; download Aug-PE's PubMed train.csv "
            "(github.com/AI-secure/aug-pe, scripts/download_data.sh) and pass --source train.csv, "
            "or give --hub-id")
    import datasets

    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(hub_id, revision=revision, split=hub_split)
    except Exception as e:
        why = (" HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set and it is not in the local cache;"
               " unset it (network needed) or pass a local copy with --source FILE."
               if hub_offline() else "")
        raise MissingResourceError(
            f"cannot load hub dataset {hub_id!r} (revision {revision or 'default'}, split "
            f"{hub_split}): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}.{why}") from None
    docs = table_documents(ds, where=hub_id, text=text, client=client, date=date,
                           fields=d["fields"], optional_fields=True)
    log.info(f"{name}: {len(ds)} rows from {hub_id}, {len(docs)} documents")
    return SourceData(name, f"{hub_id}@{revision or 'default'}", docs,
                      {"hub_id": hub_id, "revision": revision, "split": hub_split,
                       "columns": {"text": text, "client": client, "date": date}})
