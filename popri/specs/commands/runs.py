"""What ``popri runs`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/runs.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, json_param, param


@dataclass(frozen=True, kw_only=True)
class RunsDiffCall(Call):
    """``popri runs diff``."""

    command: ClassVar[str] = 'runs diff'
    a: str = param(help='', positional=True, metavar='RUN_A')
    b: str = param(help='', positional=True, metavar='RUN_B')
    everything: bool = param(False,
                             'Every setting and every metric, equal ones too (default: the '
                             'settings that differ and the headline metrics).', flag='--all',
                             negatable=False)
    keys: tuple[str, ...] | None = param(None,
                                         'Only the keys that match PATTERN: a glob (privacy.*, '
                                         '*_se) or a substring (gap_closed); repeatable. '
                                         'Metrics: every matching one that differs instead of '
                                         'the headline. A PATTERN that matches no key of either '
                                         'run is named on stderr (exit 0: an empty selection, '
                                         'not an error).', metavar='PATTERN')
    as_json: bool = json_param('One JSON object: every setting and metric that differs (by the rule '
                          'of the counts; values exact; --all: every one; --keys filters; '
                          '"keys_unmatched": the patterns that matched no key), the headline '
                          'with its precision, the counts; +/-Infinity as the strings "inf" / '
                          '"-inf", NaN as null.')


@dataclass(frozen=True, kw_only=True)
class RunsListCall(Call):
    """``popri runs list``."""

    command: ClassVar[str] = 'runs list'
    dirs: tuple[str, ...] = param((), 'Run directories or folders holding them (default: runs).',
                                  positional=True, metavar='DIRS...')
    as_json: bool = json_param('One JSON list on stdout (+/-Infinity as the strings "inf" / "-inf", '
                          'NaN as null; a run that could not be read has "error").')


@dataclass(frozen=True, kw_only=True)
class RunsShowCall(Call):
    """``popri runs show``."""

    command: ClassVar[str] = 'runs show'
    run_dir: str = param(help='', positional=True, metavar='RUN_DIR')
    as_json: bool = json_param("run_dir, config, results, metrics (metrics.jsonl's rows, as written) "
                          'and notes as one JSON object (+/-Infinity as the strings "inf" / '
                          '"-inf", NaN as null).')
    every: bool = param(False,
                        'Every round in the per-round table (default: the first and last five '
                        "when there are more than eleven, the middle as '...').", flag='--all',
                        negatable=False)
