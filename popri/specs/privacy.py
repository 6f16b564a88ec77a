"""The settings of the privacy steps: ``popri fred stats``, ``popri account``, ``popri audit``.

    popri fred stats --private data/sotu --epsilon 0.6 --delta 2e-6 --clip 1 --out runs/fred/stats.npz
    popri account sigma --epsilon 1 --sample-rate 0.1 --steps 20 --accountant pld
    popri audit release --mechanism fred --epsilon 0.9 --delta 1e-5 --trials 10000
    python -m pytest -q tests/test_specs_privacy.py

Papers: POPri = "Private Federated Learning using Preference-Optimized Synthetic Data"
(arXiv:2504.16438); PrE-Text = "PrE-Text: Training Language Models on Private Federated Data in
the Age of LLMs" (arXiv:2406.02958); FreD = "Privately Customizing Prefinetuning to Better Match
User Data in Federated Learning" (arXiv:2302.09042).

Shared fields are declared once, in mixins: :class:`AccountantSpec` (rdp / pld),
:class:`TargetDeltaSpec` (delta 3e-6), :class:`ReleasesSpec` (sample rate q and steps T of a
composed Gaussian), :class:`FredDesignSpec` (FreD's neighbouring relation, level, clip c and
per-client cap m; also what ``popri audit release --mechanism fred`` replays) and
:class:`GaussianCalibrationSpec` (classic / analytic).

FreD's private-release settings default to None and are resolved when the spec is built
(relation replace-one, level sample, clip 1, calibration classic, no denoising, m = 8 at user
level), as :class:`popri.specs.feedback.ScoreSpec` does per mode: the defaults are written once,
here, and a setting given with ``--non-private`` is still an error naming its flag.  Paths,
seeds, the embedding model and the dataset split are not settings: they are arguments of the
library calls (:func:`popri.methods.fred.steps.release_stats`, :func:`popri.apps.audit.run`).

Pure Python: no numpy / torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.errors import ConfigError
from popri.core.spec import Spec, flag_of, param, same, spec_field
from popri.core.validate import CLIP_MAX, EPSILON_MAX, Z_MAX

#: the accountants of popri.privacy.accounting (opacus RDP, dp-accounting PLD)
ACCOUNTANTS = ("rdp", "pld")
#: FreD's neighbouring relations, levels and single-release calibrations
RELATIONS = ("replace-one", "add-remove")
LEVELS = ("sample", "user")
CALIBRATIONS = ("classic", "analytic")
#: samples kept per client at FreD --level user (PrE-Text's cap, popri's user-level M)
DEFAULT_USER_CAP = 8
#: what `popri fred stats` releases: both (mean + covariance, FreD Algorithm 1) or the mean alone
STATISTICS = ("both", "mean")
#: what popri audit release replays, how it can be broken, on what data
AUDIT_MECHANISMS = ("cosine", "nn-histogram", "fred", "ddg", "tree", "subsampled", "fixed")
AUDIT_BREAKS = ("no-clip", "half-noise", "two-leaves", "public-sample")
#: the breaks that only one mechanism has: tree (the canary in two leaves of a tree: the
#: epoch-wise participation dropped) and subsampled (the canary always in the "random" sample:
#: a sample anyone can recompute, amplification claimed but not had)
AUDIT_BREAK_ONLY = {"two-leaves": "tree", "public-sample": "subsampled"}
AUDIT_DATASETS = ("random", "adversarial")
#: the number of base records in an audit's D, per mechanism (fred is replayed once per trial)
AUDIT_CLIENTS = {"cosine": 20, "nn-histogram": 20, "fred": 3, "ddg": 11, "tree": 0,
                 "subsampled": 5, "fixed": 20}
#: the smallest claimed z an audit takes: at most 10^7 trials per world (half measure), a test
#: with no error at all certifies at most mu ~ 9.6 (eps ~ 14), so a claim of z < 0.1 (mu = 1/z >
#: 10, rdp eps ~ 100 and up) can never be refuted; z = 1e-300 printed 1/z with 300 digits
AUDIT_Z_MIN = 0.1

#: client sampling of a composed release (popri.privacy.relations): Poisson under add/remove one
#: client, or a fixed L of N without replacement under replace one client
SAMPLINGS = ("poisson", "fixed")
#: accounting conventions a user may ask for by name; none is a DP guarantee
CONVENTIONS = ("papers",)

FIXED = ("Fixed-size sampling of L of N clients (--sampling fixed) is accounted as sampling "
         "without replacement under replace one client (dp-accounting's "
         "SampledWithoutReplacementDpEvent; RDP only), z relative to the replace-one "
         "sensitivity (2C). POPri D.1 accounted it as Poisson at q = L/N under add/remove, which "
         "is not a DP guarantee: an added client displaces another (docs/privacy.md).")


# --------------------------------------------------------------------------- the noise multiplier
@dataclass(frozen=True)
class NoiseSpec(Spec):
    """The noise multiplier z, declared once with its range [0, Z_MAX]: every step that takes
    one (``popri score``, ``fl round``, ``fewfedpit aggregate``, ``account epsilon``, ``audit
    release``, ``popri run``'s privacy section) reuses this field with
    :func:`~popri.core.spec.same`, changing only its help sentence, its default, and -- where
    the step cannot use all of it -- the lower end (the audit's floor, the run's z > 0)."""

    noise_multiplier: float | None = param(
        None, "Noise std on the aggregate / L2 sensitivity.", short="-z", lo=0, hi=Z_MAX)


# --------------------------------------------------------------------------- accounting
@dataclass(frozen=True)
class AccountantSpec(Spec):
    """Which accountant turns a composition into (epsilon, delta)."""

    accountant: str = param(
        "rdp", "'rdp' (default; opacus RDP, as POPri D.1 and PrE-Text D.1) or 'pld' "
               "(dp-accounting PLD, tighter).", cite="POPri D.1", short="-a", choices=ACCOUNTANTS)


@dataclass(frozen=True)
class TargetDeltaSpec(Spec):
    """The delta of an (epsilon, delta) claim."""

    delta: float = param(3e-6, "Target delta. Default 3e-6, as in POPri D.1 and PrE-Text D.1.",
                         lo=0, lo_open=True, hi=1, hi_open=True)


@dataclass(frozen=True)
class ReleasesSpec(Spec):
    """A Gaussian release composed T times on Poisson samples of clients at rate q (opacus'
    history shape).  Both are required by the commands (None: not given)."""

    sample_rate: float | None = param(
        None, "Probability that a client takes part in a step (Poisson sampling); 1 = full "
              "participation, a plain Gaussian mechanism (PrE-Text D.1: q = 1). POPri Table 3: "
              "clients per round / total clients. " + FIXED, short="-q", lo=0, lo_open=True, hi=1)
    steps: int | None = param(
        None, "Number of releases composed (rounds): POPri D.1 uses 20, PrE-Text D.1 uses 11.",
        short="-T", lo=1)
    sampling: str = param(
        "poisson", "poisson: each client independently at rate q, add/remove one client (the "
                   "default). fixed: L of N without replacement (q = L/N), replace one client; "
                   "z relative to the replace-one sensitivity (2C), at q = 1 too (a fixed L = N "
                   "is L of the N + 1 clients of an added-to neighbour); rdp only below q = 1.",
        choices=SAMPLINGS)

    def check(self) -> None:
        if self.sampling == "fixed" and getattr(self, "accountant", None) == "pld" \
                and not (self.sample_rate is not None and self.sample_rate >= 1):
            # at q = 1 it is full participation (the Gaussian), which pld accounts
            raise ConfigError("fixed-size sampling has no PLD analysis (dp-accounting's "
                              "SampledWithoutReplacementDpEvent is RDP only): --accountant rdp",
                              field="accountant")
        for k in ("sample_rate", "steps"):
            if getattr(self, k) is None:
                raise ConfigError("required", field=k)


@dataclass(frozen=True)
class EpsilonSpec(ReleasesSpec, TargetDeltaSpec, AccountantSpec):
    """``popri account epsilon``: the epsilon of T releases with noise multiplier z at rate q."""

    noise_multiplier: float | None = same(
        NoiseSpec, "noise_multiplier",
        help="Noise std on the aggregate / L2 sensitivity. POPri Table 3 lists it as sigma; "
             "PrE-Text D.1: sigma / (max samples per client). 0 gives epsilon = inf.")

    def check(self) -> None:
        if self.noise_multiplier is None:
            raise ConfigError("required", field="noise_multiplier")
        super().check()


@dataclass(frozen=True)
class SigmaSpec(ReleasesSpec, TargetDeltaSpec, AccountantSpec):
    """``popri account sigma``: the smallest noise multiplier whose epsilon meets a target."""

    epsilon: float | None = param(
        None, "Target epsilon: POPri uses 1 and 7, PrE-Text 1.29 and 7.58.", short="-e",
        lo=0, lo_open=True)
    tol: float = param(1e-4, "Bisection tolerance on z (default 1e-4).", lo=1e-12, hi=1)

    def check(self) -> None:
        if self.epsilon is None:
            raise ConfigError("required", field="epsilon")
        super().check()


@dataclass(frozen=True)
class LedgerTotalSpec(AccountantSpec):
    """``popri account ledger``: how the recorded releases are totalled.  ``delta`` here
    defaults to the entries' own (None), unlike :class:`TargetDeltaSpec`'s 3e-6."""

    delta: float | None = param(
        None, "Target delta. Default: the entries' delta when they all agree (POPri and PrE-Text "
              "use 3e-6); otherwise required.", lo=0, lo_open=True, hi=1, hi_open=True)
    max_epsilon: float | None = param(
        None, "Budget guard: exit with status 4 (after printing the total) when the total epsilon "
              "exceeds E. For scripts and CI: 'popri account ledger runs/x --max-epsilon 1'.",
        lo=0, lo_open=True)
    convention: str | None = param(
        None, "papers: total the releases without a proven accounting (fixed-size sampling under "
              "add/remove, e.g. ledgers of popri <= 0.3; DP-FTRL block trees under add/remove) as "
              "POPri / PrE-Text did (Poisson at q = L/N). The total is then NOT a DP guarantee, "
              "and says so on every line.", choices=CONVENTIONS)


# --------------------------------------------------------------------------- FreD
@dataclass(frozen=True)
class ReleaseModeSpec(Spec):
    """Research mode (seeded noise) or release mode (secure randomness)."""

    release: bool = param(
        False, "Secure randomness (os.urandom) for noise and cap; the seed is then ignored.",
        envvar="POPRI_RELEASE", negatable=False)


@dataclass(frozen=True)
class FredDesignSpec(Spec):
    """What FreD's sensitivities depend on (FreD section 3; popri/methods/fred/stats.py):
    the neighbouring relation, the level, the clip norm c and the per-client cap m."""

    relation: str | None = param(
        None, "replace-one (default: the relation the paper's tau1 = 2c/n assumes) or add-remove "
              "(the paper's Definition 2.1).", cite="FreD Definition 2.1", choices=RELATIONS)
    level: str | None = param(
        None, "sample (default, as the paper) or user (one client's whole data).",
        choices=LEVELS)
    clip: float | None = param(
        None, "Clip norm c of both passes (default 1.0: popri's embeddings are L2-normalised, so "
              "pass 1 clips nothing; the paper leaves c open).", short="-c", lo=0, lo_open=True,
        hi=CLIP_MAX)
    max_samples_per_client: int | None = param(
        None, f"--level user: samples kept per client, a seeded choice (default "
              f"{DEFAULT_USER_CAP}, PrE-Text's cap).", cite="PrE-Text 3", short="-M", lo=1)


@dataclass(frozen=True)
class GaussianCalibrationSpec(Spec):
    """How one Gaussian release's noise multiplier follows from (epsilon, delta)."""

    calibration: str | None = param(
        None, "classic (default; the paper: sqrt(2 ln(1.25/delta))/eps, eps < 1) or analytic "
              "(Balle & Wang 2018, exact, less noise).", cite="FreD Algorithm 1",
        choices=CALIBRATIONS)


@dataclass(frozen=True)
class FredStatsSpec(ReleaseModeSpec, GaussianCalibrationSpec, FredDesignSpec):
    """``popri fred stats``: FreD's two Gaussian releases (mean, covariance; FreD Algorithm 1,
    Proposition 3.1), or the exact statistics with ``non_private``."""

    epsilon: float | None = param(
        None, "Epsilon of EACH of the two releases; the pair costs 2 eps (Proposition 3.1). The "
              "paper's Figure 2 uses 0.6.", cite="FreD Proposition 3.1", short="-e", lo=0,
        lo_open=True, hi=EPSILON_MAX)
    delta: float | None = param(
        None, "Delta of each release (Figure 2: 2e-6); the pair costs 2 delta.",
        cite="FreD Figure 2", lo=0, lo_open=True, hi=1, hi_open=True)
    statistics: str | None = param(
        None, "What is released: both (the mean and the covariance, FreD Algorithm 1; default) "
              "or mean (release 1 alone: one release at --epsilon, what a mean-cosine "
              "checkpoint selection reads; no covariance, so no Frechet distance).",
        choices=STATISTICS)
    denoise: bool | None = param(
        None, "Covariance: eigenvalues below the noise edge 2 tau2 sqrt(d) set to 0, those above "
              "debiased (spiked Wigner model), instead of the paper's nearest-PSD projection "
              "(default). Post-processing of the same release: no privacy cost.")
    non_private: bool = param(
        False, "Write the exact statistics (no clipping, no noise, NO privacy) for reference.",
        negatable=False)

    #: the settings of the private release (an error with --non-private), and their defaults
    PRIVATE = ("epsilon", "delta", "clip", "relation", "level", "max_samples_per_client",
               "calibration", "denoise", "statistics")
    #: the settings whose None the spec resolves (``_given``: those given)
    RESOLVED: ClassVar[tuple] = PRIVATE
    DEFAULTS = {"relation": RELATIONS[0], "level": LEVELS[0], "clip": 1.0,
                "calibration": CALIBRATIONS[0], "denoise": False, "statistics": STATISTICS[0]}

    def __post_init__(self) -> None:
        given = frozenset(k for k in self.PRIVATE if getattr(self, k) is not None)
        object.__setattr__(self, "_given", given)
        if not self.non_private:  # resolve the defaults (a non-private spec keeps them None)
            for k, v in self.DEFAULTS.items():
                if getattr(self, k) is None:
                    object.__setattr__(self, k, v)
            if self.level == "user" and self.max_samples_per_client is None:
                object.__setattr__(self, "max_samples_per_client", DEFAULT_USER_CAP)
        super().__post_init__()

    def check(self) -> None:
        if self.non_private:
            for k in self.PRIVATE:
                if k in self._given:
                    flag = flag_of(spec_field(type(self), k))
                    raise ConfigError(f"--non-private writes the exact statistics; {flag} "
                                      "applies to the private release only", field=k)
            if self.release:
                raise ConfigError("--non-private writes the exact statistics; --release does "
                                  "not apply", field="release")
            return
        for k in ("epsilon", "delta"):
            if getattr(self, k) is None:
                raise ConfigError("required for a private release (or give --non-private)",
                                  field=k)
        if self.level == "sample" and "max_samples_per_client" in self._given:
            raise ConfigError("applies to --level user only (at sample level every sample is "
                              "its own record)", field="max_samples_per_client")
        if self.statistics == "mean" and "denoise" in self._given:
            raise ConfigError("--statistics mean releases no covariance to denoise",
                              field="denoise")


# --------------------------------------------------------------------------- audit
@dataclass(frozen=True)
class AuditSpec(FredDesignSpec, GaussianCalibrationSpec, TargetDeltaSpec, AccountantSpec):
    """``popri audit release``: which release is replayed, on what, and the claim it is held to
    (Jagielski, Ullman, Oprea, "Auditing differentially private machine learning", NeurIPS
    2020, arXiv:2006.07709; Nasr et al., "Tight auditing of differentially private machine
    learning", USENIX Security 2023, arXiv:2302.07956).  ``mechanism`` and ``trials`` are
    required (None: not given)."""

    mechanism: str | None = param(
        None, "cosine (popri score), nn-histogram (popri score --mode nn-histogram), fred "
              "(popri fred stats), ddg (a cosine round's distributed discrete Gaussian through "
              "the Flower nodes' encoding), tree (a DP-FTRL tree: every prefix sum released), "
              "subsampled (a cosine round on a Poisson sample at --sample-rate) or fixed (a "
              "cosine round on --clients-per-round L of the N clients: the displacement pair, an "
              "added client at -C among N at +C).", short="-m", choices=AUDIT_MECHANISMS)
    clients_per_round: int = param(
        10, "fixed: L, the clients sampled per round (without replacement) of --clients N.",
        short="-L", lo=1, hi=10_000)
    convention: str | None = param(
        None, "fixed: papers replays the round as popri <= 0.3 did (noise z C, the ledger entry "
              "Poisson at q = L/N under add/remove): the claim that accounting makes, NOT a DP "
              "guarantee.", choices=CONVENTIONS)
    sample_rate: float = param(0.01, "subsampled: the Poisson rate q of the claim.", lo=0,
                               lo_open=True, hi=1, hi_open=True)
    leaves: int = param(8, "tree: rounds (leaves) of the tree; every prefix is released.",
                        lo=1, hi=1024)
    nodes: int = param(4, "ddg: the SuperNodes (uploaders) each adding a noise share.", lo=3,
                       hi=64)
    trials: int | None = param(
        None, "Releases per world (D and D'); half pick the threshold, half measure it. 10,000 "
              "runs in seconds.", short="-T", lo=100, hi=10_000_000)
    noise_multiplier: float | None = same(
        NoiseSpec, "noise_multiplier", lo=AUDIT_Z_MIN,
        help="Claimed noise multiplier z (noise std / sensitivity). Exclusive with --epsilon. "
             f"At least {AUDIT_Z_MIN:g}: with at most 10^7 trials the audit's bounds stay "
             "under mu ~ 9.6 (eps ~ 14), so a smaller z (mu = 1/z > 10) is a claim no audit "
             "here can refute.")
    epsilon: float | None = param(
        None, "Claimed epsilon of the release: z is calibrated to it (fred: its --epsilon per "
              "release, via --calibration; others: the smallest z the accountant accepts).",
        short="-e", lo=0, lo_open=True)
    clients: int | None = param(
        None, "Records / clients in D besides the canary (default 20; fred 3: it is replayed "
              "once per trial).", short="-N", lo=1, hi=10_000)
    synthetic: int = param(100, "cosine / nn-histogram: synthetic samples (default 100: the "
                                "canary's unclipped cosine vector is then 10 C).", short="-n",
                           lo=2, hi=10_000)
    dim: int = param(16, "Embedding dimension (default 16).", short="-d", lo=1, hi=1024)
    dataset: str = param(
        "random", "random (default): seeded Gaussian records; adversarial: every other record "
                  "mirrors the canary (the adversary also picks D, Nasr et al. 2021).",
        choices=AUDIT_DATASETS)
    confidence: float = param(0.95, "Joint confidence of the bounds (default 0.95).", lo=0.5,
                              hi=1, hi_open=True)
    brk: str | None = param(
        None, "Audit a deliberately broken mechanism: no-clip, half-noise, two-leaves (tree: "
              "the canary in two leaves) or public-sample (subsampled: the canary always "
              "sampled).", flag="--break", choices=AUDIT_BREAKS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_given", frozenset(
            k for k in ("clip", "relation", "level", "calibration", "max_samples_per_client")
            if getattr(self, k) is not None))
        if self.calibration is None:
            object.__setattr__(self, "calibration", CALIBRATIONS[0])
        if self.mechanism != "nn-histogram" and self.clip is None:
            object.__setattr__(self, "clip", 1.0)
        if self.mechanism == "fred":
            for k, v in (("relation", RELATIONS[0]), ("level", LEVELS[0])):
                if getattr(self, k) is None:
                    object.__setattr__(self, k, v)
        super().__post_init__()

    def check(self) -> None:
        for k in ("mechanism", "trials"):
            if getattr(self, k) is None:
                raise ConfigError("required", field=k)
        if self.max_samples_per_client is not None and self.max_samples_per_client > 1000:
            raise ConfigError(f"must be in [1, 1000] (got {self.max_samples_per_client})",
                              field="max_samples_per_client")
        if self.mechanism == "nn-histogram" and "clip" in self._given:
            raise ConfigError("applies to cosine and fred; nn-histogram's sensitivity is "
                              "--max-samples-per-client", field="clip")
        if self.mechanism == "fred":
            if "max_samples_per_client" in self._given and self.level != "user":
                raise ConfigError("applies to fred --level user only",
                                  field="max_samples_per_client")
        else:
            for k in ("relation", "level"):
                if k in self._given:
                    raise ConfigError("applies to --mechanism fred only", field=k)
        if (self.noise_multiplier is None) == (self.epsilon is None):
            raise ConfigError("give exactly one of --noise-multiplier and --epsilon",
                              field="noise_multiplier")
        only = AUDIT_BREAK_ONLY.get(self.brk or "")
        if only is not None and only != self.mechanism:
            raise ConfigError(f"applies to --mechanism {only} only", field="brk")
        if self.dataset == "adversarial" and self.mechanism in ("ddg", "tree", "subsampled",
                                                                "fixed"):
            raise ConfigError("applies to cosine, nn-histogram and fred", field="dataset")
        if self.mechanism == "fixed" and not self.clients_per_round < self.n_clients:
            raise ConfigError(f"must be < --clients ({self.n_clients}): with every client "
                              "sampled nothing is displaced", field="clients_per_round")
        if self.convention is not None and self.mechanism != "fixed":
            raise ConfigError("applies to --mechanism fixed only", field="convention")

    @property
    def n_clients(self) -> int:
        """Records in D besides the canary (``clients``, or the mechanism's default)."""
        return int(self.clients or AUDIT_CLIENTS[self.mechanism])


