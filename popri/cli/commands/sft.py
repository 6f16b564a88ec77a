"""popri sft: the PE+SFT baseline, LoRA next-token tuning on the best samples (library:
popri/methods/popri/dpo.py train_sft; settings: popri/specs/training.py SFTSpec).

    popri sft --pairs runs/r0/pairs.jsonl --model smollm2-135m --out runs/r0/sft
    popri sft --samples runs/r0/samples.jsonl --scores runs/r0/scores.npy --out runs/r0/sft
"""

from __future__ import annotations

from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core.guard import check_outputs
from popri.methods.popri import dpo as lib
from popri.specs.training import SFTSpec
from popri.cli.options import command
from popri.specs.commands.sft import SftCall

HELP = """PE+SFT baseline (POPri section 3, "Supervised Fine-Tuning"; Table 1): fine-tune the
server LLM with next-token loss on the highest-scoring sample of every prompt, through TRL's
SFTTrainer with the same LoRA adapter as 'popri dpo'. The loss covers the sample only, not the
prompt (completion-only loss).

Input: either --pairs (preference JSONL from 'popri prefs build': trains on prompt + chosen) or
--samples + --scores ('popri gen' JSONL + SCORES.npy: the top-scored sample per prompt; ties by
sample_idx).

Settings: the same LoRA adapter, schedule and budget as 'popri dpo' (the paper gives no SFT
settings, so the baseline gets DPO's; defaults and sources with the options below; on
SmolLM2-135M, 32 samples, 8 steps at the default rate: loss 4.03 -> 3.98, 1e-4 barely moves it).

Outputs in --out DIR as 'popri dpo': checkpoint-STEP/, adapter/ (atomic), metrics.json (loss and
token accuracy per step and epoch), run.json; the adapter path on stdout. --adapter continues an
earlier adapter; --resume (default) picks up a killed run."""


@command(SftCall)
def sft(
    out: str, pairs: Optional[str], samples: Optional[str], scores: Optional[str], model: str,
    adapter: Optional[str], seed: int, resume: bool, *, spec: SFTSpec
) -> None:
    from pathlib import Path

    o = Path(out)
    check_outputs([out, o / lib.ADAPTER_DIR, o / lib.METRICS_FILE, o / lib.RUN_FILE,
                   *(() if resume else lib.list_checkpoints(o, complete_only=False))],
                  [pairs, samples, scores, adapter, model if Path(model).exists() else None])
    res = lib.train_sft(lib.sft_records(pairs=pairs, samples=samples, scores=scores), spec,
                        model=model, out_dir=out, seed=seed, adapter=adapter, resume=resume)
    print(res["adapter"], flush=True)


def register(app: typer.Typer) -> None:
    app.command("sft", help=unwrap(HELP))(sft)
