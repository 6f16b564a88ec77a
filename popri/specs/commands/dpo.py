"""What ``popri dpo`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/dpo.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, out_param, param, seed_param
from popri.specs.training import DPOSpec, SelectSpec


@dataclass(frozen=True, kw_only=True)
class DpoCall(DPOSpec, SelectSpec, Call):
    """``popri dpo``."""

    command: ClassVar[str] = 'dpo'
    into: ClassVar[dict] = {'sel': SelectSpec, 'spec': DPOSpec}
    pairs: str = param(help="Preference pairs JSONL ('popri prefs build').", short='-p')
    out: str = out_param('Output directory (checkpoints, adapter/, metrics.json).')
    model: str = param('smollm2-135m',
                       'Base LLM: smollm2-135m / gemma3-270m (offline), a checkpoint dir or hub '
                       'id (POPri: LLaMA-3-8B).', short='-m', envvar='POPRI_GEN_MODEL')
    adapter: str | None = param(None, 'Continue from this adapter (round t+1 from round t).')
    seed: int = seed_param('Seeds LoRA init and data order.')
    resume: bool = param(True, 'Continue from the latest checkpoint in --out.')
    eval_pairs: int = param(0,
                            'After training, the exact (fp32) reward margin on the first N '
                            'pairs (the bf16-logged margins carry rounding noise ~1e-3); into '
                            'metrics.json.', lo=0)
    select_on: str | None = param(None,
                                  'Validation data for checkpoint selection by FID (POPri B.1), '
                                  "or a 'popri fred stats' STATS.npz (DP statistics).")
    select_prompts: str | None = param(None,
                                       "Prompts for the selection samples (JSONL 'prompt', or "
                                       "Omega 'text').")
    embed_model: str | None = param(None, 'Embedder for the FID (default all-MiniLM-L6-v2).',
                                    envvar='POPRI_EMBED_MODEL')
