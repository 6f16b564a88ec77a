"""Noise calibration: the smallest noise multiplier that meets a privacy budget.

    popri account sigma --epsilon 1 --sample-rate 0.1 --steps 20 --delta 3e-6 --accountant pld
    popri fred stats --private data/sotu --epsilon 0.6 --delta 2e-6 --calibration analytic ...
    python -m pytest -q tests/test_accounting.py tests/test_fred.py

    from popri.privacy import calibration as C
    C.noise_multiplier(1.0, 0.1, 20, 3e-6)         # composed: 20 subsampled releases, eps <= 1
    C.gaussian_multiplier(0.6, 2e-6, "analytic")   # one Gaussian release, (0.6, 2e-6)-DP
    C.solve(lambda z: my_epsilon(z), 1.0)          # any decreasing epsilon(z)

Two kinds of calibration, with distinct names:

- **Composed** (:func:`noise_multiplier`, :func:`calibrate`): the noise multiplier z of a release
  that is composed (``steps`` times, Poisson-subsampled at rate q, possibly with other recorded
  releases) so that the accountant's total epsilon at delta is <= the target.  The analogue of
  opacus' ``get_noise_multiplier(target_epsilon, target_delta, sample_rate, steps,
  accountant)``: epsilon falls as z grows, so a geometric bracket and a bisection find it
  (:func:`solve`); the upper end of the final interval is returned, so the target is met.  It
  works over any mechanism of the registry (:mod:`popri.privacy.accounting`) and either
  accountant (opacus RDP, dp-accounting PLD): :func:`calibrate` takes the prospective ledger
  entries as a function of z.
- **One Gaussian release** (:func:`gaussian_multiplier`): z with one Gaussian mechanism
  (eps, delta)-DP, by the classic bound sqrt(2 ln(1.25/delta)) / eps (Dwork & Roth, "The
  Algorithmic Foundations of Differential Privacy", 2014, Theorem A.1; eps < 1 only; what FreD
  used: "Privately Customizing Prefinetuning to Better Match User Data in Federated Learning",
  arXiv:2302.09042, Algorithm 1) or the exact analytic Gaussian mechanism (Balle & Wang,
  "Improving the Gaussian Mechanism for Differential Privacy: Analytical Calibration and Optimal
  Denoising", ICML 2018, arXiv:1805.06530, Theorem 8 / Algorithm 1).
"""

from __future__ import annotations

import hashlib
import json
import math
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Iterable, Protocol

from popri.core.version import __version__
from popri.privacy.accounting import (
    ORDERS,
    PLD_INTERVAL,
    PLD_SEARCH_INTERVAL,
    Z_MAX,
    Z_MIN,
    ParameterError,
    check,
    compose,
    epsilon_details,
    history_of,
)

# the single-release calibrations of gaussian_multiplier ("classic", "analytic"): in the spec
from popri.specs.privacy import CALIBRATIONS  # noqa: F401


# --------------------------------------------------------------------------- root finding
def bisect(f: Callable[[float], float], target: float, lo: float, hi: float, tol: float):
    """Invariant: f(lo) > target >= f(hi) (f decreasing); shrink until hi - lo <= tol.
    Returns (lo, hi)."""
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:  # adjacent floats: a tol below their spacing is met here
            break
        if f(mid) <= target:
            hi = mid
        else:
            lo = mid
    return lo, hi


def bracket(f: Callable[[float], float], target: float, lo_bound: float = Z_MIN,
            hi_bound: float = Z_MAX) -> tuple[float, float]:
    """(lo, hi) with f(lo) > target >= f(hi) for a decreasing f: from 1, double the upper bound
    (or halve the lower one) within [lo_bound, hi_bound]; a ParameterError (param
    ``epsilon``) when the target is met nowhere or everywhere there."""
    hi = 1.0
    if f(hi) > target:
        while True:
            lo, hi = hi, min(2.0 * hi, hi_bound)
            if f(hi) <= target:
                return lo, hi
            if hi >= hi_bound:
                raise ParameterError("epsilon", f"target {target:g} is not met even at noise "
                                                f"multiplier {hi_bound:g}")
    while True:
        lo = max(hi / 2.0, lo_bound)
        if f(lo) > target:
            return lo, hi
        if lo <= lo_bound:
            raise ParameterError("epsilon", f"target {target:g} is met by every noise multiplier "
                                            f">= {lo_bound:g} (is delta >= sample rate?); the "
                                            "noise does not bind: choose a smaller epsilon")
        hi = lo


