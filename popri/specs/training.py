"""The settings of the training and evaluation steps: LoRA, DPO, SFT, preference pairs,
checkpoint selection, the downstream model and its evaluation.

    popri prefs build --samples s.jsonl --scores s.npy --out pairs.jsonl   # PrefsSpec
    popri dpo --pairs pairs.jsonl --out runs/r0/dpo --lora-r 4             # DPOSpec (+ SelectSpec)
    popri sft --pairs pairs.jsonl --out runs/r0/sft                        # SFTSpec
    popri train-downstream syn.jsonl --val data/sotu --out runs/ds         # DownstreamSpec
    popri eval accuracy --model runs/ds --data data/sotu                   # EvalSpec
    popri eval gap --acc 0.41 --eps0 0.35 --epsinf 0.45                    # GapSpec

The mixins declare a setting shared by several steps once:

- :class:`LoraSpec` (rank, alpha, target modules): DPO, SFT and the downstream model's LoRA.
  Rank 4 / alpha 8 are "Private Federated Learning using Preference-Optimized Synthetic Data"
  (POPri, arXiv:2504.16438) appendix B.1, also the LoRA setting of "PrE-Text: Training Language
  Models on Private Federated Data in the Age of LLMs" (PrE-Text, arXiv:2406.02958); the
  reference code meiyuw/POPri uses 16 / 16.
- :class:`TrainSpec` (learning rate and schedule, epochs, batch, length, checkpoints): DPO and
  SFT, which get the same budget so that PE+SFT is a like-for-like baseline.
- :class:`SequenceSpec` (how a text becomes a training / test sequence) and
  :class:`PrecisionSpec` (bf16): the downstream training and ``popri eval accuracy``.
- :class:`BootstrapSpec`: the client bootstrap of ``eval accuracy`` and ``eval gap``.

Model names, input / output paths, seeds, ``--resume`` / ``--force`` and diagnostics
(``--eval-pairs``) are arguments of the library functions, not settings.

Pure Python: no torch / numpy import.
"""

from __future__ import annotations

from dataclasses import dataclass

from popri.core.errors import ConfigError
from popri.core.spec import Spec, param
from popri.core.validate import EPOCHS_MAX  # --epochs at most (1e308 overflowed the step count)


# --------------------------------------------------------------------------- mixins
@dataclass(frozen=True)
class LoraSpec(Spec):
    """A LoRA adapter (PEFT): rank, alpha and the modules it adapts."""

    lora_r: int = param(4, "LoRA rank (the reference code meiyuw/POPri uses 16).",
                        cite="POPri B.1", lo=1)
    lora_alpha: int = param(8, "LoRA alpha (the reference code uses 16).", cite="POPri B.1", lo=1)
    target_modules: tuple[str, ...] | None = param(
        None, "Comma-separated module names, or 'all-linear' (default: the attention and MLP "
        "projections q,k,v,o,gate,up,down the model has, else all-linear).",
        cite="POPri 4.2", sep=",")

    def check(self) -> None:
        t = self.target_modules
        if isinstance(t, str):  # "q_proj,v_proj" from Python or a config file
            t = tuple(x.strip() for x in t.split(",") if x.strip())
        if t is not None:
            object.__setattr__(self, "target_modules", tuple(t) or None)


@dataclass(frozen=True)
class PrecisionSpec(Spec):
    """bf16 mixed precision (autocast on CPU; on a GPU where supported)."""

    bf16: bool = param(True, "bf16 mixed precision: autocast, fp32 master weights (1.3-2.4x "
                       "faster on CPU in our runs; a GPU without bf16 trains in fp32).")


@dataclass(frozen=True)
class TrainSpec(PrecisionSpec, LoraSpec):
    """LoRA tuning of the server LLM through TRL (``popri dpo`` and ``popri sft``): AdamW, cosine
    schedule from ``lr`` down to ``min_lr_ratio`` x lr."""

    lr: float = param(
        5e-4, "Peak learning rate (the default is measured for SmolLM2-135M: see 'popri dpo "
        "--help'; POPri B.1 uses 3e-7..8e-7 for LLaMA-3-8B; SFT gets the same rate: a "
        "like-for-like baseline).", lo=0, lo_open=True, hi=1)
    min_lr_ratio: float = param(
        0.375, "Cosine floor as a fraction of --lr (the paper's 8e-7 -> 3e-7; reference code "
        "cosine_with_min_lr).", cite="POPri B.1", lo=0, hi=1)
    epochs: float = param(2.0, "Epochs (fractions allowed).", cite="POPri B.1", lo=0,
                          lo_open=True, hi=EPOCHS_MAX)
    batch_size: int = param(8, "Examples (pairs or samples) per device step (POPri: 24; x "
                            "--grad-accum per optimizer step).", cite="POPri B.1", lo=1)
    grad_accum: int = param(1, "Gradient accumulation steps.", lo=1)
    max_length: int = param(512, "Max prompt + completion tokens (reference code).", lo=8)
    save_steps: int | None = param(None, "Checkpoint every N steps (default: every epoch, as the "
                                   "reference code).", lo=1)
    max_steps: int | None = param(None, "Stop after N steps.", lo=1)
    gradient_checkpointing: bool = param(False, "Trade compute for memory (large models on GPU).",
                                         negatable=False)


