"""Python package descriptions from PyPI, one client per author: a federated corpus built from
a package registry (issue 44: a corpus nobody tuned popri's defaults on).

    popri bench fetch pypi --out data/pypi                  # fetches the pinned releases once
    popri bench fetch pypi --source DIR --out data/pypi     # DIR: release JSON files, offline
    python -m popri.data.pypi pin --every 232 --out popri/data/pypi_pins.txt   # redraw the pins

**The releases** are pinned: ``popri/data/pypi_pins.txt`` lists ``name==version digest`` lines,
drawn once from PyPI's simple index (every project whose sha256(name) is 0 modulo ``--every``,
at its latest version on the day of the draw, written in the file's header).  ``digest`` is the
sha256 (16 hex digits) of the fields this corpus reads (:func:`used_fields`).  A project's
record (``https://pypi.org/pypi/NAME/json``: its latest release) is fetched and checked against
its pin: a project with a newer release, or changed metadata, or deleted since is left out and
counted, so the corpus is the same text on every machine and day, or smaller.  Those fields are
cached under ``$POPRI_CACHE/sources/pypi/`` (written atomically).

**A client** is the first e-mail address in the release's ``author_email`` (else
``maintainer_email``), lower-cased; without one, the ``author`` (else ``maintainer``) name,
lower-cased; a release with neither is left out.  Placeholders ("UNKNOWN", "none") count as
absent.

**The text** of a release: its summary (given a full stop), then its description (the README)
as plain prose: code blocks (fenced, indented, reStructuredText literal blocks after ``::``),
directives, HTML, images, tables, headings, badges and URLs are removed, links keep their text,
list items their words.  A paragraph is kept when it has at least :data:`MIN_WORDS` words and
at least :data:`ASCII_SHARE` of its characters are ASCII (the corpus is English-leaning, as
sotu, shakespeare and Debian's descriptions are); at most :data:`MAX_CHARS` characters of
prose per release.  The date is the release's first upload (``data.date_from`` / ``date_to``
apply).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import html
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from popri.core import log, runtime
from popri.core.errors import InputError, MissingResourceError
from popri.data.sources import Document, SourceData

PINS = Path(__file__).with_name("pypi_pins.txt")
INDEX = "https://pypi.org"
#: a paragraph needs this many words to be prose
MIN_WORDS = 6
#: and this share of ASCII characters
ASCII_SHARE = 0.95
#: prose kept per release (characters)
MAX_CHARS = 2000
#: concurrent requests when fetching
WORKERS = 8
_PLACEHOLDER = {"", "unknown", "none", "null", "n/a", "na", "-", "todo", "author", "your name"}
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


def cache_root() -> Path:
    return runtime.cache_dir() / "sources" / "pypi"


def read_pins(path: str | os.PathLike = PINS) -> list[tuple[str, str, str]]:
    """(name, version, digest) per ``name==version digest`` line (``#`` comments and blank
    lines skipped)."""
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, digest = line.partition(" ")
        name, sep, version = spec.partition("==")
        if not sep or not name.strip() or not version.strip() or not digest.strip():
            raise InputError("expected name==version digest", path=str(path), line=n)
        out.append((name.strip(), version.strip(), digest.strip()))
    return out


#: the release fields the corpus reads (and the pins' digest covers)
INFO_FIELDS = ("name", "version", "summary", "description", "author", "author_email",
               "maintainer", "maintainer_email")


def used_fields(rec: dict) -> dict:
    """The part of a PyPI JSON record this corpus reads: INFO_FIELDS and the release files'
    upload times."""
    info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
    return {"info": {k: info.get(k) for k in INFO_FIELDS},
            "urls": sorted(({"upload_time_iso_8601": u.get("upload_time_iso_8601")
                             or u.get("upload_time")} for u in rec.get("urls") or []
                            if isinstance(u, dict)), key=lambda u: str(u["upload_time_iso_8601"]))}


def digest_of(rec: dict) -> str:
    return hashlib.sha256(json.dumps(used_fields(rec), sort_keys=True,
                                     ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def available() -> tuple[bool, str]:
    """For ``popri bench list``."""
    pins = read_pins()
    d = cache_root() / "json"
    have = sum(1 for n, v, _ in pins if (d / _file(n, v)).exists()) if d.is_dir() else 0
    if have == len(pins):
        return True, f"{have} pinned releases cached"
    return True, f"{len(pins)} pinned releases ({have} cached; the rest from {INDEX})"


def _file(name: str, version: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{name}-{version}") + ".json"


def _get(url: str, tries: int = 3) -> bytes | None:
    """The body of ``url``; None for 404 (a deleted release); raises after ``tries`` failures."""
    for k in range(tries):
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                return r.read()
        except urllib.error.HTTPError as e:
            if e.code in (404, 410):
                return None
            err = e
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            err = e
        time.sleep(1.0 + 2 * k)
    raise MissingResourceError(f"cannot fetch {url}: {err} (no network to PyPI? give --source "
                               f"DIR with the release JSON files)")


def fetch_releases(pins: list[tuple[str, str, str]], dest: Path) -> dict:
    """Each pinned release's used fields into ``dest/NAME-VERSION.json`` when the project's
    record still matches its pin (cached files kept), else a ``.missing`` marker saying why;
    counts of each."""
    dest.mkdir(parents=True, exist_ok=True)
    todo = [(n, v, h) for n, v, h in pins if not (dest / _file(n, v)).exists()
            and not (dest / (_file(n, v) + ".missing")).exists()]

    def one(nvh):
        n, v, h = nvh
        body = _get(f"{INDEX}/pypi/{n}/json")
        if body is None:
            return nvh, None, "deleted"
        try:
            rec = json.loads(body)
        except ValueError:
            return nvh, None, "not JSON"
        if str((rec.get("info") or {}).get("version")) != v:
            return nvh, None, "newer release"
        if digest_of(rec) != h:
            return nvh, None, "changed metadata"
        return nvh, used_fields(rec), None

    if todo:
        log.info(f"pypi: fetching {len(todo)} project records from {INDEX}")
    counts: dict[str, int] = {}
    with cf.ThreadPoolExecutor(WORKERS) as ex:
        for k, ((n, v, _), rec, why) in enumerate(ex.map(one, todo), start=1):
            target = dest / (_file(n, v) + (".missing" if rec is None else ""))
            tmp = target.with_name(target.name + f".tmp{os.getpid()}")
            tmp.write_text(why or json.dumps(rec, ensure_ascii=False), encoding="utf-8")
            os.replace(tmp, target)
            counts[why or "fetched"] = counts.get(why or "fetched", 0) + 1
            if k % 500 == 0:
                log.info(f"pypi: {k}/{len(todo)}")
    return counts


def _present(x) -> str | None:
    s = str(x or "").strip()
    return None if s.lower().strip(" .") in _PLACEHOLDER else s


def client_of(info: dict) -> str | None:
    """The client id of a release: first e-mail of author_email / maintainer_email, else the
    author / maintainer name, lower-cased (None: no author at all)."""
    for key in ("author_email", "maintainer_email"):
        v = _present(info.get(key))
        m = _EMAIL.search(v or "")
        if m:
            return m.group(0).lower()
    for key in ("author", "maintainer"):
        v = _present(info.get(key))
        if v:
            return " ".join(v.lower().split())
    return None


_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
_TAG = re.compile(r"<[^>\n]{1,400}>")
_MD_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_MD_REF = re.compile(r"^\s*\[[^\]]+\]:\s*\S+.*$", re.M)
_RST_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`_{1,2}")
_RST_ROLE = re.compile(r":[a-z:]+:`([^`]+)`")
_URL = re.compile(r"https?://\S+|www\.\S+")
_UNDERLINE = re.compile(r"^\s*([=\-~^\"'`#*+_:.])\1{2,}\s*$")
_LIST = re.compile(r"^\s*(?:[-*+]|\d+[.)]|#\.)\s+")


def prose(text: str) -> str:
    """A README (Markdown or reStructuredText) as plain prose paragraphs (see the module
    docstring), at most MAX_CHARS characters."""
    t = str(text or "").replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    t = _FENCE.sub("\n", t)
    t = _HTML_COMMENT.sub(" ", t)
    t = _MD_IMAGE.sub(" ", t)
    t = _MD_REF.sub(" ", t)
    lines, out, skip_indented = t.split("\n"), [], False
    for i, line in enumerate(lines):
        s = line.strip()
        indented = line.startswith("    ") or line.startswith(" " * 3) and s.startswith(":")
        if skip_indented:
            if not s or indented or line.startswith("  "):
                continue
            skip_indented = False
        if s.startswith(".. "):  # a directive, comment or target, and its indented body
            skip_indented = True
            continue
        if indented:  # code, a literal block, a directive's options
            continue
        if (s.startswith(("#", "|", "+-", "+=", ">>>", "$ ", "...", "$", ">"))
                or _UNDERLINE.match(line)
                or (i + 1 < len(lines) and _UNDERLINE.match(lines[i + 1]) and s)):
            out.append("")  # headings, tables, prompts, quotes: a paragraph break
            continue
        if s.endswith("::"):  # an RST literal block follows
            s = s[:-2].rstrip() + ("." if s[:-2].strip() else "")
            skip_indented = True
        out.append(_LIST.sub("", s))
    paras, cur = [], []
    for s in out + [""]:
        if s:
            cur.append(s)
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    kept, total = [], 0
    for p in paras:
        p = _RST_LINK.sub(r"\1", p)
        p = _RST_ROLE.sub(r"\1", p)
        p = _MD_LINK.sub(r"\1", p)
        p = html.unescape(_TAG.sub(" ", p))
        p = _URL.sub(" ", p)
        p = re.sub(r"[`*_]{1,3}([^`*_]+)[`*_]{1,3}", r"\1", p)
        p = " ".join(p.split())
        words = p.split()
        if len(words) < MIN_WORDS or sum(c.isascii() for c in p) < ASCII_SHARE * len(p):
            continue
        if sum(any(ch.isalpha() for ch in w) for w in words) < 0.7 * len(words):
            continue  # tables of numbers, command lines
        kept.append(p)
        total += len(p)
        if total >= MAX_CHARS:
            break
    text = "\n\n".join(kept)
    return text[:MAX_CHARS].rsplit(" ", 1)[0] if len(text) > MAX_CHARS else text


def release_document(rec: dict, path: str = "release") -> Document | None:
    """The Document of one release's JSON (None: no author, or no English prose)."""
    info = rec.get("info")
    if not isinstance(info, dict):
        raise InputError("no 'info' object (not a PyPI release record?)", path=path, field="info")
    client = client_of(info)
    if client is None:
        return None
    summary = " ".join(str(info.get("summary") or "").split())
    if summary and sum(c.isascii() for c in summary) < ASCII_SHARE * len(summary):
        summary = ""
    if summary and summary[-1] not in ".!?":
        summary += "."
    body = prose(info.get("description") or "")
    text = "\n\n".join(x for x in (summary, body) if x)
    if len(text.split()) < MIN_WORDS:
        return None
    times = sorted(u.get("upload_time_iso_8601") or u.get("upload_time") or ""
                   for u in rec.get("urls") or [] if isinstance(u, dict))
    date = times[0][:10] if times and times[0] else None
    return Document(client_id=client, text=text, date=date,
                    fields={"project": str(info.get("name") or ""),
                            "version": str(info.get("version") or "")})


