"""Tree-aggregation noise for DP-FTRL: noisy prefix sums, restarts, resumable from (seed, round).

    python -m pytest -q tests/test_tree.py

    from popri.privacy.tree import TreeNoise, depth, prefix_nodes
    tn = TreeNoise(dim, std=z * clip, leaves_per_tree=1, seed=0)   # DP-FTRL, a restart per round
    noisy_prefix = prefix_sum_of_tree + tn.prefix(round_)           # round_ = 1, 2, ... (1-based)
    # ledger: LedgerEntry(mechanism="tree_aggregation", noise_multiplier=z, params={"leaves": 1})

DP-FTRL (Kairouz, McMahan, Song, Thakkar, Thakurta, Xu, "Practical and Private (Deep) Learning
without Sampling or Shuffling", ICML 2021, arXiv:2103.00039, section 3, Algorithm 1; restarts:
appendix D) releases, at every round t of a tree, the prefix sum of the (clipped) round sums
1..t plus noise from the binary-tree mechanism (Dwork, Naor, Pitassi, Rothblum, "Differential
privacy under continual observation", STOC 2010; Chan, Shi, Song, "Private and continual
release of statistics", ACM TISSEC 2011): every node of a binary tree over the leaves (rounds)
gets an independent N(0, std^2) vector, and the prefix sum up to step s is covered by
popcount(s) nodes (:func:`prefix_nodes`), whose noises add up to the prefix's noise.  A leaf
lies in at most :func:`depth` of the nodes ever used, so one client that contributes (norm <= C)
to one leaf moves the released node vector by <= C sqrt(depth): a tree is the Gaussian mechanism
at multiplier z / sqrt(depth) for node std z C (``tree_aggregation`` in
:mod:`popri.privacy.accounting`).  ``leaves_per_tree`` rounds make a tree; round
``leaves_per_tree + 1`` restarts with a fresh tree (the FTRL state restarts with it).

Node convention: node ``(level, index)`` (both 0-based) is the sum of the ``2**level`` leaves
``index * 2**level + 1 .. (index + 1) * 2**level`` (leaves 1-based).  ``prefix_nodes(s)`` lists,
for each set bit ``level`` of ``s`` from the highest down, the node ``(level, (s >> level) - 1)``:
e.g. ``prefix_nodes(6) == [(2, 0), (1, 2)]`` (leaves 1-4 and 5-6).  Only complete left-child
nodes (even ``index``, all leaves at or before the step) are ever used (:func:`leaf_nodes`).

Seeding.  Research mode (``secure=False``): a node's noise is a pure function of (seed, tree,
level, index) -- a PCG64 stream keyed by ``SeedSequence([seed, tree, level, index,
TREE_STREAM])`` -- so any round's noise can be recomputed from (seed, round) alone, in any
order, after any restart of the process: the tree state is resumable with no saved noise.
Meta's FLSim ``TreePrivacyEngine`` (flsim/privacy/privacy_engine.py, the DP-FTRL of PrE-Text's
baseline, ``SyncFTRLServer``) instead draws every node it sums from torch's global generator at
each ``add_noise`` call (``torch.normal`` without a generator; ``PrivacySetting.noise_seed``
only seeds its Gaussian engine), so a node's noise differs from one round to the next and a run
cannot be resumed (or reproduced) part way.

Release mode (``secure=True``): node noises come from the OS CSPRNG
(:class:`popri.privacy.noise.SecureRandom`) as discrete Gaussians on the power-of-two grid
``grid``: node = grid * N_Z(0, (std/grid)^2) (Canonne, Kamath, Steinke, "The Discrete Gaussian
for Differential Privacy", arXiv:2004.00010; see :mod:`popri.privacy.noise`).  The caller snaps
each round's data sum to the same grid (``np.rint(x / grid) * grid`` with ``grid =
noise.snapped_sensitivity(C, dim)[0]``), so every output lies on the grid, and passes node std
z (C + grid sqrt(dim)) (the snapping inflates the sensitivity to C + grid sqrt(dim):
``noise.snapped_sensitivity(C, dim)[1]``), so the tree keeps multiplier z.  Secure draws cannot be recomputed, so the object holds the nodes later
rounds of the current tree still need (those of :func:`prefix_nodes` of the last step drawn;
any node a later step reuses is among them) and :meth:`TreeNoise.state` /
:meth:`TreeNoise.from_state` save and restore them.  That state is as secret as the clients'
data (it is the noise): keep it with the run's private files and delete it after the run.
Release mode only moves forward: a round before the last one drawn is an error (its nodes are
gone); the last round may be asked again.
"""

