"""What ``popri audit`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/audit.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import REQUIRED, Call, json_param, out_param, param, same, seed_param
from popri.specs.privacy import AuditSpec, CanarySpec, ExtractSpec


@dataclass(frozen=True, kw_only=True)
class AuditExtractCall(ExtractSpec, Call):
    """``popri audit extract``."""

    command: ClassVar[str] = 'audit extract'
    into: ClassVar[dict] = {'spec': ExtractSpec}
    model: str = param(help='Checkpoint to attack (directory, adapter directory, alias or hub id).',
                       short='-m')
    data: str = param(help="Federated dataset directory or JSONL with 'text' (and 'client_id'; instruction records: 'instruction', 'input', 'output').",
                      short='-d')
    split: str = param('train', 'Split of --data (the training data).')
    seed: int = seed_param('Which examples (and clients) are attacked.')
    out: str | None = out_param("Per-example JSONL ('-': stdout).", None)
    as_json: bool = json_param('Summary as one JSON object on stdout.')


@dataclass(frozen=True, kw_only=True)
class AuditReleaseCall(AuditSpec, Call):
    """``popri audit release``."""

    command: ClassVar[str] = 'audit release'
    into: ClassVar[dict] = {'spec': AuditSpec}
    mechanism: str = same(AuditSpec, 'mechanism', REQUIRED)
    trials: int = same(AuditSpec, 'trials', REQUIRED)
    max_samples_per_client: int | None = param(None,
                                               "Per-client cap M: nn-histogram's sensitivity "
                                               '(default 8); cosine: cap (default none); fred '
                                               '--level user: m (default 8).', short='-M')
    seed: int = seed_param("Seed of the data and of every trial's noise.")
    as_json: bool = json_param('One JSON object on stdout.')


@dataclass(frozen=True, kw_only=True)
class AuditCanariesCall(CanarySpec, Call):
    """``popri audit canaries``."""

    command: ClassVar[str] = 'audit canaries'
    into: ClassVar[dict] = {'spec': CanarySpec}
    config: str | None = param(None, 'YAML config of the run audited (without it: the embedded '
                                     'default).', positional=True, metavar='CONFIG')
    run_dir: str = param(help='Directory of the audit: its data, canaries.jsonl, the run (RUN/run), '
                              'audit.json.')
    set_: tuple[str, ...] = param((), 'Override a config key of the run audited: --set '
                                      'privacy.epsilon=inf (repeatable; as popri run --set).',
                                  flag='--set', short='-s')
    seed: int = seed_param('Seed of the canaries and of their inclusion draw.')
    as_json: bool = json_param('One JSON object (audit.json) on stdout.')