def solve(f: Callable[[float], float], target: float, tol: float = 1e-4) -> float:
    """The smallest x (to ``tol``, the upper end of the final interval: f(x) <= target holds)
    of a decreasing ``f`` with f(x) <= ``target``: :func:`bracket` then :func:`bisect`."""
    return bisect(f, target, *bracket(f, target), tol)[1]


# --------------------------------------------------------------------------- memo
class Memo(Protocol):
    """Where :func:`calibrate` may keep the z it found under a key of everything that decides
    it (:func:`calibration_key`), so that a later call skips the search (popri run's planning:
    a search is ~20 compositions, 5-10 s of opacus' fractional RDP orders on one CPU core; the
    pipeline passes a directory under POPRI_CACHE, :class:`popri.pipeline.budget.Budget`).  A
    z read back is used only once :func:`calibrate` has checked it again: never a claim."""

    def get(self, key: str) -> float | None: ...

    def put(self, key: str, z: float) -> None: ...


def _plain(entry: Any) -> Any:
    if hasattr(entry, "to_dict"):
        return entry.to_dict()
    return dict(entry) if isinstance(entry, dict) else list(entry)


def _lib(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def calibration_key(eps: float, delta: float, entries_at: Callable[[float], Iterable[Any]],
                    accountant: str, tol: float, orders, interval: float | None,
                    convention: str | None) -> str:
    """A digest of a calibration's inputs: the target, the accountant and its settings, popri's
    and the accounting libraries' versions, and the prospective entries at two noise
    multipliers (their mechanism, sampling, relation, sensitivity, rate and steps)."""
    probe = {str(z): [_plain(e) for e in entries_at(z)] for z in (1.0, 2.0)}
    what = {"eps": eps, "delta": delta, "accountant": accountant, "tol": tol,
            "orders": list(orders), "interval": interval, "convention": convention,
            "libs": [__version__, _lib("opacus"), _lib("dp-accounting")], "entries": probe}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=repr).encode()).hexdigest()


# --------------------------------------------------------------------------- composed releases
def calibrate(eps: float, delta: float, entries_at: Callable[[float], Iterable[Any]],
              accountant: str = "rdp", tol: float = 1e-4, *, orders=ORDERS,
              value_discretization_interval: float | None = None,
              convention: str | None = None, memo: Memo | None = None) -> float:
    """Smallest z (to ``tol``) with ``compose(entries_at(z), delta, accountant).epsilon <= eps``.

    ``entries_at(z)``: the prospective ledger entries (LedgerEntry objects, dicts or (z, q,
    steps) tuples, any registered mechanism) when the calibrated releases use noise multiplier
    z.  PLD brackets on a 1e-3 grid, then refines at 1e-4 (or uses
    ``value_discretization_interval`` throughout when given).

    ``memo`` (:class:`Memo`): a z kept under the same :func:`calibration_key` is returned only
    if it still passes the search's own end test -- epsilon at z <= eps, and at z - tol above
    it (tol-tight) -- two compositions instead of ~20; otherwise the search runs and its z is
    kept.  The search's answer is a function of the key, so the memo changes no result."""
    check(eps=eps, delta=delta, accountant=accountant)
    if not (isinstance(tol, (int, float)) and tol > 0 and math.isfinite(tol)):
        raise ParameterError("tol", f"must be > 0 (got {tol})")
    fine = value_discretization_interval or PLD_INTERVAL
    coarse = value_discretization_interval or PLD_SEARCH_INTERVAL

    def at(interval):
        return lambda z: compose(entries_at(z), delta, accountant, orders=orders,
                                 value_discretization_interval=interval, alone=False,
                                 convention=convention).epsilon

    if memo is None:
        return _search(at, eps, tol, accountant, orders, fine, coarse)
    key = calibration_key(eps, delta, entries_at, accountant, tol, orders,
                          value_discretization_interval, convention)
    z = memo.get(key)
    final = at(fine if accountant == "pld" else None)  # what the search's last bisection used
    if (isinstance(z, float) and math.isfinite(z) and z > 0 and final(z) <= eps
            and (z - tol <= 0 or final(z - tol) > eps)):
        return z
    z = _search(at, eps, tol, accountant, orders, fine, coarse)
    memo.put(key, z)
    return z


def _search(at, eps: float, tol: float, accountant: str, orders, fine: float,
            coarse: float) -> float:
    """:func:`calibrate`'s search over ``at(interval)``'s epsilon(z): bracket, bisect (PLD: on
    the ``coarse`` grid, then refined on the ``fine`` one)."""
    f = at(coarse if accountant == "pld" else None)
    try:
        lo, hi = bisect(f, eps, *bracket(f, eps), tol)
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
    return bisect(g, eps, lo, hi, tol)[1]


