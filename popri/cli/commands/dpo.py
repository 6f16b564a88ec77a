"""popri dpo: preference-tune the server LLM with LoRA (library: popri/methods/popri/dpo.py).

    popri dpo --pairs runs/r0/pairs.jsonl --model smollm2-135m --out runs/r0/dpo
    popri dpo --pairs runs/r1/pairs.jsonl --adapter runs/r0/dpo/adapter --out runs/r1/dpo \\
        --select-on data/sotu --select-prompts runs/r1/samples.jsonl
"""

from __future__ import annotations

from typing import Optional

import typer

HELP = """Fine-tune the server LLM on preference pairs with DPO (POPri 4.2, Algorithm 1 line 27)
through TRL's DPOTrainer and a LoRA adapter.

Input --pairs: JSONL {"prompt", "chosen", "rejected", ...} from 'popri prefs build'.

Defaults and where they come from: loss DPO (--loss ipo: IPO, POPri E.4 ablation); beta 0.01 (POPri
tau, reference code); LoRA rank 4, alpha 8 (POPri B.1; the reference code meiyuw/POPri uses 16/16)
on q,k,v,o,gate,up,down projections (POPri: "all the projection matrices"; other architectures:
--target-modules, default there "all-linear"); AdamW; cosine schedule from --lr down to
--min-lr-ratio x lr (0.375: the paper's 8e-7 -> 3e-7); 2 epochs (POPri B.1); batch 8 (POPri: 24;
x --grad-accum); max length 512 tokens (reference code).

--lr: POPri B.1 uses 3e-7..8e-7 for LLaMA-3-8B (LoRA rank 4). On the small offline models that does
not move the policy: measured on SmolLM2-135M, 32 pairs, batch 8, 2 epochs, the exact reward margin
on the training pairs after 8e-7 / 5e-5 / 2e-4 / 5e-4 / 1e-3 was 0.0001 / 0.006 / 0.024 / 0.067 /
0.155; 5e-4 (the default) moves it clearly with the chosen log-prob rising (no collapse), 1e-3
starts to overfit. For an 8B model start from the paper's 8e-7.

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


def dpo(
    pairs: str = typer.Option(..., "--pairs", "-p", help="Preference pairs JSONL ('popri prefs build')."),
    out: str = typer.Option(..., "--out", "-o", help="Output directory (checkpoints, adapter/, "
                            "metrics.json)."),
    model: str = typer.Option("smollm2-135m", "--model", "-m", envvar="POPRI_GEN_MODEL",
                              help="Base LLM: smollm2-135m / gemma3-270m (offline), a checkpoint "
                                   "dir or hub id (POPri: LLaMA-3-8B)."),
    adapter: Optional[str] = typer.Option(None, "--adapter", help="Continue from this adapter "
                                          "(round t+1 from round t)."),
    loss: str = typer.Option("dpo", "--loss", help="dpo (TRL 'sigmoid', POPri) or ipo (POPri E.4)."),
    beta: float = typer.Option(0.01, "--beta", help="DPO beta = POPri tau (0.01)."),
    lora_r: int = typer.Option(4, "--lora-r", min=1, help="LoRA rank (POPri B.1: 4; reference code: 16)."),
    lora_alpha: int = typer.Option(8, "--lora-alpha", min=1, help="LoRA alpha (POPri B.1: 8; "
                                   "reference code: 16)."),
    target_modules: Optional[str] = typer.Option(None, "--target-modules", help="Comma-separated "
                                                 "module names, or 'all-linear'."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Peak learning rate (default 5e-4, "
                                       "measured for the small models; POPri 8B: 8e-7)."),
    min_lr_ratio: float = typer.Option(0.375, "--min-lr-ratio", min=0.0, max=1.0,
                                       help="Cosine floor as a fraction of --lr (POPri 3e-7/8e-7)."),
    epochs: float = typer.Option(2, "--epochs", help="Epochs (POPri B.1: 2)."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Pairs per step (POPri: 24)."),
    grad_accum: int = typer.Option(1, "--grad-accum", min=1, help="Gradient accumulation steps."),
    max_length: int = typer.Option(512, "--max-length", min=8, help="Max prompt+completion tokens."),
    save_steps: Optional[int] = typer.Option(None, "--save-steps", min=1, help="Checkpoint every N "
                                             "steps (default: every epoch, as the reference code)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, help="Stop after N steps."),
    seed: int = typer.Option(0, "--seed", help="Seeds LoRA init and data order."),
    bf16: bool = typer.Option(True, "--bf16/--no-bf16", help="bf16 mixed precision (CPU autocast: "
                              "faster on this CPU; GPU where supported)."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from the latest "
                                "checkpoint in --out."),
    gradient_checkpointing: bool = typer.Option(False, "--gradient-checkpointing",
                                                help="Trade compute for memory (large models on GPU)."),
    eval_pairs: int = typer.Option(0, "--eval-pairs", min=0, help="After training, the exact "
                                   "(fp32) reward margin on the first N pairs (the bf16-logged "
                                   "margins carry rounding noise ~1e-3); into metrics.json."),
    select_on: Optional[str] = typer.Option(None, "--select-on", help="Validation data for "
                                            "checkpoint selection by FID (POPri B.1), or a "
                                            "'popri fred stats' STATS.npz (DP statistics)."),
    select_prompts: Optional[str] = typer.Option(None, "--select-prompts", help="Prompts for the "
                                                 "selection samples (JSONL 'prompt', or Omega 'text')."),
    select_samples: int = typer.Option(24, "--select-samples", min=2, help="Samples per checkpoint "
                                       "for the FID."),
    embed_model: Optional[str] = typer.Option(None, "--embed-model", envvar="POPRI_EMBED_MODEL",
                                              help="Embedder for the FID (default all-MiniLM-L6-v2)."),
) -> None:
    from pathlib import Path

    from popri.methods.popri import dpo as lib
    from popri.core import log
    from popri.core.errors import InputError

    if loss not in ("dpo", "ipo"):
        raise InputError(f"--loss must be dpo or ipo (got {loss!r})")
    from popri.core import validate

    validate.finite(beta, "--beta", lo=0, lo_open=True)
    validate.optional(lr, "--lr", lo=0, lo_open=True, hi=1)
    validate.finite(epochs, "--epochs", lo=0, lo_open=True, hi=validate.EPOCHS_MAX)
    if bool(select_on) != bool(select_prompts):
        raise InputError("checkpoint selection needs both --select-on and --select-prompts")
    from popri.core.guard import check_outputs

    o = Path(out)
    check_outputs([out, o / lib.ADAPTER_DIR, o / lib.METRICS_FILE, o / lib.RUN_FILE,
                   o / "selection.json" if select_on else None,
                   *(() if resume else lib.list_checkpoints(o, complete_only=False))],
                  [pairs, adapter, select_on, select_prompts,
                   model if Path(model).exists() else None])
    targets = [t.strip() for t in target_modules.split(",") if t.strip()] if target_modules else None
    records = lib.load_pairs(pairs)
    select = (_selector(select_on, select_prompts, select_samples, model, seed, bf16, embed_model)
              if select_on else None)
    res = lib.train_dpo(records, model=model, adapter=adapter, out_dir=out, loss=loss, beta=beta,
                        lora_r=lora_r, lora_alpha=lora_alpha, target_modules=targets, lr=lr,
                        epochs=epochs, batch_size=batch_size, grad_accum=grad_accum,
                        max_length=max_length, save_steps=save_steps, max_steps=max_steps,
                        seed=seed, bf16=bf16, resume=resume, min_lr_ratio=min_lr_ratio,
                        gradient_checkpointing=gradient_checkpointing, eval_pairs=eval_pairs)
    adapter_out = res["adapter"]
    if select:
        adapter_out = select(res["checkpoints"], Path(out))
    log.info(f"dpo: adapter -> {adapter_out}")
    print(adapter_out, flush=True)


def _selector(select_on, select_prompts, n, model, seed, bf16, embed_model):
    """Check the selection inputs up front; return select(checkpoints, out_dir) -> adapter path."""
    from pathlib import Path

    from popri.core import log
    from popri.models.embed import as_embedding_set, embed_texts, is_federated_dir
    from popri.core.errors import InputError
    from popri.core.io import read_jsonl, write_json

    from popri.models.generation import build_prompts, generate

    recs = read_jsonl(select_prompts)
    if not recs:
        raise InputError("no prompts", path=select_prompts)
    if all(isinstance(r.get("prompt"), str) for r in recs):
        seen, prompts = set(), []
        for r in recs:
            key = r.get("prompt_id", r["prompt"])
            if key not in seen:
                seen.add(key)
                prompts.append({"prompt_id": len(prompts), "prompt": r["prompt"]})
    elif all(isinstance(r.get("text"), str) for r in recs):
        prompts = build_prompts([r["text"] for r in recs], min(n, len(recs)), seed=seed)
    else:
        bad = next(i for i, r in enumerate(recs, 1) if not isinstance(r.get("prompt", r.get("text")), str))
        raise InputError("need 'prompt' (prompts) or 'text' (Omega texts) in every line",
                         path=select_prompts, line=bad, field="prompt")
    if str(select_on).endswith(".npz"):  # FreD statistics: a mean + covariance, no samples
        from popri.models.embed import default_model, resolve_model
        from popri.methods.fred.stats import load_stats

        mean, cov, side = load_stats(select_on)
        smodel = side.get("embedding_model")
        if smodel and resolve_model(smodel) != resolve_model(embed_model or default_model()):
            raise InputError(f"the statistics were computed on {smodel!r} embeddings but the "
                             f"selection samples would be embedded with "
                             f"{embed_model or default_model()!r}: pass --embed-model {smodel}",
                             path=select_on, field="embedding_model")
        target = {"val_stats": (mean, cov)}
        criterion = ("lowest Frechet distance to the DP mean and covariance of the validation "
                     "split ('popri fred stats')" if side.get("private") else
                     "lowest Frechet distance to the EXACT (non-private) statistics in "
                     f"{select_on}")
    else:
        split = "val" if Path(select_on).is_dir() and is_federated_dir(select_on) else "train"
        val = as_embedding_set(select_on, model=embed_model, split=split, what="validation")
        if len(val) < 2:
            raise InputError("need at least 2 validation samples for a Frechet distance",
                             path=select_on)
        target = {"val_embeddings": val.embeddings}
        criterion = "lowest FID to the validation split (POPri B.1)"
    per_prompt = -(-n // len(prompts))

    def select(checkpoints, out_dir: Path) -> str:
        from popri.methods.popri import dpo as lib

        def gen(ck: str) -> list[str]:
            recs, _ = generate(prompts, model=model, adapter=ck, samples_per_prompt=per_prompt,
                               num_samples=n, seed=seed, bf16=bf16)
            return [r["text"] for r in recs]

        def emb(texts: list[str]):
            return embed_texts(texts, embed_model, desc="embed selection")

        best, results = lib.select_checkpoint(checkpoints, base_model=model, generate_fn=gen,
                                              embed_fn=emb, **target)
        path = lib.save_adapter(None, out_dir / lib.ADAPTER_DIR, source=best)
        write_json({"selected": best, "criterion": criterion,
                    "validation": select_on, "prompts": select_prompts, "samples": n,
                    "results": results}, out_dir / "selection.json")
        log.info(f"dpo: selected {best} (lowest FID)")
        return path

    return select


def _unwrap(text: str) -> str:
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def register(app: typer.Typer) -> None:
    app.command("dpo", help=_unwrap(HELP))(dpo)
