"""popri sft: the PE+SFT baseline, LoRA next-token tuning on the best samples (library:
popri/methods/popri/dpo.py train_sft; settings: popri/specs/training.py SFTSpec).

    popri sft --pairs runs/r0/pairs.jsonl --model smollm2-135m --out runs/r0/sft
    popri sft --samples runs/r0/samples.jsonl --scores runs/r0/scores.npy --out runs/r0/sft
"""

from __future__ import annotations

from typing import Optional

import typer

from popri.cli.options import build, option, unwrap
from popri.specs.training import SFTSpec

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


def sft(
    out: str = typer.Option(..., "--out", "-o", help="Output directory."),
    pairs: Optional[str] = typer.Option(None, "--pairs", "-p", help="Preference pairs JSONL "
                                        "(uses prompt + chosen)."),
    samples: Optional[str] = typer.Option(None, "--samples", "-s", help="Samples JSONL ('popri gen')."),
    scores: Optional[str] = typer.Option(None, "--scores", help="SCORES.npy (+ .json with 'ids') for "
                                         "--samples."),
    model: str = typer.Option("smollm2-135m", "--model", "-m", envvar="POPRI_GEN_MODEL",
                              help="Base LLM (alias, checkpoint dir or hub id)."),
    adapter: Optional[str] = typer.Option(None, "--adapter", help="Continue from this adapter."),
    lora_r: int = option(SFTSpec, "lora_r"),
    lora_alpha: int = option(SFTSpec, "lora_alpha"),
    target_modules: Optional[str] = option(SFTSpec, "target_modules"),
    lr: float = option(SFTSpec, "lr"),
    min_lr_ratio: float = option(SFTSpec, "min_lr_ratio"),
    epochs: float = option(SFTSpec, "epochs"),
    batch_size: int = option(SFTSpec, "batch_size"),
    grad_accum: int = option(SFTSpec, "grad_accum"),
    max_length: int = option(SFTSpec, "max_length"),
    save_steps: Optional[int] = option(SFTSpec, "save_steps"),
    max_steps: Optional[int] = option(SFTSpec, "max_steps"),
    seed: int = typer.Option(0, "--seed", help="Seeds LoRA init and data order."),
    bf16: bool = option(SFTSpec, "bf16"),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from the latest "
                                "checkpoint in --out."),
    gradient_checkpointing: bool = option(SFTSpec, "gradient_checkpointing"),
) -> None:
    from pathlib import Path

    from popri.core.guard import check_outputs
    from popri.methods.popri import dpo as lib

    spec = build(SFTSpec, lora_r=lora_r, lora_alpha=lora_alpha, target_modules=target_modules,
                 lr=lr, min_lr_ratio=min_lr_ratio, epochs=epochs, batch_size=batch_size,
                 grad_accum=grad_accum, max_length=max_length, save_steps=save_steps,
                 max_steps=max_steps, bf16=bf16, gradient_checkpointing=gradient_checkpointing)
    o = Path(out)
    check_outputs([out, o / lib.ADAPTER_DIR, o / lib.METRICS_FILE, o / lib.RUN_FILE,
                   *(() if resume else lib.list_checkpoints(o, complete_only=False))],
                  [pairs, samples, scores, adapter, model if Path(model).exists() else None])
    res = lib.train_sft(lib.sft_records(pairs=pairs, samples=samples, scores=scores), spec,
                        model=model, out_dir=out, seed=seed, adapter=adapter, resume=resume)
    print(res["adapter"], flush=True)


def register(app: typer.Typer) -> None:
    app.command("sft", help=unwrap(HELP))(sft)
