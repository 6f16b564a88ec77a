"""Random sources for DP noise and client sampling.

Research mode (default): a seeded ``numpy.random.Generator`` (PCG64), so the same inputs and
``--seed`` give the same outputs.

Release mode (``--release`` / ``POPRI_RELEASE=1``): every draw that protects privacy (the
noise and the client sample) comes from the operating system's CSPRNG (``os.urandom``, via
:class:`SecureRandom`); the seed is ignored for them.  The noise itself is then NOT a float
Gaussian: a float sample ``x + N(0, s^2)`` leaks ``x`` through the low-order bits of the result
(Mironov, "On significance of the least significant bits for differential privacy", CCS 2012).
:func:`discrete_gaussian_release` instead snaps the exact aggregate to a power-of-two grid ``g``
and adds ``g`` times a discrete Gaussian (Canonne, Kamath, Steinke, "The Discrete Gaussian for
Differential Privacy", NeurIPS 2020, arXiv:2004.00010, Algorithm 3), so every output lies on
one fixed grid whatever the input, and its privacy is that of the discrete Gaussian on the
integers: for L2 sensitivity D on Z^d it satisfies the same Renyi DP bound as the continuous
Gaussian (ibid., Theorem 14), with D inflated by the snapping to D + g*sqrt(d) (see
:func:`snap_grid`).  The noise is therefore drawn at std z (D + g sqrt(d)): the mechanism
guarantees exactly the noise multiplier z it is given, which is what the ledger records (the
plan's z reaches the noise unchanged; no factor is applied on the way and taken off again).
"""

from __future__ import annotations

import math
import os

import numpy as np


#: the snapping grid of a release-mode aggregate adds at most this share to its sensitivity
#: (:func:`snap_grid`); the noise covers the snapped sensitivity (:func:`snapped_sensitivity`)
SNAP_SHARE = 1e-4


class SecureRandom:
    """The subset of ``numpy.random.Generator`` popri uses, backed by ``os.urandom``."""

    secure = True

    def random(self, size=None) -> np.ndarray | float:
        n = int(np.prod(size)) if size is not None else 1
        raw = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
        u = (raw >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
        return u.reshape(size) if size is not None else float(u[0])

    def normal(self, loc=0.0, scale=1.0, size=None):
        n = int(np.prod(size)) if size is not None else 1
        m = (n + 1) // 2
        u1 = 1.0 - self.random(m)  # (0, 1]: log is finite
        u2 = self.random(m)
        r = np.sqrt(-2.0 * np.log(u1))
        z = np.concatenate([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)])[:n]
        z = loc + scale * z
        return z.reshape(size) if size is not None else float(z[0])

    def standard_normal(self, size=None, dtype=np.float64):
        return np.asarray(self.normal(0.0, 1.0, size), dtype=dtype)

    def permutation(self, n: int) -> np.ndarray:
        # Fisher-Yates driven by secure uniforms
        a = np.arange(n)
        u = np.asarray(self.random(max(n - 1, 1)))
        for i in range(n - 1, 0, -1):
            j = int(u[i - 1] * (i + 1))
            a[i], a[j] = a[j], a[i]
        return a

    def choice(self, n: int, size: int, replace: bool = True, p=None) -> np.ndarray:
        if p is not None:
            cdf = np.cumsum(np.asarray(p, dtype=np.float64))
            cdf /= cdf[-1]
            return np.minimum(np.searchsorted(cdf, self.random(size), side="right"), n - 1)
        if replace:
            return np.minimum((np.asarray(self.random(size)) * n).astype(np.int64), n - 1)
        return self.permutation(n)[:size]


def make_rng(seed: int | None, *, secure: bool = False, stream: str = "") -> np.random.Generator | SecureRandom:
    """A generator for one purpose (``stream``); independent streams for one seed."""
    if secure:
        return SecureRandom()
    if seed is None:
        raise ValueError("a seed is required outside release mode")
    # Derive a separate, reproducible stream per purpose from (seed, stream name)
    key = [int(seed) & 0xFFFFFFFF] + [ord(c) for c in stream]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(key)))


def release_mode_from_env() -> bool:
    return os.environ.get("POPRI_RELEASE", "").lower() in ("1", "true", "yes", "on")


