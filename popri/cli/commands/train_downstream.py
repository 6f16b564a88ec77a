"""popri train-downstream: fine-tune the small downstream LM on synthetic (or any) text (library:
popri/eval/downstream.py train_downstream; settings: popri/specs/training.py DownstreamSpec).

    popri train-downstream syn.jsonl --val data/sotu --out runs/ds
    popri train-downstream data/sotu --val data/sotu --out runs/eps_inf      # eps=inf baseline
    popri train-downstream syn.jsonl --val data/sotu --out runs/ds --lora --max-steps 20
"""

from __future__ import annotations

from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core.guard import check_outputs
from popri.core.io import dumps
from popri.eval.downstream import train_downstream as run
from popri.specs.training import DownstreamSpec
from popri.cli.options import command
from popri.specs.commands.train_downstream import TrainDownstreamCall

_HELP = """Fine-tune a causal LM on the 'text' of TRAIN and keep the epoch that is best on --val.

TRAIN is a JSONL file with 'text' (e.g. 'popri gen' output) or a federated dataset directory
(its --train-split; the private train split gives the eps=inf baseline of POPri section 5).
--val is a JSONL file or a dataset directory (its val split; the test split is refused).

Each text becomes [BOS] + tokens + [EOS] cut to --max-length (POPri B.1); BOS is the
tokenizer's (its EOS if it has none), the tokenizer never adds one itself. A chat-turn marker (SmolLM2-Instruct's <|im_start|> / <|im_end|>) is replaced by <|endoftext|>, the
document separator of pretraining (eps=0 on SmolLM2, 400 sotu test records: 0.2825 accuracy with the markers, 0.2913 without).  The loss is the mean
cross-entropy over the targets that 'popri eval accuracy' counts (positions 1.., EOS included
unless --no-count-eos, padding never).  AdamW with a constant --lr (POPri B.1 / PrE-Text
D.2), each --batch-size batch split into --micro-batch-size chunks with the gradient of the
whole batch.  After every epoch the model is evaluated on --val; the best epoch (by --select-by) is
written atomically to --out: a transformers checkpoint (--full) or a PEFT adapter (--lora with
--lora-r / --lora-alpha / --target-modules: PrE-Text's LoRA setting by default), plus
metrics.json (per-epoch train loss, val loss, val
accuracy; 'initial' = the model before training; the settings).  Evaluate it with
'popri eval accuracy --model OUT'.  Progress goes to stderr; --json prints the summary on stdout."""


@command(TrainDownstreamCall)
def train_downstream(
    train: str, out: str, val: Optional[str], model: str, train_split: str, seed: int, force: bool,
    json_out: bool, *, spec: DownstreamSpec
) -> None:
    from pathlib import Path

    # the checkpoint directory is replaced whole: every file now under it is overwritten
    o = Path(out)
    check_outputs([out, *(sorted(map(str, o.rglob("*"))) if o.is_dir() else ())],
                  [train, val, model if Path(model).exists() else None])
    res = run(train, spec, model=model, out_dir=out, val_records=val, seed=seed,
              train_split=train_split, force=force)
    if json_out:
        typer.echo(dumps(res))


def register(app: typer.Typer) -> None:
    app.command("train-downstream", help=unwrap(_HELP.strip()))(train_downstream)
