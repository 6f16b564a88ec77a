"""One release protocol for every DP stage: streams, id, staged outputs, ledger, commit.

    popri score --private runs/priv.npy --synthetic syn.jsonl -z 1.05 --out runs/r1/scores.npy
    python -m pytest -q tests/test_ledger_protocol.py

Every step that spends privacy (``score``, ``fred stats``, and every later one) does, in order:

1. **Named random streams** -- ``rel.rng("noise")``, ``rel.rng("sampling")``...: independent,
   reproducible streams of one seed in research mode; the OS CSPRNG in release mode.
2. **A release id over everything that changes the noise draw** (``rel.release_id(...)``): the
   stage, the data fingerprints, every mechanism parameter, the seed, the mode and the output
   layout (one draw on the sum vs one per client).  Identical research-mode commands reproduce
   identical outputs and share an id (counted once); anything else gets a new id.  Release mode
   draws a random id: every run is a new release.
3. **Outputs staged** in ``rel.outputs`` (an :class:`popri.core.io.AtomicOutputs`): temporary
   files next to their destinations, invisible until committed.
4. **Ledger entry appended under an exclusive file lock** (``fcntl.flock``) on every target
   ledger, fsync'ed, *then* the outputs committed (all-or-nothing renames).  If the commit
   fails, the append is rolled back while the lock is still held; if the process is killed
   between the two, the entry stays and the outputs never appear -- the ledger can over-count a
   release that never happened, never under-count one that did.

Research vs release mode: research mode (the default) seeds every stream, so anyone holding a
sidecar (which records the seed) can regenerate the noise: fine for experiments, no privacy
against that reader.  Release mode (``--release``) draws from ``os.urandom`` and uses the
discretised Gaussian of :func:`popri.privacy.noise.discrete_gaussian_release`.  Every
ledger entry and sidecar says which (``"mode"``).

A library caller gets exactly the CLI's ledger: the commands are thin wrappers over functions
that use this protocol (e.g. :func:`popri.feedback.release.release_scores`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from popri.core.io import AtomicOutputs
from popri.core.runtime import fault_point
from popri.privacy import ledger as L
from popri.privacy.noise import make_rng

#: the label of every exact statistic of the clients' data written beside a DP release (research
#: mode's diagnostics, or release mode's behind an explicit flag)
NOT_PRIVATE = ("NOT PRIVATE: exact statistics of the clients' data (counts, norms, losses); "
               "never publish them")


@dataclass
class Release:
    """One DP release.  Use as a context manager: leaving it by an exception discards the
    staged outputs and writes nothing.

    ``ledgers``: output paths or ledger files whose ``ledger.jsonl`` records the release (an
    output's ledger is the one next to it).  Empty only for diagnostics, which release nothing
    (``diagnostic=True``: no ledger entry, and the caller marks the outputs NOT PRIVATE)."""

    stage: str
    seed: int | None
    secure: bool = False
    ledgers: list = field(default_factory=list)
    diagnostic: bool = False

    def __post_init__(self) -> None:
        if self.diagnostic and self.secure:
            raise ValueError("a diagnostic (noise-free) output cannot be made in release mode")
        if not self.ledgers and not self.diagnostic:
            raise ValueError("a DP release needs a ledger to record it in")
        if not self.secure and self.seed is None:
            raise ValueError("research mode needs a seed")
        self.ledgers = [L.ledger_path_for(p) for p in self.ledgers]
        self.outputs = AtomicOutputs()
        self.committed = False

    # ------------------------------------------------------------------ mode, streams, ids
    @property
    def mode(self) -> str:
        return "release" if self.secure else "research"

    def rng(self, stream: str):
        """The random source for one purpose (independent streams of one seed)."""
        return make_rng(self.seed, secure=self.secure, stream=stream)

    def release_id(self, *parts: Any) -> str:
        return L.make_release_id(self.stage, self.mode, self.seed, *parts, secure=self.secure)

    def entry(self, **fields: Any) -> L.LedgerEntry:
        fields.setdefault("stage", self.stage)
        fields.setdefault("mode", self.mode)
        return L.LedgerEntry(**fields)

    def check_ledgers(self) -> None:
        """Fail before any noise is drawn if a target ledger is broken."""
        L.check_writable(self.ledgers)

    # ------------------------------------------------------------------ commit
    def commit(self, entries: Iterable[L.LedgerEntry]) -> None:
        """Record ``entries`` in every ledger (locked), then commit the staged outputs."""
        entries = list(entries)
        if self.diagnostic:
            if entries:
                raise ValueError("a diagnostic output records no ledger entries")
            self.outputs.commit()
            self.committed = True
            return
        if not entries:
            raise ValueError("a DP release must record at least one ledger entry")
        record(self.ledgers, entries, self.outputs)
        self.committed = True

    def __enter__(self) -> "Release":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            self.outputs.discard()


def record(ledgers: Iterable[str | os.PathLike], entries: Iterable[L.LedgerEntry],
           outputs: AtomicOutputs) -> None:
    """The protocol's last step for a stage that forwards entries of an earlier release (e.g.
    ``popri aggregate``): the entries first (locked), then the outputs, rolled back together."""
    entries = list(entries)
    with L.LockedLedgers([Path(p) for p in ledgers]) as lk:
        lk.append(entries)
        try:
            fault_point("after-ledger")
            outputs.commit()
        except BaseException:
            lk.rollback()
            raise
