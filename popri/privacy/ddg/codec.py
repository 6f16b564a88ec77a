"""The distributed discrete Gaussian's codec: a client's vector clipped, rotated and rounded
to the integer grid (:func:`round_client`), an uploader's noise share (:func:`noise_share`),
the modular encoding of an upload and the decoding of the sum (:func:`encode`,
:func:`decode`).  The overview, the paper and the maths: :mod:`popri.privacy.ddg`.

    python -m pytest -q tests/test_ddg.py

Pure maths: numpy and the standard library only.
"""

from __future__ import annotations

import math

import numpy as np

from popri.privacy.ddg.planning import DDGPlan
from popri.privacy.noise import discrete_gaussian

#: redraws of the conditional rounding before giving up (each fails with probability <= beta,
#: so reaching this bound has probability <= beta**MAX_ROUNDING_TRIES, e.g. e^-500)
MAX_ROUNDING_TRIES = 1000
#: below this local sigma, N_Z(0, s^2) is nonzero with probability < 2 exp(-1/(2 s^2)) < 1e-240
#: and :func:`noise_share` returns zeros (the float sampler divides by s^2, which underflows to 0
#: below ~1e-154 and then never accepts a draw)
TINY_SIGMA = 0.03


# --------------------------------------------------------------------------- the rotation

def _signs(seed: int, D: int) -> np.ndarray:
    """The rotation's public random signs (+-1, float64 [D]) from its seed."""
    rng = np.random.default_rng([int(seed), 0x52484431])  # "RHD1"
    return rng.integers(0, 2, size=D).astype(np.float64) * 2.0 - 1.0


def fwht(a: np.ndarray) -> np.ndarray:
    """The (unnormalised) fast Walsh-Hadamard transform of a power-of-two-length vector:
    H a with H the Sylvester Hadamard matrix (H H = D I); O(D log D), a new float64 array."""
    a = np.array(a, dtype=np.float64)
    n = a.size
    if n & (n - 1):
        raise ValueError(f"fwht needs a power-of-two length (got {n})")
    h = 1
    while h < n:
        b = a.reshape(-1, 2, h)
        x = b[:, 0, :].copy()
        b[:, 0, :] += b[:, 1, :]
        b[:, 1, :] = x - b[:, 1, :]
        h *= 2
    return a


def rotate(x: np.ndarray, p: DDGPlan) -> np.ndarray:
    """The randomized Hadamard rotation of the DDG paper (section 4): pad to D, flip signs,
    H / sqrt(D).  Orthonormal: the L2 norm is kept; every coordinate of a vector of norm r
    becomes a Rademacher sum, subgaussian with variance proxy r^2 / D (flat, whatever x)."""
    D = p.noise_dim
    y = np.zeros(D, dtype=np.float64)
    y[:p.dim] = np.asarray(x, dtype=np.float64).reshape(-1)
    return fwht(y * _signs(p.rotation_seed, D)) / math.sqrt(D)


def unrotate(y: np.ndarray, p: DDGPlan) -> np.ndarray:
    """The inverse of :func:`rotate` (H is symmetric), cut back to the plan's d coordinates."""
    D = p.noise_dim
    return (fwht(np.asarray(y, dtype=np.float64)) / math.sqrt(D) * _signs(p.rotation_seed, D)
            )[:p.dim]


