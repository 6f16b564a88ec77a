"""Neighbouring relations: which one each release is accounted under, the L2 sensitivity of a
clipped sum under it, and the only conversions a total may apply.

    popri account ledger runs/demo                       # prints the relation of the total
    popri account ledger old-run/ --convention papers    # the papers' convention: NOT DP
    python -m pytest -q tests/test_relations.py tests/test_worst_case.py

Pure functions and constants (no accountant here: :mod:`popri.privacy.mechanisms` has the
maths of each mechanism, :mod:`popri.privacy.accounting` composes them).  User level: a record
is one client's whole data.

The relations (``neighbouring`` of every ledger entry):

- ``add/remove one client``: D' = D plus one client (or minus one).  The number of clients N is
  private.  What every default of popri promises.
- ``replace one client``: D' = D with one client's data replaced by another's; N is the same in
  both, hence public.
- ``zero-out one client``: D' = D with one client's data replaced by the zero record (it keeps
  its slot and contributes nothing): the relation DP-FTRL's tree accounting is proven under
  (Kairouz, McMahan, Song, Thakkar, Thakurta, Xu, "Practical and Private (Deep) Learning without
  Sampling or Shuffling", ICML 2021, arXiv:2103.00039; dp-accounting's
  ``NeighboringRelation.REPLACE_SPECIAL``).
- ``add/remove one sample`` / ``replace one sample``: FreD at sample level (its entries).

Sampling scheme -> relation, as popri records it (:func:`of_sampling`):

=========  ===================  ===================================================================
sampling   relation             why it is proven
=========  ===================  ===================================================================
none       add/remove           every client takes part: the sum gains or loses one contribution
poisson    add/remove           each client independently w.p. q: Poisson subsampling amplifies
                                under add/remove (Mironov, Talwar, Zhang, arXiv:1908.10530)
fixed      replace one client   L of N without replacement: dp-accounting's
                                ``SampledWithoutReplacementDpEvent`` (Wang, Balle,
                                Kasiviswanathan, "Subsampled Renyi Differential Privacy and
                                Analytical Moments Accountant", AISTATS 2019, arXiv:1808.00087,
                                Theorem 27), which holds under replace-one only
=========  ===================  ===================================================================

Fixed-size sampling under add/remove has no accountant here: a client added to N is sampled with
probability L/(N+1) and then *displaces* another, so the released sum moves by up to 2C, not C;
accounting it as Poisson at q = L/N (what POPri D.1 and PrE-Text D.1 did) under-states epsilon
(Lebeda, Regehr, Kamath, Steinke, "Avoiding Pitfalls for Privacy Accounting of Subsampled
Mechanisms under Composition", arXiv:2405.20769; Chua et al., "How Private are DP-SGD
Implementations?", ICML 2024, arXiv:2403.17673).  It is offered only by name,
``convention="papers"`` (:data:`CONVENTIONS`), and every total that uses it says
:data:`PAPERS_NOTE`.

Sensitivity of a round's sum (:func:`sensitivity`) when one client's contribution is bounded by
B (an L2 clip C, or at most M histogram votes):

- add/remove, zero-out: B (one contribution more or less);
- replace, vectors in the C-ball (cosine scores, model updates of DP-FedAvg / DP-FTRL /
  FewFedPIT, FreD's sums): 2C, attained by x = C e1, y = -C e1;
- replace, non-negative votes (the nn-histogram of PrE-Text): sqrt(2) M, since ||h - h'||^2 =
  ||h||^2 + ||h'||^2 - 2 <h, h'> <= 2 M^2 for non-negative h, h' with ||h||_1, ||h'||_1 <= M,
  attained by M votes each in two different bins.

Conversions a total may apply (:func:`conversion`; anything else is refused with one line):

- a q = 1 Gaussian-family entry (no sampling amplification: ``gaussian``, ``tree_aggregation``,
  the distributed discrete Gaussian at q = 1) under add/remove with sensitivity D counts under
  replace-one or zero-out with sensitivity 2D: replacing x by y (or by the zero record) is
  removing x and adding y, and the L2 sensitivity of the released sum is subadditive (triangle
  inequality), so the same mechanism is the Gaussian at multiplier z/2 under that relation;
- a replace-one entry counts under zero-out as it is: zero-out is the replacement by one
  particular record.

Which (sampling, neighbouring) pair of which mechanism a ledger entry may record at all is ONE
table, :data:`PROVEN` (with the proof of each row), shared by the ledger reader
(:meth:`popri.privacy.ledger.LedgerEntry.from_dict`: any ledger line, sidecar or hand-written
entry), the writer (:class:`popri.privacy.ledger.LockedLedgers`), the totals
(:meth:`popri.privacy.mechanisms.Mechanism.unproven`) and the table "Ledger entries popri
accepts" of docs/privacy.md (``tests/test_relations.py`` checks that the two are equal).  Any
other pair is refused with one line naming the file, line and pair -- except
:data:`PAPERS_PAIRS` (fixed-size sampling under add/remove, what popri <= 0.3 recorded), which
only the papers' convention totals, by name.
"""

