"""DPO (POPri) and SFT (the PE+SFT baseline) of the server LLM with a LoRA adapter, via TRL.

    popri dpo --pairs runs/r0/pairs.jsonl --model smollm2-135m --out runs/r0/dpo
    popri sft --pairs runs/r0/pairs.jsonl --model smollm2-135m --out runs/r0/sft
    python -c "from popri.methods.popri.dpo import *; print(train_dpo('p.jsonl', model='smollm2-135m', out_dir='o'))"

"Private Federated Learning using Preference-Optimized Synthetic Data" (POPri,
arXiv:2504.16438), section 4.2 / appendix B.1: DPO (TRL ``DPOTrainer``, loss "sigmoid"; IPO =
loss "ipo", POPri E.4) with tau = beta = 0.01, LoRA rank 4 / alpha 8 on the attention and MLP
projections (the reference code meiyuw/POPri uses rank 16 / alpha 16), AdamW, cosine schedule
from lr down to 3/8 lr (the paper's 8e-7 -> 3e-7, reference ``cosine_with_min_lr``), 2 epochs,
batch 24.  The settings and their sources are the fields of
:class:`~popri.specs.training.DPOSpec` / :class:`~popri.specs.training.SFTSpec`; the TRL / PEFT
plumbing both share is :mod:`popri.models.lora`.

The reference model is the public base checkpoint (POPri 4.2: "we use the public checkpoint"):
TRL computes its log-probs with the adapter *disabled*, so no second model is held in memory.
Round t+1 starts from round t's adapter (``adapter=``): its weights are loaded into the fresh
trainable adapter, so the reference stays the base model (TRL's own path for a pre-loaded PEFT
model would instead copy the adapter as the reference).

Checkpoints go to ``OUT/checkpoint-STEP`` (every epoch, or every ``save_steps``); a killed run
resumes from the latest complete one.  The final adapter is written atomically to
``OUT/adapter``, metrics (loss and reward margin per logging step and per epoch) to
``OUT/metrics.json``; with ``select=`` (:mod:`popri.methods.popri.select`, POPri B.1) the
adapter is the checkpoint with the lowest FID instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from popri.core import artifacts, io, log
from popri.core.errors import InputError
from popri.core.spec import default
from popri.methods.popri.prefs import load_score_vector, read_samples, top_samples
from popri.methods.popri.select import select_checkpoint
from popri.models.lora import (
    ADAPTER_DIR,
    METRICS_FILE,
    RUN_FILE,
    build_trainer,
    list_checkpoints,
    prepare_out,
    require_adapter,
    run_trainer,
    save_adapter,
    training_args,
)
from popri.specs.training import DPOSpec, SFTSpec, TrainSpec

# re-exported: what the commands, tests and the selection use from here (the TRL / PEFT
# plumbing itself is popri.models.lora, the selection popri.methods.popri.select)
__all__ = ["ADAPTER_DIR", "METRICS_FILE", "RUN_FILE", "list_checkpoints", "save_adapter",
           "select_checkpoint", "load_pairs", "sft_records_from_pairs", "sft_records",
           "build_dpo_trainer", "train_dpo", "build_sft_trainer", "train_sft", "sequence_logps",
           "margin_stats", "reward_margins"]

# --------------------------------------------------------------------------- inputs
def load_pairs(pairs: str | os.PathLike | Sequence[dict]) -> list[dict]:
    """Preference records ``{"prompt", "chosen", "rejected", ...}`` from a JSONL path or a list."""
    if isinstance(pairs, (str, os.PathLike)):
        src = str(pairs)
        recs = io.read_jsonl(src, required=("prompt", "chosen", "rejected"))
    else:
        src, recs = "pairs", list(pairs)
    for n, r in enumerate(recs, start=1):
        for f in ("prompt", "chosen", "rejected"):
            if not isinstance(r.get(f), str):
                raise InputError("missing or not a string", path=src, line=n, field=f)
        if not r["chosen"] or not r["rejected"]:
            raise InputError("empty completion", path=src, line=n,
                             field="chosen" if not r["chosen"] else "rejected")
    if not recs:
        raise InputError("no preference pairs", path=src)
    return [{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in recs]


def sft_records_from_pairs(pairs: Sequence[dict]) -> list[dict]:
    """PE+SFT from preference pairs: train on (prompt, chosen)."""
    return [{"prompt": p["prompt"], "completion": p["chosen"]} for p in load_pairs(pairs)]


def _check_sft(records: Sequence[dict]) -> list[dict]:
    recs = list(records)
    if not recs:
        raise InputError("no SFT records")
    for n, r in enumerate(recs, start=1):
        for f in ("prompt", "completion"):
            if not isinstance(r.get(f), str):
                raise InputError("missing or not a string", path="records", line=n, field=f)
    return [{"prompt": r["prompt"], "completion": r["completion"]} for r in recs]


def _config(spec, records: list[dict], *, model: str, adapter: str | None, seed: int) -> dict:
    """What run.json and metrics.json record (and the resume fingerprint covers): the spec's
    settings plus the model, the starting adapter (and its content digest) and the seed."""
    return {**spec.to_dict(), "model": model, "adapter": adapter,
            "adapter_sha256": artifacts.dir_digest(adapter) if adapter else None,
            "seed": int(seed), "records": len(records)}


def _spec(cls, spec, overrides: dict):
    """``spec`` (default: ``cls()``) with ``overrides`` (field values) applied: validated."""
    if spec is None:
        return cls(**overrides)
    if not isinstance(spec, cls):
        raise TypeError(f"expected a {cls.__name__}, got {type(spec).__name__}")
    return spec.replace(**overrides) if overrides else spec


def _train(kind: str, records: list[dict], spec, build, *, model: str, out_dir, seed: int,
           adapter: str | None, resume: bool, after=None, **build_kw) -> dict:
    out_dir = Path(out_dir)
    if adapter:
        require_adapter(adapter)  # before anything is written to out_dir
    config = _config(spec, records, model=model, adapter=adapter, seed=seed)
    fingerprint = artifacts.digest({"kind": kind, "records": records, "config": config})
    resume_from = prepare_out(out_dir, kind, fingerprint, config, resume)
    trainer = build(records, spec, model=model, out_dir=out_dir, seed=seed, adapter=adapter,
                    **build_kw)
    return run_trainer(kind, trainer, out_dir, resume_from, config, after)


# --------------------------------------------------------------------------- DPO
def build_dpo_trainer(records: list[dict], spec: DPOSpec | None = None, *, model: str, out_dir,
                      seed: int = 0, adapter: str | None = None, logging_steps: int = 1,
                      callbacks=None, **overrides):
    """A TRL ``DPOTrainer`` on a fresh LoRA adapter (initialised from ``adapter`` if given);
    reference = the base model with the adapter disabled (``ref_model=None``).  ``overrides``:
    field values of ``spec`` (default ``DPOSpec()``)."""
    from trl import DPOConfig, DPOTrainer

    spec = _spec(DPOSpec, spec, overrides)
    return build_trainer(
        records, spec, trainer_cls=DPOTrainer, config_cls=DPOConfig, model=model,
        out_dir=out_dir, seed=seed, adapter=adapter, logging_steps=logging_steps,
        callbacks=callbacks, trainer_kwargs={"ref_model": None},
        config=dict(beta=float(spec.beta), **loss_config(spec),
                    max_length=int(spec.max_length), disable_dropout=True))


def loss_config(spec: DPOSpec) -> dict:
    """TRL's ``loss_type`` (and ``loss_weights``) of the spec: the preference loss (sigmoid =
    DPO, ipo), plus the chosen sample's NLL at ``sft_weight`` (RPO, arXiv:2404.19733)."""
    base = "sigmoid" if spec.loss == "dpo" else "ipo"
    if not spec.sft_weight:
        return {"loss_type": [base]}
    return {"loss_type": [base, "sft"], "loss_weights": [1.0, float(spec.sft_weight)]}