def noise_multiplier(eps: float, q: float, steps: int, delta: float, accountant: str = "rdp",
                     tol: float = 1e-4, *, also: Iterable[Any] = (), orders=ORDERS,
                     value_discretization_interval: float | None = None,
                     sampling: str = "poisson") -> float:
    """Smallest noise multiplier z (to ``tol``) with epsilon(z, q, steps, delta) <= ``eps``: the
    Gaussian (q = 1) or subsampled Gaussian run ``steps`` times (opacus'
    ``get_noise_multiplier``): Poisson sampling under add/remove, or ``sampling="fixed"`` (L of
    N) under replace one client (:func:`popri.privacy.accounting.history_of`).  ``also``: ledger
    entries of other releases composed with them (e.g. a run's DP checkpoint selection), so the
    total meets ``eps``."""
    check(eps=eps, q=q, steps=steps, delta=delta, accountant=accountant)
    steps, also = int(steps), list(also)
    if also:
        spent = compose(also, delta, accountant, orders=orders,
                        value_discretization_interval=value_discretization_interval,
                        alone=False).epsilon
        if not spent < eps:
            raise ParameterError("epsilon", f"the other releases alone spend epsilon={spent:.4g} "
                                            f"of the target {eps:g} (at delta={delta:g})")
    return calibrate(eps, delta, lambda z: [*history_of(z, q, steps, sampling), *also],
                     accountant, tol, orders=orders,
                     value_discretization_interval=value_discretization_interval)


def noise_multiplier_details(eps: float, q: float, steps: int, delta: float,
                             accountant: str = "rdp", tol: float = 1e-4, **kw):
    """``popri account sigma``: (z, the accountant's Result at z) for :func:`noise_multiplier`'s
    z, i.e. the epsilon it achieves (<= ``eps``), its RDP order and any warnings."""
    z = noise_multiplier(eps, q, steps, delta, accountant, tol, **kw)
    return z, epsilon_details(z, q, steps, delta, accountant,
                              orders=kw.get("orders", ORDERS),
                              value_discretization_interval=kw.get(
                                  "value_discretization_interval"),
                              sampling=kw.get("sampling", "poisson"))


# --------------------------------------------------------------------------- one Gaussian release
def _check_eps_delta(eps: float, delta: float) -> None:
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ParameterError("epsilon", f"must be a finite number > 0 (got {eps})")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ParameterError("delta", f"must be in (0, 1) (got {delta})")


def classic_multiplier(eps: float, delta: float) -> float:
    """z = sqrt(2 ln(1.25 / delta)) / eps: (eps, delta)-DP for eps < 1 (Dwork & Roth, Thm A.1)."""
    _check_eps_delta(eps, delta)
    if not eps < 1:
        raise ParameterError("epsilon", f"the classic calibration sqrt(2 ln(1.25/delta))/eps is "
                             f"proven for epsilon < 1 only (Dwork & Roth 2014, Theorem A.1; got "
                             f"{eps}); use --calibration analytic")
    return math.sqrt(2.0 * math.log(1.25 / delta)) / eps


def gaussian_log_delta(z: float, eps: float) -> float:
    """log of the exact delta(eps) of the Gaussian mechanism with noise multiplier z
    (Balle & Wang 2018, Theorem 8): Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z)."""
    from scipy.special import log_ndtr

    a = float(log_ndtr(0.5 / z - eps * z))
    b = eps + float(log_ndtr(-0.5 / z - eps * z))
    return a + math.log1p(-math.exp(b - a)) if b < a else -math.inf


def analytic_multiplier(eps: float, delta: float) -> float:
    """Smallest z whose exact delta(eps) is <= delta (Balle & Wang 2018, Algorithm 1), from
    dp_accounting.gaussian_mechanism.get_sigma_gaussian; nudged up until the condition holds in
    floating point (its root finder can stop a hair below the root)."""
    from dp_accounting.gaussian_mechanism import get_sigma_gaussian

    _check_eps_delta(eps, delta)
    z = float(get_sigma_gaussian(float(eps), float(delta)))
    target, step = math.log(delta), 1e-12
    while gaussian_log_delta(z, eps) > target:
        z *= 1.0 + step
        step *= 2.0
    return z


def gaussian_multiplier(eps: float, delta: float, calibration: str = "classic") -> float:
    """The noise multiplier of ONE (eps, delta)-DP Gaussian release: ``classic``
    (:func:`classic_multiplier`) or ``analytic`` (:func:`analytic_multiplier`)."""
    if calibration == "classic":
        return classic_multiplier(eps, delta)
    if calibration == "analytic":
        return analytic_multiplier(eps, delta)
    raise ParameterError("calibration", f"must be one of {', '.join(CALIBRATIONS)} "
                                        f"(got {calibration!r})")
