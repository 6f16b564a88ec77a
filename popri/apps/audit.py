"""Empirical privacy audit of one release: a lower bound on epsilon by replaying the mechanism.

    popri audit release --mechanism cosine -z 1 --trials 10000
    popri audit release --mechanism nn-histogram -z 2 --trials 10000 --json
    popri audit release --mechanism fred --epsilon 0.9 --delta 1e-5 --trials 10000
    popri audit release --mechanism cosine -z 1 --trials 10000 --break half-noise   # exit 1
    python -m pytest -q tests/test_audit.py

Differential privacy is a claim about two neighbouring datasets D and D' = D + one record: no
test that sees one output can tell them apart with false-positive rate FPR and false-negative
rate FNR unless FNR >= 1 - delta - e^eps FPR and FPR >= 1 - delta - e^eps FNR.  Running the
mechanism many times on D and on D' and measuring one test's error rates therefore gives a
lower bound on the epsilon the mechanism really has (Jagielski, Ullman, Oprea, "Auditing
differentially private machine learning: how private is private SGD?", NeurIPS 2020,
arXiv:2006.07709)::

    eps_lb = max(log((1 - delta - FNR_hi) / FPR_hi), log((1 - delta - FPR_hi) / FNR_hi))

with FPR_hi, FNR_hi Clopper-Pearson upper confidence bounds of the measured rates.  If eps_lb
exceeds the epsilon the ledger claims, the claim is false (with the stated confidence).

What is replayed.  Nothing is re-implemented: every trial calls the library's own release code
with research-mode seeded noise (one seed per trial and world, from ``--seed``), on a small
random private set (``--clients`` N, ``--dim`` d, ``--synthetic`` n samples; everyone takes part,
q = 1) without (D) and with (D') one worst-case canary record (Nasr, Song, Thakurta, Papernot,
Carlini, "Adversary instantiation: lower bounds for differentially private machine learning",
IEEE S&P 2021, arXiv:2101.04535: the canary is the record whose contribution after clipping is
largest):

- cosine (:func:`popri.feedback.cosine.cosine_round` + :func:`~popri.federated.aggregation.finish`, the
  mean): the canary client's private embeddings equal synthetic sample 0, so its standardised
  score vector has norm sqrt(n) (10 C at n = 100, C = 1) and the clip must cut it to C.
- nn-histogram (:func:`popri.feedback.histogram.histogram_round`, sum, threshold 0): the canary client
  holds 10 M copies of a synthetic sample placed far from every other one; the per-client cap
  (:func:`popri.federated.participation.cap_per_client`) must keep M of its votes.
- fred (:func:`popri.methods.fred.stats.release`, release 1 = the noisy sum behind the mean, whose
  epsilon is the ``--epsilon`` each release claims): a canary record (one sample, or at
  ``--level user`` a client with 10 m identical samples) at norm 10 c along e_1; replace-one:
  D holds it at -10 c e_1, add-remove: D lacks it.

``--dataset adversarial`` lets the adversary pick D too (Nasr et al. 2021): every other record
mirrors the canary (cosine: the opposite embedding; nn-histogram: votes for the canary's sample;
fred: -e_1).  This exposes that the cosine release divides its sum by the exact number of
participating clients (private under add/remove neighbours): with every other client opposite
the canary, D and D' differ by about 2 C, and the audit of the real mechanism fails
(``popri audit release --mechanism cosine -z 1 --trials 10000 --dataset adversarial``).

The noise of cosine and nn-histogram is drawn once on the sum (``noisy_sum``), so one library
call runs all trials: its noise source returns each trial's draw, from that trial's own seeded
stream, stacked.  FreD is called once per trial (``--clients`` defaults to 3 records there).

The attack.  The attacker knows D, the canary and the mechanism, so it knows both expected
outputs mu_0, mu_1 (the mechanism replayed with z = 0, or with a zero noise source); its statistic
is the projection <out - mu_0, mu_1 - mu_0> / |mu_1 - mu_0|, the likelihood-ratio test for
Gaussian noise (Neyman-Pearson).  The threshold is chosen on the first half of the trials of each
world (:func:`best_threshold`), FPR and FNR are measured on the second half, so the bounds are
not flattered by the choice.

Two bounds, each at confidence 1 - alpha/2 (Bonferroni; alpha = 1 - --confidence, so a mechanism
that keeps its claim is flagged with probability <= alpha):

- ``epsilon_lower_bound``: the formula above; each rate's upper bound at tail alpha/4.  "ci" is
  the interval from the two-sided Clopper-Pearson intervals of both rates (tails alpha/4 each, so
  it holds with >= 1 - alpha); its lower end is the bound.
- ``mu_lower_bound`` (Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini, Terzis, "Tight
  auditing of differentially private machine learning", USENIX Security 2023, arXiv:2302.07956): a
  mechanism that is mu-GDP (Dong, Roth, Su, "Gaussian differential privacy", 2022,
  arXiv:1905.02383) has FNR >= Phi(Phi^-1(1 - FPR) - mu) for every test, so
  mu >= Phi^-1(1 - FPR_hi) - Phi^-1(FNR_hi).  A Gaussian release with noise multiplier z on its
  sensitivity (what every stage here claims to be, at q = 1) is exactly 1/z-GDP, and the accountants derive the
  ledger's epsilon from that z, so this bound tests the ledger's z itself, and is far tighter than
  the (eps, delta) formula at small delta.  ``gdp_epsilon`` is epsilon(delta) of mu_lb-GDP; it
  exceeds the claimed epsilon only if mu_lb > 1/z (the claim is at least the exact epsilon of a
  1/z Gaussian), so flagging on it is sound.

Verdict "violation" (exit status 1, one line per bound) when epsilon_lower_bound or gdp_epsilon
exceeds the claimed epsilon.  The claim of a cosine / nn-histogram release is
``popri.privacy.accounting.epsilon(z, 1, 1, delta, accountant)`` (what the ledger entry is
worth); FreD's is its ``--epsilon`` per release (with ``-z``: the same accountant formula).

Deliberately broken mechanisms (``--break``), run through the library's own parameters (no code
is patched): ``no-clip`` (cosine: ``cosine_round(clip_to=...)`` past any norm, the canary
contributes sqrt(n) = 10 C; nn-histogram: no per-client cap, 10 M votes; fred:
``private_stats(clip_to=inf)``, 10 c; the noise stays that of the claimed clip) and
``half-noise`` (the noise multiplier passed to the mechanism is z / 2, the claim stays at z).
A sound audit flags both.  Not covered: client subsampling (q < 1), several rounds, release mode
(discrete Gaussian from os.urandom is not seedable; its claim is the same z), and one-run
auditing (Steinke, Nasr, Jagielski, "Privacy auditing with one (1) training run", NeurIPS 2023,
arXiv:2305.08846), which needs many canaries in one release instead of many releases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from popri.apps.flower import node
from popri.core import log
from popri.federated import aggregation, participation
from popri.feedback import cosine, histogram
from popri.feedback.release import public_denominator
from popri.methods.dpfl.rounds import tree_noise
from popri.methods.fred import stats as fred
from popri.privacy import accounting as A
from popri.privacy import calibration as C
from popri.privacy import ddg
from popri.privacy import entries as E
from popri.privacy.calibration import gaussian_log_delta
from popri.privacy.noise import make_rng
from popri.privacy.relations import round_relation
from popri.privacy.tree import depth, leaf_nodes
from popri.specs.feedback import ScoreSpec
from popri.specs.fl import FLSpec
from popri.specs.privacy import AUDIT_BREAKS as BREAKS  # noqa: F401  (re-exported)
from popri.specs.privacy import AUDIT_CLIENTS as DEFAULT_CLIENTS
from popri.specs.privacy import AUDIT_MECHANISMS as MECHANISMS  # noqa: F401  (re-exported)
from popri.specs.privacy import AuditSpec

CANARY_FACTOR = 10  # the canary brings this many times the sensitivity before clip / cap
TRAIN_TAIL = 1e-3  # Clopper-Pearson tail used to pick the threshold on the training half
FAR = 50.0  # nn-histogram: distance of the canary's synthetic sample (others ~ N(0, I_d))


# --------------------------------------------------------------------------- statistics
def clopper_pearson(k, n, alpha: float = 0.05):
    """Two-sided Clopper-Pearson interval (lo, hi) of a binomial rate, k successes of n, at level
    1 - alpha (each tail alpha / 2).  Vectorised over k; lo = 0 at k = 0, hi = 1 at k = n."""
    from scipy.stats import beta

    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        lo = np.where(k > 0, beta.ppf(alpha / 2, np.maximum(k, 1), n - k + 1), 0.0)
        hi = np.where(k < n, beta.ppf(1 - alpha / 2, k + 1, np.maximum(n - k, 1)), 1.0)
    if lo.ndim == 0:
        return float(lo), float(hi)
    return lo, hi


def epsilon_from_rates(fpr, fnr, delta: float):
    """max(log((1 - delta - FNR) / FPR), log((1 - delta - FPR) / FNR)), at least 0 (vectorised)."""
    fpr, fnr = np.asarray(fpr, dtype=np.float64), np.asarray(fnr, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(1 - delta - fnr > 0, np.log(np.maximum(1 - delta - fnr, 1e-300)) - np.log(fpr),
                     -np.inf)
        b = np.where(1 - delta - fpr > 0, np.log(np.maximum(1 - delta - fpr, 1e-300)) - np.log(fnr),
                     -np.inf)
    e = np.maximum(np.maximum(a, b), 0.0)
    return float(e) if e.ndim == 0 else e


def mu_from_rates(fpr, fnr):
    """Phi^-1(1 - FPR) - Phi^-1(FNR), at least 0: the smallest mu of a mu-GDP mechanism that has
    a test with these rates (vectorised)."""
    from scipy.special import ndtri

    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.maximum(-ndtri(np.asarray(fpr, dtype=np.float64))
                       - ndtri(np.asarray(fnr, dtype=np.float64)), 0.0)
    m = np.where(np.isnan(m), 0.0, m)
    return float(m) if m.ndim == 0 else m


def gdp_epsilon(mu: float, delta: float) -> float:
    """epsilon at ``delta`` of a mu-GDP mechanism (= a Gaussian mechanism with multiplier 1/mu):
    the root of Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) = delta (Balle & Wang 2018)."""
    from scipy.optimize import brentq

    if not mu > 0:
        return 0.0
    if not math.isfinite(mu):
        return math.inf
    z, target = 1.0 / mu, math.log(delta)
    f = lambda e: gaussian_log_delta(z, e) - target  # noqa: E731  (decreasing in e)
    if f(0.0) <= 0:
        return 0.0
    hi = 1.0
    while f(hi) > 0:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    return float(brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-12))


def _counts(s0: np.ndarray, s1: np.ndarray, t) -> tuple[np.ndarray, np.ndarray]:
    """Errors of the test "D' iff statistic > t": false positives among s0, false negatives
    among s1 (``t`` scalar or array)."""
    a0, a1 = np.sort(s0), np.sort(s1)
    fp = len(a0) - np.searchsorted(a0, t, side="right")
    fn = np.searchsorted(a1, t, side="right")
    return fp, fn


def best_threshold(s0: np.ndarray, s1: np.ndarray, bound, alpha: float = 2 * TRAIN_TAIL) -> float:
    """The threshold (among the observed statistics) whose ``bound(FPR_hi, FNR_hi)`` is largest on
    this (training) sample; upper bounds are Clopper-Pearson at tail alpha / 2.

    The default tail, TRAIN_TAIL = 1e-3, is stricter than the test's: it discounts thresholds
    whose training rates rest on a handful of errors, which otherwise win the maximum by luck
    (the winner's curse) and do poorly on the test half."""
    cand = np.unique(np.concatenate([s0, s1]))
    fp, fn = _counts(s0, s1, cand)
    fpr_hi = clopper_pearson(fp, len(s0), alpha)[1]
    fnr_hi = clopper_pearson(fn, len(s1), alpha)[1]
    return float(cand[int(np.argmax(bound(fpr_hi, fnr_hi)))])


def audit_statistics(stat0, stat1, *, delta: float, confidence: float = 0.95) -> dict:
    """Threshold on the first half of each world's trials, rates and bounds on the second half.

    Returns the epsilon bound (with its interval), the GDP bound and the test's rates; see the
    module docstring for the confidence levels."""
    s0, s1 = np.asarray(stat0, dtype=np.float64), np.asarray(stat1, dtype=np.float64)
    h0, h1 = len(s0) // 2, len(s1) // 2
    tr0, te0, tr1, te1 = s0[:h0], s0[h0:], s1[:h1], s1[h1:]
    alpha = 1.0 - confidence
    a = alpha / 2  # per bound; per rate: two-sided at level 1 - a (tails a / 2)

    t_eps = best_threshold(tr0, tr1, lambda f, g: epsilon_from_rates(f, g, delta))
    fp, fn = (int(x) for x in _counts(te0, te1, t_eps))
    fpr_lo, fpr_hi = clopper_pearson(fp, len(te0), a)
    fnr_lo, fnr_hi = clopper_pearson(fn, len(te1), a)
    eps_lb = epsilon_from_rates(fpr_hi, fnr_hi, delta)
    eps_hi = epsilon_from_rates(fpr_lo, fnr_lo, delta)

    t_mu = best_threshold(tr0, tr1, mu_from_rates)
    gp, gn = (int(x) for x in _counts(te0, te1, t_mu))
    mu_lb = mu_from_rates(clopper_pearson(gp, len(te0), a)[1], clopper_pearson(gn, len(te1), a)[1])
    return {
        "epsilon_lower_bound": eps_lb,
        "ci": [eps_lb, eps_hi if math.isfinite(eps_hi) else None],
        "threshold": t_eps, "fpr": fp / len(te0), "fnr": fn / len(te1),
        "fpr_upper": fpr_hi, "fnr_upper": fnr_hi,
        "mu_lower_bound": mu_lb, "gdp_epsilon": gdp_epsilon(mu_lb, delta),
        "gdp_threshold": t_mu, "gdp_fpr": gp / len(te0), "gdp_fnr": gn / len(te1),
        "test_trials": [len(te0), len(te1)],
    }


# --------------------------------------------------------------------------- noise sources
def trial_seeds(seed: int, world: int, trials: int) -> np.ndarray:
    """One research-mode seed per trial of world 0 (D) or 1 (D'), derived from ``seed``."""
    return np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 0xA0D17, world]).generate_state(
        trials, dtype=np.uint32)


