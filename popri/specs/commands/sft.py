"""What ``popri sft`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/sft.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param, seed_param
from popri.specs.training import SFTSpec


@dataclass(frozen=True, kw_only=True)
class SftCall(SFTSpec, Call):
    """``popri sft``."""

    command: ClassVar[str] = 'sft'
    into: ClassVar[dict] = {'spec': SFTSpec}
    out: str = out_param('Output directory.')
    pairs: str | None = param(None, 'Preference pairs JSONL (uses prompt + chosen).', short='-p')
    samples: str | None = param(None, "Samples JSONL ('popri gen').", short='-s')
    scores: str | None = param(None, "SCORES.npy (+ .json with 'ids') for --samples.")
    model: str = param('smollm2-135m', 'Base LLM (alias, checkpoint dir or hub id).', short='-m',
                       envvar='POPRI_GEN_MODEL')
    adapter: str | None = param(None, 'Continue from this adapter.')
    seed: int = seed_param('Seeds LoRA init and data order.')
    resume: bool = param(True, 'Continue from the latest checkpoint in --out.')
