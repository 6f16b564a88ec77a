"""The audit's two worlds D and D' = D + one canary, replayed through the library's own
release code with seeded research-mode noise, per mechanism (cosine, nn-histogram, FreD, the
distributed discrete Gaussian, the DP-FTRL tree, the subsampled and fixed-size rounds); the
deliberately broken variants (``--break``) as the library's own parameters (popri/apps/audit/
__init__.py's docstring says what each replays and why).

    popri audit release --mechanism tree -z 1 --trials 2000
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from popri.apps.flower import node
from popri.federated import aggregation, participation
from popri.feedback import cosine, histogram
from popri.feedback.release import public_denominator
from popri.federated.updates import tree_noise
from popri.methods.fred import stats as fred
from popri.privacy import ddg
from popri.privacy.noise import make_rng
from popri.privacy.relations import round_relation
from popri.privacy.tree import leaf_nodes
from popri.specs.fl import FLSpec
from popri.specs.privacy import AUDIT_BREAKS as BREAKS  # noqa: F401  (re-exported)
from popri.specs.privacy import AUDIT_CLIENTS as DEFAULT_CLIENTS
from popri.specs.privacy import AUDIT_MECHANISMS as MECHANISMS  # noqa: F401  (re-exported)

CANARY_FACTOR = 10  # the canary brings this many times the sensitivity before clip / cap
FAR = 50.0  # nn-histogram: distance of the canary's synthetic sample (others ~ N(0, I_d))


# --------------------------------------------------------------------------- noise sources
def trial_seeds(seed: int, world: int, trials: int) -> np.ndarray:
    """One research-mode seed per trial of world 0 (D) or 1 (D'), derived from ``seed``."""
    return np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 0xA0D17, world]).generate_state(
        trials, dtype=np.uint32)


class TrialNoise:
    """A noise source for one library call that runs every trial: ``standard_normal(shape)``
    returns [trials, *shape], row t drawn from ``make_rng(seeds[t], stream=stream)`` (the stream
    a release seeded with seeds[t] uses)."""

    def __init__(self, seeds: np.ndarray, stream: str):
        self.seeds, self.stream = [int(s) for s in seeds], stream

    def standard_normal(self, size=None, dtype=np.float64) -> np.ndarray:
        return np.stack([make_rng(s, stream=self.stream).standard_normal(size, dtype=dtype)
                         for s in self.seeds])


class ZeroNoise:
    """A noise source that draws zeros: the mechanism's expected output (the attacker's mu)."""

    def standard_normal(self, size=None, dtype=np.float64):
        return np.zeros(size if size is not None else (), dtype=dtype)

    def random(self, size=None):
        return np.zeros(size if size is not None else (), dtype=np.float64)


# --------------------------------------------------------------------------- broken mechanisms
#: the cosine round's ``clip_to`` under ``no-clip``: its coefficients divide by the clip, so
#: the largest finite float, not inf (no score vector comes near it)
FLOAT_MAX = float(np.finfo(np.float64).max)


def clip_to(brk: str | None, unbounded: float = math.inf) -> float | None:
    """``no-clip``: the norm the library's clipping is run at (``unbounded``: nothing is
    clipped; the noise keeps the claimed clip's scale), passed as the mechanism's ``clip_to``;
    None (the mechanism's own clip) otherwise.  ``half-noise`` changes the multiplier passed to
    the mechanism instead (:func:`run_z`)."""
    return unbounded if brk == "no-clip" else None


def run_z(z: float, brk: str | None) -> float:
    """The noise multiplier the mechanism is run with (``half-noise``: z / 2; the claim stays z)."""
    return z / 2.0 if brk == "half-noise" else z


