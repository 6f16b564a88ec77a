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

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from popri.core import log, runtime
from popri.core.artifacts import digest, json_sidecar, path_digest
from popri.core.errors import InputError, PopriError
from popri.core.io import annotate_write_error, atomic_write
from popri.core.runtime import fault_point
from popri.core.version import __version__
from popri.kit import DPRelease, Stage
from popri.pipeline import zygote as Z
from popri.pipeline.reuse import (COPIED, Loan, copy_in, read_marker, translate, translator,
                                  written_paths)
from popri.privacy.entries import conformance
from popri.privacy.ledger import LockedLedgers, read_ledger

#: POPRI_* settings a stage inherits that define its outputs: their values are in its key
#: when set.  POPRI_CPU_BF16=1 (bf16 on a CPU, :func:`popri.models.llm.use_bf16`) changes more
#: than the last bits; POPRI_THREADS is an execution setting (see :meth:`StageRunner.key`)
KEYED_ENV: tuple[str, ...] = ("POPRI_CPU_BF16",)
#: POPRI_* settings a stage inherits that define no output (threads, logging, caches, test hooks)
PASSED_ENV = ("POPRI_THREADS", "POPRI_QUIET", "POPRI_PROGRESS", "POPRI_CACHE", "POPRI_FAULT",
              "POPRI_VLLM_KV_GIB", "POPRI_VLLM_EAGER", "POPRI_VLLM_INPROCESS")
#: recorded in each stage's marker and attempt (what it ran with), never in its key
RECORDED_ENV = ("POPRI_THREADS",)
#: set in a stage's environment to popri run's pid: the stage dies with it (popri.cli.process)
PARENT_ENV = runtime.PARENT_ENV


def child_argv(args: list[str]) -> list[str]:
    """``python -m popri ARGS`` without the current directory on sys.path (``-P``, Python >=
    3.11; before, a bootstrap that drops it): a directory named ``popri`` where the user stands
    -- ``popri run --run-dir popri`` makes one -- would otherwise shadow the package (its
    ``data/`` became ``popri.data``)."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "popri", *args]
    boot = ("import runpy, sys; del sys.path[0]; "
            "runpy.run_module('popri', run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", boot, *args]


class StageFailed(PopriError):
    """A stage's command failed (exit 1: the run stopped after it started), except where the
    stage's own one-line error says what the user must fix outside popri: a disk that cannot
    be written (full, read-only, over quota: exit 2, as every popri command) or a missing model
    (exit 3)."""

    def __init__(self, message: str, code: int = 1, said: str | None = None):
        super().__init__(message)
        self.exit_code = 3 if code == 3 else 2 if (code == 2 and said
                                                   and "cannot write: " in said) else 1


def stage_env(base: dict, extra: dict | None = None) -> dict:
    """The environment of a stage: ``base`` without any ``POPRI_*`` variable except
    :data:`KEYED_ENV` and :data:`PASSED_ENV`, plus ``extra`` (the runner's own settings)."""
    keep = set(KEYED_ENV) | set(PASSED_ENV)
    env = {k: v for k, v in base.items() if not k.startswith("POPRI_") or k in keep}
    env.update(extra or {})
    return env


class RunLock:
    """An exclusive lock on a run directory (``fcntl.flock`` on the directory itself: nothing
    is written) held by one ``popri run`` from its budget check to its last stage marker, so
    two runs can never both pass the budget guard on one ledger.  A second run is refused at
    once (exit 2), not queued, after a short grace; the lock dies with its process (a SIGKILLed
    run leaves none).  Every stage inherits the locked descriptor (:meth:`StageRunner._child`),
    so the directory stays locked while a stage of the run still lives: a stage outliving its
    popri run (it is told to die with it, :data:`PARENT_ENV`) cannot race a rerun."""

    #: seconds a busy lock is waited for before the run is refused
    GRACE = 5.0

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir)
        self.fd: int | None = None
        self.created = False

    def __enter__(self) -> "RunLock":
        import fcntl

        self.created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        deadline = time.time() + self.GRACE
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() < deadline:  # a stopped run's stage may still be exiting
                    time.sleep(0.2)
                    continue
                os.close(fd)
                self._cleanup()
                raise InputError("is in use by another popri run (or by a stage of a stopped "
                                 "one that is still exiting): wait for it to finish, or use "
                                 "another run_dir", path=str(self.path),
                                 field="run_dir") from None
        self.fd = fd
        return self

    def _cleanup(self) -> None:
        """A run refused before writing anything leaves no directory it created."""
        if self.created:
            try:
                self.path.rmdir()  # only if still empty
            except OSError:
                pass

    def __exit__(self, exc_type, *exc) -> None:
        if self.fd is None:
            return
        if exc_type is not None:
            self._cleanup()
        os.close(self.fd)  # releases the lock
        self.fd = None


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