from __future__ import annotations

import math

import numpy as np

from popri.privacy.noise import SecureRandom, discrete_gaussian

#: the stream tag in every research-mode node's SeedSequence ("tree" in ASCII): keeps tree noise
#: apart from any other stream popri derives from the same seed
TREE_STREAM = 0x74726565
#: research-mode nodes are generated (and summed) in chunks of this many numbers, so a prefix of
#: a 135M-parameter model needs its output array and one chunk, never a node-sized temporary
CHUNK = 1 << 20
#: state() keys that are metadata (the others are nodes, named node_L{level}_I{index})
META_KEYS = ("version", "dim", "std", "leaves_per_tree", "secure", "grid", "seed", "tree", "step",
             "round")
STATE_VERSION = 1


def _int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo} (got {v!r})")
    return int(v)


def depth(leaves: int) -> int:
    """Most nodes of a tree over ``leaves`` leaves that hold one leaf and are ever used by
    :func:`prefix_nodes` (steps 1..leaves): ``floor(log2(leaves)) + 1`` (1 for one leaf).

    A leaf lies in one node per level, and a node of level l is used only once it is complete,
    i.e. when 2**l <= leaves.  This equals ``ceil(log2(leaves)) + 1`` (the leaf-to-root path of
    the padded tree) when ``leaves`` is a power of two, and is one less otherwise: the root of
    a padded tree over 3 leaves covers leaves 1-4 and is never released.  It is dp-accounting's
    ``ceil(log2(leaves + 1))`` (``_compute_rdp_single_epoch_tree_aggregation``)."""
    return _int("leaves", leaves, 1).bit_length()


def prefix_nodes(step: int) -> list[tuple[int, int]]:
    """The ``(level, index)`` nodes whose sum is the sum of leaves 1..``step``: for each set bit
    ``level`` of ``step`` (highest first), node ``(level, (step >> level) - 1)``, which covers
    leaves ``((step >> level) - 1) * 2**level + 1 .. (step >> level) * 2**level``; popcount(step)
    nodes, left to right.  ``step`` >= 1 (1-based leaves, as in the module docstring)."""
    s = _int("step", step, 1)
    return [(lv, (s >> lv) - 1) for lv in range(s.bit_length() - 1, -1, -1) if (s >> lv) & 1]


def leaf_nodes(leaf: int, leaves: int) -> list[tuple[int, int]]:
    """The nodes holding ``leaf`` that some :func:`prefix_nodes` of a step <= ``leaves`` uses:
    node ``(level, index)`` is used iff it is complete (``(index + 1) * 2**level <= leaves``)
    and a left child (``index`` even: a right child is always absorbed into its parent).  At
    most :func:`depth` (``leaves``) of them; exactly that many for leaf 1."""
    t, n = _int("leaf", leaf, 1), _int("leaves", leaves, 1)
    if t > n:
        raise ValueError(f"leaf must be <= leaves (got leaf {t}, leaves {n})")
    out = []
    for lv in range(n.bit_length()):
        i = (t - 1) >> lv
        if (i + 1) << lv <= n and i % 2 == 0:
            out.append((lv, i))
    return out


def _node_key(level: int, index: int) -> str:
    return f"node_L{level}_I{index}"