# --------------------------------------------------------------------------- the worlds
@dataclass
class Setup:
    mechanism: str
    z: float  # the claimed noise multiplier
    trials: int
    seed: int = 0
    clients: int | None = None
    synthetic: int = 100
    dim: int = 16
    clip: float = 1.0
    max_samples_per_client: int | None = None
    relation: str = "replace-one"  # fred
    level: str = "sample"  # fred
    brk: str | None = None
    dataset: str = "random"  # or "adversarial": every other record mirrors the canary
    sample_rate: float = 0.1  # subsampled
    clients_per_round: int = 10  # fixed
    convention: str | None = None  # fixed: "papers" replays popri <= 0.3's noise and claim
    leaves: int = 8  # tree
    nodes: int = 4  # ddg
    notes: list = field(default_factory=list)

    @property
    def n_clients(self) -> int:
        return int(self.clients or DEFAULT_CLIENTS[self.mechanism])


def _projection(out0: np.ndarray, out1: np.ndarray, mu0: np.ndarray, mu1: np.ndarray):
    """Each trial's <out - mu0, u>, u = (mu1 - mu0) / |mu1 - mu0|, for both worlds."""
    diff = np.asarray(mu1, dtype=np.float64) - np.asarray(mu0, dtype=np.float64)
    norm = float(np.linalg.norm(diff))
    if not norm > 0:
        raise RuntimeError("the canary does not change the mechanism's expected output")
    u = diff / norm
    s0 = (np.asarray(out0, dtype=np.float64) - mu0) @ u
    s1 = (np.asarray(out1, dtype=np.float64) - mu0) @ u
    return s0, s1, norm


def _stacked(out, trials: int, n: int) -> np.ndarray:
    out = np.asarray(out)
    if out.shape != (trials, n):  # the library's noise step no longer broadcasts over trials
        raise RuntimeError(f"expected [{trials}, {n}] outputs from one call, got {out.shape}")
    return out


def _base_rows(rng, n_clients: int, dim: int, max_rows: int):
    counts = rng.integers(1, max_rows + 1, n_clients)
    emb = rng.standard_normal((int(counts.sum()), dim))
    ids = [f"client-{k:05d}" for k, c in enumerate(counts) for _ in range(int(c))]
    return emb, ids


def _score_worlds(s: Setup):
    """cosine / nn-histogram: (stat0, stat1, canary description)."""
    rng = make_rng(s.seed, stream="audit-data")
    n, d, cos = s.synthetic, s.dim, s.mechanism == "cosine"
    M = s.max_samples_per_client if cos else (s.max_samples_per_client or 8)
    syn = rng.standard_normal((n, d))
    emb, ids = _base_rows(rng, s.n_clients, d, M or 4)
    if cos:
        target, k = 0, (M or 1)
        what = (f"1 client, {k} embedding(s) = synthetic sample 0: standardised score vector of "
                f"norm sqrt(n) = {math.sqrt(n):.4g} before the clip C = {s.clip:g}")
    else:
        target, k = n - 1, CANARY_FACTOR * M
        syn[target] = 0.0
        syn[target, 0] = FAR
        what = (f"1 client, {k} samples (= {CANARY_FACTOR} M) all nearest to synthetic sample "
                f"{target}, placed at distance {FAR:g} from the origin (others ~ N(0, I))")
    canary = np.repeat(syn[target:target + 1], k, axis=0)
    if s.dataset == "adversarial":  # cosine: every client scores the opposite way; histogram:
        emb[:] = -syn[target] if cos else syn[target]  # every client votes with the canary
    worlds = [(emb.astype(np.float32), ids),
              (np.concatenate([emb, canary]).astype(np.float32), ids + ["canary"] * k)]

    def release(world, z, noise):
        e, who = worlds[world]
        codes, clients = participation.factorize(who)
        sample = participation.sample_clients(len(clients), make_rng(s.seed, stream="sampling"))
        # no-clip: the histogram's per-client cap off (every vote kept)
        keep = (participation.cap_per_client(codes, M, make_rng(s.seed, stream="cap"))
                if cos or s.brk != "no-clip" else None)
        if cos:
            total = cosine.cosine_round(e, codes, sample, syn, noise_multiplier=z, clip=s.clip,
                                        standardize=True, noise_rng=noise, keep=keep,
                                        clip_to=clip_to(s.brk, FLOAT_MAX))
            # the release's own rule: only a public count divides (score_release)
            reduce, denom = public_denominator("cosine", sample.sampling, sample.sample_rate,
                                               len(sample.members), None)
            return aggregation.finish(total, reduce=reduce, denominator=denom or 1.0, threshold=None)
        total = histogram.histogram_round(e, codes, sample, syn, noise_multiplier=z,
                                          max_per_client=M, keep=keep, noise_rng=noise)
        return aggregation.finish(total, reduce="sum", denominator=1.0, threshold=0.0)

    z = run_z(s.z, s.brk)
    mu0, mu1 = (np.asarray(release(w, 0.0, ZeroNoise()), dtype=np.float64) for w in (0, 1))
    outs = [_stacked(release(w, z, TrialNoise(trial_seeds(s.seed, w, s.trials), "noise")),
                     s.trials, n) for w in (0, 1)]
    if not cos and s.dataset == "random" and mu0[target] != 0:
        raise RuntimeError("a base client voted for the canary's synthetic sample")
    s0, s1, shift = _projection(outs[0], outs[1], mu0, mu1)
    return s0, s1, what, shift


