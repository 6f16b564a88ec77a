"""Random sources for DP noise and client sampling.

Research mode (default): a seeded ``numpy.random.Generator`` (PCG64), so the same inputs and
``--seed`` give the same outputs.

Release mode (``--release`` / ``POPRI_RELEASE=1``): every draw that protects privacy (the
Gaussian noise and the client sample) comes from the operating system's CSPRNG
(``os.urandom``, via :class:`SecureRandom`); the seed is ignored for them.  Gaussians are made
from 53-bit uniforms by the Box-Muller transform in float64.  (Floating-point side channels of
sampled Gaussians, Mironov 2012, are not addressed here; a discrete Gaussian over secure
aggregation is the deployment answer and is out of scope for this simulator.)
"""

from __future__ import annotations

import os

import numpy as np


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
        u = self.random(max(n - 1, 1))
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
            return np.minimum((self.random(size) * n).astype(np.int64), n - 1)
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