# --------------------------------------------------------------------------- the client
def round_client(x: np.ndarray, p: DDGPlan, rng) -> np.ndarray:
    """One client's integer vector (int64, [D]) with L2 norm <= ``p.delta2``.

    Float plans: clip ``x`` to L2 norm ``p.clip``, rotate it (:func:`rotate`, when the plan
    has a rotation: D = the padded length, else D = d), scale by 1/gamma, conditional randomized
    rounding (redrawn until the norm is <= delta2; RuntimeError after MAX_ROUNDING_TRIES).
    Integer plans (:attr:`DDGPlan.integer_mode`): ``x`` must be integers of L2 norm <= clip
    (ValueError otherwise); they are multiplied by 1/gamma exactly.  ``rng``: a numpy Generator
    or :class:`popri.privacy.noise.SecureRandom` (only ``rng.random(size)`` is used)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.size != p.dim:
        raise ValueError(f"client vector has {x.size} values, the plan {p.dim}")
    if not np.all(np.isfinite(x)):
        raise ValueError("client vector has non-finite values")
    if p.integer_mode:
        if not np.all(x == np.rint(x)) or float(np.dot(x, x)) > p.clip * p.clip:
            raise ValueError(f"this plan is for integer inputs of L2 norm <= {p.clip:g} "
                             f"(vote counts); got non-integers or a larger norm")
        K = int(round(1.0 / p.gamma))
        return x.astype(np.int64) * K
    norm = float(np.linalg.norm(x))
    if norm > p.clip:
        x = x * (p.clip / norm)
    if p.rotated:
        x = rotate(x, p)
    y = x / p.gamma
    lo = np.floor(y)
    frac = y - lo
    # a hair inside delta2: the float sum of squares (exact integers < 2^53 summed in float64)
    # may round either way; the integer vector's true norm is then <= delta2
    bound = p.delta2 * p.delta2 * (1.0 - 1e-12)
    for _ in range(MAX_ROUNDING_TRIES):
        r = lo + (np.asarray(rng.random(p.noise_dim), dtype=np.float64) < frac)
        if float(np.dot(r, r)) <= bound:
            return r.astype(np.int64)
    raise RuntimeError(f"conditional rounding failed {MAX_ROUNDING_TRIES} times (each fails "
                       f"with probability <= beta = {p.beta:g}): a wrong plan for this input?")


def noise_share(p: DDGPlan, rng) -> np.ndarray:
    """One uploader's noise: d i.i.d. draws of N_Z(0, local_sigma^2) (int64); zeros when
    local_sigma is below TINY_SIGMA (0 included).  Exact sampling (Canonne, Kamath, Steinke
    2020, Algorithm 3, via :func:`popri.privacy.noise.discrete_gaussian`); ~10 ms for
    d = 20000."""
    if p.local_sigma < TINY_SIGMA:
        return np.zeros(p.noise_dim, dtype=np.int64)
    return discrete_gaussian(p.local_sigma, p.noise_dim, rng)


# --------------------------------------------------------------------------- modular arithmetic
def _as_int64(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind in "iu":
        return a.astype(np.int64)  # uint64 >= 2^63 wraps mod 2^64: unchanged mod m
    if a.dtype.kind == "f":
        if not (np.all(np.isfinite(a)) and np.all(a == np.rint(a))
                and np.all(np.abs(a) < 2.0 ** 63)):
            raise ValueError("expected integers (a float array with non-integral values)")
        return a.astype(np.int64)
    if a.dtype == object:
        return np.array([int(v) % (1 << 64) for v in a.reshape(-1)],
                        dtype=np.uint64).reshape(a.shape).astype(np.int64)
    raise ValueError(f"expected an integer array (got dtype {a.dtype})")


def encode(ints: np.ndarray, p: DDGPlan) -> np.ndarray:
    """Centred residues mod m: int64 in [-m/2, m/2), congruent to ``ints`` mod m."""
    m = p.modulus
    h = m // 2
    return np.mod(_as_int64(ints) + h, m) - h


def decode(total: np.ndarray, p: DDGPlan) -> np.ndarray:
    """The float sum: gamma * (the centred residue of ``total`` mod m), float64, rotated back
    (:func:`unrotate`, d values) when the plan rotates.  ``total`` is any integer array
    congruent to the sum of the uploads mod m (int64, uint64, or a float array holding
    integers)."""
    out = encode(total, p).astype(np.float64) * p.gamma
    return unrotate(out, p) if p.rotated else out


