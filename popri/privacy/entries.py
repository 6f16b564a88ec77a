"""One function per DP mechanism builds its ledger entry: for the budget's plan and for the record.

    python -m pytest -q tests/test_entries.py

A run's budget guard composes the entries a stage WILL record (its plan: ``popri run``'s
calibration and guard, :mod:`popri.pipeline.budget` and the methods' ``round_entries``); the
stage's release then records its entries (:mod:`popri.feedback.release`, ``popri fl round``,
``popri fred stats``, ``popri fewfedpit aggregate``).  The guard is right only while the two
agree, so both build them here, from the same arguments:

- :func:`gaussian`: the Gaussian mechanism on a clipped sum, ``subsampled_gaussian`` at q < 1
  (POPri, "Private Federated Learning using Preference-Optimized Synthetic Data",
  arXiv:2504.16438, section 4.1 and Algorithm 1; DP-FedAvg, McMahan et al., arXiv:1710.06963;
  FreD's private mean and covariance, arXiv:2302.09042, Algorithm 1, at q = 1);
- :func:`distributed_discrete_gaussian`: Flower SecAgg+ with integer noise shares (Kairouz, Liu,
  Steinke, arXiv:2102.06387), ``params`` carrying what its accountant reads;
- :func:`tree_aggregation`: DP-FTRL's tree (Kairouz et al., "Practical and Private (Deep)
  Learning without Sampling or Shuffling", arXiv:2103.00039), ``params.leaves``;
- :func:`round_release`: one DP round on an engine (:class:`popri.specs.engine.EngineSpec`
  chooses the mechanism) -- the function the score rounds, DP-FL rounds and their plans call.

:func:`conformance` says where a stage's recorded entries differ from its plan; ``popri run``
checks it after every DP stage and stops the run on a difference (the ledger keeps what was
recorded; the budget guard would otherwise have been computed on the wrong entries).
"""

from __future__ import annotations

import math
from typing import Any

from popri.privacy import accounting as A
from popri.privacy import ddg as D
from popri.privacy.ledger import LedgerEntry

#: the fields of an entry the accountants read besides ``noise_multiplier`` and ``params``
ACCOUNTED = ("stage", "mechanism", "sample_rate", "steps", "delta", "sensitivity", "sampling",
             "neighbouring")


def gaussian(stage: str, *, noise_multiplier: float, sample_rate: float, sensitivity: float,
             sampling: str, delta: float | None, mode: str, steps: int = 1,
             neighbouring: str = "add/remove one client", params: dict | None = None,
             release_id: str = "") -> LedgerEntry:
    """The Gaussian mechanism on a sum of contributions of L2 norm <= ``sensitivity``:
    ``gaussian`` at q = 1, ``subsampled_gaussian`` (amplified by ``sampling``) at q < 1."""
    q = float(sample_rate)
    return LedgerEntry(stage=stage, mechanism="subsampled_gaussian" if q < 1 else "gaussian",
                       noise_multiplier=float(noise_multiplier), sample_rate=q, steps=int(steps),
                       delta=delta, sensitivity=float(sensitivity), sampling=sampling,
                       neighbouring=neighbouring, release_id=release_id,
                       params=dict(params or {}), mode=mode)


def distributed_discrete_gaussian(stage: str, *, noise_multiplier: float, sample_rate: float,
                                  sensitivity: float, sampling: str, delta: float | None,
                                  mode: str, ddg: dict | None = None, steps: int = 1,
                                  neighbouring: str = "add/remove one client",
                                  params: dict | None = None,
                                  release_id: str = "") -> LedgerEntry:
    """Flower SecAgg+ with the distributed discrete Gaussian.  ``ddg``: the accountant's
    params -- the realised plan's (:func:`popri.privacy.ddg.ledger_params`) when recording,
    :func:`popri.privacy.ddg.nominal_params` of the asked z when planning (the default)."""
    return LedgerEntry(stage=stage, mechanism="distributed_discrete_gaussian",
                       noise_multiplier=float(noise_multiplier), sample_rate=float(sample_rate),
                       steps=int(steps), delta=delta, sensitivity=float(sensitivity),
                       sampling=sampling, neighbouring=neighbouring, release_id=release_id,
                       mode=mode,
                       params={**(params or {}),
                               **(ddg if ddg is not None else D.nominal_params(noise_multiplier))})


