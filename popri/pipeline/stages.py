"""Cached, resumable stages for ``popri run``.

A stage is one ``popri`` subcommand run in a subprocess with its outputs inside the run
directory.  Its *key* is the sha256 of the command line and the keys (or content hashes) of
its inputs.  When a stage finishes, a marker ``RUN/.stages/NAME.json`` holding the key is
written atomically -- last.  On the next run a stage whose marker key matches and whose
outputs all exist is skipped; anything else (new parameters, changed upstream, a run killed
half-way) runs again.  Keys chain through inputs, so a change re-runs everything downstream
of it and nothing upstream.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from popri.core import log
from popri.core.errors import PopriError
from popri.core.io import atomic_write, sha256_file


@dataclass
class Stage:
    name: str
    args: list[str]                       # popri subcommand + options
    outputs: list[str]                    # paths (files or dirs) that must exist afterwards
    inputs: list[str] = field(default_factory=list)  # files/dirs this stage reads
    stdout_to: str | None = None          # capture stdout into this file (atomically)
    # called with the stage's key right before it runs (not when it is skipped, not in a dry
    # run): e.g. the budget guard of a DP stage, which raises to stop the run
    before: Callable[[str], None] | None = None

    def shown(self) -> str:
        """The command line as a user would type it (commands.sh, the dry-run plan)."""
        s = "popri " + " ".join(shlex.quote(a) for a in self.args)
        return s + (f" > {shlex.quote(self.stdout_to)}" if self.stdout_to else "")


COMMANDS_HEADER = ("#!/bin/sh\n"
                   "# The stage commands of this run in order (cached ones included); every\n"
                   "# 'popri run' rewrites this file.\n"
                   "set -e\n")


class StageRunner:
    """Runs stages with caching.  ``dry_run``: nothing runs and nothing is written (no marker,
    no commands.sh, no directory); ``commands`` collects the plan, each command with
    ``# up to date`` where its cached result would be kept."""

    def __init__(self, run_dir: str | Path, *, env: dict | None = None, dry_run: bool = False):
        self.run_dir = Path(run_dir)
        self.marker_dir = self.run_dir / ".stages"
        self.env = dict(os.environ, **(env or {}))
        # a stage's mode and defaults come from its command line only: an ambient POPRI_RELEASE
        # or POPRI_CONFIG would change them behind the run's back (and its results table)
        for k in ("POPRI_RELEASE", "POPRI_CONFIG"):
            if k not in (env or {}):
                self.env.pop(k, None)
        self.dry_run = dry_run
        self.commands: list[str] = []      # this run's commands, in order (commands.sh)
        self.keys: dict[str, str] = {}     # output path -> key of the stage that made it
        self.timings: dict[str, float] = {}
        self.ran: list[str] = []
        self.skipped: list[str] = []
        self.log_path = self.run_dir / "commands.sh"

    # ------------------------------------------------------------------ keys
    def _input_key(self, path: str) -> str:
        if path in self.keys:
            return self.keys[path]
        p = Path(path)
        if p.is_file():
            return sha256_file(p)
        if p.is_dir():
            man = p / "manifest.json"
            if man.exists():
                return sha256_file(man)
            h = hashlib.sha256()
            for f in sorted(p.rglob("*")):
                if f.is_file():
                    h.update(f"{f.relative_to(p)}:{f.stat().st_size}:{int(f.stat().st_mtime)}".encode())
            return h.hexdigest()
        return "missing"

    def key(self, stage: Stage) -> str:
        h = hashlib.sha256()
        h.update(json.dumps(stage.args).encode())
        for i in stage.inputs:
            h.update(f"|{i}={self._input_key(i)}".encode())
        return h.hexdigest()

    # ------------------------------------------------------------------ running
    def _marker(self, stage: Stage) -> Path:
        return self.marker_dir / f"{stage.name}.json"

    def done(self, stage: Stage, key: str) -> bool:
        m = self._marker(stage)
        if not m.exists():
            return False
        try:
            rec = json.loads(m.read_text())
        except json.JSONDecodeError:
            return False
        return rec.get("key") == key and all(Path(o).exists() for o in stage.outputs)

    def run(self, stage: Stage) -> bool:
        """Run ``stage`` unless its cached result is current. Returns True when it ran."""
        key = self.key(stage)
        shown = stage.shown()
        if self.done(stage, key):
            self.skipped.append(stage.name)
            self._record(shown + ("  # up to date" if self.dry_run else ""))
            if not self.dry_run:
                log.info(f"run: [{stage.name}] up to date, skipped")
            for o in stage.outputs:
                self.keys[o] = key
            return False
        if self.dry_run:
            self._record(shown)
            for o in stage.outputs:  # what it would write is new: its dependants would run too
                self.keys[o] = f"planned:{key}"
            return False
        if stage.before is not None:
            stage.before(key)
        cmd = [sys.executable, "-m", "popri", *stage.args]
        log.info(f"run: [{stage.name}] {shown}")
        self._record(shown)
        t0 = time.time()
        if stage.stdout_to:
            with atomic_write(stage.stdout_to) as out:
                p = subprocess.run(cmd, stdout=out, env=self.env)
                if p.returncode != 0:
                    raise PopriError(f"stage {stage.name} failed (exit {p.returncode}): {shown}")
        else:
            # a stage's own stdout (data, e.g. an adapter path) must not mix into ours
            p = subprocess.run(cmd, env=self.env, stdout=sys.stderr.fileno())
            if p.returncode != 0:
                raise PopriError(f"stage {stage.name} failed (exit {p.returncode}): {shown}")
        missing = [o for o in stage.outputs if not Path(o).exists()]
        if missing:
            raise PopriError(f"stage {stage.name} finished but did not write {missing}")
        self.timings[stage.name] = time.time() - t0
        with atomic_write(self._marker(stage)) as fh:
            json.dump({"key": key, "args": stage.args, "outputs": stage.outputs,
                       "seconds": round(self.timings[stage.name], 2)}, fh, indent=2)
        for o in stage.outputs:
            self.keys[o] = key
        self.ran.append(stage.name)
        return True

    def _record(self, shown: str) -> None:
        """Add a command to this run's list; a real run rewrites RUN/commands.sh with the list
        so far (one file per run, not an ever-growing log)."""
        self.commands.append(shown)
        if not self.dry_run:
            with atomic_write(self.log_path) as fh:
                fh.write(COMMANDS_HEADER + "".join(c + "\n" for c in self.commands))
