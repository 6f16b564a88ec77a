"""What ``popri eval`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/eval.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, json_param, out_param, param, same, seed_param
from popri.specs.training import BootstrapSpec, EvalSpec, GapSpec, PrecisionSpec


@dataclass(frozen=True, kw_only=True)
class EvalAccuracyCall(EvalSpec, Call):
    """``popri eval accuracy``."""

    command: ClassVar[str] = 'eval accuracy'
    into: ClassVar[dict] = {'spec': EvalSpec}
    model: str = param('smollm2-135m',
                       "Alias ('smollm2-135m' default, 'gemma3-270m'), checkpoint dir (a "
                       'train-downstream output, full or LoRA) or hub id.', short='-m')
    adapter: str | None = param(None, 'PEFT adapter dir on top of --model.')
    data: str = param(help="Dataset dir (its --split) or JSONL with 'text' (and 'client_id').",
                      short='-d')
    split: str = param('test', 'Split of a dataset dir (default: test).')
    seed: int = seed_param('Seed of the bootstrap.')
    per_client_out: str | None = param(None, 'Write per-client sums to this JSONL file.')
    json_out: bool = json_param('Print the full result as JSON.')


@dataclass(frozen=True, kw_only=True)
class EvalDiffCall(Call):
    """``popri eval diff``."""

    command: ClassVar[str] = 'eval diff'
    method: str = param(help="The method's per-client file ('popri eval accuracy --per-client-out').")
    control: str = param(help="Its control's per-client file on the same test clients (e.g. POPri's T = 0 row).")
    bootstrap: int = param(1000, 'Paired bootstrap resamples of test clients.', lo=2)
    seed: int = seed_param('Seed of the bootstrap.')
    json_out: bool = json_param('Print a JSON object.')


@dataclass(frozen=True, kw_only=True)
class EvalFidCall(Call):
    """``popri eval fid``."""

    command: ClassVar[str] = 'eval fid'
    a: str = param(help="JSONL texts, JSONL with 'embedding', embedding set .npy, or a dataset dir.",
                   positional=True, metavar='A')
    b: str = param(help='The same kinds as A.', positional=True, metavar='B')
    split: str = param('val',
                       'Split used for dataset dirs (POPri selects checkpoints by FID to the '
                       'validation split).')
    model: str | None = param(None,
                              'Sentence embedder for texts (default all-MiniLM-L6-v2: POPri B.1).',
                              short='-m', envvar='POPRI_EMBED_MODEL')
    normalize: bool = param(True, "L2-normalise text embeddings (as 'popri embed').")
    json_out: bool = json_param('Print a JSON object.')


@dataclass(frozen=True, kw_only=True)
class EvalFluencyCall(Call):
    """``popri eval fluency``."""

    command: ClassVar[str] = 'eval fluency'
    samples: str = param(help="Synthetic samples (JSONL with 'text', e.g. 'popri gen' output) or preference pairs (JSONL with 'chosen' and 'rejected', 'popri prefs build' output).",
                         positional=True, metavar='SAMPLES')
    model: str = param('smollm2-135m', 'The public model whose likelihood measures fluency.',
                       short='-m')
    adapter: str | None = param(None,
                                "PEFT adapter on top of --model (e.g. a round's DPO adapter: "
                                "how far the tuning moved these texts' log-probability).")
    max_tokens: int = param(128, 'Tokens of each text scored (its first ones).', lo=2)
    batch_size: int = param(16, '', lo=1)
    bf16: bool = same(PrecisionSpec, 'bf16')
    out: str | None = out_param('Write one record per text (per pair: chosen_* and rejected_*) to '
                            'this JSONL file.', None)
    json_out: bool = json_param('Print a JSON object.')


@dataclass(frozen=True, kw_only=True)
class EvalGapCall(GapSpec, Call):
    """``popri eval gap``."""

    command: ClassVar[str] = 'eval gap'
    into: ClassVar[dict] = {'spec': GapSpec}
    method: str = param(help="The method's accuracy, or its --per-client-out file.",
                        decls=('--method', '--acc'))
    eps0: str = param(help='Accuracy (or per-client file) at eps=0: the public model without private data (POPri section 5).')
    epsinf: str = param(help='Accuracy (or per-client file) at eps=inf: trained on the private train split.')
    seed: int = seed_param('Seed of the bootstrap.')
    json_out: bool = json_param('Print a JSON object.')
    control: str | None = param(None,
                                "The method's control (a per-client file), e.g. POPri's T = 0 "
                                'row (the untuned generator): adds its gap closed and the '
                                'method minus the control, paired, with its SE.')


@dataclass(frozen=True, kw_only=True)
class EvalInstructCall(Call):
    """``popri eval instruct``."""

    command: ClassVar[str] = 'eval instruct'
    model: str = param(help="Checkpoint (a FewFedPIT / FedIT round's model/, a train-downstream dir, an alias).",
                       short='-m')
    data: str = param(help='Instruction dataset (popri instruct build) or JSONL with instruction/input/output.',
                      short='-d')
    split: str = param('test', 'Split of a dataset dir (default: test).')
    max_samples: int | None = param(None, 'First N examples only.', lo=1, cli_range=True)
    max_new_tokens: int = param(96, 'Greedy response length at most (Rouge-L).', lo=1)
    max_length: int = param(256, 'Tokens per example (prompt cut from the left).', lo=8)
    no_generate: bool = param(False, 'Token accuracy only (no greedy responses, no Rouge-L).',
                              negatable=False)
    bf16: bool = same(PrecisionSpec, 'bf16')
    bootstrap: int = same(BootstrapSpec, 'bootstrap')
    seed: int = seed_param('Seed of the bootstrap.')
    per_client_out: str | None = param(None, 'Write per-client sums to this JSONL file.')
    json_out: bool = json_param('Print the full result as JSON.')


@dataclass(frozen=True, kw_only=True)
class EvalProbeCall(Call):
    """``popri eval probe``."""

    command: ClassVar[str] = 'eval probe'
    samples: str = param(help="The fixed-prompt sample: JSONL with 'text' ('popri gen' output).",
                         positional=True, metavar='SAMPLES')
    target: str = param(help="The private validation embeddings (an embedding set .npy, JSONL texts or a dataset dir's --split).")
    split: str = param('val', 'Split of a dataset-dir target.')
    model: str | None = param(None,
                              'The public model whose perplexity of the sample measures fluency '
                              '(omit: no perplexity).', short='-m')
    embed_model: str | None = param(None, 'Sentence embedder (default all-MiniLM-L6-v2).',
                                    envvar='POPRI_EMBED_MODEL')
    bf16: bool = same(PrecisionSpec, 'bf16')
    seed: int = seed_param('Seed of the bootstrap.')
    json_out: bool = json_param('Print a JSON object.')


@dataclass(frozen=True, kw_only=True)
class EvalQualityCall(Call):
    """``popri eval quality``."""

    command: ClassVar[str] = 'eval quality'
    samples: str = param(help="The synthetic set: JSONL with 'text', or a dataset dir's "
                         "--samples-split.", positional=True, metavar='SAMPLES')
    samples_split: str = param('train', 'Split of a dataset-dir SAMPLES (eps = inf: the '
                               'private training text).')
    reference: str = param(help="The reference text: a dataset dir (its --split) or JSONL with "
                           "'text' (popri run: the private test split).")
    split: str = param('test', 'Split of a dataset-dir reference.')
    max_reference: int | None = same(EvalSpec, 'max_samples',
                                     help='Reference records: the first N (or a sample: '
                                          '--reference-seed).')
    reference_seed: int | None = same(EvalSpec, 'sample_seed',
                                      help='With --max-reference: a seeded random sample of N '
                                           "records (eval accuracy's --sample-seed: the same "
                                           'records).')
    model: str = param('smollm2-135m', "The language model whose final hidden state at each "
                       "text's last token is MAUVE's feature (the downstream model's).",
                       short='-m')
    embed_model: str | None = param(None, 'Sentence embedder of the diversity spread (default '
                                    'all-MiniLM-L6-v2).', envvar='POPRI_EMBED_MODEL')
    sizes: tuple[int, ...] | None = param(None, 'Also each prefix of SAMPLES of these sizes '
                                          '(comma-separated: a learning curve).', sep=',')
    bf16: bool = same(PrecisionSpec, 'bf16', False)
    seed: int = seed_param("Seed of MAUVE's k-means.")
    json_out: bool = json_param('Print a JSON object.')
