"""The update maths of federated learning that DP-FedAvg / DP-FTRL (popri/methods/dpfl/rounds.py),
FewFedPIT (popri/methods/fewfedpit/) and the audit's replays (popri/apps/audit/) share: a
model's trainable parameters as one flat vector, the L2 clip of a client's update, and the noise
on the clipped sum -- the Gaussian of DP-FedAvg (McMahan et al., "Learning Differentially Private
Recurrent Language Models", arXiv:1710.06963, Algorithm 1) or the tree-aggregation noise of
DP-FTRL (Kairouz et al., "Practical and Private (Deep) Learning without Sampling or Shuffling",
arXiv:2103.00039, section 3), both safe in floating point in release mode
(:func:`popri.privacy.noise.snapped_sensitivity`).

    python -c "from popri.federated.updates import clip; import numpy as np; print(clip(np.ones(4, np.float32), 1.0))"
"""

from __future__ import annotations

import math

import numpy as np

from popri.core.errors import InputError
from popri.privacy import noise as N
from popri.privacy.tree import TreeNoise
from popri.specs.fl import FLSpec


# --------------------------------------------------------------------------- the model as a vector
def trainable(model) -> list:
    return [p for p in model.parameters() if p.requires_grad]


def flat(params) -> np.ndarray:
    import torch

    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).float().cpu() for p in params]).numpy()


def set_flat(params, vec: np.ndarray) -> None:
    import torch

    with torch.no_grad():
        i = 0
        for p in params:
            n = p.numel()
            p.copy_(torch.from_numpy(np.asarray(vec[i:i + n], dtype=np.float32))
                    .reshape(p.shape).to(p.device, p.dtype))
            i += n
    if i != len(vec):
        raise InputError(f"the global weights have {len(vec)} numbers, the model {i}",
                         field="init")


def clip(delta: np.ndarray, c: float) -> tuple[np.ndarray, float]:
    """(Delta * min(1, C / ||Delta||), ||Delta||): the L2 clip that bounds a client's share.

    An update that is not finite (a client whose local training diverged: NaN or inf) has no
    norm a clip could scale, and ``NaN > C`` is false: passed on, it would make the whole noisy
    sum NaN -- a release that tells whether some client's data diverged, which the sum's
    sensitivity does not cover.  It contributes zeros instead (norm <= C holds for every
    client), and its norm is reported as inf."""
    d64 = delta.astype(np.float64)
    if not np.all(np.isfinite(d64)):
        return np.zeros_like(delta), math.inf
    norm = float(np.linalg.norm(d64))
    if norm > c:
        delta = delta * np.float32(c / norm)
    return delta, norm



# --------------------------------------------------------------------------- noise
def add_noise(total: np.ndarray, spec: FLSpec, z: float, t: int, rel, seed: int,
              sensitivity: float | None = None) -> tuple[np.ndarray, float]:
    """(sum + noise, the noise multiplier guaranteed): fedavg's Gaussian, or ftrl's tree noise
    of round t's one-leaf tree (``--restart round``; epoch trees: :func:`tree_noise`), of std
    z times the sum's ``sensitivity`` under the round's relation (default the clip C; 2C under
    replace one client: :func:`popri.privacy.relations.round_relation`).  Release mode snaps
    the sum to a grid and adds discrete-Gaussian integers on it at the same z for the snapped
    sensitivity (safe in floating point: :func:`popri.privacy.noise.snapped_sensitivity`)."""
    C, d = float(spec.clip if sensitivity is None else sensitivity), total.size
    if z == 0:
        return total.copy(), 0.0
    if spec.algorithm == "fedavg":
        if rel.secure:
            return N.discrete_gaussian_release(total, z, C, rel.rng("noise"))[0], z
        return total + rel.rng("noise").standard_normal(d) * (z * C), z

    if rel.secure:
        g, snapped = N.snapped_sensitivity(C, d)
        tree = TreeNoise(d, z * snapped, 1, seed=None, secure=True, grid=g)
        return g * (np.rint(total / g) + tree.prefix_units(t)), z
    tree = TreeNoise(d, z * C, 1, seed=seed, secure=False)
    return total + tree.prefix(t), z


def tree_noise(total: np.ndarray, spec: FLSpec, z: float, t: int, leaves: int, rel,
               seed: int, state: dict | None = None):
    """(sum + the tree noise of round t's leaf, the noise multiplier guaranteed, the TreeNoise)
    for DP-FTRL with a tree of ``leaves`` rounds: the increment prefix(t) - prefix(t - 1) of
    the tree's noisy prefix sums (:meth:`popri.privacy.tree.TreeNoise.increment`; the server's
    running state adds the increments, so it follows the noisy prefix sums exactly).  Research
    mode recomputes every node from (seed, tree, level, index); release mode draws them from the
    OS CSPRNG on the sum's grid and needs the previous round's ``state`` (secret)."""
    C, d = float(spec.clip), total.size
    if z == 0:
        return total.copy(), 0.0, None
    if rel.secure:
        g, snapped = N.snapped_sensitivity(C, d)
        tree = (TreeNoise.from_state(state) if state is not None
                else TreeNoise(d, z * snapped, leaves, seed=None, secure=True, grid=g))
        if tree.secure is not True or tree.grid != g or tree.leaves_per_tree != leaves \
                or not math.isclose(tree.std, z * snapped, rel_tol=1e-12):
            raise InputError("the saved tree state does not fit this round", field="init")
        # increment(t): exact multiples of g from the nodes of t - 1 (held in the state) and t
        return g * np.rint(total / g) + tree.increment(t), z, tree
    tree = TreeNoise(d, z * C, leaves, seed=seed, secure=False)
    return total + tree.increment(t), z, tree
