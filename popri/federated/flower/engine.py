"""``popri score --engine flower``: one feedback round on Flower, with SecAgg+, on one machine.

    popri score --engine flower --supernodes 8 --mode cosine --private runs/priv.npy \\
        --synthetic runs/syn.npy -z 1.05 --clients-per-round 40 --seed 0 --out runs/scores.npy
    python -m pytest -q tests/test_flower.py

The in-process path (:mod:`popri.feedback.release`) computes the round's noisy sum in one
process.  This engine computes the same sum the way a deployment does: the round's participants
(sampled and capped exactly as in-process, so that at z = 0 both give the same sum) are spread
over N virtual SuperNodes (``--supernodes``; participant i goes to node i mod N); each node
computes its clients' vectors and its noise share (:mod:`popri.apps.flower.node`); Flower's
SecAgg+ sums the uploads of the nodes that survive; the server decodes and the caller finishes
with the same aggregation code and writes the same SCORES.npy, sidecar and ledger entry.

The job directory (:func:`job_dir`: ``.popri-flower-PID-XXXX/`` next to the output, mode
0700) holds ``settings.json`` (the mode, the SecAgg+ plan of :mod:`popri.federated.secagg`, the
discrete Gaussian plan of :mod:`popri.privacy.ddg`), ``syn.npy``, one ``node-K.npy`` embedding
set (or ``node-K.jsonl`` texts, ``popri fl round``) per node -- the clients' private data --,
``flower.log`` and the ServerApp's ``result.json`` / ``result.npy``.  It is removed on every exit
path (success, error, timeout, SIGTERM / SIGHUP / Ctrl-C); a failed round keeps only its
``flower.log``, moved next to the output as ``.popri-flower-PID.log`` and named in the error; a
SIGKILLed round's directory is removed by the next round run there (:func:`sweep_jobs`).
``POPRI_FLOWER_KEEP=1`` keeps it (debugging, research data only).  The simulation runs in a child process group
(:mod:`popri.federated.flower.simulate`, Ray backend) that is killed on timeout or interrupt.

Noise mechanisms (``--secagg-mechanism``):

- ``ddg`` (default): the distributed discrete Gaussian (Kairouz, Liu, Steinke, "The Distributed
  Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation", ICML 2021,
  arXiv:2102.06387): integer uploads, exact modular sum, its own accounting
  (mechanism ``distributed_discrete_gaussian`` in the ledger).
- ``gaussian``: Flower's stock float path: each node adds N(0, (zC)^2/n_min) and SecAgg+
  quantises; the ledger records a Gaussian of the survivors' noise, and notes that the
  quantisation and modular wrap are not part of the proof.  Research mode only.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from popri.core import io, log
from popri.core.errors import InputError, PopriError
from popri.federated import secagg
from popri.federated.flower import deploy
from popri.privacy import ddg

DEFAULT_SUPERNODES = 10
KEEP_ENV = "POPRI_FLOWER_KEEP"
HEARTBEAT = 30.0


class FlowerError(PopriError):
    """The Flower round did not complete (exit 1); the message names the log to read."""


@dataclass
class FlowerRound:
    total: np.ndarray            # the decoded secure sum, float64 [n]
    nodes: int
    survivors: int
    plan: secagg.SecAggPlan
    ddg: dict | None
    seconds: float               # wall time of the Flower run (start-up included)
    round_seconds: float         # the ServerApp's workflow alone
    quantisation_bound: float    # per-coordinate bound on |total - exact noisy sum|
    noise_multiplier: float      # the guarantee the survivors' noise gives (ledger)
    notes: list[str] = field(default_factory=list)

    def params(self) -> dict:
        """What the sidecar and the ledger entry record about the engine."""
        return {"engine": "flower", "supernodes": self.nodes, "survivors": self.survivors,
                "secagg": self.plan.to_dict(), "ddg": self.ddg,
                "quantisation_bound": self.quantisation_bound}


def flower_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("flwr") is not None


def require_flower() -> None:
    if not flower_available():
        raise InputError("--engine flower needs Flower: pip install 'popri[flower]' "
                         "(flwr 1.41 with its simulation runtime)", field="--engine")


def node_count(supernodes: int | None, L: int, release: bool) -> int:
    """The virtual SuperNodes of a simulated round: ``--supernodes`` (default 10).  Research
    mode uses no more nodes than participants; release mode always the asked number, so that
    neither the node count nor the plan it sizes follows the private participant count (a node
    without clients uploads its noise share alone)."""
    S = int(supernodes or DEFAULT_SUPERNODES)
    return S if release else min(S, L)


def rotation_seed(seed: int, round_: int, release: bool) -> int:
    """The public seed of the DDG rotation's signs: from the run's seed and the round in
    research mode (reproducible), from the OS in release mode (it protects nothing, but a fixed
    rotation would let an adversary pick inputs that it does not flatten)."""
    if release:
        import secrets

        return secrets.randbits(31)
    return (int(seed) * 1000 + int(round_)) & 0x7FFFFFFF


def assign(L: int, nodes: int) -> list[np.ndarray]:
    """Participant indices of each node: participant i goes to node i mod ``nodes``."""
    return [np.arange(k, L, nodes) for k in range(nodes)]


def plan_ddg(mode: str, z: float, sensitivity: float, dim: int, clients: int, n_min: int,
             uploaders: int | None = None, rotation_seed: int = 0, release: bool = False,
             sens_factor: float = 1.0):
    """The discrete Gaussian plan of a round (:func:`popri.privacy.ddg.plan_round`): the
    modulus sized by the ``uploaders`` (the SuperNodes; Flower's constraint), the noise scaled
    to the ROUNDED sensitivity so the ledger's noise multiplier is the z asked for (``popri
    run`` calibrates z with this mechanism's accounting), the grid fine enough that the noise
    on the sum is within 5% of z * C (the randomized Hadamard rotation where the modulus needs
    it), or a ValueError naming what to change.  ``release``: a grid that does not follow the
    private participant count (:func:`~popri.privacy.ddg.plan_round`'s ``fixed_grid``).
    ``sensitivity``: one client's bound (C, or M votes); ``sens_factor``: the sum's sensitivity
    under the round's relation over it (2 under replace one client, sqrt 2 for votes)."""
    return ddg.plan_round(clip=sensitivity, noise_multiplier=z, dim=dim, clients=clients,
                          uploaders=uploaders or clients, min_noisy=n_min,
                          integer_inputs=(mode == "nn-histogram"),
                          rotation_seed=rotation_seed, fixed_grid=release,
                          sens_factor=sens_factor)


def public_participants(spec, *, deployed: bool) -> int:
    """Release mode: a PUBLIC upper bound on a round's participants, which sizes the secure
    aggregation plan (the realised count is private under add/remove one client): every
    SuperNode of a deployment, ``--clients-per-round`` L, else ``--public-clients`` N (the
    enrolled clients, declared public); an InputError when none is given."""
    if deployed:
        return int(spec.supernodes)
    for k in ("clients_per_round", "public_clients"):
        v = getattr(spec, k, None)
        if v is not None:
            return int(v)
    raise InputError("release mode sizes the secure aggregation plan from a PUBLIC upper bound "
                     "on the participants (their count is private): give --public-clients N, "
                     "the enrolled clients you declare public (or --clients-per-round L)",
                     field="--public-clients")


def planned_sizes(spec, L: int, nodes: int, unit: float, *, release: bool,
                  deployed: bool = False) -> tuple[int, list[float]]:
    """(the participants a round's plan is sized for, each node's upload bound before noise):
    the realised ones in research mode (participant i on node i mod ``nodes``, ``unit`` = C or
    M each); in release mode the public bound B of :func:`public_participants` and
    ceil(B / nodes) participants on every node, so that nothing the plan decides (modulus,
    grid, value bound, whether it fits) or prints follows the private count.  More
    participants than B: an InputError that does not print the count."""
    if not release:
        return max(int(L), 1), [len(g) * float(unit) for g in assign(L, nodes)]
    B = public_participants(spec, deployed=deployed)
    if L > B:
        raise InputError(f"more clients took part than the public bound {B} the plan is sized "
                         "for (their count is private in release mode): raise --public-clients",
                         field="--public-clients")
    return B, [math.ceil(B / nodes) * float(unit)] * nodes


def plans(*, mode: str, L: int, nodes: int, per_node: list[float], dim: int, z: float,
          sensitivity: float, spec, release: bool, rotation_seed: int = 0,
          clients: int | None = None, unit: float | None = None):
    """(SecAgg+ plan, discrete Gaussian plan or None) of a round whose ``nodes`` SuperNodes
    hold ``L`` participants and upload at most ``per_node[k]`` (L2 / votes) before noise; the
    DDG plan is sized for ``clients`` participants (:func:`planned_sizes`: the public bound in
    release mode; default ``L``).  ``sensitivity``: the sum's L2 sensitivity under the round's
    relation; ``unit`` (default: the same): one client's bound (C, or M votes), which the DDG
    clips and rounds to while its noise is scaled to ``sensitivity``
    (:attr:`popri.privacy.ddg.DDGPlan.sens_factor`)."""
    if nodes < 3:
        # release mode: the realised participant count is private; say only that it fell short
        has = ("fewer than 3 participating clients (the count is private in release mode)"
               if release else f"{L} participating clients")
        raise InputError(f"--engine flower: secure aggregation needs at least 3 SuperNodes "
                         f"(this round has {has}"
                         + (f", --supernodes {spec.supernodes}" if spec.supernodes else "")
                         + ")", field="--supernodes")
    mech = spec.secagg_mechanism
    if release and mech != "ddg":
        raise InputError("release mode needs --secagg-mechanism ddg: Flower's float path "
                         "quantises with numpy's global (non-cryptographic) generator",
                         field="--secagg-mechanism")
    bound = float(max(per_node))
    ddg_plan = None
    try:
        if mech == "ddg":
            n_min = secagg.min_survivors(nodes, spec.max_dropout)
            u = float(sensitivity if unit is None else unit)
            ddg_plan = plan_ddg(mode, z, u, dim,
                                max(int(clients if clients is not None else L), 1), n_min,
                                uploaders=nodes, rotation_seed=rotation_seed,
                                release=release, sens_factor=float(sensitivity) / u)
            plan = secagg.plan(nodes=nodes, max_dropout=spec.max_dropout, dim=dim,
                               value_bound=bound, mechanism="ddg", ddg_bits=ddg_plan.bits)
        else:
            plan = secagg.plan(nodes=nodes, max_dropout=spec.max_dropout, dim=dim,
                               value_bound=bound, noise_std=z * float(sensitivity))
    except ValueError as e:
        raise InputError(f"--engine flower: {e}", field="--supernodes") from None
    return plan, ddg_plan


def execute(job: Path, spec, *, plan, ddg_plan, L: int, z: float, deployed: bool
            ) -> FlowerRound:
    """Run the job directory's round (simulation, or the deployment ``spec.federation``) and
    decode the survivors' sum: the common tail of every Flower round."""
    nodes, mech = plan.nodes, spec.secagg_mechanism
    if deployed:
        seconds = submit(job, spec)
    else:
        seconds = simulate(job, timeout=float(spec.flower_timeout))
    res = io.read_json(job / "result.json", expect=dict)
    if not res.get("complete"):
        raise FlowerError(f"the Flower round did not complete: SecAgg+ halted (it needs "
                          f"{plan.threshold} of {plan.num_shares} shares per node, so at most "
                          f"{plan.num_shares - plan.threshold} dropouts per neighbourhood; "
                          f"plan for more with --max-dropout): see {job / 'flower.log'}")
    survivors = int(res["survivors"])
    mean = np.load(job / "result.npy")
    notes = []
    if mech == "ddg":
        ints = np.rint(mean * survivors).astype(np.int64)
        total = ddg.decode(ints, ddg_plan)
        # each client's rounding moves a coordinate by less than gamma; rotated back, one
        # coordinate moves by at most the error vector's norm (sqrt(D) gamma per client)
        qbound = L * ddg_plan.gamma * (math.sqrt(ddg_plan.noise_dim) if ddg_plan.rotated
                                       else 1.0)
        z_ok = ddg.effective_noise_multiplier(ddg_plan, survivors)
    else:
        total = mean * survivors
        qbound = plan.error_bound
        z_ok = secagg.guaranteed_multiplier(z, survivors, plan)
        notes.append("Flower's float SecAgg+ path: the stochastic quantisation and the modular "
                     "sum are not part of the Gaussian guarantee recorded here (use "
                     "--secagg-mechanism ddg for a formal one)")
    if survivors < nodes:
        notes.append(f"{nodes - survivors} of {nodes} SuperNodes dropped out: their clients' "
                     f"contributions are missing from the sum; the noise of the {survivors} "
                     f"survivors gives noise multiplier {z_ok:.4g} (planned {z:g} for at least "
                     f"{plan.min_survivors})")
    return FlowerRound(np.asarray(total, dtype=np.float64), nodes, survivors, plan,
                       ddg_plan.to_dict() if ddg_plan else None, seconds,
                       float(res.get("seconds") or 0.0), float(qbound), float(z_ok), notes)


JOB_PREFIX = ".popri-flower-"


def sweep_jobs(where: Path) -> None:
    """Remove the job directories of dead processes in ``where`` (a SIGKILLed round: they hold
    the clients' private data)."""
    if not where.is_dir():
        return
    for d in where.glob(f"{JOB_PREFIX}*"):
        pid = d.name[len(JOB_PREFIX):].split("-", 1)[0]
        if not d.is_dir() or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            _remove_dead_job(d)
        except (PermissionError, OverflowError):
            pass


#: how long a sweep keeps removing a dead process's job directory while the orphaned
#: simulation's watchdog (popri.federated.flower.simulate: 0.5 s polls, then the whole group
#: killed) may still write into it
SWEEP_SECONDS = 10.0


def _remove_dead_job(d: Path) -> None:
    """Remove ``d`` until it is gone: a SIGKILLed popri's simulation group runs on for up to
    its watchdog's poll and may create files while one removal walks the tree (which then
    leaves the directory behind)."""
    deadline = time.monotonic() + SWEEP_SECONDS
    while True:
        shutil.rmtree(d, ignore_errors=True)
        if not os.path.lexists(d) or time.monotonic() > deadline:
            return
        time.sleep(0.1)


@contextlib.contextmanager
def job_dir(where: Path) -> Iterator[Path]:
    """A private job directory for one Flower round in ``where`` (module docstring): created
    0700 after the stale ones of dead processes are swept (and swept again when the round
    ends), removed on every exit path; on an
    error its ``flower.log`` moves to ``where/.popri-flower-PID.log``."""
    where = Path(where)
    where.mkdir(parents=True, exist_ok=True)
    sweep_jobs(where)
    job = Path(tempfile.mkdtemp(prefix=f"{JOB_PREFIX}{os.getpid()}-", dir=where))
    try:
        yield job
    except FlowerError as e:
        logf = job / "flower.log"
        if logf.is_file() and os.environ.get(KEEP_ENV) != "1":
            kept = where / f"{JOB_PREFIX}{os.getpid()}.log"
            os.replace(logf, kept)
            raise FlowerError(str(e).replace(str(logf), str(kept))) from None
        raise
    finally:
        if os.environ.get(KEEP_ENV) != "1":
            shutil.rmtree(job, ignore_errors=True)
        # and once more after the round: a SIGKILLed popri's orphaned simulation group, ended
        # by its watchdog's poll (slower on loaded cores), can recreate its job directory after
        # the sweep above removed it (tests/test_flower_staging.py saw one left in CI, twice)
        sweep_jobs(where)


def run_round(*, mode: str, emb, codes, clients: list[str], part, keep, syn: np.ndarray,
              spec, noise_multiplier: float, sensitivity: float, seed: int, round_: int,
              job: Path, meta: dict | None = None, release: bool = False) -> FlowerRound:
    """Run the round's secure sum on Flower's simulation runtime; see the module docstring."""
    require_flower()
    deployed = spec.federation is not None
    L, n = len(part.members), len(syn)
    # a deployment: every SuperNode takes part, one client each (their data stay there)
    nodes = L if deployed else node_count(spec.supernodes, L, release)
    groups = assign(L, nodes)
    unit = spec.max_samples_per_client if mode == "nn-histogram" else float(spec.clip)
    sized, per_node = planned_sizes(spec, L, nodes, unit, release=release, deployed=deployed)
    z = float(noise_multiplier)
    plan, ddg_plan = plans(mode=mode, L=L, nodes=nodes, per_node=per_node, dim=n, z=z,
                           sensitivity=sensitivity, spec=spec, release=release,
                           rotation_seed=rotation_seed(seed, round_, release), clients=sized,
                           unit=unit)

    # ---- the job directory
    job.mkdir(mode=0o700, parents=True, exist_ok=True)  # normally job_dir's, already there
    if not deployed:  # simulation: the engine hands each virtual node its clients' rows
        members = np.asarray(part.members)
        mrows = keep if keep is not None else np.ones(len(codes), dtype=bool)
        for k, g in enumerate(groups):
            sel = np.flatnonzero(np.isin(codes, members[g]) & mrows)
            rows = [{"id": f"r{int(i)}", "client_id": clients[int(codes[i])]} for i in sel]
            x = np.asarray(emb[sel], dtype=np.float32) if len(sel) else \
                np.zeros((0, syn.shape[1]), np.float32)
            io.save_embedding_set(job / f"node-{k}.npy", x, rows, meta=dict(meta or {}))
    np.save(job / "syn.npy", np.ascontiguousarray(syn, dtype=np.float32))
    settings = {
        "mode": mode, "clip": float(spec.clip) if mode == "cosine" else None,
        "standardize": bool(spec.standardize) if mode == "cosine" else None,
        # simulation: the engine already applied the round's cap (as in-process); a deployed
        # node caps its own rows at M (nn-histogram)
        "node_cap": int(spec.max_samples_per_client) if deployed and mode == "nn-histogram"
        else None,
        "deployed": deployed, "model": (meta or {}).get("model"),
        "seed": int(seed), "round": int(round_), "release": bool(release),
        "secagg": plan.to_dict(), "ddg": ddg_plan.to_dict() if ddg_plan else None,
        "workers": int(os.environ.get("POPRI_THREADS") or os.cpu_count() or 1),
        "timeout": float(spec.flower_timeout),
    }
    io.write_json(settings, job / "settings.json")
    return execute(job, spec, plan=plan, ddg_plan=ddg_plan, L=L, z=z, deployed=deployed)


def submit(job: Path, spec) -> float:
    """Run the round on the deployment named ``spec.federation`` (``$FLWR_HOME/config.toml``):
    a thin Flower app (:func:`popri.federated.flower.deploy.app_dir`) submitted with ``flwr run``
    and awaited (:func:`~popri.federated.flower.deploy.submit`).  The ServerApp runs on the
    SuperLink host and reads / writes ``job``: run popri there, or share the directory at the
    same path (docs/flower.md).  Returns the wall time."""
    app = deploy.app_dir(job / "app", config={"job": ""})
    t0 = time.perf_counter()
    try:
        res = deploy.submit(app, {"job": str(job.resolve())}, connection=spec.federation,
                            flwr_home=os.environ.get("FLWR_HOME"),
                            timeout=float(spec.flower_timeout), work_dir=job / "flwr")
    except deploy.DeployError as e:
        raise FlowerError(f"the Flower deployment run failed: {e}") from None
    if not res.ok or not (job / "result.json").is_file():
        raise FlowerError(f"the Flower run {res.run_id} on {spec.federation!r} ended "
                          f"{res.status!r}: see {job / 'flwr' / 'logs'}")
    return time.perf_counter() - t0


def simulate(job: Path, *, timeout: float) -> float:
    """Run :mod:`popri.federated.flower.simulate` on ``job`` in a new process group; its output
    goes to ``job/flower.log`` (a heartbeat on stderr); the group is killed on timeout or
    interrupt.  Returns the wall time."""
    logf = job / "flower.log"
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
               PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    with open(logf, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "popri.federated.flower.simulate",
                                 str(job)], stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            last = t0
            while True:
                try:
                    rc = proc.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    now = time.perf_counter()
                    if now - t0 > timeout:
                        raise FlowerError(f"the Flower round ran past {timeout:g} s "
                                          f"(--flower-timeout): see {logf}") from None
                    if now - last >= HEARTBEAT:
                        log.info(f"score: Flower round running, {now - t0:.0f} s")
                        last = now
        finally:
            kill_group(proc)
    took = time.perf_counter() - t0
    if rc != 0 or not (job / "result.json").is_file():
        tail = logf.read_text(errors="replace").strip().splitlines()[-5:]
        raise FlowerError(f"the Flower simulation exited {rc}: see {logf}"
                          + ("; last lines: " + " | ".join(tail) if tail else ""))
    return took


def kill_group(proc: subprocess.Popen) -> None:
    """End ``proc``'s process group: SIGTERM, then SIGKILL after 5 s."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if pgid is not None:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=wait)
            if pgid is None:
                return
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; anything left in the group still gets the next signal
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
