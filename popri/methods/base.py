"""What a method of ``popri run`` is: a subclass of :class:`Method`, one per package, and what it
may ask of the run it builds stages for: :class:`RunContext`.

    popri run examples/default.yaml --set method=pe --dry-run
    python -m pytest -q tests/test_layers.py tests/test_api.py::test_a_new_method_is_one_recipe_entry

The driver (:mod:`popri.pipeline.driver`) is method-agnostic by construction: it calls these
hooks and never asks which method it runs.  A method yields its stages from :meth:`recipe` --
a pure function of the config, the run directory's paths and the planned noise, ending by
writing ``run.paths.synthetic`` (or, like DP-FL, by naming the model it trained in
:meth:`model_out`) -- and overrides what differs from a synthetic-text method: where its data
comes from (:meth:`data`, :meth:`embeddings`), who takes part in a DP round
(:meth:`participation`), what bounds one client's part of it (:meth:`round_spec`) and what that
round spends when it is not a ``popri score`` release (:meth:`round_entries`), how it is
evaluated (:meth:`evaluation`, :meth:`table`), its control row (:meth:`control`), its
per-round metrics and its fields of ``results.json``.

``run``, in every hook, is a :class:`RunContext`: the few typed things a recipe may use --
``cfg``, ``paths``, ``release``, ``dry_run``, the planned ``noise``, the public data's
arguments, the shared stage builders and, only where the method's accounting makes it public,
the client count.  The driver's ``Run`` implements it; this module never imports the driver,
and no method reads anything of the run but these members (``tests/test_layers.py`` walks
their code).  Stages are built with the recipe kit, :mod:`popri.kit`.

Adding a method: ``popri/methods/NAME/`` with its steps (``popri`` subcommands) and a
``recipe.py`` defining a subclass, and one line in :mod:`popri.pipeline.recipes`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from popri.kit import Stage, readback
from popri.methods import steps
from popri.methods.context import RunContext
from popri.privacy.plan import Noise
from popri.specs.engine import EngineSpec
from popri.specs.feedback import ScoreSpec


@dataclass(frozen=True)
class RoundPanels:
    """A method's figure of per-round values in ``popri report``: the rows (one per round,
    ``round`` and the plotted keys), the panels (``popri.report.figures.panels``' spec: a
    title, a y label and lines (key, se key, label[, n key, unit]) each, optional ``hline`` and
    ``ylim``), the figure's file suffix, title, caption and suptitle; ``private``: exact client
    statistics, never in a release-mode report."""

    rows: list
    panels: list
    name: str
    title: str
    caption: str
    suptitle: str
    private: bool = True


class Method(abc.ABC):
    """One method of ``popri run``.  Class attributes describe it; methods are its hooks."""

    #: the config's ``method`` value
    name: str = ""
    #: its row in the results table
    label: str = ""
    #: one line for ``popri run --help`` and the docs
    summary: str = ""
    #: False for a method without a DP guarantee (FewFedPIT): no calibration and no budget
    #: (the config must say privacy.epsilon: null); its ledger entries total eps = inf
    dp: bool = True
    #: builds preference pairs from the DP scores (best vs the dpo.rejected_rank-th of J per
    #: prompt): the config checks dpo.rejected_rank <= samples_per_prompt
    pairs: bool = False
    #: tunes with DPO and selects its checkpoint (dpo.select_on / select_checkpoint)
    selects: bool = False
    #: what the method releases: "text" (a synthetic set) or "model" (DP-FL, FewFedPIT); the
    #: report shows samples of a text method only
    releases: str = "text"
    #: how the clients' data reach the released text, for the report's samples page
    feedback: str = "the DP releases recorded in its ledger"
    #: its colour in every figure of the report (fixed: a method keeps it across reports; ""
    #: a stable colour from its name)
    colour: str = ""
    #: its name in the report's figures and tables ("": :attr:`label`)
    figure_label: str = ""
    #: the report's name for a run directory of a variant of this method: {key: (label,
    #: colour)} (e.g. POPri with the nearest-neighbour histogram)
    variants: dict = {}
    #: it writes ``num_synthetic`` samples (the report's method cell says N)
    writes_synthetic: bool = True

    # ------------------------------------------------------------------ the method's stages
    @abc.abstractmethod
    def recipe(self, run: RunContext) -> Iterable[Stage]:
        """The method's stages (:class:`~popri.kit.Stage` objects, built, not run)."""

    # ------------------------------------------------------------------ data
    def data(self, run: RunContext) -> Iterable[Stage]:
        """The stages that build the private federated data and Omega, before the noise is
        calibrated (it may depend on the client count).  Default: ``bench fetch`` of both."""
        return steps.fetch_text(run, public=True)

    def embeddings(self, run: RunContext) -> Iterable[Stage]:
        """The stages that embed the private splits (the clients' side of the DP feedback).
        Default: the train and validation splits, and Omega when checkpoint selection reads it."""
        return steps.embed_private(run)

    # ------------------------------------------------------------------ privacy
    def score_mode(self, cfg) -> str:
        """The client feedback of the DP rounds, which sets the ledger entries' sensitivity:
        "cosine" (clip C), "nn-histogram" (M votes) or "coverage" (norm 1)."""
        return cfg.score.mode

    def participation(self, cfg) -> tuple:
        """Who takes part in a DP round: (clients_per_round, sample_rate, the config section
        that sets them)."""
        return cfg.score.clients_per_round, cfg.score.sample_rate, "score"

    def clients_public(self, cfg) -> bool:
        """Does the method's accounting make the private train split's client count N public?
        Default: a fixed L of N clients a round (no sample rate), whose q = L/N is in every
        round's ledger entry.  Where it is private, a recipe gets nothing that reveals it
        (:meth:`RunContext.disclosed_clients` is None)."""
        cpr, rate, _ = self.participation(cfg)
        return bool(cpr) and not rate

    def score_settings(self, cfg, *, mode: str | None = None,
                       threshold: float | str | None = None) -> dict:
        """``popri score``'s settings from the run's score section (and privacy.delta,
        privacy.convention, release): the ONE builder of what a round's score stage is given
        (:func:`popri.methods.steps.score_call` adds its paths, seed and z) and of the
        round's spec the budget calibrates with (:meth:`round_spec`).  ``mode``: default
        :meth:`score_mode`; ``threshold``: default score.threshold (nn-histogram; a string is a
        dry run's placeholder)."""
        sc, mode = cfg.score, mode or self.score_mode(cfg)
        # coverage (issue 67): every sample of a client votes, normalised to norm 1: no setting
        own = ({"clip": sc.clip, "standardize": sc.standardize} if mode == "cosine" else
               {} if mode == "coverage" else
               {"max_samples_per_client": sc.max_samples_per_client,
                "threshold": sc.threshold if threshold is None else threshold})
        return dict(mode=mode, delta=cfg.privacy.delta, clients_per_round=sc.clients_per_round,
                    sample_rate=sc.sample_rate, public_clients=sc.public_clients,
                    convention=cfg.privacy.convention, release=bool(cfg.release), **own,
                    **EngineSpec.of(sc).to_dict())

    def round_spec(self, cfg):
        """The spec of one DP round, whose bound on a client's contribution (its
        ``sensitivity``: C, or M votes), ``nonnegative`` and ``convention`` set the round's
        relation and sensitivity (:meth:`popri.privacy.plan.Noise.of_round`), and whose engine
        its mechanism.  Default: ``popri score``'s :class:`~popri.specs.feedback.ScoreSpec`
        from :meth:`score_settings`, the settings its stages are given."""
        return ScoreSpec(**self.score_settings(cfg))

    def round_entries(self, cfg, t: int, noise: Noise, clients: int | None) -> list | None:
        """Round t's prospective ledger entries with ``noise`` (z, q and the round's relation;
        the calibration composes them over the rounds at every z it tries) when the rounds are
        not ``popri score`` releases; ``clients``: N where the accounting makes it public
        (:meth:`RunContext.disclosed_clients`).  None: they are score releases (the budget plans
        them with ``noise.entry``)."""
        return None

    # ------------------------------------------------------------------ the report
    def metrics_from_files(self, run_dir: Path, results: dict | None, notes: list[str], *,
                           release: bool) -> list[dict]:
        """The rows of RUN/metrics.jsonl (docs/formats.md) rebuilt from the stages' files, for
        a run of this method without one (earlier versions): what ``popri report`` plots per
        round.  Default: the kit's steps' files (:func:`popri.kit.readback.metrics_from_files`:
        probe, released scores, preference pairs, DPO / SFT)."""
        return readback.metrics_from_files(run_dir, results, notes, release=release)

    def round_panels(self, run_dir: Path, results: dict | None) -> RoundPanels | None:
        """A figure of the method's own per-round values for ``popri report`` (DP-FL: the
        clients' local loss and update norms), or None (default: none)."""
        return None

    # ------------------------------------------------------------------ evaluation
    def model_out(self, run: RunContext):
        """The model directory the evaluation reads, for a method that trains the downstream
        model itself (DP-FL); None: the driver trains it on ``run.paths.synthetic``."""
        return None

    def evaluation(self, run: RunContext) -> Iterable[Stage]:
        """The evaluation stages.  Default: the downstream model's next-token accuracy next to
        eps = 0, eps = inf and the control row (:func:`popri.methods.steps.downstream_evaluation`)."""
        return steps.downstream_evaluation(run)

    def control(self, run: RunContext) -> Stage | None:
        """The Stage writing the synthetic set of the untuned generator (T = 0) with the same
        prompts, N and seed, for a generator method (issue 24); None: no control row."""
        return None

    def has_control(self) -> bool:
        """Whether this method has a control row (it overrides :meth:`control`)."""
        return type(self).control is not Method.control

    def metrics(self, run: RunContext) -> list[dict] | None:
        """Per-round rows of ``RUN/metrics.jsonl``; None: the method writes no such file."""
        return None

    def results(self, run: RunContext, noise: Noise | None) -> dict:
        """The method's own fields of ``results.json`` (``noise``: the run's planned noise)."""
        return {}

    def table(self, r: dict) -> str | None:
        """The results table of a run (markdown), when not the driver's accuracy table."""
        return None

    def shape(self, r: dict) -> str:
        """The results table's title line."""
        return (f"{self.label} on {r['run_dir']}: T={r['rounds']} rounds, K={r['prompts']} x "
                f"J={r['samples_per_prompt']}, N={r['num_synthetic']} synthetic")

    def plan_notes(self, run: RunContext) -> list[str]:
        """Lines of the dry-run plan's header."""
        return []

    def __repr__(self) -> str:
        return f"<method {self.name}>"
