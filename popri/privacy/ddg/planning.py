"""The distributed discrete Gaussian's plan: the granularity gamma, the modulus 2^bits, the
noise share s and the rounded sensitivity Delta_2 of one round (:func:`plan`,
:func:`plan_round`).  The overview, the paper and the maths: :mod:`popri.privacy.ddg`.

    python -m pytest -q tests/test_ddg.py tests/test_ddg_scale.py

Pure maths: numpy and the standard library only.
"""

from __future__ import annotations

import math
from typing import Any
from dataclasses import MISSING, asdict, dataclass, fields, replace

import numpy as np


# --------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class DDGPlan:
    """Everything a client and the server need for one DDG round (JSON via :meth:`to_dict`)."""

    clip: float         # c: L2 bound of one client's float contribution
    gamma: float        # granularity: float value = gamma * integer
    bits: int           # modulus m = 2**bits
    dim: int            # d
    clients: int        # n: clients in the round (max summands of signal); for range sizing
    min_noisy: int      # n_min: summands of noise guaranteed (minimum survivors)
    local_sigma: float  # each uploader's discrete-Gaussian std, in INTEGER units
    beta: float         # conditional rounding: allowed failure prob per try (paper's beta)
    delta2: float       # L2 sensitivity in integer units after conditional rounding (Delta_2)
    uploaders: int = 0  # U: noise shares / modular uploads summed (SuperNodes); 0 = clients
    padded_dim: int = 0  # D: the rotated vectors' length (a power of two >= d); 0 = no rotation
    rotation_seed: int = -1  # the public seed of the rotation's random signs; -1 = none
    #: the integer sum's L2 sensitivity over Delta_2 under the release's neighbouring relation
    #: (:attr:`sensitivity`): 1 under add/remove one client (one rounded vector more or less);
    #: 2 under replace one client (two rounded vectors r_i - r_i', each of norm <= Delta_2:
    #: the triangle inequality); sqrt 2 for non-negative integer votes (no rounding)
    sens_factor: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise ValueError(f"DDGPlan.{f.name} must be a number (got {v!r})")
            if not math.isfinite(v):
                raise ValueError(f"DDGPlan.{f.name} must be finite (got {v!r})")
        for k in ("bits", "dim", "clients", "min_noisy"):
            v = getattr(self, k)
            if v != int(v) or v < 1:
                raise ValueError(f"DDGPlan.{k} must be an integer >= 1 (got {v!r})")
            object.__setattr__(self, k, int(v))
        for k, lo in (("uploaders", 0), ("padded_dim", 0), ("rotation_seed", -1)):
            v = getattr(self, k)
            if v != int(v) or v < lo:
                raise ValueError(f"DDGPlan.{k} must be an integer >= {lo} (got {v!r})")
            object.__setattr__(self, k, int(v))
        if self.padded_dim and (self.padded_dim < self.dim
                                or self.padded_dim & (self.padded_dim - 1)):
            raise ValueError(f"DDGPlan.padded_dim must be a power of two >= dim (got "
                             f"{self.padded_dim} for dim {self.dim})")
        if bool(self.padded_dim) != (self.rotation_seed >= 0):
            raise ValueError("DDGPlan: a rotation has both padded_dim and rotation_seed")
        for k in ("clip", "gamma", "local_sigma", "beta", "delta2", "sens_factor"):
            object.__setattr__(self, k, float(getattr(self, k)))
        if not 1.0 <= self.sens_factor <= 2.0:
            raise ValueError(f"DDGPlan.sens_factor must be in [1, 2] (got {self.sens_factor!r})")
        if not (self.clip > 0 and self.gamma > 0 and self.delta2 > 0):
            raise ValueError("DDGPlan.clip, gamma and delta2 must be > 0")
        if self.local_sigma < 0 or not (0 <= self.beta < 1):
            raise ValueError("DDGPlan.local_sigma must be >= 0 and beta in [0, 1)")
        if self.min_noisy > self.noise_shares:
            raise ValueError(f"DDGPlan.min_noisy ({self.min_noisy}) > uploaders "
                             f"({self.noise_shares})")
        if self.bits > 62:
            raise ValueError(f"DDGPlan.bits must be <= 62 (int64 arithmetic; got {self.bits})")

    @property
    def modulus(self) -> int:
        return 1 << self.bits

    @property
    def noise_shares(self) -> int:
        """U: the uploads summed mod m, each with one noise share (``clients`` when unset)."""
        return self.uploaders or self.clients

    @property
    def rotated(self) -> bool:
        return self.rotation_seed >= 0

    @property
    def noise_dim(self) -> int:
        """The length of the integer vectors (rounded, noised, summed): D when rotated."""
        return self.padded_dim or self.dim

    @property
    def sensitivity(self) -> float:
        """The integer sum's L2 sensitivity under the release's relation: sens_factor *
        Delta_2 (what the noise is scaled to and the accountant reads)."""
        return self.sens_factor * self.delta2

    @property
    def noise_ratio(self) -> float:
        """The std of the sum's noise over z * clip when ``min_noisy`` shares survive (z the
        plan's effective multiplier): Delta_2 gamma / clip >= 1, the rounding's inflation of
        the sensitivity the noise is scaled to."""
        return self.delta2 * self.gamma / self.clip

    @property
    def integer_mode(self) -> bool:
        """Inputs are integers scaled by 1/gamma (no rounding): Delta_2 == clip / gamma."""
        return self.delta2 <= (self.clip / self.gamma) * (1 + 1e-12)

    def to_dict(self) -> dict:
        """JSON-able: the fields, plus ``modulus`` (ignored by :meth:`from_dict`)."""
        return {**asdict(self), "modulus": self.modulus}

    @classmethod
    def from_dict(cls, d) -> "DDGPlan":
        """From :meth:`to_dict`'s output (keys other than the fields, e.g. ``modulus`` or a
        ledger entry's ``noisy``, are ignored; a missing field is a ValueError)."""
        if not isinstance(d, dict):
            raise ValueError(f"a DDG plan must be a dict (got {type(d).__name__})")
        names = [f.name for f in fields(cls) if f.default is MISSING]
        missing = [k for k in names if k not in d]
        if missing:
            raise ValueError(f"DDG plan misses {', '.join(missing)}")
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def _need(n: int, c_int: float, sigma: float, k: float, rounding: bool,
          uploaders: int | None = None) -> float:
    """The largest |coordinate| of the integer sum we plan for without a rotation: the
    worst-case signal (n clients each at c/gamma on one coordinate, +1 each for rounding up)
    plus k std of the noise of the ``uploaders`` (default n) noise shares."""
    u = n if uploaders is None else uploaders
    return n * (c_int + (1.0 if rounding else 0.0)) + k * math.sqrt(u) * sigma