def load_pypi(source: str | None = None) -> SourceData:
    """The pinned releases' documents (``source``: a directory of their JSON files, read
    instead of the cache + PyPI: every ``*.json`` in it)."""
    if source:
        d = Path(source)
        if not d.is_dir():
            raise InputError("expected a directory of PyPI release JSON files", path=source)
        files = sorted(d.glob("*.json"))
        if not files:
            raise InputError("no *.json release files", path=source)
        missing = 0
    else:
        pins = read_pins()
        d = cache_root() / "json"
        fetch_releases(pins, d)
        missing = sum((d / (_file(n, v) + ".missing")).exists() for n, v, _ in pins)
        files = [d / _file(n, v) for n, v, _ in pins if (d / _file(n, v)).exists()]
    docs, skipped = [], 0
    digest = hashlib.sha256()
    for f in files:
        raw = f.read_bytes()
        digest.update(hashlib.sha256(raw).digest())
        try:
            rec = json.loads(raw)
        except ValueError as e:
            raise InputError(f"not JSON: {e}", path=str(f)) from None
        doc = release_document(rec, str(f))
        if doc is None:
            skipped += 1
        else:
            docs.append(doc)
    if not docs:
        raise InputError("no release with an author and English prose", path=str(d))
    clients = len({x.client_id for x in docs})
    log.info(f"pypi: {len(docs)} releases of {clients} authors ({skipped} without an author or "
             f"prose, {missing} pinned releases no longer on PyPI)")
    return SourceData("pypi", "releases " + digest.hexdigest()[:16], docs,
                      {"releases": len(files), "documents": len(docs), "authors": clients,
                       "skipped": skipped, "missing": missing,
                       "pins": None if source else str(PINS.name)})


