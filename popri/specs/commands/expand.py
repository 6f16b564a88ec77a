"""What ``popri expand`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/expand.py derives its options from it; a
stage of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param, seed_param
from popri.specs.generation import ExpandSpec


@dataclass(frozen=True, kw_only=True)
class ExpandCall(ExpandSpec, Call):
    """``popri expand``."""

    command: ClassVar[str] = 'expand'
    into: ClassVar[dict] = {'spec': ExpandSpec}
    seeds: str = param(help="The DP seed set: JSONL with 'text' (and 'id'; else the 0-based row number), a dataset directory, or '-'.",
                       positional=True)
    num_samples: int = param(help='Samples to keep (PrE-Text 4.1: 2,000,000).', short='-N', lo=1,
                             cli_range=True)
    out: str = out_param('Output directory (shards + manifest.json).')
    adapter: str | None = param(None, 'PEFT LoRA adapter directory on top of --model.')
    seed: int = seed_param('Seeds the choice of examples and the sampling.')
    allow_short: bool = param(False, 'A shortfall exits 0 (warning).', negatable=False)
    template: str | None = param(None, 'Prompt template file ({sample1}..{sample3} placeholders).')
    device: str | None = param(None, 'transformers: cpu, cuda (default: cuda if available).')
    merged_out: str | None = param(None, "Also write all shards as one JSONL here ('-' = stdout).")
    force: bool = param(False,
                        'Start over when DIR holds another expansion (its shards are removed).',
                        negatable=False)
