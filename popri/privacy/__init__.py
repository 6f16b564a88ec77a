"""Differential privacy: noise, accounting, calibration, the ledger, the release protocol, audits.

    popri account epsilon --noise-multiplier 2.5 --sample-rate 0.1 --steps 20
    popri account sigma --epsilon 1 --sample-rate 0.1 --steps 20
    popri account ledger runs/
    popri audit release --mechanism cosine -z 1 --trials 10000

- :mod:`popri.privacy.noise`: seeded / secure random sources for noise and client sampling, the
  discrete Gaussian of release mode.
- :mod:`popri.privacy.accounting`: the mechanism registry (``register_mechanism``,
  ``MECHANISMS``, ``get_mechanism``; as opacus' accountant registry), epsilon of a composition
  (opacus RDP or dp-accounting PLD) and the composition of a pipeline's ledger.
- :mod:`popri.privacy.calibration`: epsilon -> noise multiplier, composed
  (``noise_multiplier``, ``calibrate``, ``solve``) or for one Gaussian release
  (``gaussian_multiplier``: classic / analytic).
- :mod:`popri.privacy.ledger`: the ledger files (locked appends, dedup by release id, totals).
- :mod:`popri.privacy.release`: the one release protocol every DP stage follows.
- :mod:`popri.apps.audit`: empirical lower bounds on a release's epsilon.

Nothing is imported here, so ``import popri.privacy.noise`` stays light.
"""
