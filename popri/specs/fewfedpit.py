"""The settings of FewFedPIT's client stages (``popri fewfedpit local | selfgen | train | mix``)
and of the server average (``aggregate``).

    popri fewfedpit local --data data/instruct-debian --client C --round 1 --out runs/f/r1/C/local

"FewFedPIT: Towards Privacy-preserving and Few-shot Federated Instruction Tuning"
(arXiv:2403.06131): section 3 (Algorithm 1), settings in 4.1 and appendix A (LLaMA-2-7B int8,
LoRA r = 16, 1 local epoch, 2 clients per round, AdamW, batch 8, lr in {3e-4, 2e-3} with a
cosine schedule over the rounds, 32 self-generated candidates of which IFS keeps 16, beta = 0.5).
The CPU defaults shrink the model (SmolLM2-135M), the rank and the generation lengths, and say
so in each field.

Pure Python (no torch / numpy import).
"""

from __future__ import annotations

from dataclasses import dataclass

from popri.core.errors import ConfigError
from popri.core.spec import param, same
from popri.specs.privacy import NoiseSpec
from popri.specs.training import LoraSpec, PrecisionSpec

#: what a sampled client does (FewFedPIT 4.3's baselines): fewfedpit = Algorithm 1; fedit =
#: private training only (beta = 1, FedAvg on LoRA: Zhang et al. 2023, arXiv:2305.05644);
#: fedmit = self-generation, then one model trained on private + synthetic data mixed
MODES = ("fewfedpit", "fedit", "fedmit")


@dataclass(frozen=True)
class FewFedPITSpec(PrecisionSpec, LoraSpec):
    """A FewFedPIT client round and the server's weighted average."""

    mode: str = param("fewfedpit", "fewfedpit (Algorithm 1) | fedit (private training only, "
                      "beta = 1) | fedmit (one model on private + synthetic data mixed).",
                      cite="FewFedPIT 4.3", choices=MODES)
    beta: float = param(0.5, "Local aggregation sharing: the client uploads beta W^l + (1 - "
                        "beta) W^g (1 = FedIT; lower = less private signal uploaded).",
                        cite="FewFedPIT 3.4, 4.1", lo=0, hi=1)
    lr: float = param(2e-3, "Peak AdamW learning rate (paper: 3e-4 or 2e-3).",
                      cite="FewFedPIT A", lo=0, lo_open=True, hi=1)
    rounds: int = param(3, "R, the rounds the cosine schedule spans (lr_r = lr (1 + cos(pi (r - "
                        "1) / R)) / 2); the issue's CPU run: 3 (paper: 10-30).",
                        cite="FewFedPIT A", lo=1, hi=100_000)
    local_epochs: int = param(1, "Local epochs of each training step.", cite="FewFedPIT 4.1",
                              lo=1, hi=1000)
    batch_size: int = param(8, "Examples per AdamW step.", cite="FewFedPIT 4.1", lo=1)
    max_length: int = param(256, "Tokens per example (prompt + response + EOS) at most; the "
                            "prompt is cut from the left.", lo=8)
    candidates: int = param(32, "2M: novel instructions generated per client round.",
                            cite="FewFedPIT 4.1", lo=1, hi=100_000)
    keep: int = param(16, "M: candidates the IFS filter keeps.", cite="FewFedPIT 4.1", lo=1,
                      hi=100_000)
    demos: int = param(8, "Local instructions shown to generate new ones.",
                       cite="FewFedPIT 3.3", lo=1, hi=64)
    io_shots: int = param(4, "Demonstrations of the input + response prompt (alternately with "
                          "and without an input).", cite="FewFedPIT 3.3", lo=1, hi=32)
    retries: int = param(3, "Tries (fresh demonstrations each) for a compliant input + "
                         "response before an instruction is dropped.", cite="FewFedPIT 3.3",
                         lo=1, hi=100)
    instruction_prompts: int = param(12, "Instruction-generation prompts tried at most per "
                                     "client round (each continues a numbered list; greedy "
                                     "decoding needs fresh demonstrations for new items).",
                                     lo=1, hi=10_000)
    rouge_threshold: float = param(0.7, "Rouge-L above which a generated instruction or sample "
                                   "counts as a copy of local data.", cite="FewFedPIT 3.3",
                                   lo=0, hi=1)
    instruction_tokens: int = param(96, "New tokens per instruction-generation prompt.", lo=1)
    response_tokens: int = param(128, "New tokens per input + response generation.", lo=1)
    clip: float | None = param(None, "popri extension, not in the paper: clip the mixed "
                               "update W^a - W^g_{r-1} to this L2 norm before upload (needed for "
                               "--noise-multiplier).", lo=0, lo_open=True, hi=1e6)
    noise_multiplier: float = same(
        NoiseSpec, "noise_multiplier", 0.0,
        help="popri extension: Gaussian noise z * clip on the sum of the clipped updates, "
             "ledgered (subsampled_gaussian); 0 = none, and then FewFedPIT has no DP guarantee "
             "(eps = inf).")

    def check(self) -> None:
        if self.keep > self.candidates:
            raise ConfigError(f"is above candidates ({self.keep} > {self.candidates}): the IFS "
                              "filter keeps M of the 2M", field="keep")
        if self.noise_multiplier > 0 and self.clip is None:
            raise ConfigError("needs --clip: the noise is z * C on clipped updates",
                              field="noise_multiplier")

    @property
    def sensitivity(self) -> float:
        """One client's L2 contribution bound: the clip of its mixed update (1 when unclipped:
        the noise-free aggregate records it but adds nothing), the sum's sensitivity under
        add/remove; under the round's relation: :func:`popri.privacy.relations.round_relation`."""
        return float(self.clip) if self.clip is not None else 1.0

    @property
    def nonnegative(self) -> bool:
        return False

    @property
    def convention(self) -> None:
        """FewFedPIT's rounds take no accounting convention (always a DP claim, or none)."""
        return None

    def lr_at(self, round_: int) -> float:
        """The cosine schedule over the rounds (round 1: lr; round R + 1 would be 0)."""
        import math

        r = min(max(round_, 1), self.rounds)
        return self.lr * 0.5 * (1.0 + math.cos(math.pi * (r - 1) / self.rounds))

    def beta_value(self) -> float:
        """beta as uploaded: 1 for fedit and fedmit (one model, nothing to mix)."""
        return 1.0 if self.mode in ("fedit", "fedmit") else self.beta
