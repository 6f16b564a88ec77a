"""File formats the stages exchange, and atomic writes.

Formats (see ``docs/formats.md`` for the full reference):

- **Text samples**: JSONL, one object per line with at least ``id`` and ``text``.
- **Federated dataset**: a directory with ``train.jsonl``/``val.jsonl``/``test.jsonl``
  (records ``{"client_id", "text", ...}``) and ``manifest.json``.
- **Embedding set**: ``NAME.npy`` (float32, ``[N, d]``) + row-aligned sidecar ``NAME.jsonl``
  (``id``; ``client_id`` for private data) + optional ``NAME.meta.json`` (model, normalisation).
  On a pipe an embedding set travels as JSONL whose rows carry an ``embedding`` list.
- **Score vector**: ``NAME.npy`` + ``NAME.json`` sidecar (ids in order, mode, parameters, ledger).

``-`` means stdin / stdout everywhere; stdout carries data only.

Every writer here goes through :func:`atomic_write` / :class:`AtomicOutputs`: data is written
to a temporary file in the destination directory and renamed into place only when the whole
output is complete, so a failed or killed stage never leaves a half file and never clobbers
an earlier good one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Sequence

import numpy as np

from .errors import InputError

STDIO = "-"
_UMASK = os.umask(0)
os.umask(_UMASK)


# --------------------------------------------------------------------------- atomic writes
def _tmp_in(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs get the usual permissions
    return Path(tmp)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temp file next to ``path``; rename it over ``path`` only on success."""
    dest = Path(path)
    tmp = _tmp_in(dest)
    try:
        with open(tmp, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class AtomicOutputs:
    """Stage several output files and commit them together.

    ``path(dest)`` returns a temporary path to write ``dest`` to; ``commit()`` renames every
    staged file into place; leaving the ``with`` block by an exception removes them all.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []

    def path(self, dest: str | os.PathLike, suffix: str = "") -> Path:
        dest = Path(dest)
        tmp = _tmp_in(dest)
        if suffix:  # numpy appends .npy to names without it; give it the suffix up front
            new = tmp.with_name(tmp.name + suffix)
            tmp.rename(new)
            tmp = new
        self._staged.append((tmp, dest))
        return tmp

    def commit(self) -> None:
        for tmp, dest in self._staged:
            os.replace(tmp, dest)
        self._staged.clear()

    def discard(self) -> None:
        for tmp, _ in self._staged:
            tmp.unlink(missing_ok=True)
        self._staged.clear()

    def __enter__(self) -> "AtomicOutputs":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()


def sha256_file(path: str | os.PathLike, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- JSON / JSONL
def dumps(obj: Any) -> str:
    """Deterministic one-line JSON (field order kept, UTF-8 kept, NaN refused)."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


def _open_in(path: str | os.PathLike) -> IO[str]:
    if str(path) == STDIO:
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8")
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path=str(path))
    if p.is_dir():
        raise InputError("is a directory, expected a file", path=str(path))
    return open(p, "r", encoding="utf-8")


def iter_jsonl(path: str | os.PathLike, required: Sequence[str] = (),
               locate: bool = False) -> Iterator[dict]:
    """Yield the objects of a JSONL file (``-`` = stdin), validating ``required`` fields.

    Blank lines are skipped.  Any malformed line raises :class:`InputError` naming the file,
    the line number and the field.  ``locate=True`` adds ``_path`` / ``_line`` to each object so
    later checks can name where a record came from.
    """
    fh = _open_in(path)
    close = str(path) != STDIO
    try:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"malformed JSON: {e.msg} (column {e.colno})",
                                 path=str(path), line=lineno) from None
            if not isinstance(obj, dict):
                raise InputError("expected a JSON object", path=str(path), line=lineno)
            for f in required:
                if f not in obj or obj[f] is None:
                    raise InputError("missing required field", path=str(path), line=lineno, field=f)
            if "text" in required and not isinstance(obj["text"], str):
                raise InputError("must be a string", path=str(path), line=lineno, field="text")
            if locate:
                obj["_path"], obj["_line"] = str(path), lineno
            yield obj
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text ({e.reason})", path=str(path)) from None
    finally:
        if close:
            fh.close()


def read_jsonl(path: str | os.PathLike, required: Sequence[str] = ()) -> list[dict]:
    return list(iter_jsonl(path, required))


