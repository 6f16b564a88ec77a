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

from popri.apps.audit.stats import (  # noqa: F401  (re-exported: the audit's statistics)
    audit_statistics,
    best_threshold,
    clopper_pearson,
    epsilon_from_rates,
    gdp_epsilon,
    mu_from_rates,
)
from popri.apps.audit.worlds import (  # noqa: F401  (re-exported: the worlds and breaks)
    CANARY_FACTOR,
    FAR,
    Setup,
    TrialNoise,
    ZeroNoise,
    clip_to,
    fixed_round,
    run_z,
    trial_seeds,
    worlds,
)
from popri.apps.flower import node
from popri.core import log
from popri.federated import aggregation, participation
from popri.feedback import cosine, histogram
from popri.feedback.release import public_denominator
from popri.federated.updates import tree_noise
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
