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

from . import log
from .errors import PopriError
from .io import atomic_write, sha256_file


@dataclass
class Stage:
    name: str
    args: list[str]                       # popri subcommand + options
    outputs: list[str]                    # paths (files or dirs) that must exist afterwards
    inputs: list[str] = field(default_factory=list)  # files/dirs this stage reads
    stdout_to: str | None = None          # capture stdout into this file (atomically)


class StageRunner:
    def __init__(self, run_dir: str | Path, *, env: dict | None = None, dry_run: bool = False):
        self.run_dir = Path(run_dir)
        self.marker_dir = self.run_dir / ".stages"
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, **(env or {}))
        self.dry_run = dry_run
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
        if self.done(stage, key):
            self.skipped.append(stage.name)
            log.info(f"run: [{stage.name}] up to date, skipped")
            for o in stage.outputs:
                self.keys[o] = key
            return False
        cmd = [sys.executable, "-m", "popri_cli.cli", *stage.args]
        shown = "popri " + " ".join(shlex.quote(a) for a in stage.args)
        if stage.stdout_to:
            shown += f" > {shlex.quote(stage.stdout_to)}"
        log.info(f"run: [{stage.name}] {shown}")
        with open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(shown + "\n")
        if self.dry_run:
            return False
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
