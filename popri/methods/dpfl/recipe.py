"""DP-FedAvg and DP-FTRL as stages of ``popri run`` (``method: dp-fedavg | dp-ftrl``): the DP
federated-learning baselines of "Private Federated Learning using Preference-Optimized
Synthetic Data" (POPri, arXiv:2504.16438, section 4; appendix C.1, C.2, D.1).

    popri run examples/dpfl.yaml --dry-run                       # DP-FedAvg, lists the stages
    popri run examples/dpfl.yaml --set method=dp-ftrl

One cached, resumable stage per round, ``popri fl round`` (:mod:`popri.methods.dpfl.rounds`),
each continuing the previous round's directory; the last round's ``model/`` is the downstream
model the driver evaluates on the private test split, next to eps = 0 and eps = inf.  There is
no synthetic set (no FID column).  The noise multiplier is calibrated to privacy.epsilon over
the T rounds' ledger entries: ``subsampled_gaussian`` at q = fl.clients_per_round / N for
DP-FedAvg; for DP-FTRL ``tree_aggregation`` of one tree per epoch of R = floor(N / L) rounds
(``fl.restart: epoch``, Kairouz et al.'s TreeRestart: each client in at most one round of an
epoch, so a client is in one leaf of each tree and the tree is the Gaussian at z / sqrt(depth
R), no amplification by sampling).  T = 20 R rounds (20 trees) reproduce POPri Table 3's
partial-participation DP-FTRL noise multipliers (tests/test_dpftrl_epochs.py).  ``fl.restart:
round`` is a one-leaf tree per round on fresh samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from popri.core.errors import ConfigError
from popri.kit import Z_LATER, DPRelease, Stage
from popri.methods.base import Method
from popri.methods import steps
from popri.methods.dpfl import readback
from popri.methods.dpfl.rounds import epoch_leaves, epoch_position
from popri.privacy.plan import Noise
from popri.specs.commands.fl import FlRoundCall
from popri.specs.engine import EngineSpec
from popri.specs.fl import FLSpec

#: FLSpec fields that come from the run config's fl section
_FROM_CONFIG = ("clip", "client_lr", "local_epochs", "client_batch_size", "server_lr",
                "momentum", "lora_r", "lora_alpha", "max_samples_per_client", "max_length",
                "bf16", "clients_per_round", "sample_rate", "public_clients")


def algorithm(cfg) -> str:
    return cfg.method.removeprefix("dp-")


def participation(cfg) -> tuple:
    return cfg.fl.clients_per_round, cfg.fl.sample_rate, "fl"


def model_name(cfg) -> str:
    return cfg.fl.model or cfg.downstream.model


def round_dir(run, t: int) -> Path:
    return run.paths.root / "fl" / f"round{t}"


def model_out(run) -> Path:
    return round_dir(run, run.cfg.rounds) / "model"


def round_entries(cfg, t: int, noise: Noise, clients: int | None,
                  spec: FLSpec | None = None) -> list:
    """Round t's prospective ledger entry with the planned ``noise`` (its z, q, sampling,
    relation and sensitivity): what ``popri fl round`` will record, by the same entry function
    (:meth:`popri.privacy.plan.Noise.entry`) on the same engine.  ``clients``: N, public under
    DP-FTRL's blocks (R = floor(N / L) leaves).  ``spec``: the round stage's own call (an
    :class:`~popri.specs.fl.FLSpec`), whose z, bound, engine and relation the entry is then
    planned from; without it (the calibration, before any stage exists) :func:`fl_spec`."""
    if not noise.planned:
        return []
    if spec is None:
        spec = fl_spec(cfg)
    else:  # the stage's own z and relation (its bound and convention)
        noise = noise.replace(z=spec.noise_multiplier).at(str(noise.sampling), spec)
    params = {"round": t, "algorithm": cfg.method}
    if spec.epoch_trees:
        # one tree per epoch of R rounds: the tree is one release, recorded by each of its
        # rounds under one id (counted once), so only its first round plans it
        if clients is None and spec.assignment == "blocks":
            return []  # a dry run before the fetch: R = floor(N / L) is known after it
        R, e, r = epoch_position(epoch_leaves(spec, clients or 0, cfg.fl.clients_per_round), t)
        if r > 1:
            return []
        # the tree takes no amplification by sampling: q = 1, under its assignment's relation
        tree = noise.replace(sample_rate=1.0, sampling="none", sensitivity=spec.sensitivity,
                             relation=spec.tree_relation)
        return [tree.entry(spec, "fl", delta=cfg.privacy.delta, tree=True, leaves=R,
                           params={**params, "tree": e, "restart": "epoch",
                                   "assignment": spec.assignment})]
    return [noise.entry(spec, "fl", delta=cfg.privacy.delta, params=params,
                        tree=spec.algorithm == "ftrl")]


def blocks(cfg) -> bool:
    """DP-FTRL's epoch trees over blocks of a permutation (``fl.assignment: blocks``): R =
    floor(N / L) rounds an epoch, so N is public."""
    fl = cfg.fl
    return algorithm(cfg) == "ftrl" and fl.restart == "epoch" and fl.assignment == "blocks"


def epoch_rounds(cfg) -> int | None:
    """DP-FTRL with ``fl.assignment: bins``: R, the rounds of an epoch -- ``fl.epoch_rounds``,
    else 1 / fl.sample_rate rounded (each client once per epoch, as often as Poisson sampling at
    that rate would take it part); None for the other settings."""
    fl = cfg.fl
    if algorithm(cfg) != "ftrl" or fl.restart != "epoch" or fl.assignment != "bins":
        return None
    if fl.epoch_rounds is not None:
        return int(fl.epoch_rounds)
    return max(1, round(1.0 / fl.sample_rate)) if fl.sample_rate else 1


def fl_spec(cfg) -> FLSpec:
    """The FLSpec of the run's rounds (its engine, algorithm, restart and assignment decide the
    entry; its clip bounds a client's update)."""
    c, fl = cfg, cfg.fl
    return FLSpec(algorithm=algorithm(c), clip=fl.clip, restart=fl.restart,
                  **_participation_args(c), convention=c.privacy.convention,
                  **EngineSpec.of(fl).engine_settings())


