"""The privacy ledger: what every privacy-consuming step spent.

    popri score ... --out runs/round1/scores.npy      # appends to runs/round1/ledger.jsonl
    popri account ledger runs/                         # totals every ledger.jsonl below runs/
    python -m pytest -q tests/test_ledger_protocol.py

Each DP release appends one JSON line to ``ledger.jsonl`` in the directory of its outputs
(and copies the entry into the output's sidecar)::

    {"stage": "score", "mechanism": "subsampled_gaussian", "noise_multiplier": 1.05,
     "sample_rate": 0.0075, "sampling": "poisson", "steps": 1, "delta": 3e-06,
     "sensitivity": 1.0, "neighbouring": "add/remove one client", "mode": "research",
     "release_id": "...", "params": {...}, "popri_version": "0.1.0"}

``noise_multiplier`` is always (std of the noise on the aggregate) / (L2 sensitivity), so every
Gaussian release, whatever its stage, composes in one accountant.  In release mode it is the
*effective* multiplier of the discretised mechanism (:mod:`popri.privacy.noise`).

``mechanism`` names an entry of the accountant's registry
(:data:`popri.privacy.accounting.MECHANISMS`: ``gaussian``, ``subsampled_gaussian`` and whatever
:func:`~popri.privacy.accounting.register_mechanism` added); an unknown name is an error listing
the known ones, and the mechanism checks the fields it needs (numbers it reads from ``params``
count among the accounting fields below).

Writing is append-only and locked: :class:`LockedLedgers` takes an exclusive ``fcntl.flock`` on
each ledger file (following a symlink to a shared ledger, which stays a symlink), appends whole
lines with one ``write`` and ``fsync``, and can roll its own append back (truncate to the old
size) while it still holds the lock -- which is how :mod:`popri.privacy.release` makes
"entry recorded, then outputs committed" all-or-nothing.  A line torn by a kill in the middle of
an append (no trailing newline) belongs to a release whose outputs were never committed: readers
skip it with a warning and the next append cuts it off.

``popri account ledger PATH...`` totals any set of ledgers.  Entries are deduplicated by
``release_id`` (the same release copied into several files counts once); two entries with one id
but different accounting fields are a conflict and an error, never silently merged.

A research-mode (seeded) release gets a ``release_id`` derived from everything that determines
its noise draw (inputs, parameters, seed, output layout): running the identical command again
reproduces the identical output, which reveals nothing new, so it is not counted twice.  A
release-mode run (secure noise) draws a random id: two runs are two releases.

Every entry read (a ledger line, a sidecar's, hand-written or not) or written must name a
(sampling, neighbouring) pair that :data:`popri.privacy.relations.PROVEN` lists for its
mechanism (the table of docs/privacy.md), or popri <= 0.3's fixed-size pair that only
``--convention papers`` totals; anything else is one :class:`InputError` naming the file, the
line and the pair (:meth:`LedgerEntry.refusal`).  An empty ledger totals to an error, not 0.

DP-FTRL (issue 43): the rounds of an epoch's tree share the tree's id (one release), and each
records its own line with ``params.leaf`` and ``params.leaf_release_id``
(:meth:`LedgerEntry.leaf`): a second release of a leaf is refused by the ledger that recorded
the first (:meth:`LockedLedgers.append`, :func:`leaf_releases`), and counts the tree once more
when ledgers written apart are totalled together (:func:`dedupe`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from popri.core import log, provenance
from popri.core.errors import InputError
from popri.core.io import read_json
from popri.core.outdir import LEDGER_NAME  # noqa: F401 (ledger.jsonl; re-exported)
from popri.core.version import __version__
from popri.privacy import relations as _REL
from popri.privacy.accounting import (  # noqa: F401
    MECHANISMS,
    ParameterError,
    common_delta,
    compose,
    get_mechanism,
)

# MECHANISMS: the accountant's registry (popri.privacy.accounting.register_mechanism): an entry's
# mechanism must be registered there, and it checks the fields that mechanism needs
SAMPLINGS = ("none", "poisson", "fixed")
#: neighbouring relations, compared exactly (after lower-casing and collapsing blanks); their
#: meaning, and which sampling is accounted under which: popri.privacy.relations
RELATIONS = _REL.RELATIONS
MODES = ("research", "release")
#: the fields that decide what a release costs; two entries with one release_id must agree on them
ACCOUNTING_FIELDS = ("stage", "mechanism", "noise_multiplier", "sample_rate", "steps", "delta",
                     "sensitivity", "sampling", "neighbouring", "mode")


normalize_relation = _REL.normalize


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass
class LedgerEntry:
    stage: str
    mechanism: str
    noise_multiplier: float
    sample_rate: float
    steps: int
    delta: float | None
    sensitivity: float
    sampling: str = "none"  # none | poisson | fixed
    neighbouring: str = "add/remove one client"
    release_id: str = ""
    params: dict = field(default_factory=dict)
    mode: str = "research"  # research (seeded, reproducible noise) | release (secure noise)
    popri_version: str = __version__

    def __post_init__(self) -> None:
        if not isinstance(self.stage, str) or not self.stage:
            raise ValueError("stage must be a non-empty string")
        mech = get_mechanism(self.mechanism)  # ParameterError listing the known ones
        if not _number(self.noise_multiplier) or not (0 <= self.noise_multiplier < math.inf):
            raise ValueError(f"noise_multiplier must be a finite number >= 0 "
                             f"(got {self.noise_multiplier!r})")
        if not _number(self.sample_rate) or not (0 < self.sample_rate <= 1):
            raise ValueError(f"sample_rate must be a number in (0, 1] (got {self.sample_rate!r})")
        if (not _number(self.steps) or not math.isfinite(self.steps)
                or self.steps != int(self.steps) or self.steps < 1):
            raise ValueError(f"steps must be an integer >= 1 (got {self.steps!r})")
        self.steps = int(self.steps)
        if self.delta is not None and (not _number(self.delta) or not (0 < self.delta < 1)):
            raise ValueError(f"delta must be a number in (0, 1) (got {self.delta!r})")
        if not _number(self.sensitivity) or not (0 < self.sensitivity < math.inf):
            raise ValueError(f"sensitivity must be a finite number > 0 (got {self.sensitivity!r})")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)} (got {self.sampling!r})")
        if not isinstance(self.neighbouring, str) or \
                normalize_relation(self.neighbouring) not in RELATIONS:
            raise ValueError(f"neighbouring must be one of {', '.join(map(repr, RELATIONS))} "
                             f"(got {self.neighbouring!r})")
        self.neighbouring = normalize_relation(self.neighbouring)
        if not isinstance(self.release_id, str):
            raise ValueError("release_id must be a string")
        if not isinstance(self.params, dict):
            raise ValueError("params must be a JSON object")
        if self.mode not in MODES:
            raise ValueError(f"mode must be research or release (got {self.mode!r})")
        mech.check(self.to_dict())  # what this mechanism needs (e.g. params fields)

    def to_dict(self) -> dict:
        return asdict(self)

    def accounting_items(self) -> list[tuple[str, Any]]:
        """(name, value) of the fields that decide what this release costs: ACCOUNTING_FIELDS
        and the mechanism's ``params_fields`` (as ``params.NAME``)."""
        d = self.to_dict()
        mech = MECHANISMS.get(self.mechanism)
        extra = mech.params_fields if mech is not None else ()
        return ([(k, d[k]) for k in ACCOUNTING_FIELDS]
                + [(f"params.{k}", self.params.get(k)) for k in extra])

    def accounting(self) -> tuple:
        return tuple(v for _, v in self.accounting_items())

    @classmethod
    def from_dict(cls, d: Any, *, path: str = "", line: int | None = None) -> "LedgerEntry":
        if not isinstance(d, dict):
            raise InputError("a ledger entry must be a JSON object", path=path, line=line)
        need = ("stage", "mechanism", "noise_multiplier", "sample_rate", "steps")
        for k in need:
            if k not in d:
                raise InputError("missing required ledger field", path=path, line=line, field=k)
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known}
        kw.setdefault("delta", None)
        kw.setdefault("sensitivity", 1.0)
        kw.setdefault("mode", "research")  # entries written before modes existed: seeded noise
        try:
            entry = cls(**kw)
        except ParameterError as e:  # the mechanism registry: unknown, or a field it needs
            raise InputError(f"bad ledger entry: {e.message}", path=path, line=line,
                             field=e.param) from None
        except (TypeError, ValueError) as e:
            fld = str(e).split(" ", 1)[0] if str(e).split(" ", 1)[0] in known else None
            raise InputError(f"bad ledger entry: {e}", path=path, line=line, field=fld) from None
        why = entry.refusal()
        if why is not None:
            raise InputError(f"refused ledger entry: {why}", path=path, line=line,
                             field="neighbouring")
        #: where it was read ("path:line"), for the totals' messages (not a field: never written)
        setattr(entry, "where", f"{path}:{line}" if path and line is not None else (path or None))
        return entry

    def refusal(self) -> str | None:
        """Why this entry may not stand in a ledger at all (None when it may): its (sampling,
        neighbouring) pair has no proven accounting for its mechanism
        (:data:`popri.privacy.relations.PROVEN`, the table docs/privacy.md lists) and no
        convention totals it either (:meth:`~popri.privacy.mechanisms.Mechanism.papers`: only
        popri <= 0.3's fixed-size entries under add/remove, totalled by ``--convention papers``
        and refused by every other total).  Checked on every entry read
        (:meth:`from_dict`: any ledger line or sidecar, hand-written or not) and written
        (:meth:`LockedLedgers.append`)."""
        mech = MECHANISMS[self.mechanism]
        d = self.to_dict()
        why = mech.unproven(d)
        if why is None or mech.papers(d):
            return None
        return f"{mech.pair(d)}: {why}"

    def leaf(self) -> tuple[str, int, str] | None:
        """(tree release id, leaf, the leaf's own release id) of a DP-FTRL round's line, None
        for any other entry.  Every round of an epoch's tree records the tree's entry under the
        tree's id (one release for the accountant) with ``params.leaf`` and
        ``params.leaf_release_id`` (that round's own release id): a second release of one leaf
        with other noise is then seen -- refused when it would be written
        (:meth:`LockedLedgers.append`), counted as one more tree when ledgers written apart are
        totalled together (:func:`dedupe`)."""
        p = self.params
        leaf, lid = p.get("leaf"), p.get("leaf_release_id")
        if self.release_id and leaf is not None and _number(leaf) and isinstance(lid, str) \
                and lid:
            return self.release_id, int(leaf), lid
        return None


