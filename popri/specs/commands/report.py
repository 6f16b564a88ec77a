"""What ``popri report`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/report.py derives its options from it; a
stage of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, json_param, out_param, param


@dataclass(frozen=True, kw_only=True)
class ReportCall(Call):
    """``popri report``."""

    command: ClassVar[str] = 'report'
    run_dirs: tuple[str, ...] = param(help='Run directories (each holds results.json, metrics.jsonl or, while running, config.resolved.json).',
                                      positional=True, metavar='RUN_DIR...')
    out: str = out_param("Output directory (created; an earlier report there is replaced, the user's other files in it kept).")
    json_out: bool = json_param('Print {figures, notes, not_shown, verdicts, epsilon, palette, html, '
                           'md} as JSON instead of the HTML path.')
