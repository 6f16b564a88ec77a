"""What ``popri prefs`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/prefs.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param
from popri.specs.training import GateSpec, PoolSpec, PrefsSpec


@dataclass(frozen=True, kw_only=True)
class PrefsBuildCall(PrefsSpec, Call):
    """``popri prefs build``."""

    command: ClassVar[str] = 'prefs build'
    into: ClassVar[dict] = {'spec': PrefsSpec}
    samples: str = param(help="Samples JSONL ('popri gen'), or '-'.", short='-s')
    scores: str = param(help='SCORES.npy (+ SCORES.json sidecar with \'ids\') or JSONL {"id", "score"}.')
    true_scores: str | None = param(None,
                                    'Exact scores of the same samples: report the recovery rate '
                                    '(POPri Fig. 6).')
    out: str = out_param("Pairs JSONL, or '-' for stdout.", '-')
    report_out: str | None = param(None,
                                   'JSON report: counts, skipped prompts, mean score gap, '
                                   'recovery rate.')
    fluency: str | None = param(None,
                                "Per-sample public-model NLL ('popri eval fluency SAMPLES --out "
                                "FILE'): needed by --pair-rule fluent.")
    embeddings: str | None = param(None,
                                   "The samples' embeddings ('popri embed SAMPLES --out "
                                   "FILE.npy', matched by id): needed by --pair-rule divpo.")


@dataclass(frozen=True, kw_only=True)
class PrefsGateCall(GateSpec, Call):
    """``popri prefs gate``."""

    command: ClassVar[str] = 'prefs gate'
    into: ClassVar[dict] = {'spec': GateSpec}
    samples: str = param(help="A round's samples JSONL ('popri gen').", short='-s')
    fluency: str = param(help="Their per-sample public-model NLL ('popri eval fluency SAMPLES --out FILE').")
    out: str = out_param("Kept samples JSONL, or '-' for stdout.", '-')


@dataclass(frozen=True, kw_only=True)
class PrefsPoolCall(PoolSpec, Call):
    """``popri prefs pool``."""

    command: ClassVar[str] = 'prefs pool'
    into: ClassVar[dict] = {'spec': PoolSpec}
    samples: str = param(help="Round t's samples JSONL ('popri gen').", short='-s')
    scores: str = param(help='Their released scores: SCORES.npy (+ .json sidecar with \'ids\') or JSONL {"id", "score"}.')
    base: str = param(help="The population so far: Omega (JSONL or a dataset directory, its --split) or round t-1's pool.")
    round_: int = param(help="Round t (recorded in ids and 'source').", flag='--round', lo=1,
                        cli_range=True)
    split: str = param('train', 'Split when --base is a dataset directory.')
    out: str = out_param("Pool JSONL, or '-' for stdout.", '-')
    min_size: int = param(3,
                          'chosen: keep the whole base while the chosen samples are fewer '
                          "distinct texts than this (a prompt's --shots of 'popri gen').", lo=1)
