"""What a method of ``popri run`` is: a subclass of :class:`Method`, one per package.

    popri run examples/default.yaml --set method=pe --dry-run
    python -m pytest -q tests/test_layers.py::test_the_driver_never_branches_on_a_method_name

The driver (:mod:`popri.pipeline.driver`) is method-agnostic by construction: it calls these
hooks and never asks which method it runs.  A method yields its stages from :meth:`recipe` --
a pure function of the config, the run directory's paths and the calibrated noise, ending by
writing ``run.paths.synthetic`` (or, like DP-FL, by naming the model it trained in
:meth:`model_out`) -- and overrides what differs from a synthetic-text method: where its data
comes from (:meth:`data`, :meth:`embeddings`), who takes part in a DP round
(:meth:`participation`) and what that round spends when it is not a ``popri score`` release
(:meth:`round_entries`), how it is evaluated (:meth:`evaluation`, :meth:`table`), its control
row (:meth:`control`), its per-round metrics and its fields of ``results.json``.

``run`` is the driver's :class:`~popri.pipeline.driver.Run` (``cfg``, ``paths``, ``noise``,
``release`` and the shared stage builders); hooks receive it, this module never imports it.

Adding a method: ``popri/methods/NAME/`` with its steps (``popri`` subcommands) and a
``recipe.py`` defining a subclass, and one line in :mod:`popri.pipeline.recipes`.
"""

from __future__ import annotations

import abc
from typing import Iterable


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

    # ------------------------------------------------------------------ the method's stages
    @abc.abstractmethod
    def recipe(self, run) -> Iterable:
        """The method's stages (``Stage`` objects, built, not run)."""

    # ------------------------------------------------------------------ data
    def data(self, run) -> Iterable:
        """The stages that build the private federated data and Omega, before the noise is
        calibrated (it may depend on the client count).  Default: ``bench fetch`` of both."""
        return run.fetch_text(public=True)

    def embeddings(self, run) -> Iterable:
        """The stages that embed the private splits (the clients' side of the DP feedback).
        Default: the train and validation splits, and Omega when checkpoint selection reads it."""
        return run.embed_private()

    # ------------------------------------------------------------------ privacy
    def score_mode(self, cfg) -> str:
        """The client feedback of the DP rounds, which sets the ledger entries' sensitivity:
        "cosine" (clip C) or "nn-histogram" (M votes)."""
        return cfg.score.mode

    def participation(self, cfg) -> tuple:
        """Who takes part in a DP round: (clients_per_round, sample_rate, the config section
        that sets them)."""
        return cfg.score.clients_per_round, cfg.score.sample_rate, "score"

    def round_entries(self, run, t: int, z: float | None, q: float | None) -> list | None:
        """Round t's prospective ledger entries at noise multiplier z and rate q when the rounds
        are not ``popri score`` releases (the calibration composes them over the rounds); None:
        they are score releases (:meth:`Budget.score_entry`)."""
        return None

    # ------------------------------------------------------------------ evaluation
    def model_out(self, run):
        """The model directory the evaluation reads, for a method that trains the downstream
        model itself (DP-FL); None: the driver trains it on ``run.paths.synthetic``."""
        return None

    def evaluation(self, run) -> Iterable:
        """The evaluation stages.  Default: the downstream model's next-token accuracy next to
        eps = 0, eps = inf and the control row (:meth:`Run.downstream_evaluation`)."""
        return run.downstream_evaluation()

    def control(self, run):
        """The Stage writing the synthetic set of the untuned generator (T = 0) with the same
        prompts, N and seed, for a generator method (issue 24); None: no control row."""
        return None

    def has_control(self) -> bool:
        """Whether this method has a control row (it overrides :meth:`control`)."""
        return type(self).control is not Method.control

    def metrics(self, run) -> list[dict] | None:
        """Per-round rows of ``RUN/metrics.jsonl``; None: the method writes no such file."""
        return None

    def results(self, run, noise: dict) -> dict:
        """The method's own fields of ``results.json``."""
        return {}

    def table(self, r: dict) -> str | None:
        """The results table of a run (markdown), when not the driver's accuracy table."""
        return None

    def shape(self, r: dict) -> str:
        """The results table's title line."""
        return (f"{self.label} on {r['run_dir']}: T={r['rounds']} rounds, K={r['prompts']} x "
                f"J={r['samples_per_prompt']}, N={r['num_synthetic']} synthetic")

    def plan_notes(self, run) -> list[str]:
        """Lines of the dry-run plan's header."""
        return []

    def __repr__(self) -> str:
        return f"<method {self.name}>"
