"""popri: differentially private synthetic text from federated data.

The library behind the ``popri`` command.  Each stage is a thin Typer module in
``popri_cli.commands`` that calls into this package:

- ``popri_cli.io``             file formats (JSONL, embedding sets, score vectors), atomic writes
- ``popri_cli.ledger``         the privacy ledger every DP stage appends to
- ``popri_cli.privacy``        accounting maths (RDP / PLD), noise, calibration
- ``popri_cli.data``           benchmark corpora, chunking, client-level splits
- ``popri_cli.embed``          sentence-transformers embedding with a content-hash cache
- ``popri_cli.scoring``        the client side of POPri (cosine) and PE (nn-histogram), aggregation
"""

__version__ = "0.1.0"
