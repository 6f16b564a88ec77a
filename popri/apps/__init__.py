"""Entry points that stand above every method (docs/architecture.md: the ``apps`` layer).

    popri audit release --mechanism cosine -z 1 --trials 10000     # apps/audit/
    flwr run .   # a deployment names popri.apps.flower.{server_app,client_app}:app

- :mod:`popri.apps.flower`: the Flower apps.  One SuperNode computes the client side of every
  method (POPri's cosine scores, PrE-Text's histogram votes, a DP-FL model update), so the node
  imports ``feedback`` and ``methods`` and cannot live in ``federated``, which the methods use.
- :mod:`popri.apps.audit`: the empirical privacy audit, which replays every method's release
  (FreD's statistics and DP-FTRL's tree included) through the library's own code.
"""
