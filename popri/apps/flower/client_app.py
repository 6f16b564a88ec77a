"""Flower ClientApp: one SuperNode's side of a popri feedback round, behind SecAgg+.

    # one machine (Flower's simulation runtime; this module is loaded in every client worker)
    popri score --engine flower --supernodes 8 --private runs/priv.npy --synthetic runs/syn.npy \\
        -z 1 --clients-per-round 40 --seed 0 --out runs/scores.npy
    # a real device: a SuperNode whose node config names its private data (texts or embeddings)
    flower-supernode --superlink HOST:8000 --root-certificates ca.pem \\
        --node-config "data-path='/data/me.jsonl'"          # see docs/flower.md

A deployed SuperNode (``popri score --federation``) is ONE client: all rows of its
``data-path`` are that client's samples (capped at M for nn-histogram).  An engine job's node
file with ``client_id`` rows (simulation, or :func:`popri.federated.flower.deploy.loopback_job`)
holds several clients, each scored on its own.

The server (:mod:`popri.apps.flower.server_app`) sends the synthetic embeddings as the fit
parameters and the round's settings (JSON) in the fit config.  The node loads its private data:
``node_config["data-path"]`` in a deployment (a JSONL of texts, which it embeds with the same
model as the server, or an embedding set), or the partition the simulation engine wrote
(``$POPRI_FLOWER_JOB/node-<partition-id>.npy``); computes :func:`popri.apps.flower.node.
upload`; and returns it with ``num_examples = 1`` (Flower's SecAgg+ weight: 1/max_weight = 1, so
its aggregate is the plain mean of the survivors' uploads, which the server turns back into the
sum).  ``flwr.client.mod.secaggplus_mod`` masks and quantises the upload; the server never sees
it alone.

Randomness: research mode seeds the node's stream from (seed, round, node); release mode uses the
OS CSPRNG (:class:`popri.privacy.noise.SecureRandom`).

Fault injection (tests, drills): ``POPRI_FLOWER_DROP=0,3`` makes the nodes with those
partition ids fail in SecAgg+'s masked-vector stage, after they shared their keys -- the dropout
SecAgg+ must recover from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from popri.apps.flower import node
from popri.data.records import text_records
from popri.feedback.release import load_set

JOB_ENV = "POPRI_FLOWER_JOB"
DROP_ENV = "POPRI_FLOWER_DROP"


def node_index(context) -> int:
    """The node's partition id (simulation) or its Flower node id (deployment)."""
    cfg = context.node_config
    return int(cfg["partition-id"]) if "partition-id" in cfg else int(context.node_id)


node_rng = node.node_rng  # the node's random source (popri.apps.flower.node)


def load_data(context, settings: dict):
    """(embeddings [k, d], client ids) of this node's private data."""
    path = context.node_config.get("data-path")
    if path:
        es = load_set(str(path), model=settings.get("model"),
                      split=settings.get("split", "train"), what="private", private=False)
        x = np.asarray(es.embeddings, dtype=np.float32)
        if settings.get("deployed") or any(r.get("client_id") is None for r in es.rows):
            return x, ["supernode"] * len(es)  # a deployed SuperNode is ONE client
        return x, es.client_ids()  # an engine job's node file on a loopback deployment
    job = os.environ.get(JOB_ENV) or settings.get("job")
    es = load_set(str(Path(job) / f"node-{node_index(context)}.npy"), model=settings.get("model"),
                  split="train", what="private", private=True)
    return np.asarray(es.embeddings, dtype=np.float32), es.client_ids()


def load_texts(context, settings: dict):
    """(texts, client ids) of this node's clients in a DP-FL round: a deployed node's
    ``data-path`` (JSONL with ``text``: ONE client, the device) or the engine's
    ``node-<partition-id>.jsonl`` (rows with ``client_id``)."""
    path = context.node_config.get("data-path")
    if path:
        recs, _ = text_records(str(path), settings.get("split", "train"))
        return [r["text"] for r in recs], ["supernode"] * len(recs)
    job = os.environ.get(JOB_ENV) or settings.get("job")
    recs, _ = text_records(str(Path(job) / f"node-{node_index(context)}.jsonl"), "train",
                           require_client=True)
    return [r["text"] for r in recs], [str(r["client_id"]) for r in recs]


class FeedbackClient(NumPyClient):
    def __init__(self, context) -> None:
        self.context = context

    def get_parameters(self, config):
        return []

    def fit(self, parameters, config):
        settings = json.loads(str(config["settings"]))
        syn = np.asarray(parameters[0], dtype=np.float32)
        if settings.get("payload_only"):  # benchmarks/bench_flower.py: SecAgg+ alone
            return [np.zeros(len(syn))], 1, {}
        if settings["mode"] == "fl":  # DP-FL: the node's clients' texts
            emb, ids = load_texts(self.context, settings)
        else:
            emb, ids = load_data(self.context, settings)
        idx = node_index(self.context)
        vec = node.upload(settings, syn, emb, ids, node_rng(settings, idx))
        return [vec], 1, {"clients": len(set(ids))}


def client_fn(context):
    return FeedbackClient(context).to_client()


def drop_mod(msg, ctxt, call_next):
    """Fail on purpose in the masked-vector stage (``POPRI_FLOWER_DROP``)."""
    drop = {s.strip() for s in os.environ.get(DROP_ENV, "").split(",") if s.strip()}
    if drop and str(node_index(ctxt)) in drop:
        cfg = msg.content.config_records.get(RECORD_KEY_CONFIGS)
        if cfg is not None and cfg.get(Key.STAGE) == Stage.COLLECT_MASKED_VECTORS:
            raise RuntimeError(f"popri: node {node_index(ctxt)} drops out "
                               f"({DROP_ENV}, fault injection)")
    return call_next(msg, ctxt)


app = ClientApp(client_fn=client_fn, mods=[drop_mod, secaggplus_mod])
