"""Privacy provenance: what every file popri writes may be released as, derived from its inputs.

    popri account ledger runs/x     # names every file whose chain holds a not-dp link
    python -m pytest -q tests/test_provenance.py

Each output of a command carries a status (issue 66), strongest first:

- ``public``  -- no client data in its chain (the server's public data, models, prompts);
- ``dp``      -- client data entered its chain only through DP mechanisms: the ledger entries
  (release ids) it depends on are listed;
- ``not-dp``  -- something in its chain read client data without a DP guarantee: a noise-free
  diagnostic (``score --diagnostic``), a research read (an evaluation on the private test
  split, eps = inf, exact checkpoint selection), a release at z = 0, or one accounted under a
  convention that is not a guarantee (``--convention papers``); ``links`` name each;
- ``private`` -- the clients' data itself or a per-record transform of it (a fetched private
  dataset, its embeddings, per-client uploads): it stays with the clients.

**Derivation.** A command declares (:class:`Flow`, on its :class:`~popri.core.spec.Call`) the
role of each input: ``private`` inputs are consumed by its DP mechanism and contribute what the
mechanism guarantees (``dp``, or ``not-dp`` with the reason); ``transform`` inputs pass a
``private`` status on unchanged (embedding private text gives private embeddings); any other
input that is ``private`` makes the output ``not-dp`` (client data read without a mechanism),
and otherwise passes its own status on.  An output's status is the **weakest** of its inputs'
(``private`` < ``not-dp`` < ``dp`` < ``public``); ``dp`` entries and ``not-dp`` links are
unioned.  In release mode a command refuses an input whose chain is ``not-dp``
(:func:`plan`); in research mode it propagates the mark and says so on stderr.

**Storage.** A file output ``F`` has ``F.provenance.json``; a directory output ``D`` holds
``D/provenance.json``.  The companion is committed *before* its output (the file-commit points
of :mod:`popri.core.io` and :func:`popri.core.outdir.replace` call :func:`before_commit`), with
the output's size, mtime and sha256: a companion that does not match its file (the file was
replaced or edited after popri wrote the companion, or a kill fell between the two renames) is
read as ``not-dp`` ("changed since"), never as the status it records.  A file popri did not
write (no companion) is *unmarked* and counts as ``public``: popri cannot know what a user's
own file holds, so the role a command gives it is the user's declaration.  Standard input and
output carry no companion (a pipe is unmarked); ``score --diagnostic`` refuses ``--out -``.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from popri.core import log
from popri.core.errors import InputError

FORMAT = "popri-provenance"
SUFFIX = ".provenance.json"
DIR_FILE = "provenance.json"
#: strongest first; the weakest of a set wins
STATUSES = ("public", "dp", "not-dp", "private")
_RANK = {s: i for i, s in enumerate(STATUSES)}
#: what a command's input may be to it (see the module docstring)
ROLES = ("data", "private", "transform")
NOT_DP = "NOT A DP GUARANTEE"


@dataclass(frozen=True)
class Provenance:
    """One file's privacy status; ``entries``: the ledger release ids of a ``dp`` chain;
    ``links``: why a chain is ``not-dp`` / ``private`` ("PATH: reason"), each once."""

    status: str = "public"
    entries: tuple[str, ...] = ()
    links: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.status not in _RANK:
            raise ValueError(f"unknown provenance status {self.status!r}")

    @property
    def guarantee(self) -> bool:
        """True for ``public`` and ``dp``: what may be released under the ledger's epsilon."""
        return self.status in ("public", "dp")

    def words(self) -> str:
        """One line: ``dp (2 ledger entries)``, ``public``, or ``NOT A DP GUARANTEE (not-dp):
        LINK; LINK``."""
        if self.status == "dp":
            n = len(self.entries)
            return f"dp ({n} ledger entr{'y' if n == 1 else 'ies'})" if n else "dp"
        if self.status == "public":
            return "public"
        what = "private client data" if self.status == "private" else "not-dp"
        return f"{NOT_DP} ({what}): " + "; ".join(self.links or ("(no link recorded)",))

    def to_json(self) -> dict:
        return {"status": self.status, "entries": list(self.entries), "links": list(self.links)}


PUBLIC = Provenance()


def _uniq(xs: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x for x in xs if x))


def combine(provs: Iterable[Provenance]) -> Provenance:
    """The weakest status of ``provs`` (``public`` when empty); entries and links unioned."""
    provs = list(provs)
    if not provs:
        return PUBLIC
    status = max((p.status for p in provs), key=_RANK.__getitem__)
    return Provenance(status, _uniq(e for p in provs for e in p.entries),
                      _uniq(x for p in provs for x in p.links))


