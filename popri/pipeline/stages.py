"""Cached, resumable stages for ``popri run`` (DVC-style: content hashes, not timestamps).

    popri run examples/default.yaml            # a second call skips every up-to-date stage

A stage is one ``popri`` subcommand run in a subprocess (``python -m popri``) with its outputs
inside the run directory.  Its *key* is the sha256 of

- popri's version (a new release re-runs everything: its code may compute differently),
- the command line,
- the values of the ``POPRI_*`` settings that define a result (:data:`KEYED_ENV`:
  POPRI_CPU_BF16, when set; the thread count is not one, see :meth:`StageRunner.key`); every other ``POPRI_*`` variable
  is removed from the stage's environment (:data:`PASSED_ENV` are passed and do not change
  results), so an ambient ``POPRI_RELEASE`` or ``POPRI_CONFIG`` can neither change a stage
  behind its key nor leak into it,
- the content hash of each input: a file's sha256, a directory's sha256 over its files' names
  and bytes (:func:`popri.core.artifacts.path_digest`; never mtimes), or -- for an output of an
  earlier stage of this run -- the hash recorded when that stage finished.

When a stage finishes, a marker ``RUN/.stages/NAME.json`` holding the key and the sha256 of each
output is written atomically -- last.  On the next run a stage is skipped only when its marker
key matches AND every output still has the recorded hash: an edited or truncated intermediate
re-runs the stage that wrote it (and, by the chained keys, whatever depends on it), as DVC does.
A killed run continues from the last finished stage.  ``RUN/commands.sh`` is rewritten by each
run with that run's commands.

This is the driver's runner; the stages it runs are the recipe kit's
(:class:`popri.kit.Stage`, built by the methods' recipes below the driver).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from popri.core import log
from popri.core.artifacts import path_digest
from popri.core.errors import PopriError
from popri.core.io import atomic_write
from popri.core.runtime import fault_point
from popri.core.version import __version__
from popri.kit import Stage
from popri.pipeline.child import PARENT_ENV, ChildProcesses, child_argv, stage_env  # noqa: F401
from popri.pipeline.conformance import LedgerChecks, declared_release, recorded_release_ids  # noqa: F401
from popri.pipeline.keys import (KEYED_ENV, PASSED_ENV, RECORDED_ENV, StageKeys,  # noqa: F401
                                 changed_args, flags)
from popri.pipeline.lock import RunLock  # noqa: F401  (re-exported: the driver takes it here)
from popri.pipeline.reuse import (COPIED, Loan, copy_in, read_marker, translate, translator,
                                  written_paths)





class StageFailed(PopriError):
    """A stage's command failed (exit 1: the run stopped after it started), except where the
    stage's own one-line error says what the user must fix outside popri: a disk that cannot
    be written (full, read-only, over quota: exit 2, as every popri command) or a missing model
    (exit 3)."""

    def __init__(self, message: str, code: int = 1, said: str | None = None):
        super().__init__(message)
        self.exit_code = 3 if code == 3 else 2 if (code == 2 and said
                                                   and "cannot write: " in said) else 1












COMMANDS_HEADER = ("#!/bin/sh\n"
                   "# The stage commands of this run in order (cached ones included); every\n"
                   "# 'popri run' rewrites this file.\n"
                   "set -e\n")




class StageRunner(StageKeys, LedgerChecks, ChildProcesses):
    """Runs stages with caching.  ``dry_run``: nothing runs and nothing is written (no marker,
    no commands.sh, no directory); ``commands`` collects the plan, each command with
    ``# up to date`` where its cached result would be kept."""

    def __init__(self, run_dir: str | Path, *, env: dict | None = None, dry_run: bool = False):
        self.run_dir = Path(run_dir)
        self.marker_dir = self.run_dir / ".stages"
        # a stage's mode and defaults come from its command line only: an ambient POPRI_RELEASE,
        # POPRI_CONFIG or POPRI_EMBED_MODEL would change them behind the run's back
        self.env = stage_env(dict(os.environ), env)
        self.dry_run = dry_run
        self.commands: list[str] = []      # this run's commands, in order (commands.sh)
        self.hold = False                  # True: commands.sh not rewritten yet (see flush)
        self.keys: dict[str, str] = {}     # output path -> its content hash (or a plan tag)
        self._digests: dict[str, str] = {}  # other input path -> its content hash (memo)
        self.timings: dict[str, float] = {}
        self.total: int | None = None     # the run's stage count, for "[5/18 ...]" lines
        self.ran: list[str] = []
        self.skipped: list[str] = []
        self.reused: list[str] = []        # copied from a lender (--reuse-from)
        self.lenders: list[Path] = []      # --reuse-from: run directories to copy stages from
        self._lent: dict[str, str] = {}    # a lender's output -> its content hash (memo)
        self.log_path = self.run_dir / "commands.sh"
        self.accountant = "rdp"            # the run's accountant (the plan-vs-record check)
        self.convention: str | None = None  # and its privacy.convention (None, or "papers")
        self.lock_fd: int | None = None    # the run directory's lock, inherited by stages
        self._log_error: OSError | None = None  # a stage log that could not be kept
        self.stage_error: str | None = None     # the last stage's own one-line error
        self.planned_keys: dict[str, str] = {}  # stage name -> its key in the last survey
        self._zygote = None                # the stage zygote (popri.pipeline.zygote), once up
        self._zygote_off = False           # it failed, or POPRI_ZYGOTE=0: new interpreters
        self.planned_to_run: int | None = None  # stages the survey says will run (None: unknown)




    # ------------------------------------------------------------------ --reuse-from
    def loan(self, stage: Stage) -> "Loan | None":
        """The first lender (``--reuse-from``, :mod:`popri.pipeline.reuse`) whose finished
        stage of this name is this stage's result: its marker's key is this stage's key with
        every path under this run directory moved to the lender's, and its declared outputs
        still have their recorded hashes.  None for a DP release, or when no lender has it."""
        if not self.lenders or stage.release is not None or not stage.outputs:
            return None
        ours = os.fspath(self.run_dir)
        here = translator(ours, "")
        rel = [here(o) for o in stage.outputs]  # "/round1/samples.jsonl"
        if any(r == o or not r for r, o in zip(rel, stage.outputs)):
            return None  # an output outside the run directory (or the directory itself)
        for lender in self.lenders:
            rec = read_marker(lender / ".stages" / f"{stage.name}.json")
            outs, hashes = rec.get("outputs"), rec.get("hashes")
            if (not isinstance(outs, list) or len(outs) != len(rel) or not isinstance(hashes, dict)
                    or not isinstance(outs[0], str) or not outs[0].endswith(rel[0])):
                continue
            theirs = outs[0][:len(outs[0]) - len(rel[0])]  # the lender's directory, as it ran
            tr = translator(ours, theirs)
            if [tr(o) for o in stage.outputs] != outs:
                continue
            key = self._key(translate(stage.key_fields(), tr),
                            [(tr(i), self._input_key(i)) for i in stage.inputs])
            if rec.get("key") != key:
                continue
            mine = {o: hashes.get(tr(o)) for o in stage.outputs}
            if any(self._lent_digest(lender / here(o).lstrip(os.sep)) != h
                   for o, h in mine.items()):
                continue
            files = [(lender / here(p).lstrip(os.sep), Path(p)) for p in written_paths(stage)
                     if here(p) != p]
            files = [(src, dst) for src, dst in files if os.path.lexists(src)]
            sec = rec.get("seconds")
            return Loan(lender, files, {o: str(h) for o, h in mine.items()},
                        float(sec) if isinstance(sec, (int, float)) else None)
        return None

    def _lent_digest(self, path: Path) -> str:
        """A lender's output's content hash, computed once per runner."""
        k = os.fspath(path)
        if k not in self._lent:
            self._lent[k] = path_digest(path)
        return self._lent[k]

    def _borrow(self, stage: Stage, key: str, shown: str) -> bool:
        """Copy the stage's result from a lender (:meth:`loan`) and write its marker; False
        (nothing written that a run would not rewrite) when none has it or the copy does not
        hash as the lender's marker says."""
        loan = self.loan(stage)
        if loan is None:
            return False
        log.info(f"run: {self._where()} {stage.name}: {COPIED}{loan.lender} (the same command "
                 f"on the same inputs finished there): {shown}")
        for src, dst in loan.files:
            copy_in(src, dst)
        got = {o: path_digest(o) for o in stage.outputs}
        bad = [o for o in stage.outputs if got[o] != loan.hashes[o]]
        if bad:
            log.warn(f"run: {stage.name}: the copy of {bad[0]} from {loan.lender} does not have "
                     "the hash its marker recorded (the lender changed?): running the stage")
            self._lent.clear()
            return False
        self._record(shown + f"  # {COPIED}{loan.lender}")
        self._finish(stage, key, loan.seconds, reused_from=os.fspath(loan.lender), hashes=got)
        self.reused.append(stage.name)
        return True

    # ------------------------------------------------------------------ running
    def _marker(self, stage: Stage) -> Path:
        return self.marker_dir / f"{stage.name}.json"

    def marker(self, stage: Stage) -> dict:
        """The stage's marker ({} when it never finished or the marker is unreadable)."""
        return read_marker(self._marker(stage))

    def done(self, stage: Stage, key: str) -> dict | None:
        """The outputs' hashes when the stage's cached result is current: the marker has this
        key and every output still has the hash recorded when the stage finished."""
        m = self._marker(stage)
        if not m.exists():
            return None
        try:
            rec = json.loads(m.read_text())
        except (OSError, ValueError):
            return None
        hashes = rec.get("hashes") if isinstance(rec, dict) else None
        if rec.get("key") != key or not isinstance(hashes, dict):
            return None
        for o in stage.outputs:
            if hashes.get(o) is None or path_digest(o) != hashes[o]:
                if Path(o).exists() and not self.dry_run:
                    log.info(f"run: [{stage.name}] {o} changed since the stage wrote it: "
                             "running it again")
                return None
        return hashes

    def run(self, stage: Stage) -> bool:
        """Run ``stage`` unless its cached result is current. Returns True when it ran."""
        key = self.key(stage)
        shown = stage.shown()
        hashes = self.done(stage, key)
        if hashes is not None:
            if not self.dry_run:
                log.info(f"run: {self._where()} {stage.name} up to date, skipped")
            self.skipped.append(stage.name)
            self._record(shown + ("  # up to date" if self.dry_run else ""))
            for o in stage.outputs:
                self.keys[o] = hashes[o]
            return False
        if self.dry_run:
            loan = self.loan(stage)
            if loan is not None:  # it would be copied: its dependants see the lender's hashes
                self._record(shown + f"  # {COPIED}{loan.lender}")
                self.reused.append(stage.name)
                self.keys.update(loan.hashes)
                return False
            self._record(shown)
            for o in stage.outputs:  # what it would write is new: its dependants would run too
                self.keys[o] = f"planned:{key}"
            return False
        if stage.release is not None and self._adopt(stage, key, shown):
            return False
        if self._borrow(stage, key, shown):
            return False
        if stage.before is not None:
            stage.before(key)
        args = stage.args
        if stage.fresh and self.attempt(stage.name).get("key") != key:
            # another attempt's (or an older run's) checkpoints there are stale: start over
            args = stage.fresh_args()
        cmd = child_argv(args)
        log.info(f"run: {self._where()} {stage.name}: {shown}"
                 + (" (starting over: " + ", ".join(f"{k}={v}" for k, v in stage.fresh.items())
                    + ")" if args != stage.args else ""))
        self._record(shown)
        t0 = time.time()
        before = self._ledger_snapshot(stage)
        earlier = self.marker(stage) if stage.release is not None else {}
        self._pending(stage, key, before)

        def failed(rc: int, said: str | None) -> PopriError:
            where = self._log_path(stage)
            logged = f" (its log: {where})" if where.is_file() and not self._log_error else ""
            if said:  # the stage's own one-line error, as ours (its command is in the log)
                return StageFailed(f"stage {stage.name} failed (exit {rc}): {said}{logged}", rc,
                                   said)
            return StageFailed(f"stage {stage.name} failed (exit {rc}): {shown}{logged}")

        if stage.stdout_to:
            with atomic_write(stage.stdout_to) as out:
                rc = self._child(stage, cmd, out)
                if rc != 0:
                    raise failed(rc, self.stage_error)  # inside: the half-written stdout is discarded
        else:
            # a stage's own stdout (data, e.g. an adapter path) must not mix into ours
            rc = self._child(stage, cmd, None)
            if rc != 0:
                raise failed(rc, self.stage_error)
        if self._log_error is not None:  # the stage ran, but its log could not be kept
            raise self._log_error
        missing = [o for o in stage.outputs if not Path(o).exists()]
        if missing:
            raise PopriError(f"stage {stage.name} finished but did not write {missing}")
        check = self._conform(stage, before, earlier)
        fault_point(f"before-marker:{stage.name}")  # tests: a stop between commit and marker
        self.timings[stage.name] = time.time() - t0
        log.info(f"run: {self._where()} {stage.name} done in {self.timings[stage.name]:.0f} s")
        self._finish(stage, key, self.timings[stage.name], check)
        self.ran.append(stage.name)
        return True

    def _finish(self, stage: Stage, key: str, seconds: float | None,
                check: dict | None = None, reused_from: str | None = None,
                hashes: dict[str, str] | None = None) -> None:
        """The stage's marker (its key and outputs' hashes -- ``hashes`` when the caller has
        just computed them; a DP stage's plan-vs-record check; the lender it was copied from),
        written last."""
        if hashes is None:
            hashes = {o: path_digest(o) for o in stage.outputs}
        with atomic_write(self._marker(stage)) as fh:
            json.dump({"key": key, "popri": __version__, "args": stage.args,
                       "env": {k: self.env.get(k) for k in (*KEYED_ENV, *RECORDED_ENV)},
                       "outputs": stage.outputs, "hashes": hashes,
                       "seconds": None if seconds is None else round(seconds, 2),
                       **({"ledger_check": check} if check is not None else {}),
                       **({"reused_from": reused_from} if reused_from else {})}, fh, indent=2)
        for o in stage.outputs:
            self.keys[o] = hashes[o]
        self._pending_path(stage.name).unlink(missing_ok=True)






    # ------------------------------------------------------------------ DP stages: adoption
    def _pending_path(self, name: str) -> Path:
        return self.marker_dir / f"{name}.attempt.json"



    def attempt(self, name: str) -> dict:
        """``{"key", "before", "env"}`` of stage ``name``'s first unfinished attempt with its
        key ({} if none)."""
        try:
            rec = json.loads(self._pending_path(name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return rec if isinstance(rec, dict) else {}

    def threads_env(self) -> dict:
        """The recorded execution settings (:data:`RECORDED_ENV`) of this runner's stages."""
        return {k: self.env.get(k) for k in RECORDED_ENV}

    def same_attempt(self, name: str, key: str) -> bool:
        """Would a run of stage ``name`` now repeat its unfinished attempt exactly: the same key
        and the same recorded execution settings (a research-mode DP stage then reproduces the
        same seeded release, under the same release id)?"""
        rec = self.attempt(name)
        return rec.get("key") == key and rec.get("env", self.threads_env()) == self.threads_env()

    def note_attempt(self, name: str, key: str, before: list[str]) -> None:
        """Before a stage runs: its key, its thread count and (a DP stage) the release ids its
        ledger already holds (``before``), so a rerun can tell a release an attempt with this
        key committed from the earlier ones, and a training stage can resume only its own
        attempt's checkpoints.  The first attempt's record is kept until the stage finishes."""
        if not self.same_attempt(name, key):
            self.marker_dir.mkdir(parents=True, exist_ok=True)
            with atomic_write(self._pending_path(name)) as fh:
                json.dump({"key": key, "before": list(before), "env": self.threads_env()}, fh)

    def _pending(self, stage: Stage, key: str,
                 before: tuple[int, list[str]] | None) -> None:
        """The stage's attempt with ``key``: for a DP stage, the release ids its ledger held
        before it (``before``, :meth:`_ledger_snapshot`)."""
        if not self.same_attempt(stage.name, key):
            self.note_attempt(stage.name, key, before[1] if before is not None else [])

    def committed(self, stage: Stage, key: str | None = None) -> bool:
        """The DP stage's last attempt (with ``key``; any key when None) committed its release:
        its outputs exist and record a release id the ledger gained during that attempt."""
        rec = self.attempt(stage.name)
        if not rec or (key is not None and rec.get("key") != key):
            return False
        new = {e.release_id for e in self._mine(stage)} - set(rec.get("before") or [])
        return bool(new) and all(Path(o).exists() for o in stage.outputs) and any(
            recorded_release_ids(o) & new for o in stage.outputs)

    def _adopt(self, stage: Stage, key: str, shown: str) -> bool:
        """A DP stage killed after its release committed (ledger entry and outputs in place)
        but before its marker: the outputs are the release's -- they record a release id that
        this very attempt (same key) added to the ledger -- so the marker is written now and
        nothing is released again.  In release mode that release could never be reproduced,
        and a rerun would spend the budget twice.  The entries that attempt recorded are
        checked against the plan now, as if it had finished (a stop, or a failed check, before
        the marker must not leave the release unchecked)."""
        if not self.committed(stage, key):
            return False
        rec = self.attempt(stage.name)
        outs = set().union(*(recorded_release_ids(o) for o in stage.outputs))
        seen = set(rec.get("before") or [])
        new = list({e.release_id: e for e in self._mine(stage)
                    if e.release_id not in seen and e.release_id in outs}.values())
        check = self._check(stage, new)
        log.info(f"run: [{stage.name}] its release was committed (ledger and outputs) before "
                 "the run was stopped: kept as it is, not released again")
        self._record(shown + "  # committed before the stop, kept")
        self._finish(stage, key, None, {**check, "note": "committed before a stop; checked "
                                                         "when kept"})
        self.skipped.append(stage.name)
        return True







    def stage_seconds(self) -> dict[str, float]:
        """Every finished stage's seconds, from the markers (so across invocations: a fully
        cached rerun keeps the times of the runs that did the work)."""
        out = {}
        for m in sorted(self.marker_dir.glob("*.json")) if self.marker_dir.is_dir() else []:
            if m.name.endswith(".attempt.json"):
                continue
            try:
                sec = json.loads(m.read_text()).get("seconds")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(sec, (int, float)):
                out[m.stem] = round(float(sec), 1)
        return out

    def survey(self, stages: list[Stage]) -> tuple[list[str], list[tuple[str, str]]]:
        """What a run of ``stages`` would reuse and what it would run, without running or
        writing anything: (the names of the stages whose cached result is current, [(name,
        why it runs)]).  Why: "new" (never finished), the arguments that changed since its
        marker ("--lr 0.0005 -> 0.0002"), "inputs changed" (same arguments, an input's content
        or an earlier stage's output differs), or "outputs changed" (edited since written)."""
        probe = StageRunner(self.run_dir, dry_run=True)
        probe.env, probe.keys, probe._digests = self.env, dict(self.keys), self._digests
        probe.lenders, probe._lent = self.lenders, self._lent
        cached, todo = [], []
        writer: dict[str, str] = {}  # output -> the stage that will write it again
        for st in stages:
            key = probe.key(st)
            self.planned_keys[st.name] = key
            if probe.done(st, key) is not None:
                cached.append(st.name)
            elif (loan := probe.loan(st)) is not None:
                todo.append((st.name, f"{COPIED}{loan.lender}"))
            else:
                why = self._why(st, key)
                if why == "inputs changed":  # name the stages upstream that run again
                    up = list(dict.fromkeys(writer[i] for i in st.inputs if i in writer))
                    if up:
                        why = f"inputs changed: {', '.join(up)} runs again"
                todo.append((st.name, why))
                for o in st.outputs:
                    writer[o] = st.name
            probe.run(st)
        return cached, todo

    def _why(self, st: Stage, key: str) -> str:
        try:
            rec = json.loads(self._marker(st).read_text())
        except (OSError, ValueError):
            return "new"
        old = rec.get("args") if isinstance(rec, dict) else None
        if not isinstance(old, list):
            return "new"
        if old != st.args:
            return changed_args(old, st.args) or "arguments changed"
        if rec.get("key") == key:
            return "outputs changed"
        if rec.get("popri") != __version__:
            return f"popri {rec.get('popri')} -> {__version__}"
        env = rec.get("env")
        if isinstance(env, dict):
            diff = [f"{k}={env.get(k) or 'unset'} -> {self.env.get(k) or 'unset'}"
                    for k in KEYED_ENV if env.get(k) != self.env.get(k)]
            if diff:
                return ", ".join(diff)
        return "inputs changed"

    def _record(self, shown: str) -> None:
        """Add a command to this run's list; a real run rewrites RUN/commands.sh with the list
        so far (one file per run, not an ever-growing log)."""
        self.commands.append(shown)
        self.flush()

    def flush(self) -> None:
        """Rewrite RUN/commands.sh, unless held (the driver holds it until the budget check
        passed, so a refused run leaves the old list in place)."""
        if not self.dry_run and not self.hold:
            with atomic_write(self.log_path) as fh:
                fh.write(COMMANDS_HEADER + "".join(c + "\n" for c in self.commands))