class TrialNoise:
    """A noise source for one library call that runs every trial: ``standard_normal(shape)``
    returns [trials, *shape], row t drawn from ``make_rng(seeds[t], stream=stream)`` (the stream
    a release seeded with seeds[t] uses)."""

    def __init__(self, seeds: np.ndarray, stream: str):
        self.seeds, self.stream = [int(s) for s in seeds], stream

    def standard_normal(self, size=None, dtype=np.float64) -> np.ndarray:
        return np.stack([make_rng(s, stream=self.stream).standard_normal(size, dtype=dtype)
                         for s in self.seeds])


class ZeroNoise:
    """A noise source that draws zeros: the mechanism's expected output (the attacker's mu)."""

    def standard_normal(self, size=None, dtype=np.float64):
        return np.zeros(size if size is not None else (), dtype=dtype)

    def random(self, size=None):
        return np.zeros(size if size is not None else (), dtype=np.float64)


# --------------------------------------------------------------------------- broken mechanisms
#: the cosine round's ``clip_to`` under ``no-clip``: its coefficients divide by the clip, so
#: the largest finite float, not inf (no score vector comes near it)
FLOAT_MAX = float(np.finfo(np.float64).max)


def clip_to(brk: str | None, unbounded: float = math.inf) -> float | None:
    """``no-clip``: the norm the library's clipping is run at (``unbounded``: nothing is
    clipped; the noise keeps the claimed clip's scale), passed as the mechanism's ``clip_to``;
    None (the mechanism's own clip) otherwise.  ``half-noise`` changes the multiplier passed to
    the mechanism instead (:func:`run_z`)."""
    return unbounded if brk == "no-clip" else None


