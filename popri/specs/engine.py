"""Where a round's sum is computed, and so which DP mechanism releases it: one engine object.

    popri score ... --engine flower --supernodes 4 --secagg-mechanism ddg
    popri fl round ... --engine flower --supernodes 3
    python -m pytest -q tests/test_engine.py

Three engines, one spec (:class:`EngineSpec`, a mixin of ``popri score``'s
:class:`~popri.specs.feedback.ScoreSpec` and ``popri fl round``'s :class:`~popri.specs.fl.FLSpec`,
so each setting is declared here once):

- **in-process** (``engine: inprocess``): this process sums the clipped client vectors and adds
  Gaussian noise once, on the sum;
- **Flower simulation** (``engine: flower``): virtual SuperNodes on Flower's simulation runtime
  sum their clients' vectors plus a noise share each, and SecAgg+ reveals only the total;
- **Flower deployment** (``engine: flower`` with ``federation``, ``popri score`` only): the same
  on real SuperNodes (docs/flower.md).

The engine owns its mechanism choice (:meth:`EngineSpec.mechanism`): the distributed discrete
Gaussian on Flower with ``secagg_mechanism: ddg`` (Kairouz, Liu, Steinke, "The Distributed
Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation", arXiv:2102.06387),
the Gaussian otherwise -- and for DP-FTRL in-process, tree aggregation.
:func:`popri.privacy.entries.round_release` turns that choice into the round's ledger entry, for
the budget's plan and for the release's record alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from popri.core.errors import ConfigError
from popri.core.spec import Spec, param

#: where the round's sum is computed: in this process, or on Flower with SecAgg+ (issue 12)
ENGINES = ("inprocess", "flower")
#: the noise of a Flower round: distributed discrete Gaussian, or Flower's float Gaussian path
SECAGG_MECHANISMS = ("ddg", "gaussian")
#: the engine's settings besides ``engine`` (what a stage passes on when not in-process)
FLOWER_FIELDS = ("supernodes", "secagg_mechanism", "max_dropout", "flower_timeout")


@dataclass(frozen=True)
class EngineSpec(Spec):
    """The engine of a DP round: in-process, Flower simulation or Flower deployment."""

    engine: str = param(
        "inprocess", "Where the round's sum is computed: inprocess (fast, one process) or flower "
                     "(Flower's simulation runtime: SuperNodes, SecAgg+; pip install "
                     "'popri[flower]'; docs/flower.md).", choices=ENGINES)
    supernodes: int | None = param(
        None, "flower: virtual SuperNodes the participants are spread over (participant i on "
              "node i mod N; default min(L, 10)); at least 3.", lo=3, hi=100_000)
    secagg_mechanism: str = param(
        "ddg", "flower: the noise behind SecAgg+: ddg, the distributed discrete Gaussian "
               "(integer uploads, formally DP after quantisation and the modular sum; "
               "Kairouz-Liu-Steinke, arXiv:2102.06387), or gaussian (Flower's float path, "
               "research mode only).", choices=SECAGG_MECHANISMS)
    max_dropout: float = param(
        0.1, "flower: the fraction of SuperNodes that may drop out mid-round. Sets SecAgg+'s "
             "reconstruction threshold and scales each node's noise for the fewest survivors; "
             "the ledger records the noise of those who did survive.", lo=0, hi=0.5,
        hi_open=True)
    flower_timeout: float = param(
        900.0, "flower: seconds before the round (start-up included) is abandoned and its "
               "processes killed.", lo=1, hi=86_400)

    @classmethod
    def of(cls, section: object) -> "EngineSpec":
        """The engine of a config section or spec that has the engine's fields (``popri run``'s
        ``score`` and ``fl`` sections)."""
        import dataclasses

        return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(cls)})

    # ------------------------------------------------------------------ what the engine is
    @property
    def flower(self) -> bool:
        """The round runs on Flower (simulation or deployment): the server sees only the
        SecAgg+ sum, never one client's upload."""
        return self.engine == "flower"

    @property
    def kind(self) -> str:
        """``inprocess`` | ``flower-simulation`` | ``flower-deployment``."""
        if not self.flower:
            return "inprocess"
        return "flower-deployment" if getattr(self, "federation", None) else "flower-simulation"

    def mechanism(self, *, tree: bool = False) -> str:
        """The DP mechanism of one round's release on this engine (a name of
        :mod:`popri.privacy.accounting`'s registry).  ``tree``: the round is a DP-FTRL tree's
        leaf; in-process that is ``tree_aggregation``, on Flower each round's noise shares are
        one Gaussian release (the tree restarts every round).  A Gaussian at q < 1 is recorded
        as ``subsampled_gaussian`` (:func:`popri.privacy.entries.gaussian`)."""
        if self.flower:
            return "distributed_discrete_gaussian" if self.secagg_mechanism == "ddg" else "gaussian"
        return "tree_aggregation" if tree else "gaussian"

    def engine_settings(self) -> dict:
        """The settings a stage passes on (``--engine flower --supernodes ...``); none
        in-process, so an in-process stage's command line (and cache key) stays as it was."""
        if not self.flower:
            return {}
        return {"engine": self.engine, **{k: getattr(self, k) for k in FLOWER_FIELDS}}

    def check_engine(self, *, release: bool, diagnostic: bool = False) -> None:
        """The checks every engine user makes (called from the spec's ``check``)."""
        if not self.flower:
            return
        if diagnostic:
            raise ConfigError("noise-free diagnostics are computed in-process; drop "
                              "--engine flower", field="diagnostic")
        if release and self.secagg_mechanism != "ddg":
            raise ConfigError("release mode on Flower needs the distributed discrete Gaussian "
                              "(--secagg-mechanism ddg): the float path quantises with numpy's "
                              "global generator", field="secagg_mechanism")
        if (release and getattr(self, "federation", None) is None
                and getattr(self, "clients_per_round", None) is None
                and getattr(self, "public_clients", "absent") is None):
            raise ConfigError("release mode sizes the secure aggregation plan from a PUBLIC "
                              "upper bound on a round's participants (their count is private): "
                              "give --public-clients N, the enrolled clients you declare public, "
                              "or --clients-per-round L", field="public_clients")
