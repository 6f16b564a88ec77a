"""The Flower apps of popri: ``server_app`` (the ServerApp: SecAgg+ sum of the nodes' uploads),
``client_app`` (the ClientApp) and ``node`` (one SuperNode's upload, no Flower import).  The
simulation (:mod:`popri.federated.flower.simulate`) and a deployment (docs/flower.md) load them by
their component strings :data:`popri.federated.flower.SERVER_APP` / ``CLIENT_APP``.
"""
