"""What ``popri fewfedpit`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/fewfedpit.py derives its options from it; a
stage of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param, same, seed_param
from popri.specs.fewfedpit import FewFedPITSpec


@dataclass(frozen=True, kw_only=True)
class FewfedpitAggregateCall(Call):
    """``popri fewfedpit aggregate``."""

    command: ClassVar[str] = 'fewfedpit aggregate'
    into: ClassVar[dict] = {'spec': FewFedPITSpec}
    uploads: tuple[str, ...] = param(help="The round's mixed weights directories.", positional=True,
                                     metavar='UPLOADS...')
    round_: int = param(help='Round r.', flag='--round', lo=1, cli_range=True)
    init: str = param(help="Round r-1's global weights directory.")
    out: str = out_param("Round r's global weights directory (with model/ for eval and audit).")
    clients_total: int | None = param(None,
                                      'N, the clients the K uploads were drawn from (the '
                                      "extension's q = K / N: fixed sampling, replace one "
                                      'client).', lo=1, cli_range=True)
    public_clients: int | None = param(None,
                                       'With --noise-multiplier and everyone taking part: '
                                       'N_pub, the clients, declared PUBLIC (a number you '
                                       'state, never the count of uploads, which is private '
                                       'under add/remove one client); the noisy sum is divided '
                                       'by it.', lo=1, cli_range=True)
    delta: float = param(3e-06, 'delta of the ledger entry.')
    release: bool = param(False,
                          'Release mode: noise from the OS CSPRNG, discrete Gaussian on a grid; '
                          'round.json then holds no count of clients or examples and no update '
                          'norm. Default: research mode, or POPRI_RELEASE=1.',
                          decls=('--release/--research',), envvar='POPRI_RELEASE')
    diagnostics: bool = param(False,
                              "Release mode: also write the round's exact client count, example "
                              "counts n_k and mean update norm to round.json's "
                              'private_diagnostics, labelled NOT PRIVATE (research mode always '
                              'writes them).', negatable=False)
    mode: str = same(FewFedPITSpec, 'mode')
    clip: float | None = same(FewFedPITSpec, 'clip')
    noise_multiplier: float = same(FewFedPITSpec, 'noise_multiplier')
    lora_r: int = same(FewFedPITSpec, 'lora_r')
    lora_alpha: int = same(FewFedPITSpec, 'lora_alpha')


@dataclass(frozen=True, kw_only=True)
class FewfedpitInitCall(Call):
    """``popri fewfedpit init``."""

    command: ClassVar[str] = 'fewfedpit init'
    into: ClassVar[dict] = {'spec': FewFedPITSpec}
    model: str = param('smollm2-135m', 'Base model (alias, checkpoint or hub id).', short='-m')
    out: str = out_param('Round-0 global weights directory.')
    seed: int = seed_param("The run's seed: the LoRA initialisation and every client-round's choices.")
    lora_r: int = same(FewFedPITSpec, 'lora_r')
    lora_alpha: int = same(FewFedPITSpec, 'lora_alpha')
    target_modules: tuple | None = same(FewFedPITSpec, 'target_modules')


@dataclass(frozen=True, kw_only=True)
class FewfedpitLocalCall(Call):
    """``popri fewfedpit local``."""

    command: ClassVar[str] = 'fewfedpit local'
    into: ClassVar[dict] = {'spec': FewFedPITSpec}
    data: str = param(help='Instruction dataset (popri instruct build) or JSONL with instruction/input/output/client_id.',
                      short='-d')
    client: str | None = param(None, "The client's id.", short='-c')
    all_clients: bool = param(False,
                              "Pool every client's examples instead (centralised tuning: the "
                              "eps = inf skyline of 'popri run').", negatable=False)
    round_: int = param(help='Round r.', flag='--round', lo=1, cli_range=True)
    init: str = param(help="Round r-1's global weights directory.")
    out: str = out_param('Local weights directory W^l.')
    save_model: bool = param(False, 'Also write OUT/model (for eval / audit).', negatable=False)
    split: str = param('train', 'Split of --data.')
    lr: float = same(FewFedPITSpec, 'lr')
    rounds: int = same(FewFedPITSpec, 'rounds')
    local_epochs: int = same(FewFedPITSpec, 'local_epochs')
    batch_size: int = same(FewFedPITSpec, 'batch_size')
    max_length: int = same(FewFedPITSpec, 'max_length')
    bf16: bool = same(FewFedPITSpec, 'bf16')
    lora_r: int = same(FewFedPITSpec, 'lora_r')
    lora_alpha: int = same(FewFedPITSpec, 'lora_alpha')


@dataclass(frozen=True, kw_only=True)
class FewfedpitMixCall(Call):
    """``popri fewfedpit mix``."""

    command: ClassVar[str] = 'fewfedpit mix'
    into: ClassVar[dict] = {'spec': FewFedPITSpec}
    round_: int = param(help='Round r.', flag='--round', lo=1, cli_range=True)
    init: str = param(help="Round r-1's global weights directory.")
    out: str = out_param('The upload W^a_k.')
    local: str | None = param(None, 'W^l (local).')
    public: str | None = param(None, 'W^g_k (train).')
    mode: str = same(FewFedPITSpec, 'mode')
    beta: float = same(FewFedPITSpec, 'beta')
    clip: float | None = same(FewFedPITSpec, 'clip')


@dataclass(frozen=True, kw_only=True)
class FewfedpitSelfgenCall(Call):
    """``popri fewfedpit selfgen``."""

    command: ClassVar[str] = 'fewfedpit selfgen'
    into: ClassVar[dict] = {'spec': FewFedPITSpec}
    data: str = param(help="Instruction dataset (the client's local examples: demonstrations and the copy filter).",
                      short='-d')
    client: str = param(help="The client's id.", short='-c')
    round_: int = param(help='Round r.', flag='--round', lo=1, cli_range=True)
    init: str = param(help="Round r-1's global weights (M^g generates).")
    local: str = param(help="This round's local weights (M^l scores IFS).")
    out: str = out_param('Every candidate, JSONL (kept: true for D^syn).')
    stats_out: str | None = param(None, 'Filter counts, JSON.')
    split: str = param('train', 'Split of --data.')
    candidates: int = same(FewFedPITSpec, 'candidates')
    keep: int = same(FewFedPITSpec, 'keep')
    demos: int = same(FewFedPITSpec, 'demos')
    io_shots: int = same(FewFedPITSpec, 'io_shots')
    retries: int = same(FewFedPITSpec, 'retries')
    instruction_prompts: int = same(FewFedPITSpec, 'instruction_prompts')
    rouge_threshold: float = same(FewFedPITSpec, 'rouge_threshold')
    instruction_tokens: int = same(FewFedPITSpec, 'instruction_tokens')
    response_tokens: int = same(FewFedPITSpec, 'response_tokens')
    max_length: int = same(FewFedPITSpec, 'max_length')
    bf16: bool = same(FewFedPITSpec, 'bf16')
    lora_r: int = same(FewFedPITSpec, 'lora_r')
    lora_alpha: int = same(FewFedPITSpec, 'lora_alpha')


@dataclass(frozen=True, kw_only=True)
class FewfedpitTrainCall(Call):
    """``popri fewfedpit train``."""

    command: ClassVar[str] = 'fewfedpit train'
    into: ClassVar[dict] = {'spec': FewFedPITSpec}
    synthetic: str = param(help="selfgen's JSONL (its kept rows).", short='-s')
    client: str = param(help="The client's id.", short='-c')
    round_: int = param(help='Round r.', flag='--round', lo=1, cli_range=True)
    init: str = param(help="Round r-1's global weights directory.")
    out: str = out_param('Public weights directory W^g_k.')
    data: str | None = param(None,
                             "fedmit: also the client's private examples (one model on both).",
                             short='-d')
    split: str = param('train', 'Split of --data.')
    mode: str = same(FewFedPITSpec, 'mode')
    lr: float = same(FewFedPITSpec, 'lr')
    rounds: int = same(FewFedPITSpec, 'rounds')
    local_epochs: int = same(FewFedPITSpec, 'local_epochs')
    batch_size: int = same(FewFedPITSpec, 'batch_size')
    max_length: int = same(FewFedPITSpec, 'max_length')
    bf16: bool = same(FewFedPITSpec, 'bf16')
    lora_r: int = same(FewFedPITSpec, 'lora_r')
    lora_alpha: int = same(FewFedPITSpec, 'lora_alpha')
