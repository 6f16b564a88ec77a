"""What ``popri fl`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/fl.py derives its options from it; a stage of
``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param, seed_param
from popri.specs.fl import FLSpec


@dataclass(frozen=True, kw_only=True)
class FlRoundCall(FLSpec, Call):
    """``popri fl round``."""

    command: ClassVar[str] = 'fl round'
    into: ClassVar[dict] = {'spec': FLSpec}
    flags: ClassVar[dict] = {'noise_multiplier': ('--noise-multiplier', '-z'), 'clients_per_round': ('--clients-per-round', '-L')}
    data: str = param(help="Private data: a federated dataset directory (its --split) or JSONL with 'client_id' and 'text'.",
                      short='-d')
    out: str = out_param('Output directory of this round.')
    round_: int = param(help='Round number t (1 = start from the base model).', flag='--round',
                        lo=1, cli_range=True)
    init: str | None = param(None, "Round t-1's output directory (required for t > 1).")
    model: str = param('smollm2-135m',
                       'The downstream model in round 1 (alias, checkpoint dir or hub id); '
                       "later rounds use --init's.", short='-m')
    split: str = param('train', 'Split of --data the clients hold.')
    seed: int = seed_param("The run's seed: LoRA init, tree noise keys; with the round: sampling, "
                      'data order, noise.')
    lora: bool = param(True, 'LoRA adapter (default) or the whole model.', decls=('--lora/--full',))
    diagnostics: bool = param(False,
                              "Release mode: also write the round's exact statistics of the "
                              "clients' data (clients, participants, update norms, clipped "
                              "share, local loss) to round.json's private_diagnostics, labelled "
                              'NOT PRIVATE (research mode always writes them).', negatable=False)
