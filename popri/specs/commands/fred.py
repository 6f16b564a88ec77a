"""What ``popri fred`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/fred.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, json_param, out_param, param, seed_param
from popri.specs.privacy import FredStatsSpec


@dataclass(frozen=True, kw_only=True)
class FredCompareCall(Call):
    """``popri fred compare``."""

    command: ClassVar[str] = 'fred compare'
    candidates: tuple[str, ...] = param(help="JSONL texts or 'embedding' rows, embedding sets .npy, dataset dirs, or '-' (once).",
                                        positional=True, metavar='CANDIDATE...')
    stats_path: str = param(help="STATS.npz from 'popri fred stats'.", flag='--stats', short='-s')
    json_out: bool = json_param('Print a JSON list of {"candidate", "fred"}.')
    model: str | None = param(None,
                              'Embedding model for texts (default: the one recorded in '
                              'STATS.json).', decls=('--model', '--embedder', '-m'))
    split: str = param('train', 'Split used for dataset dirs.')


@dataclass(frozen=True, kw_only=True)
class FredStatsCall(FredStatsSpec, Call):
    """``popri fred stats``."""

    command: ClassVar[str] = 'fred stats'
    into: ClassVar[dict] = {'spec': FredStatsSpec}
    flags: ClassVar[dict] = {'denoise': ('--denoise/--no-denoise',)}
    private: str = param(help="Private client data: a federated dataset directory (its --split), JSONL texts with 'client_id' (or 'embedding' rows), an embedding set NAME.npy, or '-'. client_id is required at --level user; at sample level a row without one is its own client.")
    out: str = out_param('STATS.npz; STATS.json and ledger.jsonl are written next to it.')
    seed: int = seed_param('Seed of the noise and of the per-client cap.')
    split: str = param('train', 'Split when --private is a dataset dir.')
    model: str | None = param(None,
                              'Embedding model for texts (default all-MiniLM-L6-v2: POPri B.1; '
                              'the paper used ALBERT).', decls=('--model', '--embedder', '-m'),
                              envvar='POPRI_EMBED_MODEL')
