"""Privacy accounting: epsilon of a composition of mechanisms, and ledger totals.

    popri account epsilon --noise-multiplier 2.5 --sample-rate 0.1 --steps 20 --delta 3e-6
    popri account sigma --epsilon 1 --sample-rate 0.1 --steps 20 --delta 3e-6 --accountant pld
    popri account ledger runs/ --json
    python -m pytest -q tests/test_accounting.py

    from popri.privacy.accounting import epsilon, compose
    epsilon(2.5, 0.1, 20, 3e-6)            # 0.9617 (POPri Table 3, N=10000, L=1000, eps=1)
    compose([(1.05, 0.0075, 20), (19.3, 1.0, 1)], 3e-6).epsilon
    # epsilon -> noise multiplier: popri.privacy.calibration.noise_multiplier(1.0, 0.1, 20, 3e-6)

Pure functions, no state (maths apart from state, as in opacus).  Neighbouring datasets differ by
adding or removing one client's data (user-level DP); POPri = "Private Federated Learning using
Preference-Optimized Synthetic Data" (arXiv:2504.16438), PrE-Text = "PrE-Text: Training Language
Models on Private Federated Data in the Age of LLMs" (arXiv:2406.02958).

Mechanisms: :mod:`popri.privacy.mechanisms` (the registry; its names are re-exported here).

Accountants:

- ``rdp``: opacus' RDP analysis of the Poisson-subsampled Gaussian
  (``opacus.accountants.analysis.rdp.compute_rdp`` / ``get_privacy_spent``; Mironov, "Renyi
  Differential Privacy", CSF 2017, arXiv:1702.07476; Mironov, Talwar, Zhang, "Renyi
  Differential Privacy of the Sampled Gaussian Mechanism", arXiv:1908.10530), what POPri (D.1)
  and PrE-Text (D.1) used, at opacus' ``RDPAccountant.DEFAULT_ALPHAS`` extended with orders
  64..1024 (these only tighten very small epsilons; every POPri Table 3 row is unchanged).
- ``pld``: dp-accounting's privacy-loss-distribution accountant (``PLDAccountant`` with
  ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``, or ``GaussianDpEvent(z)`` at ``q = 1``;
  Koskela, Jalko, Honkela, "Computing tight differential privacy guarantees using FFT",
  arXiv:1906.03049; Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, "Connect the dots: tighter
  discrete approximations of privacy loss distributions", arXiv:2207.04380), pessimistic
  estimate, ``value_discretization_interval`` 1e-4 (epsilon error < 1e-5 at the papers'
  settings; a 1e-3 grid is used to bracket the noise multiplier, then refined at 1e-4).
  Tighter than RDP: it is the near-exact (epsilon, delta) of the mechanism.

Calibration (epsilon -> noise multiplier) is :mod:`popri.privacy.calibration`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from popri.privacy import relations as REL
from popri.privacy.mechanisms import (  # noqa: F401 (the registry, re-exported)
    ADD_REMOVE,
    FIXED_NOTE,
    GAUSSIAN,
    INF_NOTE,
    MECHANISMS,
    NEIGHBOURING,
    OPACUS_ALPHAS,
    ORDERS,
    PLD_INTERVAL,
    PLD_MAX_INTERVAL,
    PLD_MAX_POINTS,
    PLD_SEARCH_INTERVAL,
    REPLACE,
    SUBSAMPLED_GAUSSIAN,
    TINY_NOTE,
    WOR,
    Z_CLAMP,
    Z_MAX,
    Z_MIN,
    DistributedDiscreteGaussianMechanism,
    GaussianMechanism,
    Mechanism,
    ParameterError,
    Result,
    SubsampledGaussianMechanism,
    TreeAggregationMechanism,
    rdp_lib,
    check,
    get_mechanism,
    register_mechanism,
    unregister_mechanism,
)
from popri.specs.privacy import ACCOUNTANTS  # ("rdp", "pld"), declared once in the spec


# --------------------------------------------------------------------------- the accountants
def _steps(history) -> list[tuple[Mechanism, tuple, int]]:
    """``history`` as (mechanism, key, steps): opacus' (z, q, steps) tuples are the Gaussian
    (q = 1) or the subsampled Gaussian; (Mechanism, key, steps) triples pass through."""
    out = []
    for h in history:
        if isinstance(h[0], Mechanism):
            out.append((h[0], tuple(h[1]), int(h[2])))
        else:
            z, q, n = h
            out.append((GAUSSIAN if q >= 1 else SUBSAMPLED_GAUSSIAN, (float(z), float(q)),
                        int(n)))
    return out


def _unsupported(m: Mechanism, accountant: str, what: str = "") -> ParameterError:
    other = [a for a in ACCOUNTANTS if a != accountant]
    return ParameterError("accountant", f"mechanism {m.name!r}{' with ' + what if what else ''} "
                                        f"has no {accountant} analysis; use --accountant "
                                        f"{' or '.join(other)}")


def _rdp(steps, delta: float, orders) -> Result:
    lib = rdp_lib()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            rdp = 0.0
            for m, k, n in steps:
                try:
                    rdp = rdp + m.rdp(k, n, orders)
                except NotImplementedError:
                    raise _unsupported(m, "rdp") from None
            eps, order = lib.get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
        except (ZeroDivisionError, OverflowError, FloatingPointError):
            # z so small that z**2 underflows (1e-300): the loss is unbounded in floating point
            z = min(m.noise_multiplier(k) for m, k, _ in steps)
            return Result(math.inf, delta, "rdp", warnings=(TINY_NOTE.format(z=z, acc="rdp"),))
    eps = float(eps)
    if not math.isfinite(eps):
        return Result(math.inf, delta, "rdp")
    order = float(order)
    warn = ()
    if order in (float(orders[0]), float(orders[-1])):
        edge = "smallest" if order == float(orders[0]) else "largest"
        warn = (f"the optimal RDP order is the {edge} one tried ({order:g}): the RDP bound may be "
                f"loose here; compare --accountant pld",)
    return Result(max(eps, 0.0), delta, "rdp", order, warn)


def pld_loss_range(history) -> float:
    """A rough width of the privacy losses dp-accounting's PLD grid spans for ``history``, used
    only to bound the grid (see PLD_MAX_POINTS): the sum of each mechanism's
    :meth:`Mechanism.loss_range`."""
    return sum(m.loss_range(k, n) for m, k, n in _steps(history))


#: the most steps (of all releases together) the pld accountant composes.  dp-accounting's
#: PLD of T self-composed releases costs time that grows with T, and a calibration evaluates
#: it some 40 times: measured on 2 CPU cores (dp-accounting 0.4), ``popri account sigma -e 1
#: -q 0.5 --accountant pld`` took ~9 s at T = 10^5 (q = 0.01: ~9 s; -e 0.1: ~12 s), ~23 s at
#: 2 x 10^5, ~100 s at 10^6, and T = 10^12 had not ended after 400 s.  The rdp accountant's
#: cost does not depend on T (T multiplies the RDP of one step).
PLD_MAX_STEPS = 100_000


def _pld(steps, delta: float, interval: float) -> Result:
    total = sum(n for _m, _k, n in steps)
    if total > PLD_MAX_STEPS:  # before dp-accounting is even imported: refused at once
        raise ParameterError("steps", f"at most {PLD_MAX_STEPS:,} with --accountant pld (got "
                                      f"{total:,}): its time grows with the steps (~10 s to "
                                      f"calibrate z at 10^5, ~100 s at 10^6); --accountant rdp "
                                      f"accounts any number of steps at once")
    from dp_accounting import dp_event
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.privacy_accountant import NeighboringRelation, UnsupportedEventError

    warn: tuple[str, ...] = ()
    need = pld_loss_range(steps) / PLD_MAX_POINTS
    z_min = min(m.noise_multiplier(k) for m, k, _ in steps)
    tiny = Result(math.inf, delta, "pld", warnings=(TINY_NOTE.format(z=z_min, acc="pld")
                                                    + "; --accountant rdp gives a finite bound",))
    if not need <= PLD_MAX_INTERVAL:
        return tiny
    if need > interval:
        warn = (f"PLD grid coarsened from {interval:g} to {need:.3g} (noise multiplier {z_min:g} "
                "spans a wide range of privacy losses): epsilon is a looser upper bound",)
        interval = need
    events = []
    for m, k, n in steps:
        try:
            events.append(m.event(k, n))
        except NotImplementedError as err:
            raise _unsupported(m, "pld", str(err)) from None
    acc = PLDAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE,
                        value_discretization_interval=interval)
    try:
        acc.compose(dp_event.ComposedDpEvent(events))
        eps = float(acc.get_epsilon(delta))
    except UnsupportedEventError:  # an event the PLD accountant cannot analyse
        bad = next(m for m, k, n in steps if not acc.supports(m.event(k, n)))
        raise _unsupported(bad, "pld") from None
    except (OverflowError, ZeroDivisionError, FloatingPointError):
        return tiny
    return Result(max(eps, 0.0) if math.isfinite(eps) else math.inf, delta, "pld", warnings=warn)


def _account(history, delta: float, accountant: str, orders=ORDERS,
             interval: float | None = None) -> Result:
    """Epsilon of the composition of ``history``: opacus' shape [(z, q, steps), ...] or
    [(Mechanism, key, steps), ...]."""
    steps = _steps(history)
    if any(m.infinite(k) for m, k, _ in steps):
        return Result(math.inf, delta, accountant, warnings=(INF_NOTE,))
    steps = [(m, m.clamp(k), n) for m, k, n in steps]
    if accountant == "rdp":
        return _rdp(steps, delta, orders)
    return _pld(steps, delta, interval or PLD_INTERVAL)


#: the client-sampling schemes of a composed release: Poisson (add/remove one client) or a
#: fixed L of N (sampling without replacement, replace one client); popri.privacy.relations
SAMPLINGS = ("poisson", "fixed")


def history_of(z: float, q: float, steps: int, sampling: str = "poisson") -> list:
    """:func:`compose`'s entries for ``steps`` releases at rate q: Poisson sampling under
    add/remove (opacus' (z, q, steps) shape), or ``fixed`` (L of N, q = L/N) under replace one
    client, z relative to the replace-one sensitivity."""
    if sampling not in SAMPLINGS:
        raise ParameterError("sampling", f"must be one of {', '.join(SAMPLINGS)} (got "
                                         f"{sampling!r})")
    if sampling == "fixed" and q < 1:
        return [{"stage": "-", "mechanism": "subsampled_gaussian", "noise_multiplier": z,
                 "sample_rate": q, "steps": int(steps), "sampling": "fixed",
                 "neighbouring": REL.REPLACE, "sensitivity": 2.0}]
    return [(z, q, int(steps))]


def epsilon_details(z: float, q: float, steps: int, delta: float, accountant: str = "rdp", *,
                    orders=ORDERS, value_discretization_interval: float | None = None,
                    sampling: str = "poisson") -> Result:
    """Epsilon (with the RDP order and any warnings) of ``steps`` releases at rate ``q``:
    Poisson sampling under add/remove one client, or ``sampling="fixed"`` (L of N, q = L/N)
    under replace one client (:func:`history_of`; RDP only)."""
    check(z=z, q=q, steps=steps, delta=delta, accountant=accountant)
    history_of(z, q, steps, sampling)  # checks the sampling
    hist = ([(SUBSAMPLED_GAUSSIAN, (float(z), float(q), WOR), int(steps))]
            if sampling == "fixed" and q < 1 else [(z, q, int(steps))])
    return _account(hist, delta, accountant, orders, value_discretization_interval)


def epsilon(z: float, q: float, steps: int, delta: float, accountant: str = "rdp", *,
            orders=ORDERS, value_discretization_interval: float | None = None,
            sampling: str = "poisson") -> float:
    """Epsilon at ``delta`` of ``steps`` subsampled Gaussian releases of multiplier z at rate q:
    Poisson sampling under add/remove one client (default), or a fixed L of N under replace one
    client (``sampling="fixed"``)."""
    return epsilon_details(z, q, steps, delta, accountant, orders=orders,
                           value_discretization_interval=value_discretization_interval,
                           sampling=sampling).epsilon



# --------------------------------------------------------------------------- composition
@dataclass
class Composition:
    epsilon: float
    delta: float
    accountant: str
    entries: int
    groups: list[dict]
    order: float | None = None
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    neighbouring: str = NEIGHBOURING  # the relation the total protects
    #: the conventions asked for (``papers``); when one was USED, ``guarantee`` is False
    convention: str | None = None
    guarantee: bool = True

    @property
    def label(self) -> str:
        """How every printer states what the epsilon is: the relation, or NOT A DP GUARANTEE."""
        if not self.guarantee:
            return "NOT A DP GUARANTEE (papers' convention)"
        return f"(eps, delta)-DP under {self.neighbouring}"

    def to_dict(self) -> dict:
        eps = self.epsilon if math.isfinite(self.epsilon) else None
        d = {"epsilon": eps, "delta": self.delta, "accountant": self.accountant,
             "neighbouring": self.neighbouring, "dp_guarantee": self.guarantee,
             "guarantee": self.label, "entries": self.entries, "groups": self.groups}
        if self.convention is not None:
            d["convention"] = self.convention
        if self.order is not None:
            d["order"] = self.order
        if self.notes:
            d["note"] = "; ".join(self.notes)
        if self.warnings:
            d["warnings"] = self.warnings
        return d


def _fields(e: Any) -> dict:
    if isinstance(e, (tuple, list)):
        z, q, n = e
        return {"stage": "-", "mechanism": "gaussian" if q >= 1 else "subsampled_gaussian",
                "noise_multiplier": z, "sample_rate": q, "steps": n,
                "sampling": "none" if q >= 1 else "poisson", "neighbouring": NEIGHBOURING,
                "sensitivity": 1.0, "params": {}}
    d = e if isinstance(e, dict) else e.to_dict()
    out = {k: d.get(k, dflt) for k, dflt in (("stage", "-"), ("mechanism", "subsampled_gaussian"),
                                              ("noise_multiplier", None), ("sample_rate", None),
                                              ("steps", None), ("sampling", "none"),
                                              ("neighbouring", NEIGHBOURING), ("release_id", ""),
                                              ("sensitivity", 1.0))}
    out["params"] = d.get("params") if isinstance(d.get("params"), dict) else {}
    return out


def _target(rows: list) -> str:
    """The relation a total is stated under: the entries' own when they agree; else the first
    of replace-one / zero-out (per unit) every entry converts to
    (:func:`popri.privacy.relations.conversion`); else a ParameterError naming two entries."""
    rels = list(dict.fromkeys(r[4] for r in rows))
    if len(rels) == 1:
        return rels[0]
    for cand in (REL.REPLACE, REL.ZERO_OUT, REL.REPLACE_SAMPLE):
        if cand in rels and all(REL.conversion(rel, cand, relation_free=m.relation_free(d))
                                is not None for _, _, d, m, rel in rows):
            return cand
    a = rows[0]
    b = next(r for r in rows if r[4] != a[4])
    raise ParameterError("neighbouring", f"{b[1]} protects {b[4]!r} but {a[1]} protects "
                                         f"{a[4]!r}, and no proven conversion brings them to one "
                                         "relation (docs/privacy.md): total them separately")


def compose(entries: Iterable[Any], delta: float, accountant: str = "rdp", *, orders=ORDERS,
            value_discretization_interval: float | None = None, alone: bool = True,
            convention: str | None = None) -> Composition:
    """Compose heterogeneous releases into one epsilon at ``delta``, under one neighbouring
    relation (``Composition.neighbouring``).

    ``entries``: :class:`popri.privacy.ledger.LedgerEntry` objects, their dicts, or (z, q, steps)
    tuples (Poisson at q < 1, add/remove).  Each entry's ``mechanism`` is looked up in the
    registry (:func:`get_mechanism`; an unknown one is a ParameterError listing the known ones),
    which checks the entry, says whether its (sampling, neighbouring) pair has a proven
    accounting (:meth:`Mechanism.unproven`: a row of the one table
    :data:`popri.privacy.relations.PROVEN`; an entry read from a ledger is named by its file
    and line) and gives its accounting key.  Entries under different relations are brought to one only by the
    conversions of :func:`popri.privacy.relations.conversion` (a q = 1 Gaussian-family entry
    under add/remove counts at twice its sensitivity under replace-one or zero-out; replace-one
    counts as zero-out), each noted; anything else is a ParameterError.

    ``convention="papers"``: the entries without a proven accounting that popri <= 0.3 recorded
    (:meth:`Mechanism.papers`: fixed L of N under add/remove, totalled as Poisson at q = L/N;
    block trees as if add/remove) are totalled as the papers did -- any other unproven pair is
    refused under every convention; the result then has
    ``guarantee`` False and PAPERS_NOTE first among its notes: NOT a DP guarantee.

    Entries of one stage, mechanism, sampling and key form one group whose steps add up; RDP
    sums the per-order RDP of the groups (:meth:`Mechanism.rdp`), PLD composes their events
    (:meth:`Mechanism.event`) in a ``ComposedDpEvent``.  ``alone`` adds each group's own
    epsilon to its dict."""
    check(delta=delta, accountant=accountant)
    if convention is not None and convention not in REL.CONVENTIONS:
        raise ParameterError("convention", f"must be one of {', '.join(REL.CONVENTIONS)} (got "
                                           f"{convention!r})")
    notes: list[str] = []
    rows = []  # (n, who, entry dict, mechanism, relation)
    used_convention = False
    n = 0
    for e in entries:
        d = _fields(e)
        n += 1
        where = getattr(e, "where", None)  # "path:line" of an entry read from a ledger
        who = f"{where + ': ' if where else ''}entry {n} (stage {d['stage']!r})"
        try:
            mech = get_mechanism(d["mechanism"])
        except ParameterError as err:
            raise ParameterError(err.param, f"{who}: {err.message}") from None
        rel = REL.normalize(d["neighbouring"])
        if rel not in REL.RELATIONS:
            raise ParameterError("neighbouring", f"{who}: unknown relation {d['neighbouring']!r} "
                                                 f"(known: {', '.join(REL.RELATIONS)})")
        try:
            mech.check(d)
        except ParameterError as err:
            raise ParameterError(err.param, f"{who}: {err.message}") from None
        why = mech.unproven(d)
        if why is not None:
            if not mech.papers(d):  # no convention totals it (popri.privacy.relations.PROVEN)
                raise ParameterError("neighbouring", f"{who}: {mech.pair(d)}: {why}, refused")
            if convention != "papers":
                raise ParameterError("neighbouring", f"{who}: {mech.pair(d)}: {why}; its "
                                     "epsilon would not be true. Total it under the papers' "
                                     "convention only by name (--convention papers: NOT a DP "
                                     "guarantee)")
            used_convention = True
        rows.append((n, who, d, mech, rel))
    if not rows:
        raise ParameterError("entries", "nothing to compose (no ledger entries)")
    target = _target(rows)
    groups: dict[tuple, dict] = {}
    history: list[tuple[Mechanism, tuple, int]] = []
    for _, who, d, mech, rel in rows:
        f = REL.conversion(rel, target, relation_free=mech.relation_free(d))
        if f != 1.0:
            d = mech.scaled(d, f)
            notes.append(f"{who}: recorded under {rel}, counted under {target} at {f:g} times "
                         "its sensitivity (replacing a client is removing it and adding "
                         "another: the L2 sensitivity at most doubles)")
        k = mech.key(d, who, notes)
        if d["sampling"] == "fixed" and mech.unproven(d) is None and mech.fixed_note not in notes:
            notes.append(mech.fixed_note)
        gkey = (d["stage"], mech.name, d["sampling"], k)
        if gkey not in groups:
            groups[gkey] = {"stage": d["stage"], "mechanism": mech.name, **mech.describe(k),
                            "steps": 0, "sampling": d["sampling"], "neighbouring": rel,
                            "entries": 0}
            if mech.unproven(d) is not None:  # only under the papers' convention
                groups[gkey]["proof"] = "none: the papers' convention, NOT a DP guarantee"
            history.append((mech, k, 0))
        g = groups[gkey]
        g["steps"] += int(d["steps"])
        g["entries"] += 1
    if used_convention:
        notes.insert(0, REL.PAPERS_NOTE)
    out = list(groups.values())
    history = [(m, k, g["steps"]) for (m, k, _), g in zip(history, out)]
    res = _account(history, delta, accountant, orders, value_discretization_interval)
    if alone:
        for g, h in zip(out, history):
            e = res.epsilon if len(out) == 1 else _account([h], delta, accountant, orders,
                                                           value_discretization_interval).epsilon
            g["epsilon_alone"] = e if math.isfinite(e) else None
    if not math.isfinite(res.epsilon):
        notes.append(INF_NOTE)
    return Composition(res.epsilon, delta, accountant, n, out, res.order, notes,
                       [w for w in res.warnings if w != INF_NOTE], target,
                       convention=convention, guarantee=not used_convention)


def _delta_of(e: Any) -> float | None:
    if isinstance(e, (tuple, list)):
        return None
    return e.get("delta") if isinstance(e, dict) else getattr(e, "delta", None)


def common_delta(entries: Iterable[Any]) -> float:
    """The delta all entries agree on (entries without one abstain); else ParameterError."""
    ds = sorted({float(d) for d in map(_delta_of, entries) if d is not None})
    if len(ds) == 1:
        return ds[0]
    if not ds:
        raise ParameterError("delta", "no ledger entry records a delta; pass --delta")
    raise ParameterError("delta", "ledger entries use different deltas "
                                  f"({', '.join(f'{d:g}' for d in ds)}); pass --delta")
