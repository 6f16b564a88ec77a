"""Flower ServerApp: one popri feedback round through SecAgg+, the sum written to the job dir.

    popri score --engine flower --supernodes 8 ...        # simulation: loads this module
    flwr run popri-app/ popri --stream --run-config "job='/srv/run/job'"   # deployment: docs/flower.md

Reads the job directory the engine (:mod:`popri.federated.flower.engine`) wrote --
``settings.json`` (mode, clip, noise plan, the SecAgg+ plan of :mod:`popri.federated.secagg`)
and ``syn.npy`` (the synthetic embeddings; a DP-FL round: ``theta.npy``, the global weights,
named by ``settings["payload"]``) -- from ``$POPRI_FLOWER_JOB`` or the run config key
``job``.  Runs Flower's legacy workflow with SecAgg+ (``DefaultWorkflow(fit_workflow=
SecAggPlusWorkflow(...))`` on a ``LegacyContext``) for one round: every SuperNode gets the
synthetic embeddings as the fit parameters and the settings in the fit config, and uploads its
masked vector (:mod:`popri.apps.flower.client_app`).  Flower's aggregate with weight 1 per
node is the mean of the survivors' uploads; the app writes that mean, the number of survivors
and of failures to ``result.json`` + ``result.npy`` (atomically).  The engine turns them into
the sum, decodes the discrete Gaussian, finishes (:func:`popri.federated.aggregation.finish`)
and writes SCORES.npy and the ledger entry like the in-process path.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import ServerApp

from popri.core import io
from popri.federated.secagg import SecAggPlan

JOB_ENV = "POPRI_FLOWER_JOB"


class RoundCapture(FedAvg):
    """FedAvg that keeps what SecAgg+ produced: the survivors' mean upload and the counts."""

    def __init__(self, settings: dict, syn: np.ndarray, nodes: int):
        blob = json.dumps(settings)
        super().__init__(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=nodes,
                         min_evaluate_clients=0, min_available_clients=nodes,
                         initial_parameters=ndarrays_to_parameters([syn]),
                         on_fit_config_fn=lambda rnd: {"settings": blob},
                         accept_failures=True)
        self.mean: np.ndarray | None = None
        self.survivors = 0
        self.failures = 0
        self.sampled = 0

    def configure_fit(self, server_round, parameters, client_manager):
        out = super().configure_fit(server_round, parameters, client_manager)
        self.sampled = len(out)
        return out

    def aggregate_fit(self, server_round, results, failures):
        # (Flower's SecAgg+ workflow lists a dropped node's failure twice)
        self.survivors, self.failures = len(results), self.sampled - len(results)
        if not results:
            return None, {}
        # SecAgg+ wrote the same aggregate into every result: take it as it is
        params = results[0][1].parameters
        self.mean = np.asarray(parameters_to_ndarrays(params)[0], dtype=np.float64)
        return params, {}


def job_dir(context) -> Path:
    job = os.environ.get(JOB_ENV) or context.run_config.get("job")
    if not job:
        raise RuntimeError(f"no job directory: set {JOB_ENV} or the run config key 'job'")
    return Path(str(job))


app = ServerApp()


@app.main()
def main(grid, context) -> None:
    job = job_dir(context)
    settings = io.read_json(job / "settings.json", expect=dict)
    plan = SecAggPlan.from_dict(settings["secagg"])
    syn = np.load(job / settings.get("payload", "syn.npy"))  # what every node gets
    strategy = RoundCapture(settings, syn, plan.nodes)
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=1),
                           strategy=strategy)
    t0 = time.perf_counter()
    workflow = DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(
        **plan.flower_kwargs(timeout=settings.get("timeout"))))
    workflow(grid, legacy)
    took = time.perf_counter() - t0
    result = {"sampled": strategy.sampled, "survivors": strategy.survivors,
              "failures": strategy.failures, "seconds": took,
              "complete": strategy.mean is not None}
    if strategy.mean is not None:
        with io.atomic_write(job / "result.npy", "wb") as fh:
            np.save(fh, strategy.mean)
    io.write_json(result, job / "result.json")