# --------------------------------------------------------------------------- release-mode noise
def snap_grid(sensitivity: float, dim: int) -> float:
    """The power-of-two grid g for :func:`discrete_gaussian_release`.

    Rounding each of ``dim`` coordinates to the nearest multiple of g moves it by <= g/2, so two
    neighbouring aggregates whose difference has L2 norm <= D differ after snapping by <= D +
    g*sqrt(dim) (each coordinate's difference grows by < g).  g is the largest power of two with
    g*sqrt(dim) <= SNAP_SHARE * D; a power of two keeps k*g exact in float64 for |k| < 2^53."""
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be finite and > 0 (got {sensitivity})")
    return 2.0 ** math.floor(math.log2(SNAP_SHARE * sensitivity / math.sqrt(max(dim, 1))))


def _uniform_open(rng, n: int) -> np.ndarray:
    """n uniforms in (0, 1]."""
    return 1.0 - np.asarray(rng.random(n), dtype=np.float64)


def discrete_laplace(t: float, n: int, rng) -> np.ndarray:
    """n draws of the discrete Laplace P(y) ~ exp(-|y|/t) on the integers (int64).

    A geometric magnitude G (P(G=k) ~ exp(-k/t), by inversion of a secure uniform) with a sign;
    (negative, 0) is rejected so that 0 is not counted twice (Canonne et al. 2020, Algorithm 2)."""
    out = np.empty(0, dtype=np.int64)
    while len(out) < n:
        m = 2 * (n - len(out)) + 16
        g = np.floor(-t * np.log(_uniform_open(rng, m))).astype(np.int64)
        neg = np.asarray(rng.random(m)) < 0.5
        ok = ~(neg & (g == 0))
        out = np.concatenate([out, np.where(neg, -g, g)[ok]])
    return out[:n]


def discrete_gaussian(sigma: float, n: int, rng) -> np.ndarray:
    """n draws of the discrete Gaussian N_Z(0, sigma^2): P(y) ~ exp(-y^2 / (2 sigma^2)), int64.

    Canonne, Kamath, Steinke 2020, Algorithm 3: Y ~ discrete Laplace(t), t = floor(sigma) + 1,
    accepted with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)).  The acceptance test uses
    float64 probabilities from 53-bit secure uniforms; the outputs are exact integers, so the
    float rounding only perturbs the probabilities (relative error ~1e-16), never the support."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be finite and > 0 (got {sigma})")
    if sigma < 0.03:
        # P(Y != 0) <= 2 exp(-1 / (2 sigma^2)) < 1e-240; and sigma^2 underflows below ~1e-154,
        # where the acceptance test below would be 0/0 and never accept (an endless loop)
        return np.zeros(n, dtype=np.int64)
    t = math.floor(sigma) + 1.0
    out = np.empty(0, dtype=np.int64)
    while len(out) < n:
        m = 2 * (n - len(out)) + 16
        y = discrete_laplace(t, m, rng)
        p = np.exp(-((np.abs(y) - sigma * sigma / t) ** 2) / (2.0 * sigma * sigma))
        out = np.concatenate([out, y[np.asarray(rng.random(m)) < p]])
    return out[:n]


def snapped_sensitivity(sensitivity: float, dim: int) -> tuple[float, float]:
    """(g, D + g sqrt(dim)): release mode's grid for an aggregate of ``dim`` coordinates with L2
    sensitivity D, and the sensitivity after snapping to it (:func:`snap_grid`), which the
    noise is calibrated to."""
    g = snap_grid(sensitivity, dim)
    return g, sensitivity + g * math.sqrt(max(dim, 1))


def discrete_gaussian_release(x: np.ndarray, z: float, sensitivity: float, rng
                              ) -> tuple[np.ndarray, float]:
    """Release ``x`` (any shape, float) with noise multiplier ``z`` for L2 sensitivity
    ``sensitivity`` (D): ``(g * (round(x / g) + Z), g)`` with Z ~ N_Z(0, (z D' / g)^2) i.i.d.,
    D' = D + g sqrt(x.size) the sensitivity after snapping (:func:`snapped_sensitivity`).  In
    grid units the sensitivity is D' / g and the std z D' / g: the discrete Gaussian's bound at
    exactly multiplier ``z`` (Canonne, Kamath, Steinke 2020, Theorem 14), what the ledger gets."""
    x = np.asarray(x, dtype=np.float64)
    g, snapped = snapped_sensitivity(sensitivity, x.size)
    k = np.rint(x / g)
    if x.size and not np.all(np.abs(k) < 2.0 ** 52):
        raise ValueError("aggregate too large for the release grid (|x|/g >= 2^52)")
    noise = discrete_gaussian(z * snapped / g, x.size, rng).reshape(x.shape)
    return (k + noise) * g, g
