"""DPO (POPri) and SFT (the PE+SFT baseline) of the server LLM with a LoRA adapter, via TRL.

    popri dpo --pairs runs/r0/pairs.jsonl --model smollm2-135m --out runs/r0/dpo
    popri sft --pairs runs/r0/pairs.jsonl --model smollm2-135m --out runs/r0/sft
    python -c "from popri.methods.popri.dpo import train_dpo; print(train_dpo('pairs.jsonl', model='smollm2-135m', out_dir='o'))"

POPri 4.2 / B.1: DPO (TRL ``DPOTrainer``, loss "sigmoid"; IPO = loss "ipo", POPri E.4) with
tau = beta = 0.01, LoRA rank 4 / alpha 8 on the attention and MLP projections (the reference
code meiyuw/POPri uses rank 16 / alpha 16), AdamW, cosine schedule from lr down to 3/8 lr (the
paper's 8e-7 -> 3e-7, reference ``cosine_with_min_lr``), 2 epochs, batch 24.

The reference model is the public base checkpoint (POPri 4.2: "we use the public checkpoint"):
TRL computes its log-probs with the adapter *disabled*, so no second model is held in memory.
Round t+1 starts from round t's adapter (``adapter=``): its weights are loaded into the fresh
trainable adapter, so the reference stays the base model (TRL's own path for a pre-loaded PEFT
model would instead copy the adapter as the reference).

Checkpoints go to ``OUT/checkpoint-STEP`` (every epoch, or every ``save_steps``); a killed run
resumes from the latest complete one.  The final adapter is written atomically to
``OUT/adapter``, metrics (loss and reward margin per logging step and per epoch) to
``OUT/metrics.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from popri.core import io, log
from popri.core.errors import InputError, PopriError

# POPri 4.2: "all the attention matrices and up/down projection matrices"; B.1: "all the
# projection matrices"; reference code: q, k, v, o, gate, up, down.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BETA = 0.01  # POPri tau (reference conf: training.beta 0.01)
PAPER_LR = 8e-7  # POPri B.1 for LLaMA-3-8B (3e-7 .. 8e-7); reference start_lr 8e-7, end_lr 3e-7
MIN_LR_RATIO = 3 / 8  # cosine down to 3e-7 / 8e-7 of the start rate
# Measured on SmolLM2-135M (README): 32 real-ish pairs, batch 8, 2 epochs (8 steps).  fp32 margin
# on the training pairs: 8e-7 -> 9e-5 (nothing), 5e-5 -> 0.006, 2e-4 -> 0.024, 5e-4 -> 0.067
# (chosen log-prob +2.9, rejected -3.8: no collapse; held-out pairs move the same way), 1e-3 ->
# 0.155 (held-out chosen log-prob starts to fall: overfitting).
DEFAULT_LR = 5e-4
DEFAULT_SFT_LR = 5e-4  # the same rate as DPO: a like-for-like PE+SFT baseline
DEFAULT_BATCH = 8
DEFAULT_MAX_LENGTH = 512  # reference code max_length
RUN_FILE = "run.json"
METRICS_FILE = "metrics.json"
ADAPTER_DIR = "adapter"
_CKPT = re.compile(r"^checkpoint-(\d+)$")


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


def _fingerprint(kind: str, records: list[dict], config: dict) -> str:
    h = hashlib.sha256(kind.encode())
    h.update(json.dumps(records, ensure_ascii=False, sort_keys=True).encode())
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    return h.hexdigest()


# --------------------------------------------------------------------------- model + LoRA
def target_modules_for(model, requested: Sequence[str] | None = None):
    """The LoRA targets: ``requested``, else the Llama-style projections the model has, else
    PEFT's "all-linear" (e.g. GPT-2's fused c_attn)."""
    if requested:
        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        missing = [t for t in requested if t not in names and t != "all-linear"]
        if missing:
            raise InputError(f"--target-modules {', '.join(missing)} not found in the model "
                             f"(it has e.g. {', '.join(sorted(names)[:12])})")
        return "all-linear" if list(requested) == ["all-linear"] else list(requested)
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    found = [t for t in DEFAULT_TARGETS if t in names]
    return found or "all-linear"


def lora_config(model, *, r: int, alpha: int, target_modules: Sequence[str] | None = None,
                dropout: float = 0.0):
    from peft import LoraConfig

    from popri.core.compat import config_kwargs

    return LoraConfig(**config_kwargs(LoraConfig, dict(
        r=int(r), lora_alpha=int(alpha), lora_dropout=dropout, bias="none",
        target_modules=target_modules_for(model, target_modules), task_type="CAUSAL_LM")))


def _adapter_config(adapter: str):
    from peft import PeftConfig

    if not (Path(adapter) / "adapter_config.json").exists():
        raise InputError("not a PEFT adapter directory (no adapter_config.json)", path=adapter)
    return PeftConfig.from_pretrained(adapter)


def _init_from_adapter(peft_model, adapter: str) -> None:
    """Copy a saved adapter's weights into the (identically shaped) trainable 'default' adapter."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    weights = load_peft_weights(adapter, device="cpu")
    res = set_peft_model_state_dict(peft_model, weights, adapter_name="default")
    missing = [k for k in res.missing_keys if "lora_" in k]
    if res.unexpected_keys or missing:
        raise InputError(f"adapter does not fit the model: {len(missing)} missing / "
                         f"{len(res.unexpected_keys)} unexpected LoRA weights", path=adapter)