# --------------------------------------------------------------------------- canary audit
CANARY_STYLES = ("random", "echo")
CANARY_SCORES = ("embed", "lcs", "generator", "generator-raw", "model", "model-raw",
                 "model-rows")
CANARY_BREAKS = ("no-noise",)


@dataclass(frozen=True)
class CanarySpec(Spec):
    """``popri audit canaries``: m canary clients planted in one run's private data, scored from
    what the run releases, and the one-run lower bound on its epsilon (Steinke, Nasr, Jagielski,
    "Privacy auditing with one (1) training run", NeurIPS 2023, arXiv:2305.08846)."""

    canaries: int = param(
        200, "m: canary clients, each included with probability 1/2 by a seeded, recorded draw "
             "(more canaries: a tighter bound; with 200 and perfect guesses it reaches ~3).",
        short="-m", lo=10, hi=100_000)
    style: str = param(
        "random", "random: secret phrases of --words words drawn from the public data's "
                  "vocabulary; echo: a public text's opening with a random suffix (the "
                  "Canary's Echo, arXiv:2502.14921).", choices=CANARY_STYLES)
    words: int = param(10, "Words of each canary's random secret.", lo=3, hi=200)
    copies: int = param(
        4, "Records of its secret each canary client holds (one client still: under add/remove "
           "one client the claim covers them together).", lo=1, hi=1000)
    scores: tuple[str, ...] | None = param(
        None, "Membership scores to try (comma-separated: embed, lcs, generator, generator-raw, "
              "model, model-raw, model-rows; default: all that the method releases); the bound is "
              "Bonferroni-corrected over them.",
        sep=",")
    significance: float = param(0.05, "The bound holds with probability 1 - this, over the "
                                      "canaries' draw (default 0.05).", lo=0, lo_open=True,
                                hi=0.5)
    brk: str | None = param(
        None, "no-noise: run the same config at z = 1e-6 (no noise in effect, no budget) and "
              "hold it to the config's privacy.epsilon (the test that the audit has teeth; NOT "
              "a private run).",
        flag="--break", choices=CANARY_BREAKS)

    def check(self) -> None:
        t = self.scores
        if isinstance(t, str):
            t = tuple(x.strip() for x in t.split(",") if x.strip())
        if t is not None:
            bad = [x for x in t if x not in CANARY_SCORES]
            if bad:
                raise ConfigError(f"unknown score {bad[0]!r} (one of {', '.join(CANARY_SCORES)})",
                                  field="scores")
            object.__setattr__(self, "scores", tuple(t) or None)


