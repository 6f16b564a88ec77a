"""FreD: a differentially private Frechet distance between public candidates and client data.

    popri fred stats --private data/sotu --epsilon 0.6 --delta 2e-6 --clip 1 --out runs/fred/stats.npz
    popri fred compare --stats runs/fred/stats.npz cand_a.jsonl cand_b.npy data/other --json
    python examples/fred_mixture.py
    python -m pytest -q tests/test_fred.py

FreD (Hou et al., "Privately Customizing Prefinetuning to Better Match
User Data in Federated Learning", arXiv:2302.09042, Algorithm 1 and Proposition 3.1): the
clients' embedding mean and covariance are released once under DP; any number of public
candidates is then compared with them by the Frechet distance of ``popri.models.fid`` (the one
`popri eval fid` and checkpoint selection use), at no further privacy cost.  This module is the
maths (sensitivities, the two releases, the files); :mod:`popri.methods.fred.steps` runs the
``fred stats`` / ``fred compare`` steps (release protocol, ledger, ranking).

Two Gaussian releases, each the noisy sum of per-client contributions (client side:
:func:`mean_contribution`, :func:`cov_contribution`; server side: :func:`server_sum`, noise,
:func:`project_psd`).  Client k keeps n_k <= m rows x_j (m = 1 per record at sample level)::

    release 1   u_k = [ sum_j clip_c(x_j) ; g * n_k ]          g: count weight (0 if n is public)
                S1  = sum_k u_k + N(0, s1^2 I),   s1 = z * D1
                pmean = S1[:d] / n,   n = the exact count when public, else S1[d] / g
    release 2   y_j = clip_c(clip_c(x_j) - pmean),   V_k = sum_j y_j y_j^T
                S2  = sum_k V_k + E,   E symmetric, its upper triangle (with the diagonal)
                      iid N(0, s2^2),   s2 = z * D2
                pcov = nearest PSD matrix to S2 / n  (Frobenius: eigenvalues clipped at 0), or
                       with --denoise: eigenvalues below the noise edge 2 tau2 sqrt(d) set to 0,
                       those above debiased (:func:`denoise_spectrum`)

so tau1 = s1 / n and tau2 = s2 / n are the noise stds on the released mean and covariance.  z is
the classic sqrt(2 ln(1.25/delta)) / eps (Dwork & Roth 2014, Theorem A.1: eps < 1 only; the
paper's choice) or the analytic Gaussian mechanism (Balle & Wang 2018): the smallest z with
Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z) <= delta (dp_accounting's exact solver); both
are :func:`popri.privacy.calibration.gaussian_multiplier`.  Each release is (eps, delta)-DP, the
pair (2 eps, 2 delta)-DP by basic composition (FreD Proposition 3.1).

Sensitivities (L2, of the sums).  A *record* is one sample (--level sample) or one client's data
(--level user, at most m samples per client).  ``replace-one``: neighbours have as many records
and differ in one record's content; ``add-remove``: one record more or less.

- D1, replace-one: the change is (sum_j clip(x_j) - sum_j clip(x'_j), g (n_k - n'_k)), of squared
  norm <= (n_k + n'_k)^2 c^2 + g^2 (n_k - n'_k)^2; convex in n_k, n'_k in [1, m], so the maximum is
  at a corner: D1 = sqrt(max(4 m^2 c^2, (m+1)^2 c^2 + g^2 (m-1)^2)).  Sample level: n is fixed by
  the relation, hence public (g = 0): D1 = 2c, the paper's tau1 = 2c z / n.  User level: g = c,
  and D1 = 2mc (2m^2 + 2 <= 4m^2): the count rides along for free.
- D1, add-remove: ||(sum_j clip(x_j), g n_k)|| <= m sqrt(c^2 + g^2); n is private, g = c/2, so
  D1 = m c sqrt(5)/2 (~1.118 m c) and the count's noise std is s1 / g.
- D2: V_k is PSD with ||V_k||_F <= tr V_k <= n_k c^2 <= m c^2, and the released upper triangle u
  of a symmetric A has ||u||^2 = (||A||_F^2 + ||diag A||^2) / 2 <= ||A||_F^2.  add-remove:
  D2 = m c^2 (sample level: the paper's tau2 = c^2 z / n).  replace-one: ||V - V'||_F^2 =
  ||V||^2 + ||V'||^2 - 2<V, V'> <= 2 m^2 c^4 (<V, V'> >= 0 for PSD), D2 = sqrt(2) m c^2, attained
  by y = c e1, y' = c e2.  The paper's c^2/n is the add/remove bound; under the replace-one
  relation its tau1 = 2c/n assumes, the covariance needs sqrt(2) c^2 / n, which is used here.

Noise placement: Algorithm 1 as printed adds N(0, tau1^2) to every sample before averaging,
which leaves only tau1 / sqrt(n) on the mean; Proposition 3.1 needs tau1 on the mean itself.
popri draws s1 = n tau1 (s2 = n tau2) once on the sum, distributed exactly as K clients each
adding N(0, s^2 / K) to their upload under secure aggregation.
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from popri.core.artifacts import json_sidecar
from popri.core.errors import InputError
from popri.core.io import read_json
from popri.federated import participation
from popri.models.fid import gaussian_stats
from popri.privacy.accounting import ParameterError
from popri.privacy.calibration import (  # noqa: F401  (re-exported: deprecated names)
    CALIBRATIONS,
    analytic_multiplier,
    classic_multiplier,
    gaussian_log_delta,
    gaussian_multiplier,
)
from popri.privacy.noise import discrete_gaussian_release, make_rng, snapped_sensitivity

# the relations, the levels and the user-level cap m (8, PrE-Text's): declared in the spec
from popri.privacy.entries import gaussian
from popri.specs.privacy import DEFAULT_USER_CAP, LEVELS, RELATIONS  # noqa: F401

# --------------------------------------------------------------------------- calibration
# One Gaussian release's noise multiplier: popri.privacy.calibration.gaussian_multiplier.


# --------------------------------------------------------------------------- sensitivities
@dataclass(frozen=True)
class Design:
    """Neighbouring relation, level, clip norm and per-client cap: everything D1, D2 depend on."""

    relation: str = "replace-one"
    level: str = "sample"
    clip: float = 1.0
    max_samples_per_client: int | None = None  # m at --level user

    def __post_init__(self) -> None:
        if self.relation not in RELATIONS:
            raise ParameterError("relation", f"must be one of {', '.join(RELATIONS)} "
                                             f"(got {self.relation!r})")
        if self.level not in LEVELS:
            raise ParameterError("level", f"must be one of {', '.join(LEVELS)} (got {self.level!r})")
        if not (isinstance(self.clip, (int, float)) and math.isfinite(self.clip) and self.clip > 0):
            raise ParameterError("clip", f"must be a finite number > 0 (got {self.clip})")
        m = self.max_samples_per_client
        if self.level == "sample" and m is not None:
            raise ParameterError("max_samples_per_client", "applies to --level user only (at "
                                 "sample level every sample is its own record)")
        if m is not None and (isinstance(m, bool) or int(m) != m or m < 1):
            raise ParameterError("max_samples_per_client", f"must be an integer >= 1 (got {m})")

    @property
    def m(self) -> int:
        if self.level == "sample":
            return 1
        return int(self.max_samples_per_client or DEFAULT_USER_CAP)

    @property
    def count_public(self) -> bool:
        """n is fixed by the relation (same number of samples in both neighbours)."""
        return self.relation == "replace-one" and self.level == "sample"

    @property
    def count_weight(self) -> float:
        """g: weight of the count coordinate of release 1 (0 when n is public)."""
        if self.count_public:
            return 0.0
        return float(self.clip) if self.relation == "replace-one" else float(self.clip) / 2.0

    @property
    def mean_sensitivity(self) -> float:
        c, m, g = float(self.clip), self.m, self.count_weight
        if self.relation == "replace-one":
            return math.sqrt(max(4 * m * m * c * c, (m + 1) ** 2 * c * c + g * g * (m - 1) ** 2))
        return m * math.sqrt(c * c + g * g)

    @property
    def cov_sensitivity(self) -> float:
        c, m = float(self.clip), self.m
        return (math.sqrt(2.0) if self.relation == "replace-one" else 1.0) * m * c * c

    @property
    def neighbouring(self) -> str:
        kind = "replace" if self.relation == "replace-one" else "add/remove"
        return f"{kind} one {'sample' if self.level == 'sample' else 'client'}"


# --------------------------------------------------------------------------- client side
def clip_rows(x: np.ndarray, c: float) -> np.ndarray:
    """chi_c: every row scaled to L2 norm at most c (float64 copy)."""
    x = np.array(x, dtype=np.float64, ndmin=2)
    norm = np.sqrt(np.einsum("ij,ij->i", x, x))
    return x * np.minimum(1.0, c / np.maximum(norm, np.finfo(np.float64).tiny))[:, None]


def mean_contribution(x: np.ndarray, clip: float, count_weight: float = 0.0) -> np.ndarray:
    """Client side, release 1: [sum of the clipped rows ; count_weight * rows], float64 [d+1]."""
    cx = clip_rows(x, clip)
    return np.concatenate([cx.sum(axis=0), [count_weight * len(cx)]])


def cov_contribution(x: np.ndarray, clip: float, center: np.ndarray) -> np.ndarray:
    """Client side, release 2: sum of y y^T, y = clip_c(clip_c(x) - center), float64 [d, d]."""
    y = clip_rows(clip_rows(x, clip) - np.asarray(center, dtype=np.float64), clip)
    return y.T @ y


# --------------------------------------------------------------------------- server side
def server_sum(contributions: Iterable[np.ndarray]) -> np.ndarray:
    """The sum of the clients' uploads (secure aggregation stands here)."""
    total = None
    for u in contributions:
        total = np.array(u, dtype=np.float64) if total is None else total + u
    if total is None:
        raise ParameterError("private", "no clients: nothing to aggregate")
    return total


