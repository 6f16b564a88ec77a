"""Benchmark corpora as federated datasets: sources, chunking, client-level splits.

    popri bench list
    popri bench fetch sotu --out data/sotu
    popri bench stats data/sotu

Modules: ``sources`` (THE source registry ``SOURCES``, ``register_source``, Document,
SourceData), one module per source family: ``sotu``, ``shakespeare``, ``debian``, ``hub``
(biorxiv, congress, pubmed, local tables via ``datasets``); ``tokenize`` (offset tokenizers),
``chunking``, ``splits``, ``build`` (the shared pipeline + manifest; settings in
:class:`popri.specs.data.FetchSpec`), ``stats``.
"""