# --------------------------------------------------------------------------- extraction audit
@dataclass(frozen=True)
class ExtractSpec(Spec):
    """``popri audit extract``: discoverable memorisation ("Scalable extraction of training data
    from (production) language models", Nasr et al. 2023, arXiv:2311.17035, section 2; the
    attack of FewFedPIT, arXiv:2403.06131, section 4.3): the model is prompted with a training
    example's prefix and its greedy continuation compared with the true one by Rouge-L."""

    num_examples: int = param(
        100, "Examples attacked, each from a different client (FewFedPIT 4.3: 100); fewer when "
             "the split has fewer clients.", short="-n", lo=1, hi=1_000_000)
    per_client: int = param(
        1, "Examples attacked per client at most (1: distinct clients, FewFedPIT 4.3; more "
           "when a run has few clients).", lo=1, hi=1_000_000)
    prefix_tokens: int = param(
        32, "Text records: the prefix is the first this many tokens (Nasr et al. use 50 of "
            "200); instruction records (instruction/input/output fields) use the prompt as the "
            "prefix and the response as the continuation, as FewFedPIT 4.3.", lo=1)
    suffix_tokens: int = param(
        32, "Tokens of the true continuation compared (and generated, greedily) at most.", lo=1)
    threshold: float = param(
        0.5, "Rouge-L at or above which an example counts as extracted (the 'extracted' "
             "share); the mean Rouge-L is FewFedPIT's figure.", lo=0, hi=1)
    batch_size: int = param(8, "Generation batch size.", lo=1)
    bf16: bool = param(True, "bf16 autocast (CPU: about 2x faster greedy decoding).")