def make_release_id(*parts: Any, secure: bool = False) -> str:
    """Deterministic id from everything that decides the noise draw; random in release mode."""
    if secure:
        return secrets.token_hex(16)
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def ledger_path_for(output: str | os.PathLike) -> Path:
    """The ledger that sits next to an output file (or inside an output directory); a path
    that already names a ``ledger.jsonl`` is returned as it is."""
    p = Path(output)
    if p.name == LEDGER_NAME:
        return p
    return (p if p.is_dir() else p.parent) / LEDGER_NAME


# --------------------------------------------------------------------------- reading
def _parse(data: bytes, path: str) -> tuple[list[LedgerEntry], int]:
    """Entries of a ledger's bytes, and the length of its whole lines (a torn tail is skipped)."""
    out: list[LedgerEntry] = []
    whole = data.rfind(b"\n") + 1
    tail = data[whole:]
    if tail.strip():
        log.warn(f"{path}: last line is incomplete (a release killed while recording itself; "
                 "its outputs were never committed): skipped")
    for lineno, raw in enumerate(data[:whole].split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            msg = getattr(e, "msg", None) or type(e).__name__
            raise InputError(f"malformed ledger line: {msg}", path=path, line=lineno) from None
        out.append(LedgerEntry.from_dict(obj, path=path, line=lineno))
    return out, whole


def read_ledger(path: str | os.PathLike) -> list[LedgerEntry]:
    p = Path(path)
    if p.is_dir():
        raise InputError("is a directory, expected a ledger.jsonl file", path=str(p))
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError("no such file", path=str(p)) from None
    return _parse(data, str(p))[0]


def check_writable(targets: Iterable[str | os.PathLike]) -> None:
    """Fail early (before any noise is drawn) on a ledger that is broken or not a file."""
    for t in targets:
        lp = ledger_path_for(t)
        if lp.exists() or lp.is_symlink():
            if lp.is_dir():
                raise InputError("ledger path is a directory", path=str(lp))
            read_ledger(lp)


# --------------------------------------------------------------------------- writing
class LockedLedgers:
    """Exclusive locks on several ledger files, append-only writes, and rollback.

    ::

        with LockedLedgers([out_dir / "ledger.jsonl"]) as lk:
            lk.append(entries)          # locked, fsync'ed
            try:
                commit_outputs()
            except BaseException:
                lk.rollback()           # truncate back; still under the lock
                raise

    Locks are taken in a fixed order (device, inode) so two processes locking overlapping sets
    cannot deadlock; two paths naming one file (a symlink to a shared ledger) are one lock.
    """

    def __init__(self, paths: Iterable[str | os.PathLike]):
        self.paths = [ledger_path_for(p) for p in paths]
        self._files: list[tuple[Path, int]] = []  # (path, fd)
        self._sizes: dict[int, int] = {}          # fd -> size before our append

    def __enter__(self) -> "LockedLedgers":
        seen: dict[tuple[int, int], tuple[Path, int]] = {}
        try:
            for p in self.paths:
                target = Path(os.path.realpath(p))
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_dir():
                    raise InputError("ledger path is a directory", path=str(p))
                fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    os.close(fd)
                    continue
                seen[key] = (p, fd)
            for key in sorted(seen):
                p, fd = seen[key]
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._files.append((p, fd))
        except BaseException:
            for _, fd in seen.values():
                os.close(fd)
            self._files = []
            raise
        return self

    def __exit__(self, *exc) -> None:
        for _, fd in self._files:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        self._files = []

    def _read(self, fd: int) -> bytes:
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0) if size else b""

    def entries(self) -> list[LedgerEntry]:
        """Every entry currently in the locked ledgers (deduplicated)."""
        out: list[LedgerEntry] = []
        for p, fd in self._files:
            out += _parse(self._read(fd), str(p))[0]
        return dedupe(out)

    def append(self, entries: Iterable[LedgerEntry]) -> None:
        """Append ``entries`` to every locked ledger: an id already there with the same
        accounting fields is skipped (the same release), with other ones it is an error; a
        DP-FTRL leaf (:meth:`LedgerEntry.leaf`) of a tree already there gets a line of its own
        (the tree still counts once), and a leaf already released by another release is an
        :class:`InputError` -- nothing is written, so the outputs are never committed.  An entry
        no total may account (:meth:`LedgerEntry.refusal`) is refused too."""
        entries = list(entries)
        for e in entries:
            why = e.refusal()
            if why is not None:
                raise InputError(f"refused ledger entry: {why}", field="neighbouring")
        for p, fd in self._files:
            data = self._read(fd)
            existing, whole = _parse(data, str(p))
            if whole < len(data):  # cut a torn tail so the new line starts a line of its own
                os.ftruncate(fd, whole)
            by_id = {e.release_id: e for e in existing if e.release_id}
            leaves = {lf[:2]: lf[2] for lf in map(LedgerEntry.leaf, existing) if lf}
            new = []
            for e in entries:
                old = by_id.get(e.release_id) if e.release_id else None
                lf = e.leaf()
                if old is not None:
                    _check_same(old, e, str(p))
                    had = leaves.get(lf[:2]) if lf else None
                    if lf is None or had == lf[2]:
                        continue  # the same release (for a leaf: an identical research rerun)
                    if had is not None:
                        raise InputError(leaf_message(lf[1], lf[0]), path=str(p), field="leaf")
                new.append(e)
                if e.release_id:
                    by_id[e.release_id] = e
                if lf:
                    leaves[lf[:2]] = lf[2]
            self._sizes[fd] = whole
            if not new:
                continue
            blob = "".join(json.dumps(e.to_dict(), ensure_ascii=False, allow_nan=False) + "\n"
                           for e in new).encode("utf-8")
            try:
                written = os.write(fd, blob)
                if written != len(blob):
                    raise OSError(errno.ENOSPC, "short write to the ledger", str(p))
                os.fsync(fd)
            except OSError as err:
                os.ftruncate(fd, whole)
                raise OSError(err.errno, f"cannot record the release in the ledger: "
                                         f"{err.strerror}", str(p)) from None

    def rollback(self) -> None:
        """Undo this object's appends (the caller still holds the locks)."""
        for _, fd in self._files:
            if fd in self._sizes:
                os.ftruncate(fd, self._sizes[fd])
                os.fsync(fd)
        self._sizes.clear()