class TreeNoise:
    """The cumulative tree noise of one run of rounds, a tree every ``leaves_per_tree`` rounds.

    ``prefix(r)`` (float64, shape ``(dim,)``) is the noise to add to the prefix sum, within round
    ``r``'s tree, of that tree's rounds up to ``r`` (``r`` 1-based over the whole run; tree
    ``(r - 1) // leaves_per_tree``, step ``(r - 1) % leaves_per_tree + 1``); ``increment(r)`` is
    ``prefix(r) - prefix(r - 1)`` within the tree (``prefix(r)`` at a tree's first step), the
    noise to add to round r's own sum when the caller keeps the running sum.  Node std ``std`` =
    z C.  See the module docstring for seeding (research) and the CSPRNG + grid (release)."""

    def __init__(self, dim: int, std: float, leaves_per_tree: int, *, seed: int | None,
                 secure: bool = False, grid: float | None = None):
        self.dim = _int("dim", dim, 1)
        if (isinstance(std, bool) or not isinstance(std, (int, float, np.number))
                or not (0 <= std < math.inf)):
            raise ValueError(f"std must be a finite number >= 0 (got {std!r})")
        self.std = float(std)
        self.leaves_per_tree = _int("leaves_per_tree", leaves_per_tree, 1)
        self.secure = bool(secure)
        if self.secure:
            if grid is None:
                raise ValueError("release mode (secure=True) needs the power-of-two grid the data "
                                 "sum is snapped to (grid=noise.snap_grid(clip, dim))")
            if (isinstance(grid, bool) or not isinstance(grid, (int, float, np.number))
                    or not (0 < grid < math.inf) or math.frexp(float(grid))[0] != 0.5):
                raise ValueError(f"grid must be a power of two > 0 (got {grid!r})")
            self.grid: float | None = float(grid)
            self.seed = None  # the CSPRNG ignores it
        else:
            if grid is not None:
                raise ValueError("grid is for release mode (secure=True) only: research-mode "
                                 "noise is a float Gaussian")
            if seed is None:
                raise ValueError("a seed is required outside release mode (secure=False)")
            self.seed = _int("seed", seed, 0)
            if self.seed >= 2 ** 63:
                raise ValueError(f"seed must be < 2**63 (got {seed})")
            self.grid = None
        self.round = 0                                  # the last round drawn (0: none)
        self._tree = -1                                 # release mode: the tree held
        self._step = 0                                  # release mode: its last step drawn
        self._nodes: dict[tuple[int, int], np.ndarray] = {}   # release: int64 grid units

    # ------------------------------------------------------------------ positions
    def locate(self, round_: int) -> tuple[int, int]:
        """``(tree, step)`` of 1-based ``round_``: tree 0-based, step 1..leaves_per_tree."""
        r = _int("round_", round_, 1)
        return (r - 1) // self.leaves_per_tree, (r - 1) % self.leaves_per_tree + 1

    def node_count(self, round_: int) -> int:
        """Nodes summed into ``prefix(round_)``: popcount of its step in its tree (the prefix
        noise has variance ``node_count * std**2`` per coordinate)."""
        return len(prefix_nodes(self.locate(round_)[1]))

    @property
    def depth(self) -> int:
        """:func:`depth` of one tree (the accounting's sqrt(depth) sensitivity factor)."""
        return depth(self.leaves_per_tree)

    # ------------------------------------------------------------------ nodes
    def _grid(self) -> float:
        """Release mode's grid (a secure tree has one)."""
        if self.grid is None:
            raise ValueError("a secure tree's noise is on a grid: this tree has none")
        return self.grid

    def _rng(self, tree: int, level: int, index: int) -> np.random.Generator:
        if self.seed is None:
            raise ValueError("a seeded tree's node keys need its seed (release mode: none)")
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(
            [self.seed, tree, level, index, TREE_STREAM])))

    def _add_node(self, out: np.ndarray, tree: int, level: int, index: int,
                  sign: float = 1.0) -> None:
        """out += sign * the research-mode noise of a node, in chunks (see CHUNK)."""
        rng = self._rng(tree, level, index)
        buf = np.empty(min(CHUNK, self.dim))
        for a in range(0, self.dim, CHUNK):
            b = min(a + CHUNK, self.dim)
            z = buf[: b - a]
            rng.standard_normal(out=z)
            z *= sign * self.std
            out[a:b] += z

    def node(self, tree: int, level: int, index: int) -> np.ndarray:
        """The noise of one node (float64, ``(dim,)``).  Research mode: computed from (seed,
        tree, level, index).  Release mode: only a node held (of the last step drawn)."""
        t, lv, i = _int("tree", tree, 0), _int("level", level, 0), _int("index", index, 0)
        if not self.secure:
            out = np.zeros(self.dim)
            if self.std > 0:
                self._add_node(out, t, lv, i)
            return out
        if t != self._tree or (lv, i) not in self._nodes:
            raise ValueError(f"release mode: node (tree {t}, level {lv}, index {i}) is not held "
                             "(secure nodes cannot be recomputed; only those of the last step "
                             "drawn are kept)")
        return self._nodes[(lv, i)] * self.grid

    def _draw_units(self, tree: int, level: int, index: int) -> np.ndarray:
        """A fresh secure node in grid units (the position is not used by the draw; it names
        the node, for tests that replace this method with a keyed fake)."""
        out = np.zeros(self.dim, dtype=np.int64)
        if self.std > 0:
            rng = SecureRandom()
            for a in range(0, self.dim, CHUNK):
                b = min(a + CHUNK, self.dim)
                out[a:b] = discrete_gaussian(self.std / self._grid(), b - a, rng)
        return out

    def _secure_units(self, round_: int) -> np.ndarray:
        t, s = self.locate(round_)
        if (t, s) < (self._tree, self._step):
            raise ValueError(f"release mode moves forward only: round {round_} is before the last "
                             f"round drawn ({self.round}); its secure nodes were discarded")
        held = self._nodes if t == self._tree else {}
        need = prefix_nodes(s)
        nodes = {k: held[k] if k in held else self._draw_units(t, *k) for k in need}
        self._tree, self._step, self._nodes = t, s, nodes
        self.round = max(self.round, int(round_))
        out = np.zeros(self.dim, dtype=np.int64)
        for k in need:
            out += nodes[k]
        return out

    # ------------------------------------------------------------------ the noise
    def prefix(self, round_: int) -> np.ndarray:
        """The noise (float64, ``(dim,)``) of the prefix sum of ``round_``'s tree up to it."""
        if self.secure:
            return self._secure_units(round_) * self.grid
        t, s = self.locate(round_)
        out = np.zeros(self.dim)
        if self.std > 0:
            for lv, i in prefix_nodes(s):
                self._add_node(out, t, lv, i)
        self.round = max(self.round, int(round_))
        return out

    def prefix_units(self, round_: int) -> np.ndarray:
        """Release mode: ``prefix(round_) / grid`` as exact int64 (add to ``rint(sum / grid)``)."""
        if not self.secure:
            raise ValueError("prefix_units is for release mode (secure=True)")
        return self._secure_units(round_)

    def increment(self, round_: int) -> np.ndarray:
        """``prefix(round_) - prefix(round_ - 1)`` within the tree (``prefix(round_)`` at a
        tree's first step): the noise of round ``round_``'s own sum when the caller keeps the
        running (prefix) sum.  Release mode: exact multiples of grid, computed from the nodes
        of both steps (the ones of ``round_ - 1`` must still be held, i.e. call in order)."""
        t, s = self.locate(round_)
        if s == 1:
            return self.prefix(round_)
        if not self.secure:
            # s-1 -> s in binary: the trailing nodes of s-1 leave, one node of s comes in
            new, old = set(prefix_nodes(s)), set(prefix_nodes(s - 1))
            out = np.zeros(self.dim)
            if self.std > 0:
                for lv, i in sorted(new - old, reverse=True):
                    self._add_node(out, t, lv, i)
                for lv, i in sorted(old - new, reverse=True):
                    self._add_node(out, t, lv, i, -1.0)
            self.round = max(self.round, int(round_))
            return out
        if (t, s - 1) != (self._tree, self._step):
            raise ValueError(f"release mode: increment({round_}) needs the nodes of round "
                             f"{round_ - 1}, the last round drawn (last drawn: {self.round})")
        before = sum((self._nodes[k] for k in prefix_nodes(s - 1)),
                     np.zeros(self.dim, dtype=np.int64))
        return (self._secure_units(round_) - before) * self._grid()

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, np.ndarray]:
        """What resuming needs, as arrays (``np.savez(path, **tn.state())``): metadata
        (:data:`META_KEYS`) and, in release mode, the int64 grid units of the nodes held
        (``node_L{level}_I{index}``; those of the last step drawn).  Research mode holds no
        nodes: (seed, round) is the whole state.  Release-mode state is secret (it is the
        noise)."""
        st = {"version": np.asarray(STATE_VERSION), "dim": np.asarray(self.dim),
              "std": np.asarray(self.std), "leaves_per_tree": np.asarray(self.leaves_per_tree),
              "secure": np.asarray(self.secure),
              "grid": np.asarray(self.grid if self.grid is not None else np.nan),
              "seed": np.asarray(self.seed if self.seed is not None else -1, dtype=np.int64),
              "tree": np.asarray(self._tree), "step": np.asarray(self._step),
              "round": np.asarray(self.round)}
        for (lv, i), v in self._nodes.items():
            st[_node_key(lv, i)] = v
        return st

    @classmethod
    def from_state(cls, state) -> "TreeNoise":
        """The object :meth:`state` saved (a dict, or ``np.load``'s NpzFile): its next
        ``prefix`` equals the uninterrupted object's.  ValueError for a malformed state."""
        missing = [k for k in META_KEYS if k not in state]
        if missing:
            raise ValueError(f"tree state lacks {', '.join(missing)}")
        if int(state["version"]) != STATE_VERSION:
            raise ValueError(f"tree state version {int(state['version'])} (expected "
                             f"{STATE_VERSION})")
        secure = bool(state["secure"])
        grid = float(state["grid"])
        tn = cls(int(state["dim"]), float(state["std"]), int(state["leaves_per_tree"]),
                 seed=None if secure else int(state["seed"]), secure=secure,
                 grid=grid if secure else None)
        tn._load(state)
        return tn

    def load_state(self, state) -> None:
        """Restore :meth:`state` into this object, whose parameters must match the saved ones."""
        for k, mine in (("dim", self.dim), ("std", self.std),
                        ("leaves_per_tree", self.leaves_per_tree), ("secure", self.secure)):
            if k not in state:
                raise ValueError(f"tree state lacks {k}")
            if type(mine)(state[k]) != mine:
                raise ValueError(f"tree state has {k} = {state[k]!r}, this object {mine!r}")
        if self.secure and float(state.get("grid", np.nan)) != self.grid:
            raise ValueError(f"tree state grid {state.get('grid')!r} != {self.grid!r}")
        if not self.secure and int(state.get("seed", -1)) != self.seed:
            raise ValueError(f"tree state seed {state.get('seed')!r} != {self.seed!r}")
        self._load(state)

    def _load(self, state) -> None:
        tree, step, rnd = int(state["tree"]), int(state["step"]), int(state["round"])
        nodes: dict[tuple[int, int], np.ndarray] = {}
        for k in state:
            if k in META_KEYS:
                continue
            if not self.secure or not k.startswith("node_L") or "_I" not in k:
                raise ValueError(f"unexpected key {k!r} in a "
                                 f"{'release' if self.secure else 'research'}-mode tree state")
            lv, i = (int(x) for x in k[len("node_L"):].split("_I"))
            v = np.asarray(state[k])
            if v.shape != (self.dim,) or not np.issubdtype(v.dtype, np.integer):
                raise ValueError(f"tree state node {k}: expected int64 of shape ({self.dim},), "
                                 f"got {v.dtype} {v.shape}")
            nodes[(lv, i)] = v.astype(np.int64)
        if self.secure:
            want = set(prefix_nodes(step)) if step >= 1 else set()
            if set(nodes) != want or (step >= 1) != (tree >= 0) or step > self.leaves_per_tree:
                raise ValueError(f"tree state holds nodes {sorted(nodes)} for tree {tree} step "
                                 f"{step}; expected {sorted(want)}")
            if rnd != (tree * self.leaves_per_tree + step if step else 0):
                raise ValueError(f"tree state round {rnd} does not match tree {tree} step {step}")
        self._tree, self._step, self._nodes, self.round = tree, step, nodes, rnd

    def __repr__(self) -> str:
        mode = f"release, grid={self.grid:g}" if self.secure else f"seed={self.seed}"
        return (f"TreeNoise(dim={self.dim}, std={self.std:g}, leaves_per_tree="
                f"{self.leaves_per_tree}, {mode}, round={self.round})")
