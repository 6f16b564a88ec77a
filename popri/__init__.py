"""popri: differentially private synthetic text from federated data.

    import popri
    popri.score("runs/priv.npy", "runs/r1/samples.jsonl", noise_multiplier=6.09,
                out="runs/r1/scores.npy")            # == popri score ...
    popri.account("runs/")                            # == popri account ledger runs/

The package is layered (docs/architecture.md): ``cli`` (the ``popri`` command), ``pipeline``
(``popri run``), ``methods`` (popri, pe, fred), ``eval``, ``feedback`` (what a client
computes), ``federated`` (participation, aggregation), ``models``, ``privacy`` (accounting,
noise, ledger, release), ``data``, ``specs`` (every step's settings) and ``core``.
``import popri`` is light: the API functions import their layer when called.
"""

from popri.core.version import __version__

__all__ = ["score", "account", "epsilon", "load_config", "run", "load_run", "__version__"]


def __getattr__(name):
    if name in ("score", "account", "epsilon", "load_config", "run", "load_run"):
        from popri import api

        return getattr(api, name)
    raise AttributeError(f"module 'popri' has no attribute {name!r}")
