"""Privacy accounting for Gaussian releases: epsilon <-> noise multiplier, and ledger totals.

    popri account epsilon --noise-multiplier 2.5 --sample-rate 0.1 --steps 20 --delta 3e-6
    popri account sigma --epsilon 1 --sample-rate 0.1 --steps 20 --delta 3e-6 --accountant pld
    popri account ledger runs/ --json

    from popri.privacy.accounting import epsilon, noise_multiplier, compose
    epsilon(2.5, 0.1, 20, 3e-6)            # 0.9617 (POPri Table 3, N=10000, L=1000, eps=1)
    noise_multiplier(1.0, 0.1, 20, 3e-6)   # smallest z with epsilon <= 1 (upper end, tol 1e-4)
    compose([(1.05, 0.0075, 20), (19.3, 1.0, 1)], 3e-6).epsilon

Pure functions, no state (maths apart from state, as in opacus).  The mechanism is the Gaussian
mechanism on a sum with L2 sensitivity 1 (``z`` = noise std / sensitivity), run ``steps`` times,
each time on a Poisson sample of clients with rate ``q`` (``q = 1``: everyone, plain Gaussian).
Neighbouring datasets differ by adding or removing one client's data (user-level DP).

Accountants:

- ``rdp``: opacus' RDP analysis of the Poisson-subsampled Gaussian
  (``opacus.accountants.analysis.rdp.compute_rdp`` / ``get_privacy_spent``), what POPri (D.1)
  and PrE-Text (D.1) used, at opacus' ``RDPAccountant.DEFAULT_ALPHAS`` extended with orders
  64..1024 (these only tighten very small epsilons; every POPri Table 3 row is unchanged).
- ``pld``: dp-accounting's privacy-loss-distribution accountant (``PLDAccountant`` with
  ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``, or ``GaussianDpEvent(z)`` at ``q = 1``),
  pessimistic estimate, ``value_discretization_interval`` 1e-4 (epsilon error < 1e-5 at the papers'
  settings; a 1e-3 grid is used to bracket the noise multiplier, then refined at 1e-4).
  Tighter than RDP: it is the near-exact (epsilon, delta) of the mechanism.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

ACCOUNTANTS = ("rdp", "pld")
NEIGHBOURING = "add/remove one client"
#: the relations an entry may name, matched exactly (no substring tests: "not add/remove ..."
#: must not pass for add/remove); popri.privacy.ledger.RELATIONS is their union
ADD_REMOVE = ("add/remove one client", "add/remove one sample")
REPLACE = ("replace one client", "replace one sample")

# == opacus.accountants.RDPAccountant.DEFAULT_ALPHAS (checked by the tests), + larger orders.
OPACUS_ALPHAS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
ORDERS = OPACUS_ALPHAS + (64, 80, 96, 128, 160, 192, 256, 384, 512, 768, 1024)

PLD_INTERVAL = 1e-4         # dp-accounting's default value_discretization_interval
PLD_SEARCH_INTERVAL = 1e-3  # coarse grid for bracketing in noise_multiplier()
Z_MIN, Z_MAX = 1e-2, 1e6    # search range of noise_multiplier()
#: a noise multiplier above this is accounted as this one: epsilon falls as z grows, so the
#: result is an upper bound (~0: 0.0047 by RDP, whose floor is set by its largest order, 0 by
#: PLD); z = 1e200 overflowed z**2 in both accountants
Z_CLAMP = 1e10
#: the PLD grid is coarsened (a pessimistic estimate is an upper bound at any interval) so that
#: the privacy losses it spans take at most this many points: a noise multiplier of 1e-3 asked
#: dp-accounting for 10^10 points (76 GiB); a loss range that needs an interval above
#: PLD_MAX_INTERVAL is reported as epsilon = infinity (the noise is negligible: z < ~1e-4)
PLD_MAX_POINTS = 3_000_000
PLD_MAX_INTERVAL = 10.0
TINY_NOTE = ("the privacy losses (smallest noise multiplier {z:g}) are beyond the {acc} "
             "accountant's range (a tiny noise multiplier, or very many steps): epsilon reported "
             "as infinity")

FIXED_NOTE = ("fixed-size sampling (L of N clients per round) is accounted with the Poisson-"
              "subsampling analysis at q = L/N, as POPri did (appendix D.1, 'client sampling "
              "ratio'); this is the papers' convention, not a proven bound for sampling without "
              "replacement")
INF_NOTE = "a noise multiplier of 0 releases the exact aggregate: no privacy (epsilon = infinity)"


class ParameterError(ValueError):
    """A bad accounting parameter; ``param`` names it (noise_multiplier, sample_rate, ...)."""

    def __init__(self, param: str, message: str):
        self.param = param
        self.message = message
        super().__init__(f"{param}: {message}")


def check(*, z: float | None = None, q: float | None = None, steps: Any = None,
          delta: float | None = None, eps: float | None = None,
          accountant: str | None = None) -> None:
    """Raise :class:`ParameterError` for the first parameter outside its domain."""
    def bad(x):
        return isinstance(x, bool) or not isinstance(x, (int, float, np.number)) or math.isnan(x)

    if z is not None and (bad(z) or not (0 <= z < math.inf)):
        raise ParameterError("noise_multiplier", f"must be a finite number >= 0 (got {z})")
    if q is not None and (bad(q) or not (0 < q <= 1)):
        raise ParameterError("sample_rate", f"must be in (0, 1] (got {q})")
    if steps is not None and (bad(steps) or steps != int(steps) or steps < 1):
        raise ParameterError("steps", f"must be an integer >= 1 (got {steps})")
    if delta is not None and (bad(delta) or not (0 < delta < 1)):
        raise ParameterError("delta", f"must be in (0, 1) (got {delta})")
    if eps is not None and (bad(eps) or not (0 < eps < math.inf)):
        raise ParameterError("epsilon", f"must be a finite number > 0 (got {eps})")
    if accountant is not None and accountant not in ACCOUNTANTS:
        raise ParameterError("accountant",
                             f"must be one of {', '.join(ACCOUNTANTS)} (got {accountant!r})")


@lru_cache(maxsize=1)
def _rdp_lib():
    """``opacus.accountants.analysis.rdp``, loaded from its file: importing the ``opacus``
    package runs its ``__init__``, which imports torch (~3 s); this module needs only numpy and
    scipy.  Falls back to the ordinary import."""
    spec = importlib.util.find_spec("opacus")
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / "accountants" / "analysis" / "rdp.py"
        if path.is_file():
            s = importlib.util.spec_from_file_location("popri.privacy._opacus_rdp", path)
            mod = importlib.util.module_from_spec(s)
            s.loader.exec_module(mod)
            return mod
    from opacus.accountants.analysis import rdp

    return rdp


@dataclass(frozen=True)
class Result:
    epsilon: float                  # math.inf when a noise multiplier is 0
    delta: float
    accountant: str
    order: float | None = None      # rdp: the optimal Renyi order
    warnings: tuple[str, ...] = ()


def _rdp(history, delta: float, orders) -> Result:
    lib = _rdp_lib()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            rdp = sum(np.asarray(lib.compute_rdp(q=float(q), noise_multiplier=float(z),
                                                 steps=int(n), orders=list(orders)), dtype=float)
                      for z, q, n in history)
            eps, order = lib.get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
        except (ZeroDivisionError, OverflowError, FloatingPointError):
            # z so small that z**2 underflows (1e-300): the loss is unbounded in floating point
            z = min(z for z, _, _ in history)
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


def _event(z: float, q: float):
    from dp_accounting import dp_event

    g = dp_event.GaussianDpEvent(float(z))
    return g if q >= 1 else dp_event.PoissonSampledDpEvent(float(q), g)


def pld_loss_range(history) -> float:
    """A rough width of the privacy losses dp-accounting's PLD grid spans for ``history``, used
    only to bound the grid (see PLD_MAX_POINTS).  A Gaussian of multiplier z has losses
    ~ 1/(2 z^2) +- 10/z.  q = 1 steps fold into one Gaussian of z / sqrt(steps) (as dp-accounting
    does).  n Poisson-subsampled steps compose k Gaussian-sized losses, k ~ the steps a client
    takes part in at the far tail (n q + 10 sqrt(n q) + 10, at most n).  Calibrated on
    dp-accounting 0.4: ~225 bytes per point, so PLD_MAX_POINTS keeps a call under ~0.7 GB, and
    every setting with z >= 0.5 and q <= 0.1 keeps the 1e-4 grid."""
    total = 0.0
    for z, q, n in history:
        # measured: q = 1 needs the +-10/z tails; composed subsampled PMFs are truncated harder
        k, c = (n, 20.0) if q >= 1 else (min(n, n * q + 10.0 * math.sqrt(n * q) + 10.0), 2.0)
        try:
            total += k / (z * z) + c * math.sqrt(k) / z
        except (ZeroDivisionError, OverflowError):
            return math.inf
    return total


def _pld(history, delta: float, interval: float) -> Result:
    from dp_accounting import dp_event
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.privacy_accountant import NeighboringRelation

    warn: tuple[str, ...] = ()
    need = pld_loss_range(history) / PLD_MAX_POINTS
    z_min = min(z for z, _, _ in history)
    tiny = Result(math.inf, delta, "pld", warnings=(TINY_NOTE.format(z=z_min, acc="pld")
                                                    + "; --accountant rdp gives a finite bound",))
    if not need <= PLD_MAX_INTERVAL:
        return tiny
    if need > interval:
        warn = (f"PLD grid coarsened from {interval:g} to {need:.3g} (noise multiplier {z_min:g} "
                "spans a wide range of privacy losses): epsilon is a looser upper bound",)
        interval = need
    acc = PLDAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE,
                        value_discretization_interval=interval)
    try:
        acc.compose(dp_event.ComposedDpEvent(
            [dp_event.SelfComposedDpEvent(_event(z, q), int(n)) for z, q, n in history]))
        eps = float(acc.get_epsilon(delta))
    except (OverflowError, ZeroDivisionError, FloatingPointError):
        return tiny
    return Result(max(eps, 0.0) if math.isfinite(eps) else math.inf, delta, "pld", warnings=warn)


def _account(history, delta: float, accountant: str, orders=ORDERS,
             interval: float | None = None) -> Result:
    """Epsilon of the composition of ``history`` = [(z, q, steps), ...] (opacus' history shape)."""
    if any(z == 0 for z, _, _ in history):
        return Result(math.inf, delta, accountant, warnings=(INF_NOTE,))
    history = [(min(float(z), Z_CLAMP), q, n) for z, q, n in history]  # see Z_CLAMP
    if accountant == "rdp":
        return _rdp(history, delta, orders)
    return _pld(history, delta, interval or PLD_INTERVAL)


def epsilon_details(z: float, q: float, steps: int, delta: float, accountant: str = "rdp", *,
                    orders=ORDERS, value_discretization_interval: float | None = None) -> Result:
    """Epsilon (with the RDP order and any warnings) of ``steps`` releases at rate ``q``."""
    check(z=z, q=q, steps=steps, delta=delta, accountant=accountant)
    return _account([(z, q, int(steps))], delta, accountant, orders, value_discretization_interval)


def epsilon(z: float, q: float, steps: int, delta: float, accountant: str = "rdp", *,
            orders=ORDERS, value_discretization_interval: float | None = None) -> float:
    """Epsilon at ``delta`` of ``steps`` Poisson(q)-subsampled Gaussian releases of multiplier z."""
    return epsilon_details(z, q, steps, delta, accountant, orders=orders,
                           value_discretization_interval=value_discretization_interval).epsilon


def _bisect(f: Callable[[float], float], target: float, lo: float, hi: float, tol: float):
    """Invariant: f(lo) > target >= f(hi); shrink until hi - lo <= tol."""
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:  # adjacent floats: a tol below their spacing is met here
            break
        if f(mid) <= target:
            hi = mid
        else:
            lo = mid
    return lo, hi


def _bracket(f: Callable[[float], float], target: float) -> tuple[float, float]:
    """(lo, hi) with f(lo) > target >= f(hi): from z = 1, double the upper bound (or halve the
    lower one) within [Z_MIN, Z_MAX]."""
    hi = 1.0
    if f(hi) > target:
        while True:
            lo, hi = hi, min(2.0 * hi, Z_MAX)
            if f(hi) <= target:
                return lo, hi
            if hi >= Z_MAX:
                raise ParameterError("epsilon", f"target {target:g} is not met even at noise "
                                                f"multiplier {Z_MAX:g}")
    while True:
        lo = max(hi / 2.0, Z_MIN)
        if f(lo) > target:
            return lo, hi
        if lo <= Z_MIN:
            raise ParameterError("epsilon", f"target {target:g} is met by every noise multiplier "
                                            f">= {Z_MIN:g} (is delta >= sample rate?); the noise "
                                            "does not bind: choose a smaller epsilon")
        hi = lo


def noise_multiplier(eps: float, q: float, steps: int, delta: float, accountant: str = "rdp",
                     tol: float = 1e-4, *, orders=ORDERS,
                     value_discretization_interval: float | None = None) -> float:
    """Smallest noise multiplier z (to ``tol``) with epsilon(z, q, steps, delta) <= ``eps``.

    Bracket (the upper bound grows geometrically) + bisection; returns the upper end of the final
    interval, so the target is met.  PLD brackets on a 1e-3 grid, then refines at 1e-4 (or uses
    ``value_discretization_interval`` throughout when given).
    """
    check(eps=eps, q=q, steps=steps, delta=delta, accountant=accountant)
    if not (tol > 0 and math.isfinite(tol)):
        raise ParameterError("tol", f"must be > 0 (got {tol})")
    steps = int(steps)
    fine = value_discretization_interval or PLD_INTERVAL
    coarse = value_discretization_interval or PLD_SEARCH_INTERVAL

    def at(interval):
        return lambda z: _account([(z, q, steps)], delta, accountant, orders, interval).epsilon

    f = at(coarse if accountant == "pld" else None)
    try:
        lo, hi = _bisect(f, eps, *_bracket(f, eps), tol)
    except ParameterError as e:
        if accountant == "rdp" and "not met" in e.message:  # RDP -> DP conversion has a floor
            raise ParameterError("epsilon", e.message + " (the RDP bound has a floor set by its "
                                 f"largest order, {orders[-1]:g}; the pld accountant may reach "
                                 "it)") from None
        raise
    if accountant != "pld" or fine == coarse:
        return hi
    g, step = at(fine), tol  # refine on the fine grid (its pessimistic estimate is ~ the same)
    while g(hi) > eps:
        lo, hi, step = hi, hi + step, step * 2
    lo, step = max(hi - step, 0.0), step * 2
    while g(lo) <= eps:
        lo, hi, step = max(lo - step, 0.0), lo, step * 2
    return _bisect(g, eps, lo, hi, tol)[1]


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
    neighbouring: str = NEIGHBOURING  # the relation every composed entry protects

    def to_dict(self) -> dict:
        eps = self.epsilon if math.isfinite(self.epsilon) else None
        d = {"epsilon": eps, "delta": self.delta, "accountant": self.accountant,
             "neighbouring": self.neighbouring, "entries": self.entries, "groups": self.groups}
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
                "sampling": "none" if q >= 1 else "poisson", "neighbouring": NEIGHBOURING}
    d = e if isinstance(e, dict) else e.to_dict()
    return {k: d.get(k, dflt) for k, dflt in (("stage", "-"), ("mechanism", "subsampled_gaussian"),
                                               ("noise_multiplier", None), ("sample_rate", None),
                                               ("steps", None), ("sampling", "none"),
                                               ("neighbouring", NEIGHBOURING), ("release_id", ""))}


