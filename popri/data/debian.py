"""Debian/Ubuntu package descriptions from the local apt indexes; one client per Maintainer.

    popri bench fetch debian --out data/debian
    popri bench fetch debian --source DIR --out data/debian   # DIR of apt list files

Index files: ``apt-get indextargets -o Acquire::Languages=en --format '$(FILENAME)'`` plus
``/var/lib/apt/lists/*_Packages*`` and ``*_i18n_Translation-en*`` (``--source DIR``: the
``*Packages*`` and ``*Translation-en*`` files in DIR).  ``.gz``/``.xz``/``.bz2`` are read with
Python; ``.lz4``/``.zst`` (apt's default) with ``/usr/lib/apt/apt-helper cat-file``.

``Packages`` gives Package, Maintainer and Description-md5 (short description only); the long
description comes from ``Translation-en`` (``Description-md5`` -> ``Description-en``).  Text =
short description (given a full stop when a long one follows), then the long description with
its " ." paragraph markers unwrapped.
Packages seen in several indexes/architectures are kept once (same name + description md5).
Client id = the maintainer's e-mail address, lower-cased (the full Maintainer is kept as a field).
"""

from __future__ import annotations

import bz2
import glob
import gzip
import hashlib
import lzma
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

from popri.core import log
from popri.core.artifacts import file_digest
from popri.core.errors import InputError, MissingResourceError
from popri.data.sources import Document, SourceData

LISTS = "/var/lib/apt/lists"
APT_HELPER = "/usr/lib/apt/apt-helper"
#: what to run when the indexes are missing (root needs no sudo; containers often have none)
UPDATE_CMD = ("sudo " if hasattr(os, "geteuid") and os.geteuid() != 0 else "") + \
    "apt-get update -o Acquire::Languages=en"
_EMAIL = re.compile(r"<([^>]+)>")


def _is_packages(name: str) -> bool:
    return bool(re.search(r"(^|_)Packages(\.[a-z0-9]+)?$", name))


def _is_translation(name: str) -> bool:
    return bool(re.search(r"(^|_)Translation-en(\.[a-z0-9]+)?$", name))


