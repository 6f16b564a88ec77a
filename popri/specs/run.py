"""The settings of ``popri run``: one section dataclass per step or method (YAML keys are their
fields; unknown keys are errors) and :class:`RunConfig`, which nests them.

    popri run examples/default.yaml --set rounds=1 --set dpo.lr=2e-5 --set privacy.epsilon=7
    python -c "from popri.specs.run import RunConfig; print(RunConfig().dpo.beta)"

Every key has a default here; loading (YAML, ``--set`` overrides) and the run-level checks are
:mod:`popri.pipeline.config`'s.  Defaults are the embedded offline setting, small enough for a
2-core CPU; where the papers give a value it is cited and the paper-scale value is in
examples/biorxiv-gpu.yaml.  Here, below the methods, so that a method's recipe can name the
type of ``run.cfg`` (:class:`popri.methods.base.RunContext`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.errors import ConfigError
from popri.core.spec import Spec, param, same
from popri.specs.data import EmbedSpec, FetchSpec
from popri.specs.engine import EngineSpec
from popri.specs.feedback import (
    COSINE_CLIP,
    COSINE_STANDARDIZE,
    HISTOGRAM_MAX_SAMPLES,
    HISTOGRAM_THRESHOLD,
    ScoreSpec,
)
from popri.specs.fewfedpit import FewFedPITSpec
from popri.specs.fl import FLSpec
from popri.specs.generation import DEFAULT_LM, ExpandSpec, GeneratorSpec, GenSpec, VarySpec
from popri.specs.instruct import InstructSpec
from popri.specs.privacy import AccountantSpec, NoiseSpec
from popri.specs.training import (
    GATE_MAX,
    BootstrapSpec,
    DownstreamSpec,
    DPOSpec,
    PoolSpec,
    PrefsSpec,
    SelectSpec,
)


@dataclass(frozen=True)
class DataConfig(Spec):
    """Private federated data and the public initial population Omega (two ``bench fetch``
    runs: each field that is a fetch setting is FetchSpec's, with the embedded default's value)."""
    source: str = param("sotu", "Private data: a bench source (sotu | shakespeare | debian | "
                        "biorxiv | ...) or a file.")
    dir: str | None = param(None, "Use an existing federated dataset directory instead.")
    date_from: str | None = same(FetchSpec, "date_from", "1900-01-01")
    max_samples_per_client: int | None = same(FetchSpec, "max_samples_per_client", 16)
    max_clients: int | None = same(FetchSpec, "max_clients")
    max_tokens: int = same(FetchSpec, "max_tokens")
    split: str = same(FetchSpec, "split")
    public_source: str | None = param("sotu", "Omega: public text (a bench source or a JSONL "
                                      "file).")
    public_date_to: str | None = same(FetchSpec, "date_to", "1899-12-31")
    public_max_samples_per_client: int | None = same(FetchSpec, "max_samples_per_client", 8)


#: the generator section is the generator's own spec (model, backend, sampling)
GeneratorConfig = GeneratorSpec


@dataclass(frozen=True)
class PrivacyConfig(Spec):
    """The budget: the noise multiplier is calibrated over `rounds` steps at the client
    sampling rate, unless given explicitly.  epsilon (at delta, with the accountant) is the
    budget of the whole run directory -- every ledger.jsonl below it -- and is enforced: a
    stage whose release would exceed it is refused before it runs (also with an explicit
    noise_multiplier; set epsilon to null for no budget)."""
    epsilon: float | None = param(1.0, "Budget of the run directory.", cite="POPri: eps = 1, 7",
                                  lo=0, lo_open=True)
    delta: float = same(ScoreSpec, "delta")
    # z > 0: a run's noise is never switched off by its config (the range is NoiseSpec's)
    noise_multiplier: float | None = same(NoiseSpec, "noise_multiplier", None, short=None,
                                          lo_open=True,
                                          help="Explicit z (the budget still applies).")
    accountant: str = same(AccountantSpec, "accountant", cite=None, short=None,
                           help="rdp (opacus, as the papers) | pld (dp-accounting).")
    convention: str | None = same(ScoreSpec, "convention")


@dataclass(frozen=True)
class ScoreConfig(EngineSpec):
    """The clients' DP feedback of every round (``popri score``'s settings; where each round's
    sum is computed -- in-process, or Flower + SecAgg+ (issue 12) -- is the engine's, an
    :class:`~popri.specs.engine.EngineSpec`)."""
    mode: str = same(ScoreSpec, "mode")
    clip: float = same(ScoreSpec, "clip", COSINE_CLIP)
    standardize: bool = same(ScoreSpec, "standardize", COSINE_STANDARDIZE)
    # Poisson sampling at q = 0.5 (about 50 of sotu's 100 clients): the scheme whose
    # add/remove-one-client accounting is proven; a fixed L of N (clients_per_round, with
    # sample_rate: null) is accounted under replace-one-client (docs/privacy.md)
    clients_per_round: int | None = same(ScoreSpec, "clients_per_round")
    sample_rate: float | None = same(ScoreSpec, "sample_rate", 0.5)
    public_clients: int | None = same(ScoreSpec, "public_clients")
    max_samples_per_client: int = same(ScoreSpec, "max_samples_per_client",
                                       HISTOGRAM_MAX_SAMPLES)   # nn-histogram only (PrE-Text)
    threshold: float = same(ScoreSpec, "threshold", HISTOGRAM_THRESHOLD)  # nn-histogram only
    # also score noise-free for the recovery rate: `popri score --diagnostic` (NOT private, no
    # ledger entry, never released); skipped in release mode
    recovery_rate: bool = param(True, "Also score noise-free for the recovery rate (a "
                                "diagnostic: not private, never released; off in release mode).",
                                cli=False)


@dataclass(frozen=True)
class DPOConfig(Spec):
    """POPri's tuning step: preference pairs (PrefsSpec), DPO (DPOSpec) and checkpoint
    selection.  POPri B.1 picks the epoch with the lowest FID to the private validation split,
    read WITHOUT noise (not covered by epsilon): ``select_on: private``, a research setting
    labelled as such in results and reports, refused in release mode.  dp (default): the
    validation split's embedding statistics released once by `popri fred stats` (user level,
    add/remove one client, analytic Gaussian at select_epsilon / select_delta per release) --
    only what select_by reads: the mean for mean-cosine, mean and covariance for fid --,
    ledgered in the run: it is PART of privacy.epsilon.  public: the public Omega embeddings
    (no privacy cost); none: the last epoch."""
    loss: str = same(DPOSpec, "loss")
    beta: float = same(DPOSpec, "beta")
    sft_weight: float | None = same(DPOSpec, "sft_weight")
    lora_r: int = same(DPOSpec, "lora_r")
    lora_alpha: int = same(DPOSpec, "lora_alpha")
    lr: float = same(DPOSpec, "lr")
    epochs: float = same(DPOSpec, "epochs")
    batch_size: int = same(DPOSpec, "batch_size", 4)   # the embedded CPU run (POPri B.1: 24)
    rejected_rank: int = same(PrefsSpec, "rejected_rank")
    # issue 44: remedies for a tuned generator that writes less fluent text (null: POPri)
    pair_rule: str | None = same(PrefsSpec, "pair_rule")
    fluency_gate: float | None = param(
        None, "A popri remedy beyond POPri (issue 44): leave out this share of each round's "
        "samples, the least fluent under the public model (generator.model), before the clients "
        "score them ('popri prefs gate'; no prompt is left fewer samples than rejected_rank). "
        "null: POPri, every sample scored.", lo=0, hi=GATE_MAX, lo_open=True)
    select_checkpoint: bool = param(True, "false = select_on: none (kept for older configs).")
    select_samples: int = same(SelectSpec, "select_samples", 16)
    select_by: str = same(SelectSpec, "select_by")
    holdout: float = same(DPOSpec, "holdout", 0.25)   # held-out pairs: metrics.jsonl
    select_on: str = param("dp", "What checkpoint selection reads: dp (ledgered DP statistics "
                           "of the private validation split), public (Omega), none (the last "
                           "epoch), private (the exact validation split, POPri B.1: NOT covered "
                           "by epsilon; research only).",
                           choices=("dp", "public", "none", "private"))
    select_epsilon: float = param(0.1, "dp: epsilon of each FreD release (one, the mean, for "
                                  "select_by mean-cosine; two, mean and covariance, for fid).",
                                  lo=0, lo_open=True)
    select_delta: float | None = param(None, "dp: delta of each release (None: privacy.delta).",
                                       lo=0, hi=1, lo_open=True, hi_open=True)


@dataclass(frozen=True)
class PEConfig(Spec):
    """Private Evolution / PrE-Text (``method: pe``): population, variation and expansion."""
    num_syn: int = param(48, "N_syn: the population size.",
                         cite="PrE-Text D.2: 1024 at eps 1.29, 2048 at eps 7.58", lo=1)
    variation: str = same(VarySpec, "method", "paraphrase")
    variation_model: str | None = same(VarySpec, "model")
    mask_ratio: float = same(VarySpec, "mask_ratio")
    mask_steps: int = same(VarySpec, "steps")
    lookahead: int = same(VarySpec, "lookahead")
    threshold: float | None = param(None, "H; None = the noise std z * M.", cite="PrE-Text D.2",
                                    lo=0)
    fallback: bool = same(VarySpec, "fallback")
    # expand's chunks: its own setting (ExpandSpec's backend table when unset), not the
    # generator's sampling batch
    expand_batch_size: int | None = same(ExpandSpec, "batch_size")


@dataclass(frozen=True)
class DownstreamConfig(Spec):
    """The downstream model (``popri train-downstream`` / ``popri eval``), at CPU scale."""
    model: str = param(DEFAULT_LM, "Downstream LM.", cite="POPri: DistilGPT2", nonempty=True)
    epochs: int = same(DownstreamSpec, "epochs", 2)       # POPri: 80 (on 1M samples)
    batch_size: int = same(DownstreamSpec, "batch_size", 16)  # POPri: 160
    lr: float = same(DownstreamSpec, "lr")
    max_length: int = same(DownstreamSpec, "max_length")
    lora: bool = same(DownstreamSpec, "lora")
    eval_max_samples: int | None = param(400, "Cap test/val samples for CPU runs (None = all).",
                                         lo=1)
    bootstrap: int = same(BootstrapSpec, "bootstrap")
    quality: bool = param(False, "Also a second opinion on every synthetic set and draw (and at "
                          "each size of the curve): MAUVE against the private test records on "
                          "the downstream model's features, distinct-1/2/3 and the embedding "
                          "spread ('popri eval quality', issue 65; a research read). Adds about "
                          "a featurisation of the set and the test records per arm and draw.")


@dataclass(frozen=True)
class FLConfig(EngineSpec):
    """DP federated learning of the downstream model (``method: dp-fedavg | dp-ftrl``, POPri
    appendix C.1 / C.2): ``rounds`` rounds of ``popri fl round`` (FLSpec's settings), the noise
    multiplier calibrated to privacy.epsilon over them.  CPU default: SmolLM2-135M with a LoRA
    adapter (r = 4 on every projection: ~1.2M numbers per update), a handful of clients per
    round; examples/dpfl-gpu.yaml is the paper's setting (full fine-tuning)."""
    model: str | None = param(None, "The model trained (default: downstream.model).")
    # Poisson at q = 0.1 (about 10 of sotu's 100 clients a round): add/remove one client; a
    # fixed L (clients_per_round, with sample_rate: null) is accounted under replace one client
    clients_per_round: int | None = same(FLSpec, "clients_per_round")
    sample_rate: float | None = same(FLSpec, "sample_rate", 0.1)
    public_clients: int | None = same(FLSpec, "public_clients")
    clip: float = same(FLSpec, "clip")
    client_lr: float = same(FLSpec, "client_lr")
    local_epochs: int = same(FLSpec, "local_epochs")
    client_batch_size: int = same(FLSpec, "client_batch_size")
    server_lr: float | None = same(FLSpec, "server_lr")
    momentum: float | None = same(FLSpec, "momentum")
    restart: str = same(FLSpec, "restart")
    # dp-ftrl, restart epoch: bins (add/remove; R = epoch_rounds, default 1 / sample_rate) or
    # blocks (zero-out; floor(N / clients_per_round) rounds, POPri Table 3)
    assignment: str = same(FLSpec, "assignment")
    epoch_rounds: int | None = same(FLSpec, "epoch_rounds")
    lora: bool = same(FLSpec, "lora")
    lora_r: int = same(FLSpec, "lora_r")
    lora_alpha: int = same(FLSpec, "lora_alpha")
    max_samples_per_client: int | None = same(FLSpec, "max_samples_per_client")
    max_length: int = same(FLSpec, "max_length")
    bf16: bool = same(FLSpec, "bf16")

    def check(self) -> None:
        if self.clients_per_round is not None and self.sample_rate is not None:
            raise ConfigError("give fl.clients_per_round or fl.sample_rate, not both (the "
                              "default is sample_rate: 0.1; a fixed L needs sample_rate: null)",
                              field="sample_rate")


@dataclass(frozen=True)
class InstructConfig(InstructSpec):
    """How data.source becomes instruction data for the FewFedPIT methods: ``popri instruct
    build``'s own spec, with the CPU default's sizes: 20 debian maintainers, 16 examples each,
    the client-level split leaving about 10 training clients (the issue's "about 10 clients")
    and more test clients than usual, so the utility has some examples to stand on."""
    max_output_words: int = same(InstructSpec, "max_output_words", 64)
    max_samples_per_client: int | None = same(InstructSpec, "max_samples_per_client", 16)
    max_clients: int | None = same(InstructSpec, "max_clients", 20)
    test_frac: float = same(InstructSpec, "test_frac", 0.4)


@dataclass(frozen=True)
class FewFedPITConfig(Spec):
    """FewFedPIT and its baselines (``method: fewfedpit | fedit | fedmit``; FewFedPIT,
    arXiv:2403.06131, Algorithm 1): ``rounds`` rounds, ``clients_per_round`` sampled clients
    each running the client stages (FewFedPITSpec's settings), the n_k-weighted server average;
    eps = inf is centralised LoRA tuning on every training client's examples (the paper's
    skyline).  CPU default: SmolLM2-135M-Instruct, LoRA r = 8, shorter generations;
    examples/fewfedpit-gpu.yaml mirrors the paper's Alpaca setting."""
    model: str | None = param(None, "The model tuned (default: downstream.model).")
    clients_per_round: int = param(2, "K clients sampled per round (seeded).",
                                   cite="FewFedPIT 4.1", lo=1)
    beta: float = same(FewFedPITSpec, "beta")
    lr: float = same(FewFedPITSpec, "lr")
    local_epochs: int = same(FewFedPITSpec, "local_epochs")
    batch_size: int = same(FewFedPITSpec, "batch_size")
    max_length: int = same(FewFedPITSpec, "max_length", 192)
    lora_r: int = same(FewFedPITSpec, "lora_r", 8)
    lora_alpha: int = same(FewFedPITSpec, "lora_alpha", 16)
    candidates: int = same(FewFedPITSpec, "candidates")
    keep: int = same(FewFedPITSpec, "keep")
    demos: int = same(FewFedPITSpec, "demos")
    io_shots: int = same(FewFedPITSpec, "io_shots")
    retries: int = same(FewFedPITSpec, "retries")
    instruction_prompts: int = same(FewFedPITSpec, "instruction_prompts")
    rouge_threshold: float = same(FewFedPITSpec, "rouge_threshold")
    instruction_tokens: int = same(FewFedPITSpec, "instruction_tokens")
    response_tokens: int = same(FewFedPITSpec, "response_tokens", 96)
    bf16: bool = same(FewFedPITSpec, "bf16")
    clip: float | None = same(FewFedPITSpec, "clip")
    noise_multiplier: float = same(FewFedPITSpec, "noise_multiplier")
    centralized_epochs: int = param(1, "eps = inf: epochs of centralised tuning on the pooled "
                                    "training examples (paper: 10). 1 was chosen on the val "
                                    "split of examples/fewfedpit.yaml at seed 0 (response-token "
                                    "accuracy 0.419 / 0.402 / 0.382 after 1 / 2 / 3 epochs: more "
                                    "overfits 88 examples).", cite="FewFedPIT 4.1", lo=1)
    eval_max_samples: int | None = param(128, "Test examples evaluated (None: all).", lo=1)
    eval_max_new_tokens: int = param(64, "Greedy response length at most (Rouge-L).", lo=1)
    extract_examples: int = param(100, "Training examples the extraction audit attacks "
                                  "(FewFedPIT 4.3: 100), taken round-robin over the clients, "
                                  "so from distinct clients while there are more clients than "
                                  "examples; SEs are over clients.", lo=1)


@dataclass(frozen=True)
class ProbeConfig(Spec):
    """The per-round view of a generator (issue 24; popri/eval/probe.py): each round's
    generator (round 0: the untuned one) writes a fixed-prompt sample -- the same held prompts
    and seeds every round -- whose distance to the private validation split (mean-embedding
    cosine, unbiased MMD^2), fluency (the public model's perplexity) and diversity (distinct-1/2)
    go to RUN/metrics.jsonl.  A private diagnostic: read without noise, never released."""
    enabled: bool = param(False, "Probe every round (POPri and PE+SFT). On in "
                          "examples/learning.yaml and smoke.yaml; off in the embedded default, "
                          "where it would add ~2.3 of the demo's ~10 minutes.")
    prompts: int = param(16, "Held prompts (built from Omega with their own seed).", lo=1)
    samples_per_prompt: int = param(4, "Samples per held prompt.", lo=1)
    perplexity: bool = param(True, "Also the public model's perplexity of the sample.")


#: the random sources a draw can redraw (``draw_sources``), each its own seed stream
DRAW_SOURCES = ("generation", "training", "test")

#: the largest run seed: its stage seeds (seed * 1000 + 999 at most) stay below 2**32
SEED_MAX = (2 ** 32 - 1 - 999) // 1000


@dataclass(frozen=True)
class RunConfig(Spec):
    run_dir: str = param("runs/default", "The run directory.", nonempty=True)
    method: str = param("popri", "popri | pe (PrE-Text) | pe-sft (POPri's PE+SFT baseline) | "
                        "dp-fedavg | dp-ftrl (DP federated learning, POPri C.1 / C.2) | "
                        "fewfedpit | fedit | fedmit (FewFedPIT and its baselines: no DP "
                        "guarantee); the table of methods is popri.pipeline.recipes.METHODS.")
    # every stage's seed is seed * 1000 + t (round_seed, final_seed): it must fit the 32-bit
    # seeds of numpy's legacy seeding, which the trainers call (transformers.set_seed)
    seed: int = param(0, "Seed of every stage (named rules in popri.pipeline.driver; stage "
                      "seeds are seed * 1000 + t, 32-bit).", lo=0, hi=SEED_MAX)
    rounds: int = param(1, "POPri T (paper: 10 / 20).", lo=1, hi=10_000)
    prompts: int = param(12, "POPri K (paper: 1800).", lo=1)
    samples_per_prompt: int = same(GenSpec, "samples_per_prompt", 6)   # paper J = 10
    num_synthetic: int = param(64, "Final N (paper: 1,000,000).", lo=1)
    curve: tuple[int, ...] = param(
        (), "The learning curve's final-set sizes (issue 65): every arm -- the method, its T = 0 "
        "control, eps = inf -- is also trained and evaluated on the first n samples of its set "
        "for each n here below num_synthetic (nested prefixes of one generation of the "
        "largest: the curve is paired, as the draws are). 'num_synthetic: [96, 384, 1536]' "
        "says the same: num_synthetic 1536 and this curve. Comma-separated.", sep=",")
    final_top_p: float | None = param(
        None, "Nucleus sampling (top-p) of the final synthetic set and of its T = 0 control "
        "(null: generator.top_p, as POPri). A popri remedy (issue 44): the tuned generator's "
        "low-probability tail, not its typical sample, cost accuracy in the study "
        "(docs/results.md).", lo=0, hi=1, lo_open=True)
    final_match_tokens: bool = param(
        False, "The final set holds as many tokens as its T = 0 control, not as many samples: "
        "the tuned generator draws a pool of 3 N and 'popri take' keeps its first samples whose "
        "tokens (the downstream model's) reach the control's N samples' (false: N samples, as "
        "POPri). A popri remedy (issue 44): at equal N the tuned generator's shorter samples "
        "handed the downstream model 37-46 % less text (docs/results.md).")
    # issue 67: the final set's mixture and conditioning (popri remedies beyond POPri)
    final_untuned_share: float = param(
        0.0, "A popri remedy (issue 67): this share of the final set's prompts takes its samples "
        "from the untuned generator (the T = 0 control's, same prompts and seeds; 'popri take "
        "--mix-from'), the rest from the tuned one. 0: POPri, all tuned.", lo=0, hi=1,
        hi_open=True)
    final_samples_per_prompt: int | None = param(
        None, "A popri remedy (issue 67): samples per few-shot prompt of the final set and its "
        "T = 0 control (null: samples_per_prompt, as POPri). 1: N samples from N different "
        "prompts, each its own draw of Omega's examples, not N/J prompts' J draws.", lo=1)
    # issue 24: an evolving few-shot pool (POPri and PE+SFT; popri/methods/popri/pool.py)
    pool: str = same(PoolSpec, "pool")
    embedder: str = same(EmbedSpec, "model")
    baselines: bool = param(True, "eps = 0 and eps = inf runs.")
    control: bool = param(True, "The control row of a generator method (POPri, PE+SFT): the "
                          "untuned generator (T = 0) writes the synthetic set with the same "
                          "prompts, N, seed and downstream recipe; the method minus it, paired "
                          "over test clients, is what the DP feedback and the tuning bought.")
    draws: int = param(1, "How many times the final synthetic set and its control are drawn "
                       "(generation seeds + 0, 1, ...) and each trained and evaluated downstream. "
                       "With draws >= 2 the learning line is the mean paired difference over "
                       "the draws and its SE is between draws: the synthetic set's sampling "
                       "noise, which the SE over test clients of one draw leaves out (issue 24).",
                       lo=1, hi=100)
    draw_sources: tuple[str, ...] = param(
        ("generation", "training"), "What each draw k >= 1 redraws, the other sources held at "
        "draw 0's (issue 65: the variance of the paired difference one source at a time): "
        "generation (the sampling seeds of both final sets), training (the downstream model's "
        "initialisation and batch order), test (which downstream.eval_max_samples test records "
        "every arm is evaluated on: with it, each draw -- draw 0 included -- evaluates a seeded "
        "sample of the test split, the same for all arms). Comma-separated.", sep=",",
        choices=DRAW_SOURCES)
    # release mode: every DP stage (and every stage that samples clients) gets --release: OS
    # CSPRNG noise, nothing reproducible from a seed.  false = research mode: noise is seeded and
    # reproducible from the sidecars (fine for experiments, not for releasing data).
    release: bool = param(False, "Release mode: OS CSPRNG noise, and the run stops at its "
                          "release (the synthetic set or the DP model, and the ledger): no "
                          "evaluation on the private splits, no baselines, control or draws, "
                          "no probe, checkpoint selection dp/public/none.")
    data: DataConfig = param(default_factory=DataConfig)
    generator: GeneratorConfig = param(default_factory=GeneratorConfig)
    privacy: PrivacyConfig = param(default_factory=PrivacyConfig)
    score: ScoreConfig = param(default_factory=ScoreConfig)
    dpo: DPOConfig = param(default_factory=DPOConfig)
    probe: ProbeConfig = param(default_factory=ProbeConfig)
    pe: PEConfig = param(default_factory=PEConfig)
    downstream: DownstreamConfig = param(default_factory=DownstreamConfig)
    fl: FLConfig = param(default_factory=FLConfig)
    instruct: InstructConfig = param(default_factory=InstructConfig)
    fewfedpit: FewFedPITConfig = param(default_factory=FewFedPITConfig)

    @property
    def selection_delta(self) -> float:
        """delta of each DP checkpoint-selection release (``dpo.select_delta``, else
        ``privacy.delta``)."""
        return self.privacy.delta if self.dpo.select_delta is None else self.dpo.select_delta

    #: the run-level checks (the method exists, the combinations of values): registered by
    #: :mod:`popri.pipeline.config`, which knows the methods and the accountants (above specs)
    CHECKS: ClassVar[list] = []

    def check(self) -> None:
        for fn in self.CHECKS:
            fn(self)
