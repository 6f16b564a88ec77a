"""What ``popri aggregate`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/aggregate.py derives its options from it; a
stage of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param
from popri.specs.feedback import AggregateSpec


@dataclass(frozen=True, kw_only=True)
class AggregateCall(AggregateSpec, Call):
    """``popri aggregate``."""

    command: ClassVar[str] = 'aggregate'
    into: ClassVar[dict] = {'spec': AggregateSpec}
    files: tuple[str, ...] = param(help='CLIENTS.npy files (+ CLIENTS.json sidecars).',
                                   positional=True)
    out: str = out_param("SCORES.npy (+ SCORES.json), or '-'.")