def append(output: str | os.PathLike, entries: Iterable[LedgerEntry]) -> Path:
    """Append entries to the ledger next to ``output`` (locked; an id already present with the
    same accounting fields is skipped, with different ones it is an error)."""
    lp = ledger_path_for(output)
    with LockedLedgers([lp]) as lk:
        lk.append(entries)
    return lp


def collect(paths: Iterable[str | os.PathLike]) -> list[LedgerEntry]:
    """Entries from ledger files, directories (every ledger.jsonl below) and score sidecars."""
    out: list[LedgerEntry] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = sorted(p.rglob(LEDGER_NAME))
            if not found:
                raise InputError(f"no {LEDGER_NAME} found under this directory", path=str(p))
            for f in found:
                out.extend(read_ledger(f))
        elif p.suffix == ".json":
            d = read_json(p)
            entries = d.get("ledger") if isinstance(d, dict) else None
            if entries is None:
                raise InputError("JSON file has no 'ledger' entries", path=str(p), field="ledger")
            for e in entries if isinstance(entries, list) else [entries]:
                out.append(LedgerEntry.from_dict(e, path=str(p)))
        elif p.exists():
            out.extend(read_ledger(p))
        else:
            raise InputError("no such file", path=str(p))
    return dedupe(out)


@dataclass
class Total:
    """The total of a set of ledgers (:func:`total`)."""

    composition: Any  # popri.privacy.accounting.Composition
    entries: list[LedgerEntry]
    #: the files under the totalled directories whose chain is not-dp (popri.core.provenance):
    #: what this epsilon does NOT cover, each with its links
    not_dp: list = field(default_factory=list)

    @property
    def research(self) -> int:
        """Entries made in research mode (seeded noise: no privacy against the seed's holder)."""
        return sum(e.mode == "research" for e in self.entries)

    def to_dict(self) -> dict:
        d = self.composition.to_dict()
        d["modes"] = {"research": self.research, "release": len(self.entries) - self.research}
        d["not_dp"] = [{"path": str(f), "status": p.status, "links": list(p.links)}
                       for f, p in self.not_dp]
        return d

    def not_dp_lines(self) -> list[str]:
        """``NOT A DP GUARANTEE: FILE: LINK; LINK`` for each not-dp file (none: [])."""
        return [f"{provenance.NOT_DP}: {f}: " + "; ".join(p.links) for f, p in self.not_dp]


