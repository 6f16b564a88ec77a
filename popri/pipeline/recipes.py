"""The methods ``popri run`` knows: one table, one entry per method.

    popri run examples/default.yaml --set method=pe --dry-run

A method is a *recipe* -- ``recipe(run) -> Iterator[Stage]``, a pure function of the config,
the run directory's paths and the calibrated noise that yields the method's stages and ends by
writing ``run.paths.synthetic`` -- plus a few hooks the method-agnostic driver
(:mod:`popri.pipeline.driver`) calls: which client feedback the DP rounds use (its
sensitivity), the method's fields of ``results.json``, its line in the results table and its
notes in a dry-run plan.  The driver does the rest for every method: data, calibration, the
budget guard of every stage that declares a DP release (``Stage.release``), caching,
evaluation against eps = 0 / eps = inf, and the ledger total.

Adding a method: write ``popri/methods/NAME/`` (its steps, as ``popri`` subcommands, and
``recipe.py``) and add one :class:`Method` entry below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from popri.core.errors import ConfigError


def _no_results(run, noise) -> dict:
    return {}


def _no_notes(run) -> list[str]:
    return []


@dataclass(frozen=True)
class Method:
    name: str
    label: str                                            # in the results table
    recipe: Callable[..., Iterable]                       # recipe(run) -> Iterator[Stage]
    # the client feedback of the DP rounds: "cosine" (POPri) | "nn-histogram" (PE); sets the
    # sensitivity of the ledger entries (clip C, or M votes)
    score_mode: Callable[..., str] = field(default=lambda cfg: cfg.score.mode)
    results: Callable[..., dict] = _no_results            # results(run, noise) -> extra fields
    plan_notes: Callable[..., list] = _no_notes           # plan_notes(run) -> dry-run lines
    shape: Callable[[dict], str] | None = None            # shape(results) -> table title
    summary: str = ""
    # who takes part in a DP round: participation(cfg) -> (clients_per_round, sample_rate,
    # the config section that sets them)
    participation: Callable[..., tuple] = field(
        default=lambda cfg: (cfg.score.clients_per_round, cfg.score.sample_rate, "score"))
    # the prospective ledger entries of round t at noise multiplier z and rate q, when the
    # rounds are not 'popri score' releases: round_entries(run, t, z, q) -> [LedgerEntry]
    # (the calibration composes them over the rounds)
    round_entries: Callable[..., list] | None = None
    # a method that trains the downstream model itself (DP-FL) instead of writing a synthetic
    # set: model_out(run) -> the model directory the evaluation reads
    model_out: Callable[..., object] | None = None
    # whether the data stages fetch the public Omega and embed the private train / val splits
    # (the synthetic-data methods; DP-FL reads the private texts only)
    embeds: bool = True
    # False for a method without a DP guarantee (FewFedPIT): no calibration, no budget (the
    # config must say privacy.epsilon: null), its ledger entries total eps = inf
    dp: bool = True
    # "text": 'bench fetch' builds the private data (and Omega); "instruct": 'instruct build'
    data_kind: str = "text"
    # the evaluation stages, when not the downstream model's next-token accuracy:
    # evaluation(run) -> Iterator[Stage]; and the results table of such a run
    evaluation: Callable[..., Iterable] | None = None
    table: Callable[[dict], str] | None = None
    # a generator method's control (issue 24): control(run) -> the Stage writing the synthetic
    # set of the untuned generator (T = 0) with the same prompts, N and seed; the driver trains
    # and evaluates it next to the method and reports the paired difference
    control: Callable[..., object] | None = None
    # per-round rows of RUN/metrics.jsonl: metrics(run) -> [dict]
    metrics: Callable[..., list] | None = None
    # the method builds preference pairs from the DP scores (best vs dpo.rejected_rank-th of J
    # per prompt): the config checks dpo.rejected_rank <= samples_per_prompt
    pairs: bool = False
    # the method tunes with DPO and selects its checkpoint (dpo.select_on / select_checkpoint)
    selects: bool = False

    def __post_init__(self):
        if self.shape is None:
            object.__setattr__(self, "shape", lambda r, label=self.label: (
                f"{label} on {r['run_dir']}: T={r['rounds']} rounds, K={r['prompts']} x "
                f"J={r['samples_per_prompt']}, N={r['num_synthetic']} synthetic"))


def _methods() -> dict[str, Method]:
    from popri.methods.dpfl import recipe as dpfl
    from popri.methods.fewfedpit import recipe as ffp
    from popri.methods.pe import recipe as pe
    from popri.methods.popri import recipe as popri

    return {m.name: m for m in (
        Method("popri", "POPri", popri.recipe, results=popri.results,
               plan_notes=popri.plan_notes, control=popri.control_stage,
               metrics=popri.round_metrics, pairs=True, selects=True,
               summary="POPri: T rounds of gen, DP scores, preference pairs, DPO; then N samples"),
        Method("pe", "PE (PrE-Text)", pe.recipe, score_mode=lambda cfg: "nn-histogram",
               results=pe.results, shape=pe.shape,
               summary="PrE-Text: T rounds of DP nearest-neighbour votes, draws, variations; "
                       "then Expand"),
        Method("pe-sft", "PE+SFT", popri.recipe_sft, results=popri.results_sft,
               control=popri.control_stage, metrics=popri.round_metrics, pairs=True,
               summary="POPri's PE+SFT baseline: SFT on each prompt's top-scored sample"),
        *(Method(f"dp-{a}", label, dpfl.recipe, results=dpfl.results, shape=dpfl.shape,
                 plan_notes=dpfl.plan_notes, participation=dpfl.participation,
                 round_entries=dpfl.round_entries, model_out=dpfl.model_out, embeds=False,
                 summary=summary)
          for a, label, summary in (
              ("fedavg", "DP-FedAvg", "DP-FedAvg (POPri C.1): T rounds of clipped client "
                                      "updates of the downstream model + Gaussian noise"),
              ("ftrl", "DP-FTRL", "DP-FTRL (POPri C.2): T rounds, tree-aggregation noise on "
                                  "the prefix sums, a tree per epoch (TreeRestart), server "
                                  "momentum 0.9"))),
        *(Method(m, ffp.LABELS[m], ffp.recipe, results=ffp.results, shape=ffp.shape,
                 participation=ffp.participation, round_entries=ffp.round_entries,
                 model_out=ffp.model_out, embeds=False, dp=False, data_kind="instruct",
                 evaluation=ffp.evaluation, table=ffp.table, summary=summary)
          for m, summary in (
              ("fewfedpit", "FewFedPIT (arXiv:2403.06131): T rounds of private training, "
                            "self-generation + IFS, synthetic training, beta mixing; no DP"),
              ("fedit", "FedIT: FedAvg of LoRA instruction tuning (FewFedPIT at beta = 1); "
                        "no DP"),
              ("fedmit", "FedMIT (FewFedPIT 4.3): self-generated and private data mixed in one "
                         "model; no DP"))),
    )}


METHODS: dict[str, Method] = _methods()


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"must be one of {', '.join(METHODS)} (got {name!r})",
                          field="method") from None
