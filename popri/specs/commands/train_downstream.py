"""What ``popri train-downstream`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/train_downstream.py derives its options from
it; a stage of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, json_param, out_param, param, seed_param
from popri.specs.training import DownstreamSpec


@dataclass(frozen=True, kw_only=True)
class TrainDownstreamCall(DownstreamSpec, Call):
    """``popri train-downstream``."""

    command: ClassVar[str] = 'train-downstream'
    into: ClassVar[dict] = {'spec': DownstreamSpec}
    flags: ClassVar[dict] = {'lora': ('--lora/--full',)}
    train: str = param(help="JSONL with 'text', or a dataset dir.", positional=True,
                       metavar='TRAIN')
    out: str = out_param('Checkpoint directory to create.')
    val: str | None = param(None,
                            'Validation JSONL or dataset dir (val split) for epoch selection. '
                            'Without it the last epoch is kept.')
    model: str = param('smollm2-135m',
                       "Causal LM to fine-tune: 'smollm2-135m' (default: SmolLM2-135M-Instruct, "
                       "the small pretrained LM installable offline), 'distilgpt2' (the papers' "
                       'model; needs the hub or a local copy), any local checkpoint dir or hub '
                       'id.', short='-m')
    train_split: str = param('train', 'Split of TRAIN when it is a dataset directory.')
    seed: int = seed_param('Seeds the shuffling and the LoRA initialisation.')
    force: bool = param(False,
                        'Replace a non-empty --out that popri wrote (a model of an earlier '
                        'run); a directory popri did not write is never replaced.', negatable=False)
    json_out: bool = json_param('Print the summary as JSON on stdout.')
