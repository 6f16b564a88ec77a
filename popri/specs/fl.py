"""The settings of one DP federated-learning round (``popri fl round``): DP-FedAvg and DP-FTRL,
the DP federated-learning baselines that "Private Federated Learning using
Preference-Optimized Synthetic Data" (POPri, arXiv:2504.16438) compares against (section 4,
appendix C.1 DP-FedAvg, C.2 DP-FTRL, D.1 the noise multipliers).

    popri fl round --data runs/x/data/private --round 1 --algorithm fedavg -z 1.2 --out runs/x/fl/round1

- DP-FedAvg: McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent
  Language Models" (ICLR 2018, arXiv:1710.06963), Algorithm 1: clients sampled per round, each
  trains locally from the global weights, its update clipped to L2 norm C, the server adds
  N(0, z^2 C^2) to the sum and divides by the expected number of clients.
- DP-FTRL: Kairouz, McMahan, Song, Thakkar, Thakurta, Xu, "Practical and Private (Deep)
  Learning without Sampling or Shuffling" (ICML 2021, arXiv:2103.00039), section 3 and
  appendix (DP-FTRLM): tree-aggregation noise on the prefix sums of the clipped updates, heavy
  ball server momentum 0.9 (PrE-Text D.2, for both baselines), the tree restarted every epoch
  with each client in at most one round of it (TreeRestart, appendix D): ``assignment: bins``
  (each client independently to one of R public rounds; add/remove one client) or ``blocks``
  (floor(N / L) blocks of a permutation, the paper's; zero-out one client).

Pure Python (no torch / numpy import).
"""

from __future__ import annotations

from dataclasses import dataclass

from popri.core.errors import ConfigError
from popri.core.spec import param, same
from popri.specs.engine import EngineSpec
from popri.specs.feedback import ScoreSpec
from popri.specs.privacy import NoiseSpec
from popri.specs.training import LoraSpec, PrecisionSpec, SequenceSpec

ALGORITHMS = ("fedavg", "ftrl")
RESTARTS = ("epoch", "round")
#: how an epoch's clients are assigned to its rounds (leaves): independently (bins, add/remove)
#: or as blocks of a permutation (blocks, zero-out: Kairouz et al., POPri Table 3)
ASSIGNMENTS = ("bins", "blocks")


