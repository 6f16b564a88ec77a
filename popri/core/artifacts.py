"""Artifacts: companion-file names and content digests, one function each.

- :func:`sidecar_path` ``NAME.npy -> NAME.jsonl`` (an embedding set's rows),
  :func:`meta_path` ``NAME.npy -> NAME.meta.json``, :func:`json_sidecar` ``NAME.npy|npz ->
  NAME.json`` (a score vector's or FreD statistics' metadata).
- :func:`digest` a stable sha256 of JSON-able data (records, configs), :func:`file_digest` of a
  file's bytes, :func:`dir_digest` of a directory tree's file names and bytes (an adapter, a
  checkpoint), :func:`array_digest` of arrays and keys (an embedding set).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

from popri.core import provenance

_BUF = 1 << 20


def _stem(path: str | os.PathLike, *suffixes: str) -> str:
    p = os.fspath(path)
    for s in suffixes:
        if p.endswith(s):
            return p[: -len(s)]
    return p


def sidecar_path(npy: str | os.PathLike) -> str:
    """``NAME.npy`` -> ``NAME.jsonl``: the rows (ids, client ids) of an embedding set."""
    return _stem(npy, ".npy") + ".jsonl"


def meta_path(npy: str | os.PathLike) -> str:
    """``NAME.npy`` -> ``NAME.meta.json``: an embedding set's model and settings."""
    return _stem(npy, ".npy") + ".meta.json"


def json_sidecar(path: str | os.PathLike) -> str:
    """``NAME.npy`` / ``NAME.npz`` -> ``NAME.json``: a score vector's or FreD statistics'
    metadata (mechanism, parameters, release id)."""
    return _stem(path, ".npy", ".npz") + ".json"


def digest(obj: Any) -> str:
    """sha256 of ``obj`` as canonical JSON (sorted keys, no whitespace)."""
    s = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def file_digest(path: str | os.PathLike, h=None) -> str:
    """sha256 of a file's bytes."""
    h = h or hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_BUF), b""):
            h.update(chunk)
    return h.hexdigest()


def dir_digest(path: str | os.PathLike) -> str:
    """sha256 over a directory tree: each file's relative name and bytes, in sorted order
    (content, not mtimes: a copied or touched tree keeps its digest).  Privacy provenance files
    (``provenance.json``, ``*.provenance.json``: popri.core.provenance) are marks, not content:
    left out."""
    root = Path(path)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*")
                    if p.is_file() and not provenance.is_companion(p.name)):
        h.update(str(f.relative_to(root)).encode("utf-8") + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(_BUF), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def path_digest(path: str | os.PathLike) -> str:
    """:func:`file_digest` or :func:`dir_digest`; "missing" when there is nothing."""
    p = Path(path)
    if p.is_file():
        return file_digest(p)
    if p.is_dir():
        return dir_digest(p)
    return "missing"


def array_digest(*arrays, keys: Iterable[str] = ()) -> str:
    """sha256 of arrays (dtype, shape, bytes) and string keys."""
    import numpy as np

    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    for k in keys:
        h.update(str(k).encode("utf-8") + b"\0")
    return h.hexdigest()
