"""Arrays the stages exchange: embedding sets (``NAME.npy`` float32 [N, d] + the row-aligned
sidecar ``NAME.jsonl`` + ``NAME.meta.json``; on a pipe, JSONL rows carrying an ``embedding``
list) and score vectors (``NAME.npy`` + the ``NAME.json`` sidecar); ``.npy`` files are told
from text, pickles and zip archives before numpy reads them (docs/formats.md).

    python -c "from popri.core.arrays import load_embedding_set; print(load_embedding_set('runs/demo/round1/samples_emb.npy').emb.shape)"
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from popri.core.errors import InputError
from popri.core.atomic import AtomicOutputs, writing
from popri.core.jsonl import dumps, read_json, read_jsonl

# --------------------------------------------------------------------------- embedding sets
@dataclass
class EmbeddingSet:
    """Row-aligned embeddings + metadata rows (``id``, maybe ``client_id``, maybe ``text``)."""

    embeddings: np.ndarray  # float32 [N, d]
    rows: list[dict]
    meta: dict = field(default_factory=dict)
    source: str = ""

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    @property
    def ids(self) -> list[str]:
        return [str(r["id"]) for r in self.rows]

    def client_ids(self) -> list[str]:
        out = []
        for i, r in enumerate(self.rows):
            if "client_id" not in r or r["client_id"] is None:
                raise InputError("missing required field (private data needs client ids)",
                                 path=sidecar_path(self.source) if self.source.endswith(".npy")
                                 else self.source, line=i + 1, field="client_id")
            out.append(str(r["client_id"]))
        return out


# companion-file names live in one place (popri.core.artifacts); re-exported for the readers here
from popri.core.artifacts import meta_path, sidecar_path  # noqa: E402


def check_finite(emb: np.ndarray, path: str, what: str = "embedding") -> None:
    bad = ~np.isfinite(emb)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise InputError(f"{what} row {row + 1} contains NaN or infinity", path=path,
                         line=row + 1, field=what)


def load_embedding_set(path: str | os.PathLike, mmap: bool = False) -> EmbeddingSet:
    """Load ``NAME.npy`` + ``NAME.jsonl`` (+ optional ``NAME.meta.json``)."""
    path = str(path)
    if not Path(path).exists():
        raise InputError("no such file", path=path)
    side = sidecar_path(path)
    if not Path(side).exists():
        raise InputError(f"missing sidecar {side} (row-aligned JSONL with 'id' per row)", path=path)
    emb = load_npy(path, mmap=mmap)
    if emb.ndim != 2:
        raise InputError(f"expected a 2-D array [N, d], got shape {tuple(emb.shape)}", path=path)
    if not np.issubdtype(emb.dtype, np.floating):
        raise InputError(f"expected float embeddings, got dtype {emb.dtype}", path=path)
    rows = read_jsonl(side, required=("id",))
    if len(rows) != emb.shape[0]:
        raise InputError(f"sidecar has {len(rows)} rows but {path} has {emb.shape[0]}", path=side)
    if not mmap:
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        check_finite(emb, path)
    meta = read_json(meta_path(path), expect=dict) if Path(meta_path(path)).exists() else {}
    for k, kind in (("model", str), ("model_path", str), ("normalize", bool)):
        if meta.get(k) is not None and not isinstance(meta[k], kind):
            raise InputError(f"must be a {'string' if kind is str else 'boolean'} (got "
                             f"{type(meta[k]).__name__})", path=meta_path(path), field=k)
    return EmbeddingSet(emb, rows, meta, source=path)


_NPY_MAGIC = b"\x93NUMPY"  # numpy.lib.format.MAGIC_PREFIX
_ZIP_MAGIC = b"PK\x03\x04"  # np.savez's zip archive (refused below, by name)


def _npy_head(path: str) -> bytes | None:
    """The first 64 bytes of the regular file ``path``; None for anything else (a pipe, a
    device, a missing file: np.load says what is wrong, and a pipe's bytes are not consumed)."""
    try:
        if not Path(path).is_file():
            return None
        with open(path, "rb") as fh:
            return fh.read(64)
    except OSError:
        return None


def _texty(head: bytes) -> bool:
    """``head`` reads as UTF-8 text (a character cut at its end allowed)."""
    try:
        s = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:
            return False
        s = head[:e.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\r\n" for c in s)


def load_npy(path: str | os.PathLike, mmap: bool = False) -> np.ndarray:
    """One ``.npy`` array (no pickles); anything else -- a zip archive (``np.savez``) named
    ``.npy``, a pickle, text -- is an :class:`InputError` naming the file.  A regular file is
    told by its first bytes (the format's magic string, numpy.lib.format.MAGIC_PREFIX):
    numpy's own message for a file without it is about pickles (allow_pickle=False)."""
    path = str(path)
    head = _npy_head(path)
    if head is not None and not head.startswith((_NPY_MAGIC, _ZIP_MAGIC)):
        what = ("it is empty" if not head else "it is a Python pickle" if head[:1] == b"\x80"
                else "it holds text" if _texty(head) else "it lacks the .npy header")
        raise InputError(f"not a .npy file: {what} (a .npy file starts with \\x93NUMPY, as "
                         "np.save writes it)", path=path)
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise InputError(f"not a .npy array: {e}", path=path) from None
    if not isinstance(arr, np.ndarray):  # np.load opens a zip (.npz) whatever its name
        close = getattr(arr, "close", None)
        if close is not None:
            close()
        raise InputError("is a zip archive (.npz, from np.savez), not a .npy array", path=path)
    if arr.dtype.fields is not None or arr.dtype.kind not in "biufc":
        raise InputError(f"expected a numeric array, got dtype {arr.dtype}", path=path)
    return arr


def save_embedding_set(path: str | os.PathLike, emb: np.ndarray, rows: Sequence[dict],
                       meta: dict | None = None, out: AtomicOutputs | None = None) -> None:
    """Write the three files of an embedding set atomically (all or nothing); with ``out`` only
    stage them (committed with the caller's other outputs)."""
    path = str(path)
    if not path.endswith(".npy"):
        raise InputError("embedding set output must end in .npy", path=path)
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    if emb.shape[0] != len(rows):
        raise ValueError("rows and embeddings differ in length")
    with (contextlib.nullcontext(out) if out is not None else AtomicOutputs()) as out:
        with writing(path):
            np.save(out.path(path, suffix=".npy"), emb, allow_pickle=False)
        with writing(sidecar_path(path)), \
                open(out.path(sidecar_path(path)), "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(dumps(r) + "\n")
        if meta is not None:
            m = dict(meta)
            m.update({"count": int(emb.shape[0]), "dim": int(emb.shape[1]) if emb.ndim == 2 else 0,
                      "dtype": "float32"})
            with writing(meta_path(path)), \
                    open(out.path(meta_path(path)), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(m, ensure_ascii=False, indent=2) + "\n")


def embedding_rows_to_set(records: list[dict], path: str) -> EmbeddingSet:
    """Build an embedding set from JSONL rows that carry an ``embedding`` list (pipe format)."""
    vecs = []
    dim = None
    rows = []
    model = None
    for i, r in enumerate(records, start=1):
        v = r.get("embedding")
        if not isinstance(v, list) or not v:
            raise InputError("expected a non-empty list of numbers", path=path, line=i, field="embedding")
        if dim is None:
            dim = len(v)
        elif len(v) != dim:
            raise InputError(f"embedding has dimension {len(v)}, earlier rows have {dim}",
                             path=path, line=i, field="embedding")
        bad = next((x for x in v if isinstance(x, bool) or not isinstance(x, (int, float))), None)
        if bad is not None or any(isinstance(x, bool) for x in v):
            got = "a nested list" if isinstance(bad, list) else type(bad).__name__
            raise InputError(f"expected a flat list of numbers (found {got})", path=path, line=i,
                             field="embedding")
        try:
            arr = np.asarray(v, dtype=np.float32)
        except (TypeError, ValueError, OverflowError):
            raise InputError("expected a list of numbers", path=path, line=i, field="embedding") from None
        if not np.isfinite(arr).all():
            raise InputError("contains NaN or infinity", path=path, line=i, field="embedding")
        vecs.append(arr)
        em = r.get("embedding_model")
        if em is not None and not isinstance(em, str):
            raise InputError("must be a string", path=path, line=i, field="embedding_model")
        model = r.get("embedding_model", model)
        rows.append({k: val for k, val in r.items() if k not in ("embedding", "embedding_model")})
    emb = np.stack(vecs) if vecs else np.zeros((0, 0), dtype=np.float32)
    meta = {"model": model} if model else {}
    return EmbeddingSet(emb, rows, meta, source=path)


def is_embedding_path(path: str | os.PathLike) -> bool:
    return str(path).endswith(".npy")


# --------------------------------------------------------------------------- score vectors
from popri.core.artifacts import json_sidecar as score_sidecar_path  # noqa: E402


def save_scores(path: str | os.PathLike, scores: np.ndarray, sidecar: dict,
                out: AtomicOutputs | None = None) -> None:
    """Write ``scores`` (.npy) and its ``.json`` sidecar; with ``out`` only stage them."""
    path = str(path)
    if not path.endswith(".npy"):
        raise InputError("score output must end in .npy", path=path)
    own = out is None
    out = out or AtomicOutputs()
    try:
        with writing(path):
            np.save(out.path(path, suffix=".npy"), np.asarray(scores), allow_pickle=False)
        with writing(score_sidecar_path(path)), \
                open(out.path(score_sidecar_path(path)), "w", encoding="utf-8") as fh:
            fh.write(json.dumps(sidecar, ensure_ascii=False, indent=2, allow_nan=False) + "\n")
    except BaseException:
        if own:  # a caller's AtomicOutputs discards its own staged files
            out.discard()
        raise
    if own:
        out.commit()


def load_scores(path: str | os.PathLike) -> tuple[np.ndarray, dict]:
    path = str(path)
    if not Path(path).exists():
        raise InputError("no such file", path=path)
    side = score_sidecar_path(path)
    if not Path(side).exists():
        raise InputError(f"missing sidecar {side}", path=path)
    arr = load_npy(path)
    meta = read_json(side, expect=dict)
    check_score_sidecar(meta, side)
    return arr, meta


def check_score_sidecar(meta: dict, side: str) -> None:
    """The JSON types of a score sidecar's fields (each optional): ``ids`` a list of strings or
    integers, ``params`` an object, ``ledger`` a list of objects, ``mode`` a string, ``round``
    an integer."""
    ids = meta.get("ids")
    if ids is not None:
        if not isinstance(ids, list):
            raise InputError("must be a list", path=side, field="ids")
        for i, x in enumerate(ids):
            if isinstance(x, bool) or not isinstance(x, (str, int)):
                raise InputError(f"item {i + 1} must be a string or an integer (got "
                                 f"{type(x).__name__})", path=side, field="ids")
    for k, kind, what in (("params", dict, "an object"), ("ledger", list, "a list"),
                          ("mode", str, "a string"), ("kind", str, "a string")):
        if meta.get(k) is not None and not isinstance(meta[k], kind):
            raise InputError(f"must be {what} (got {type(meta[k]).__name__})", path=side, field=k)
    if any(not isinstance(e, dict) for e in meta.get("ledger") or []):
        raise InputError("every entry must be an object", path=side, field="ledger")
    r = meta.get("round")
    if r is not None and (isinstance(r, bool) or not isinstance(r, int)):
        raise InputError(f"must be an integer (got {type(r).__name__})", path=side, field="round")


def finite_or_none(x: float) -> float | None:
    return None if (x is None or (isinstance(x, float) and not math.isfinite(x))) else x
