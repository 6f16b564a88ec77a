"""popri sft: the PE+SFT baseline, LoRA next-token tuning on the best samples (popri/methods/popri/dpo.py).

    popri sft --pairs runs/r0/pairs.jsonl --model smollm2-135m --out runs/r0/sft
    popri sft --samples runs/r0/samples.jsonl --scores runs/r0/scores.npy --out runs/r0/sft
"""

from __future__ import annotations

from typing import Optional

import typer

HELP = """PE+SFT baseline (POPri section 3, "Supervised Fine-Tuning"; Table 1): fine-tune the
server LLM with next-token loss on the highest-scoring sample of every prompt, through TRL's
SFTTrainer with the same LoRA adapter as 'popri dpo'. The loss covers the sample only, not the
prompt (completion-only loss).

Input: either --pairs (preference JSONL from 'popri prefs build': trains on prompt + chosen) or
--samples + --scores ('popri gen' JSONL + SCORES.npy: the top-scored sample per prompt; ties by
sample_idx).

Defaults: LoRA rank 4 / alpha 8 (POPri B.1; reference code 16/16), AdamW, cosine to 0.375 x lr,
2 epochs, batch 8, lr 5e-4: the paper gives no SFT settings, so the baseline gets the same budget
as 'popri dpo' (on SmolLM2-135M, 32 samples, 8 steps: loss 4.03 -> 3.98; 1e-4 barely moves it).

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
    lora_r: int = typer.Option(4, "--lora-r", min=1, help="LoRA rank (POPri B.1: 4; reference: 16)."),
    lora_alpha: int = typer.Option(8, "--lora-alpha", min=1, help="LoRA alpha (POPri B.1: 8; "
                                   "reference: 16)."),
    target_modules: Optional[str] = typer.Option(None, "--target-modules", help="Comma-separated "
                                                 "module names, or 'all-linear'."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Peak learning rate (default 5e-4, as "
                                       "popri dpo)."),
    min_lr_ratio: float = typer.Option(0.375, "--min-lr-ratio", min=0.0, max=1.0,
                                       help="Cosine floor as a fraction of --lr."),
    epochs: float = typer.Option(2, "--epochs", help="Epochs (as POPri's DPO: 2)."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Samples per step."),
    grad_accum: int = typer.Option(1, "--grad-accum", min=1, help="Gradient accumulation steps."),
    max_length: int = typer.Option(512, "--max-length", min=8, help="Max prompt+sample tokens."),
    save_steps: Optional[int] = typer.Option(None, "--save-steps", min=1,
                                             help="Checkpoint every N steps (default: every epoch)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, help="Stop after N steps."),
    seed: int = typer.Option(0, "--seed", help="Seeds LoRA init and data order."),
    bf16: bool = typer.Option(True, "--bf16/--no-bf16", help="bf16 mixed precision."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from the latest "
                                "checkpoint in --out."),
    gradient_checkpointing: bool = typer.Option(False, "--gradient-checkpointing",
                                                help="Trade compute for memory."),
) -> None:
    from popri.methods.popri import dpo as lib
    from popri.core.errors import InputError
    from popri.methods.popri.prefs import load_score_vector, read_samples, top_samples

    from popri.core import validate

    validate.optional(lr, "--lr", lo=0, lo_open=True, hi=1)
    validate.finite(epochs, "--epochs", lo=0, lo_open=True, hi=validate.EPOCHS_MAX)
    if bool(pairs) == bool(samples):
        raise InputError("give either --pairs, or --samples with --scores")
    if samples and not scores:
        raise InputError("--samples needs --scores")
    if scores and not samples:
        raise InputError("--scores goes with --samples")
    from pathlib import Path

    from popri.core.guard import check_outputs

    o = Path(out)
    check_outputs([out, o / lib.ADAPTER_DIR, o / lib.METRICS_FILE, o / lib.RUN_FILE,
                   *(() if resume else lib.list_checkpoints(o, complete_only=False))],
                  [pairs, samples, scores, adapter, model if Path(model).exists() else None])
    if pairs:
        records = lib.sft_records_from_pairs(pairs)
    else:
        arr, ids = load_score_vector(scores)
        records = top_samples(read_samples(samples), arr, ids, scores_path=scores)
    targets = [t.strip() for t in target_modules.split(",") if t.strip()] if target_modules else None
    res = lib.train_sft(records, model=model, adapter=adapter, out_dir=out, lora_r=lora_r,
                        lora_alpha=lora_alpha, target_modules=targets, lr=lr, epochs=epochs,
                        batch_size=batch_size, grad_accum=grad_accum, max_length=max_length,
                        save_steps=save_steps, max_steps=max_steps, seed=seed, bf16=bf16,
                        resume=resume, min_lr_ratio=min_lr_ratio,
                        gradient_checkpointing=gradient_checkpointing)
    print(res["adapter"], flush=True)


def _unwrap(text: str) -> str:
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def register(app: typer.Typer) -> None:
    app.command("sft", help=_unwrap(HELP))(sft)
