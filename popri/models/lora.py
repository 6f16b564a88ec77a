"""LoRA plumbing shared by every tuning step (DPO, SFT, the downstream model): PEFT adapters
and the TRL trainer around them.

    popri dpo --pairs runs/r1/prefs.jsonl --adapter runs/r0/dpo/adapter --out runs/r1/dpo
    popri sft --pairs runs/r0/pairs.jsonl --out runs/r0/sft
    popri train-downstream syn.jsonl --val data/sotu --out runs/ds --lora

- the adapter: :func:`target_modules_for` / :func:`lora_config` (a :class:`LoraSpec` on a given
  model), :func:`require_adapter` (the one ``--adapter`` check), :func:`load_base` (base model,
  tokenizer and the LoRA config, the adapter's own when continuing one), :func:`init_from_adapter`;
- the trainer: :func:`training_args` (a :class:`TrainSpec` as TrainingArguments options) and
  :func:`build_trainer` (one builder for TRL's DPO and SFT trainers, the differences passed in);
- the run directory: :func:`prepare_out` (run.json, resume from the latest complete
  checkpoint), :func:`run_trainer` (train, save the adapter, metrics.json), :func:`save_adapter`
  and :func:`replace_dir` (atomic).

The reference model of DPO is the base model with the adapter disabled ("Private Federated
Learning using Preference-Optimized Synthetic Data", POPri, arXiv:2504.16438, section 4.2: "we
use the public checkpoint"): :func:`build_trainer` passes no second model, and an earlier round's
adapter initialises the fresh trainable adapter (:func:`init_from_adapter`) instead of being
loaded as a PEFT model, which TRL would copy as the reference.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from popri.core import io, log, outdir, runtime
from popri.core.artifacts import digest, dir_digest
from popri.core.compat import config_kwargs
from popri.core.errors import InputError, PopriError
from popri.models import llm
from popri.models.llm import ADAPTER_CONFIG, require_adapter  # noqa: F401 (re-exported)

# POPri 4.2: "all the attention matrices and up/down projection matrices"; B.1: "all the
# projection matrices"; reference code: q, k, v, o, gate, up, down.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RUN_FILE = "run.json"
METRICS_FILE = "metrics.json"
ADAPTER_DIR = "adapter"
_CKPT = re.compile(r"^checkpoint-(\d+)$")


# --------------------------------------------------------------------------- the adapter
def target_modules_for(model, requested: Sequence[str] | None = None):
    """The LoRA targets: ``requested``, else the Llama-style projections the model has, else
    PEFT's "all-linear" (e.g. GPT-2's fused c_attn)."""
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    if requested:
        missing = [t for t in requested if t not in names and t != "all-linear"]
        if missing:
            raise InputError(f"--target-modules {', '.join(missing)} not found in the model "
                             f"(it has e.g. {', '.join(sorted(names)[:12])})")
        return "all-linear" if list(requested) == ["all-linear"] else list(requested)
    found = [t for t in DEFAULT_TARGETS if t in names]
    return found or "all-linear"


def lora_config(model, spec, *, dropout: float = 0.0):
    """The PEFT ``LoraConfig`` of a :class:`~popri.specs.training.LoraSpec` on ``model``."""
    from peft import LoraConfig

    return LoraConfig(**config_kwargs(LoraConfig, dict(
        r=int(spec.lora_r), lora_alpha=int(spec.lora_alpha), lora_dropout=dropout, bias="none",
        target_modules=target_modules_for(model, spec.target_modules), task_type="CAUSAL_LM")))


def adapter_config(adapter: str | os.PathLike):
    """The saved ``PeftConfig`` of an adapter directory (checked by :func:`require_adapter`)."""
    from peft import PeftConfig

    return PeftConfig.from_pretrained(str(require_adapter(adapter)))


def init_from_adapter(peft_model, adapter: str | os.PathLike) -> None:
    """Copy a saved adapter's weights into the (identically shaped) trainable 'default' adapter."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    weights = load_peft_weights(str(adapter), device="cpu")
    res = set_peft_model_state_dict(peft_model, weights, adapter_name="default")
    missing = [k for k in res.missing_keys if "lora_" in k]
    if res.unexpected_keys or missing:
        raise InputError(f"adapter does not fit the model: {len(missing)} missing / "
                         f"{len(res.unexpected_keys)} unexpected LoRA weights", path=str(adapter))


