"""JSON and JSONL, read and written: one object per line, ``-`` for stdin / stdout, a line cap
(``POPRI_MAX_LINE_BYTES``), every parse error one line naming the file, line and field
(:func:`iter_jsonl`), writes atomic (:mod:`popri.core.atomic`); and the lenient readers of
finished runs (a torn last line skipped with a note).

    python -c "from popri.core.jsonl import read_jsonl; print(read_jsonl('runs/demo/synthetic.jsonl')[:1])"
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Sequence


from popri.core.errors import InputError
from popri.core.atomic import STDIO, atomic_write

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


#: the longest JSONL line read (bytes, newline excluded); POPRI_MAX_LINE_BYTES overrides it.  A
#: line is read at most this far, so one runaway line (a 50 MB text, a file without newlines)
#: neither fills memory nor reaches a tokenizer.
MAX_LINE_BYTES = 16 << 20


def max_line_bytes() -> int:
    raw = os.environ.get("POPRI_MAX_LINE_BYTES")
    if raw is None or raw.strip() == "":
        return MAX_LINE_BYTES
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise InputError(f"must be a positive integer (got {raw!r})", field="POPRI_MAX_LINE_BYTES")
    return n


def _open_in_bytes(path: str | os.PathLike) -> IO[bytes]:
    if str(path) == STDIO:
        return sys.stdin.buffer
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path=str(path))
    if p.is_dir():
        raise InputError("is a directory, expected a file", path=str(path))
    return open(p, "rb")


def parse_json(text: str | bytes, path: str | os.PathLike | None = None,
               line: int | None = None) -> Any:
    """``json.loads`` with every failure an :class:`InputError` at ``path:line``: malformed
    JSON, or nesting too deep for the parser (RecursionError).  NaN / Infinity literals are
    read (as Python's json does); the readers of each field refuse them with its name."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON: {e.msg} (column {e.colno})",
                         path=None if path is None else str(path),
                         line=line if line is not None else e.lineno) from None
    except RecursionError:
        raise InputError("JSON nested too deeply", path=None if path is None else str(path),
                         line=line) from None


def iter_jsonl(path: str | os.PathLike, required: Sequence[str] = (),
               locate: bool = False) -> Iterator[dict]:
    """Yield the objects of a JSONL file (``-`` = stdin), validating ``required`` fields.

    Blank lines are skipped.  Any malformed line raises :class:`InputError` naming the file,
    the line number and the field; so does a line longer than :func:`max_line_bytes` (read no
    further than that).  ``locate=True`` adds ``_path`` / ``_line`` to each object so later
    checks can name where a record came from.
    """
    cap = max_line_bytes()
    fh = _open_in_bytes(path)
    close = str(path) != STDIO
    try:
        lineno = 0
        while True:
            raw = fh.readline(cap + 1)
            if not raw:
                break
            lineno += 1
            if len(raw) > cap and not raw.endswith(b"\n"):
                raise InputError(f"line longer than {cap} bytes (the limit; set "
                                 "POPRI_MAX_LINE_BYTES to raise it)", path=str(path), line=lineno)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"not UTF-8 text ({e.reason})", path=str(path),
                                 line=lineno) from None
            if not line.strip():
                continue
            obj = parse_json(line, path, lineno)
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


def read_json(path: str | os.PathLike, expect: type | None = None) -> Any:
    """A JSON file; every failure (missing, not UTF-8, malformed, nested too deeply, larger than
    :func:`max_line_bytes` x 16, 256 MiB by default) an :class:`InputError` naming it.
    ``expect=dict`` (or list) also refuses any other top-level type."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path=str(path))
    if p.is_dir():
        raise InputError("is a directory, expected a JSON file", path=str(path))
    cap = 16 * max_line_bytes()
    with open(p, "rb") as fh:
        raw = fh.read(cap + 1)
    if len(raw) > cap:
        raise InputError(f"larger than {cap} bytes (the limit: 16 x POPRI_MAX_LINE_BYTES)",
                         path=str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text ({e.reason})", path=str(path)) from None
    obj = parse_json(text, path)
    if expect is not None and not isinstance(obj, expect):
        want = {dict: "a JSON object", list: "a JSON list"}.get(expect, expect.__name__)
        raise InputError(f"expected {want}, got {type(obj).__name__ if obj is not None else 'null'}"
                         .replace("got dict", "got an object").replace("got list", "got a list")
                         .replace("got str", "got a string"), path=str(path))
    return obj


# --------------------------------------------------------------------------- lenient readers
# For a report of a run that may be partial, older or damaged (popri report): what could not be
# read becomes a note, never an exception.


def read_json_lenient(p: Path, notes: list[str] | None = None) -> Any:
    """A JSON file's value; None when missing or unreadable (with a note in ``notes``): for a
    report of a partial or damaged run, where :func:`read_json` would stop it."""
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        if notes is not None:
            notes.append(f"{p}: unreadable ({type(e).__name__}), ignored")
        return None


def read_jsonl_lenient(p: Path, notes: list[str] | None = None,
                       limit: int | None = None) -> list[dict]:
    """The object rows of a JSONL file (at most ``limit``); unreadable lines skipped, counted in a
    note (:func:`iter_jsonl` refuses the whole file instead)."""
    rows: list[dict] = []
    if not p.is_file():
        return rows
    bad = 0
    try:
        fh = open(p, encoding="utf-8", errors="replace")
    except OSError:
        if notes is not None:
            notes.append(f"{p}: unreadable, ignored")
        return rows
    with fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except (ValueError, RecursionError):
                bad += 1
                continue
            if isinstance(r, dict):
                rows.append(r)
                if limit is not None and len(rows) >= limit:
                    break
            else:
                bad += 1
    if bad and notes is not None:
        notes.append(f"{p}: {bad} unreadable line(s) ignored (a file still being written?)")
    return rows