def _spread_rotated(n: int, c_int: float, sigma: float, D: int, uploaders: int) -> float:
    """The subgaussian scale of one coordinate of the rotated integer sum (the DDG paper,
    section 4.2 and its ``heuristic_scale_factor``): the signal (norm <= n c/gamma, spread flat
    by the rotation: proxy (n c/gamma)^2 / D), the rounding (each client's coordinate moves
    within [0, 1): proxy 1/4) and the noise shares (N_Z(0, s^2) is subgaussian with proxy
    s^2, Canonne, Kamath, Steinke 2020)."""
    return math.sqrt((n * c_int) ** 2 / D + n / 4.0 + uploaders * sigma * sigma)


def headroom(p: "DDGPlan", k_stddevs: float = 4.0) -> float:
    """How much of the modulus the planned sum needs, as a fraction of m/2 - 1 (<= 1 fits):
    the worst-case hard bound without a rotation; ``k_stddevs`` subgaussian scales with one."""
    room = p.modulus / 2.0 - 1.0
    c_int = p.clip / p.gamma
    if p.rotated:
        return k_stddevs * _spread_rotated(p.clients, c_int, p.local_sigma, p.noise_dim,
                                           p.noise_shares) / room
    return _need(p.clients, c_int, p.local_sigma, k_stddevs, not p.integer_mode,
                 p.noise_shares) / room