def symmetric_noise(d: int, std: float, rng) -> np.ndarray:
    """Upper triangle (diagonal included) iid N(0, std^2), mirrored to the lower triangle."""
    iu = np.triu_indices(d)
    e = np.zeros((d, d))
    e[iu] = std * np.asarray(rng.standard_normal(len(iu[0])), dtype=np.float64)
    return e + np.triu(e, 1).T


def project_psd(a: np.ndarray) -> np.ndarray:
    """Nearest symmetric PSD matrix in Frobenius norm (Higham 1988): symmetrise, clip the
    eigenvalues at 0."""
    a = np.asarray(a, dtype=np.float64)
    w, v = np.linalg.eigh((a + a.T) / 2)
    p = (v * np.clip(w, 0.0, None)) @ v.T
    return (p + p.T) / 2


def denoise_spectrum(a: np.ndarray, tau: float) -> np.ndarray:
    """PSD estimate of C from a = C + E, E symmetric with iid N(0, tau^2) upper triangle.

    E's eigenvalues fill [-2 tau sqrt(d), 2 tau sqrt(d)] (semicircle law), so eigenvalues of
    ``a`` below that edge carry no recoverable signal and are set to 0; one above it is the
    image l = theta + d tau^2 / theta of a signal eigenvalue theta (spiked Wigner model,
    Benaych-Georges & Nadakuditi 2011) and is mapped back to theta = (l + sqrt(l^2 - 4 d tau^2))
    / 2.  Post-processing of the release: no privacy cost."""
    a = np.asarray(a, dtype=np.float64)
    d = a.shape[0]
    w, v = np.linalg.eigh((a + a.T) / 2)
    edge = 2.0 * tau * math.sqrt(d)
    theta = np.where(w > edge, (w + np.sqrt(np.maximum(w * w - edge * edge, 0.0))) / 2, 0.0)
    p = (v * theta) @ v.T
    return (p + p.T) / 2


