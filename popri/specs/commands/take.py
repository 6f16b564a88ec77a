"""What ``popri take`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/take.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param


@dataclass(frozen=True, kw_only=True)
class TakeCall(Call):
    """``popri take``."""

    command: ClassVar[str] = 'take'
    samples: str = param(help="Synthetic samples JSONL ('text'), or '-'.", positional=True,
                         metavar='SAMPLES')
    tokens: int | None = param(None, 'The token budget B.', lo=1, cli_range=True)
    tokens_of: str | None = param(None,
                                  "The budget is REF's total tokens (JSONL with 'text', e.g. "
                                  "the T = 0 control's set).", metavar='REF')
    mix_from: str | None = param(None,
                                 "Mix instead of cutting (issue 67): the samples of a seeded "
                                 "--share of SAMPLES' prompts are replaced by OTHER's samples "
                                 "of the same prompt ids (e.g. the untuned T = 0 set).",
                                 metavar='OTHER')
    share: float | None = param(None, "With --mix-from: the share of prompts taken from OTHER.",
                                lo=0, hi=1)
    seed: int = param(0, "With --mix-from: seeds which prompts are taken from OTHER.", lo=0)
    tokenizer: str = param('smollm2-135m',
                           "Counts the tokens: a model name or path (the downstream model's).")
    out: str = out_param("Kept samples JSONL ('-' = stdout).", '-')
    stats_out: str | None = param(None,
                                  'Write the budget, the tokens and samples kept, and whether '
                                  'the budget was reached, as JSON.')