def dp(entries: Iterable[str] = ()) -> Provenance:
    return Provenance("dp", _uniq(entries))


def not_dp(*links: str) -> Provenance:
    return Provenance("not-dp", links=_uniq(links))


def private(*links: str) -> Provenance:
    return Provenance("private", links=_uniq(links))


# --------------------------------------------------------------------------- files
def is_companion(name: str) -> bool:
    """``name`` (a file name) is a provenance companion's: marks, not content (no directory
    digest or foreign-file check counts them)."""
    return name == DIR_FILE or name.endswith(SUFFIX)


def companion(path: str | os.PathLike) -> Path:
    """Where the provenance of ``path`` lives: ``F.provenance.json``, or ``D/provenance.json``
    for a directory."""
    p = Path(path)
    return p / DIR_FILE if p.is_dir() else Path(os.fspath(p) + SUFFIX)


def _fingerprint(path: Path) -> dict | None:
    if not path.is_file():
        return None
    st = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": h.hexdigest()}


def _matches(path: Path, fp: dict) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_size != fp.get("size"):
        return False
    if st.st_mtime_ns == fp.get("mtime_ns"):
        return True
    return (_fingerprint(path) or {}).get("sha256") == fp.get("sha256")  # copied, not changed


def is_ours(path: str | os.PathLike) -> bool:
    """``path`` is a provenance companion popri wrote (its ``format``)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _write(dest: Path, prov: Provenance, *, of: Path | None, pending: bool = False) -> None:
    """Write ``dest`` (the companion) atomically; ``of``: the file whose fingerprint it holds
    (a staged temporary file about to be renamed into place), None for a directory."""
    # a private file's size would count the clients' records: none is kept (private is the
    # weakest status, so a swapped file cannot read as anything stronger)
    fp = _fingerprint(of) if of is not None and prov.status != "private" else None
    doc = {"format": FORMAT, "format_version": 1, **prov.to_json(),
           "pending": pending, "file": fp}
    # popri.core.io's atomic write calls before_commit: a write of its own (same pattern:
    # an exclusive temporary name beside it, fsync, one rename)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read(path: str | os.PathLike) -> Provenance | None:
    """The recorded provenance of ``path`` (None: unmarked): its companion, else what its own
    sidecar says (a diagnostic score vector), else that of the nearest marked directory above
    it (a file inside a dataset, an adapter inside a DPO output).  A companion that does not
    match its file, or one written before its output was finished, reads as ``not-dp``."""
    p = Path(path)
    c = companion(p)
    if c.is_file():
        return _read_companion(p, c)
    legacy = _legacy(p)
    if legacy is not None:
        return legacy
    for anc in p.absolute().parents:
        if (anc / DIR_FILE).is_file() and is_ours(anc / DIR_FILE):
            return _read_companion(anc, anc / DIR_FILE)
    return None


def _read_companion(p: Path, c: Path) -> Provenance | None:
    try:
        doc = json.loads(c.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return not_dp(f"{p}: its provenance file {c} cannot be read")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None  # a user's file of that name: says nothing
    status = doc.get("status") if doc.get("status") in _RANK else "not-dp"
    prov = Provenance(str(status), _uniq(doc.get("entries") or ()), _uniq(doc.get("links") or ()))
    if doc.get("pending"):
        return combine([prov, not_dp(f"{p}: popri did not finish writing it")])
    fp = doc.get("file")
    if fp and not _matches(p, fp):
        return combine([prov, not_dp(f"{p}: changed since popri recorded its provenance")])
    return prov


def _legacy(p: Path) -> Provenance | None:
    """A score vector or FreD statistics written without a companion (by the Python API, or
    an older popri), read from its sidecar: ``diagnostic`` (noise-free) or ``private: false``
    is not-dp; ledger entries at z = 0 or under a convention are not-dp; other ledger entries
    are dp."""
    if p.suffix not in (".npy", ".npz"):
        return None
    side = p.with_suffix(".json")
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    if meta.get("diagnostic") or meta.get("private") is False:
        return not_dp(f"{p}: noise-free statistics ({side} says so)")
    rows = [r for r in meta.get("ledger") or () if isinstance(r, dict)]
    if not rows:
        return None
    for r in rows:
        params = r["params"] if isinstance(r.get("params"), dict) else {}
        if r.get("noise_multiplier") == 0:
            return not_dp(f"{p}: released at z = 0 (epsilon = inf)")
        if r.get("convention") or params.get("convention"):
            return not_dp(f"{p}: accounted under a convention, which is not a DP guarantee")
    return dp(str(r["release_id"]) for r in rows if r.get("release_id"))


def status_of(path: str | os.PathLike | None) -> Provenance:
    """``read(path)``, with an unmarked file, ``-`` and a name that is no file (a model alias,
    a hub id) as ``public``."""
    if path is None or os.fspath(path) in ("", "-") or not os.path.lexists(path):
        return PUBLIC
    return read(path) or PUBLIC


def scan(root: str | os.PathLike) -> list[tuple[Path, Provenance]]:
    """Every marked output under ``root`` (a file's companion, or a directory's), sorted."""
    root = Path(root)
    out: list[tuple[Path, Provenance]] = []
    if root.is_file():
        prov = read(root)
        return [(root, prov)] if prov is not None else []
    for c in sorted(root.rglob("*" + SUFFIX)):
        if is_ours(c):
            f = Path(os.fspath(c)[: -len(SUFFIX)])
            if f.exists():
                out.append((f, read(f) or PUBLIC))
    for c in sorted(root.rglob(DIR_FILE)):
        if c.parent.is_dir() and is_ours(c):
            out.append((c.parent, read(c.parent) or PUBLIC))
    return sorted(out, key=lambda t: str(t[0]))


def not_dp_files(root: str | os.PathLike) -> list[tuple[Path, Provenance]]:
    """The marked outputs under ``root`` whose chain is ``not-dp`` (private data excluded:
    it is the clients' own, not a release)."""
    return [(f, p) for f, p in scan(root) if p.status == "not-dp"]


# --------------------------------------------------------------------------- a command's flow
@dataclass(frozen=True)
class Flow:
    """What a command's outputs derive their provenance from: ``inputs`` maps each input field
    of its Call to a role (:data:`ROLES`); ``outputs`` maps each output field to the input
    fields it depends on (None: all of them); ``mechanism(call)`` is what the ``private``
    inputs contribute (a DP mechanism's ``dp`` or ``not-dp`` with its reason); ``source(call)``
    is the status of an output with no inputs (``bench fetch``: private unless ``--public``);
    ``entries(call, out)`` the ledger release ids an output's ``dp`` link holds (read after the
    command ran); ``private_out``: output fields that are per-client data (``private``)."""

    inputs: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    mechanism: Callable[[Any], Provenance] | None = None
    source: Callable[[Any], Provenance] | None = None
    entries: Callable[[Any, str], list[str]] | None = None
    private_out: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = [r for r in self.inputs.values() if r not in ROLES]
        if bad:
            raise ValueError(f"unknown input role(s) {bad}")


def _paths(v: Any) -> list[str]:
    if v is None or isinstance(v, bool):
        return []
    if isinstance(v, (list, tuple)):
        return [p for x in v for p in _paths(x)]
    s = os.fspath(v) if isinstance(v, (str, os.PathLike)) else None
    return [s] if s and s != "-" else []


def contributions(flow: Flow, call: Any, command: str) -> dict[str, Provenance]:
    """Each input field's contribution to the outputs that depend on it."""
    out: dict[str, Provenance] = {}
    for name, role in flow.inputs.items():
        paths = _paths(getattr(call, name, None))
        if role == "private":  # consumed by the mechanism (a federation when no path is given)
            out[name] = flow.mechanism(call) if flow.mechanism else not_dp(
                f"popri {command}: reads client data with no mechanism declared")
            continue
        parts = []
        for p in paths:
            prov = status_of(p)
            if prov.status == "private" and role != "transform":
                prov = not_dp(f"{p}: client data read by 'popri {command}' without a DP "
                              "mechanism")
            parts.append(prov)
        out[name] = combine(parts)
    return out


def inherited(flow: Flow, call: Any, command: str,
              contrib: Mapping[str, Provenance] | None = None) -> set[str]:
    """The outputs whose not-dp status comes from an input file (not from this command's own
    mechanism or read): what research mode warns about after the command succeeded.
    ``contrib``: :func:`contributions`, when already read."""
    contrib = contributions(flow, call, command) if contrib is None else contrib
    bad = {n for n, p in contrib.items() if p.status == "not-dp"
           and flow.inputs.get(n) != "private" and not (p.links and all(
               f"'popri {command}'" in x for x in p.links))}
    out: set[str] = set()
    for name, deps in flow.outputs.items():
        use = set(contrib) if deps is None else set(deps)
        if use & bad and name not in flow.private_out:
            out.update(_paths(getattr(call, name, None)))
    return out


def derive(flow: Flow, call: Any, command: str,
           contrib: Mapping[str, Provenance] | None = None) -> dict[str, Provenance]:
    """Each output path of ``call`` -> its provenance (before the ledger's release ids).
    ``contrib``: :func:`contributions`, when already read."""
    contrib = contributions(flow, call, command) if contrib is None else contrib
    result: dict[str, Provenance] = {}
    for name, deps in flow.outputs.items():
        paths = _paths(getattr(call, name, None))
        if not paths:
            continue
        if name in flow.private_out:
            prov = private(f"{paths[0]}: per-client data of 'popri {command}'")
        else:
            use = list(contrib) if deps is None else [d for d in deps if d in contrib]
            prov = combine([contrib[d] for d in use])
            if flow.source is not None:
                prov = combine([prov, flow.source(call)])
        for p in paths:
            result[p] = prov
    return result


# --------------------------------------------------------------------------- commit hooks
_PENDING: dict[str, Provenance] = {}


def _key(path: str | os.PathLike) -> str:
    return os.path.abspath(os.fspath(path))


def before_commit(tmp: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Called by popri's commit points just before ``tmp`` is renamed to ``dest``: when a
    command planned ``dest``'s provenance, write its companion now, with ``tmp``'s fingerprint
    (a directory: ``tmp/provenance.json``, moved with it)."""
    if not _PENDING:
        return
    prov = _PENDING.get(_key(dest))
    if prov is None:
        return
    tmp = Path(tmp)
    if tmp.is_dir():
        _write(tmp / DIR_FILE, prov, of=None)
    else:
        _write(Path(os.fspath(dest) + SUFFIX), prov, of=tmp)


def plan(outputs: Mapping[str, Provenance], *, release: bool, command: str) -> None:
    """Before a command runs: refuse (release mode) an output whose chain is ``not-dp``, check
    no companion would overwrite a user's file, mark every file output pending and register
    the statuses for :func:`before_commit`.  Raises :class:`InputError`."""
    for out, prov in outputs.items():
        if prov.status == "not-dp":
            if release:
                raise InputError(f"release mode: this output's chain is {NOT_DP}: "
                                 + "; ".join(prov.links) + "; a release must not depend on it",
                                 path=out)
        c = companion(out)
        if c.exists() and not is_ours(c):
            raise InputError(f"would overwrite {c}, which popri did not write: move it or "
                             "choose another name", path=out)
    for out, prov in outputs.items():
        _PENDING[_key(out)] = prov
        p = Path(out)  # a new file: marked pending until written (an old one keeps its own
        # companion until the commit replaces both, or reads "changed since")
        if not os.path.lexists(p) and p.parent.is_dir():
            _write(Path(os.fspath(p) + SUFFIX), prov, of=None, pending=True)


def _special(p: Path) -> bool:
    """A device or a pipe (written in place: no companion)."""
    try:
        mode = os.stat(p).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def finish(outputs: Mapping[str, Provenance], entries: Callable[[str], list[str]] | None,
           ok: bool, warn: Iterable[str] = ()) -> None:
    """After a command: each output's final companion (with the ledger ids ``entries(out)``
    of a ``dp`` output, and the file as it now is); a pending companion of an output that was
    never written is removed.  ``warn``: outputs whose not-dp mark came from an input, said on
    stderr once written (research mode; release mode refused them in :func:`plan`)."""
    warn = set(warn)
    try:
        for out, prov in outputs.items():
            p = Path(out)
            if _special(p):
                continue
            if prov.status == "dp" and entries is not None and p.exists():
                prov = Provenance("dp", _uniq([*prov.entries, *entries(out)]), prov.links)
            side = Path(os.fspath(p) + SUFFIX)  # the pending mark of a new output: a file's
            # companion, dropped when the output is a directory (its own holds the status) or
            # was never written
            if (p.is_dir() or not p.exists()) and side.is_file() and is_ours(side) \
                    and _pending(side):
                side.unlink(missing_ok=True)
            if not p.exists():
                continue
            c = companion(p)
            if not ok:
                continue  # a failed command: what it committed has its companion; the rest
                # stays pending or as it was (read as not-dp, or unchanged)
            if read(p) != prov:
                _write(c, prov, of=None if p.is_dir() else p)
            if out in warn:
                log.warn(f"{out}: {prov.words()}")
    finally:
        for out in outputs:
            _PENDING.pop(_key(out), None)


def _pending(c: Path) -> bool:
    try:
        return bool(json.loads(c.read_text(encoding="utf-8")).get("pending"))
    except (OSError, ValueError, AttributeError):
        return False


def ledger_ids(path: str | os.PathLike) -> list[str]:
    """The release ids a DP output records of itself: its JSON sidecar's ``ledger`` (``NAME.json``
    of a score vector or FreD statistics) or a round directory's ``round.json``: what a ``dp``
    companion lists as its entries (none found: the status alone)."""
    p = Path(path)
    for side in (p / "round.json", p.with_suffix(".json")):
        try:
            meta = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and isinstance(meta.get("ledger"), list):
            return [str(r["release_id"]) for r in meta["ledger"]
                    if isinstance(r, dict) and r.get("release_id")]
    return []