def compose(entries: Iterable[Any], delta: float, accountant: str = "rdp", *, orders=ORDERS,
            value_discretization_interval: float | None = None, alone: bool = True) -> Composition:
    """Compose heterogeneous Gaussian releases into one epsilon at ``delta``.

    ``entries``: :class:`popri.privacy.ledger.LedgerEntry` objects, their dicts, or (z, q, steps)
    tuples.  ``mechanism == "gaussian"`` or ``sampling == "none"`` is accounted at q = 1;
    ``sampling == "fixed"`` at q = sample_rate = L/N (see ``FIXED_NOTE``).  All entries must
    protect one neighbouring relation (``Composition.neighbouring``): add/remove, or a replace
    relation for plain q = 1 Gaussians (whose privacy curve depends only on z).  Identical
    (stage, mechanism, sampling, z, q) entries form one group whose steps add up; RDP sums the
    per-order RDP of the groups, PLD composes ``SelfComposedDpEvent`` s in a ``ComposedDpEvent``.
    ``alone`` adds each group's own epsilon to its dict.
    """
    check(delta=delta, accountant=accountant)
    groups: dict[tuple, dict] = {}
    notes: list[str] = []
    relations: dict[str, str] = {}  # relation -> first entry with it; all entries must agree
    n = 0
    for e in entries:
        d = _fields(e)
        n += 1
        who = f"entry {n} (stage {d['stage']!r})"
        rel = " ".join(str(d["neighbouring"]).lower().split())
        if rel not in ADD_REMOVE and not (rel in REPLACE and _unsampled(d)):
            raise ParameterError("neighbouring", f"{who} is for {d['neighbouring']!r}; only "
                                                 f"add/remove releases, or plain (q = 1) Gaussian "
                                                 f"releases under a replace relation, compose here")
        relations.setdefault(rel, who)
        if len(relations) > 1:
            r0 = next(iter(relations))
            w0 = relations[r0]
            raise ParameterError("neighbouring", f"{who} protects {rel!r} but {w0} protects "
                                                 f"{r0!r}: guarantees for different neighbouring "
                                                 f"relations do not add up; total them separately")
        try:
            check(z=d["noise_multiplier"], q=d["sample_rate"], steps=d["steps"])
        except ParameterError as err:
            raise ParameterError(err.param, f"{who}: {err.message}") from None
        q = float(d["sample_rate"])
        if d["mechanism"] == "gaussian" or d["sampling"] == "none":
            if q < 1:
                notes.append(f"{who}: {d['mechanism']} with sampling {d['sampling']!r} is "
                             f"accounted at q = 1 (no amplification by sampling)")
            q = 1.0
        if d["sampling"] == "fixed" and FIXED_NOTE not in notes:
            notes.insert(0, FIXED_NOTE)
        key = (d["stage"], d["mechanism"], d["sampling"], float(d["noise_multiplier"]), q)
        g = groups.setdefault(key, {"stage": d["stage"], "mechanism": d["mechanism"],
                                    "noise_multiplier": key[3], "sample_rate": q,
                                    "steps": 0, "sampling": d["sampling"], "entries": 0})
        g["steps"] += int(d["steps"])
        g["entries"] += 1
    if not groups:
        raise ParameterError("entries", "nothing to compose (no ledger entries)")
    history = [(g["noise_multiplier"], g["sample_rate"], g["steps"]) for g in groups.values()]
    res = _account(history, delta, accountant, orders, value_discretization_interval)
    out = list(groups.values())
    if alone:
        for g, h in zip(out, history):
            e = res.epsilon if len(out) == 1 else _account([h], delta, accountant, orders,
                                                           value_discretization_interval).epsilon
            g["epsilon_alone"] = e if math.isfinite(e) else None
    if not math.isfinite(res.epsilon):
        notes.append(INF_NOTE)
    return Composition(res.epsilon, delta, accountant, n, out, res.order, notes,
                       [w for w in res.warnings if w != INF_NOTE],
                       next(iter(relations)) if relations else NEIGHBOURING)


def _unsampled(d: dict) -> bool:
    """Accounted at q = 1: a plain Gaussian, whose (eps, delta) curve depends only on z under
    any neighbouring relation (z measured in that relation's sensitivity)."""
    return d["mechanism"] == "gaussian" or d["sampling"] == "none" or d["sample_rate"] == 1


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