def _indextargets() -> list[str]:
    if not shutil.which("apt-get"):
        return []
    try:
        p = subprocess.run(["apt-get", "indextargets", "-o", "Acquire::Languages=en",
                            "--format", "$(FILENAME)"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.strip() for ln in p.stdout.splitlines() if ln.strip()] if p.returncode == 0 else []


def find_index_files(source: str | None) -> tuple[list[str], list[str]]:
    """(Packages files, Translation-en files), sorted; raises with the command to run if absent."""
    if source:
        d = Path(source)
        if not d.is_dir():
            raise InputError("expected a directory of apt list files (Packages, Translation-en)",
                             path=source)
        cands = [str(p) for p in d.iterdir() if p.is_file()]
    else:
        cands = [f for f in _indextargets() if os.path.isfile(f)]
        cands += glob.glob(os.path.join(LISTS, "*_Packages*")) + \
            glob.glob(os.path.join(LISTS, "*_i18n_Translation-en*"))
    cands = sorted(set(os.path.realpath(c) for c in cands))
    pk = [c for c in cands if _is_packages(os.path.basename(c))]
    tr = [c for c in cands if _is_translation(os.path.basename(c))]
    if source and (not pk or not tr):
        raise InputError(f"needs *Packages* and *Translation-en* apt list files (found "
                         f"{len(pk)} and {len(tr)})", path=source)
    if not pk:
        raise MissingResourceError(f"no apt Packages index in {LISTS}; run: {UPDATE_CMD}")
    if not tr:
        raise MissingResourceError(f"no apt Translation-en index in {LISTS} (the long "
                                   f"descriptions live there); run: {UPDATE_CMD}")
    return pk, tr


def available() -> tuple[bool, str]:
    """For ``popri bench list``: are the apt indexes here?"""
    try:
        pk, tr = find_index_files(None)
    except MissingResourceError as e:
        return False, str(e)
    return True, f"{len(pk)} Packages + {len(tr)} Translation-en indexes"


def read_index(path: str) -> str:
    """The text of an apt index file, decompressing by suffix."""
    try:
        if path.endswith(".gz"):
            raw = gzip.open(path, "rb").read()
        elif path.endswith((".xz", ".lzma")):
            raw = lzma.open(path, "rb").read()
        elif path.endswith(".bz2"):
            raw = bz2.open(path, "rb").read()
        elif path.endswith((".lz4", ".zst")):
            if not os.path.exists(APT_HELPER):
                raise MissingResourceError(f"{path}: needs {APT_HELPER} (package apt) to decompress")
            p = subprocess.run([APT_HELPER, "cat-file", path], capture_output=True)
            if p.returncode != 0:
                raise InputError(f"apt-helper cat-file failed: {p.stderr.decode(errors='replace').strip()}",
                                 path=path)
            raw = p.stdout
        else:
            raw = Path(path).read_bytes()
    except (OSError, EOFError, lzma.LZMAError) as e:
        raise InputError(f"cannot read apt index: {e}", path=path) from None
    return raw.decode("utf-8", errors="replace")


def stanzas(text: str) -> Iterator[dict[str, str]]:
    """deb822 paragraphs: ``{field: value}``; continuation lines are kept with their newline."""
    for para in re.split(r"\n[ \t]*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in para.split("\n"):
            if not line or line.startswith("#"):
                continue
            if line[0] in " \t":
                if key is not None:
                    fields[key] += "\n" + line
                continue
            k, sep, v = line.partition(":")
            if not sep:
                continue
            key = k.strip()
            fields[key] = v.strip()
        if fields:
            yield fields


def description_text(desc: str) -> str:
    """Short description + long description paragraphs (" ." lines are paragraph breaks)."""
    lines = desc.split("\n")
    short, paras, cur = lines[0].strip(), [], []
    for ln in lines[1:]:
        body = ln[1:] if ln.startswith(" ") else ln
        if body.strip() == ".":
            if cur:
                paras.append(" ".join(cur))
            cur = []
        else:
            cur.append(body.strip())
    if cur:
        paras.append(" ".join(cur))
    paras = [p for p in paras if p]
    if paras and short and short[-1] not in ".!?:;":
        short += "."  # the synopsis has no full stop by convention; it is a sentence here
    return "\n\n".join([short] + paras)


def load_debian(source: str | None = None) -> SourceData:
    pk_files, tr_files = find_index_files(source)
    long_desc: dict[str, str] = {}
    for f in tr_files:
        for st in stanzas(read_index(f)):
            md5, d = st.get("Description-md5"), st.get("Description-en")
            if md5 and d and md5 not in long_desc:
                long_desc[md5] = d
    seen: dict[tuple[str, str], Document] = {}
    no_long = 0
    for f in pk_files:
        for st in stanzas(read_index(f)):
            name, maint, desc = st.get("Package"), st.get("Maintainer"), st.get("Description", "")
            if not name or not maint or not desc:
                continue
            if "\n" in desc:  # long description inline (repositories without Translation files)
                md5 = hashlib.md5((desc + "\n").encode("utf-8")).hexdigest()
                full = desc
            else:
                md5 = st.get("Description-md5") or hashlib.md5((desc + "\n").encode()).hexdigest()
                full = long_desc.get(md5)
                if full is None:
                    no_long += 1
                    full = desc
            if (name, md5) in seen:
                continue
            m = _EMAIL.search(maint)
            client = (m.group(1) if m else maint).strip().lower()
            seen[(name, md5)] = Document(client_id=client, text=description_text(full),
                                         fields={"package": name, "maintainer": maint,
                                                 "section": st.get("Section", "")})
    if not seen:
        raise InputError("no packages with Package, Maintainer and Description found",
                         path=source or LISTS)
    if no_long:
        log.info(f"debian: {no_long} packages have no Translation-en entry (short description only)")
    docs = [seen[k] for k in sorted(seen)]
    files = [{"file": os.path.basename(f), "sha256": file_digest(f)} for f in pk_files + tr_files]
    log.info(f"debian: {len(docs)} packages from {len(pk_files)} Packages + "
             f"{len(tr_files)} Translation-en indexes")
    return SourceData("debian", "apt indexes " + hashlib.sha256(
        "".join(x["sha256"] for x in files).encode()).hexdigest()[:16], docs, {"indexes": files})

