"""DP-FedAvg and DP-FTRL: one federated round of the downstream model on the clients' private
texts, the DP federated-learning baselines of "Private Federated Learning using
Preference-Optimized Synthetic Data" (POPri, arXiv:2504.16438, section 4, appendix C.1, C.2).

    popri fl round --data runs/x/data/private --round 1 --algorithm fedavg -z 1.2 \
        --clients-per-round 8 --seed 0 --out runs/x/fl/round1
    popri fl round --data runs/x/data/private --round 2 --init runs/x/fl/round1 ... --out runs/x/fl/round2

One round t (McMahan et al., "Learning Differentially Private Recurrent Language Models",
arXiv:1710.06963, Algorithm 1; Kairouz et al., "Practical and Private (Deep) Learning without
Sampling or Shuffling", arXiv:2103.00039, section 3, DP-FTRLM):

1. sample the clients (``sampling`` stream: L of N without replacement, Poisson at q, or all);
2. each sampled client, in turn, loads the global weights theta_{t-1}, runs ``local_epochs`` of
   SGD (batch 2, sequences of 64 tokens, POPri C.1) on its texts and uploads
   Delta_k = theta_k - theta_{t-1} clipped to L2 norm C; the server keeps only the running sum
   (streaming: one client's update in memory at a time, never all of them -- a full-model
   update of a 135M model is 538 MB);
3. noise on the sum: ``fedavg`` adds N(0, z^2 C^2) (release mode: the discretised Gaussian of
   :func:`popri.privacy.noise.discrete_gaussian_release`); ``ftrl`` adds the increment of the
   tree-aggregation noise of the prefix sums (:func:`popri.federated.updates.tree_noise`,
   :class:`popri.privacy.tree.TreeNoise`).  By default (``--restart epoch``, Kairouz et al.'s
   TreeRestart) a tree covers an epoch of R = floor(N / L) rounds whose participants are the
   epoch's client order cut into blocks of L (:func:`epoch_schedule`, :func:`epoch_order`):
   each client is in one leaf of each tree, the condition of the tree's accounting (one ledger
   entry per tree, ``leaves`` R, q = 1).  ``--restart round``: a one-leaf tree per round on a
   fresh sample;
4. the server step on avg = noisy sum / D (D: L, or q N under Poisson sampling, or N):
   v_t = mu v_{t-1} + avg, theta_t = theta_{t-1} + eta_s v_t (FedAvg: mu = 0, eta_s = 1;
   DP-FTRLM: mu = 0.9, POPri C.2; eta_s = 1 - mu by default, the same long-run step; within a
   tree this is Kairouz et al.'s theta_0 - eta m_t on the noisy prefix sums, and the velocity
   carries over the restarts).

The round's release -- one ledger entry, ``subsampled_gaussian`` (or ``gaussian`` at q = 1) for
fedavg, ``tree_aggregation`` (one tree of one leaf) for ftrl -- goes through the release
protocol (:mod:`popri.privacy.release`): the ledger append, then the output directory renamed
into place, all or nothing (:mod:`popri.core.outdir`: only an output popri wrote is ever
replaced).  The output directory holds ``theta.npy`` (the global weights), ``server.npz``
(velocity), ``round.json`` (the round's settings and release id; the exact statistics --
clients, participants, update norms, clipped share, local loss -- in ``private_diagnostics``,
labelled NOT PRIVATE, written in research mode and in release mode only on request; schema in
docs/formats.md) and ``model/`` (the adapter or full model with its tokenizer and
``metrics.json``: ``popri eval accuracy --model OUT/model`` reads it).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from popri.core import io, log, outdir
from popri.core.artifacts import path_digest
from popri.core.errors import InputError
from popri.data.records import text_records
from popri.eval.local import (  # noqa: F401  (the client's side, re-exported)
    build_model,
    cap_texts,
    client_rng,
    encode_client,
    local_update,
    prepare_tokenizer,
)
from popri.federated.aggregation import public_count
from popri.federated.flower import engine as E
from popri.federated.participation import Participation, sample_clients
from popri.federated.updates import (  # noqa: F401  (the update maths, re-exported)
    add_noise,
    clip,
    flat,
    set_flat,
    trainable,
    tree_noise,
)
from popri.kit import round_seed
from popri.models import llm
from popri.privacy import ddg as D
from popri.privacy.entries import round_release
from popri.privacy.ledger import LEDGER_NAME, leaf_message, leaf_releases, make_release_id
from popri.privacy.noise import SecureRandom
from popri.privacy.relations import round_relation
from popri.privacy.release import NOT_PRIVATE, Release
from popri.specs.fl import FLSpec

THETA = "theta.npy"
SERVER = "server.npz"
ROUND = "round.json"
MODEL = "model"
LEDGER_STAGE = "fl"


# --------------------------------------------------------------------------- data
def client_texts(data: str, split: str = "train") -> tuple[list[str], dict[str, list[str]], str]:
    """(sorted client ids, client -> texts, source) of a federated dataset directory / JSONL."""
    recs, src = text_records(data, split, require_client=True)
    by: dict[str, list[str]] = {}
    for r in recs:
        by.setdefault(str(r["client_id"]), []).append(r["text"])
    if not by:
        raise InputError("no records", path=src)
    if not any(t.strip() for ts in by.values() for t in ts):
        raise InputError("every text is empty: the clients have nothing to train on (and a "
                         "round would spend privacy budget on it)", path=src, field="text")
    return sorted(by), by, src


# The model as a vector, the clip and the noise: popri/federated/updates.py; a client's local
# update: popri/eval/local.py (both re-exported above).


# --------------------------------------------------------------------------- DP-FTRL epochs
FTRL_STATE = "ftrl-state.npz"


@dataclass(frozen=True)
class Epoch:
    """A DP-FTRL round's place in its epoch's tree (``--restart epoch``; :func:`_ftrl_epoch`)."""

    leaves: int           # R: the tree's rounds
    index: int            # e: the epoch
    leaf: int             # r: this round's leaf, 1..R
    order: np.ndarray     # the epoch's client order (``assignment: bins``: each client's leaf)
    tree_id: str          # the tree's release id (one ledger entry per tree)
    state: dict | None    # release mode: the tree's secret noise state from round t - 1


def epoch_schedule(n: int, L: int, round_: int) -> tuple[int, int, int]:
    """(leaves R, epoch e, leaf r) of round t under epoch-wise participation in blocks: an
    epoch is R = floor(N / L) rounds of L distinct clients each (the N - R L left over sit the
    epoch out), one tree per epoch (Kairouz et al. 2021, arXiv:2103.00039, appendix D,
    TreeRestart); e 0-based, r 1-based."""
    return epoch_position(max(1, n // max(1, L)), round_)


def epoch_position(R: int, round_: int) -> tuple[int, int, int]:
    """(R, epoch e, leaf r) of round t in epochs of R rounds (e 0-based, r 1-based)."""
    e, r = divmod(int(round_) - 1, int(R))
    return int(R), e, r + 1


def epoch_leaves(spec: FLSpec, n: int, L: int | None) -> int:
    """R, the rounds of one DP-FTRL epoch: ``--epoch-rounds`` (bins: public) or floor(N / L)
    (blocks)."""
    if spec.assignment == "bins":
        return int(spec.epoch_rounds or 1)
    return max(1, n // max(1, L or n))


def epoch_bins(n: int, R: int, seed: int, epoch: int, secure: bool) -> np.ndarray:
    """``assignment: bins``: the epoch's leaf (0 .. R-1) of every client, each an independent
    uniform draw (balls into bins), seeded by (seed, epoch) in research mode, from the OS CSPRNG
    in release mode (drawn at the epoch's first round, then kept in the secret state).  A client
    added to the data gets its own draw and moves no other client: the tree's guarantee holds
    under add/remove one client (Chua et al., "Balls-and-Bins Sampling for DP-SGD",
    arXiv:2412.16802, use the same assignment for DP-SGD)."""
    if secure:
        return np.asarray(SecureRandom().choice(int(R), int(n)), dtype=np.int64)
    return np.random.default_rng([int(seed), int(epoch), 0x42494E53]).integers(0, R, n)


def epoch_order(n: int, seed: int, epoch: int, secure: bool) -> np.ndarray:
    """The epoch's client order: a uniform permutation, seeded by (seed, epoch) in research
    mode, from the OS CSPRNG in release mode (drawn at the epoch's first round, then kept in
    the round directory's secret state)."""
    if secure:
        return np.asarray(SecureRandom().permutation(n), dtype=np.int64)
    return np.random.default_rng([int(seed), int(epoch), 0x45504F43]).permutation(n)


def load_ftrl_state(init: str | None) -> dict | None:
    """The secret state (epoch order, tree id, tree nodes) a release-mode DP-FTRL round left in
    its directory, for the next round of the same epoch."""
    if init is None:
        return None
    f = Path(init) / FTRL_STATE
    if not f.is_file():
        raise InputError(f"has no {FTRL_STATE} (the secret state of a release-mode DP-FTRL "
                         "epoch); the next round of an epoch continues from its previous round",
                         path=init)
    try:
        with np.load(f, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as e:
        raise InputError(f"unreadable DP-FTRL state: {e}", path=str(f)) from None


# --------------------------------------------------------------------------- Flower
def _flower_sum(members: list[str], texts_of: dict, theta: np.ndarray, spec: FLSpec, *,
                base: str, seed: int, round_: int, z: float, release: bool, where: Path,
                sensitivity: float | None = None):
    """The round's noisy sum on Flower's simulation runtime with SecAgg+
    (:mod:`popri.federated.flower.engine`): participant i's texts go to virtual SuperNode
    i mod N (``node-K.jsonl``), every node gets theta, trains its clients, uploads the sum of
    their clipped updates plus its noise share; the survivors' sum is decoded here.  The texts
    sit in a private job directory removed on every exit path (:func:`engine.job_dir`)."""
    E.require_flower()
    L = len(members)
    nodes = E.node_count(spec.supernodes, L, release)
    groups = E.assign(L, nodes)
    sized, per_node = E.planned_sizes(spec, L, nodes, float(spec.clip), release=release)
    plan, ddg_plan = E.plans(mode="fl", L=L, nodes=nodes, per_node=per_node,
                             dim=int(theta.size), z=z,
                             sensitivity=float(spec.clip if sensitivity is None else sensitivity),
                             spec=spec, release=release,
                             rotation_seed=E.rotation_seed(seed, round_, release), clients=sized,
                             unit=float(spec.clip))
    with E.job_dir(where) as job:
        for k, g in enumerate(groups):
            rows = [{"client_id": members[i], "text": t} for i in g for t in texts_of[members[i]]]
            with io.atomic_write(job / f"node-{k}.jsonl") as fh:
                fh.write("".join(json.dumps(r) + "\n" for r in rows))
        np.save(job / "theta.npy", np.ascontiguousarray(theta, dtype=np.float32))
        settings = {
            "mode": "fl", "payload": "theta.npy", "fl": spec.to_dict(), "base": str(base),
            "deployed": False, "seed": int(seed), "round": int(round_),
            "release": bool(release), "secagg": plan.to_dict(),
            "ddg": ddg_plan.to_dict() if ddg_plan else None,
            "workers": int(os.environ.get("POPRI_THREADS") or os.cpu_count() or 1),
            "timeout": float(spec.flower_timeout)}
        io.write_json(settings, job / "settings.json")
        return E.execute(job, spec, plan=plan, ddg_plan=ddg_plan, L=L, z=z, deployed=False)


# --------------------------------------------------------------------------- one round
#: the files a round directory written before the ownership marker always holds
ROUND_FILES = (THETA, SERVER, ROUND)
def load_init(init: str, round_: int, spec: FLSpec) -> tuple[dict, np.ndarray, np.ndarray]:
    """(round.json, theta, server velocity) of round t-1's directory ``init``, checked: a
    broken or foreign directory is one :class:`InputError` naming the file."""
    ip = Path(init)
    for f in ROUND_FILES:
        if not (ip / f).is_file():
            raise InputError(f"not a 'popri fl round' output (no {f})", path=init)
    prev = io.read_json(ip / ROUND, expect=dict)
    if prev.get("round") != round_ - 1:
        raise InputError(f"holds round {prev.get('round')}, expected {round_ - 1}",
                         path=init, field="round")
    pspec = prev.get("spec")
    if not isinstance(pspec, dict) or not isinstance(prev.get("model"), str):
        raise InputError("has no 'spec' object or 'model' name", path=str(ip / ROUND))
    for k in ("algorithm", "lora", "lora_r", "lora_alpha"):
        if pspec.get(k) != getattr(spec, k):
            raise InputError(f"was made with {k}={pspec.get(k)!r}, this round has "
                             f"{getattr(spec, k)!r}", path=init, field=k)
    theta = io.load_npy(ip / THETA).astype(np.float32)
    try:
        with np.load(ip / SERVER, allow_pickle=False) as z:
            vel = np.asarray(z["velocity"], dtype=np.float32)
    except (OSError, ValueError, KeyError, EOFError) as e:
        raise InputError(f"not a server state (velocity): {e}", path=str(ip / SERVER)) from None
    if theta.ndim != 1 or not np.isfinite(theta).all():
        raise InputError("is not a finite vector", path=str(ip / THETA))
    if not np.isfinite(vel).all():
        raise InputError("velocity is not finite", path=str(ip / SERVER))
    return prev, theta, vel


def tree_release_id(data: str, split: str, spec: FLSpec, z: float, L: int, seed: int,
                    base: str, epoch: int) -> str:
    """Research mode: the release id every round of epoch ``epoch``'s tree records (the tree is
    one release): a function of the data, the settings, the seed and the epoch, never of the
    round."""
    return make_release_id(LEDGER_STAGE, "research", seed, "ftrl-tree", int(epoch),
                           path_digest(data), split, spec.to_dict(), float(z), int(L),
                           str(base), secure=False)


def _ftrl_epoch(data, split, spec, z, n, clients_per_round, round_, prev, init, seed, release,
                base):
    """The :class:`Epoch` of a DP-FTRL round with a tree per epoch, checked against round t-1's
    directory."""
    L = clients_per_round or n
    R, e, r = epoch_position(epoch_leaves(spec, n, clients_per_round), round_)
    draw = epoch_order
    if spec.assignment == "bins":
        def draw(n_, seed_, e_, secure_):
            return epoch_bins(n_, R, seed_, e_, secure_)
    state = None
    if r > 1:  # inside an epoch: round t-1 must be this epoch's previous leaf
        info = (prev or {}).get("ftrl") or {}
        if (info.get("leaves"), info.get("epoch"), info.get("leaf")) != (R, e, r - 1):
            raise InputError(f"round {round_} is leaf {r} of epoch {e} ({R} rounds"
                             + (f" of {L} clients" if spec.assignment == "blocks" else "")
                             + f"); --init holds {info or 'no DP-FTRL epoch'}: continue "
                             "from that epoch's previous round with the same data and "
                             "settings", path=init, field="init")
        tree_id = str(info.get("tree_release_id"))
        if release:
            state = load_ftrl_state(init)
            order = np.asarray(state.pop("order"), dtype=np.int64)
            if str(state.pop("tree_id")) != tree_id or order.size != n:
                raise InputError("the DP-FTRL state does not belong to this epoch or data",
                                 path=init, field="init")
        else:
            order = draw(n, seed, e, False)
    else:
        order = draw(n, seed, e, release)
        if release:
            tree_id = make_release_id(LEDGER_STAGE, "release", None, "ftrl-tree", secure=True)
        else:
            tree_id = tree_release_id(data, split, spec, z, L, seed, base, e)
    return Epoch(R, e, r, order, tree_id, state)


def _tree_ledgers(out: str, init: str | None) -> list[Path]:
    """The ledgers a DP-FTRL round of an epoch tree records its leaf in: ``OUT/../ledger.jsonl``
    and, when it is another file, ``INIT/../ledger.jsonl`` -- the tree's ledger, where the
    previous leaves were recorded.  Every release of a leaf from one ``--init`` thus meets the
    others in that ledger, wherever its ``--out`` is."""
    out_l = Path(out).parent / LEDGER_NAME
    found = [out_l]
    if init is not None:
        init_l = Path(init).parent / LEDGER_NAME
        if os.path.realpath(init_l) != os.path.realpath(out_l):
            found.append(init_l)
    return found


def _leaf_release_id(data, split, round_, spec, z, clients_per_round, sample_rate, init, base,
                     seed) -> str:
    """Research mode: the release id :func:`run_round` records for this round (its
    ``rel.release_id(...)``, the same parts): a rerun with equal inputs reproduces the round
    bit for bit, the same release."""
    return make_release_id(LEDGER_STAGE, "research", round_seed(seed, round_), path_digest(data),
                           split, round_, spec.to_dict(), float(z), clients_per_round,
                           sample_rate, init and path_digest(Path(init) / THETA), base)


def _refuse_released_leaf(epoch: Epoch, ledgers: list[Path], leaf_id: str | None, out: str) -> None:
    """Before any noise is drawn: an :class:`InputError` if leaf r of the epoch's tree is
    recorded in ``ledgers`` by another release (release mode: by any; research mode: by one
    whose id is not ``leaf_id``, i.e. not this very round reproduced).  A leaf released twice
    with fresh noise would let the noises average out while the ledger counted the tree once
    (Kairouz et al. 2021, arXiv:2103.00039: each node's noise is drawn once)."""
    r, tree_id = epoch.leaf, epoch.tree_id
    done = leaf_releases(ledgers, tree_id, r)
    other = sorted(k for k in done if k != leaf_id)
    if other:
        raise InputError(leaf_message(r, tree_id, done[other[0]]), path=str(out),
                         field="--out")


@dataclass
class _Start:
    """What a round starts from: the clients' texts, the model it trains and theta_{t-1}."""

    clients: list[str]
    by: dict[str, list[str]]
    src: str
    base: str
    prev: dict | None
    theta: np.ndarray | None  # None in round 1 (theta_0 comes from the seed)
    vel: np.ndarray | None
    epoch: Epoch | None
    ledgers: list[Path]  # OUT/../ledger.jsonl, and the tree's ledger next to --init (epochs)


def _start(data: str, out: str, spec: FLSpec, *, round_: int, z: float, model: str,
           init: str | None, clients_per_round: int | None, sample_rate: float | None,
           seed: int, release: bool, split: str) -> _Start:
    """The round's inputs read and checked before any model is built: the clients, the weights
    of round t-1 (``init``), DP-FTRL's epoch and the refusal of a leaf released already."""
    outdir.check(out, inputs=[data, init, model if Path(model).exists() else None],
                 legacy=ROUND_FILES)
    if round_ > 1 and init is None:
        raise InputError("round > 1 needs --init, the previous round's directory", field="init")
    clients, by, src = client_texts(data, split)
    n = len(clients)
    if clients_per_round is not None and clients_per_round > n:
        raise InputError(f"{clients_per_round} clients per round, but {src} has {n} clients",
                         field="clients_per_round")
    base, prev, theta, vel = model, None, None, None
    if init is not None:
        prev, theta, vel = load_init(init, round_, spec)
        base = prev["model"]
    if clients_per_round is None:  # no fixed L: refuse before any work if no N_pub is declared
        public_count("poisson" if sample_rate is not None and sample_rate < 1 else "none",
                     sample_rate=sample_rate or 1.0, clients_per_round=None,
                     public_clients=spec.public_clients, what=_what(spec))
    epoch, ledgers = None, [Path(out).parent / LEDGER_NAME]
    if spec.epoch_trees:
        epoch = _ftrl_epoch(data, split, spec, z, n, clients_per_round, round_, prev, init, seed,
                            release, base)
        done = Path(out) / ROUND
        if release and done.is_file():  # this leaf was released already: once is all
            info = io.read_json(done, expect=dict).get("ftrl") or {}
            if info.get("tree_release_id") == epoch.tree_id and info.get("leaf") == epoch.leaf:
                raise InputError(f"holds leaf {epoch.leaf} of this DP-FTRL tree, released "
                                 "already; releasing it again with fresh noise would let the "
                                 "two noises average out", path=str(out), field="--out")
        # ... into any directory: the ledgers of the tree (next to --out and to --init) record
        # every leaf released; checked again under their lock when the entry is appended
        ledgers = _tree_ledgers(out, init)
        _refuse_released_leaf(epoch, ledgers, None if release else _leaf_release_id(
            data, split, round_, spec, z, clients_per_round, sample_rate, init, base, seed), out)
    return _Start(clients, by, src, base, prev, theta, vel, epoch, ledgers)


def _what(spec: FLSpec) -> str:
    return f"DP-{spec.algorithm}'s noisy sum of the updates"


def _participants(epoch: Epoch | None, spec: FLSpec, n: int, rel, *,
                  clients_per_round: int | None, sample_rate: float | None) -> Participation:
    """This round's clients: leaf r's bin or the epoch's r-th block of L (DP-FTRL epochs), else
    a sample (``sampling`` stream: L of N, Poisson at q, or all)."""
    if epoch is not None and spec.assignment == "bins":  # the clients drawn to leaf r
        return Participation(np.flatnonzero(epoch.order == epoch.leaf - 1), n, "bins",
                             1.0 / epoch.leaves)
    if epoch is not None:  # the epoch's r-th block of L clients: each once per epoch
        L = clients_per_round or n
        r = epoch.leaf
        return Participation(np.sort(epoch.order[(r - 1) * L: r * L]), n,
                             "fixed" if L < n else "none", L / n)
    return sample_clients(n, rel.rng("sampling"), sample_rate=sample_rate,
                          clients_per_round=clients_per_round)


def _who(part: Participation, n: int, release: bool, epoch: Epoch | None) -> str:
    """The log's words for the participants (release mode: no count that is private)."""
    if not release:
        return f"{len(part.members)} of {n} clients ({part.sampling})"
    return {"poisson": f"a Poisson sample at q={part.sample_rate:g}",
            "fixed": f"{len(part.members)} clients per round",
            "bins": f"the clients drawn to leaf {epoch.leaf if epoch else '?'}",
            "none": "every client"}[part.sampling] + " (counts private in release mode)"


def _local_sum(m, tok, params, theta: np.ndarray, members: list[str], texts_of: dict,
               spec: FLSpec, *, rseed: int, round_: int, pad: int, device: str,
               release: bool) -> tuple[np.ndarray, list[float], list[float]]:
    """The in-process sum of the members' clipped updates (one client's update in memory at a
    time), with their norms and local losses (exact statistics: private)."""
    total = np.zeros(theta.size, dtype=np.float64)
    norms, losses = [], []
    with log.progress() as prog:
        task = prog.add_task(f"round {round_}, clients", total=None if release else len(members))
        for cid in members:
            d, st = local_update(m, params, theta, encode_client(tok, texts_of[cid], spec), spec,
                                 client_rng(rseed, round_, cid), pad, device)
            d, nrm = clip(d, spec.clip)
            total += d
            norms.append(nrm)
            if st["loss"] is not None:
                losses.append(st["loss"])
            prog.advance(task)
    return total, norms, losses


def _summary(spec: FLSpec, part: Participation, *, round_: int, base: str, dim: int,
             z: float, z_eff: float, relation: str, sens: float, mu: float, denom: float,
             mode: str, rid: str, src: str, flower, epoch: Epoch | None,
             release: bool) -> dict:
    """``round.json`` without its private diagnostics: settings, public counts, release id."""
    summary = {
        "round": round_, "model": str(base), "base_model": llm.recorded_name(base),
        "spec": spec.to_dict(), "algorithm": f"dp-{spec.algorithm}",
        "sampling": part.sampling, "dim": int(dim),
        "noise_multiplier": float(z), "noise_multiplier_guaranteed": z_eff,
        "noise_std": float(z) * sens, "neighbouring": relation,
        "sensitivity": sens, "momentum": mu,
        # public: a fixed L or q times the declared --public-clients (public_count)
        "divisor": denom, "public_clients": spec.public_clients,
        "server_lr": spec.server_lr_value(),
        "mode": mode, "release_id": rid, "source": src, "engine": spec.engine,
    }
    # q: the Poisson rate (a setting), 1, or L/N for a fixed L -- where the ledger's epsilon
    # depends on it, so N is public by the accounting (use Poisson sampling when N itself must
    # stay private)
    summary["sample_rate"] = float(part.sample_rate)
    if part.sampling == "fixed":
        summary["clients_per_round"] = int(len(part.members))
    if flower is not None:
        summary["flower"] = {"supernodes_requested": spec.supernodes,
                             "secagg_mechanism": spec.secagg_mechanism}
    if epoch is not None:
        summary["ftrl"] = {"restart": "epoch", "assignment": spec.assignment,
                           "leaves": epoch.leaves, "epoch": epoch.index,
                           "leaf": epoch.leaf, "tree_release_id": epoch.tree_id,
                           **({"state": f"{FTRL_STATE} (secret: the tree's noise and the "
                              "epoch's client order; never publish it)"} if release else {})}
    return summary


def _private(seed: int, n: int, part: Participation, norms: list[float], losses: list[float],
             spec: FLSpec, flower) -> dict:
    """The round's exact statistics (NOT PRIVATE: ``private_diagnostics``)."""
    every = np.asarray(norms, dtype=np.float64)
    arr = every[np.isfinite(every)]  # a diverged client's update (not finite) counted apart
    return {
        "private": False, "note": NOT_PRIVATE, "seed": seed,
        "clients": n, "participants": int(len(part.members)),
        "update_norm_mean": float(arr.mean()) if arr.size else None,
        "update_norm_max": float(arr.max()) if arr.size else None,
        "clipped_share": float((arr > spec.clip).mean()) if arr.size else None,
        "diverged": int((~np.isfinite(every)).sum()),
        "local_loss": float(np.mean(losses)) if losses else None,
        **({"flower": {"supernodes": flower.nodes, "survivors": flower.survivors,
                       "quantisation_bound": flower.quantisation_bound,
                       "round_seconds": round(flower.round_seconds, 2),
                       "engine": flower.params()}}
           if flower is not None else {}),
    }


def _how(private: dict, flower, release: bool, diagnostics: bool) -> str:
    """The round's closing log line's statistics (none in release mode without diagnostics)."""
    if release and not diagnostics:
        return "release mode: counts, update norms and losses stay private"
    if flower is not None:
        return (f"{private['participants']} clients, Flower SecAgg+ over {flower.nodes} "
                f"SuperNodes, {flower.survivors} survived (update norms stay on the nodes)")
    loss, norm = private["local_loss"], private["update_norm_mean"]
    return (f"{private['participants']} clients, mean update norm "
            f"{norm if norm is not None else float('nan'):.4g} (clipped "
            f"{(private['clipped_share'] or 0) * 100:.0f}%), local loss "
            f"{loss if loss is not None else float('nan'):.4f}"
            + (f"; {private['diverged']} diverged (not finite: zeros in the sum)"
               if private.get("diverged") else ""))


def run_round(data: str, out: str, spec: FLSpec, *, round_: int, noise_multiplier: float,
              model: str = "smollm2-135m", init: str | None = None,
              clients_per_round: int | None = None, sample_rate: float | None = None,
              delta: float = 3e-6, seed: int = 0, release: bool = False, split: str = "train",
              device: str | None = None, diagnostics: bool = False) -> dict:
    """One DP round (module docstring): reads ``init`` (the previous round's directory; None in
    round 1: theta_0 from ``seed``), writes ``out`` and one ledger entry in
    ``OUT/../ledger.jsonl``.  ``seed`` is the run's seed: the LoRA initialisation, the tree's
    keyed noise (resumable from seed and round) and -- with the round -- the sampling, the
    clients' data order and the Gaussian noise.  Release mode writes no exact statistic of the
    clients' data (counts, norms, losses, the seed) unless ``diagnostics`` (labelled NOT
    PRIVATE)."""
    t0 = time.perf_counter()
    z = float(noise_multiplier)
    s = _start(data, out, spec, round_=round_, z=z, model=model, init=init,
               clients_per_round=clients_per_round, sample_rate=sample_rate, seed=seed,
               release=release, split=split)
    device = device or llm.default_device()
    out_p, epoch, n = Path(out), s.epoch, len(s.clients)
    m, tok, params = build_model(s.base, spec, seed, device)
    theta = flat(params) if init is None else s.theta
    vel = np.zeros_like(theta) if init is None else s.vel
    if theta.shape != vel.shape or theta.size != sum(p.numel() for p in params):
        raise InputError("the saved weights do not fit the model", path=init)
    pad = prepare_tokenizer(tok, spec)
    rseed = round_seed(seed, round_)
    with Release(LEDGER_STAGE, rseed, secure=release, ledgers=s.ledgers) as rel:
        rel.check_ledgers()
        part = _participants(epoch, spec, n, rel, clients_per_round=clients_per_round,
                             sample_rate=sample_rate)
        # the relation this round is accounted under and the sum's sensitivity under it: noise
        # std z * sens (fixed L of N: replace one client, 2C); an epoch tree's is its assignment's
        relation, sens = round_relation(spec.sensitivity, part.sampling if part.sampling in (
            "none", "poisson", "fixed") else "none", spec.convention)
        if epoch is not None:
            relation, sens = spec.tree_relation, spec.sensitivity
        log.info(f"fl round {round_}: {_who(part, n, release, epoch)}, {spec.algorithm}, "
                 f"{theta.size:,} numbers per update, clip {spec.clip:g}, z "
                 f"{noise_multiplier:g}, engine {spec.engine}")
        members = [s.clients[k] for k in part.members]
        texts_of = {cid: cap_texts(s.by[cid], spec, client_rng(rseed, round_, cid))
                    for cid in members}
        flower, tree, norms, losses = None, None, [], []
        if spec.flower:
            flower = _flower_sum(members, texts_of, theta, spec, base=s.base, seed=seed,
                                 round_=round_, z=z, release=release, where=out_p.parent,
                                 sensitivity=sens)
            noisy, z_eff = flower.total, flower.noise_multiplier
            for note in flower.notes:
                log.warn(f"fl: {note}")
        else:
            total, norms, losses = _local_sum(m, tok, params, theta, members, texts_of, spec,
                                              rseed=rseed, round_=round_, pad=pad,
                                              device=device, release=release)
            if epoch is not None:
                noisy, z_eff, tree = tree_noise(total, spec, z, round_, epoch.leaves, rel, seed,
                                                state=epoch.state)
            else:
                noisy, z_eff = add_noise(total, spec, z, round_, rel, seed, sensitivity=sens)
        # the mean's divisor: a PUBLIC count (a fixed L, or q times the declared N), never the
        # realised or total client count (aggregation.public_count)
        denom = public_count(part.sampling, sample_rate=part.sample_rate,
                             clients_per_round=clients_per_round if epoch is None
                             or spec.assignment != "bins" else None,
                             public_clients=spec.public_clients, what=_what(spec))
        mu = spec.momentum_value()
        vel = (mu * vel.astype(np.float64) + noisy / denom).astype(np.float32)
        theta = (theta.astype(np.float64) + spec.server_lr_value() * vel).astype(np.float32)
        rid = rel.release_id(path_digest(data), split, round_, spec.to_dict(), z,
                             clients_per_round, sample_rate,
                             init and path_digest(Path(init) / THETA), s.base)
        entry = round_entry(spec, part, z_eff=float(z_eff), delta=delta, rid=rid,
                            mode=rel.mode, round_=round_, dim=int(theta.size), flower=flower,
                            release=release, epoch=epoch, relation=relation, sensitivity=sens)
        rel.outputs = outdir.DirOutput(out_p, kind="fl-round", legacy=ROUND_FILES)
        tmp = rel.outputs.tmp
        np.save(tmp / THETA, theta)
        np.savez(tmp / SERVER, velocity=vel)
        if epoch is not None and release and tree is not None:
            # the epoch's secret state for its next round: the client order, the tree's id and
            # the noise nodes still needed (never publish it: it is the noise)
            f = tmp / FTRL_STATE
            np.savez(f, order=epoch.order, tree_id=np.asarray(epoch.tree_id), **tree.state())
            os.chmod(f, 0o600)
        set_flat(params, theta)
        m.save_pretrained(tmp / MODEL)
        tok.save_pretrained(tmp / MODEL)
        summary = _summary(spec, part, round_=round_, base=s.base, dim=int(theta.size), z=z,
                           z_eff=z_eff, relation=relation, sens=sens, mu=mu, denom=denom,
                           mode=rel.mode, rid=rid, src=s.src, flower=flower, epoch=epoch,
                           release=release)
        private = _private(seed, n, part, norms, losses, spec, flower)
        if not release or diagnostics:
            summary["private_diagnostics"] = private
        (tmp / ROUND).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        meta = {"model": str(s.base), "base_model": summary["base_model"], "lora": spec.lora,
                "trainable_parameters": int(theta.size), "bos_token": tok.bos_token,
                "eos_token": tok.eos_token, "fl_round": round_, "algorithm": spec.algorithm}
        (tmp / MODEL / "metrics.json").write_text(json.dumps(meta, indent=2) + "\n",
                                                  encoding="utf-8")
        rel.commit([entry])
    seconds = round(time.perf_counter() - t0, 2)
    log.info(f"fl round {round_}: {_how(private, flower, release, diagnostics)}, "
             f"{seconds:.1f}s -> {out}")
    return {**summary, "seconds": seconds}


def round_entry(spec: FLSpec, part, *, z_eff: float, delta: float, rid: str, mode: str,
                round_: int, dim: int, flower=None, release: bool = False,
                epoch: Epoch | None = None,
                relation: str = "add/remove one client", sensitivity: float | None = None):
    """The round's ledger entry: ``subsampled_gaussian`` (``gaussian`` at q = 1) for fedavg,
    ``tree_aggregation`` for ftrl -- with epoch trees one entry per TREE: every round of an
    epoch records it under the tree's release id, so the ledger counts the tree once (R leaves,
    each client in one of them, q = 1); with per-round restarts one tree of one leaf --,
    ``distributed_discrete_gaussian`` on Flower with the DDG.  Release mode records no exact
    client count in it."""
    info = {"round": round_, "algorithm": f"dp-{spec.algorithm}", "dim": int(dim)}
    common = dict(noise_multiplier=float(z_eff), delta=delta,
                  sensitivity=float(spec.clip if sensitivity is None else sensitivity),
                  mode=mode, tree=spec.algorithm == "ftrl", neighbouring=relation)
    if epoch is not None:
        # leaf and leaf_release_id (this round's own id): which leaf of the tree this line
        # released, so that no ledger lets a leaf be released twice (LedgerEntry.leaf)
        return round_release(spec, LEDGER_STAGE, sample_rate=1.0, sampling="none",
                             release_id=epoch.tree_id, leaves=epoch.leaves,
                             params={**info, "tree": epoch.index, "restart": "epoch",
                                     "assignment": spec.assignment, "leaf": int(epoch.leaf),
                                     "leaf_release_id": rid}, **common)
    ddg = None
    if flower is not None:
        if not release:
            info["engine"] = flower.params()
        if spec.mechanism(tree=common["tree"]) == "distributed_discrete_gaussian":
            ddg = D.ledger_params(D.DDGPlan.from_dict(flower.ddg), flower.survivors,
                                  release=release)
    return round_release(spec, LEDGER_STAGE, sample_rate=float(part.sample_rate),
                         sampling=part.sampling, release_id=rid, ddg=ddg, params=info, **common)