# --------------------------------------------------------------------------- the mechanism
@dataclass
class FredStats:
    mean: np.ndarray          # float64 [d]
    cov: np.ndarray | None    # float64 [d, d], PSD; None when only the mean was released
    n: float                  # what the sums were divided by (exact only when public)
    private: bool
    params: dict = field(default_factory=dict)
    sum1: np.ndarray | None = None  # release 1 as released: noisy [sum ; g n] (d+1, or d)
    sum2: np.ndarray | None = None  # release 2 as released: noisy symmetric sum, unprojected


def group_clients(codes: np.ndarray, keep: np.ndarray | None = None) -> list[np.ndarray]:
    """Row indices of each client (kept rows only), clients in code order, rows ascending."""
    codes = np.asarray(codes)
    idx = np.arange(len(codes)) if keep is None else np.flatnonzero(keep)
    order = idx[np.argsort(codes[idx], kind="stable")]
    cuts = np.flatnonzero(np.diff(codes[order])) + 1
    return [part for part in np.split(order, cuts) if len(part)]


def private_stats(clients: Sequence[np.ndarray], design: Design, z: float, rng, *,
                  denoise: bool = False, covariance: bool = True,
                  clip_to: float | None = None) -> FredStats:
    """Algorithm 1's two releases over ``clients`` (each a [n_k, d] array of kept rows); with
    ``covariance=False`` release 1 alone (the mean: what a mean-cosine selection reads).
    ``clip_to``: the norm the rows are clipped to, when not the design's c (the privacy audit's
    broken variant ``no-clip`` passes inf: the noise is still that of c, and the audit must flag
    the release).

    The covariance is the nearest PSD matrix to S2 / n (the paper), or with ``denoise``
    :func:`denoise_spectrum` of it (noise-edge thresholding; same release, no privacy cost)."""
    if not clients:
        raise ParameterError("private", "no clients: nothing to release")
    if not (math.isfinite(z) and z > 0):
        raise ParameterError("noise_multiplier", f"must be a finite number > 0 (got {z})")
    d = int(clients[0].shape[1])
    c, g = float(design.clip if clip_to is None else clip_to), design.count_weight
    s1, s2 = z * design.mean_sensitivity, z * design.cov_sensitivity
    rows = sum(len(x) for x in clients)

    secure = bool(getattr(rng, "secure", False))
    t1 = server_sum(mean_contribution(x, c, g) for x in clients)
    if secure:  # release mode: snapped + discrete Gaussian at z (popri.privacy.noise)
        v1 = t1[:d] if design.count_public else t1
        sum1, _ = discrete_gaussian_release(v1, z, design.mean_sensitivity, rng)
        s1 = z * snapped_sensitivity(design.mean_sensitivity, v1.size)[1]
    elif design.count_public:
        sum1 = t1[:d] + s1 * np.asarray(rng.standard_normal(d), dtype=np.float64)
    else:
        sum1 = t1 + s1 * np.asarray(rng.standard_normal(d + 1), dtype=np.float64)
    if design.count_public:
        n, clamped = float(rows), False
    else:
        n_hat = float(sum1[d] / g)
        n, clamped = max(n_hat, 1.0), n_hat < 1.0
    pmean = sum1[:d] / n
    params = {
        "noise_multiplier": z, "mean_sensitivity": design.mean_sensitivity,
        "noise_std_sum1": s1, "tau1": s1 / n, "count_public": design.count_public,
        "count_weight": g, "count_noise_std": None if design.count_public else s1 / g,
        "count_clamped": clamped, "noise": "discrete-gaussian" if secure else "gaussian",
        "statistics": "both" if covariance else "mean",
    }
    if not covariance:
        return FredStats(pmean, None, n, True, params, sum1, None)

    t2 = server_sum(cov_contribution(x, c, pmean) for x in clients)
    if secure:
        iu = np.triu_indices(d)
        tri, _ = discrete_gaussian_release(t2[iu], z, design.cov_sensitivity, rng)
        s2 = z * snapped_sensitivity(design.cov_sensitivity, tri.size)[1]
        sum2 = np.zeros((d, d))
        sum2[iu] = tri
        sum2 = sum2 + np.triu(sum2, 1).T
    else:
        sum2 = t2 + symmetric_noise(d, s2, rng)
    cov = denoise_spectrum(sum2 / n, s2 / n) if denoise else project_psd(sum2 / n)
    params.update({
        "cov_sensitivity": design.cov_sensitivity, "noise_std_sum2": s2, "tau2": s2 / n,
        "covariance": "denoised" if denoise else "nearest-psd",
        "noise_edge": 2.0 * s2 / n * math.sqrt(d),
    })
    return FredStats(pmean, cov, n, True, params, sum1, sum2)