@dataclass(frozen=True)
class FLSpec(SequenceSpec, PrecisionSpec, LoraSpec, EngineSpec):
    """One round of DP-FedAvg / DP-FTRL on a LoRA adapter (CPU default) or the full model."""

    algorithm: str = param("fedavg", "fedavg (DP-FedAvg, Gaussian noise) | ftrl (DP-FTRL, "
                           "tree-aggregation noise on the prefix sums, server momentum).",
                           cite="POPri C.1, C.2", choices=ALGORITHMS)
    restart: str = param("epoch", "ftrl: restart the tree every epoch, each client in at most "
                         "one round (leaf) of it: Kairouz et al.'s TreeRestart (see "
                         "--assignment). 'round': a one-leaf tree every round on a fresh "
                         "sample (DP-SGD with momentum, no amplification).",
                         cite="Kairouz et al. 2021 (arXiv:2103.00039) appendix D",
                         choices=RESTARTS)
    assignment: str = param(
        "bins", "ftrl, restart epoch: how an epoch's clients go to its rounds. bins (default): "
                "each client independently to one of --epoch-rounds R rounds (its own seeded "
                "draw), so an added client moves no other: the tree holds under add/remove one "
                "client, sensitivity C. blocks: a random permutation cut into floor(N / L) "
                "blocks of --clients-per-round L (the rest sit the epoch out), as Kairouz et al. "
                "and POPri Table 3: an added client takes a slot and pushes another out, so the "
                "tree holds under ZERO-OUT one client (replace a client's data by the zero "
                "record), which is what the ledger says.", choices=ASSIGNMENTS)
    epoch_rounds: int | None = param(
        None, "ftrl, restart epoch, assignment bins: R, the rounds of an epoch (the tree's "
              "leaves); about N / R clients take part in each (default 1: every client every "
              "round). A public setting: R = floor(N / L) would reveal N.", lo=1)
    clip: float = param(0.01, "L2 clip C of a client's model update (POPri C.1 searches "
                        "[0.01, 0.4]; on sotu at eps = 1, 10 of 100 clients per round, the C.1 "
                        "search picked 0.01 over 0.1 for both methods by validation accuracy: "
                        "with every update clipped, C sets the step and the noise together).",
                        cite="POPri C.1", lo=0, lo_open=True, hi=1e6)
    client_lr: float = param(0.05, "Client SGD learning rate (POPri C.1 searches [0.01, 0.06]).",
                             cite="POPri C.1", lo=0, lo_open=True, hi=10)
    local_epochs: int = param(1, "Local epochs over the client's texts per round.", lo=1,
                              hi=1000)
    client_batch_size: int = param(2, "Client batch size.", cite="POPri C.1", lo=1)
    server_lr: float | None = param(None, "Server learning rate on the averaged noisy update "
                                    "(default: 1 - momentum, so that every method takes the same "
                                    "long-run step: 0.1 at the default momentum 0.9).", lo=0,
                                    lo_open=True, hi=100)
    momentum: float | None = param(None, "Server heavy-ball momentum (default 0.9 for both "
                                   "baselines, PrE-Text D.2's setting for DP-FedAvg and DP-FTRL; "
                                   "POPri C.1/C.2 give none).", cite="PrE-Text D.2", lo=0, hi=1,
                                   hi_open=True)
    lora: bool = param(True, "Train a LoRA adapter (the CPU default: ~1.2M numbers per update "
                       "for SmolLM2-135M at r = 4) or the full model (the paper's DistilGPT2 "
                       "setting: --full).", negatable=False)
    max_samples_per_client: int | None = param(None, "Use at most this many of a client's "
                                               "texts per round (seeded).", lo=1)
    noise_multiplier: float | None = same(
        NoiseSpec, "noise_multiplier",
        help="z: the noise std is z C (a tree node's, for ftrl); popri run calibrates it to the "
             "budget.")
    clients_per_round: int | None = same(ScoreSpec, "clients_per_round")
    sample_rate: float | None = same(ScoreSpec, "sample_rate")
    convention: str | None = same(ScoreSpec, "convention")
    public_clients: int | None = param(
        None, "N_pub: the enrolled clients, declared PUBLIC -- a number you state, never one "
              "computed from the clients' data. The round's noisy sum of updates is divided by "
              "q N_pub (Poisson; DP-FTRL bins: N_pub / R; everyone: N_pub), McMahan et al.'s "
              "fixed-denominator estimator (arXiv:1710.06963, section 2); an estimate only "
              "scales the step. Needed unless a fixed --clients-per-round L is the divisor. "
              "Release mode on Flower (distributed discrete Gaussian): also the upper bound on "
              "a round's participants that sizes the secure aggregation plan.", lo=1)
    delta: float = same(ScoreSpec, "delta")
    release: bool = same(ScoreSpec, "release")

    @property
    def federation(self) -> None:
        """A deployed federation is not supported for DP-FL rounds (simulation only)."""
        return None

    def server_lr_value(self) -> float:
        if self.server_lr is not None:
            return float(self.server_lr)
        return 1.0 - self.momentum_value()

    def momentum_value(self) -> float:
        if self.momentum is not None:
            return float(self.momentum)
        return 0.9

    def check(self) -> None:
        super().check()
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"must be one of {', '.join(ALGORITHMS)} (got {self.algorithm!r})",
                              field="algorithm")
        if self.clients_per_round is not None and self.sample_rate is not None:
            raise ConfigError("give clients_per_round or sample_rate, not both",
                              field="sample_rate")
        self.check_engine(release=self.release)
        if self.release and self.noise_multiplier == 0:
            raise ConfigError("0 with --release would publish the exact sum of the updates",
                              field="noise_multiplier")
        if self.epoch_trees:
            if self.sample_rate is not None:
                raise ConfigError("DP-FTRL's epoch-wise participation assigns every client to "
                                  "one round of the epoch, not a Poisson sample (tree "
                                  "aggregation gets no amplification by sampling): "
                                  "--assignment bins --epoch-rounds R, or --restart round",
                                  field="sample_rate")
            if self.assignment == "bins":
                if self.clients_per_round is not None:
                    raise ConfigError("--assignment bins assigns each client to one of "
                                      "--epoch-rounds rounds; --clients-per-round is for "
                                      "--assignment blocks", field="clients_per_round")
            elif self.epoch_rounds is not None:
                raise ConfigError("applies to --assignment bins (blocks make floor(N / L) "
                                  "rounds an epoch)", field="epoch_rounds")
        if self.algorithm == "ftrl" and self.flower and self.restart == "epoch":
            raise ConfigError("DP-FTRL on Flower restarts the tree every round (the SuperNodes' "
                              "noise shares are one release each): add --restart round",
                              field="restart")

    @property
    def sensitivity(self) -> float:
        """One client's L2 contribution bound: the clip C of its update, the sum's sensitivity
        under add/remove; under the round's relation:
        :func:`popri.privacy.relations.round_relation`."""
        return float(self.clip)

    @property
    def nonnegative(self) -> bool:
        """Updates are vectors in the C-ball, not non-negative votes: 2C under replace."""
        return False

    @property
    def epoch_trees(self) -> bool:
        """DP-FTRL with a tree per epoch (TreeRestart) and epoch-wise participation."""
        return self.algorithm == "ftrl" and self.restart == "epoch"

    @property
    def tree_relation(self) -> str:
        """The relation an epoch tree is accounted under: add/remove one client with bins (an
        added client moves no other), zero-out one client with blocks."""
        return ("add/remove one client" if self.assignment == "bins" else
                "zero-out one client")