def train_dpo(pairs_path_or_records, spec: DPOSpec | None = None, *, model: str, out_dir,
              seed: int = 0, adapter: str | None = None, resume: bool = True, eval_pairs: int = 0,
              select=None, logging_steps: int = 1, callbacks=None, **overrides) -> dict:
    """Train; returns {"adapter": OUT/adapter, "metrics": OUT/metrics.json, "checkpoints", "epochs",
    ...}.  ``spec``: the settings (default ``DPOSpec()``; ``overrides``: field values on top).
    ``resume``: continue from the latest checkpoint in ``out_dir`` (same data/settings).
    ``eval_pairs``: also measure the exact (fp32) reward margin on the first N pairs afterwards.
    ``select``: a :class:`~popri.methods.popri.select.Selection` (POPri B.1): OUT/adapter is
    then the checkpoint it selects ("selected" in the result)."""
    records = load_pairs(pairs_path_or_records)
    spec = _spec(DPOSpec, spec, overrides)
    held: list[dict] = []
    if spec.holdout > 0:
        records, held = split_holdout(records, spec.holdout, seed)
    eval_records = records[:max(int(eval_pairs), 0)]

    def after(trainer) -> dict:
        out: dict = {"eval_margin": None}
        tok = trainer.processing_class
        if eval_records:
            # exact (fp32) margins: bf16 logged rewards carry rounding noise ~1e-3
            ev = margin_stats(trainer.model, tok, eval_records, spec.beta, spec.max_length)
            ev["margins"] = [float(x) for x in ev["margins"]]
            log.info(f"dpo: fp32 reward margin on {ev['pairs']} training pairs: "
                     f"{ev['margin']:+.4g} (accuracy {ev['accuracy']:.2f}; dlogp chosen "
                     f"{ev['dlogp_chosen']:+.3g}, rejected {ev['dlogp_rejected']:+.3g})")
            out["eval_margin"] = ev
        if held:  # the same on pairs DPO never saw, and on the ones it trained on
            for key, recs in (("holdout", held), ("train_eval", records)):
                ev = margin_stats(trainer.model, tok, recs, spec.beta, spec.max_length)
                ev.pop("margins")
                out[key] = ev
            h, t = out["holdout"], out["train_eval"]
            log.info(f"dpo: reward margin {t['margin']:+.4g} (accuracy {t['accuracy']:.2f}) on "
                     f"{t['pairs']} training pairs, {h['margin']:+.4g} (accuracy "
                     f"{h['accuracy']:.2f}) on {h['pairs']} held-out pairs")
        return out

    res = _train("dpo", records, spec, build_dpo_trainer, model=model, out_dir=out_dir, seed=seed,
                 adapter=adapter, resume=resume, after=after, logging_steps=logging_steps,
                 callbacks=callbacks)
    if select is not None:
        res["adapter"] = res["selected"] = select(res["checkpoints"], Path(out_dir))
    return res