def load_base(model: str, spec, adapter: str | None = None):
    """(base model, tokenizer, LoRA config): the adapter's own config when continuing one.
    On a bf16-capable GPU (and ``spec.bf16``) the frozen base weights are loaded in bf16; on CPU
    in fp32 with bf16 autocast."""
    import torch

    dtype = "bfloat16" if spec.bf16 and torch.cuda.is_available() and \
        torch.cuda.is_bf16_supported() else "float32"
    if adapter:
        cfg = adapter_config(adapter)  # checked before the model is loaded
    base, tok = llm.load_causal_lm(model, dtype=dtype)
    if adapter:
        if (cfg.r, cfg.lora_alpha) != (spec.lora_r, spec.lora_alpha):
            log.info(f"train: continuing adapter {adapter} with its own LoRA rank {cfg.r} / alpha "
                     f"{cfg.lora_alpha}")
        cfg.inference_mode = False
        return base, tok, cfg
    return base, tok, lora_config(base, spec)


# --------------------------------------------------------------------------- the trainer
def use_bf16(bf16: bool) -> bool:
    """``bf16`` where the training device computes it natively (a GPU with bf16, a CPU with
    AVX512-BF16 / AMX: :func:`popri.models.llm.use_bf16`), else fp32 with a warning."""
    return llm.use_bf16(bf16, llm.default_device())


def training_args(spec, *, out_dir, seed: int = 0, logging_steps: int = 1) -> dict:
    """A :class:`~popri.specs.training.TrainSpec` as TrainingArguments options under their
    newest names (:func:`trainer_config` maps them to what the installed transformers / TRL call
    them): AdamW, cosine down to ``min_lr_ratio`` x lr, a checkpoint every epoch or
    ``save_steps``."""
    import torch

    return dict(
        output_dir=str(out_dir), learning_rate=float(spec.lr), num_train_epochs=float(spec.epochs),
        max_steps=int(spec.max_steps) if spec.max_steps else -1,
        per_device_train_batch_size=int(spec.batch_size),
        gradient_accumulation_steps=int(spec.grad_accum),
        optim="adamw_torch", weight_decay=0.0, warmup_steps=0,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": float(spec.min_lr_ratio)},
        logging_strategy="steps", logging_steps=int(logging_steps), logging_first_step=True,
        save_strategy="steps" if spec.save_steps else "epoch",
        save_steps=int(spec.save_steps or 500), save_total_limit=None, save_only_model=False,
        seed=int(seed), data_seed=int(seed), bf16=use_bf16(spec.bf16), fp16=False,
        activation_checkpointing=bool(spec.gradient_checkpointing),
        use_cpu=not torch.cuda.is_available(),  # bf16 autocast on CPU needs it (transformers 5)
        report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
    )


def trainer_config(cls, common: dict, **extra):
    """``cls(**common, **extra)`` (a TRL ``DPOConfig`` / ``SFTConfig``) with every option under the
    name the installed version accepts (e.g. ``activation_checkpointing``, which transformers
    releases before it call ``gradient_checkpointing``): see :mod:`popri.core.compat`."""
    return cls(**config_kwargs(cls, {**common, **extra}))


def stderr_callback():
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