def max_bits_for(clients: int, max_bits: int = 32) -> int:
    """The largest bits with clients * 2**bits <= 2**max_bits / 2 (Flower's SecAgg+ sums the
    quantised values mod 2**max_bits, and its weight factor clients * 2**bits must stay below
    it); 0 when none >= 1 exists."""
    top = (1 << (max_bits - 1)) // int(clients)
    return max(top.bit_length() - 1, 0)


def _check_pos_int(name: str, v, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo} (got {v!r})")
    return int(v)


def _check_num(name: str, v, *, lo: float = 0.0, lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
            or not math.isfinite(v) or v < lo or (lo_open and v == lo):
        op = ">" if lo_open else ">="
        raise ValueError(f"{name} must be a finite number {op} {lo:g} (got {v!r})")
    return float(v)


def rounded_l2_bound(c_int: float, beta: float, dim: int) -> float:
    """Delta_2 of conditional randomized rounding of a vector of L2 norm <= ``c_int`` (integer
    units) in ``dim`` coordinates (see the module docstring; ``rounded_l2_norm_bound`` of the
    authors' code).  ``beta`` = 0: the deterministic bound c + sqrt(d)."""
    b1 = c_int + math.sqrt(dim)
    if beta <= 0:
        return b1
    b2 = math.sqrt(c_int * c_int + dim / 4.0
                   + math.sqrt(2.0 * math.log(1.0 / beta)) * (c_int + math.sqrt(dim) / 2.0))
    return min(b1, b2)


def _modulus_bits(bits: int | None, uploaders: int, max_bits: int) -> int:
    """The modulus' bits: ``bits`` checked against the largest that fits ``uploaders`` (SecAgg+:
    uploaders * 2**bits <= 2**(max_bits - 1)), or that largest (ValueError when none does)."""
    top = max_bits_for(uploaders, max_bits)
    if top < 1:
        raise ValueError(f"no modulus fits: uploaders * 2**bits <= 2**{max_bits - 1} has no "
                         f"bits >= 1 for {uploaders} uploaders; use fewer SuperNodes (at most "
                         f"{1 << (max_bits - 2)})")
    if bits is None:
        return top
    bits = _check_pos_int("bits", bits)
    if bits > top:
        raise ValueError(f"bits = {bits} too large for {uploaders} uploaders: uploaders * "
                         f"2**bits must be <= 2**{max_bits - 1} (at most {top} bits)")
    return bits


def plan(*, clip: float, noise_multiplier: float, dim: int, clients: int, min_noisy: int,
         bits: int | None = None, gamma: float | None = None, integer_inputs: bool = False,
         beta: float = math.exp(-0.5), max_bits: int = 32, k_stddevs: float = 4.0,
         uploaders: int | None = None, rotation_seed: int | None = None) -> DDGPlan:
    """The DDG parameters of one round at a given (or the finest fitting) granularity gamma.

    ``noise_multiplier`` z: the std of the SUM's noise is z * clip in float units when
    ``min_noisy`` uploads survive: each uploader adds N_Z(0, s^2) per coordinate with
    s = z * clip / (gamma * sqrt(min_noisy)) (integer units).  The privacy is then that of
    :func:`epsilon_cdp` at Delta_2 (>= clip / gamma because of rounding), so the effective noise
    multiplier sqrt(n_min) s / Delta_2 (:func:`effective_noise_multiplier`) is a little below z
    (:func:`plan_round` scales the noise to Delta_2 instead and picks gamma for a bounded
    inflation).

    ``clients`` n: the clients whose vectors are summed (the signal); ``uploaders`` U (default
    n): the uploads summed mod m -- on Flower the SuperNodes, each uploading the sum of its
    clients' integer vectors plus one noise share.  ``bits`` (default: the largest with
    U * 2**bits <= 2**max_bits / 2, :func:`max_bits_for`, Flower's SecAgg+ constraint on the
    uploaders): modulus m = 2**bits.

    ``gamma`` (default: the finest that fits) must keep the sum inside m/2 - 1:

    - without a rotation, the worst case: n * (clip/gamma + 1) + k_stddevs * sqrt(U) * s (every
      client's whole clipped norm on one coordinate, rounded up, plus k std of the noise);
    - with a rotation (``rotation_seed``: the randomized Hadamard transform of the DDG paper,
      section 4, of the vectors padded to D = 2^ceil(log2 d)), k_stddevs subgaussian scales of
      :func:`_spread_rotated` (the paper's k-stddev sizing; a coordinate wraps with probability
      <= 2 exp(-k^2 / 2), a utility loss, never a privacy one: the reduction mod m is
      post-processing).

    ``integer_inputs`` (nn-histogram vote counts): the inputs are integer vectors of L2 norm
    <= clip; gamma = 1 by default (or 1/K for an integer K: the votes are multiplied by K, still
    exact), no rounding error, Delta_2 = clip / gamma, no rotation.  Note: a small s (< ~1: many
    clients, each with a tiny share) makes the paper's tau, hence epsilon, large; a gamma = 1/K
    with a large K (:func:`integer_gamma`) keeps s large at the same z.

    ``beta``: conditional rounding's failure probability per draw (the paper's beta; 0 = no
    conditioning, Delta_2 = c/gamma + sqrt(d)).  Raises ValueError, naming what to change,
    when no modulus fits."""
    c = _check_num("clip", clip, lo_open=True)
    z = _check_num("noise_multiplier", noise_multiplier)
    d = _check_pos_int("dim", dim)
    n = _check_pos_int("clients", clients)
    U = n if uploaders is None else _check_pos_int("uploaders", uploaders)
    n_min = _check_pos_int("min_noisy", min_noisy)
    if n_min > U:
        raise ValueError(f"min_noisy ({n_min}) cannot exceed the uploaders ({U})")
    beta = _check_num("beta", beta)
    if not beta < 1:
        raise ValueError(f"beta must be in [0, 1) (got {beta})")
    max_bits = _check_pos_int("max_bits", max_bits, lo=2)
    k = _check_num("k_stddevs", k_stddevs)
    rot = rotation_seed is not None
    if rot and integer_inputs:
        raise ValueError("integer inputs (vote counts) are not rotated")
    seed = _check_pos_int("rotation_seed", rotation_seed, lo=0) if rot else -1
    D = next_pow2(d) if rot else d
    bits = _modulus_bits(bits, U, max_bits)
    m = 1 << bits
    room = m / 2.0 - 1.0  # |sum| <= m/2 - 1 decodes without wrapping
    extra = {"uploaders": U if uploaders is not None else 0, "padded_dim": D if rot else 0,
             "rotation_seed": seed}

    if integer_inputs:
        if gamma is None:
            gamma = 1.0
        gamma = _check_num("gamma", gamma, lo_open=True)
        K = round(1.0 / gamma)
        if K < 1 or abs(K * gamma - 1.0) > 1e-12:
            raise ValueError(f"integer_inputs needs gamma = 1/K for an integer K >= 1 "
                             f"(got {gamma})")
        s = z * c / (gamma * math.sqrt(n_min))
        need = _need(n, c / gamma, s, k, rounding=False, uploaders=U)
        if need > room:
            raise ValueError(
                f"the integer sum does not fit in {bits} bits: up to {need:.4g} per coordinate "
                f"(clients * clip/gamma + {k:g} std of the noise) > m/2 - 1 = {room:.4g}; use "
                f"fewer clients per round, a smaller clip or a larger gamma")
        return DDGPlan(clip=c, gamma=gamma, bits=bits, dim=d, clients=n, min_noisy=n_min,
                       local_sigma=s, beta=beta, delta2=c / gamma, **extra)

    # float inputs: the need is linear in 1/gamma (no rotation) or the subgaussian scale is
    # (rotation), so the finest gamma that fits is closed-form
    zz = z * math.sqrt(U / n_min)  # the noise of all U shares, relative to c / gamma
    if gamma is None:
        if rot:
            free = (room / k) ** 2 - n / 4.0 if k > 0 else math.inf
            if free <= 0:
                raise ValueError(f"{bits} bits cannot hold {n} clients' rounding; use fewer "
                                 "clients per round or fewer SuperNodes")
            gamma = c * math.sqrt(n * n / D + zz * zz) / math.sqrt(free)
        else:
            if room <= n:
                raise ValueError(f"{bits} bits cannot hold {n} clients' rounding (m/2 - 1 = "
                                 f"{room:g} <= clients); use fewer clients per round")
            gamma = (n * c + k * zz * c) / (room - n)
        for _ in range(60):  # float safety: the inequality below must hold as computed
            p = DDGPlan(clip=c, gamma=gamma, bits=bits, dim=d, clients=n, min_noisy=n_min,
                        local_sigma=z * c / (gamma * math.sqrt(n_min)), beta=beta,
                        delta2=rounded_l2_bound(c / gamma, beta, D), **extra)
            if headroom(p, k) <= 1.0:
                break
            gamma *= 1 + 1e-12
    gamma = _check_num("gamma", gamma, lo_open=True)
    p = DDGPlan(clip=c, gamma=gamma, bits=bits, dim=d, clients=n, min_noisy=n_min,
                local_sigma=z * c / (gamma * math.sqrt(n_min)), beta=beta,
                delta2=rounded_l2_bound(c / gamma, beta, D), **extra)
    if headroom(p, k) > 1.0:
        raise ValueError(
            f"gamma = {gamma:g} is too fine for {bits} bits: the sum needs {headroom(p, k):.3g} "
            f"x m/2 per coordinate ({'k subgaussian scales of the rotated sum' if rot else 'clients * (clip/gamma + 1) + ' + format(k, 'g') + ' std of the noise'}); "
            f"use a larger gamma (or leave it to plan())")
    return p


#: plan_round's default bound on the noise's inflation by rounding (5%), and the inflation it
#: aims at when the modulus allows (1%)
NOISE_TOLERANCE = 0.05
NOISE_TARGET = 0.01


def _u_for(ratio: float, beta: float, D: int) -> float:
    """The smallest c/gamma (integer units) whose rounding inflates the sensitivity by at most
    ``ratio``: Delta_2(u) / u <= 1 + ratio (Delta_2 / u falls as u grows)."""
    lo, hi = 1e-9, 1.0
    while rounded_l2_bound(hi, beta, D) / hi > 1.0 + ratio:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = math.sqrt(lo * hi) if lo > 0 else hi / 2
        if rounded_l2_bound(mid, beta, D) / mid > 1.0 + ratio:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    return hi


#: release mode rotates float vectors of at least this many and at most this many values (the
#: choice is then public: a function of d alone); the rotation's FWHT holds 2 copies of D
#: float64 values in memory
ROTATE_MIN_DIM, ROTATE_MAX_DIM = 64, 1 << 24


def plan_round(*, clip: float, noise_multiplier: float, dim: int, clients: int,
               uploaders: int, min_noisy: int, integer_inputs: bool = False,
               tolerance: float = NOISE_TOLERANCE, target: float = NOISE_TARGET,
               beta: float = math.exp(-0.5), max_bits: int = 32, k_stddevs: float = 4.0,
               rotation_seed: int = 0, fixed_grid: bool = False,
               sens_factor: float = 1.0) -> DDGPlan:
    """The plan of a secure-aggregation round: ``clients`` vectors summed on ``uploaders``
    SuperNodes (the modulus is sized by the uploaders, Flower's constraint), the noise scaled to
    the ROUNDED sensitivity Delta_2 so the effective noise multiplier is exactly z, and gamma
    chosen so that the sum's noise exceeds z * clip by at most ``tolerance`` (the rounding's
    inflation Delta_2 gamma / clip, :attr:`DDGPlan.noise_ratio`).

    Float inputs, research mode: the finest grid the modulus holds (the least rounding error),
    first without a rotation (the worst-case bound: no coordinate ever wraps), then with the
    randomized Hadamard rotation and k-stddev sizing of the DDG paper (section 4;
    ``rotation_seed`` is the signs' public seed).  ``fixed_grid`` (release mode): gamma must
    not follow the private participant count, so it is the grid whose inflation is ``target``
    (a function of d alone) and the rotation is used iff d is in [ROTATE_MIN_DIM,
    ROTATE_MAX_DIM]; the count only decides whether the round fits.  Integer inputs (votes): no
    inflation; gamma = 2^-j, as fine as fits (research) or the coarsest whose shares are at
    least 2 integer units wide (release; tau is then negligible).  A round that cannot reach z
    within ``tolerance`` raises ValueError naming the numbers and what to change -- never a
    degraded plan.

    ``sens_factor`` f (:attr:`DDGPlan.sens_factor`): the sum's sensitivity is f * Delta_2 under
    the release's relation (2 under replace one client, sqrt 2 for non-negative votes): the
    noise is scaled to it, z * f * Delta_2 / sqrt(n_min) per share, while each client's vector
    is still clipped and rounded to ``clip`` and Delta_2."""
    f = _check_num("sens_factor", sens_factor, lo=1.0)
    if f > 2.0:
        raise ValueError(f"sens_factor must be in [1, 2] (got {f})")
    p = _plan_round(clip=clip, noise_multiplier=_check_num("noise_multiplier", noise_multiplier)
                    * f, dim=dim, clients=clients, uploaders=uploaders, min_noisy=min_noisy,
                    integer_inputs=integer_inputs, tolerance=tolerance, target=target, beta=beta,
                    max_bits=max_bits, k_stddevs=k_stddevs, rotation_seed=rotation_seed,
                    fixed_grid=fixed_grid)
    return replace(p, sens_factor=f) if f != 1.0 else p


def _plan_round(*, clip: float, noise_multiplier: float, dim: int, clients: int,
                uploaders: int, min_noisy: int, integer_inputs: bool, tolerance: float,
                target: float, beta: float, max_bits: int, k_stddevs: float,
                rotation_seed: int, fixed_grid: bool) -> DDGPlan:
    """:func:`plan_round` at noise multiplier z relative to Delta_2 (sens_factor 1)."""
    z = _check_num("noise_multiplier", noise_multiplier)
    tol = _check_num("tolerance", tolerance, lo_open=True)
    kw: dict[str, Any] = dict(clip=clip, noise_multiplier=z, dim=dim, clients=clients, uploaders=uploaders,
              min_noisy=min_noisy, beta=beta, max_bits=max_bits, k_stddevs=k_stddevs)
    c = float(clip)
    if integer_inputs:
        if fixed_grid and z > 0:
            j = max(0, math.ceil(math.log2(2.0 * math.sqrt(min_noisy) / (z * c))))
            return plan(**kw, gamma=2.0 ** -j, integer_inputs=True)
        g = integer_gamma(**{k: v for k, v in kw.items() if k not in ("dim", "beta")})
        return plan(**kw, gamma=g, integer_inputs=True)
    if z == 0:  # no noise: the finest grid, no rotation (the decoded sum is exact to gamma)
        return plan(**kw)
    if fixed_grid:
        rot = int(rotation_seed) if ROTATE_MIN_DIM <= dim <= ROTATE_MAX_DIM else None
        D = next_pow2(dim) if rot is not None else int(dim)
        u = _u_for(min(target, tol), beta, D)
        try:
            p = _scaled_to_rounded(plan(**kw, rotation_seed=rot, gamma=c / u), z)
        except ValueError:
            p = None
        if p is not None and headroom(p, k_stddevs) <= 1.0:
            return p
        raise ValueError(
            f"the distributed discrete Gaussian's grid for d = {dim} (noise within "
            f"{min(target, tol):.0%} of z * C) does not fit {clients} clients on {uploaders} "
            f"SuperNodes ({max_bits_for(uploaders, max_bits)}-bit modulus); use fewer clients "
            "per round or fewer SuperNodes (each uploader costs modulus bits)")
    worst = math.inf
    for rot in (None, int(rotation_seed)):
        try:
            p = _scaled_to_rounded(plan(**kw, rotation_seed=rot), z)
        except ValueError:
            continue
        if headroom(p, k_stddevs) > 1.0:  # the larger share no longer fits: back off a hair
            p = _back_off(p, z, kw, rot, k_stddevs)
        if p is None:
            continue
        if p.noise_ratio <= 1.0 + tol:
            return p
        worst = min(worst, p.noise_ratio)
    raise ValueError(
        f"the distributed discrete Gaussian cannot reach z = {z:g} within {tol:.0%}: "
        f"{clients} clients on {uploaders} SuperNodes leave a {max_bits_for(uploaders, max_bits)}"
        f"-bit modulus whose grid would inflate the noise on the sum "
        f"{'%.3gx' % worst if math.isfinite(worst) else 'past any bound'} (d = {dim}); use "
        "fewer clients per round, fewer SuperNodes (each uploader costs modulus bits), or a "
        "larger tolerance")


def _scaled_to_rounded(p: DDGPlan, z: float) -> DDGPlan:
    """The plan with its noise share scaled to the rounded sensitivity: sqrt(n_min) s /
    Delta_2 = z exactly (the ledger's noise multiplier is the z asked for)."""
    return replace(p, local_sigma=z * p.delta2 / math.sqrt(p.min_noisy))


def _back_off(p: DDGPlan, z: float, kw: dict, rot, k: float) -> DDGPlan | None:
    """A coarser gamma until the plan with the rounded-sensitivity noise fits (a few steps of
    1%: the share grew by at most the inflation); None if it never does within 2x."""
    g = p.gamma
    for _ in range(80):
        g *= 1.01
        try:
            q = _scaled_to_rounded(plan(**kw, rotation_seed=rot, gamma=g), z)
        except ValueError:
            continue
        if headroom(q, k) <= 1.0:
            return q
    return None


def integer_gamma(*, clip: float, noise_multiplier: float, clients: int, min_noisy: int,
                  bits: int | None = None, max_bits: int = 32, k_stddevs: float = 4.0,
                  uploaders: int | None = None) -> float:
    """The smallest gamma = 2**-j (j >= 0) that :func:`plan` accepts with ``integer_inputs``:
    votes multiplied by 2**j stay exact, and the noise share s grows by 2**j at the same z
    (which keeps tau, hence epsilon, near the Gaussian's).  ValueError when even gamma = 1
    does not fit."""
    kw: dict[str, Any] = dict(clip=clip, noise_multiplier=noise_multiplier, dim=1, clients=clients,
              min_noisy=min_noisy, bits=bits, integer_inputs=True, max_bits=max_bits,
              k_stddevs=k_stddevs, uploaders=uploaders)

    def ok(g):
        try:
            plan(**kw, gamma=g)
            return True
        except ValueError:
            return False

    if not ok(1.0):
        plan(**kw, gamma=1.0)  # raises with the reason
    j = 0
    while j < 62 and ok(2.0 ** -(j + 1)):
        j += 1
    return 2.0 ** -j




def next_pow2(d: int) -> int:
    """The smallest power of two >= d (the rotation's padded length D)."""
    return 1 << max(int(d) - 1, 0).bit_length()
