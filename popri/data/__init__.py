"""Benchmark corpora as federated datasets: sources, chunking, client-level splits.

    popri bench list
    popri bench fetch sotu --out data/sotu
    popri bench stats data/sotu

Modules: ``sources`` (registry, Document, SOTU), ``shakespeare``, ``debian``, ``hub`` (biorxiv,
congress, pubmed, local tables via ``datasets``), ``tokenize`` (offset tokenizers),
``chunking``, ``splits``, ``build`` (the shared pipeline + manifest), ``stats``.
"""
