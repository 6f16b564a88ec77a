"""popri: differentially private synthetic text from federated data.

The library behind the ``popri`` command.  Each stage is a thin Typer module in
``popri.cli.commands`` that calls into this package:

- ``popri.core.io``             file formats (JSONL, embedding sets, score vectors), atomic writes
- ``popri.privacy.ledger``         the privacy ledger every DP stage appends to
- ``popri.privacy``        accounting maths (RDP / PLD), noise, calibration
- ``popri.data``           benchmark corpora, chunking, client-level splits
- ``popri.models.embed``          sentence-transformers embedding with a content-hash cache
- ``popri.feedback.scoring``        the client side of POPri (cosine) and PE (nn-histogram), aggregation
"""

__version__ = "0.1.0"