def run_z(z: float, brk: str | None) -> float:
    """The noise multiplier the mechanism is run with (``half-noise``: z / 2; the claim stays z)."""
    return z / 2.0 if brk == "half-noise" else z


# --------------------------------------------------------------------------- the worlds
@dataclass
class Setup:
    mechanism: str
    z: float  # the claimed noise multiplier
    trials: int
    seed: int = 0
    clients: int | None = None
    synthetic: int = 100
    dim: int = 16
    clip: float = 1.0
    max_samples_per_client: int | None = None
    relation: str = "replace-one"  # fred
    level: str = "sample"  # fred
    brk: str | None = None
    dataset: str = "random"  # or "adversarial": every other record mirrors the canary
    sample_rate: float = 0.1  # subsampled
    clients_per_round: int = 10  # fixed
    convention: str | None = None  # fixed: "papers" replays popri <= 0.3's noise and claim
    leaves: int = 8  # tree
    nodes: int = 4  # ddg
    notes: list = field(default_factory=list)

    @property
    def n_clients(self) -> int:
        return int(self.clients or DEFAULT_CLIENTS[self.mechanism])


def _projection(out0: np.ndarray, out1: np.ndarray, mu0: np.ndarray, mu1: np.ndarray):
    """Each trial's <out - mu0, u>, u = (mu1 - mu0) / |mu1 - mu0|, for both worlds."""
    diff = np.asarray(mu1, dtype=np.float64) - np.asarray(mu0, dtype=np.float64)
    norm = float(np.linalg.norm(diff))
    if not norm > 0:
        raise RuntimeError("the canary does not change the mechanism's expected output")
    u = diff / norm
    s0 = (np.asarray(out0, dtype=np.float64) - mu0) @ u
    s1 = (np.asarray(out1, dtype=np.float64) - mu0) @ u
    return s0, s1, norm


