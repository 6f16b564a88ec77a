"""The DP mechanisms a ledger entry can name: one class each, in a registry (as opacus' accountants).

    python -m pytest -q tests/test_accounting.py tests/test_ddg.py tests/test_tree.py

Mechanisms (the registry, as opacus' ``accountants.registry``: one class per mechanism, found by
the name a ledger entry records).  A :class:`Mechanism` names the ledger fields it needs and gives
its Renyi DP curve (``rdp``, for the ``rdp`` accountant) and its dp-accounting ``DpEvent`` (for
``pld``); :func:`compose` and :mod:`popri.privacy.ledger` look every entry's mechanism up with
:func:`get_mechanism`, so a new mechanism (tree aggregation for DP-FTRL, the distributed discrete
Gaussian of secure aggregation) is one :func:`register_mechanism` call::

    @register_mechanism
    class TreeAggregation(GaussianMechanism):
        name = "tree_aggregation"
        params_fields = ("leaves",)            # read from the entry's "params" object
        def key(self, d, who, notes): ...      # its accounting parameters
        def rdp(self, key, steps, orders): ...
        def event(self, key, steps): ...       # dp_event.SingleEpochTreeAggregationDpEvent

Registered here: ``gaussian`` (one Gaussian release of the whole population, q = 1) and
``subsampled_gaussian`` (the Gaussian on a Poisson sample of clients at rate q), both of the
sum's L2 sensitivity: ``noise_multiplier`` z = noise std / sensitivity.

The pure maths of each mechanism lives here (its RDP curve, its dp-accounting event); the
accountants that compose them and the ledger totals are :mod:`popri.privacy.accounting`; the
ledger entry each mechanism's release records is built by :mod:`popri.privacy.entries`.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from popri.privacy import ddg
from popri.privacy import relations as REL
from popri.privacy.tree import depth
from popri.specs.privacy import ACCOUNTANTS  # ("rdp", "pld"), declared once in the spec

NEIGHBOURING = REL.ADD_REMOVE
#: the relations an entry may name, matched exactly (no substring tests: "not add/remove ..."
#: must not pass for add/remove); popri.privacy.relations.RELATIONS is their union
ADD_REMOVE = REL.ADD_REMOVE_ALL
REPLACE = REL.REPLACE_ALL
ZERO_OUT = REL.ZERO_OUT

# == opacus.accountants.RDPAccountant.DEFAULT_ALPHAS (checked by the tests), + larger orders.
OPACUS_ALPHAS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
ORDERS = OPACUS_ALPHAS + (64, 80, 96, 128, 160, 192, 256, 384, 512, 768, 1024)

PLD_INTERVAL = 1e-4         # dp-accounting's default value_discretization_interval
PLD_SEARCH_INTERVAL = 1e-3  # coarse grid for bracketing (popri.privacy.calibration)
Z_MIN, Z_MAX = 1e-2, 1e6    # search range of popri.privacy.calibration.noise_multiplier()
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

FIXED_NOTE = ("fixed-size sampling (L of N clients per round) is accounted as sampling "
              "without replacement under replace one client (dp-accounting's "
              "SampledWithoutReplacementDpEvent: Wang, Balle, Kasiviswanathan 2019, Theorem 27), "
              "at the replace-one sensitivity of the sum")
#: why an entry's (sampling, relation) has no proven accounting: fixed-size sampling under
#: add/remove (the displacement pair; popri.privacy.relations)
DISPLACEMENT = ("fixed-size sampling (L of N clients) under add/remove one client has no proven "
                "accounting: an added client displaces a sampled one, so the sum moves by up to "
                "2C (Lebeda et al. 2024); popri records such rounds under replace one client")
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
def rdp_lib():
    """``opacus.accountants.analysis.rdp``, loaded from its file: importing the ``opacus``
    package runs its ``__init__``, which imports torch (~3 s); this module needs only numpy and
    scipy.  Falls back to the ordinary import."""
    spec = importlib.util.find_spec("opacus")
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / "accountants" / "analysis" / "rdp.py"
        if path.is_file():
            s = importlib.util.spec_from_file_location("popri.privacy._opacus_rdp", path)
            if s is not None and s.loader is not None:
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


# --------------------------------------------------------------------------- mechanisms
class Mechanism:
    """One DP mechanism the accountants know (subclass, set ``name``, :func:`register_mechanism`).

    Every ledger entry records ``noise_multiplier``, ``sample_rate`` and ``steps`` (the common
    shape; ``steps`` = how many times the mechanism described by the rest is self-composed);
    ``fields`` names those the mechanism reads, ``params_fields`` the further numbers it needs,
    read from the entry's ``params`` object (e.g. a tree's leaves, a discrete Gaussian's
    dimension).  The accounting of one entry goes through:

    - :meth:`key`: the entry's accounting parameters as a hashable tuple (entries of one stage
      with equal keys are one group, their steps added);
    - :meth:`rdp`: its Renyi DP at ``orders`` after ``steps`` compositions (the ``rdp``
      accountant sums these over the groups, as opacus' ``RDPAccountant`` sums its history);
    - :meth:`event`: its dp-accounting ``DpEvent`` after ``steps`` compositions (the ``pld``
      accountant composes these in one ``ComposedDpEvent``).

    A mechanism without one of the two analyses leaves it unimplemented: that accountant then
    refuses it with a :class:`ParameterError` naming the other."""

    name: str = ""
    #: one line for error messages and the docs
    summary: str = ""
    #: the entry's top-level fields it reads (all entries carry these three)
    fields: tuple[str, ...] = ("noise_multiplier", "sample_rate", "steps")
    #: numbers it needs from the entry's ``params`` object
    params_fields: tuple[str, ...] = ()
    #: what a total says of the mechanism's fixed-size (L of N) entries under replace one client
    fixed_note: str = FIXED_NOTE
    #: its row of :data:`popri.privacy.relations.PROVEN` (the (sampling, neighbouring) pairs it
    #: has a proven accounting for); a registered subclass inherits its parent's.  "" (the
    #: base class): no pair is proven, every entry is refused
    family: str = ""

    # -- the entry
    def check(self, d: dict) -> None:
        """:class:`ParameterError` for a missing or out-of-domain field of entry ``d``."""
        for k in self.fields:
            if d.get(k) is None:
                raise ParameterError(k, f"missing (mechanism {self.name!r} needs "
                                        f"{', '.join(self.fields)})")
        check(z=d.get("noise_multiplier"), q=d.get("sample_rate"), steps=d.get("steps"))
        params = d.get("params") or {}
        for k in self.params_fields:
            v = params.get(k) if isinstance(params, dict) else None
            if (isinstance(v, bool) or not isinstance(v, (int, float, np.number))
                    or not math.isfinite(v)):
                raise ParameterError(f"params.{k}", f"mechanism {self.name!r} needs "
                                                    f"params.{k}, a finite number (got {v!r})")

    def key(self, d: dict, who: str, notes: list) -> tuple:
        """The accounting parameters of entry ``d`` (checked); may append a note."""
        raise NotImplementedError

    def describe(self, key: tuple) -> dict:
        """The group's columns for ``popri account ledger`` (after stage and mechanism), with
        ``proof``: the theorem or library event its epsilon rests on."""
        return {"noise_multiplier": key[0], "sample_rate": key[1] if len(key) > 1 else 1.0,
                "proof": self.proof(key)}

    def proof(self, key: tuple) -> str:
        """The theorem or library event this key's accounting rests on (for the totals)."""
        return ""

    def noise_multiplier(self, key: tuple) -> float:
        """For messages: the noise multiplier of a group."""
        return float(key[0])

    def unproven(self, d: dict) -> str | None:
        """Why entry ``d`` has no proven accounting here, or None when it has: its (sampling,
        neighbouring) pair is not a row of :data:`popri.privacy.relations.PROVEN` for this
        mechanism's :attr:`family` (fixed-size sampling under add/remove never is: the
        displacement pair); subclasses refuse more (a condition on ``params``)."""
        s = d.get("sampling", "none")
        rel = REL.normalize(d.get("neighbouring", NEIGHBOURING))
        status = REL.pair_status(self.family, s, rel)
        if status == "papers":
            return DISPLACEMENT
        if status is None:
            return (f"no proven accounting (proven for {self.family or self.name}: "
                    f"{REL.describe_pairs(self.family)}; docs/privacy.md)")
        return None

    def papers(self, d: dict) -> bool:
        """The papers' convention (``--convention papers``, NOT a DP guarantee) may total entry
        ``d`` although :meth:`unproven`: what popri <= 0.3 recorded (fixed-size sampling under
        add/remove; :data:`popri.privacy.relations.PAPERS_PAIRS`).  Anything else unproven is
        refused under every convention."""
        rel = REL.normalize(d.get("neighbouring", NEIGHBOURING))
        return REL.pair_status(self.family, d.get("sampling", "none"), rel) == "papers"

    def pair(self, d: dict) -> str:
        """Entry ``d``'s mechanism and (sampling, neighbouring) pair, for one-line messages."""
        return (f"{self.name} with sampling {d.get('sampling', 'none')!r} under "
                f"{REL.normalize(d.get('neighbouring', NEIGHBOURING))!r}")

    def relation_free(self, d: dict) -> bool:
        """Entry ``d`` is a q = 1 release whose privacy curve is a function of its noise
        multiplier alone, so it converts between relations by scaling its sensitivity
        (:func:`popri.privacy.relations.conversion`)."""
        return False

    def scaled(self, d: dict, f: float) -> dict:
        """Entry ``d`` with its sensitivity multiplied by ``f`` (the same mechanism under a
        relation whose sensitivity is f times larger): noise multiplier / f."""
        return {**d, "sensitivity": float(d.get("sensitivity") or 1.0) * f,
                "noise_multiplier": float(d["noise_multiplier"]) / f}

    def infinite(self, key: tuple) -> bool:
        """No privacy at all (a noise multiplier of 0): epsilon = infinity, no accountant run."""
        return False

    def clamp(self, key: tuple) -> tuple:
        """The key the accountants see (e.g. a huge noise multiplier capped: an upper bound)."""
        return key

    # -- the analyses
    def rdp(self, key: tuple, steps: int, orders) -> np.ndarray:
        """Renyi DP at ``orders`` of ``steps`` compositions (the ``rdp`` accountant)."""
        raise NotImplementedError

    def event(self, key: tuple, steps: int):
        """dp-accounting ``DpEvent`` of ``steps`` compositions (the ``pld`` accountant)."""
        raise NotImplementedError

    def loss_range(self, key: tuple, steps: int) -> float:
        """A rough width of the privacy losses of ``steps`` compositions (bounds the PLD grid;
        see :data:`PLD_MAX_POINTS`); 0 when unknown (the grid is then not coarsened)."""
        return 0.0

    def __repr__(self) -> str:
        return f"<mechanism {self.name}>"


#: name -> mechanism; :func:`register_mechanism` adds, :func:`get_mechanism` looks up
MECHANISMS: dict[str, Mechanism] = {}


def register_mechanism(mechanism, *, force: bool = False):
    """Register a :class:`Mechanism` (a subclass or an instance) under its ``name``; usable as a
    class decorator, returns its argument.  A name already taken is a ValueError unless
    ``force`` (as opacus' ``register_accountant``)."""
    mech = mechanism() if isinstance(mechanism, type) else mechanism
    if not isinstance(mech, Mechanism) or not mech.name or not isinstance(mech.name, str):
        raise ValueError(f"{mechanism!r} is not a Mechanism with a name")
    if mech.name in MECHANISMS and not force:
        raise ValueError(f"mechanism {mech.name!r} is already registered (force=True replaces)")
    MECHANISMS[mech.name] = mech
    return mechanism


def unregister_mechanism(name: str) -> None:
    """Remove a registered mechanism (tests)."""
    MECHANISMS.pop(name, None)


def get_mechanism(name: Any) -> Mechanism:
    """The registered mechanism called ``name``; a :class:`ParameterError` (param
    ``mechanism``) listing the known ones otherwise."""
    mech = MECHANISMS.get(name) if isinstance(name, str) else None
    if mech is None:
        raise ParameterError("mechanism", f"unknown mechanism {name!r} (known: "
                                          f"{', '.join(MECHANISMS)})")
    return mech


@register_mechanism
class GaussianMechanism(Mechanism):
    """The Gaussian mechanism on a sum of L2 sensitivity D, noise std z D, every client taking
    part (q = 1): its privacy curve depends on z alone, under any neighbouring relation
    (Balle & Wang, "Improving the Gaussian mechanism for differential privacy", ICML 2018).
    An entry with ``sample_rate`` < 1 is accounted at q = 1 (no amplification), with a note."""

    name = "gaussian"
    family = "gaussian"
    summary = "Gaussian mechanism, every client takes part (q = 1)"

    def key(self, d: dict, who: str, notes: list) -> tuple:
        if float(d["sample_rate"]) < 1:
            notes.append(f"{who}: {d['mechanism']} with sampling {d['sampling']!r} is "
                         f"accounted at q = 1 (no amplification by sampling)")
        return (float(d["noise_multiplier"]), 1.0)

    def relation_free(self, d: dict) -> bool:
        return True

    def proof(self, key: tuple) -> str:
        q = key[1] if len(key) > 1 else 1.0
        if len(key) > 2 and key[2] == WOR:
            return ("sampling without replacement, replace one client: dp-accounting "
                    "SampledWithoutReplacementDpEvent (Wang, Balle, Kasiviswanathan 2019, Thm 27)")
        if q < 1:
            return ("Poisson subsampled Gaussian, add/remove: opacus compute_rdp (Mironov, "
                    "Talwar, Zhang 2019) / dp-accounting PoissonSampledDpEvent")
        return "Gaussian mechanism: RDP alpha/(2 z^2) (Mironov 2017); PLD GaussianDpEvent"

    def infinite(self, key: tuple) -> bool:
        return key[0] == 0

    def clamp(self, key: tuple) -> tuple:
        return (min(float(key[0]), Z_CLAMP), *key[1:])  # see Z_CLAMP

    def rdp(self, key: tuple, steps: int, orders) -> np.ndarray:
        z, q = key[0], key[1]
        if len(key) > 2 and key[2] == WOR:
            return _wor_rdp(float(z), float(q), tuple(float(a) for a in orders)) * int(steps)
        return np.asarray(rdp_lib().compute_rdp(q=float(q), noise_multiplier=float(z),
                                                 steps=int(steps), orders=list(orders)),
                          dtype=float)

    def event(self, key: tuple, steps: int):
        from dp_accounting import dp_event

        z, q = float(key[0]), float(key[1])
        g = dp_event.GaussianDpEvent(z)
        if len(key) > 2 and key[2] == WOR:
            # dp-accounting's PLD accountant has no SampledWithoutReplacementDpEvent (its RDP
            # accountant has, under REPLACE_ONE: rdp() above)
            raise NotImplementedError("fixed-size sampling (sampling without replacement, "
                                      "replace one client)")
        return dp_event.SelfComposedDpEvent(
            g if q >= 1 else dp_event.PoissonSampledDpEvent(q, g), int(steps))

    def loss_range(self, key: tuple, steps: int) -> float:
        """A Gaussian of multiplier z has losses ~ 1/(2 z^2) +- 10/z.  q = 1 steps fold into
        one Gaussian of z / sqrt(steps) (as dp-accounting does).  n Poisson-subsampled steps
        compose k Gaussian-sized losses, k ~ the steps a client takes part in at the far tail
        (n q + 10 sqrt(n q) + 10, at most n).  Calibrated on dp-accounting 0.4: ~225 bytes per
        point, so PLD_MAX_POINTS keeps a call under ~0.7 GB, and every setting with z >= 0.5 and
        q <= 0.1 keeps the 1e-4 grid."""
        z, q, n = key[0], key[1], steps
        # measured: q = 1 needs the +-10/z tails; composed subsampled PMFs are truncated harder
        k, c = (n, 20.0) if q >= 1 else (min(n, n * q + 10.0 * math.sqrt(n * q) + 10.0), 2.0)
        try:
            return k / (z * z) + c * math.sqrt(k) / z
        except (ZeroDivisionError, OverflowError):
            return math.inf


@register_mechanism
class SubsampledGaussianMechanism(GaussianMechanism):
    """The Gaussian mechanism on a sample of the clients, as in DP-SGD / DP-FedAvg (Abadi et al.,
    "Deep learning with differential privacy", CCS 2016):

    - ``sampling`` ``"poisson"`` (each client independently at rate q) under add/remove one
      client: opacus' RDP of the sampled Gaussian (Mironov, Talwar, Zhang 2019,
      arXiv:1908.10530), dp-accounting's ``PoissonSampledDpEvent`` for PLD;
    - ``"fixed"`` (L of N without replacement, q = L/N) under replace one client:
      dp-accounting's ``SampledWithoutReplacementDpEvent`` under
      ``NeighboringRelation.REPLACE_ONE`` (Wang, Balle, Kasiviswanathan, AISTATS 2019,
      arXiv:1808.00087, Theorem 27; RDP only: the PLD accountant has no such event), with z
      relative to the replace-one sensitivity of the sum (2C; sqrt(2) M for votes);
    - ``"none"``: at q = 1.

    Fixed-size sampling under add/remove is refused (DISPLACEMENT) unless a total asks for the
    papers' convention, which accounts it as Poisson at q = L/N (NOT a DP guarantee)."""

    name = "subsampled_gaussian"
    family = "subsampled_gaussian"
    summary = "Gaussian mechanism on a Poisson (add/remove) or fixed-size (replace-one) sample"

    def unproven(self, d: dict) -> str | None:
        why = super().unproven(d)
        rel = REL.normalize(d.get("neighbouring", NEIGHBOURING))
        if why is not None and d.get("sampling") == "poisson" and rel not in ADD_REMOVE:
            why = (f"Poisson sampling is accounted under add/remove only, not {rel!r} (no "
                   "analysis of it under that relation is offered here)")
        return why

    def key(self, d: dict, who: str, notes: list) -> tuple:
        if d.get("sampling") == "none" or float(d["sample_rate"]) >= 1:
            return super().key(d, who, notes)
        z, q = float(d["noise_multiplier"]), float(d["sample_rate"])
        if (d.get("sampling") == "fixed"
                and REL.normalize(d.get("neighbouring", NEIGHBOURING)) in REPLACE):
            return (z, q, WOR)
        return (z, q)  # Poisson (or, under the papers' convention, fixed accounted as Poisson)

    def describe(self, key: tuple) -> dict:
        d = super().describe(key)
        if len(key) > 2 and key[2] == WOR:
            d["subsampling"] = "without replacement"
        return d

    def relation_free(self, d: dict) -> bool:
        return d.get("sampling") == "none" or d.get("sample_rate") == 1


@register_mechanism
class DistributedDiscreteGaussianMechanism(Mechanism):
    """The distributed discrete Gaussian of secure aggregation (Kairouz, Liu, Steinke, "The
    Distributed Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation",
    ICML 2021, arXiv:2102.06387, Theorem 1): ``params.noisy`` noise shares N_Z(0,
    ``params.local_sigma``^2) in ``params.dim`` coordinates, L2 sensitivity ``params.delta2``
    (integer units), maths in :mod:`popri.privacy.ddg`.  The release is (1/2) eps^2-concentrated
    DP (:func:`popri.privacy.ddg.cdp_epsilon`), i.e. RDP alpha eps^2 / 2 at every order; on a
    Poisson sample at rate q < 1 (``sampling`` other than ``"none"``), Zhu & Wang's general
    subsampling bound at integer orders (:func:`popri.privacy.ddg.rdp`).  RDP only: the PLD
    accountant refuses it (dp-accounting has no PLD for a concentrated-DP event).  The entry's
    ``noise_multiplier`` (sqrt(noisy) local_sigma / delta2) is for reading; the params decide."""

    name = "distributed_discrete_gaussian"
    family = "distributed_discrete_gaussian"
    summary = "distributed discrete Gaussian (secure aggregation mod m), concentrated DP"
    params_fields = ("dim", "noisy", "local_sigma", "delta2")

    def check(self, d: dict) -> None:
        super().check(d)
        p = d["params"]
        for k, lo in (("dim", 1), ("noisy", 0)):
            if p[k] != int(p[k]) or p[k] < lo:
                raise ParameterError(f"params.{k}", f"must be an integer >= {lo} (got {p[k]!r})")
        if p["local_sigma"] < 0:
            raise ParameterError("params.local_sigma", f"must be >= 0 (got {p['local_sigma']!r})")
        if not p["delta2"] > 0:
            raise ParameterError("params.delta2", f"must be > 0 (got {p['delta2']!r})")

    #: a fixed L of N under replace one client: no amplification claimed (see :meth:`key`)
    fixed_note = ("the distributed discrete Gaussian on a fixed-size sample (L of N clients) is "
                  "accounted at q = 1, with no amplification by sampling, under replace one "
                  "client at the sum's replace-one sensitivity (twice the rounded bound): given "
                  "the sampled set, whose law is the same for both datasets, the release is the "
                  "DDG of Kairouz, Liu, Steinke 2021, Thm 1, and a mixture of (eps, delta)-DP "
                  "pairs with common weights is (eps, delta)-DP")

    def unproven(self, d: dict) -> str | None:
        why = super().unproven(d)
        rel = REL.normalize(d.get("neighbouring", NEIGHBOURING))
        if why is not None and d.get("sampling") == "poisson" and rel not in ADD_REMOVE:
            why = (f"the distributed discrete Gaussian's subsampling bound (Zhu & Wang) is "
                   f"for Poisson sampling under add/remove, not {rel!r}")
        return why

    def relation_free(self, d: dict) -> bool:
        return d.get("sampling") == "none" or float(d["sample_rate"]) >= 1

    def scaled(self, d: dict, f: float) -> dict:
        p = dict(d.get("params") or {})
        p["delta2"] = float(p["delta2"]) * f  # the accountant reads the integer-unit bound
        return {**super().scaled(d, f), "params": p}

    def key(self, d: dict, who: str, notes: list) -> tuple:
        p = d["params"]
        # a fixed-size sample under replace one client: q = 1 (fixed_note); under add/remove it
        # is accounted only by the papers' convention, as Poisson at q = L/N (NOT DP)
        fixed_q1 = (d.get("sampling") == "fixed"
                    and REL.normalize(d.get("neighbouring", NEIGHBOURING)) not in ADD_REMOVE)
        q = 1.0 if d.get("sampling") == "none" or fixed_q1 else float(d["sample_rate"])
        if q == 1.0 and float(d["sample_rate"]) < 1:
            notes.append(f"{who}: {self.name} with sampling {d.get('sampling')!r} is accounted "
                         f"at q = 1 (no amplification by sampling)")
        n, s, d2 = int(p["noisy"]), float(p["local_sigma"]), float(p["delta2"])
        return (math.sqrt(n) * s / d2, q, int(p["dim"]), n, s, d2)

    def describe(self, key: tuple) -> dict:
        e = ddg.cdp_epsilon(key[5], key[4], key[3], key[2])
        return {"proof": "distributed discrete Gaussian: Kairouz, Liu, Steinke 2021, Thm 1 "
                         "(concentrated DP)" + ("; q < 1: Zhu & Wang 2019's Poisson "
                                                "subsampling bound" if key[1] < 1 else ""),
                "noise_multiplier": key[0], "sample_rate": key[1], "dim": key[2],
                "noisy": key[3], "local_sigma": key[4], "delta2": key[5],
                "epsilon_cdp": e if math.isfinite(e) else None}

    def infinite(self, key: tuple) -> bool:
        return key[3] == 0 or key[4] == 0

    def rdp(self, key: tuple, steps: int, orders) -> np.ndarray:
        eps = ddg.cdp_epsilon(key[5], key[4], key[3], key[2])
        return ddg.rdp(orders, eps, key[1]) * int(steps)


@register_mechanism
class TreeAggregationMechanism(GaussianMechanism):
    """Tree-aggregation noise of DP-FTRL (Kairouz, McMahan, Song, Thakkar, Thakurta, Xu,
    "Practical and Private (Deep) Learning without Sampling or Shuffling", arXiv:2103.00039,
    section 3 and appendix D; noise in :mod:`popri.privacy.tree`).  An entry is ``steps`` trees
    (restarts), each over ``params.leaves`` rounds, every node N(0, (z C)^2) with z =
    ``noise_multiplier``, and each client contributing (norm <= C) to at most ONE leaf per tree
    -- the caller guarantees this.  With ``leaves = 1`` (a restart every round) it holds even
    when every client takes part in every round: the DP-FTRL setting popri uses, where each
    round is one Gaussian release.  A leaf lies in at most d = :func:`popri.privacy.tree.depth`
    (leaves) = floor(log2(leaves)) + 1 released nodes, so a tree is the Gaussian mechanism at
    multiplier z / sqrt(d): RDP = steps alpha d / (2 z^2), equal to dp-accounting's
    ``SelfComposedDpEvent(SingleEpochTreeAggregationDpEvent(z, leaves), steps)`` under
    ``NeighboringRelation.REPLACE_SPECIAL`` (the relation dp-accounting requires for trees: a
    client's data replaced by the zero record; popri's add/remove of a client whose absence
    leaves the others' leaves unchanged moves the nodes the same way); PLD:
    ``SelfComposedDpEvent(GaussianDpEvent(z / sqrt(d)), steps)``.  ``sample_rate`` < 1 is
    accounted at q = 1, with a note: no amplification by sampling is claimed for trees."""

    name = "tree_aggregation"
    family = "tree_aggregation"
    summary = "tree-aggregation Gaussian noise of DP-FTRL (restarts every params.leaves rounds)"
    params_fields = ("leaves",)

    def check(self, d: dict) -> None:
        super().check(d)
        v = d["params"]["leaves"]
        if v != int(v) or v < 1:
            raise ParameterError("params.leaves", f"must be an integer >= 1 (got {v!r})")

    def unproven(self, d: dict) -> str | None:
        why = super().unproven(d)
        if why is None and self._blocks_add_remove(d):
            why = ("a DP-FTRL tree over blocks of a permutation (fl.assignment: blocks) holds "
                   "under zero-out one client, not add/remove: an added client takes a slot and "
                   "pushes another out of its leaf (Kairouz et al. 2021 and dp-accounting "
                   "account trees under zero-out)")
        p = d.get("params") or {}
        if (why is None and d.get("sampling") in ("poisson", "fixed")
                and int(p.get("leaves", 1)) > 1):
            why = (f"a tree of {int(p['leaves'])} leaves on a fresh sample every round: a client "
                   "can sit in several leaves, and the tree's accounting needs each client in "
                   "one leaf (a sampled round is a one-leaf tree, fl.restart: round)")
        return why

    @staticmethod
    def _blocks_add_remove(d: dict) -> bool:
        """A block tree (epoch restarts, ``fl.assignment: blocks``) recorded under add/remove,
        as popri <= 0.3 did."""
        p = d.get("params") or {}
        return (REL.normalize(d.get("neighbouring", NEIGHBOURING)) in ADD_REMOVE
                and p.get("restart") == "epoch" and p.get("assignment", "blocks") == "blocks"
                and int(p.get("leaves", 1)) > 1)

    def papers(self, d: dict) -> bool:
        """Also popri <= 0.3's block trees under add/remove (totalled as if add/remove)."""
        if super().papers(d):
            return True
        return self._blocks_add_remove(d) and REL.pair_status(
            self.family, d.get("sampling", "none"), d.get("neighbouring", NEIGHBOURING)) == "proven"

    def relation_free(self, d: dict) -> bool:
        return True  # accounted at q = 1: the Gaussian at z / sqrt(depth)

    def key(self, d: dict, who: str, notes: list) -> tuple:
        if float(d["sample_rate"]) < 1:
            notes.append(f"{who}: {self.name} with sample_rate {d['sample_rate']:g} is accounted "
                         f"at q = 1 (no amplification by sampling for tree aggregation)")
        return (float(d["noise_multiplier"]), 1.0, int(d["params"]["leaves"]))

    def describe(self, key: tuple) -> dict:
        return {"noise_multiplier": key[0], "sample_rate": key[1], "leaves": key[2],
                "proof": ("tree aggregation, a client in one leaf: the Gaussian at z / "
                          "sqrt(depth) (Kairouz et al. 2021; dp-accounting "
                          "SingleEpochTreeAggregationDpEvent under REPLACE_SPECIAL)")}

    @staticmethod
    def _gauss(key: tuple) -> tuple:
        """The key of the equivalent Gaussian: (z / sqrt(depth), 1)."""
        return (float(key[0]) / math.sqrt(depth(int(key[2]))), 1.0)

    def rdp(self, key: tuple, steps: int, orders) -> np.ndarray:
        return super().rdp(self._gauss(key), steps, orders)

    def event(self, key: tuple, steps: int):
        return super().event(self._gauss(key), steps)

    def loss_range(self, key: tuple, steps: int) -> float:
        return super().loss_range(self._gauss(key), steps)


#: the key tag of sampling without replacement (fixed L of N, replace one client)
WOR = "wor"


def _population(q: float) -> tuple[int, int]:
    """(N, L) with L / N = q, for dp-accounting's ``SampledWithoutReplacementDpEvent`` (whose
    analysis reads only the ratio): the fraction's smallest exact form."""
    from fractions import Fraction

    f = Fraction(float(q)).limit_denominator(10 ** 9)
    return f.denominator, f.numerator


@lru_cache(maxsize=4096)
def _wor_rdp(z: float, q: float, orders: tuple) -> np.ndarray:
    """RDP at ``orders`` of one Gaussian release of multiplier z on L of N clients sampled
    without replacement (q = L/N), under replace one client: dp-accounting's RDP accountant on
    ``SampledWithoutReplacementDpEvent`` (Wang, Balle, Kasiviswanathan 2019, Theorem 27; exact
    at integer orders <= 256, its Stirling bound above, interpolated between integers by their
    Corollary 10).  Cached: a calibration asks for the same (z, q) again."""
    from dp_accounting import dp_event
    from dp_accounting.privacy_accountant import NeighboringRelation
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    if z == 0:
        return np.full(len(orders), np.inf)
    n, m = _population(q)
    acc = RdpAccountant(list(orders), NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_event.SampledWithoutReplacementDpEvent(n, m, dp_event.GaussianDpEvent(z)))
    return np.asarray(acc._rdp, dtype=float).copy()  # noqa: SLF001 (the accountant's RDP vector)


GAUSSIAN = MECHANISMS["gaussian"]
SUBSAMPLED_GAUSSIAN = MECHANISMS["subsampled_gaussian"]