def tree_aggregation(stage: str, *, noise_multiplier: float, sensitivity: float,
                     delta: float | None, mode: str, leaves: int, sample_rate: float = 1.0,
                     sampling: str = "none", neighbouring: str = "add/remove one client",
                     params: dict | None = None, release_id: str = "") -> LedgerEntry:
    """A DP-FTRL tree of ``leaves`` leaves (one entry per tree), under ``neighbouring``:
    zero-out one client for a tree over blocks of a permutation, add/remove when an added
    client moves no other (independent leaf assignment, or a one-leaf tree)."""
    return LedgerEntry(stage=stage, mechanism="tree_aggregation",
                       noise_multiplier=float(noise_multiplier), sample_rate=float(sample_rate),
                       steps=1, delta=delta, sensitivity=float(sensitivity), sampling=sampling,
                       neighbouring=neighbouring, release_id=release_id, mode=mode,
                       params={**(params or {}), "leaves": int(leaves)})


def round_release(engine: Any, stage: str, *, noise_multiplier: float, sample_rate: float,
                  sensitivity: float, sampling: str, delta: float | None, mode: str,
                  tree: bool = False, leaves: int = 1, ddg: dict | None = None,
                  neighbouring: str = "add/remove one client",
                  params: dict | None = None, release_id: str = "") -> LedgerEntry:
    """The ledger entry of one DP round on ``engine`` (an :class:`~popri.specs.engine.EngineSpec`:
    ScoreSpec, FLSpec), planned or recorded, under ``neighbouring`` with the sum's
    ``sensitivity`` under it (:func:`popri.privacy.relations.round_relation`).  ``tree``: a
    DP-FTRL round (``leaves`` in its tree); on Flower each round is its own one-leaf tree, a
    single Gaussian release that takes no amplification by sampling, so it is accounted at
    q = 1."""
    mech = engine.mechanism(tree=tree)
    common: dict[str, Any] = dict(noise_multiplier=noise_multiplier, sample_rate=sample_rate,
                  sensitivity=sensitivity, sampling=sampling, delta=delta, mode=mode,
                  neighbouring=neighbouring, params=params, release_id=release_id)
    if tree and mech != "tree_aggregation":
        common.update(sample_rate=1.0, sampling="none")
    if mech == "distributed_discrete_gaussian":
        return distributed_discrete_gaussian(stage, ddg=ddg, **common)
    if mech == "tree_aggregation":
        return tree_aggregation(stage, leaves=leaves, **common)
    return gaussian(stage, **common)


# --------------------------------------------------------------------------- plan vs record
def _epsilon(entries: list[LedgerEntry], delta: float, accountant: str,
             convention: str | None = None) -> float:
    return A.compose([e.to_dict() for e in entries], delta, accountant, alone=False,
                     convention=convention).epsilon


def conformance(planned: list[LedgerEntry], recorded: list[LedgerEntry], *,
                accountant: str = "rdp", delta: float | None = None,
                convention: str | None = None) -> list[str]:
    """Where ``recorded`` (a stage's new ledger entries) departs from ``planned`` (what the
    budget composed for it); [] when they agree.  They agree when they pair up one to one with
    the same accounted fields (:data:`ACCOUNTED`), each recorded noise multiplier at least the
    planned one (release mode's snapping only adds noise), and the recorded entries spend no
    more epsilon at ``delta`` than the planned ones (the distributed discrete Gaussian's realised
    plan against its nominal one)."""
    problems: list[str] = []
    if len(planned) != len(recorded):
        return [f"planned {len(planned)} ledger entries, recorded {len(recorded)}"]
    left = list(recorded)
    for p in planned:
        key = tuple(getattr(p, f) for f in ACCOUNTED)
        match = next((r for r in left if tuple(getattr(r, f) for f in ACCOUNTED) == key), None)
        if match is None:
            shown = ", ".join(f"{f}={v!r}" for f, v in zip(ACCOUNTED, key))
            got = "; ".join(", ".join(f"{f}={getattr(r, f)!r}" for f in ACCOUNTED
                                      if getattr(r, f) != getattr(p, f)) for r in left)
            problems.append(f"planned ({shown}) has no recorded match (recorded differs in: "
                            f"{got or 'nothing left'})")
            continue
        left.remove(match)
        if match.noise_multiplier < p.noise_multiplier * (1 - 1e-9):
            problems.append(f"{p.stage}/{p.mechanism}: recorded noise multiplier "
                            f"{match.noise_multiplier:.6g} < planned {p.noise_multiplier:.6g}")
    if problems or not planned:
        return problems
    d = delta if delta is not None else next((e.delta for e in planned if e.delta), None)
    if d is None:
        return problems
    e_plan = _epsilon(planned, d, accountant, convention)
    e_rec = _epsilon(recorded, d, accountant, convention)
    if not (e_rec <= e_plan * (1 + 1e-6) or (math.isinf(e_plan) and math.isinf(e_rec))):
        problems.append(f"recorded entries spend epsilon={e_rec:.6g} at delta={d:g}, the plan "
                        f"{e_plan:.6g}")
    return problems
