"""Deprecated: the old home of the client feedback maths, split by layer (issue 11).

    participation  popri.federated.participation   Participation (was Sample), factorize,
                                                   sample_clients, cap_per_client, row_blocks
    aggregation    popri.federated.aggregation     noisy_sum, finish, sum_rows, block_clients
    cosine         popri.feedback.cosine           normalize_rows, client_means,
                                                   cosine_coefficients, cosine_rows, cosine_round
    histogram      popri.feedback.histogram        nn_index, nearest_votes, histogram_rows,
                                                   histogram_round

Nothing in popri imports this module: it keeps ``popri_cli.scoring`` (the deprecated import name)
working for one release.  Patch a function where it is defined, not here.
"""

from popri.federated.aggregation import (BLOCK_BYTES, block_clients, finish,  # noqa: F401
                                         noisy_sum, sum_rows)
from popri.federated.participation import (ROW_BLOCK, Participation,  # noqa: F401
                                           cap_per_client, factorize, row_blocks,
                                           sample_clients)
from popri.feedback.cosine import (client_means, cosine_coefficients,  # noqa: F401
                                   cosine_round, cosine_rows, normalize_rows)
from popri.feedback.histogram import (histogram_round, histogram_rows,  # noqa: F401
                                      nearest_votes, nn_index)

Sample = Participation  # the old name: "sample" meant the participating clients
