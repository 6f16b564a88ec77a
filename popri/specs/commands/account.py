"""What ``popri account`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/account.py derives its options from it; a
stage of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import REQUIRED, Call, json_param, param, same
from popri.specs.privacy import EpsilonSpec, LedgerTotalSpec, SigmaSpec


@dataclass(frozen=True, kw_only=True)
class AccountEpsilonCall(EpsilonSpec, Call):
    """``popri account epsilon``."""

    command: ClassVar[str] = 'account epsilon'
    into: ClassVar[dict] = {'spec': EpsilonSpec}
    noise_multiplier: float = same(EpsilonSpec, 'noise_multiplier', REQUIRED)
    sample_rate: float = same(EpsilonSpec, 'sample_rate', REQUIRED)
    steps: int = same(EpsilonSpec, 'steps', REQUIRED, decls=('--steps', '--rounds', '-T'))
    as_json: bool = json_param('Print one JSON object on stdout instead of one line of text.')


@dataclass(frozen=True, kw_only=True)
class AccountLedgerCall(LedgerTotalSpec, Call):
    """``popri account ledger``."""

    command: ClassVar[str] = 'account ledger'
    into: ClassVar[dict] = {'spec': LedgerTotalSpec}
    paths: tuple[str, ...] = param(help="ledger.jsonl files, directories (every ledger.jsonl below them) or score sidecars (.json with a 'ledger' key). A release_id seen twice counts once.",
                                   positional=True)
    as_json: bool = json_param('Print one JSON object on stdout instead of one line of text.')


@dataclass(frozen=True, kw_only=True)
class AccountSigmaCall(SigmaSpec, Call):
    """``popri account sigma``."""

    command: ClassVar[str] = 'account sigma'
    into: ClassVar[dict] = {'spec': SigmaSpec}
    epsilon: float = same(SigmaSpec, 'epsilon', REQUIRED)
    sample_rate: float = same(SigmaSpec, 'sample_rate', REQUIRED)
    steps: int = same(SigmaSpec, 'steps', REQUIRED, decls=('--steps', '--rounds', '-T'))
    as_json: bool = json_param('Print one JSON object on stdout instead of one line of text.')