def pin(every: int, out: str) -> None:
    """Draw the pins: every project of the simple index whose sha256(name) is 0 mod ``every``,
    at its latest version today."""
    body = _get(f"{INDEX}/simple/")
    if body is None:
        raise MissingResourceError(f"{INDEX}/simple/ not found")
    names = re.findall(r'<a href="[^"]*?([^"/]+)/">', body.decode("utf-8", "replace"))
    pick = sorted(n for n in set(names) if int(hashlib.sha256(n.encode()).hexdigest(), 16)
                  % every == 0)
    log.info(f"pypi pin: {len(pick)} of {len(names)} projects")

    def latest(n):
        b = _get(f"{INDEX}/pypi/{n}/json")
        if not b:
            return n, None, None
        rec = json.loads(b)
        return n, rec["info"].get("version"), digest_of(rec)

    with cf.ThreadPoolExecutor(WORKERS) as ex:
        got = [(n, v, h) for n, v, h in ex.map(latest, pick) if v]
    head = (f"# PyPI releases of popri's 'pypi' corpus (popri/data/pypi.py): every project of "
            f"{INDEX}/simple/ whose sha256(name) is 0 mod {every}, at its latest version on "
            f"{time.strftime('%Y-%m-%d', time.gmtime())} ({len(got)} of {len(names)} projects)\n")
    tmp = Path(out + ".tmp")
    tmp.write_text(head + "".join(f"{n}=={v} {h}\n" for n, v, h in got), encoding="utf-8")
    os.replace(tmp, out)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Draw the pinned PyPI releases of the pypi corpus.")
    ap.add_argument("cmd", choices=["pin"])
    ap.add_argument("--every", type=int, default=232)
    ap.add_argument("--out", default=str(PINS))
    a = ap.parse_args()
    try:
        pin(a.every, a.out)
    except (InputError, MissingResourceError) as e:
        sys.exit(f"popri.data.pypi: {e}")
