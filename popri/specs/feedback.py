"""The settings of ``popri score`` (one DP feedback round) and ``popri aggregate`` (its reduction).

    popri score --mode cosine --private runs/priv.npy --synthetic runs/syn.npy \\
        --noise-multiplier 1.05 --clients-per-round 1000 --seed 0 --out runs/scores.npy
    python -m pytest -q tests/test_specs_feedback.py

Papers: POPri = "Private Federated Learning using Preference-Optimized Synthetic Data"
(arXiv:2504.16438); PrE-Text = "PrE-Text: Training Language Models on Private Federated Data in
the Age of LLMs" (arXiv:2406.02958).

The mode-specific settings default to None and are resolved per mode when the spec is built,
so each default is written here once: cosine clip C = 1 and standardize on (POPri 4.1 and its
reference code), every sample of a client; nn-histogram M = 8 samples per client and H = 0
(PrE-Text 3); coverage (issue 67, :mod:`popri.feedback.coverage`) takes neither clip nor H: its
votes are normalised to norm 1, every sample of a client by default.  Giving a setting of the
other mode is an error (build a new spec rather than
``replace`` the mode of a resolved one).  Paths, the seed and the round number are not settings:
they are arguments of :func:`popri.feedback.release.release_scores`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.errors import ConfigError
from popri.core.spec import Spec, param, same
from popri.core.validate import CLIP_MAX, MIN_SAMPLE_RATE
from popri.specs.engine import EngineSpec
from popri.specs.privacy import CONVENTIONS, NoiseSpec

MODES = ("cosine", "nn-histogram", "coverage")
REDUCES = ("mean", "sum")

#: the per-mode defaults (None in the spec = this value for its mode)
COSINE_CLIP = 1.0
COSINE_STANDARDIZE = True
HISTOGRAM_MAX_SAMPLES = 8
HISTOGRAM_THRESHOLD = 0.0


@dataclass(frozen=True)
class ThresholdSpec(Spec):
    """The histogram threshold H, shared by score and aggregate."""

    threshold: float | None = param(
        None, "H in max(x - H, 0), applied after aggregation: nn-histogram only (score: default "
              "0; aggregate: default the H that score recorded).", cite="PrE-Text 3",
        short="-H", lo=0)


@dataclass(frozen=True)
class ScoreSpec(ThresholdSpec, EngineSpec):
    """One round of DP client feedback (``popri score``); where its sum is computed:
    :class:`~popri.specs.engine.EngineSpec`."""

    mode: str = param("cosine", "cosine (POPri), nn-histogram (PE) or coverage (a popri remedy, "
                      "issue 67: each client's samples vote, prompt by prompt, for their nearest "
                      "candidate; votes normalised to L2 norm 1, the sensitivity).",
                      cite="POPri 4.1; PrE-Text 3", choices=MODES)
    noise_multiplier: float | None = same(
        NoiseSpec, "noise_multiplier",
        help="Z: noise std on the sum / sensitivity. 0 = no privacy (warned, still recorded). "
             "Required to score (popri run calibrates it).")
    clip: float | None = param(
        None, f"cosine: L2 clip norm C, the sensitivity (default {COSINE_CLIP:g}).",
        cite="POPri 4.1", lo=0, lo_open=True, hi=CLIP_MAX)
    standardize: bool | None = param(
        None, "cosine: z-score each client's vector before clipping (default on, as the POPri "
              "reference code, meiyuw/POPri client_feedback.py): the norm budget goes to "
              "differences, not a common offset.", cite="POPri 4.1")
    max_samples_per_client: int | None = param(
        None, f"Cap M on samples per client (seeded choice). nn-histogram: default "
              f"{HISTOGRAM_MAX_SAMPLES}, the sensitivity. cosine: default all.",
        cite="PrE-Text 3", short="-M", lo=1)
    sample_rate: float | None = param(
        None, "Poisson client sampling at rate q (exclusive with --clients-per-round): each "
              "client independently; accounted under add/remove one client. Default: every "
              "client.", lo=MIN_SAMPLE_RATE, hi=1)
    clients_per_round: int | None = param(
        None, "Exactly L clients, uniformly without replacement (POPri D.1: 1000). Accounted "
              "under REPLACE one client (an added client would displace another), with the "
              "replace-one sensitivity: the noise std is z 2C (z sqrt(2) M for nn-histogram).",
        cite="POPri D.1", short="-L", lo=1)
    convention: str | None = param(
        None, "papers: with --clients-per-round, record the round as POPri / PrE-Text did "
              "(Poisson at q = L/N under add/remove, noise std z C): NOT a DP guarantee; "
              "'popri account ledger' then totals it only with --convention papers, and says so.",
        choices=CONVENTIONS)
    public_clients: int | None = param(
        None, "cosine: the number of enrolled clients N, which you declare PUBLIC (e.g. the size "
              "of the server's registry): the output is then the mean, the noisy sum divided by "
              "q*N (Poisson) or N (all clients). Without it (and without --clients-per-round) "
              "the output is the noisy sum: the realised client count is private.", lo=1)
    delta: float = param(3e-6, "delta recorded in the ledger.", cite="POPri B.1", lo=0,
                         lo_open=True, hi=1, hi_open=True)
    release: bool = param(
        False, "Secure randomness (os.urandom) for sampling, cap and noise; the seed is then "
               "ignored for them.", envvar="POPRI_RELEASE", negatable=False)
    diagnostic: bool = param(
        False, "Noise-free scores (z = 0) for diagnostics such as the recovery rate: written with "
               "\"diagnostic\": true, \"private\": false and NO ledger entry. Never release them.",
        negatable=False)
    block_size: int | None = param(
        None, "Clients per block for per-client rows (default: ~256 MB of float32).", lo=1)
    federation: str | None = param(
        None, "flower: run the round on a DEPLOYMENT: the SuperLink connection of that name in "
              "$FLWR_HOME/config.toml (docs/flower.md). The private data stay on the "
              "SuperNodes (no --private); each SuperNode is one client; every one of the "
              "--supernodes N takes part (q = 1). Without it: the simulation runtime.")
    #: the settings whose None the spec resolves to the mode's default (``_given``: those given)
    RESOLVED: ClassVar[tuple] = ("clip", "standardize", "threshold", "max_samples_per_client")

    def __post_init__(self) -> None:
        fill = ({"clip": COSINE_CLIP, "standardize": COSINE_STANDARDIZE}
                if self.mode == "cosine" else
                {"max_samples_per_client": HISTOGRAM_MAX_SAMPLES,
                 "threshold": HISTOGRAM_THRESHOLD} if self.mode == "nn-histogram" else {})
        given = {k for k in self.RESOLVED if getattr(self, k) is not None}
        for k, v in fill.items():
            if getattr(self, k) is None:
                object.__setattr__(self, k, v)
        object.__setattr__(self, "_given", frozenset(given))
        super().__post_init__()

    def check(self) -> None:
        if self.sample_rate is not None and self.clients_per_round is not None:
            raise ConfigError("Poisson sampling (--sample-rate) and a fixed count "
                              "(--clients-per-round) are mutually exclusive; give one",
                              field="clients_per_round")
        if self.mode in ("cosine", "coverage") and "threshold" in self._given:
            raise ConfigError("applies to --mode nn-histogram only", field="threshold")
        if self.mode == "coverage":
            for k in ("clip", "standardize"):
                if k in self._given:
                    raise ConfigError("applies to --mode cosine; coverage votes are normalised "
                                      "to L2 norm 1 (the sensitivity)", field=k)
        if self.mode == "nn-histogram":
            for k in ("clip", "standardize"):
                if k in self._given:
                    raise ConfigError("applies to --mode cosine; nn-histogram's sensitivity is "
                                      "--max-samples-per-client", field=k)
        if self.diagnostic:
            if self.release:
                raise ConfigError("writes noise-free scores; it cannot be combined with "
                                  "--release", field="diagnostic")
            if self.noise_multiplier not in (None, 0):
                raise ConfigError("is for noise-free (z = 0) scores; a noisy output is a "
                                  "release and must be recorded in a ledger", field="diagnostic")
        if self.release and self.noise_multiplier == 0:
            raise ConfigError("0 with --release would publish the exact aggregate",
                              field="noise_multiplier")
        if self.mode == "coverage" and self.flower:
            raise ConfigError("coverage is computed in-process only: Flower's SuperNodes "
                              "compute cosine and nn-histogram uploads (use --engine local)",
                              field="mode")
        if self.federation is not None:
            if not self.flower:
                raise ConfigError("is a Flower deployment: add --engine flower",
                                  field="federation")
            if self.supernodes is None:
                raise ConfigError("a deployment round needs --supernodes N, the number of "
                                  "SuperNodes that take part (the server waits for them)",
                                  field="supernodes")
            if self.sample_rate is not None or self.clients_per_round is not None:
                raise ConfigError("a deployment round has every SuperNode take part (q = 1); "
                                  "sampling is not supported there yet", field="sample_rate")
        self.check_engine(release=self.release, diagnostic=self.diagnostic)

    @property
    def sensitivity(self) -> float:
        """One client's L2 contribution bound: C (cosine), M (nn-histogram) or 1 (coverage:
        :mod:`popri.feedback.coverage`), the sum's sensitivity under add/remove; under the
        round's relation: :func:`popri.privacy.relations.round_relation`."""
        if self.mode == "coverage":
            return 1.0
        return float(self.clip if self.mode == "cosine" else self.max_samples_per_client)

    @property
    def nonnegative(self) -> bool:
        """Contributions are non-negative votes (nn-histogram, coverage): a factor sqrt(2)
        under replace one client, not 2."""
        return self.mode in ("nn-histogram", "coverage")


@dataclass(frozen=True)
class AggregateSpec(ThresholdSpec):
    """The server's reduction of per-client uploads (``popri aggregate``)."""

    reduce: str | None = param(
        None, "mean or sum (default: what 'popri score' chose: a cosine mean only over a public "
              "count, else the sum; nn-histogram sums).", cite="POPri 4.1", choices=REDUCES)
    expected_clients: float | None = param(
        None, "Divide the mean by this count, which you declare public, instead.", lo=0,
        lo_open=True)