def design_of(spec) -> Design:
    """The :class:`Design` (relation, level, clip, m) of a private
    :class:`~popri.specs.privacy.FredStatsSpec`."""
    m = spec.max_samples_per_client if spec.level == "user" else None
    return Design(spec.relation, spec.level, spec.clip, m)


def release_entries(spec, z: float, *, mode: str, more=None) -> list:
    """The ledger entries of ``popri fred stats`` with ``spec`` (a
    :class:`~popri.specs.privacy.FredStatsSpec`) at noise multiplier z: one Gaussian release
    (q = 1) of the mean, and of the covariance unless ``spec.statistics`` is "mean", at their
    sensitivities under the spec's relation and level (:class:`Design`).  The one builder of
    the plan (:meth:`popri.pipeline.budget.Budget.select_entries`, from the stage's call) and
    of the record (:func:`popri.methods.fred.steps.release_stats`, whose ``more(what)`` adds
    each entry's release id and parameters)."""
    design = design_of(spec)
    out = []
    for what, sens in (("mean", design.mean_sensitivity), ("covariance", design.cov_sensitivity)):
        if what == "covariance" and spec.statistics == "mean":
            continue
        rid, params = more(what) if more else ("", {"release": what})
        out.append(gaussian("fred", noise_multiplier=z, sample_rate=1.0, delta=spec.delta,
                            sensitivity=sens, sampling="none", neighbouring=design.neighbouring,
                            mode=mode, release_id=rid, params=params))
    return out


