"""What ``popri pe`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/pe.py derives its options from it; a stage of
``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param, seed_param


@dataclass(frozen=True, kw_only=True)
class PeDrawCall(Call):
    """``popri pe draw``."""

    command: ClassVar[str] = 'pe draw'
    population: str = param(help='Population JSONL (round t).', short='-p')
    scores: str = param(help="HIST.npy (+ .json sidecar) from 'popri score --mode nn-histogram' / 'popri aggregate', or JSONL {id, score}.")
    num: int = param(help='Survivors N_syn to draw.', short='-n', lo=1, cli_range=True)
    round_: int = param(1, 'Round t (goes into the ids).', flag='--round')
    seed: int = seed_param('Seeds the draw.')
    release: bool = param(False, 'Draw from the OS CSPRNG (seed ignored).', negatable=False,
                          envvar='POPRI_RELEASE')
    out: str = out_param("Survivors JSONL, or '-'.", '-')
    stats_out: str | None = param(None,
                                  'JSON: distinct survivors, mass, whether the draw fell back '
                                  'to uniform.')


@dataclass(frozen=True, kw_only=True)
class PeInitCall(Call):
    """``popri pe init``."""

    command: ClassVar[str] = 'pe init'
    public: str = param(help="Public text: JSONL with 'text', a dataset dir, or '-'.",
                        positional=True)
    num: int = param(help='Population size N_syn (PrE-Text D.2: 1024 at eps 1.29, 2048 at eps 7.58).',
                     short='-n', lo=1, cli_range=True)
    split: str = param('train', 'Split when PUBLIC is a dataset directory.')
    seed: int = seed_param('Seeds the draw.')
    out: str = out_param("Population JSONL, or '-'.", '-')


@dataclass(frozen=True, kw_only=True)
class PeSeedsCall(Call):
    """``popri pe seeds``."""

    command: ClassVar[str] = 'pe seeds'
    survivors: tuple[str, ...] = param(help="Survivors JSONL of each round ('pe draw').",
                                       positional=True)
    out: str = out_param("Seed set JSONL, or '-'.", '-')
