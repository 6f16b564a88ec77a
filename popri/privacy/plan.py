"""The noise of a run's DP rounds as one frozen value.

    popri run examples/default.yaml --dry-run            # the plan's first lines show it
    python -m pytest -q tests/test_budget.py

:class:`Noise` is what a DP round adds and what its ledger entry says: the noise multiplier z
(what the stage is passed and what the ledger records), the sampling rate q and scheme, the
neighbouring relation and the sum's L2 sensitivity under it, and the mode.  ``popri run``'s
budget (:class:`popri.pipeline.budget.Budget`) plans it once; the recipes pass z on to their
stages and the budget composes :meth:`Noise.entry` over the rounds, and the stage
(``popri score``, ``popri fl round``) records its entry through the same :meth:`Noise.of_round`
and :meth:`Noise.entry` from the spec it was given -- one value, one entry function
(:func:`popri.privacy.entries.round_release`), for the plan and for the record.

Release mode snaps the aggregate to a grid before adding discrete Gaussian noise; the noise
covers the snapped sensitivity (:func:`popri.privacy.noise.discrete_gaussian_release`), so the
mechanism keeps the z it is passed and no value is scaled on the way.

Pure Python (no numpy): ``popri run --dry-run`` imports it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from popri.privacy.entries import round_release
from popri.privacy.relations import round_relation

#: the modes of a release (``Noise.mode``, every ledger entry's ``mode``)
MODES = ("research", "release")


def mode_of(release: bool) -> str:
    return "release" if release else "research"


class RoundSpec(Protocol):
    """What a round's spec says of its sum: one contribution's bound (an L2 clip C, or M
    non-negative votes) and the accounting convention (:class:`popri.specs.feedback.ScoreSpec`,
    :class:`popri.specs.fl.FLSpec`, :class:`popri.specs.fewfedpit.FewFedPITSpec`)."""

    @property
    def sensitivity(self) -> float: ...

    @property
    def nonnegative(self) -> bool: ...

    @property
    def convention(self) -> str | None: ...


@dataclass(frozen=True)
class Noise:
    """The noise of a DP round, planned once: z is what the stage is passed and what the
    ledger records (the guarantee, in release mode too).  Fields a plan cannot know yet are
    None: z before the fetch when q = L/N is calibrated over N, q (and with it the sampling,
    relation and sensitivity) before the fetch when it is L/N."""

    z: float | None
    sample_rate: float | None = None
    sampling: str | None = None          # none | poisson | fixed
    relation: str | None = None          # the neighbouring relation of a round
    sensitivity: float | None = None     # the sum's L2 sensitivity under it
    mode: str = "research"               # research | release

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)} (got {self.mode!r})")

    # ------------------------------------------------------------------ building it
    @classmethod
    def of(cls, z: float, *, release: bool = False, **fields: Any) -> "Noise":
        """A noise multiplier z, given or calibrated, before its round is known."""
        return cls(z=float(z), mode=mode_of(release), **fields)

    @classmethod
    def of_round(cls, z: float | None, *, sample_rate: float | None, sampling: str,
                 spec: RoundSpec, mode: str = "research") -> "Noise":
        """The noise of one round on clients drawn by ``sampling``: its relation and the sum's
        sensitivity under it from the round's ``spec`` (its bound, whether contributions are
        non-negative votes, its convention) by :func:`popri.privacy.relations.round_relation`
        -- the one rule the plan and the record both apply."""
        relation, sens = round_relation(spec.sensitivity, sampling, spec.convention,
                                        nonnegative=spec.nonnegative)
        return cls(z=z, sample_rate=sample_rate, sampling=sampling, relation=relation,
                   sensitivity=sens, mode=mode)

    def at(self, sampling: str, spec: RoundSpec, *, sample_rate: float | None = None) -> "Noise":
        """This noise on a round drawn by ``sampling`` (at ``sample_rate``, default this q)."""
        q = self.sample_rate if sample_rate is None else sample_rate
        return Noise.of_round(self.z, sample_rate=q, sampling=sampling,
                              spec=spec, mode=self.mode)

    def replace(self, **changes: Any) -> "Noise":
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ what it says
    @property
    def planned(self) -> bool:
        """z, q and the round's relation are known: its ledger entry can be built."""
        return None not in (self.z, self.sample_rate, self.sampling, self.relation,
                            self.sensitivity)

    def entry(self, engine: Any, stage: str, *, delta: float | None, params: dict | None = None,
              **kw: Any):
        """The ledger entry of one round with this noise on ``engine`` (an
        :class:`~popri.specs.engine.EngineSpec`): :func:`popri.privacy.entries.round_release`,
        the one entry function of the plan and the record (``kw``: its ``tree``, ``leaves``,
        ``ddg``, ``release_id``)."""
        if not self.planned or self.z is None or self.sample_rate is None \
                or self.sampling is None or self.sensitivity is None or self.relation is None:
            raise ValueError(f"the noise is not planned yet (z={self.z}, q={self.sample_rate})")
        return round_release(engine, stage, noise_multiplier=float(self.z),
                             sample_rate=float(self.sample_rate), sensitivity=self.sensitivity,
                             sampling=self.sampling, neighbouring=self.relation, delta=delta,
                             mode=self.mode, params=params, **kw)


__all__ = ["Noise", "mode_of", "RoundSpec", "MODES"]
