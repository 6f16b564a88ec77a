"""What ``popri gen`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/gen.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param, seed_param
from popri.specs.generation import GenSpec


@dataclass(frozen=True, kw_only=True)
class GenCall(GenSpec, Call):
    """``popri gen``."""

    command: ClassVar[str] = 'gen'
    into: ClassVar[dict] = {'spec': GenSpec}
    omega: str = param(help="Initial population Omega: JSONL with 'text' (and 'id'), a federated dataset directory (its --split), or '-'.",
                       positional=True)
    prompts: int | None = param(None, 'K prompts (POPri B.1: 1800). Or --num-samples.', short='-K',
                                lo=1, cli_range=True)
    num_samples: int | None = param(None,
                                    'Total samples N instead of --prompts: K = ceil(N / J), '
                                    'output truncated to N.', short='-N', lo=1, cli_range=True)
    out: str = out_param("Samples JSONL ('-' = stdout).", '-')
    adapter: str | None = param(None,
                                'PEFT LoRA adapter directory on top of --model (e.g. from '
                                "'popri dpo').")
    split: str = param('train', 'Split when OMEGA is a dataset directory.')
    template: str | None = param(None, 'Prompt template file ({sample1}..{sampleN} placeholders).')
    seed: int = seed_param('Seeds the choice of Omega examples and sampling.')
    round_: int = param(0, 'Round number, recorded in ids and rows.', flag='--round', lo=0)
    device: str | None = param(None,
                               'transformers: cpu, cuda, cuda:1 (default: cuda if available).')
    prompts_out: str | None = param(None,
                                    'Write the K prompts as JSONL {prompt_id, prompt, examples '
                                    '(Omega ids)}.')
    stats_out: str | None = param(None,
                                  'Write counts (generated, regenerated, kept degenerate) and '
                                  'tokens/s as JSON.')