from __future__ import annotations

import math

from popri.specs.privacy import CONVENTIONS  # ("papers",): conventions asked for by name

ADD_REMOVE = "add/remove one client"
REPLACE = "replace one client"
ZERO_OUT = "zero-out one client"
ADD_REMOVE_SAMPLE = "add/remove one sample"
REPLACE_SAMPLE = "replace one sample"
#: every relation a ledger entry may name, compared exactly after :func:`normalize`
RELATIONS = (ADD_REMOVE, ADD_REMOVE_SAMPLE, REPLACE, REPLACE_SAMPLE, ZERO_OUT)
ADD_REMOVE_ALL = (ADD_REMOVE, ADD_REMOVE_SAMPLE)
REPLACE_ALL = (REPLACE, REPLACE_SAMPLE)

#: CONVENTIONS (imported above, declared in the spec): asked for by name; none is a DP guarantee
PAPERS_NOTE = ("NOT A DP GUARANTEE: totalled under the papers' convention (--convention "
               "papers): fixed-size sampling (L of N clients) accounted as Poisson sampling at "
               "q = L/N under add/remove one client, and DP-FTRL's block trees as if add/remove, "
               "as POPri D.1 and PrE-Text D.1 did; an added client displaces another, so the "
               "true epsilon can be much larger (docs/privacy.md)")


#: the sampling schemes a ledger entry may name (``sampling``)
SAMPLINGS = ("none", "poisson", "fixed")

_GAUSS = ("the Gaussian mechanism at the sum's L2 sensitivity under this relation: its curve "
          "is a function of z alone (Balle & Wang, ICML 2018; Mironov 2017)")
_Q1_POISSON = ("accounted at q = 1 (no amplification): given the sample the Gaussian; an added "
               "client is sampled or not, a mixture with common weights")
_Q1_FIXED = ("accounted at q = 1 (no amplification): the sample's law is the same under replace "
             "one client, and given it the Gaussian at 2C")
_GAUSSIAN_ROWS = {
    **{("none", r): _GAUSS for r in RELATIONS},
    ("poisson", ADD_REMOVE): _Q1_POISSON,
    ("fixed", REPLACE): _Q1_FIXED,
}
#: mechanism (its ``family``: a registered subclass inherits its parent's) -> {(sampling,
#: neighbouring): the proof its accounting rests on}.  THE table of proven pairs (module
#: docstring); docs/privacy.md's "Ledger entries popri accepts" is this table.
PROVEN: dict[str, dict[tuple[str, str], str]] = {
    "gaussian": dict(_GAUSSIAN_ROWS),
    "subsampled_gaussian": {
        **_GAUSSIAN_ROWS,
        ("poisson", ADD_REMOVE): "Poisson subsampled Gaussian (Mironov, Talwar, Zhang 2019, "
                                 "arXiv:1908.10530; dp-accounting PoissonSampledDpEvent)",
        ("fixed", REPLACE): "sampling without replacement under replace one client (Wang, Balle, "
                            "Kasiviswanathan 2019, arXiv:1808.00087, Thm 27)",
    },
    "tree_aggregation": {
        ("none", ADD_REMOVE): "a tree whose clients are each in one leaf, drawn independently "
                              "(fl.assignment: bins), or a one-leaf tree: the Gaussian at "
                              "z / sqrt(depth) (Kairouz et al. 2021, arXiv:2103.00039)",
        ("none", ZERO_OUT): "a tree over blocks of a permutation (fl.assignment: blocks): "
                            "dp-accounting SingleEpochTreeAggregationDpEvent, REPLACE_SPECIAL",
        ("poisson", ADD_REMOVE): "a one-leaf tree (params.leaves = 1, fl.restart: round): "
                                 + _Q1_POISSON,
        ("fixed", REPLACE): "a one-leaf tree (params.leaves = 1, fl.restart: round): " + _Q1_FIXED,
    },
    "distributed_discrete_gaussian": {
        **{("none", r): "the DDG at q = 1 at the sum's sensitivity under this relation "
                        "(Kairouz, Liu, Steinke 2021, arXiv:2102.06387, Thm 1)"
           for r in (ADD_REMOVE, REPLACE, ZERO_OUT)},
        ("poisson", ADD_REMOVE): "the DDG on a Poisson sample: Zhu & Wang 2019's subsampling "
                                 "bound",
        ("fixed", REPLACE): "the DDG at q = 1 (no amplification): the sample's law is the same "
                            "under replace one client",
    },
}
#: pairs with NO proven accounting that only the papers' convention totals, by name (NOT a DP
#: guarantee): fixed-size sampling under add/remove (the displacement pair), of any mechanism
PAPERS_PAIRS = frozenset({("fixed", ADD_REMOVE)})