def _stacked(out, trials: int, n: int) -> np.ndarray:
    out = np.asarray(out)
    if out.shape != (trials, n):  # the library's noise step no longer broadcasts over trials
        raise RuntimeError(f"expected [{trials}, {n}] outputs from one call, got {out.shape}")
    return out


def _base_rows(rng, n_clients: int, dim: int, max_rows: int):
    counts = rng.integers(1, max_rows + 1, n_clients)
    emb = rng.standard_normal((int(counts.sum()), dim))
    ids = [f"client-{k:05d}" for k, c in enumerate(counts) for _ in range(int(c))]
    return emb, ids


def _score_worlds(s: Setup):
    """cosine / nn-histogram: (stat0, stat1, canary description)."""
    rng = make_rng(s.seed, stream="audit-data")
    n, d, cos = s.synthetic, s.dim, s.mechanism == "cosine"
    M = s.max_samples_per_client if cos else (s.max_samples_per_client or 8)
    syn = rng.standard_normal((n, d))
    emb, ids = _base_rows(rng, s.n_clients, d, M or 4)
    if cos:
        target, k = 0, (M or 1)
        what = (f"1 client, {k} embedding(s) = synthetic sample 0: standardised score vector of "
                f"norm sqrt(n) = {math.sqrt(n):.4g} before the clip C = {s.clip:g}")
    else:
        target, k = n - 1, CANARY_FACTOR * M
        syn[target] = 0.0
        syn[target, 0] = FAR
        what = (f"1 client, {k} samples (= {CANARY_FACTOR} M) all nearest to synthetic sample "
                f"{target}, placed at distance {FAR:g} from the origin (others ~ N(0, I))")
    canary = np.repeat(syn[target:target + 1], k, axis=0)
    if s.dataset == "adversarial":  # cosine: every client scores the opposite way; histogram:
        emb[:] = -syn[target] if cos else syn[target]  # every client votes with the canary
    worlds = [(emb.astype(np.float32), ids),
              (np.concatenate([emb, canary]).astype(np.float32), ids + ["canary"] * k)]

    def release(world, z, noise):
        e, who = worlds[world]
        codes, clients = participation.factorize(who)
        sample = participation.sample_clients(len(clients), make_rng(s.seed, stream="sampling"))
        # no-clip: the histogram's per-client cap off (every vote kept)
        keep = (participation.cap_per_client(codes, M, make_rng(s.seed, stream="cap"))
                if cos or s.brk != "no-clip" else None)
        if cos:
            total = cosine.cosine_round(e, codes, sample, syn, noise_multiplier=z, clip=s.clip,
                                        standardize=True, noise_rng=noise, keep=keep,
                                        clip_to=clip_to(s.brk, FLOAT_MAX))
            # the release's own rule: only a public count divides (score_release)
            reduce, denom = public_denominator("cosine", sample.sampling, sample.sample_rate,
                                               len(sample.members), None)
            return aggregation.finish(total, reduce=reduce, denominator=denom or 1.0, threshold=None)
        total = histogram.histogram_round(e, codes, sample, syn, noise_multiplier=z,
                                          max_per_client=M, keep=keep, noise_rng=noise)
        return aggregation.finish(total, reduce="sum", denominator=1.0, threshold=0.0)

    z = run_z(s.z, s.brk)
    mu0, mu1 = (np.asarray(release(w, 0.0, ZeroNoise()), dtype=np.float64) for w in (0, 1))
    outs = [_stacked(release(w, z, TrialNoise(trial_seeds(s.seed, w, s.trials), "noise")),
                     s.trials, n) for w in (0, 1)]
    if not cos and s.dataset == "random" and mu0[target] != 0:
        raise RuntimeError("a base client voted for the canary's synthetic sample")
    s0, s1, shift = _projection(outs[0], outs[1], mu0, mu1)
    return s0, s1, what, shift


def _fred_worlds(s: Setup):
    rng = make_rng(s.seed, stream="audit-data")
    user = s.level == "user"
    design = fred.Design(s.relation, s.level, s.clip, s.max_samples_per_client if user else None)
    m, d = design.m, s.dim
    emb, keys = _base_rows(rng, s.n_clients, d, m if user else 1)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)  # popri's embeddings are L2-normalised
    if s.dataset == "adversarial":  # every other record opposite the canary
        emb[:] = 0.0
        emb[:, 0] = -1.0
    k = CANARY_FACTOR * m if user else 1
    row = np.zeros((k, d))
    row[:, 0] = CANARY_FACTOR * s.clip
    if s.relation == "replace-one":
        worlds = [(np.concatenate([emb, -row]), keys + ["canary"] * k),
                  (np.concatenate([emb, row]), keys + ["canary"] * k)]
    else:
        worlds = [(emb, keys), (np.concatenate([emb, row]), keys + ["canary"] * k)]
    what = (f"1 {'client, ' + str(k) + ' samples' if user else 'sample'} at norm "
            f"{CANARY_FACTOR} c = {CANARY_FACTOR * s.clip:g} along e_1"
            + ("; D holds it at -e_1" if s.relation == "replace-one" else "; D lacks it"))

    def expected(world, z):
        e, who = worlds[world]
        codes, _ = participation.factorize(who)
        keep = (participation.cap_per_client(codes, m, make_rng(s.seed, stream="fred-cap"))
                if user else None)
        clients = [np.asarray(e[g], dtype=np.float64) for g in fred.group_clients(codes, keep)]
        return fred.private_stats(clients, design, z, ZeroNoise(), clip_to=clip_to(s.brk)).sum1

    z = run_z(s.z, s.brk)
    mu0, mu1 = expected(0, z), expected(1, z)
    outs = [np.stack([fred.release(worlds[w][0], worlds[w][1], design, z, seed=int(t),
                                   clip_to=clip_to(s.brk)).sum1
                      for t in trial_seeds(s.seed, w, s.trials)]) for w in (0, 1)]
    s0, s1, shift = _projection(outs[0], outs[1], mu0, mu1)
    return s0, s1, what, shift


