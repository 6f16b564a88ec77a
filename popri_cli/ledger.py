"""The privacy ledger: what every privacy-consuming step spent.

Each DP release appends one JSON line to ``ledger.jsonl`` in the directory of its outputs
(and copies the entry into the output's sidecar)::

    {"stage": "score", "mechanism": "subsampled_gaussian", "noise_multiplier": 1.05,
     "sample_rate": 0.0075, "sampling": "poisson", "steps": 1, "delta": 3e-06,
     "sensitivity": 1.0, "neighbouring": "add/remove one client", "release_id": "...", ...}

``noise_multiplier`` is always (std of the noise on the aggregate) / (L2 sensitivity), so
every Gaussian release, whatever its stage, composes in one accountant.
``popri account ledger PATH...`` totals any set of ledgers (deduplicated by ``release_id``:
the same release copied into several files is counted once).

A seeded (research-mode) release gets a ``release_id`` derived from its inputs, parameters and
seed: running the identical command again reproduces the identical output, which reveals
nothing new, so it is not counted twice.  A release-mode run (secure noise) draws a random id.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from . import __version__
from .errors import InputError
from .io import atomic_write, dumps, iter_jsonl, read_json

LEDGER_NAME = "ledger.jsonl"

MECHANISMS = ("gaussian", "subsampled_gaussian")


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
    popri_version: str = __version__

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"unknown mechanism {self.mechanism!r}")
        if not (self.noise_multiplier >= 0):
            raise ValueError("noise_multiplier must be >= 0")
        if not (0 < self.sample_rate <= 1):
            raise ValueError("sample_rate must be in (0, 1]")
        if int(self.steps) < 1:
            raise ValueError("steps must be >= 1")
        self.steps = int(self.steps)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, *, path: str = "", line: int | None = None) -> "LedgerEntry":
        need = ("stage", "mechanism", "noise_multiplier", "sample_rate", "steps")
        for k in need:
            if k not in d:
                raise InputError("missing required ledger field", path=path, line=line, field=k)
        known = {f for f in cls.__dataclass_fields__}
        try:
            return cls(**{k: v for k, v in d.items() if k in known},
                       **({} if "delta" in d else {"delta": None}),
                       **({} if "sensitivity" in d else {"sensitivity": 1.0}))
        except (TypeError, ValueError) as e:
            raise InputError(f"bad ledger entry: {e}", path=path, line=line) from None


def make_release_id(*parts: Any, secure: bool = False) -> str:
    """Deterministic id from the release's inputs/params/seed; random in release mode."""
    if secure:
        return secrets.token_hex(16)
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def ledger_path_for(output: str | os.PathLike) -> Path:
    """The ledger that sits next to an output file (or inside an output directory)."""
    p = Path(output)
    return (p if p.is_dir() else p.parent) / LEDGER_NAME


def read_ledger(path: str | os.PathLike) -> list[LedgerEntry]:
    path = str(path)
    return [LedgerEntry.from_dict(d, path=path, line=i)
            for i, d in enumerate(iter_jsonl(path), start=1)]


def append(output: str | os.PathLike, entries: Iterable[LedgerEntry]) -> Path:
    """Append entries to the ledger next to ``output`` (atomic rewrite, dedup by release_id)."""
    lp = ledger_path_for(output)
    existing = read_ledger(lp) if lp.exists() else []
    seen = {e.release_id for e in existing if e.release_id}
    new = [e for e in entries if not (e.release_id and e.release_id in seen)]
    if not new and lp.exists():
        return lp
    with atomic_write(lp) as fh:
        for e in existing + new:
            fh.write(dumps(e.to_dict()) + "\n")
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


def dedupe(entries: Iterable[LedgerEntry]) -> list[LedgerEntry]:
    seen: set[str] = set()
    out = []
    for e in entries:
        if e.release_id:
            if e.release_id in seen:
                continue
            seen.add(e.release_id)
        out.append(e)
    return out