def _fred_worlds(s: Setup):
    rng = make_rng(s.seed, stream="audit-data")
    user = s.level == "user"
    design = fred.Design(s.relation, s.level, s.clip, s.max_samples_per_client if user else None)
    m, d = design.m, s.dim
    emb, keys = _base_rows(rng, s.n_clients, d, m if user else 1)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)  # popri's embeddings are L2-normalised
    if s.dataset == "adversarial":  # every other record opposite the canary
        emb[:] = 0.0
        emb[:, 0] = -1.0
    k = CANARY_FACTOR * m if user else 1
    row = np.zeros((k, d))
    row[:, 0] = CANARY_FACTOR * s.clip
    if s.relation == "replace-one":
        worlds = [(np.concatenate([emb, -row]), keys + ["canary"] * k),
                  (np.concatenate([emb, row]), keys + ["canary"] * k)]
    else:
        worlds = [(emb, keys), (np.concatenate([emb, row]), keys + ["canary"] * k)]
    what = (f"1 {'client, ' + str(k) + ' samples' if user else 'sample'} at norm "
            f"{CANARY_FACTOR} c = {CANARY_FACTOR * s.clip:g} along e_1"
            + ("; D holds it at -e_1" if s.relation == "replace-one" else "; D lacks it"))

    def expected(world, z):
        e, who = worlds[world]
        codes, _ = participation.factorize(who)
        keep = (participation.cap_per_client(codes, m, make_rng(s.seed, stream="fred-cap"))
                if user else None)
        clients = [np.asarray(e[g], dtype=np.float64) for g in fred.group_clients(codes, keep)]
        return fred.private_stats(clients, design, z, ZeroNoise(), clip_to=clip_to(s.brk)).sum1

    z = run_z(s.z, s.brk)
    mu0, mu1 = expected(0, z), expected(1, z)
    outs = [np.stack([fred.release(worlds[w][0], worlds[w][1], design, z, seed=int(t),
                                   clip_to=clip_to(s.brk)).sum1
                      for t in trial_seeds(s.seed, w, s.trials)]) for w in (0, 1)]
    s0, s1, shift = _projection(outs[0], outs[1], mu0, mu1)
    return s0, s1, what, shift


def _cosine_vectors(s: Setup, rng):
    """The synthetic samples, the base clients' embeddings and ids, and the canary client (its
    embeddings = synthetic sample 0: a standardised score vector of norm sqrt(n) before the
    clip) -- the cosine data of the ddg and subsampled audits."""
    n, d = s.synthetic, s.dim
    syn = rng.standard_normal((n, d))
    emb, ids = _base_rows(rng, s.n_clients, d, 4) if s.n_clients else (np.zeros((0, d)), [])
    canary = np.repeat(syn[:1], 1, axis=0)
    return syn, emb, ids, canary


