"""popri dpo: preference-tune the server LLM with LoRA (library: popri/methods/popri/dpo.py,
checkpoint selection popri/methods/popri/select.py, settings popri/specs/training.py DPOSpec).

    popri dpo --pairs runs/r0/pairs.jsonl --model smollm2-135m --out runs/r0/dpo
    popri dpo --pairs runs/r1/pairs.jsonl --adapter runs/r0/dpo/adapter --out runs/r1/dpo \\
        --select-on data/sotu --select-prompts runs/r1/samples.jsonl
"""

from __future__ import annotations

from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core import log
from popri.core.errors import InputError
from popri.core.guard import check_outputs
from popri.methods.popri import dpo as lib
from popri.methods.popri.select import SELECTION_FILE, prepare_selection
from popri.specs.training import DPOSpec, SelectSpec
from popri.cli.options import command
from popri.specs.commands.dpo import DpoCall

HELP = """Fine-tune the server LLM on preference pairs with DPO (POPri 4.2, Algorithm 1 line 27)
through TRL's DPOTrainer and a LoRA adapter.

Input --pairs: JSONL {"prompt", "chosen", "rejected", ...} from 'popri prefs build'.

Every setting's default and its source are listed with the options below (POPri B.1 unless
stated; the reference code meiyuw/POPri uses LoRA rank / alpha 16 / 16). The LoRA adapter covers
the q,k,v,o,gate,up,down projections (POPri: "all the projection matrices"; other architectures:
--target-modules, default there "all-linear"); AdamW with a cosine schedule from --lr down to
--min-lr-ratio x lr (the paper's 8e-7 -> 3e-7); --batch-size x --grad-accum pairs per optimizer
step (POPri: 24).

--lr: POPri B.1 uses 3e-7..8e-7 for LLaMA-3-8B (LoRA rank 4). On the small offline models that does
not move the policy: measured on SmolLM2-135M, 32 pairs, batch 8, 2 epochs, the exact reward margin
on the training pairs after 8e-7 / 5e-5 / 2e-4 / 5e-4 / 1e-3 was 0.0001 / 0.006 / 0.024 / 0.067 /
0.155; 5e-4 moves it clearly with the chosen log-prob rising (no collapse), 1e-3 starts to
overfit: hence the default. For an 8B model start from the paper's 8e-7.

The reference model is the public base checkpoint (POPri 4.2), computed with the adapter disabled:
no second model in memory. --adapter DIR continues from an earlier round's adapter (its weights
initialise the trainable adapter; its rank/alpha/targets are kept); the reference stays the base.

Outputs in --out DIR: checkpoint-STEP/ (every epoch, or every --save-steps), adapter/ (the final,
or with --select-on the selected checkpoint's adapter; written atomically), metrics.json (loss and
reward margin chosen-minus-rejected per logging step and per epoch, s/step), run.json, and with
selection selection.json. The adapter path is printed on stdout. A killed run resumes from the
latest complete checkpoint (--resume, default; same pairs and settings required); --no-resume
deletes earlier checkpoints in DIR and starts over.

Checkpoint selection (POPri B.1: per round keep the checkpoint whose samples have the lowest FID to
the validation split): --select-on VAL (a federated dataset dir, whose 'val' split is used, an
embedding set .npy, JSONL texts, or STATS.npz from 'popri fred stats': its DP mean and covariance,
so that selection reads no private sample; the other forms read the split without noise) and --select-prompts FILE (JSONL with "prompt", e.g. this
round's samples; or Omega texts with "text", from which prompts are built as 'popri gen' does).
Each checkpoint writes --select-samples samples; FID on all-MiniLM-L6-v2 embeddings."""


@command(DpoCall)
def dpo(
    pairs: str, out: str, model: str, adapter: Optional[str], seed: int, resume: bool,
    eval_pairs: int, select_on: Optional[str], select_prompts: Optional[str],
    embed_model: Optional[str], *, spec: DPOSpec, sel: SelectSpec
) -> None:
    from pathlib import Path

    if bool(select_on) != bool(select_prompts):
        raise InputError("checkpoint selection needs both --select-on and --select-prompts")
    o = Path(out)
    check_outputs([out, o / lib.ADAPTER_DIR, o / lib.METRICS_FILE, o / lib.RUN_FILE,
                   o / SELECTION_FILE if select_on else None,
                   *(() if resume else lib.list_checkpoints(o, complete_only=False))],
                  [pairs, adapter, select_on, select_prompts,
                   model if Path(model).exists() else None])
    records = lib.load_pairs(pairs)  # a bad pairs file fails before the selection target is read
    select = (prepare_selection(select_on, select_prompts, sel, model=model, seed=seed,
                                bf16=spec.bf16, embed_model=embed_model) if select_on else None)
    res = lib.train_dpo(records, spec, model=model, out_dir=out, seed=seed, adapter=adapter,
                        resume=resume, eval_pairs=eval_pairs, select=select)
    log.info(f"dpo: adapter -> {res['adapter']}")
    print(res["adapter"], flush=True)


def _selector(select_on, select_prompts, n, model, seed, bf16, embed_model):
    """Deprecated (tests/test_run_privacy.py): :func:`popri.methods.popri.select
    .prepare_selection`; returns select(checkpoints, out_dir) -> adapter path."""
    return prepare_selection(select_on, select_prompts, SelectSpec(select_samples=n), model=model,
                             seed=seed, bf16=bf16, embed_model=embed_model)


def register(app: typer.Typer) -> None:
    app.command("dpo", help=unwrap(HELP))(dpo)