@dataclass(frozen=True)
class SequenceSpec(Spec):
    """How a text becomes a sequence for the downstream model (training, validation and test
    alike): ``[START] + tokens + [EOS]`` cut to ``max_length``; see :mod:`popri.eval.downstream`."""

    max_length: int = param(64, "Tokens per sequence incl. START/EOS.", cite="POPri B.1", lo=2)
    count_eos: bool = param(True, "Train on / count the EOS target too (the POPri and PrE-Text "
                            "evaluation code do).")
    bos_token: str | None = param(
        None, "Token that starts every sequence (default: the tokenizer's BOS, its EOS if none; "
        "chat markers -> <|endoftext|>). A train-downstream checkpoint records it, so 'eval "
        "accuracy' uses it too; compare models with the same START/EOS.")
    eos_token: str | None = param(None, "Token appended to every text (default: the tokenizer's "
                                  "EOS).")


@dataclass(frozen=True)
class BootstrapSpec(Spec):
    """Resamples of the test clients (the unit of privacy) for standard errors."""

    bootstrap: int = param(1000, "Bootstrap resamples of the test clients (0: none).", lo=0)


# --------------------------------------------------------------------------- steps
@dataclass(frozen=True)
class PrefsSpec(Spec):
    """``popri prefs build``: which ranked sample is the rejected one (POPri Algorithm 1, lines
    21-26)."""

    rejected_rank: int = param(
        5, "1-based rank of the rejected sample (chosen = rank 1; POPri 4.2 / E.5: 5th of J = 10, "
        "the reference code's zero-based reject_rank 4).", cite="POPri B.1", short="-l", lo=2)
    pair_rule: str | None = param(
        None, "Which sample is chosen: unset or 'score' = POPri (rank 1 under the released "
        "scores); 'fluent' = a popri remedy (issue 44), not in POPri: the best-scored sample "
        "ranked above the rejected one whose public-model NLL ('popri eval fluency', --fluency) "
        "is no higher than the rejected one's; a prompt with none is skipped; 'divpo' = a popri "
        "remedy (issue 67, after DivPO, arXiv:2501.18101): the most diverse of the samples "
        "ranked above the rejected rank is chosen, the least diverse of the rest rejected "
        "(diversity: 1 - mean cosine of its embedding, --embeddings, to its prompt's other "
        "samples and the chosen ones so far).  Post-processing of the release and of public "
        "samples: no privacy cost.", choices=("score", "fluent", "divpo"))


#: the share of a round's samples a fluency gate may leave out at most
GATE_MAX = 0.9


@dataclass(frozen=True)
class GateSpec(Spec):
    """``popri prefs gate``: a fluency gate on a round's candidates before they are scored, a
    popri remedy beyond POPri (issue 44): the samples the public model finds least likely
    (highest mean NLL, 'popri eval fluency') are left out before the clients score the rest.
    The public model's likelihood of a synthetic sample is public: no privacy cost."""

    drop: float = param(0.25, "Share of the round's samples left out, the least fluent first "
                        "(an empty text before any other).", lo=0, hi=GATE_MAX)
    min_per_prompt: int = param(0, "Never leave a prompt fewer samples than this (popri run "
                                "sets the rejected rank: the gate then costs no pair).", lo=0)


#: where round t+1's few-shot examples come from (issue 24): static (Omega, the paper), union
#: (Omega and every earlier round's DP-chosen samples), chosen (those samples alone)
POOL_MODES = ("static", "union", "chosen")


@dataclass(frozen=True)
class PoolSpec(Spec):
    """``popri prefs pool``: an evolving few-shot pool, a popri extension beyond POPri (issue 24):
    each round's chosen samples -- the top-scored of J per prompt under the released DP scores,
    post-processing of the release, no privacy cost -- join the population the next round's
    prompts draw their examples from (as Private Evolution's population moves towards the
    clients: PrE-Text, arXiv:2406.02958, section 3)."""

    pool: str = param(
        "static", "Few-shot examples of round t+1 and of the final set: static (Omega, as POPri), "
        "union (Omega and every earlier round's chosen samples) or chosen (the chosen samples "
        "alone, as Private Evolution's population).", choices=POOL_MODES)


@dataclass(frozen=True)
class DPOSpec(TrainSpec):
    """``popri dpo``: DPO (TRL ``DPOTrainer``) of the server LLM with a LoRA adapter (POPri 4.2,
    Algorithm 1 line 27)."""

    loss: str = param("dpo", "dpo (TRL 'sigmoid', POPri) or ipo (POPri E.4).", cite="POPri E.4",
                      choices=("dpo", "ipo"))
    beta: float = param(0.01, "DPO beta = POPri tau (reference code: training.beta 0.01).",
                        cite="POPri 4.2", lo=0, lo_open=True)
    sft_weight: float | None = param(
        None, "popri extension (issue 24), not in POPri: add this weight times the NLL of the "
              "chosen sample to the preference loss (RPO: Pang et al., 'Iterative Reasoning "
              "Preference Optimization', arXiv:2404.19733, section 2; TRL loss_type "
              "[sigmoid|ipo, sft]), which keeps the tuned generator fluent. None: the plain "
              "loss.", lo=0, lo_open=True, hi=100)
    holdout: float = param(0.0, "Fraction of the pairs (whole prompts, seeded) held out of "
                           "training: after training, the exact (fp32) reward margin and "
                           "preference accuracy on them, next to the same on the training "
                           "pairs (metrics.json 'holdout', 'train_eval').", lo=0, hi=1,
                           hi_open=True)


