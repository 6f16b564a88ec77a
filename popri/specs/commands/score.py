"""What ``popri score`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/score.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import REQUIRED, Call, out_param, param, same, seed_param
from popri.specs.feedback import ScoreSpec


@dataclass(frozen=True, kw_only=True)
class ScoreCall(ScoreSpec, Call):
    """``popri score``."""

    command: ClassVar[str] = 'score'
    into: ClassVar[dict] = {'spec': ScoreSpec}
    flags: ClassVar[dict] = {'standardize': ('--standardize/--no-standardize',)}
    private: str | None = param(None,
                                'Private data: a federated dataset directory (its --split), '
                                "JSONL with 'client_id' and 'text' (or 'embedding'), or an "
                                "embedding set NAME.npy whose sidecar has 'client_id'. "
                                'Required, except for a Flower deployment round (--federation).')
    synthetic: str = param(help="Synthetic samples: JSONL with 'text' (or 'embedding' rows, e.g. from 'popri embed --out -'), an embedding set NAME.npy, or '-' for stdin.")
    noise_multiplier: float = same(ScoreSpec, 'noise_multiplier', REQUIRED)
    seed: int = seed_param('Seed for client sampling, the per-client cap and the noise (separate '
                      'streams).')
    out: str | None = out_param("SCORES.npy (+ SCORES.json), or '-' for JSONL on stdout.", None)
    per_client_out: str | None = param(None,
                                       "CLIENTS.npy: every participating client's noised upload "
                                       '[L, n_syn] + CLIENTS.json (client ids in row order).')
    ledger_dir: str | None = param(None,
                                   'Directory whose ledger.jsonl records this release (default: '
                                   'next to the outputs).', flag='--ledger')
    model: str | None = param(None,
                              'Embedding model for text inputs (default all-MiniLM-L6-v2: POPri '
                              'B.1, PrE-Text D.2).', short='-m', envvar='POPRI_EMBED_MODEL')
    split: str = param('train', 'Split when --private is a dataset dir.')
    round_: int = param(0, 'Round number, recorded in sidecar and ledger.', flag='--round')