def _client_vectors(emb, ids, syn, clip: float):
    """Every client's clipped, standardised cosine vector, as a Flower node computes it
    (:func:`popri.apps.flower.node.client_vectors`)."""
    return node.client_vectors({"mode": "cosine", "clip": clip, "standardize": True}, syn,
                               np.asarray(emb, dtype=np.float32), list(ids), None)


def _ddg_worlds(s: Setup):
    """The distributed discrete Gaussian of a cosine round on ``s.nodes`` SuperNodes, replayed
    through the nodes' own encoding (:func:`popri.apps.flower.node.upload`: clip, round on
    the plan's grid, one noise share per node, centred residues mod m) and the server's decode
    (sum mod m, :func:`popri.privacy.ddg.decode`).  The canary is one more client (on node 0)."""
    rng = make_rng(s.seed, stream="audit-data")
    syn, emb, ids, canary = _cosine_vectors(s, rng)
    n, C = s.synthetic, s.clip
    # the round's real plan (no dropouts: every node's share is in the sum)
    plan = ddg.plan_round(clip=C, noise_multiplier=s.z, dim=n, clients=s.n_clients + 1,
                          uploaders=s.nodes, min_noisy=s.nodes)
    s.notes.append(plan)  # the claim is this plan's (audit() reads it)
    run = plan
    if s.brk == "half-noise":
        from dataclasses import replace

        run = replace(plan, local_sigma=plan.local_sigma / 2.0)
    clip_run = C * CANARY_FACTOR * 10 if s.brk == "no-clip" else C
    if s.brk == "no-clip":  # the clients do not clip: the plan's grid, an unbounded norm
        from dataclasses import replace

        run = replace(plan, clip=clip_run,
                      delta2=ddg.rounded_l2_bound(clip_run / plan.gamma, plan.beta, plan.dim))
    settings = {"mode": "cosine", "clip": clip_run, "standardize": True,
                "secagg": {"mechanism": "ddg"}, "ddg": run.to_dict()}
    worlds = [(emb, ids), (np.concatenate([emb, canary]), ids + ["canary"])]

    def node_rows(world, k):
        e, who = worlds[world]
        clients = sorted(set(who))
        mine = {c for j, c in enumerate(clients) if j % s.nodes == k}
        sel = [i for i, c in enumerate(who) if c in mine]
        return np.asarray(e[sel], dtype=np.float32), [who[i] for i in sel]

    parts = [[node_rows(w, k) for k in range(s.nodes)] for w in (0, 1)]

    def release(world, trial_seed):
        g = make_rng(int(trial_seed), stream="noise")
        total = np.zeros(run.noise_dim)
        for e, who in parts[world]:
            total += node.upload(settings, syn, e, who, g)
        return ddg.decode(np.rint(total), run)

    mu = [np.sum(_client_vectors(*worlds[w], syn, clip_run), axis=0) if worlds[w][1]
          else np.zeros(n) for w in (0, 1)]
    outs = [np.stack([release(w, t) for t in trial_seeds(s.seed, w, s.trials)])
            for w in (0, 1)]
    s0, s1, shift = _projection(outs[0], outs[1], mu[0], mu[1])
    what = (f"1 more client (embeddings = synthetic sample 0: a score vector of norm sqrt(n) = "
            f"{math.sqrt(n):.4g} before the clip C = {C:g}) on {s.nodes} SuperNodes, "
            f"{'rotated' if plan.rotated else 'unrotated'} grid gamma = {plan.gamma:.3g}")
    return s0, s1, what, shift