def split_holdout(records: list[dict], frac: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(training pairs, held-out pairs): a seeded ``frac`` of the prompts (all their pairs)
    held out, at least one prompt and at least one left to train on."""
    keys = sorted({str(r.get("prompt_id", r["prompt"])) for r in records})
    if len(keys) < 2:
        return records, []
    k = min(max(1, round(frac * len(keys))), len(keys) - 1)
    rng = np.random.default_rng([int(seed), 0x484F4C44])
    held = set(rng.choice(len(keys), size=k, replace=False).tolist())
    out = {keys[i] for i in held}
    return ([r for r in records if str(r.get("prompt_id", r["prompt"])) not in out],
            [r for r in records if str(r.get("prompt_id", r["prompt"])) in out])


# --------------------------------------------------------------------------- SFT (PE+SFT)
def sft_records(*, pairs=None, samples: str | None = None, scores: str | None = None) -> list[dict]:
    """The PE+SFT training set: (prompt, chosen) of preference ``pairs``, or the top-scored
    sample per prompt of ``samples`` ('popri gen' JSONL) + ``scores`` (SCORES.npy / JSONL)."""
    if bool(pairs) == bool(samples):
        raise InputError("give either --pairs, or --samples with --scores")
    if samples and not scores:
        raise InputError("--samples needs --scores")
    if scores and not samples:
        raise InputError("--scores goes with --samples")
    if pairs:
        return sft_records_from_pairs(pairs)
    arr, ids = load_score_vector(scores)
    return top_samples(read_samples(samples), arr, ids, scores_path=scores)


def build_sft_trainer(records: list[dict], spec: SFTSpec | None = None, *, model: str, out_dir,
                      seed: int = 0, adapter: str | None = None, logging_steps: int = 1,
                      callbacks=None, **overrides):
    """A TRL ``SFTTrainer`` on prompt/completion records, loss on the completion only."""
    from trl import SFTConfig, SFTTrainer

    spec = _spec(SFTSpec, spec, overrides)
    return build_trainer(
        records, spec, trainer_cls=SFTTrainer, config_cls=SFTConfig, model=model,
        out_dir=out_dir, seed=seed, adapter=adapter, logging_steps=logging_steps,
        callbacks=callbacks,
        config=dict(completion_only_loss=True, max_length=int(spec.max_length), packing=False))


def train_sft(records, spec: SFTSpec | None = None, *, model: str, out_dir, seed: int = 0,
              adapter: str | None = None, resume: bool = True, logging_steps: int = 1,
              callbacks=None, **overrides) -> dict:
    """PE+SFT: LoRA next-token training on ``{"prompt", "completion"}`` records (completion-only
    loss).  Same arguments (``spec``: an ``SFTSpec``) and outputs as :func:`train_dpo`."""
    recs = _check_sft(records)
    spec = _spec(SFTSpec, spec, overrides)
    return _train("sft", recs, spec, build_sft_trainer, model=model, out_dir=out_dir, seed=seed,
                  adapter=adapter, resume=resume, logging_steps=logging_steps,
                  callbacks=callbacks)


def _common_args(*, out_dir, seed: int = 0, logging_steps: int = 1, **settings) -> dict:
    """Deprecated (tests/test_compat.py): :func:`popri.models.lora.training_args` of a
    ``TrainSpec(**settings)``."""
    return training_args(TrainSpec(**settings), out_dir=out_dir, seed=seed,
                         logging_steps=logging_steps)


# --------------------------------------------------------------------------- diagnostics
def sequence_logps(model, tok, prompts: Sequence[str], completions: Sequence[str],
                   max_length: int = default(DPOSpec, "max_length")):
    """Sum of log p(completion + EOS | prompt) per pair, one forward pass each (own tokenisation,
    independent of TRL's)."""
    import torch

    dev = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for p, c in zip(prompts, completions):
            p_ids = tok(p)["input_ids"]
            full = tok(p + c)["input_ids"] + [tok.eos_token_id]
            n = 0
            while n < min(len(p_ids), len(full)) and p_ids[n] == full[n]:
                n += 1
            full = full[:max_length]
            ids = torch.tensor([full], device=dev)
            logits = model(input_ids=ids).logits.float()
            lp = torch.log_softmax(logits[0, :-1], dim=-1)
            tgt = ids[0, 1:]
            tok_lp = lp.gather(1, tgt[:, None])[:, 0]
            out.append(float(tok_lp[max(n - 1, 0):].sum()))
    return np.asarray(out)


def margin_stats(peft_model, tok, pairs: Sequence[dict], beta: float = default(DPOSpec, "beta"),
                 max_length: int = default(DPOSpec, "max_length")) -> dict:
    """DPO implicit rewards per pair, in fp32 (no autocast): policy = adapter enabled, reference =
    adapter disabled.  ``margins`` = beta * [(log pi - log ref)(chosen) - (same)(rejected)]."""
    prompts = [p["prompt"] for p in pairs]
    ch, rj = [p["chosen"] for p in pairs], [p["rejected"] for p in pairs]
    was_training = peft_model.training
    peft_model.eval()
    try:
        pc, pr = (sequence_logps(peft_model, tok, prompts, x, max_length) for x in (ch, rj))
        with peft_model.disable_adapter():
            rc, rr = (sequence_logps(peft_model, tok, prompts, x, max_length) for x in (ch, rj))
    finally:
        peft_model.train(was_training)
    margins = beta * ((pc - rc) - (pr - rr))
    return {"pairs": len(pairs), "margin": float(margins.mean()),
            "accuracy": float((margins > 0).mean()), "dlogp_chosen": float((pc - rc).mean()),
            "dlogp_rejected": float((pr - rr).mean()), "margins": margins}


def reward_margins(peft_model, tok, pairs: Sequence[dict], beta: float = default(DPOSpec, "beta"),
                   max_length: int = default(DPOSpec, "max_length")) -> np.ndarray:
    """Per-pair DPO reward margins (see :func:`margin_stats`)."""
    return margin_stats(peft_model, tok, pairs, beta, max_length)["margins"]