def _participation_args(cfg) -> dict:
    """Who takes part, as ``popri fl round`` takes it: DP-FTRL epochs take the assignment (bins:
    R rounds an epoch; blocks: L clients a round), the others the sampling."""
    fl = cfg.fl
    if algorithm(cfg) == "ftrl" and fl.restart == "epoch":
        if fl.assignment == "bins":
            return {"assignment": "bins", "epoch_rounds": epoch_rounds(cfg)}
        return {"assignment": "blocks", "clients_per_round": fl.clients_per_round}
    return {"clients_per_round": fl.clients_per_round, "sample_rate": fl.sample_rate}


def fl_settings(run, z) -> dict:
    """``popri fl round``'s settings (fields of :class:`~popri.specs.fl.FLSpec`) at the
    noise multiplier ``z`` (None in a dry run before the fetch: a placeholder)."""
    c, fl = run.cfg, run.cfg.fl
    vals = ({k: getattr(fl, k) for k in _FROM_CONFIG if k not in ("clients_per_round",
                                                                  "sample_rate")}
            | _participation_args(c) | EngineSpec.of(fl).engine_settings())
    if c.privacy.convention:
        vals["convention"] = c.privacy.convention
    if algorithm(c) == "ftrl":
        vals["restart"] = fl.restart
    return {**vals, "algorithm": algorithm(c), "delta": c.privacy.delta,
            "release": run.release, "lora": fl.lora,
            "noise_multiplier": Z_LATER if z is None else z}


def recipe(run) -> Iterator[Stage]:
    """T rounds of ``popri fl round``, each from the previous round's directory."""
    c = run.cfg
    if c.fl.clients_per_round is None and c.fl.public_clients is None:
        # each round divides its noisy sum by a PUBLIC count (aggregation.public_count): a fixed
        # L, else q times the enrolled clients the operator declares public
        raise ConfigError("a DP-FL round divides its noisy sum by a PUBLIC count, and "
                          "without a fixed fl.clients_per_round the number of clients is private "
                          "(add/remove one client): declare the enrolled clients N_pub (a number "
                          "you state, not one computed from the data; an estimate only scales "
                          "the step)", field="fl.public_clients")
    priv = str(run.paths.private)
    noise = run.noise
    z = noise.z if noise else None
    clients = run.disclosed_clients()
    prev = None
    for t in range(1, c.rounds + 1):
        out = round_dir(run, t)
        values = dict(data=priv, round_=t, out=str(out), model=model_name(c), seed=c.seed,
                      init=str(prev) if prev else None, **fl_settings(run, z))
        call = FlRoundCall.draft(**values) if z is None else FlRoundCall(**values)
        yield Stage(f"fl-round{t}", call,
            outputs=[str(out)], inputs=[priv, *([str(prev)] if prev else [])],
            release=DPRelease(round_entries(c, t, noise, clients, spec=call)
                              if noise and z is not None else [],
                              out.parent / "ledger.jsonl",
                              lambda e, t=t: e.stage == "fl" and e.params.get("round") == t))
        prev = out