def _load_base(model: str, adapter: str | None, lora_r, lora_alpha, target_modules, bf16: bool):
    """(base model, tokenizer, LoRA config): the adapter's own config when continuing one.
    On a bf16-capable GPU the base weights are loaded in bf16 (the frozen part); on CPU in fp32
    with bf16 autocast."""
    import torch

    from popri.models import llm

    dtype = "bfloat16" if bf16 and torch.cuda.is_available() and torch.cuda.is_bf16_supported() \
        else "float32"
    base, tok = llm.load_causal_lm(model, dtype=dtype)
    if adapter:
        cfg = _adapter_config(adapter)
        if (cfg.r, cfg.lora_alpha) != (lora_r, lora_alpha):
            log.info(f"train: continuing adapter {adapter} with its own LoRA rank {cfg.r} / alpha "
                     f"{cfg.lora_alpha}")
        cfg.inference_mode = False
        peft_cfg = cfg
    else:
        peft_cfg = lora_config(base, r=lora_r, alpha=lora_alpha, target_modules=target_modules)
    return base, tok, peft_cfg


def _adapter_digest(adapter: str | None) -> str | None:
    """Content hash of an adapter's weights (a resumed run must start from the same adapter)."""
    if not adapter:
        return None
    files = sorted(Path(adapter).glob("adapter_model.*"))
    return io.sha256_file(files[0]) if files else None


# --------------------------------------------------------------------------- trainer plumbing
def _use_bf16(bf16: bool) -> bool:
    import torch

    if bf16 and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        log.warn("this GPU has no bf16: training in fp32")
        return False
    return bool(bf16)


def _common_args(*, out_dir, lr, epochs, batch_size, grad_accum, save_steps, max_steps, seed, bf16,
                 logging_steps, min_lr_ratio, gradient_checkpointing) -> dict:
    """TrainingArguments options under their newest names; :func:`trainer_config` maps them to
    what the installed transformers / TRL call them."""
    import torch

    return dict(
        output_dir=str(out_dir), learning_rate=float(lr), num_train_epochs=float(epochs),
        max_steps=int(max_steps) if max_steps else -1,
        per_device_train_batch_size=int(batch_size), gradient_accumulation_steps=int(grad_accum),
        optim="adamw_torch", weight_decay=0.0, warmup_steps=0,
        lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": float(min_lr_ratio)},
        logging_strategy="steps", logging_steps=int(logging_steps), logging_first_step=True,
        save_strategy="steps" if save_steps else "epoch", save_steps=int(save_steps or 500),
        save_total_limit=None, save_only_model=False,
        seed=int(seed), data_seed=int(seed), bf16=_use_bf16(bf16), fp16=False,
        activation_checkpointing=bool(gradient_checkpointing),
        use_cpu=not torch.cuda.is_available(),  # bf16 autocast on CPU needs it (transformers 5)
        report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
    )