def _cosine_vectors(s: Setup, rng):
    """The synthetic samples, the base clients' embeddings and ids, and the canary client (its
    embeddings = synthetic sample 0: a standardised score vector of norm sqrt(n) before the
    clip) -- the cosine data of the ddg and subsampled audits."""
    n, d = s.synthetic, s.dim
    syn = rng.standard_normal((n, d))
    emb, ids = _base_rows(rng, s.n_clients, d, 4) if s.n_clients else (np.zeros((0, d)), [])
    canary = np.repeat(syn[:1], 1, axis=0)
    return syn, emb, ids, canary


def _client_vectors(emb, ids, syn, clip: float):
    """Every client's clipped, standardised cosine vector, as a Flower node computes it
    (:func:`popri.apps.flower.node.client_vectors`)."""
    return node.client_vectors({"mode": "cosine", "clip": clip, "standardize": True}, syn,
                               np.asarray(emb, dtype=np.float32), list(ids), None)


def _ddg_worlds(s: Setup):
    """The distributed discrete Gaussian of a cosine round on ``s.nodes`` SuperNodes, replayed
    through the nodes' own encoding (:func:`popri.apps.flower.node.upload`: clip, round on
    the plan's grid, one noise share per node, centred residues mod m) and the server's decode
    (sum mod m, :func:`popri.privacy.ddg.decode`).  The canary is one more client (on node 0)."""
    rng = make_rng(s.seed, stream="audit-data")
    syn, emb, ids, canary = _cosine_vectors(s, rng)
    n, C = s.synthetic, s.clip
    # the round's real plan (no dropouts: every node's share is in the sum)
    plan = ddg.plan_round(clip=C, noise_multiplier=s.z, dim=n, clients=s.n_clients + 1,
                          uploaders=s.nodes, min_noisy=s.nodes)
    s.notes.append(plan)  # the claim is this plan's (audit() reads it)
    run = plan
    if s.brk == "half-noise":
        from dataclasses import replace

        run = replace(plan, local_sigma=plan.local_sigma / 2.0)
    clip_run = C * CANARY_FACTOR * 10 if s.brk == "no-clip" else C
    if s.brk == "no-clip":  # the clients do not clip: the plan's grid, an unbounded norm
        from dataclasses import replace

        run = replace(plan, clip=clip_run,
                      delta2=ddg.rounded_l2_bound(clip_run / plan.gamma, plan.beta, plan.dim))
    settings = {"mode": "cosine", "clip": clip_run, "standardize": True,
                "secagg": {"mechanism": "ddg"}, "ddg": run.to_dict()}
    worlds = [(emb, ids), (np.concatenate([emb, canary]), ids + ["canary"])]

    def node_rows(world, k):
        e, who = worlds[world]
        clients = sorted(set(who))
        mine = {c for j, c in enumerate(clients) if j % s.nodes == k}
        sel = [i for i, c in enumerate(who) if c in mine]
        return np.asarray(e[sel], dtype=np.float32), [who[i] for i in sel]

    parts = [[node_rows(w, k) for k in range(s.nodes)] for w in (0, 1)]

    def release(world, trial_seed):
        g = make_rng(int(trial_seed), stream="noise")
        total = np.zeros(run.noise_dim)
        for e, who in parts[world]:
            total += node.upload(settings, syn, e, who, g)
        return ddg.decode(np.rint(total), run)

    mu = [np.sum(_client_vectors(*worlds[w], syn, clip_run), axis=0) if worlds[w][1]
          else np.zeros(n) for w in (0, 1)]
    outs = [np.stack([release(w, t) for t in trial_seeds(s.seed, w, s.trials)])
            for w in (0, 1)]
    s0, s1, shift = _projection(outs[0], outs[1], mu[0], mu[1])
    what = (f"1 more client (embeddings = synthetic sample 0: a score vector of norm sqrt(n) = "
            f"{math.sqrt(n):.4g} before the clip C = {C:g}) on {s.nodes} SuperNodes, "
            f"{'rotated' if plan.rotated else 'unrotated'} grid gamma = {plan.gamma:.3g}")
    return s0, s1, what, shift