def total(paths: Iterable[str | os.PathLike], *, delta: float | None = None,
          accountant: str = "rdp", convention: str | None = None) -> Total:
    """``popri account ledger``: every release recorded in ``paths`` (files, directories,
    sidecars; :func:`collect`, deduplicated by release id) composed into one epsilon at
    ``delta`` (default: the delta the entries agree on) by ``accountant``, under the relation
    the entries state (``convention="papers"``: entries without a proven accounting totalled
    as the papers did, NOT a DP guarantee).  A
    :class:`~popri.privacy.accounting.ParameterError` (``delta``, ``mechanism``,
    ``neighbouring``...) when they cannot be totalled."""
    paths = list(paths)
    entries = collect(paths)
    if not entries:  # an empty ledger (e.g. one whose only release was rolled back)
        one = len(paths) == 1
        raise InputError(("the ledger holds" if one else "the ledgers hold") + " no entries (no "
                         "DP release is recorded there): nothing to total",
                         path=str(paths[0]) if one else ", ".join(map(str, paths)))
    if delta is None:
        delta = common_delta(entries)
    bad = [fp for p in paths if os.path.isdir(p) for fp in provenance.not_dp_files(p)]
    return Total(compose(entries, delta, accountant, convention=convention), entries, bad)


def _check_same(a: LedgerEntry, b: LedgerEntry, where: str = "") -> None:
    if a.accounting() != b.accounting():
        diff = [k for (k, x), (_, y) in zip(a.accounting_items(), b.accounting_items()) if x != y]
        diff = diff or ["mechanism"]
        raise InputError(f"release_id {a.release_id} is recorded twice with different "
                         f"{', '.join(diff)}: two different releases cannot share an id; this "
                         "ledger cannot be totalled until the conflict is resolved",
                         path=where or None, field=diff[0])


