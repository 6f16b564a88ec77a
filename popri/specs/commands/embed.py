"""What ``popri embed`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/embed.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param
from popri.specs.data import EmbedSpec


@dataclass(frozen=True, kw_only=True)
class EmbedCall(EmbedSpec, Call):
    """``popri embed``."""

    command: ClassVar[str] = 'embed'
    into: ClassVar[dict] = {'spec': EmbedSpec}
    input: str = param(help="Federated dataset directory, JSONL with 'text' (and 'id', 'client_id'), or '-' for stdin.",
                       positional=True)
    out: str = out_param("NAME.npy (writes NAME.npy + NAME.jsonl + NAME.meta.json) or '-' for JSONL rows with an 'embedding' list on stdout.")
    split: str = param('train', 'Split to embed when INPUT is a federated dataset.')
    cache: bool = param(True, 'Re-use embeddings cached by content hash (POPRI_CACHE).')
