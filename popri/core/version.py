"""popri's version: in every artifact's provenance (ledger entries, manifests, stage keys).

``popri.__version__`` re-exports it; layers below the package root read it here, so that no
module imports the root package (whose ``__getattr__`` reaches the top-level API).
"""

__version__ = "0.3.0"
