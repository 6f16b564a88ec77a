"""popri train-downstream: fine-tune the small downstream LM on synthetic (or any) text.

    popri train-downstream syn.jsonl --val data/sotu --out runs/ds
    popri train-downstream data/sotu --val data/sotu --out runs/eps_inf      # eps=inf baseline
    popri train-downstream syn.jsonl --val data/sotu --out runs/ds --lora --max-steps 20
"""

from __future__ import annotations

from typing import Optional

import typer

_HELP = """Fine-tune a causal LM on the 'text' of TRAIN and keep the epoch that is best on --val.

TRAIN is a JSONL file with 'text' (e.g. 'popri gen' output) or a federated dataset directory
(its --train-split; the private train split gives the eps=inf baseline of POPri section 5).
--val is a JSONL file or a dataset directory (its val split; the test split is refused).

Each text becomes [BOS] + tokens + [EOS] cut to --max-length (64, POPri B.1); BOS is the
tokenizer's (its EOS if it has none), the tokenizer never adds one itself. A chat-turn marker (SmolLM2-Instruct's <|im_start|> / <|im_end|>) is replaced by <|endoftext|>, the
document separator of pretraining (eps=0 on SmolLM2, 400 sotu test records: 0.2825 accuracy with the markers, 0.2913 without).  The loss is the mean
cross-entropy over the targets that 'popri eval accuracy' counts (positions 1.., EOS included
unless --no-count-eos, padding never).  AdamW, constant lr 2e-4 and batch 160 (POPri B.1 /
PrE-Text D.2: 2e-4, AdamW), split into --micro-batch-size chunks with the gradient of the whole
batch.  After every epoch the model is evaluated on --val; the best epoch (by --select-by) is
written atomically to --out: a transformers checkpoint (--full) or a PEFT adapter (--lora, rank
4, alpha 8: PrE-Text's LoRA setting), plus metrics.json (per-epoch train loss, val loss, val
accuracy; 'initial' = the model before training).  Evaluate it with
'popri eval accuracy --model OUT'.  Progress goes to stderr; --json prints the summary on stdout."""


def train_downstream(
    train: str = typer.Argument(..., metavar="TRAIN", help="JSONL with 'text', or a dataset dir."),
    out: str = typer.Option(..., "--out", "-o", help="Checkpoint directory to create."),
    val: Optional[str] = typer.Option(
        None, "--val", help="Validation JSONL or dataset dir (val split) for epoch selection. "
                            "Without it the last epoch is kept."),
    model: str = typer.Option(
        "smollm2-135m", "--model", "-m",
        help="Causal LM to fine-tune: 'smollm2-135m' (default: SmolLM2-135M-Instruct, the small "
             "pretrained LM installable offline), 'distilgpt2' (the papers' model; needs the hub "
             "or a local copy), any local checkpoint dir or hub id."),
    train_split: str = typer.Option("train", help="Split of TRAIN when it is a dataset directory."),
    max_length: int = typer.Option(64, min=2, help="Tokens per sequence incl. BOS/EOS (POPri B.1: 64)."),
    lr: float = typer.Option(2e-4, min=0.0, help="AdamW learning rate, constant (POPri B.1, PrE-Text D.2)."),
    weight_decay: float = typer.Option(0.01, min=0.0, help="AdamW weight decay (torch's default, "
                                                           "which the reference code uses)."),
    epochs: int = typer.Option(3, min=1, help="Epochs (POPri B.1 runs 80 over 1M samples, PrE-Text 20; "
                                              "3 keeps CPU runs short)."),
    batch_size: int = typer.Option(160, min=1, help="Sequences per optimizer step (POPri B.1: 160)."),
    micro_batch_size: int = typer.Option(32, min=1, help="Sequences per forward/backward pass "
                                                         "(memory only; same gradient)."),
    lora: bool = typer.Option(False, "--lora/--full",
                              help="LoRA adapter or full fine-tuning (default: full, as both papers "
                                   "fine-tune DistilGPT2 fully; for SmolLM2-135M on 2 CPU threads "
                                   "LoRA+bf16 steps measured about 2-3x faster than full: "
                                   "benchmarks/bench_downstream.py)."),
    lora_r: int = typer.Option(4, min=1, help="LoRA rank (PrE-Text: 4)."),
    lora_alpha: int = typer.Option(8, min=1, help="LoRA alpha (PrE-Text: 8)."),
    select_by: str = typer.Option("accuracy", help="Best epoch by val 'accuracy' (the reference code; "
                                                   "ties -> lower loss -> earlier) or 'loss'."),
    count_eos: bool = typer.Option(True, "--count-eos/--no-count-eos",
                                   help="Train and validate on the EOS target too (the references do)."),
    bf16: bool = typer.Option(True, "--bf16/--no-bf16", help="bf16 autocast (faster on CPU; "
                                                             "master weights stay fp32)."),
    bos_token: Optional[str] = typer.Option(
        None, "--bos-token", help="Token that starts every sequence (default: the tokenizer's BOS; "
        "recorded in the checkpoint's tokenizer so 'eval accuracy' uses it too)."),
    eos_token: Optional[str] = typer.Option(
        None, "--eos-token", help="Token appended to every text (default: the tokenizer's EOS)."),
    seed: int = typer.Option(0, help="Seeds the shuffling and the LoRA initialisation."),
    max_steps: Optional[int] = typer.Option(None, min=1, help="Stop after this many optimizer steps."),
    max_samples: Optional[int] = typer.Option(None, min=1, help="Use the first N training records."),
    max_val_samples: Optional[int] = typer.Option(None, min=1, help="Use the first N val records."),
    eval_batch_size: int = typer.Option(32, min=1, help="Batch size of the validation passes."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --out."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
) -> None:
    from popri.eval.downstream import train_downstream as run
    from popri.core.errors import InputError
    from popri.core.io import dumps

    if select_by not in ("accuracy", "loss"):
        raise InputError(f"--select-by must be 'accuracy' or 'loss', got {select_by!r}")
    from popri.core import validate

    validate.finite(lr, "--lr", lo=0, lo_open=True, hi=1)
    validate.finite(weight_decay, "--weight-decay", lo=0)
    from pathlib import Path

    from popri.core.guard import check_outputs

    # the checkpoint directory is replaced whole: every file now under it is overwritten
    o = Path(out)
    check_outputs([out, *(sorted(map(str, o.rglob("*"))) if o.is_dir() else ())],
                  [train, val, model if Path(model).exists() else None])
    res = run(train, model=model, out_dir=out, val_records=val, max_length=max_length, lr=lr,
              epochs=epochs, batch_size=batch_size, micro_batch_size=micro_batch_size, lora=lora,
              lora_r=lora_r, lora_alpha=lora_alpha, bf16=bf16, seed=seed, max_steps=max_steps,
              max_samples=max_samples, max_val_samples=max_val_samples, count_eos=count_eos,
              select_by=select_by, weight_decay=weight_decay, eval_batch_size=eval_batch_size,
              train_split=train_split, force=force, bos_token=bos_token, eos_token=eos_token)
    if json_out:
        typer.echo(dumps(res))


def register(app: typer.Typer) -> None:
    # rich keeps single newlines: re-flow the hard-wrapped paragraphs
    text = "\n\n".join(" ".join(p.split()) for p in _HELP.strip().split("\n\n"))
    app.command("train-downstream", help=text)(train_downstream)