def trainer_config(cls, common: dict, **extra):
    """``cls(**common, **extra)`` (a TRL ``DPOConfig`` / ``SFTConfig``) with every option under the
    name the installed version accepts (e.g. ``activation_checkpointing``, which transformers
    releases before it call ``gradient_checkpointing``): see :mod:`popri.core.compat`."""
    from popri.core.compat import config_kwargs

    return cls(**config_kwargs(cls, {**common, **extra}))


def _stderr_callback():
    """Trainer callback: one compact line per logging step on stderr (stdout is data only)."""
    from transformers import TrainerCallback

    class StderrLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if not logs or "loss" not in logs:
                return
            bits = [f"step {state.global_step}/{state.max_steps}",
                    f"epoch {logs.get('epoch', 0):.2f}", f"loss {logs['loss']:.4f}"]
            if "rewards/margins" in logs:
                bits.append(f"margin {logs['rewards/margins']:+.4g}")
            log.info("train: " + "  ".join(bits))

    return StderrLog()


def _finish_trainer(trainer, callbacks) -> None:
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # it prints to stdout
    trainer.add_callback(_stderr_callback())
    for cb in callbacks or ():
        trainer.add_callback(cb)


def list_checkpoints(out_dir: str | os.PathLike, complete_only: bool = True) -> list[str]:
    """``OUT/checkpoint-STEP`` directories in step order (complete = trainer state written last)."""
    d = Path(out_dir)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _CKPT.match(p.name)
        if m and p.is_dir() and (not complete_only or (p / "trainer_state.json").exists()):
            found.append((int(m.group(1)), str(p)))
    return [p for _, p in sorted(found)]