def release(emb: np.ndarray, keys: Sequence[str], design: Design, z: float, *, seed: int | None,
            secure: bool = False, denoise: bool = False, covariance: bool = True,
            clip_to: float | None = None) -> FredStats:
    """What `popri fred stats` runs: rows grouped by client key, at most m rows per client at
    user level (a seeded choice, stream "fred-cap"), then :func:`private_stats` (stream
    "fred-noise"); ``secure`` draws both from os.urandom instead.  ``clip_to``: as
    :func:`private_stats`'s."""
    codes, _ = participation.factorize(list(keys))
    rng = make_rng(seed, secure=secure, stream="fred-cap")
    keep = participation.cap_per_client(codes, design.m, rng) if design.level == "user" else None
    clients = [np.asarray(emb[g], dtype=np.float64) for g in group_clients(codes, keep)]
    return private_stats(clients, design, z, make_rng(seed, secure=secure, stream="fred-noise"),
                         denoise=denoise, covariance=covariance, clip_to=clip_to)


def exact_stats(emb: np.ndarray) -> FredStats:
    """--non-private: mean and (N-1) covariance of all rows, unclipped (= what `eval fid` fits)."""
    mean, cov = gaussian_stats(emb)
    return FredStats(mean, cov, float(len(emb)), False, {})


# --------------------------------------------------------------------------- files
#: STATS.npz -> STATS.json (:func:`popri.core.artifacts.json_sidecar`); a deprecated alias,
#: popri.core.guard still imports it
sidecar_path = json_sidecar


def write_npz(path, arrays: dict[str, np.ndarray]) -> None:
    """An .npz that np.load reads, byte-identical for identical arrays (fixed zip timestamps,
    unlike np.savez)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, arr in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            with zf.open(info, "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.require(arr, requirements="C"), allow_pickle=False)


def save_stats(path: str, stats: FredStats, sidecar: dict, out) -> None:
    """Stage STATS.npz (mean, cov, n; no cov when only the mean was released) and STATS.json
    in an io.AtomicOutputs ``out``."""
    arrays = {"mean": stats.mean, "n": np.asarray(stats.n, dtype=np.float64)}
    if stats.cov is not None:
        arrays["cov"] = stats.cov
    write_npz(out.path(path, suffix=".npz"), arrays)
    with open(out.path(json_sidecar(path)), "w", encoding="utf-8") as fh:
        fh.write(json.dumps(sidecar, ensure_ascii=False, indent=2, allow_nan=False) + "\n")


def load_stats(path: str) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """(mean, cov, sidecar) of a `popri fred stats` output; located errors for bad files.  cov
    is None for a mean-only release (sidecar ``"statistics": "mean"``)."""
    from pathlib import Path

    if not Path(path).is_file():
        raise InputError("no such file", path=path)
    side_path = json_sidecar(path)
    if not Path(side_path).is_file():
        raise InputError(f"missing sidecar {side_path} (written by 'popri fred stats')", path=path)
    side = read_json(side_path)
    if not isinstance(side, dict) or side.get("kind") != "fred-stats":
        raise InputError("not a FreD statistics sidecar (written by 'popri fred stats')",
                         path=side_path, field="kind")
    for k, kind, what in (("embedding_model", str, "a string"), ("normalize", bool, "a boolean"),
                          ("params", dict, "an object"), ("ledger", list, "a list")):
        if side.get(k) is not None and not isinstance(side[k], kind):
            raise InputError(f"must be {what} (got {type(side[k]).__name__})", path=side_path,
                             field=k)
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):  # a .npy named .npz
            raise InputError("is a .npy array, not an .npz archive (written by 'popri fred "
                             "stats')", path=path)
        with z:
            arrays = {k: np.asarray(z[k], dtype=np.float64) for k in z.files}
    except (ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise InputError(f"not an .npz archive: {e}", path=path) from None
    mean_only = side.get("statistics") == "mean"
    for k in ("mean",) if mean_only else ("mean", "cov"):
        if k not in arrays:
            raise InputError("missing array", path=path, field=k)
    mean, cov = arrays["mean"], None if mean_only else arrays["cov"]
    d = mean.shape[0] if mean.ndim == 1 else -1
    if d < 1 or (cov is not None and cov.shape != (d, d)):
        raise InputError(f"shapes do not fit: mean {mean.shape}, cov "
                         f"{None if cov is None else cov.shape}", path=path, field="cov")
    for k, a in (("mean", mean), ("cov", cov)):
        if a is not None and not np.isfinite(a).all():
            raise InputError("contains NaN or infinity", path=path, field=k)
    if side.get("dim") not in (None, d):
        raise InputError(f"sidecar says dim {side.get('dim')} but the arrays have {d}",
                         path=side_path, field="dim")
    return mean, cov, side
