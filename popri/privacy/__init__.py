"""Differential privacy: noise sources and privacy accounting.

    popri account epsilon --noise-multiplier 2.5 --sample-rate 0.1 --steps 20
    popri account ledger runs/

- :mod:`popri.privacy.noise`: seeded / secure random sources for noise and client sampling.
- :mod:`popri.privacy.accounting`: epsilon <-> noise multiplier (opacus RDP or
  dp-accounting PLD) and the composition of a pipeline's ledger.

Nothing is imported here, so ``import popri.privacy.noise`` stays light.
"""
