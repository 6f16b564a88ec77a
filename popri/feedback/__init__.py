"""Client feedback on synthetic samples: what one client computes (cosine scores for POPri, the
nearest-neighbour vote for PE) and the DP release of their sum (``release``)."""