def dedupe(entries: Iterable[LedgerEntry]) -> list[LedgerEntry]:
    """One entry per release_id; the same id with different accounting fields is an error.

    DP-FTRL leaves (:meth:`LedgerEntry.leaf`): the lines of one tree count once, but each
    further release of a leaf already released (another leaf release id: a copy of the tree's
    state released apart, into ledgers that were never checked against each other) counts the
    tree once more.  That over-counts, never under-counts: a second release of leaf r redraws
    at most the depth(R) nodes above it, within one more tree's worth of noise per client
    (:mod:`popri.privacy.tree`)."""
    seen: dict[str, LedgerEntry] = {}
    leaves: dict[tuple[str, int], set[str]] = {}
    out = []
    for e in entries:
        lf = e.leaf()
        if e.release_id:
            if e.release_id in seen:
                _check_same(seen[e.release_id], e)
                if lf is not None:
                    ids = leaves.setdefault(lf[:2], set())
                    if lf[2] not in ids:
                        if ids:  # this leaf, released again: one more tree
                            out.append(e)
                        ids.add(lf[2])
                continue
            seen[e.release_id] = e
            if lf:
                leaves.setdefault(lf[:2], set()).add(lf[2])
        out.append(e)
    return out


def leaf_message(leaf: int, tree_id: str, where: str | None = None) -> str:
    """The one line that refuses a second release of a DP-FTRL leaf."""
    return (f"leaf {leaf} of DP-FTRL tree {tree_id} was released already"
            + (f" (recorded in {where})" if where else "")
            + ": releasing it again with fresh noise would let the two noises average out "
            "(and the ledger would count the tree once); continue from the round that "
            "released it")


def leaf_releases(ledgers: Iterable[str | os.PathLike], tree_id: str,
                  leaf: int) -> dict[str, str]:
    """{leaf release id: the ledger recording it} for leaf ``leaf`` of the DP-FTRL tree
    ``tree_id`` in ``ledgers`` (paths; a ledger not there yet records nothing): what a round
    checks before drawing any noise."""
    out: dict[str, str] = {}
    for p in ledgers:
        lp = ledger_path_for(p)
        if not lp.is_file():
            continue
        for e in read_ledger(lp):
            lf = e.leaf()
            if lf and lf[:2] == (tree_id, int(leaf)):
                out.setdefault(lf[2], str(lp))
    return out
