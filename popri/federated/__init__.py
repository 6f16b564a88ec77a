"""The federated layer: who participates in a round (``participation``) and how uploads are
summed (``aggregation``: noisy sums, shard reduction)."""