def _tree_worlds(s: Setup):
    """A DP-FTRL tree of ``s.leaves`` rounds (:func:`popri.methods.dpfl.rounds.tree_noise`, the
    rounds' own noise): every noisy prefix sum P_1..P_R released.  The canary's clipped update
    (norm C along e_1) is in leaf 1 -- the leaf in the most nodes -- (``two-leaves``: also in
    leaf 2, which epoch-wise participation forbids).  The attacker reads every used node off
    the prefixes (node (l, i) = P_(i+1)2^l - P_i2^l, one independent noise each) and sums its
    projections on the canary's shift (the likelihood-ratio test)."""
    rng = make_rng(s.seed, stream="audit-data")
    R, d, C = int(s.leaves), s.dim, s.clip
    base = rng.standard_normal((R, d))  # the other clients' (clipped) round sums
    v = np.zeros(d)
    v[0] = C * (CANARY_FACTOR if s.brk == "no-clip" else 1.0)
    leaves_in = [0, 1] if s.brk == "two-leaves" and R > 1 else [0]
    spec = FLSpec(algorithm="ftrl", clip=C)
    z = run_z(s.z, s.brk)

    class _Rel:  # research mode: the release's seeded streams (no ledger: nothing is released)
        secure = False

    def prefixes(world, seed):
        out, acc = [], np.zeros(d)
        for t in range(1, R + 1):
            leaf = base[t - 1] + (v if world == 1 and t - 1 in leaves_in else 0.0)
            noisy, _, _ = tree_noise(leaf, spec, z, t, R, _Rel(), int(seed))
            acc = acc + noisy
            out.append(acc.copy())
        return np.stack(out)

    used = sorted({nd for leaf in range(1, R + 1) for nd in leaf_nodes(leaf, R)})

    def nodes_of(P):
        cols = []
        for lv, i in used:
            hi = (i + 1) * 2 ** lv
            lo = i * 2 ** lv
            cols.append(P[hi - 1] - (P[lo - 1] if lo > 0 else 0.0))
        return np.concatenate(cols)

    exp = [nodes_of(np.cumsum(base + np.stack([(v if w == 1 and r in leaves_in else 0 * v)
                                                 for r in range(R)]), axis=0)) for w in (0, 1)]
    outs = [np.stack([nodes_of(prefixes(w, t)) for t in trial_seeds(s.seed, w, s.trials)])
            for w in (0, 1)]
    s0, s1, shift = _projection(outs[0], outs[1], exp[0], exp[1])
    what = (f"1 client's clipped update (norm {C * (CANARY_FACTOR if s.brk == 'no-clip' else 1):g}"
            f" along e_1) in leaf {' and '.join(str(x + 1) for x in leaves_in)} of a tree of "
            f"{R} leaves; all {R} prefix sums released ({len(used)} nodes)")
    return s0, s1, what, shift


def _subsampled_worlds(s: Setup):
    """A cosine round on a Poisson sample at rate q (the library's :func:`~popri.federated.
    participation.sample_clients`, one sample per trial from that trial's sampling stream),
    the noisy sum released (:func:`popri.feedback.cosine.cosine_round`).  The canary joins the
    round with probability q in D'; ``public-sample`` makes it always join (a sample the
    adversary can recompute) while the claim keeps q."""
    rng = make_rng(s.seed, stream="audit-data")
    syn, emb, ids, canary = _cosine_vectors(s, rng)
    n, C, q = s.synthetic, s.clip, float(s.sample_rate)
    worlds = [(emb, ids), (np.concatenate([emb, canary]), ids + ["canary"])]
    z = run_z(s.z, s.brk)

    def release(world, seed):
        e, who = worlds[world]
        codes, clients = participation.factorize(who)
        part = participation.sample_clients(len(clients), make_rng(int(seed), stream="sampling"),
                                            sample_rate=q)
        if s.brk == "public-sample" and world == 1:
            k = clients.index("canary")
            if k not in set(part.members.tolist()):
                part = participation.Participation(np.sort(np.append(part.members, k)),
                                                   part.total, part.sampling, q)
        return cosine.cosine_round(np.asarray(e, dtype=np.float32), codes, part, syn,
                                   noise_multiplier=z, clip=C, standardize=True,
                                   noise_rng=make_rng(int(seed), stream="noise"),
                                   clip_to=clip_to(s.brk, FLOAT_MAX))

    # the attacker's shift: the canary's own clipped vector (what its participation adds)
    u = _client_vectors(canary, ["canary"], syn, C)[0]
    base = np.zeros(n)
    outs = [np.stack([np.asarray(release(w, t), dtype=np.float64).reshape(-1)
                      for t in trial_seeds(s.seed, w, s.trials)]) for w in (0, 1)]
    # the base clients' expected contribution under sampling: q * their sum
    if ids:
        base = q * np.sum(_client_vectors(emb, ids, syn, C), axis=0)
    s0, s1, shift = _projection(outs[0], outs[1], base, base + u)
    what = (f"1 more client (embeddings = synthetic sample 0, clipped to C = {C:g}) joining a "
            f"Poisson sample at q = {q:g}" + ("; ALWAYS joins (public-sample)"
                                              if s.brk == "public-sample" else ""))
    return s0, s1, what, shift


def fixed_round(s: Setup) -> tuple[str, float]:
    """The relation and the sum's sensitivity a cosine round on L of N clients is recorded with
    (the stage's own rule, :func:`popri.privacy.relations.round_relation`)."""
    return round_relation(float(s.clip), "fixed", s.convention)