def _prepare_out(out_dir: Path, kind: str, fingerprint: str, config: dict, resume: bool) -> str | None:
    """Check / write OUT/run.json; return the checkpoint to resume from (or None)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for p in set(list_checkpoints(out_dir, complete_only=False)) - set(list_checkpoints(out_dir)):
        log.warn(f"{kind}: removing incomplete checkpoint {p} (a run was killed while saving it)")
        shutil.rmtree(p)
    ckpts = list_checkpoints(out_dir)
    run_file = out_dir / RUN_FILE
    if ckpts and resume:
        prev = io.read_json(run_file) if run_file.exists() else {}
        if prev.get("fingerprint") != fingerprint:
            raise InputError(f"{out_dir} holds checkpoints of a different {kind} run (other data or "
                             "settings): choose another --out, or --no-resume to start over there",
                             path=str(run_file))
        log.info(f"{kind}: resuming from {ckpts[-1]}")
        return ckpts[-1]
    if ckpts:  # --no-resume: the user asked to start over in this directory
        log.warn(f"{kind}: --no-resume: removing {len(ckpts)} earlier checkpoint(s) in {out_dir}")
        for p in ckpts:
            shutil.rmtree(p)
    io.write_json({"kind": kind, "fingerprint": fingerprint, "config": config}, run_file)
    return None


def replace_dir(src: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Move a finished directory into place (rename; an older ``dest`` is moved aside first)."""
    src, dest = Path(src), Path(dest)
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
    os.replace(src, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_adapter(model, dest: str | os.PathLike, source: str | os.PathLike | None = None) -> str:
    """Write the adapter of ``model`` (or copy the adapter files of checkpoint ``source``) to
    ``dest`` atomically."""
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if source is None:
        model.save_pretrained(str(tmp))
    else:
        tmp.mkdir(parents=True)
        for f in Path(source).iterdir():
            if f.name.startswith("adapter_") or f.name == "README.md":
                shutil.copy2(f, tmp / f.name)
        if not (tmp / "adapter_config.json").exists():
            shutil.rmtree(tmp)
            raise PopriError(f"{source} holds no adapter")
    replace_dir(tmp, dest)
    return str(dest)


def epoch_metrics(log_history: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """(per logging step, per epoch) from a trainer's log history; epoch k covers (k-1, k]."""
    steps = [dict(e) for e in log_history if "loss" in e and "step" in e]
    keys = [k for k in ("loss", "rewards/margins", "rewards/chosen", "rewards/rejected",
                        "rewards/accuracies", "logps/chosen", "logps/rejected", "mean_token_accuracy",
                        "learning_rate") if any(k in s for s in steps)]
    by_epoch: dict[int, list[dict]] = {}
    for s in steps:
        k = max(1, math.ceil(float(s.get("epoch", 0)) - 1e-9))
        by_epoch.setdefault(k, []).append(s)
    epochs = []
    for k in sorted(by_epoch):
        rows = by_epoch[k]
        e = {"epoch": k, "steps": len(rows), "last_step": rows[-1]["step"]}
        for key in keys:
            vals = [r[key] for r in rows if key in r]
            if vals:
                e[key] = float(np.mean(vals))
        epochs.append(e)
    return steps, epochs


def _epoch_table(kind: str, epochs: list[dict]) -> None:
    if not epochs:
        return
    dpo = "rewards/margins" in epochs[0]
    head = f"{'epoch':>5} {'steps':>5} {'loss':>9}" + (
        f" {'margin':>10} {'chosen':>10} {'rejected':>10} {'acc':>5}" if dpo else f" {'tok_acc':>8}")
    log.info(f"{kind}: per epoch (means over logging steps)")
    log.info(head)
    for e in epochs:
        line = f"{e['epoch']:>5} {e['steps']:>5} {e['loss']:>9.4f}"
        if dpo:
            line += (f" {e.get('rewards/margins', float('nan')):>+10.4g}"
                     f" {e.get('rewards/chosen', float('nan')):>+10.4g}"
                     f" {e.get('rewards/rejected', float('nan')):>+10.4g}"
                     f" {e.get('rewards/accuracies', float('nan')):>5.2f}")
        elif "mean_token_accuracy" in e:
            line += f" {e['mean_token_accuracy']:>8.3f}"
        log.info(line)


def _run(kind: str, trainer, out_dir: Path, resume_from: str | None, config: dict,
         eval_records: Sequence[dict] = ()) -> dict:
    t0 = time.perf_counter()
    start_step = 0
    if resume_from:
        start_step = int(_CKPT.match(Path(resume_from).name).group(1))
    out = trainer.train(resume_from_checkpoint=resume_from)
    wall = time.perf_counter() - t0
    steps_run = trainer.state.global_step - start_step
    adapter = save_adapter(trainer.model, out_dir / ADAPTER_DIR)
    steps, epochs = epoch_metrics(trainer.state.log_history)
    metrics = {
        "kind": kind, "adapter": adapter, "checkpoints": list_checkpoints(out_dir),
        "global_step": trainer.state.global_step, "steps_this_run": steps_run,
        "resumed_from": resume_from, "train_runtime_s": wall,
        "seconds_per_step": wall / steps_run if steps_run else None,
        "train_loss": out.training_loss if steps_run else None,
        "epochs": epochs, "steps": steps, "config": config,
    }
    if eval_records:  # exact (fp32) margins: bf16 logged rewards carry rounding noise ~1e-3
        ev = margin_stats(trainer.model, trainer.processing_class, eval_records, config["beta"],
                          config["max_length"])
        ev["margins"] = [float(x) for x in ev["margins"]]
        metrics["eval_margin"] = ev
        log.info(f"{kind}: fp32 reward margin on {ev['pairs']} training pairs: {ev['margin']:+.4g} "
                 f"(accuracy {ev['accuracy']:.2f}; dlogp chosen {ev['dlogp_chosen']:+.3g}, "
                 f"rejected {ev['dlogp_rejected']:+.3g})")
    io.write_json(metrics, out_dir / METRICS_FILE)
    _epoch_table(kind, epochs)
    if metrics["seconds_per_step"]:
        log.info(f"{kind}: {steps_run} steps in {wall:.1f} s ({metrics['seconds_per_step']:.2f} s/step)"
                 f" -> {adapter}")
    return {"adapter": adapter, "metrics": str(out_dir / METRICS_FILE),
            "checkpoints": metrics["checkpoints"], "epochs": epochs,
            "eval_margin": metrics.get("eval_margin"),
            "global_step": trainer.state.global_step, "steps_this_run": steps_run,
            "resumed_from": resume_from, "seconds_per_step": metrics["seconds_per_step"]}


# --------------------------------------------------------------------------- DPO
def build_dpo_trainer(records: list[dict], *, model: str, adapter: str | None = None, out_dir,
                      loss: str = "dpo", beta: float = BETA, lora_r: int = 4, lora_alpha: int = 8,
                      target_modules: Sequence[str] | None = None, lr: float = DEFAULT_LR,
                      epochs: float = 2, batch_size: int = DEFAULT_BATCH, grad_accum: int = 1,
                      max_length: int = DEFAULT_MAX_LENGTH, save_steps: int | None = None,
                      max_steps: int | None = None, seed: int = 0, bf16: bool = True,
                      logging_steps: int = 1, min_lr_ratio: float = MIN_LR_RATIO,
                      gradient_checkpointing: bool = False, callbacks=None):
    """A TRL ``DPOTrainer`` on a fresh LoRA adapter (initialised from ``adapter`` if given);
    reference = the base model with the adapter disabled (``ref_model=None``)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from popri.core import runtime

    if loss not in ("dpo", "ipo"):
        raise InputError(f"--loss must be dpo or ipo (got {loss!r})")
    runtime.configure_torch()
    base, tok, peft_cfg = _load_base(model, adapter, lora_r, lora_alpha, target_modules, bf16)
    args = trainer_config(DPOConfig, _common_args(
        out_dir=out_dir, lr=lr, epochs=epochs, batch_size=batch_size, grad_accum=grad_accum,
        save_steps=save_steps, max_steps=max_steps, seed=seed, bf16=bf16,
        logging_steps=logging_steps, min_lr_ratio=min_lr_ratio,
        gradient_checkpointing=gradient_checkpointing),
        beta=float(beta), loss_type=["sigmoid" if loss == "dpo" else "ipo"],
        max_length=int(max_length), disable_dropout=True)
    trainer = DPOTrainer(model=base, ref_model=None, args=args,
                         train_dataset=Dataset.from_list(records), processing_class=tok,
                         peft_config=peft_cfg)
    if adapter:
        _init_from_adapter(trainer.model, adapter)
    _finish_trainer(trainer, callbacks)
    return trainer


def train_dpo(pairs_path_or_records, *, model: str, adapter: str | None = None, out_dir,
              loss: str = "dpo", beta: float = BETA, lora_r: int = 4, lora_alpha: int = 8,
              target_modules: Sequence[str] | None = None, lr: float | None = None, epochs: float = 2,
              batch_size: int = DEFAULT_BATCH, grad_accum: int = 1,
              max_length: int = DEFAULT_MAX_LENGTH, save_steps: int | None = None,
              max_steps: int | None = None, seed: int = 0, bf16: bool = True, resume: bool = True,
              logging_steps: int = 1, min_lr_ratio: float = MIN_LR_RATIO,
              gradient_checkpointing: bool = False, eval_pairs: int = 0, callbacks=None) -> dict:
    """Train; returns {"adapter": OUT/adapter, "metrics": OUT/metrics.json, "checkpoints", "epochs",
    ...}.  ``resume``: continue from the latest checkpoint in ``out_dir`` (same data/settings).
    ``eval_pairs``: also measure the exact (fp32) reward margin on the first N pairs afterwards."""
    records = load_pairs(pairs_path_or_records)
    lr = DEFAULT_LR if lr is None else lr
    out_dir = Path(out_dir)
    config = {"model": model, "adapter": adapter, "adapter_sha256": _adapter_digest(adapter),
              "loss": loss, "beta": beta, "lora_r": lora_r,
              "lora_alpha": lora_alpha, "target_modules": list(target_modules or []) or None,
              "lr": lr, "epochs": epochs, "batch_size": batch_size, "grad_accum": grad_accum,
              "max_length": max_length, "save_steps": save_steps, "max_steps": max_steps,
              "seed": seed, "bf16": bf16, "min_lr_ratio": min_lr_ratio, "pairs": len(records)}
    resume_from = _prepare_out(out_dir, "dpo", _fingerprint("dpo", records, config), config, resume)
    trainer = build_dpo_trainer(
        records, model=model, adapter=adapter, out_dir=out_dir, loss=loss, beta=beta, lora_r=lora_r,
        lora_alpha=lora_alpha, target_modules=target_modules, lr=lr, epochs=epochs,
        batch_size=batch_size, grad_accum=grad_accum, max_length=max_length, save_steps=save_steps,
        max_steps=max_steps, seed=seed, bf16=bf16, logging_steps=logging_steps,
        min_lr_ratio=min_lr_ratio, gradient_checkpointing=gradient_checkpointing, callbacks=callbacks)
    return _run("dpo", trainer, out_dir, resume_from, config, records[:max(int(eval_pairs), 0)])


# --------------------------------------------------------------------------- SFT (PE+SFT)
def build_sft_trainer(records: list[dict], *, model: str, adapter: str | None = None, out_dir,
                      lora_r: int = 4, lora_alpha: int = 8, target_modules=None,
                      lr: float = DEFAULT_SFT_LR, epochs: float = 2, batch_size: int = DEFAULT_BATCH,
                      grad_accum: int = 1, max_length: int = DEFAULT_MAX_LENGTH,
                      save_steps: int | None = None, max_steps: int | None = None, seed: int = 0,
                      bf16: bool = True, logging_steps: int = 1, min_lr_ratio: float = MIN_LR_RATIO,
                      gradient_checkpointing: bool = False, callbacks=None):
    """A TRL ``SFTTrainer`` on prompt/completion records, loss on the completion only."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from popri.core import runtime

    runtime.configure_torch()
    base, tok, peft_cfg = _load_base(model, adapter, lora_r, lora_alpha, target_modules, bf16)
    args = trainer_config(SFTConfig, _common_args(
        out_dir=out_dir, lr=lr, epochs=epochs, batch_size=batch_size, grad_accum=grad_accum,
        save_steps=save_steps, max_steps=max_steps, seed=seed, bf16=bf16,
        logging_steps=logging_steps, min_lr_ratio=min_lr_ratio,
        gradient_checkpointing=gradient_checkpointing),
        completion_only_loss=True, max_length=int(max_length), packing=False)
    trainer = SFTTrainer(model=base, args=args, train_dataset=Dataset.from_list(records),
                         processing_class=tok, peft_config=peft_cfg)
    if adapter:
        _init_from_adapter(trainer.model, adapter)
    _finish_trainer(trainer, callbacks)
    return trainer


def train_sft(records, *, model: str, adapter: str | None = None, out_dir, lora_r: int = 4,
              lora_alpha: int = 8, target_modules=None, lr: float | None = None, epochs: float = 2,
              batch_size: int = DEFAULT_BATCH, grad_accum: int = 1,
              max_length: int = DEFAULT_MAX_LENGTH, save_steps: int | None = None,
              max_steps: int | None = None, seed: int = 0, bf16: bool = True, resume: bool = True,
              logging_steps: int = 1, min_lr_ratio: float = MIN_LR_RATIO,
              gradient_checkpointing: bool = False, callbacks=None) -> dict:
    """PE+SFT: LoRA next-token training on ``{"prompt", "completion"}`` records (completion-only
    loss).  Same outputs as :func:`train_dpo`."""
    recs = _check_sft(records)
    lr = DEFAULT_SFT_LR if lr is None else lr
    out_dir = Path(out_dir)
    config = {"model": model, "adapter": adapter, "adapter_sha256": _adapter_digest(adapter),
              "lora_r": lora_r, "lora_alpha": lora_alpha,
              "target_modules": list(target_modules or []) or None, "lr": lr, "epochs": epochs,
              "batch_size": batch_size, "grad_accum": grad_accum, "max_length": max_length,
              "save_steps": save_steps, "max_steps": max_steps, "seed": seed, "bf16": bf16,
              "min_lr_ratio": min_lr_ratio, "records": len(recs)}
    resume_from = _prepare_out(out_dir, "sft", _fingerprint("sft", recs, config), config, resume)
    trainer = build_sft_trainer(
        recs, model=model, adapter=adapter, out_dir=out_dir, lora_r=lora_r, lora_alpha=lora_alpha,
        target_modules=target_modules, lr=lr, epochs=epochs, batch_size=batch_size,
        grad_accum=grad_accum, max_length=max_length, save_steps=save_steps, max_steps=max_steps,
        seed=seed, bf16=bf16, logging_steps=logging_steps, min_lr_ratio=min_lr_ratio,
        gradient_checkpointing=gradient_checkpointing, callbacks=callbacks)
    return _run("sft", trainer, out_dir, resume_from, config)


# --------------------------------------------------------------------------- diagnostics
def sequence_logps(model, tok, prompts: Sequence[str], completions: Sequence[str],
                   max_length: int = DEFAULT_MAX_LENGTH):
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


def margin_stats(peft_model, tok, pairs: Sequence[dict], beta: float = BETA,
                 max_length: int = DEFAULT_MAX_LENGTH) -> dict:
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


def reward_margins(peft_model, tok, pairs: Sequence[dict], beta: float = BETA,
                   max_length: int = DEFAULT_MAX_LENGTH) -> np.ndarray:
    """Per-pair DPO reward margins (see :func:`margin_stats`)."""
    return margin_stats(peft_model, tok, pairs, beta, max_length)["margins"]


# --------------------------------------------------------------------------- checkpoint selection
def select_checkpoint(checkpoints: list[str], *, base_model: str,
                      val_embeddings: np.ndarray | None = None,
                      generate_fn: Callable[[str], list[str]],
                      embed_fn: Callable[[list[str]], np.ndarray],
                      val_stats: tuple[np.ndarray, np.ndarray] | None = None
                      ) -> tuple[str, list[dict]]:
    """POPri B.1: the checkpoint whose generated samples have the lowest Frechet distance (FID on
    sentence embeddings) to the validation split.  Returns (best checkpoint, one result per
    checkpoint ``{"checkpoint", "base_model", "fid", "samples"}``); ties go to the earlier one.

    The target is the validation embeddings (``val_embeddings``; POPri reads them without noise)
    or their (mean, covariance) given directly as ``val_stats``, e.g. the DP statistics of
    ``popri fred stats`` (then selection costs no privacy beyond that release)."""
    from popri.models.fid import frechet_distance, gaussian_stats

    if not checkpoints:
        raise PopriError("no checkpoints to select from")
    if (val_embeddings is None) == (val_stats is None):
        raise PopriError("select_checkpoint needs val_embeddings or val_stats (one of them)")
    if val_stats is not None:
        mu_v, c_v = (np.asarray(a, dtype=np.float64) for a in val_stats)
    else:
        mu_v, c_v = gaussian_stats(np.asarray(val_embeddings, dtype=np.float64))
    val = mu_v[None, :]  # only its dimension is used below
    results = []
    for ck in checkpoints:
        texts = list(generate_fn(ck))
        if len(texts) < 2:
            raise PopriError(f"checkpoint {ck}: need at least 2 generated samples for a Frechet "
                             f"distance, got {len(texts)}")
        emb = np.asarray(embed_fn(texts), dtype=np.float64)
        if emb.ndim != 2 or emb.shape[1] != val.shape[1]:
            raise PopriError(f"checkpoint {ck}: embeddings of shape {emb.shape} do not match the "
                             f"validation set's dimension {val.shape[1]}")
        d = frechet_distance(*gaussian_stats(emb), mu_v, c_v)
        results.append({"checkpoint": str(ck), "base_model": base_model, "fid": float(d),
                        "samples": len(texts)})
        log.info(f"select: {ck}: FID {d:.4f} ({len(texts)} samples)")
    best = min(range(len(results)), key=lambda i: (results[i]["fid"], i))
    return results[best]["checkpoint"], results
