"""What ``popri vary`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/vary.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param, seed_param
from popri.specs.generation import VarySpec


@dataclass(frozen=True, kw_only=True)
class VaryCall(VarySpec, Call):
    """``popri vary``."""

    command: ClassVar[str] = 'vary'
    into: ClassVar[dict] = {'spec': VarySpec}
    flags: ClassVar[dict] = {'chat': ('--chat/--no-chat',)}
    input: str = param(help="JSONL with 'text' (and 'id'), or '-' for stdin.", positional=True)
    seed: int = seed_param('Seeds masks, fills and sampling.', lo=0)
    round_: int = param(0, 'Round number, recorded in every row.', flag='--round', lo=0)
    out: str = out_param("Variations JSONL ('-' = stdout).", '-')
    lookahead_out: str | None = param(None, 'SET.npy for the lookahead means (with --lookahead).')
    template: str | None = param(None, 'paraphrase prompt file with {text}.')
    adapter: str | None = param(None, 'paraphrase: PEFT LoRA adapter directory on top of --model.')
    device: str | None = param(None, 'cpu, cuda, cuda:1 (default: cuda if available).')
    stats_out: str | None = param(None, 'Counts, fallback and timings as JSON.')