def _fixed_worlds(s: Setup):
    """The displacement pair of fixed-size sampling (issue 36): D holds N clients whose
    embeddings equal synthetic sample 0 (each one's clipped vector is +u, |u| = C); D' adds a
    canary whose embedding is its opposite (-u).  Each trial draws L of the world's clients with
    the library's sampler (:func:`~popri.federated.participation.sample_clients`, without
    replacement) and releases the noisy cosine sum (:func:`popri.feedback.cosine.cosine_round`)
    with the noise the stage adds for that sampling (z times the sum's sensitivity under its
    relation, :func:`fixed_round`).  In D' the canary is sampled w.p. L / (N + 1) and then
    displaces one of the +u clients: the sum moves by 2C, not C."""
    rng = make_rng(s.seed, stream="audit-data")
    n, d, C, L, N = s.synthetic, s.dim, float(s.clip), int(s.clients_per_round), s.n_clients
    syn = rng.standard_normal((n, d))
    base = np.repeat(syn[:1], N, axis=0)
    ids = [f"client-{k:05d}" for k in range(N)]
    worlds = [(base, ids), (np.concatenate([base, -syn[:1]]), ids + ["canary"])]
    _, sens = fixed_round(s)
    z = run_z(s.z, s.brk)

    def release(world, seed):
        e, who = worlds[world]
        codes, clients = participation.factorize(who)
        part = participation.sample_clients(len(clients), make_rng(int(seed), stream="sampling"),
                                            clients_per_round=L)
        return cosine.cosine_round(np.asarray(e, dtype=np.float32), codes, part, syn,
                                   noise_multiplier=z, clip=C, standardize=True,
                                   noise_rng=make_rng(int(seed), stream="noise"),
                                   sensitivity=sens, clip_to=clip_to(s.brk, FLOAT_MAX))

    u = _client_vectors(syn[:1], ["x"], syn, C)[0]
    outs = [np.stack([np.asarray(release(w, t), dtype=np.float64).reshape(-1)
                      for t in trial_seeds(s.seed, w, s.trials)]) for w in (0, 1)]
    s0, s1, shift = _projection(outs[0], outs[1], L * u, (L - 2) * u)
    what = (f"1 more client at -C among {N} at +C (C = {C:g}), {L} sampled without replacement "
            f"per round: sampled (w.p. {L}/{N + 1}) it displaces one, moving the sum by 2C"
            + ("; replayed as popri <= 0.3 (--convention papers)" if s.convention else ""))
    return s0, s1, what, shift


def worlds(s: Setup):
    """(statistics on D, statistics on D', canary description, |mu_1 - mu_0|)."""
    return {"fred": _fred_worlds, "ddg": _ddg_worlds, "tree": _tree_worlds,
            "subsampled": _subsampled_worlds, "fixed": _fixed_worlds}.get(
        s.mechanism, _score_worlds)(s)


# --------------------------------------------------------------------------- claim and verdict
def claimed_epsilon(mechanism: str, *, delta: float, accountant: str = "rdp",
                    noise_multiplier: float | None = None, epsilon: float | None = None,
                    calibration: str = "classic") -> tuple[float, float, str]:
    """(z, claimed epsilon of one release, how it was obtained).

    cosine / nn-histogram: z given, or the smallest z whose accountant epsilon (q = 1, one step)
    is <= ``epsilon``; the claim is ``accounting.epsilon(z, 1, 1, delta, accountant)``.  fred:
    with ``epsilon``, z = ``calibration.gaussian_multiplier(epsilon, delta, calibration)`` and
    the claim is ``epsilon`` (each release's); with z, the accountant's epsilon as above."""
    if (noise_multiplier is None) == (epsilon is None):
        raise A.ParameterError("noise_multiplier", "give exactly one of --noise-multiplier and "
                                                   "--epsilon")
    if mechanism == "fred" and epsilon is not None:
        return (C.gaussian_multiplier(epsilon, delta, calibration), float(epsilon),
                f"fred {calibration}")
    if epsilon is not None:
        noise_multiplier = C.noise_multiplier(epsilon, 1.0, 1, delta, accountant)
    A.check(z=noise_multiplier, delta=delta, accountant=accountant)
    if not noise_multiplier > 0:
        raise A.ParameterError("noise_multiplier", f"must be > 0 (got {noise_multiplier}): "
                                                   "z = 0 claims no privacy, nothing to audit")
    return (float(noise_multiplier), A.epsilon(noise_multiplier, 1.0, 1, delta, accountant),
            accountant)


#: mechanisms whose claim is a Gaussian's (mu-GDP with mu = 1/z, or sqrt(depth)/z for a tree),
#: so the GDP bound may flag them; the DDG's claim is its concentrated-DP epsilon and a
#: subsampled Gaussian is not GDP: only the (eps, delta) bound judges those
GDP_CLAIM = ("cosine", "nn-histogram", "fred", "tree")


def entry_claim(s: Setup, *, delta: float, accountant: str) -> tuple[float, float, str]:
    """(the mechanism's z as the ledger records it, the claimed epsilon of that ledger entry,
    how) for ddg / tree / subsampled: the entry the release would record, totalled by the
    accountant, as ``popri account ledger`` would."""
    common = dict(delta=delta, sensitivity=s.clip, release_id="audit", mode="research")
    if s.mechanism == "ddg":
        plan = next(x for x in s.notes if isinstance(x, ddg.DDGPlan))
        z = ddg.effective_noise_multiplier(plan, s.nodes)
        e = E.distributed_discrete_gaussian("audit", noise_multiplier=z, sample_rate=1.0,
                                            sampling="none", ddg=ddg.ledger_params(plan, s.nodes),
                                            **common)
        how = f"{accountant}, distributed_discrete_gaussian"
    elif s.mechanism == "tree":
        z = s.z
        e = E.tree_aggregation("audit", noise_multiplier=z, leaves=int(s.leaves), **common)
        how = f"{accountant}, tree_aggregation ({s.leaves} leaves)"
    elif s.mechanism == "fixed":
        # the entry `popri score --clients-per-round L` records for this round (the same entry
        # function and relation rule), totalled as `popri account ledger` would
        z = s.z
        rel, sens = fixed_round(s)
        e = E.round_release(ScoreSpec(clients_per_round=s.clients_per_round, clip=s.clip,
                                      convention=s.convention),
                            "audit", noise_multiplier=z,
                            sample_rate=s.clients_per_round / s.n_clients, sensitivity=sens,
                            sampling="fixed", neighbouring=rel, delta=delta, mode="research",
                            release_id="audit")
        c = A.compose([e], delta, accountant, convention=s.convention)
        return float(z), c.epsilon, (f"{accountant}, subsampled_gaussian on {s.clients_per_round}"
                                     f" of {s.n_clients} ({c.label})")
    else:
        z = s.z
        e = E.gaussian("audit", noise_multiplier=z, sample_rate=float(s.sample_rate),
                       sampling="poisson", **common)
        how = f"{accountant}, subsampled_gaussian (q = {s.sample_rate:g})"
    return float(z), A.compose([e], delta, accountant).epsilon, how