def build_trainer(records: Sequence[dict], spec, *, trainer_cls, config_cls, model: str, out_dir,
                  seed: int = 0, adapter: str | None = None, config: dict | None = None,
                  trainer_kwargs: dict | None = None, logging_steps: int = 1, callbacks=None):
    """A TRL trainer (``trainer_cls`` with its ``config_cls``) on a fresh LoRA adapter of
    ``model`` (initialised from ``adapter`` if given), for the settings of ``spec`` (a
    :class:`~popri.specs.training.TrainSpec`).  What differs between DPO and SFT comes in as
    ``config`` (extra config options: beta, loss type...) and ``trainer_kwargs`` (e.g.
    ``ref_model=None``).  Progress goes to stderr, one line per logging step."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    runtime.configure_torch()
    # seed before anything draws: TRL releases before 0.30 (the lowest admitted, 0.29) wrap the
    # model in the LoRA adapter inside __init__ *before* Trainer seeds, so the adapter's random
    # init came from an unseeded generator and two identical runs trained differently
    from transformers import set_seed

    set_seed(int(seed))
    base, tok, peft_cfg = load_base(model, spec, adapter)
    log.info(f"train: LoRA r={spec.lora_r}, lr {float(spec.lr):g}, batch {spec.batch_size}, "
             + llm.compute_words(spec.bf16, llm.default_device()))
    args = trainer_config(config_cls, training_args(spec, out_dir=out_dir, seed=seed,
                                                    logging_steps=logging_steps), **(config or {}))
    trainer = trainer_cls(model=base, args=args, train_dataset=Dataset.from_list(list(records)),
                          processing_class=tok, peft_config=peft_cfg, **(trainer_kwargs or {}))
    if adapter:
        init_from_adapter(trainer.model, adapter)
    trainer.remove_callback(PrinterCallback)  # it prints to stdout
    trainer.add_callback(stderr_callback())
    for cb in callbacks or ():
        trainer.add_callback(cb)
    return trainer


# --------------------------------------------------------------------------- the run directory
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


def drop_incomplete(out_dir: str | os.PathLike) -> None:
    """Remove the checkpoints a failed or interrupted save left half-written (no trainer
    state, written last; transformers' ``tmp-checkpoint-N`` staging directories)."""
    d = Path(out_dir)
    if not d.is_dir():
        return
    for p in d.iterdir():
        m = _CKPT.match(p.name) or re.match(r"^tmp-checkpoint-\d+$", p.name)
        if m and p.is_dir() and not (p / "trainer_state.json").exists():
            shutil.rmtree(p, ignore_errors=True)


def _legacy_run(p: Path) -> bool:
    """A training run directory written before the ownership marker: its run.json is ours
    (``kind`` dpo / sft and a ``fingerprint``)."""
    try:
        r = json.loads((p / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(r, dict) and r.get("kind") in ("dpo", "sft") and "fingerprint" in r


def prepare_out(out_dir: Path, kind: str, fingerprint: str, config: dict,
                resume: bool) -> str | None:
    """Check / write OUT/run.json; return the checkpoint to resume from (or None).  A resumed
    run must have the same ``fingerprint`` (data and settings); ``resume=False`` deletes earlier
    checkpoints; a checkpoint half-written by a killed run is always removed."""
    out_dir = outdir.claim(out_dir, kind=kind, legacy=_legacy_run)
    for p in set(list_checkpoints(out_dir, complete_only=False)) - set(list_checkpoints(out_dir)):
        log.warn(f"{kind}: removing incomplete checkpoint {p} (a run was killed while saving it)")
        shutil.rmtree(p)
    ckpts = list_checkpoints(out_dir)
    run_file = out_dir / RUN_FILE
    if ckpts and resume:
        prev = io.read_json(run_file) if run_file.exists() else {}
        if prev.get("fingerprint") != fingerprint:
            raise InputError(f"{out_dir} holds checkpoints of a different {kind} run (other "
                             "data or settings): choose another --out, or --no-resume to start "
                             "over there", path=str(run_file))
        log.info(f"{kind}: resuming from {ckpts[-1]}")
        return ckpts[-1]
    if ckpts:  # --no-resume: the user asked to start over in this directory
        log.warn(f"{kind}: --no-resume: removing {len(ckpts)} earlier checkpoint(s) in {out_dir}")
        for p in ckpts:
            shutil.rmtree(p)
    io.write_json({"kind": kind, "fingerprint": fingerprint, "config": config}, run_file)
    return None


def replace_dir(src: str | os.PathLike, dest: str | os.PathLike, *, kind: str = "adapter",
                legacy=(ADAPTER_CONFIG,)) -> None:
    """Move a finished staging directory into place: :func:`popri.core.outdir.replace` (an
    older ``dest`` is replaced only when popri wrote it; a kill leaves the old or the new)."""
    outdir.replace(src, dest, kind=kind, legacy=legacy)


def save_adapter(model, dest: str | os.PathLike, source: str | os.PathLike | None = None) -> str:
    """Write the adapter of ``model`` (or copy the adapter files of checkpoint ``source``) to
    ``dest`` atomically."""
    dest = Path(dest)
    tmp = outdir.staging_dir(dest)
    try:
        if source is None:
            with io.writing(dest):  # safetensors' own error on a full disk: an OSError
                model.save_pretrained(str(tmp))
        else:
            for f in Path(source).iterdir():
                if f.name.startswith("adapter_") or f.name == "README.md":
                    shutil.copy2(f, tmp / f.name)
            if not (tmp / ADAPTER_CONFIG).exists():
                raise PopriError(f"{source} holds no adapter")
        replace_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(dest)


def epoch_metrics(log_history: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """(per logging step, per epoch) from a trainer's log history; epoch k covers (k-1, k]."""
    import numpy as np

    steps = [dict(e) for e in log_history if "loss" in e and "step" in e]
    keys = [k for k in ("loss", "rewards/margins", "rewards/chosen", "rewards/rejected",
                        "rewards/accuracies", "logps/chosen", "logps/rejected",
                        "mean_token_accuracy", "learning_rate") if any(k in s for s in steps)]
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
        f" {'margin':>10} {'chosen':>10} {'rejected':>10} {'acc':>5}" if dpo
        else f" {'tok_acc':>8}")
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


def run_trainer(kind: str, trainer, out_dir: Path, resume_from: str | None, config: dict,
                after: Callable[[Any], dict] | None = None) -> dict:
    """Train (from ``resume_from`` if given), save the adapter atomically to OUT/adapter and
    write OUT/metrics.json: per logging step and per epoch, s/step, ``config``, and what
    ``after(trainer)`` returns (e.g. DPO's exact eval margins).  Returns the paths and
    summaries."""
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    start_step = int(_CKPT.match(Path(resume_from).name).group(1)) if resume_from else 0
    try:
        # a checkpoint that cannot be written (a full disk: safetensors and torch raise their own
        # errors, not OSError) is one OSError naming the output directory
        with io.writing(out_dir):
            out = trainer.train(resume_from_checkpoint=resume_from)
    except BaseException:
        drop_incomplete(out_dir)  # a failed run leaves no half-written checkpoint behind
        raise
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
    extra = (after(trainer) or {}) if after is not None else {}
    metrics.update(extra)
    io.write_json(metrics, out_dir / METRICS_FILE)
    _epoch_table(kind, epochs)
    if metrics["seconds_per_step"]:
        log.info(f"{kind}: {steps_run} steps in {wall:.1f} s "
                 f"({metrics['seconds_per_step']:.2f} s/step) -> {adapter}")
    return {"adapter": adapter, "metrics": str(out_dir / METRICS_FILE),
            "checkpoints": metrics["checkpoints"], "epochs": epochs,
            "global_step": trainer.state.global_step, "steps_this_run": steps_run,
            "resumed_from": resume_from, "seconds_per_step": metrics["seconds_per_step"],
            **extra}


def merged_checkpoint(model: str, adapter: str) -> str:
    """Merge a LoRA adapter into its base once (PEFT ``merge_and_unload``); cached by content
    (the base's resolved path and :func:`~popri.core.artifacts.dir_digest` of the adapter)."""
    import os
    import shutil

    dest = runtime.cache_dir() / "merged" / digest([llm.resolve(model), dir_digest(adapter)])[:24]
    if (dest / "config.json").exists():
        return str(dest)
    m, tok = llm.load_causal_lm(model, adapter)
    merged = m.merge_and_unload()
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, dest)
    log.info(f"gen: merged {adapter} into {dest}")
    return str(dest)
