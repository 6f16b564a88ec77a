"""The distributed discrete Gaussian (DDG): quantised client uploads whose modular sum is DP.

    python -m pytest -q tests/test_ddg.py
    python -c "from popri.privacy import ddg; p = ddg.plan(clip=1, noise_multiplier=1, \
dim=1000, clients=50, min_noisy=40); print(p, ddg.epsilon_cdp(p, 40))"

Three modules: :mod:`~popri.privacy.ddg.planning` (gamma, the modulus, the noise share:
:func:`plan`, :func:`plan_round`), :mod:`~popri.privacy.ddg.codec` (what a client and the
server compute: :func:`round_client`, :func:`noise_share`, :func:`encode`, :func:`decode`) and
:mod:`~popri.privacy.ddg.accounting` (:func:`epsilon_cdp`, :func:`rdp`, :func:`ledger_params`);
their names are re-exported here (``ddg.plan``, ``ddg.decode``, ``ddg.rdp``).

Kairouz, Liu, Steinke, "The Distributed Discrete Gaussian Mechanism for Federated Learning with
Secure Aggregation", ICML 2021, arXiv:2102.06387 (Section 3, Theorem 1: privacy of a sum of
discrete Gaussians; the conditional randomized rounding and modular-clipping analysis behind
its end-to-end algorithm), checked against the authors' reference code
(google-research/federated, ``distributed_dp/accounting_utils.py``: ``rounded_l2_norm_bound``,
``compute_rdp_dgaussian`` = the paper's Proposition 14 / Eq. 17, ``heuristic_scale_factor``).

One round, for each client i (a SuperNode uploads the sum of its clients' vectors)::

    x_i (float, d)  --clip to L2 <= c-->  x_i / gamma  --conditional randomized rounding-->
    r_i (int, ||r_i||_2 <= Delta_2)  --+ N_Z(0, s^2)^d-->  encode: centred mod m = 2^bits
    server: SecAgg+ sums the uploads mod m;  decode: gamma * centred(sum mod m)

(:func:`round_client`, :func:`noise_share`, :func:`encode`, :func:`decode`; :func:`plan` picks
gamma, bits and s).  The server sees only the sum mod m.  Privacy: with ``noisy`` >= 1 noise
shares in the sum, each N_Z(0, s^2) per coordinate (the discrete Gaussian of Canonne, Kamath,
Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020, arXiv:2004.00010,
sampled exactly by :func:`popri.privacy.noise.discrete_gaussian`), and one client's contribution
changing the integer sum by a vector of L2 norm <= Delta_2, the sum satisfies
(1/2) eps^2-concentrated DP (Bun & Steinke, "Concentrated Differential Privacy: Simplifications,
Extensions, and Lower Bounds", TCC 2016, arXiv:1605.02065: Renyi divergence <= alpha eps^2 / 2
at every order alpha > 1) with (:func:`epsilon_cdp`)::

    tau   = 10 * sum_{k=1}^{n-1} exp(-2 pi^2 s^2 k / (k+1))          (n = noisy)
    eps   = min( Delta_2/(sqrt(n) s) + tau sqrt(d),
                 sqrt( Delta_2^2/(n s^2) + 2 tau Delta_1/(sqrt(n) s) + tau^2 d ) )
    Delta_1 = min(sqrt(d) Delta_2, Delta_2^2)   (L1 bound of an integer vector of L2 <= Delta_2)

These are the two pure-CDP terms of Proposition 14 / Eq. 17 as the authors' code computes them
(``compute_rdp_dgaussian``: ``(alpha/2)(l2 + sqrt(d) tau)^2`` and ``(alpha/2)(l2^2 + 2 l1 tau +
tau^2 d)``).  Its third term, ``(alpha/2) l2^2 + tau d``, is not of the CDP form (a constant
tau d at every order) and is left out (a valid bound, only looser; tau < 1e-16 n whenever
s >= 2, so the terms differ only for small shares).  The form sqrt(Delta_2^2/(n s^2) + tau d/2)
sometimes quoted for Theorem 1 is not in the authors' code and is not used.  Reduction mod m
and decoding are post-processing.  With tau = 0 (one noise share, or s large) eps is exactly
the continuous Gaussian's Delta_2 / (sqrt(n) s): the DDG never costs less than the Gaussian of
:func:`effective_noise_multiplier` sqrt(n) s / Delta_2.

Neighbouring: one client's contribution is added or removed while the noise shares of the
``noisy`` guaranteed uploads stay (the paper's setting, and the convention of popri's in-process
path, whose ledger records the noise of the minimum number of survivors).  More survivors than
``noisy`` only add independent noise (post-processing): the guarantee at ``noisy`` still holds.

Conditional randomized rounding (the paper's discretisation step, its Proposition 22 per the
authors' code, ``rounded_l2_norm_bound``): each coordinate y of x/gamma becomes
floor(y) + Bernoulli(y - floor(y)) (unbiased before the conditioning, nearly so after), and the
whole vector is redrawn until its L2 norm is <= ::

    Delta_2 = min( c/gamma + sqrt(d),
                   sqrt( c^2/gamma^2 + d/4 + sqrt(2 log(1/beta)) (c/gamma + sqrt(d)/2) ) )

The first bound holds always; the second fails with probability <= beta per draw, so the loop
ends fast (<= 1/(1-beta) draws on average).  The check is exact, so Delta_2 is a hard bound.

Accounting: :class:`popri.privacy.accounting.DistributedDiscreteGaussianMechanism` (registry
name ``distributed_discrete_gaussian``) reads ``params.{dim, noisy, local_sigma, delta2}`` from a
ledger entry (:func:`ledger_params`) and gives the RDP of :func:`rdp`.  RDP only:
dp-accounting (0.6.0, the lowest version popri allows, and later) has a ``ZCDpEvent``, but only
its RDP accountant supports it, not ``PLDAccountant``; ``--accountant pld`` is refused with a
message naming rdp.

"""

from popri.privacy.ddg.accounting import (
                                          TAU_TERMS,
                                          cdp_epsilon,
                                          effective_noise_multiplier,
                                          epsilon_cdp,
                                          ledger_params,
                                          nominal_params,
                                          rdp,
                                          subsampled_rdp,
                                          tau,
)
from popri.privacy.ddg.codec import (
                                          MAX_ROUNDING_TRIES,
                                          TINY_SIGMA,
                                          decode,
                                          encode,
                                          fwht,
                                          noise_share,
                                          rotate,
                                          round_client,
                                          unrotate,
)
from popri.privacy.ddg.planning import (
                                          NOISE_TARGET,
                                          NOISE_TOLERANCE,
                                          ROTATE_MAX_DIM,
                                          ROTATE_MIN_DIM,
                                          DDGPlan,
                                          headroom,
                                          integer_gamma,
                                          max_bits_for,
                                          next_pow2,
                                          plan,
                                          plan_round,
                                          rounded_l2_bound,
)

__all__ = ["DDGPlan", "MAX_ROUNDING_TRIES", "NOISE_TARGET", "NOISE_TOLERANCE", "ROTATE_MAX_DIM",
           "ROTATE_MIN_DIM", "TAU_TERMS", "TINY_SIGMA", "cdp_epsilon", "decode",
           "effective_noise_multiplier", "encode", "epsilon_cdp", "fwht", "headroom",
           "integer_gamma", "ledger_params", "max_bits_for", "next_pow2", "noise_share",
           "nominal_params", "plan", "plan_round", "rdp", "rotate", "round_client",
           "rounded_l2_bound", "subsampled_rdp", "tau", "unrotate"]