def write_jsonl(records: Iterable[dict], path: str | os.PathLike) -> int:
    """Write records as JSONL to ``path`` atomically, or to stdout when ``path`` is ``-``."""
    n = 0
    if str(path) == STDIO:
        out = sys.stdout
        for r in records:
            out.write(dumps(r) + "\n")
            n += 1
        out.flush()
        return n
    with atomic_write(path) as fh:
        for r in records:
            fh.write(dumps(r) + "\n")
            n += 1
    return n


def write_json(obj: Any, path: str | os.PathLike, indent: int | None = 2) -> None:
    if str(path) == STDIO:
        sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=indent) + "\n")
        sys.stdout.flush()
        return
    with atomic_write(path) as fh:
        fh.write(json.dumps(obj, ensure_ascii=False, indent=indent) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path=str(path))
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON: {e.msg}", path=str(path), line=e.lineno) from None


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


def sidecar_path(npy: str | os.PathLike) -> str:
    p = str(npy)
    return (p[:-4] if p.endswith(".npy") else p) + ".jsonl"


def meta_path(npy: str | os.PathLike) -> str:
    p = str(npy)
    return (p[:-4] if p.endswith(".npy") else p) + ".meta.json"


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
    try:
        emb = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise InputError(f"not a .npy array: {e}", path=path) from None
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
    meta = read_json(meta_path(path)) if Path(meta_path(path)).exists() else {}
    return EmbeddingSet(emb, rows, meta, source=path)


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
        np.save(out.path(path, suffix=".npy"), emb, allow_pickle=False)
        with open(out.path(sidecar_path(path)), "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(dumps(r) + "\n")
        if meta is not None:
            m = dict(meta)
            m.update({"count": int(emb.shape[0]), "dim": int(emb.shape[1]) if emb.ndim == 2 else 0,
                      "dtype": "float32"})
            with open(out.path(meta_path(path)), "w", encoding="utf-8") as fh:
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
        try:
            arr = np.asarray(v, dtype=np.float32)
        except (TypeError, ValueError):
            raise InputError("expected a list of numbers", path=path, line=i, field="embedding") from None
        if not np.isfinite(arr).all():
            raise InputError("contains NaN or infinity", path=path, line=i, field="embedding")
        vecs.append(arr)
        model = r.get("embedding_model", model)
        rows.append({k: val for k, val in r.items() if k not in ("embedding", "embedding_model")})
    emb = np.stack(vecs) if vecs else np.zeros((0, 0), dtype=np.float32)
    meta = {"model": model} if model else {}
    return EmbeddingSet(emb, rows, meta, source=path)


def is_embedding_path(path: str | os.PathLike) -> bool:
    return str(path).endswith(".npy")


# --------------------------------------------------------------------------- score vectors
def score_sidecar_path(npy: str | os.PathLike) -> str:
    p = str(npy)
    return (p[:-4] if p.endswith(".npy") else p) + ".json"


def save_scores(path: str | os.PathLike, scores: np.ndarray, sidecar: dict,
                out: AtomicOutputs | None = None) -> None:
    """Write ``scores`` (.npy) and its ``.json`` sidecar; with ``out`` only stage them."""
    path = str(path)
    if not path.endswith(".npy"):
        raise InputError("score output must end in .npy", path=path)
    own = out is None
    out = out or AtomicOutputs()
    np.save(out.path(path, suffix=".npy"), np.asarray(scores), allow_pickle=False)
    with open(out.path(score_sidecar_path(path)), "w", encoding="utf-8") as fh:
        fh.write(json.dumps(sidecar, ensure_ascii=False, indent=2, allow_nan=False) + "\n")
    if own:
        out.commit()


def load_scores(path: str | os.PathLike) -> tuple[np.ndarray, dict]:
    path = str(path)
    if not Path(path).exists():
        raise InputError("no such file", path=path)
    side = score_sidecar_path(path)
    if not Path(side).exists():
        raise InputError(f"missing sidecar {side}", path=path)
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise InputError(f"not a .npy array: {e}", path=path) from None
    meta = read_json(side)
    return arr, meta


def finite_or_none(x: float) -> float | None:
    return None if (x is None or (isinstance(x, float) and not math.isfinite(x))) else x