def _flags(args: list[str]) -> dict[str, str]:
    """``--flag value`` / ``--switch`` pairs of a command line (positionals by position)."""
    out: dict[str, str] = {}
    i, pos = 0, 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[a] = args[i + 1]
                i += 2
                continue
            out[a] = ""
        else:
            out[f"#{pos}"] = a
            pos += 1
        i += 1
    return out


def changed_args(old: list[str], new: list[str]) -> str:
    """The differences of two command lines as ``--lr 0.0005 -> 0.0002, --new x, -gone``."""
    a, b = _flags(old), _flags(new)
    parts = []
    for k in list(dict.fromkeys([*a, *b])):
        if a.get(k) == b.get(k):
            continue
        name = k if not k.startswith("#") else "argument"
        if k not in a:
            parts.append(f"{name} {b[k]}".strip() + " (new)")
        elif k not in b:
            parts.append(f"{name} {a[k]}".strip() + " (dropped)")
        else:
            parts.append(f"{name} {a[k]} -> {b[k]}")
    return ", ".join(parts)


COMMANDS_HEADER = ("#!/bin/sh\n"
                   "# The stage commands of this run in order (cached ones included); every\n"
                   "# 'popri run' rewrites this file.\n"
                   "set -e\n")


def _release(stage: Stage) -> DPRelease:
    """The DP release a DP stage declares (the runner's ledger checks run for those only)."""
    if stage.release is None:
        raise ValueError(f"stage {stage.name} declares no DP release")
    return stage.release


