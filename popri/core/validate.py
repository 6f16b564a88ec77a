"""Range checks for numeric options, one wording everywhere.

    from popri.core.validate import finite
    z = finite(z, "--noise-multiplier", lo=0, hi=Z_MAX)
    q = finite(q, "--sample-rate", lo=MIN_SAMPLE_RATE, hi=1)

Each check raises :class:`~popri.core.errors.InputError` with ``field`` = the option, so the CLI
prints ``popri: error: field '--clip': must be a finite number in (0, 1e+06] (got inf)`` and
exits 2 before anything is read or written.  NaN, +-inf, bools and non-numbers are refused.

The bounds used by the DP stages (and why):

- ``Z_MAX`` = 1e6 for a noise multiplier (the upper end of ``popri account sigma``'s search): at
  z = 1e6 every release is pure noise and every accountant reports epsilon ~ 0, and
  z x clip / (q N) stays far inside float32 (1e6 x 1e6 / 1e-12 = 1e24 < 3.4e38), so no output
  value can overflow to infinity.
- ``CLIP_MAX`` = 1e6 for an L2 clip norm: a cosine client's score vector has norm <= sqrt(n_syn)
  (z-scored: exactly sqrt(n_syn)) and popri's embeddings are L2-normalised, so a larger clip
  clips nothing for up to 1e12 synthetic samples; above it the squared norms FreD's covariance
  release works with (c^2 z) leave float64's precise range.
- ``MIN_SAMPLE_RATE`` = 1e-12 for a Poisson rate q: the server divides the noisy sum by the
  expected participants q N; with q >= 1e-12 (and z, clip <= 1e6) the noise on the released mean
  is at most 1e24, finite in float32; q = 1e-300 made it infinite.  A rate below 1e-12 expects no
  participant among any realistic population anyway.
- ``EPSILON_MAX`` = 700 for a target epsilon: the analytic Gaussian calibration evaluates
  e^eps (float64 overflows above 709.78), and no guarantee is left at that size.
"""

from __future__ import annotations

import math
import numbers

from popri.core.errors import InputError

Z_MAX = 1e6
CLIP_MAX = 1e6
MIN_SAMPLE_RATE = 1e-12
EPSILON_MAX = 700.0
EPOCHS_MAX = 1e4  # epochs of DPO / SFT: a float (fractions allowed); 1e308 overflowed the steps


def _fmt(x: float) -> str:
    return f"{x:g}"


def finite(value, option: str, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, hi_open: bool = False, *, path: str | None = None,
           line: int | None = None) -> float:
    """``value`` as a float if it is a finite number within [lo, hi] (``lo_open`` / ``hi_open``
    exclude the ends); else :class:`InputError` naming ``option``."""
    if lo is None and hi is None:
        want = "a finite number"
    elif hi is None and lo is not None:
        want = f"a finite number {'>' if lo_open else '>='} {_fmt(lo)}"
    elif lo is None and hi is not None:
        want = f"a finite number {'<' if hi_open else '<='} {_fmt(hi)}"
    else:
        assert lo is not None and hi is not None
        want = (f"a finite number in {'(' if lo_open else '['}{_fmt(lo)}, {_fmt(hi)}"
                f"{')' if hi_open else ']'}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputError(f"must be {want} (got {value!r})", field=option, path=path, line=line)
    x = float(value)
    ok = math.isfinite(x)
    if ok and lo is not None:
        ok = x > lo if lo_open else x >= lo
    if ok and hi is not None:
        ok = x < hi if hi_open else x <= hi
    if not ok:
        raise InputError(f"must be {want} (got {value!r})", field=option, path=path, line=line)
    return x
