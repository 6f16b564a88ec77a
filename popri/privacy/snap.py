"""Release mode's snap factor, in one place: what the discretised Gaussian costs, and what a
stage is passed so that the noise multiplier it records still meets the plan.

    python -m pytest -q tests/test_budget.py tests/test_ledger_protocol.py -k snap

Release mode snaps an aggregate to a power-of-two grid before adding discrete Gaussian noise
(:func:`popri.privacy.noise.discrete_gaussian_release`); the grid is chosen so that it inflates
the sensitivity by at most :data:`SNAP_SHARE` (:func:`popri.privacy.noise.snap_grid`), so a
stage passed z records at least z / (1 + SNAP_SHARE).  The plan therefore passes z times
:func:`snap_factor` (:class:`popri.privacy.plan.Noise`), and a given z guarantees z divided by
it.  Pure Python, no imports: the plan and the noise source both read it.
"""

from __future__ import annotations

#: the snapping grid of a release-mode aggregate costs at most this share of the sensitivity,
#: so the recorded z_eff >= z / (1 + SNAP_SHARE)
SNAP_SHARE = 1e-4


def snap_factor(release: bool) -> float:
    """The value a stage is passed over the noise multiplier it guarantees: 1 + SNAP_SHARE in
    release mode (the snapped mechanism records >= passed / (1 + SNAP_SHARE)), 1 in research
    mode (a float Gaussian records what it is passed)."""
    return 1.0 + SNAP_SHARE if release else 1.0


__all__ = ["SNAP_SHARE", "snap_factor"]
