"""The ledger conformance check of ``popri run``: after each DP stage, the entries it recorded
must equal the ones the budget guard planned for it (issue 27).

    python -m pytest -q tests/test_ledger_protocol.py

Split out of :mod:`popri.pipeline.stages` (issue 68): :class:`LedgerChecks` is the runner's
part that reads the ledgers; the rule itself is :func:`popri.privacy.entries.conformance`.
"""

from __future__ import annotations

import json
from pathlib import Path

from popri.core import log
from popri.core.artifacts import digest, json_sidecar, path_digest
from popri.core.errors import PopriError
from popri.kit import DPRelease, Stage
from popri.privacy.entries import conformance
from popri.privacy.ledger import LockedLedgers, read_ledger


def recorded_release_ids(path: str | Path) -> set[str]:
    """The release ids a DP stage's output records: a directory's ``round.json``
    (``release_id``), a score vector's / FreD statistics' JSON sidecar (its ``ledger``
    entries).  Empty when it records none."""
    p = Path(path)
    f = p / "round.json" if p.is_dir() else Path(json_sidecar(str(p)))
    try:
        d = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if not isinstance(d, dict):
        return set()
    ids = {d["release_id"]} if isinstance(d.get("release_id"), str) else set()
    for e in d.get("ledger") or []:
        if isinstance(e, dict) and isinstance(e.get("release_id"), str):
            ids.add(e["release_id"])
    return ids


def declared_release(stage: Stage) -> DPRelease:
    """The DP release a DP stage declares (the runner's ledger checks run for those only)."""
    if stage.release is None:
        raise ValueError(f"stage {stage.name} declares no DP release")
    return stage.release


class LedgerChecks:
    """The runner's plan-vs-record checks (mixed into
    :class:`popri.pipeline.stages.StageRunner`: its ``accountant``, ``convention`` and
    ``marker``)."""

    accountant: str
    convention: str | None

    def marker(self, stage: Stage) -> dict: ...  # StageRunner's

    # ------------------------------------------------------------------ DP stages: plan = record
    def _ledger_snapshot(self, stage: Stage) -> tuple[int, list[str]] | None:
        """A DP stage's ledger before it runs (read once): its entry count and release ids."""
        if stage.release is None:
            return None
        mine = self._mine(stage)
        return len(mine), [e.release_id for e in mine]

    def _conform(self, stage: Stage, before: tuple[int, list[str]] | None,
                 earlier: dict | None = None) -> dict | None:
        """After a DP stage ran: do the entries it recorded equal the ones the budget guard
        composed for it (``stage.release.entries``)?  A stage whose entries all repeat release
        ids already in the ledger (a research-mode rerun of the same seeded release, a DP-FTRL
        tree's later round) released nothing new, and its plan is empty for that reason too
        -- unless it reran a release that had finished (``earlier``: its old marker) and its
        outputs are not bit for bit the ones that release wrote: then it is a new release
        under an old id, and is ledgered as one (:meth:`_ledger_rerun`).  A difference from
        the plan stops the run: the guard was computed on the wrong entries."""
        if before is None:
            return None
        n, ids = before[0], set(before[1])
        mine = self._mine(stage)
        appended = mine[n:]
        # a line repeating a release another stage recorded is no new release: a DP-FTRL
        # tree's later leaf (issue 43: each leaf has its line, under the tree's id)
        ids |= self._others(stage)
        new = [e for e in appended if e.release_id not in ids]
        if not new:
            # the ledger already held the release (it dedupes by release id): its outputs
            # record an id that was there before the stage ran
            outs = set().union(*(recorded_release_ids(o) for o in stage.outputs))
            if appended or (outs and outs <= ids):
                old = (earlier or {}).get("hashes")
                if isinstance(old, dict) and old and outs:
                    now = {o: path_digest(o) for o in stage.outputs}
                    if any(old.get(o) != now[o] for o in stage.outputs):
                        return self._ledger_rerun(stage, [e for e in mine
                                                          if e.release_id in outs], now)
                    return {"planned": len(declared_release(stage).entries), "recorded": 0,
                            "agree": True, "note": "reran and reproduced its earlier release "
                            "bit for bit (hash-checked): the same release"}
                return {"planned": len(declared_release(stage).entries), "recorded": 0, "agree": True,
                        "note": "no new release: the ledger already held its release ids"}
        return self._check(stage, new)

    def _check(self, stage: Stage, recorded: list) -> dict:
        """The plan-vs-record check of a DP stage's new entries (a PopriError when they
        differ: the budget guard was computed on the wrong entries)."""
        planned = list(declared_release(stage).entries)
        problems = conformance(planned, recorded, accountant=self.accountant,
                               convention=self.convention)
        if problems:
            raise PopriError(f"stage {stage.name}: the ledger entries it recorded differ from "
                             f"the ones the budget guard planned: {'; '.join(problems)}. This is "
                             "a popri bug (the recorded entries are in the ledger, and `popri "
                             "account` totals them); please report it")
        return {"planned": len(planned), "recorded": len(recorded), "agree": True}

    def _ledger_rerun(self, stage: Stage, old: list, now: dict) -> dict:
        """A rerun of a finished DP release that recorded its old release id but wrote other
        bytes (floating-point sums can differ, e.g. with the thread count): a second release
        the ledger would count once.  Its entries are appended again under a derived id (the
        old id + the new outputs' hash) -- the budget guard counted this rerun as a new release
        before it ran -- and checked against the plan."""
        import dataclasses as dc

        tag = digest(sorted(now.items()))[:12]
        entries = [dc.replace(e, release_id=f"{e.release_id}+rerun-{tag}",
                              params={**e.params, "rerun_of": e.release_id})
                   for e in {e.release_id: e for e in old}.values()]
        check = self._check(stage, entries)
        with LockedLedgers([Path(declared_release(stage).ledger)]) as lk:
            lk.append(entries)
        log.warn(f"run: [{stage.name}] reran its finished release, which wrote other bytes than "
                 "before under the same release id: ledgered as a new release")
        return {**check, "note": "rerun of a finished release with other outputs: a new "
                                 "release (ledgered under a derived id)"}

    def ledger_checks(self, stages: list[Stage]) -> dict:
        """``{stage name: its plan-vs-record check}`` for the DP stages among ``stages`` (from
        their markers: a resumed run reports the stages an earlier invocation ran).  A finished
        DP stage whose marker holds no check (written by a popri that did not check) is
        reported as not checked (``agree`` None), never as agreeing."""
        out = {}
        for st in stages:
            if st.release is None:
                continue
            rec = self.marker(st)
            if not rec:
                continue
            if isinstance(rec.get("ledger_check"), dict):
                out[st.name] = rec["ledger_check"]
            else:
                out[st.name] = {"agree": None, "note": "not checked: its marker holds no "
                                                      "plan-vs-record check"}
        return out

    def _mine(self, stage: Stage) -> list:
        rel = declared_release(stage)
        led = Path(rel.ledger)
        return [e for e in read_ledger(led) if rel.match(e)] if led.is_file() else []

    def _others(self, stage: Stage) -> set[str]:
        """The release ids of the other stages' lines in this stage's ledger."""
        rel = declared_release(stage)
        led = Path(rel.ledger)
        return ({e.release_id for e in read_ledger(led)
                 if e.release_id and not rel.match(e)} if led.is_file() else set())
