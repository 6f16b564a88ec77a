"""What a method's recipe, hooks and the shared steps may ask of a run: :class:`RunContext`
(the driver's :class:`popri.pipeline.driver.Run` implements it).

    python -m pytest -q tests/test_api.py tests/test_layers.py -k "toy or context"
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from popri.kit import RunPaths
from popri.privacy.plan import Noise
from popri.specs.run import RunConfig


@runtime_checkable
class RunContext(Protocol):
    """What a method's recipe and hooks may ask of the run (the driver's ``Run`` implements it).

    Data: ``cfg`` (the run's :class:`~popri.specs.run.RunConfig`), ``paths`` (its files,
    ``paths.root`` the run directory), ``release`` (release mode), ``dry_run``, ``select`` (the
    checkpoint selection in effect: private | public | dp | none), ``omega`` /
    ``omega_inputs`` (the public population's path -- a JSONL file or a dataset directory, whose
    train split every command reads by default -- and the files it is) and ``noise`` (the planned :class:`~popri.privacy.plan.Noise` of the DP rounds;
    None while z waits for the client count).  Seeds: the kit's named rules over
    ``cfg.seed`` (:func:`popri.kit.round_seed`, ...)."""

    cfg: RunConfig
    paths: RunPaths
    release: bool
    dry_run: bool
    select: str
    omega: str
    omega_inputs: list[str]

    @property
    def noise(self) -> Noise | None: ...

    def disclosed_clients(self) -> int | None:
        """The private train split's client count N where the method's accounting treats it
        as public (a fixed L of N clients a round: q = L/N is in its ledger; DP-FTRL's blocks:
        floor(N / L) leaves); None where it is private (Poisson sampling, everyone) or not
        fetched yet."""
        ...

    def selection_entries(self, call=None) -> list:
        """The prospective ledger entries of the DP checkpoint selection (dpo.select_on: dp)."""
        ...

    def score_entries(self, t: int, call) -> list:
        """The prospective ledger entry of a score stage, planned from its ``call`` (the
        :class:`~popri.specs.commands.score.ScoreCall` it runs): :func:`popri.methods.steps.score_stage`
        declares it."""
        ...

    @property
    def method(self) -> Any:
        """The run's :class:`~popri.methods.base.Method` (its hooks:
        :meth:`~popri.methods.base.Method.score_settings`, ``control``, ``model_out`` ...)."""
        ...


__all__ = ["RunContext"]