@dataclass(frozen=True)
class SFTSpec(TrainSpec):
    """``popri sft``: the PE+SFT baseline (POPri section 3, Table 1), completion-only next-token
    loss with the same LoRA and budget as DPO (the paper gives no SFT settings)."""


@dataclass(frozen=True)
class SelectSpec(Spec):
    """Checkpoint selection by FID (POPri B.1): per round keep the checkpoint whose samples are
    closest to the validation split."""

    select_samples: int = param(24, "Samples per checkpoint.", cite="POPri B.1", lo=2)
    select_by: str = param(
        "mean-cosine", "The distance a checkpoint's samples are selected by: mean-cosine (the "
        "cosine between the mean embeddings, highest wins; low variance at a few dozen "
        "samples, and it needs only the target's mean, so it works on 'popri fred stats'), "
        "mmd (unbiased MMD^2, RBF at the median bandwidth; needs target samples) or fid "
        "(POPri B.1; its covariance term is mostly estimation error at n << d).",
        cite="POPri B.1 (fid)", choices=("mean-cosine", "mmd", "fid"))


@dataclass(frozen=True)
class DownstreamSpec(SequenceSpec, PrecisionSpec, LoraSpec):
    """``popri train-downstream``: fine-tune the small downstream LM on (synthetic) text, keep
    the best epoch on validation (POPri B.1, PrE-Text D.2)."""

    lr: float = param(2e-4, "AdamW learning rate, constant (PrE-Text D.2 as well).",
                      cite="POPri B.1", lo=0, lo_open=True, hi=1)
    weight_decay: float = param(0.01, "AdamW weight decay (torch's default, which the reference "
                                "code uses).", lo=0)
    epochs: int = param(3, "Epochs (POPri B.1 runs 80 over 1M samples, PrE-Text 20; 3 keeps CPU "
                        "runs short).", lo=1)
    batch_size: int = param(160, "Sequences per optimizer step.", cite="POPri B.1", lo=1)
    micro_batch_size: int = param(32, "Sequences per forward/backward pass (memory only; same "
                                  "gradient).", lo=1)
    lora: bool = param(False, "LoRA adapter or full fine-tuning (default: full, as both papers "
                       "fine-tune DistilGPT2 fully; for SmolLM2-135M on 2 CPU threads LoRA+bf16 "
                       "steps measured about 2-3x faster than full: "
                       "benchmarks/bench_downstream.py).", negatable=False)
    select_by: str = param("accuracy", "Best epoch by val 'accuracy' (the reference code; ties -> "
                           "lower loss -> earlier) or 'loss'.", choices=("accuracy", "loss"))
    max_steps: int | None = param(None, "Stop after this many optimizer steps.", lo=1)
    max_samples: int | None = param(None, "Use the first N training records.", lo=1)
    max_val_samples: int | None = param(None, "Use the first N val records.", lo=1)
    eval_batch_size: int = param(32, "Batch size of the validation passes.", lo=1)


@dataclass(frozen=True)
class EvalSpec(BootstrapSpec, SequenceSpec, PrecisionSpec):
    """``popri eval accuracy``: next-token accuracy and loss of a causal LM (POPri / PrE-Text's
    downstream metric)."""

    batch_size: int = param(32, "Sequences per forward pass.", lo=1)
    max_samples: int | None = param(None, "Evaluate the first N records only.", lo=1)
    sample_seed: int | None = param(
        None, "With --max-samples: a seeded random sample of N records (their file order kept) "
        "instead of the first N -- another draw of the test set, the same for every model "
        "evaluated with this seed (popri run's draw_sources: test, issue 65).", lo=0)


@dataclass(frozen=True)
class GapSpec(BootstrapSpec):
    """``popri eval gap``: the share of the eps=0 -> eps=inf accuracy gap a method closes (POPri
    section 5)."""

    allow_undefined: bool = param(
        False, "When eps=0 and eps=inf score the same, report the gap as undefined (null) "
        "instead of failing (what 'popri run' does).", negatable=False)

    def check(self) -> None:
        if self.bootstrap < 2:
            raise ConfigError(f"must be >= 2 for a paired bootstrap (got {self.bootstrap})",
                              field="bootstrap")


__all__ = ["LoraSpec", "PrecisionSpec", "TrainSpec", "SequenceSpec", "BootstrapSpec",
           "PrefsSpec", "DPOSpec", "SFTSpec", "SelectSpec", "DownstreamSpec", "EvalSpec",
           "GapSpec"]