def proven_pairs(family: str) -> dict[tuple[str, str], str]:
    """The proven (sampling, neighbouring) pairs of a mechanism family (:data:`PROVEN`; {} for
    a family the table does not know: nothing is accepted)."""
    return PROVEN.get(family, {})


def pair_status(family: str, sampling: str, relation: str) -> str | None:
    """``"proven"`` (in :data:`PROVEN`), ``"papers"`` (in :data:`PAPERS_PAIRS`: totalled only
    under the papers' convention, NOT DP) or None (refused everywhere)."""
    pair = (sampling, normalize(relation))
    if pair in proven_pairs(family):
        return "proven"
    if pair in PAPERS_PAIRS:
        return "papers"
    return None


def describe_pairs(family: str) -> str:
    """The proven pairs of ``family`` for a one-line message: ``SAMPLING under RELATION or
    ...; ...``."""
    rows = proven_pairs(family)
    parts = [f"{s} under " + " or ".join(r for r in RELATIONS if (s, r) in rows)
             for s in SAMPLINGS if any((s, r) in rows for r in RELATIONS)]
    return "; ".join(parts) or "no pair"


def normalize(relation: str) -> str:
    """Lower case, single blanks: the form compared against :data:`RELATIONS`."""
    return " ".join(str(relation).lower().split())


def unit(relation: str) -> str:
    """``client`` or ``sample``: relations of different units never add up."""
    return "sample" if normalize(relation).endswith("sample") else "client"


def of_sampling(sampling: str, convention: str | None = None) -> str:
    """The relation popri records for a release on clients drawn by ``sampling`` (``none`` |
    ``poisson`` | ``fixed``): add/remove, except fixed-size sampling, which is replace-one --
    or add/remove under the papers' convention (NOT a DP guarantee)."""
    if sampling not in ("none", "poisson", "fixed"):
        raise ValueError(f"unknown sampling {sampling!r}")
    if convention is not None and convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r} (known: {', '.join(CONVENTIONS)})")
    if sampling == "fixed" and convention != "papers":
        return REPLACE
    return ADD_REMOVE


def factor(relation: str, *, nonnegative: bool = False) -> float:
    """Sensitivity under ``relation`` / the bound on one contribution: 1 for add/remove and
    zero-out, 2 for replace (sqrt 2 for non-negative vote vectors)."""
    rel = normalize(relation)
    if rel not in RELATIONS:
        raise ValueError(f"unknown relation {relation!r}")
    if rel in REPLACE_ALL:
        return math.sqrt(2.0) if nonnegative else 2.0
    return 1.0


def sensitivity(bound: float, relation: str, *, nonnegative: bool = False) -> float:
    """L2 sensitivity of a sum of contributions bounded by ``bound`` (C, or M votes) under
    ``relation`` (module docstring)."""
    return float(bound) * factor(relation, nonnegative=nonnegative)


def round_relation(bound: float, sampling: str, convention: str | None = None, *,
                   nonnegative: bool = False) -> tuple[str, float]:
    """(relation, L2 sensitivity of the sum) of one round on clients drawn by ``sampling``
    whose contributions are bounded by ``bound``: what the stage records and what its noise std
    is z times (``popri score``, ``popri fl round``, FewFedPIT's DP aggregate, and the budget
    that plans them all call this)."""
    rel = of_sampling(sampling, convention)
    return rel, sensitivity(bound, rel, nonnegative=nonnegative)


def conversion(relation: str, target: str, *, relation_free: bool) -> float | None:
    """The factor an entry's sensitivity is multiplied by to count under ``target`` (its noise
    multiplier divided by it), or None when no proven conversion exists.  ``relation_free``: the
    entry is a q = 1 Gaussian-family release (its privacy curve is a function of z alone)."""
    rel, tgt = normalize(relation), normalize(target)
    if rel == tgt:
        return 1.0
    if unit(rel) != unit(tgt):
        return None
    if rel in REPLACE_ALL and tgt == ZERO_OUT:
        return 1.0
    if rel in ADD_REMOVE_ALL and tgt in (*REPLACE_ALL, ZERO_OUT) and relation_free:
        return 2.0
    return None
