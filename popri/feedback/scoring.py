"""Deprecated: the old home of the client feedback maths, split by layer (issue 11).

    participation  popri.federated.participation   Participation (was Sample), factorize,
                                                   sample_clients, cap_per_client, row_blocks
    aggregation    popri.federated.aggregation     noisy_sum, finish, sum_rows, block_clients
    cosine         popri.feedback.cosine           normalize_rows, client_means,
                                                   cosine_coefficients, cosine_rows, cosine_round
    histogram      popri.feedback.histogram        nn_index, nearest_votes, histogram_rows,
                                                   histogram_round

This module only re-exports those names for the callers not yet moved; it is deleted once
nothing imports it.  Setting one of its attributes (``mock.patch.object(scoring,
"cosine_coefficients", ...)``) sets it in the defining module too, so a patch still reaches the
code that calls it.
"""

from __future__ import annotations

import sys
import types

from popri.federated import aggregation, participation
from popri.federated.aggregation import (BLOCK_BYTES, block_clients, finish,  # noqa: F401
                                         noisy_sum, sum_rows)
from popri.federated.participation import (ROW_BLOCK, Participation,  # noqa: F401
                                           cap_per_client, factorize, row_blocks,
                                           sample_clients)
from popri.feedback import cosine, histogram
from popri.feedback.cosine import (client_means, cosine_coefficients,  # noqa: F401
                                   cosine_round, cosine_rows, normalize_rows)
from popri.feedback.histogram import (histogram_round, histogram_rows,  # noqa: F401
                                      nearest_votes, nn_index)

Sample = Participation  # the old name: "sample" meant the participating clients

#: public name -> the module that defines it (where its callers look it up)
_HOMES = {name: mod for mod in (participation, aggregation, cosine, histogram)
          for name, obj in vars(mod).items()
          if name in globals() and getattr(obj, "__module__", None) == mod.__name__}


class _Forwarding(types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        home = _HOMES.get(name)
        if home is not None:
            setattr(home, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Forwarding