class StageRunner:
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

    # ------------------------------------------------------------------ keys
    def _input_key(self, path: str) -> str:
        """An earlier stage's output: the hash it was recorded with; any other input: its
        content hash, computed once per runner (a dataset directory is an input of many
        stages, and no stage writes outside its own outputs)."""
        if path in self.keys:
            return self.keys[path]
        if path not in self._digests:
            self._digests[path] = path_digest(path)
        return self._digests[path]

    def key(self, stage: Stage) -> str:
        """The stage's key: popri's version, its command line, :data:`KEYED_ENV` and its
        inputs' content hashes.

        **The thread count (POPRI_THREADS) is in no stage's key**, decided per kind of stage:

        - pure Python / numpy stages (``bench fetch``, ``prefs build|pool``, ``pe draw|seeds``,
          ``account``, ``eval gap|diff``): their outputs do not depend on it at all;
        - the DP releases (``score``, ``fred stats``, ``fl round``): the noise comes from seeded
          streams and the sum is numpy's, but the sum's inputs (the synthetic set embedded in
          the stage) come from torch; the release id covers those inputs' bits, so a rerun
          whose bits moved is a new release (:meth:`_conform`);
        - the torch stages (``embed``, ``gen``, ``dpo``, ``sft``, ``train-downstream``, ``eval
          accuracy|probe|fid``, ``vary``, ``expand``): intra-op reductions split by thread, so
          the last bits of a float (rarely a sampled token) can change with the count.  An
          output computed with one count is no less the result of its command and inputs than
          one computed with another.

        So the count is an execution setting, like the machine: a run resumed with another
        count reuses every finished stage (were it keyed, a finished ``embed`` would rerun, and
        with it every DP stage after it as a new release, over the budget); stages still to run
        use the new count, and may differ in the last bits from an uninterrupted run, as on
        another machine.  The count each stage ran with is recorded in its marker (``env``)."""
        return self._key(stage.key_fields(), [(i, self._input_key(i)) for i in stage.inputs])

    def _key(self, fields: dict, inputs: list[tuple[str, str]]) -> str:
        """:meth:`key` of a stage's key fields and its (input, content hash) pairs."""
        h = hashlib.sha256()
        h.update(f"popri {__version__}\n".encode())
        h.update(json.dumps(fields, sort_keys=True, default=str).encode())
        for k in KEYED_ENV:  # only when set: keys of runs without it stay as they were
            if self.env.get(k):
                h.update(f"|{k}={self.env[k]}".encode())
        for i, k in inputs:
            h.update(f"|{i}={k}".encode())
        return h.hexdigest()

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
                    return {"planned": len(_release(stage).entries), "recorded": 0,
                            "agree": True, "note": "reran and reproduced its earlier release "
                            "bit for bit (hash-checked): the same release"}
                return {"planned": len(_release(stage).entries), "recorded": 0, "agree": True,
                        "note": "no new release: the ledger already held its release ids"}
        return self._check(stage, new)

    def _check(self, stage: Stage, recorded: list) -> dict:
        """The plan-vs-record check of a DP stage's new entries (a PopriError when they
        differ: the budget guard was computed on the wrong entries)."""
        planned = list(_release(stage).entries)
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
        with LockedLedgers([Path(_release(stage).ledger)]) as lk:
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

    # ------------------------------------------------------------------ DP stages: adoption
    def _pending_path(self, name: str) -> Path:
        return self.marker_dir / f"{name}.attempt.json"

    def _mine(self, stage: Stage) -> list:
        rel = _release(stage)
        led = Path(rel.ledger)
        return [e for e in read_ledger(led) if rel.match(e)] if led.is_file() else []

    def _others(self, stage: Stage) -> set[str]:
        """The release ids of the other stages' lines in this stage's ledger."""
        rel = _release(stage)
        led = Path(rel.ledger)
        return ({e.release_id for e in read_ledger(led)
                 if e.release_id and not rel.match(e)} if led.is_file() else set())

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

    def _where(self) -> str:
        """``[5/18 14:02:31]``: the stage's place in the run and the wall clock."""
        n = len(self.ran) + len(self.skipped) + len(self.reused) + 1
        of = f"/{self.total}" if self.total else "/?"  # ? until the data fixes the plan
        return f"[{n}{of} {time.strftime('%H:%M:%S')}]"

    def _log_path(self, stage: Stage) -> Path:
        return self.run_dir / "logs" / f"{stage.name}.log"

    #: how a stage's own one-line error starts (popri.cli.process)
    ERROR_PREFIX = b"popri: error: "

    def _child(self, stage: Stage, cmd: list[str], out) -> int:
        """Run a stage's command: its stderr forwarded line by line to ours and kept in
        RUN/logs/STAGE.log, carriage returns (a library's progress bar) turned into line ends;
        when the stage prints nothing for POPRI_HEARTBEAT seconds, a heartbeat line.  Returns the
        exit status; the stage's own one-line error (``popri: error: ...``, kept out of our
        stderr when it failed: the caller reports it as its own) is :attr:`stage_error`.

        The stage dies with this process (:data:`PARENT_ENV`: a SIGKILLed popri run leaves no
        stage running on) and inherits the run directory's lock (:class:`RunLock`).  A log
        that cannot be written (a full disk) stops being written; the stage runs on, and the
        error names the log (:attr:`_log_error`)."""
        import threading

        logf = self._log_path(stage)
        self._log_error = None
        last = [time.time()]
        said: list[bytes] = []
        t0 = time.time()
        fh = None
        try:
            logf.parent.mkdir(parents=True, exist_ok=True)
            fh = open(logf, "wb", buffering=0)
        except OSError as e:
            annotate_write_error(e, logf)
            self._log_error = e
        env = dict(self.env, **{PARENT_ENV: str(os.getpid())})
        fds = (self.lock_fd,) if self.lock_fd is not None else ()

        def keep(ln: bytes) -> None:
            nonlocal fh
            if fh is None:
                return
            try:
                fh.write(ln + b"\n")
            except OSError as e:  # the log is a side file: the stage runs on without it
                annotate_write_error(e, logf)
                self._log_error = e
                try:
                    fh.close()
                except OSError:
                    pass
                fh = None

        def emit(ln: bytes) -> None:
            if ln.strip():
                keep(ln)
                if ln.startswith(self.ERROR_PREFIX):
                    said.append(ln[len(self.ERROR_PREFIX):])
                    return
                try:
                    sys.stderr.buffer.write(ln + b"\n")
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
                last[0] = time.time()

        try:
            p = self._start(cmd, env, out if out is not None else sys.stderr.fileno(), fds)

            err_fd = p.stderr.fileno()  # type: ignore[union-attr]  (stderr=PIPE)

            def pump():
                buf = b""
                while chunk := os.read(err_fd, 65536):
                    buf += chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                    *lines, buf = buf.split(b"\n")
                    for ln in lines:
                        emit(ln)
                emit(buf)

            th = threading.Thread(target=pump, daemon=True)
            th.start()
            try:
                while True:
                    try:
                        rc = p.wait(timeout=1.0)
                        break
                    except subprocess.TimeoutExpired:
                        if time.time() - last[0] >= log.heartbeat():
                            log.info(f"run: {self._where()} {stage.name} running, "
                                     f"{time.time() - t0:.0f} s")
                            last[0] = time.time()
            except BaseException:
                p.kill()
                p.wait()
                raise
            finally:
                th.join(timeout=10)
        finally:
            if fh is not None:
                try:
                    fh.close()
                except OSError:
                    pass
        if rc == 0 and said:  # an error line from a stage that succeeded: shown as it was
            for ln in said:
                try:
                    sys.stderr.buffer.write(self.ERROR_PREFIX + ln + b"\n")
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
        self.stage_error = said[-1].decode("utf-8", "replace").strip() if said else None
        return rc

    def _start(self, cmd: list[str], env: dict, out, fds: tuple[int, ...]):
        """Start a stage's command: forked from the stage zygote when it can be (a ``popri``
        command, the zygote's environment, and at least :data:`~popri.pipeline.zygote.MIN_STAGES`
        stages left to run when it is not up yet: its imports cost about one stage's start --
        unless this process is itself a fork of a zygote, which forks one at no cost;
        popri.pipeline.zygote), else a new process.  A runner that was told no plan
        (``planned_to_run`` None: a caller of this class, not ``popri run``) starts the zygote
        for its ``MIN_STAGES``-th stage: a caller that runs a stage or two (each light, such as
        ``popri account``) pays no zygote's imports (about 4 s on 2 cores) and one that runs many
        pays at most ``MIN_STAGES - 1`` starts without it.  Either way: ``.stderr`` a pipe,
        ``.wait(timeout)``, ``.kill()``."""
        prefix = child_argv([])
        left = (None if self.planned_to_run is None
                else self.planned_to_run - len(self.ran) - len(self.reused))
        nth = len(self.ran) + 1  # this stage is the runner's nth to run (a failed one raises)
        worth = (self._zygote is not None or Z.preloaded()
                 or (nth >= Z.MIN_STAGES if left is None else left >= Z.MIN_STAGES))
        if (worth and not self._zygote_off and cmd[:len(prefix)] == prefix
                and Z.enabled(os.environ)):
            if self._zygote is None or not self._zygote.alive():
                try:
                    self._zygote = Z.Zygote(self.env)
                except (Z.ZygoteError, TimeoutError, OSError) as e:
                    log.info(f"run: stages start as new processes (the stage zygote: "
                             f"{str(e) or type(e).__name__})")
                    self._zygote, self._zygote_off = None, True
            if self._zygote is not None and self._zygote.usable_for(env):
                fd = out if isinstance(out, int) else out.fileno()
                try:
                    return self._zygote.spawn(cmd[len(prefix):], env=env, stdout_fd=fd,
                                              pass_fds=fds)
                except Z.ZygoteError as e:
                    log.info(f"run: stages start as new processes (the stage zygote: {e})")
                    self.close_zygote()
                    self._zygote_off = True
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=env, pass_fds=fds)

    def close_zygote(self) -> None:
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

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