def _tree_worlds(s: Setup):
    """A DP-FTRL tree of ``s.leaves`` rounds (:func:`popri.federated.updates.tree_noise`, the
    rounds' own noise): every noisy prefix sum P_1..P_R released.  The canary's clipped update
    (norm C along e_1) is in leaf 1 -- the leaf in the most nodes -- (``two-leaves``: also in
    leaf 2, which epoch-wise participation forbids).  The attacker reads every used node off
    the prefixes (node (l, i) = P_(i+1)2^l - P_i2^l, one independent noise each) and sums its
    projections on the canary's shift (the likelihood-ratio test)."""
    rng = make_rng(s.seed, stream="audit-data")
    R, d, C = int(s.leaves), s.dim, s.clip
    base = rng.standard_normal((R, d))  # the other clients' (clipped) round sums
    v = np.zeros(d)
    v[0] = C * (CANARY_FACTOR if s.brk == "no-clip" else 1.0)
    leaves_in = [0, 1] if s.brk == "two-leaves" and R > 1 else [0]
    spec = FLSpec(algorithm="ftrl", clip=C)
    z = run_z(s.z, s.brk)

    class _Rel:  # research mode: the release's seeded streams (no ledger: nothing is released)
        secure = False

    def prefixes(world, seed):
        out, acc = [], np.zeros(d)
        for t in range(1, R + 1):
            leaf = base[t - 1] + (v if world == 1 and t - 1 in leaves_in else 0.0)
            noisy, _, _ = tree_noise(leaf, spec, z, t, R, _Rel(), int(seed))
            acc = acc + noisy
            out.append(acc.copy())
        return np.stack(out)

    used = sorted({nd for leaf in range(1, R + 1) for nd in leaf_nodes(leaf, R)})

    def nodes_of(P):
        cols = []
        for lv, i in used:
            hi = (i + 1) * 2 ** lv
            lo = i * 2 ** lv
            cols.append(P[hi - 1] - (P[lo - 1] if lo > 0 else 0.0))
        return np.concatenate(cols)

    exp = [nodes_of(np.cumsum(base + np.stack([(v if w == 1 and r in leaves_in else 0 * v)
                                                 for r in range(R)]), axis=0)) for w in (0, 1)]
    outs = [np.stack([nodes_of(prefixes(w, t)) for t in trial_seeds(s.seed, w, s.trials)])
            for w in (0, 1)]
    s0, s1, shift = _projection(outs[0], outs[1], exp[0], exp[1])
    what = (f"1 client's clipped update (norm {C * (CANARY_FACTOR if s.brk == 'no-clip' else 1):g}"
            f" along e_1) in leaf {' and '.join(str(x + 1) for x in leaves_in)} of a tree of "
            f"{R} leaves; all {R} prefix sums released ({len(used)} nodes)")
    return s0, s1, what, shift


def _subsampled_worlds(s: Setup):
    """A cosine round on a Poisson sample at rate q (the library's :func:`~popri.federated.
    participation.sample_clients`, one sample per trial from that trial's sampling stream),
    the noisy sum released (:func:`popri.feedback.cosine.cosine_round`).  The canary joins the
    round with probability q in D'; ``public-sample`` makes it always join (a sample the
    adversary can recompute) while the claim keeps q."""
    rng = make_rng(s.seed, stream="audit-data")
    syn, emb, ids, canary = _cosine_vectors(s, rng)
    n, C, q = s.synthetic, s.clip, float(s.sample_rate)
    worlds = [(emb, ids), (np.concatenate([emb, canary]), ids + ["canary"])]
    z = run_z(s.z, s.brk)

    def release(world, seed):
        e, who = worlds[world]
        codes, clients = participation.factorize(who)
        part = participation.sample_clients(len(clients), make_rng(int(seed), stream="sampling"),
                                            sample_rate=q)
        if s.brk == "public-sample" and world == 1:
            k = clients.index("canary")
            if k not in set(part.members.tolist()):
                part = participation.Participation(np.sort(np.append(part.members, k)),
                                                   part.total, part.sampling, q)
        return cosine.cosine_round(np.asarray(e, dtype=np.float32), codes, part, syn,
                                   noise_multiplier=z, clip=C, standardize=True,
                                   noise_rng=make_rng(int(seed), stream="noise"),
                                   clip_to=clip_to(s.brk, FLOAT_MAX))

    # the attacker's shift: the canary's own clipped vector (what its participation adds)
    u = _client_vectors(canary, ["canary"], syn, C)[0]
    base = np.zeros(n)
    outs = [np.stack([np.asarray(release(w, t), dtype=np.float64).reshape(-1)
                      for t in trial_seeds(s.seed, w, s.trials)]) for w in (0, 1)]
    # the base clients' expected contribution under sampling: q * their sum
    if ids:
        base = q * np.sum(_client_vectors(emb, ids, syn, C), axis=0)
    s0, s1, shift = _projection(outs[0], outs[1], base, base + u)
    what = (f"1 more client (embeddings = synthetic sample 0, clipped to C = {C:g}) joining a "
            f"Poisson sample at q = {q:g}" + ("; ALWAYS joins (public-sample)"
                                              if s.brk == "public-sample" else ""))
    return s0, s1, what, shift


