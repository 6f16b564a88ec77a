"""popri on Flower (flwr): client feedback rounds with SecAgg+ (issue 12).

``engine`` runs a round on Flower's simulation runtime for ``popri score --engine flower``;
``simulate`` is that simulation's child process, ``deploy`` a multi-machine deployment
(docs/flower.md).  The Flower apps themselves (the ServerApp, the ClientApp and one SuperNode's
upload) are the entry-point package :mod:`popri.apps.flower`: a node computes every method's
client side, so it sits above ``methods`` (docs/architecture.md), and this layer names the apps
by their Flower component strings, as a deployment's pyproject.toml does.
Importing this package does not import flwr.
"""

import importlib

#: the Flower components ("module:attribute"), as a deployment's pyproject.toml names them
SERVER_APP = "popri.apps.flower.server_app:app"
CLIENT_APP = "popri.apps.flower.client_app:app"


def load_app(ref: str):
    """The object a Flower component string ``module:attribute`` names (as ``flwr`` loads it)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