def results(run, noise: Noise | None) -> dict:
    import json

    fl = run.cfg.fl
    rounds = []
    for t in range(1, run.cfg.rounds + 1):
        f = round_dir(run, t) / "round.json"
        if f.exists():
            r = json.loads(f.read_text(encoding="utf-8"))
            row = {"round": r.get("round")}
            diag = r.get("private_diagnostics")  # research mode only (NOT PRIVATE)
            if isinstance(diag, dict):
                row["private_diagnostics"] = {k: diag.get(k) for k in (
                    "private", "participants", "update_norm_mean", "clipped_share",
                    "local_loss")}
            rounds.append(row)
    return {"fl": {"algorithm": run.cfg.method, "model": model_name(run.cfg),
                   "clients_per_round": fl.clients_per_round, "sample_rate": fl.sample_rate,
                   "restart": fl.restart, "assignment": fl.assignment,
                   "epoch_rounds": epoch_rounds(run.cfg),
                   "clip": fl.clip, "client_lr": fl.client_lr, "local_epochs": fl.local_epochs,
                   "server_lr": fl.server_lr, "momentum": fl.momentum, "lora": fl.lora, "rounds": rounds}}


def shape(r: dict) -> str:
    fl = r.get("fl", {})
    label = "DP-FTRL" if r.get("method") == "dp-ftrl" else "DP-FedAvg"
    who = (f"{fl['clients_per_round']} clients/round" if fl.get("clients_per_round")
           else f"each client once per epoch of {fl['epoch_rounds']} rounds"
           if fl.get("epoch_rounds") else f"sample rate q={fl.get('sample_rate')}")
    return (f"{label} on {r['run_dir']}: T={r['rounds']} rounds, {who}, clip "
            f"{fl.get('clip')}, client lr {fl.get('client_lr')}, "
            f"{'LoRA' if fl.get('lora') else 'full'} {fl.get('model')}")


def plan_notes(run) -> list[str]:
    if algorithm(run.cfg) == "ftrl":
        if run.cfg.fl.restart == "epoch" and run.cfg.fl.assignment == "bins":
            return [f"DP-FTRL: a tree per epoch of {epoch_rounds(run.cfg)} rounds (TreeRestart), "
                    "each client drawn to one round of an epoch independently (bins: an added "
                    "client moves no other, so the tree holds under add/remove one client); no "
                    "amplification by sampling: z is calibrated at q = 1 over the trees"]
        if run.cfg.fl.restart == "epoch":
            n = run.disclosed_clients()
            L = run.cfg.fl.clients_per_round or n
            R = f"{max(1, n // L)}" if n else "floor(N / L)"
            return [f"DP-FTRL: a tree per epoch of {R} rounds (TreeRestart), each client in one "
                    "round of an epoch (blocks of a shuffled order): the tree holds under "
                    "ZERO-OUT one client, not add/remove (an added client pushes another out); "
                    "no amplification by sampling: z is calibrated at q = 1 over the trees"]
        return ["DP-FTRL: tree aggregation restarted every round (one leaf per tree), no "
                "amplification by sampling: z is calibrated as at q = 1"]
    return []


class DPFL(Method):
    """DP-FedAvg (POPri C.1) or DP-FTRL (POPri C.2): the method trains the downstream model
    itself on the private texts (no Omega, no embeddings, no synthetic set)."""
    releases = "model"
    writes_synthetic = False
    #: brown, olive
    COLOURS = {"fedavg": "#8c564b", "ftrl": "#bcbd22"}

    SUMMARIES = {
        "fedavg": ("DP-FedAvg", "DP-FedAvg (POPri C.1): T rounds of clipped client updates of "
                                "the downstream model + Gaussian noise"),
        "ftrl": ("DP-FTRL", "DP-FTRL (POPri C.2): T rounds, tree-aggregation noise on the prefix "
                            "sums, a tree per epoch (TreeRestart), server momentum 0.9")}

    def __init__(self, algorithm: str):
        self.name = f"dp-{algorithm}"
        self.label, self.summary = self.SUMMARIES[algorithm]
        self.colour = self.COLOURS[algorithm]

    def recipe(self, run) -> Iterator[Stage]:
        return recipe(run)

    def data(self, run):
        return steps.fetch_text(run, public=False)

    def embeddings(self, run):
        return ()

    def round_panels(self, run_dir, results):
        return readback.round_panels(run_dir, results)

    def participation(self, cfg) -> tuple:
        return participation(cfg)

    def clients_public(self, cfg) -> bool:
        """A fixed L of N a round, and DP-FTRL's blocks (floor(N / L) leaves a tree)."""
        return super().clients_public(cfg) or blocks(cfg)

    def round_spec(self, cfg) -> FLSpec:
        return fl_spec(cfg)

    def round_entries(self, cfg, t: int, noise: Noise, clients: int | None) -> list:
        return round_entries(cfg, t, noise, clients)

    def model_out(self, run) -> Path:
        return model_out(run)

    def results(self, run, noise: Noise | None) -> dict:
        return results(run, noise)

    def shape(self, r: dict) -> str:
        return shape(r)

    def plan_notes(self, run) -> list[str]:
        return plan_notes(run)