def fixed_round(s: Setup) -> tuple[str, float]:
    """The relation and the sum's sensitivity a cosine round on L of N clients is recorded with
    (the stage's own rule, :func:`popri.privacy.relations.round_relation`)."""
    return round_relation(float(s.clip), "fixed", s.convention)


def _fixed_worlds(s: Setup):
    """The displacement pair of fixed-size sampling (issue 36): D holds N clients whose
    embeddings equal synthetic sample 0 (each one's clipped vector is +u, |u| = C); D' adds a
    canary whose embedding is its opposite (-u).  Each trial draws L of the world's clients with
    the library's sampler (:func:`~popri.federated.participation.sample_clients`, without
    replacement) and releases the noisy cosine sum (:func:`popri.feedback.cosine.cosine_round`)
    with the noise the stage adds for that sampling (z times the sum's sensitivity under its
    relation, :func:`fixed_round`).  In D' the canary is sampled w.p. L / (N + 1) and then
    displaces one of the +u clients: the sum moves by 2C, not C."""
    rng = make_rng(s.seed, stream="audit-data")
    n, d, C, L, N = s.synthetic, s.dim, float(s.clip), int(s.clients_per_round), s.n_clients
    syn = rng.standard_normal((n, d))
    base = np.repeat(syn[:1], N, axis=0)
    ids = [f"client-{k:05d}" for k in range(N)]
    worlds = [(base, ids), (np.concatenate([base, -syn[:1]]), ids + ["canary"])]
    _, sens = fixed_round(s)
    z = run_z(s.z, s.brk)

    def release(world, seed):
        e, who = worlds[world]
        codes, clients = participation.factorize(who)
        part = participation.sample_clients(len(clients), make_rng(int(seed), stream="sampling"),
                                            clients_per_round=L)
        return cosine.cosine_round(np.asarray(e, dtype=np.float32), codes, part, syn,
                                   noise_multiplier=z, clip=C, standardize=True,
                                   noise_rng=make_rng(int(seed), stream="noise"),
                                   sensitivity=sens, clip_to=clip_to(s.brk, FLOAT_MAX))

    u = _client_vectors(syn[:1], ["x"], syn, C)[0]
    outs = [np.stack([np.asarray(release(w, t), dtype=np.float64).reshape(-1)
                      for t in trial_seeds(s.seed, w, s.trials)]) for w in (0, 1)]
    s0, s1, shift = _projection(outs[0], outs[1], L * u, (L - 2) * u)
    what = (f"1 more client at -C among {N} at +C (C = {C:g}), {L} sampled without replacement "
            f"per round: sampled (w.p. {L}/{N + 1}) it displaces one, moving the sum by 2C"
            + ("; replayed as popri <= 0.3 (--convention papers)" if s.convention else ""))
    return s0, s1, what, shift


def worlds(s: Setup):
    """(statistics on D, statistics on D', canary description, |mu_1 - mu_0|)."""
    return {"fred": _fred_worlds, "ddg": _ddg_worlds, "tree": _tree_worlds,
            "subsampled": _subsampled_worlds, "fixed": _fixed_worlds}.get(
        s.mechanism, _score_worlds)(s)
