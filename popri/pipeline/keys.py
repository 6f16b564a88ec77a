"""Stage keys: what makes a cached stage current (DVC-style: content hashes, not timestamps).

    python -m pytest -q tests/test_run.py -k key

A stage's key is the sha256 of popri's version, its key fields (the command line), the values
of :data:`KEYED_ENV` that are set, and the content hash of each input (an earlier stage's
output: the hash recorded when it finished).  :func:`changed_args` says why a stage reruns.
Split out of :mod:`popri.pipeline.stages` (issue 68): :class:`StageKeys` is the runner's part
that computes keys.
"""

from __future__ import annotations

import hashlib
import json

from popri.core.artifacts import path_digest
from popri.core.version import __version__
from popri.kit import Stage

#: POPRI_* settings a stage inherits that define its outputs: their values are in its key
#: when set.  POPRI_CPU_BF16=1 (bf16 on a CPU, :func:`popri.models.llm.use_bf16`) changes more
#: than the last bits; POPRI_THREADS is an execution setting (see :meth:`StageKeys.key`)
KEYED_ENV: tuple[str, ...] = ("POPRI_CPU_BF16",)
#: POPRI_* settings a stage inherits that define no output (threads, logging, caches, test hooks)
PASSED_ENV = ("POPRI_THREADS", "POPRI_QUIET", "POPRI_PROGRESS", "POPRI_CACHE", "POPRI_FAULT",
              "POPRI_VLLM_KV_GIB", "POPRI_VLLM_EAGER", "POPRI_VLLM_INPROCESS")
#: recorded in each stage's marker and attempt (what it ran with), never in its key
RECORDED_ENV = ("POPRI_THREADS",)


def flags(args: list[str]) -> dict[str, str]:
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
    a, b = flags(old), flags(new)
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


class StageKeys:
    """The runner's keys (mixed into :class:`popri.pipeline.stages.StageRunner`, whose
    ``keys`` -- output path -> recorded hash --, ``_digests`` and ``env`` it reads)."""

    keys: dict[str, str]
    _digests: dict[str, str]
    env: dict

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