def violations(result: dict) -> list[str]:
    """The VIOLATION lines of an audit result (empty: the claim stands)."""
    claim, out = result["claimed_epsilon"], []
    if result["epsilon_lower_bound"] > claim:
        out.append(f"VIOLATION: empirical lower bound {result['epsilon_lower_bound']:.4f} > "
                   f"claimed eps {claim:.4f}")
    if result["mechanism"] in GDP_CLAIM and result["gdp_epsilon"] > claim \
            and result.get("claimed_mu") and result["mu_lower_bound"] > result["claimed_mu"]:
        out.append(f"VIOLATION: empirical lower bound {result['gdp_epsilon']:.4f} > claimed eps "
                   f"{claim:.4f} (GDP: mu >= {result['mu_lower_bound']:.4f} > the claim's "
                   f"{result['claimed_mu']:.4f})")
    return out


def audit(s: Setup, *, claimed: float, delta: float, confidence: float = 0.95,
          claim_from: str = "rdp") -> dict:
    """Run the audit of ``s`` and return one JSON-ready dict (see ``popri audit release``)."""
    s0, s1, what, shift = worlds(s)
    st = audit_statistics(s0, s1, delta=delta, confidence=confidence)
    claimed_mu = 1.0 / s.z
    if s.mechanism in ("ddg", "tree", "subsampled", "fixed"):
        z_led, claimed, claim_from = entry_claim(s, delta=delta, accountant=claim_from)
        if s.mechanism == "tree":
            claimed_mu = math.sqrt(depth(int(s.leaves))) / s.z
        elif s.mechanism == "ddg":
            claimed_mu = 1.0 / z_led
    res = {
        "mechanism": s.mechanism, "break": s.brk, "noise_multiplier": s.z,
        "noise_multiplier_run": run_z(s.z, s.brk), "claimed_epsilon": claimed, "delta": delta,
        "claim": claim_from, "epsilon_lower_bound": st["epsilon_lower_bound"], "ci": st["ci"],
        "confidence": confidence, "trials": s.trials, **{k: v for k, v in st.items()
                                                         if k not in ("epsilon_lower_bound",
                                                                      "ci")},
        "claimed_mu": claimed_mu, "canary": what, "canary_shift": shift,
        "clients": s.n_clients, "dim": s.dim, "dataset": s.dataset, "seed": s.seed,
    }
    if s.mechanism in ("cosine", "nn-histogram", "ddg", "subsampled", "fixed"):
        res["synthetic"] = s.synthetic
    if s.mechanism == "ddg":
        res.update(clip=s.clip, nodes=s.nodes)
    elif s.mechanism == "tree":
        res.update(clip=s.clip, leaves=s.leaves)
    elif s.mechanism == "subsampled":
        res.update(clip=s.clip, sample_rate=s.sample_rate)
    elif s.mechanism == "fixed":
        rel, sens = fixed_round(s)
        res.update(clip=s.clip, clients_per_round=s.clients_per_round, convention=s.convention,
                   relation=rel, noise_std=run_z(s.z, s.brk) * sens,
                   claim_scope="one round (the ledger entry of one release)")
    elif s.mechanism == "cosine":
        res["clip"] = s.clip
        res["max_samples_per_client"] = s.max_samples_per_client
    elif s.mechanism == "nn-histogram":
        res["max_samples_per_client"] = s.max_samples_per_client or 8
    else:
        res.update(clip=s.clip, relation=s.relation, level=s.level,
                   max_samples_per_client=(s.max_samples_per_client or 8) if s.level == "user"
                   else None)
    res["violations"] = violations(res)
    res["verdict"] = "violation" if res["violations"] else "ok"
    return res


def run(spec: AuditSpec, *, seed: int = 0) -> dict:
    """What ``popri audit release`` runs: the claim of ``spec`` (:func:`claimed_epsilon`; a
    :class:`~popri.privacy.accounting.ParameterError` when it cannot be had), the audit of the
    release it describes (:func:`audit`), and the result dict.  Writes nothing."""
    import time

    z, claimed, how = claimed_epsilon(spec.mechanism, delta=spec.delta,
                                      accountant=spec.accountant,
                                      noise_multiplier=spec.noise_multiplier,
                                      epsilon=spec.epsilon, calibration=spec.calibration)
    if spec.mechanism in ("ddg", "tree", "subsampled", "fixed"):
        how = spec.accountant  # audit() claims the ledger entry's epsilon with this accountant
    fred = spec.mechanism == "fred"
    setup = Setup(spec.mechanism, z, spec.trials, seed=seed, clients=spec.clients,
                  synthetic=spec.synthetic, dim=spec.dim,
                  clip=1.0 if spec.clip is None else float(spec.clip),
                  max_samples_per_client=spec.max_samples_per_client,
                  relation=spec.relation if fred else "replace-one",
                  level=spec.level if fred else "sample", brk=spec.brk, dataset=spec.dataset,
                  sample_rate=spec.sample_rate, leaves=spec.leaves, nodes=spec.nodes,
                  clients_per_round=spec.clients_per_round, convention=spec.convention)
    t0 = time.perf_counter()
    r = audit(setup, claimed=claimed, delta=spec.delta, confidence=spec.confidence,
              claim_from=how)
    log.info(f"audit: {2 * spec.trials} releases of {spec.mechanism} replayed in "
             f"{time.perf_counter() - t0:.1f} s")
    return r
