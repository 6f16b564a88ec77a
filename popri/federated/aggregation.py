"""The server's side of a round: noisy sums of the clients' uploads, and their reduction.

    popri score ... --per-client-out runs/clients.npy
    popri aggregate runs/clients.npy --out runs/scores.npy
    popri aggregate shard0.npy shard1.npy --out runs/scores.npy --reduce sum --threshold 20
    python -m pytest -q tests/test_score_cli.py -k aggregate

Every client i uploads a vector v_i of L2 norm at most s (the sensitivity: the clip C of POPri's
cosine feedback, the cap M of PrE-Text's vote; :mod:`popri.feedback.cosine`,
:mod:`popri.feedback.histogram`).  The Gaussian mechanism on the sum of the L participants::

    total  = sum_i v_i + N(0, (Z s)^2)                       one draw on the sum (default), or
    upload_i = v_i + N(0, (Z s)^2 / L),  total = sum_i upload_i   per-client rows (--per-client-out)

The two have exactly the same distribution (:func:`noisy_sum`).  The server then reduces
(:func:`finish`): the mean total / D when D is a PUBLIC count (:func:`public_denominator`), else
the sum, then optionally max(x - H, 0) (PrE-Text's threshold, "PrE-Text: Training Language
Models on Private Federated Data in the Age of LLMs", arXiv:2406.02958, section 3).

:func:`aggregate_uploads` is the shard reduction a federated server runs (``popri aggregate``):
the per-client upload files of one round, checked to be shards of the same release (same
synthetic ids, mode, round, mechanism parameters; disjoint clients), summed and reduced.  It
spends no privacy: the output carries the same ledger entries (same release id, counted once).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from popri.core import artifacts, io, log
from popri.core.errors import ConfigError, InputError
from popri.core.guard import check_outputs
from popri.core.validate import finite
from popri.federated.participation import row_blocks
from popri.privacy import ledger
from popri.privacy.noise import discrete_gaussian_release
from popri.privacy.release import record

if TYPE_CHECKING:
    from popri.specs.feedback import AggregateSpec

BLOCK_BYTES = 256 << 20  # a client block's [L_b, n_syn] float32 matrix is about this big

#: the sidecar values that must agree between shards of one round
MECHANISM_KEYS = ("round", "noise_multiplier", "clip", "standardize", "max_samples_per_client",
                  "sampling", "sample_rate", "total_clients")


# --------------------------------------------------------------------------- one round's noisy sum
def block_clients(n_syn: int, block: int | None = None) -> int:
    """Clients per block of per-client rows: ``block``, else about BLOCK_BYTES of float32."""
    return int(block) if block else max(1, BLOCK_BYTES // (4 * max(n_syn, 1)))


@dataclass(frozen=True)
class Contributions:
    """One round's clipped client vectors before the noise: ``n`` coordinates, ``L``
    participants, their sum (``exact()``, computed without forming the rows) and the rows of
    clients c0..c1 (``rows(c0, c1)``, float32 [c1 - c0, n]).  Built by the feedback
    (:func:`popri.feedback.cosine.contributions`, :func:`popri.feedback.histogram.contributions`),
    which bounds each row's norm; noised here (:func:`noisy_sum`)."""

    n: int
    L: int
    exact: Callable[[], np.ndarray]
    rows: Callable[[int, int], np.ndarray]


def noisy_sum(c: Contributions, *, noise_multiplier: float, sensitivity: float, noise_rng,
              rows_out=None, block: int | None = None) -> np.ndarray:
    """The sum of the L clients' clipped rows ``c`` plus noise of multiplier z
    (``noise_multiplier``) for the sum's L2 ``sensitivity`` D, float64 [n]: std_sum = z D.

    Without ``rows_out``: ``exact()`` (the sum, computed without forming the rows) plus one draw
    of N(0, std_sum^2).  With ``rows_out`` ([L, n]): each client's row ``rows(c0, c1)`` plus its own
    N(0, std_sum^2 / L) is written there and summed; if L = 0 (a Poisson draw of nobody),
    ``rows_out`` is [1, n] and holds the server's N(0, std_sum^2).

    Release mode (``noise_rng`` is a :class:`popri.privacy.noise.SecureRandom`): the sum is
    snapped to a grid and gets discrete Gaussian noise at the same z for the snapped
    sensitivity (:func:`popri.privacy.noise.discrete_gaussian_release`, safe in floating point).
    Per-client rows are refused there: the sum of per-client discrete noise shares is not a
    discrete Gaussian (the distributed discrete Gaussian needs its own accounting).
    """
    n, L, exact, rows = c.n, c.L, c.exact, c.rows
    secure = bool(getattr(noise_rng, "secure", False))
    std_sum = noise_multiplier * sensitivity
    if secure and std_sum > 0:
        if rows_out is not None:
            raise ValueError("per-client noisy rows are not available in release mode")
        return discrete_gaussian_release(exact(), noise_multiplier, sensitivity, noise_rng)[0]
    if rows_out is None:
        total = exact()
        return total + std_sum * noise_rng.standard_normal(n) if std_sum > 0 else total
    if L == 0:
        rows_out[0] = std_sum * noise_rng.standard_normal((1, n), dtype=np.float32)
        return np.asarray(rows_out[0], dtype=np.float64)
    total, std_row = np.zeros(n), np.float32(std_sum / np.sqrt(L))
    step = block_clients(n, block)
    for c0 in range(0, L, step):
        r = rows(c0, min(c0 + step, L))
        if std_sum > 0:
            r += std_row * noise_rng.standard_normal(r.shape, dtype=np.float32)
        rows_out[c0:c0 + len(r)] = r
        total += r.sum(axis=0, dtype=np.float64)
    return total


def finish(total: np.ndarray, *, reduce: str, denominator: float,
           threshold: float | None) -> np.ndarray:
    """Server side: mean (divide by ``denominator``) or sum, then optional max(x - H, 0)."""
    out = total / denominator if reduce == "mean" else np.asarray(total, dtype=np.float64)
    if threshold is not None:
        out = np.maximum(out - threshold, 0.0)
    return out.astype(np.float32)


def public_count(sampling: str, *, sample_rate: float, clients_per_round: int | None,
                 public_clients: int | None, what: str = "the noisy sum") -> float:
    """The one number a released sum may be divided by: a PUBLIC count, never the data's own.

    Every release path that turns a noisy sum into a mean calls this (``popri score``'s cosine
    mean, ``popri fl round``'s DP-FedAvg / DP-FTRL step, ``popri fewfedpit aggregate``).  Under
    add/remove-one-client neighbours the number of participants -- and the number of clients N
    -- differ between neighbours, so dividing by them is not post-processing: the released
    noise's scale z C / (q N) would then estimate N from one release (issue 43).  Public counts:

        fixed   L, the --clients-per-round setting (N is public there by the accounting:
                q = L / N is in the ledger; neighbours replace one client and keep L)
        poisson q N_pub      N_pub = --public-clients, declared public by the operator
        bins    q N_pub      DP-FTRL's bins, q = 1 / R
        none    N_pub        (or L when --clients-per-round L says everyone takes part)

    This is DP-FedAvg's fixed-denominator estimator (McMahan, Ramage, Talwar, Zhang, "Learning
    Differentially Private Recurrent Language Models", arXiv:1710.06963, section 2: the sum
    over the round's sample divided by q W, W the known total weight).  N_pub need not equal
    the true N: it only scales the mean (an estimate costs accuracy, never privacy).  Without
    it a :class:`~popri.core.errors.ConfigError` names ``public_clients``."""
    if clients_per_round is not None and sampling in ("fixed", "none"):
        return float(clients_per_round)
    if public_clients is None:
        raise ConfigError(f"{what} is divided by a PUBLIC count, and under {sampling} "
                          "sampling the number of clients is private (add/remove one client): "
                          "declare the enrolled clients with --public-clients N (fl.public_"
                          "clients in a config; an estimate only scales the step), or sample a "
                          "fixed --clients-per-round L", field="public_clients")
    if not public_clients >= 1:
        raise ConfigError(f"must be >= 1 (got {public_clients})", field="public_clients")
    if sampling in ("poisson", "bins"):
        return float(sample_rate) * float(public_clients)
    return float(public_clients)


def public_denominator(mode: str, sampling: str, q: float, L: int,
                       public_clients: int | None) -> tuple[str, float | None]:
    """(reduce, denominator) of a round: the cosine mean only ever divides by a PUBLIC count.

    Dividing the noisy sum by the realised number of clients is not post-processing: under
    add/remove-one-client neighbours that count changes with the data (the audit,
    ``popri audit release --dataset adversarial``, measured the leak).  Public counts are a fixed
    L per round (a parameter) and an enrolled count N the operator declares public
    (``--public-clients``: the mean divides by q*N under Poisson sampling, by N without
    sampling, as DP-FedAvg's fixed-denominator estimator, McMahan et al. 2018, arXiv:1710.06963,
    section 2).  Otherwise the output is the noisy sum; nn-histogram is always a sum."""
    if mode != "cosine":
        return "sum", None
    if sampling == "fixed" or public_clients:
        return "mean", public_count(sampling, sample_rate=q, public_clients=public_clients,
                                    clients_per_round=L if sampling == "fixed" else None)
    return "sum", None


# --------------------------------------------------------------------------- shard reduction
def sum_rows(arr: np.ndarray) -> np.ndarray:
    """Sum of the rows of a (possibly huge, memory-mapped) [L, n] array, float64."""
    total = np.zeros(arr.shape[1])
    for _, blk in row_blocks(arr, max(1, BLOCK_BYTES // (4 * max(arr.shape[1], 1)))):
        total += blk.sum(axis=0, dtype=np.float64)
    return total


def _read_upload(f: str):
    """(sidecar, memory-mapped rows) of one per-client upload file, checked."""
    side_path = artifacts.json_sidecar(f)
    if not f.endswith(".npy"):
        raise InputError("expected a per-client CLIENTS.npy", path=f)
    if not Path(f).exists():
        raise InputError("no such file", path=f)
    if not Path(side_path).exists():
        raise InputError(f"missing sidecar {side_path}", path=f)
    side = io.read_json(side_path)
    if not isinstance(side, dict) or side.get("kind") != "per-client":
        raise InputError("not a per-client upload file (written by 'popri score "
                         "--per-client-out')", path=side_path, field="kind")
    for k, kind in (("ids", list), ("clients", list), ("mode", str), ("params", dict),
                    ("ledger", list)):
        if not isinstance(side.get(k), kind):
            raise InputError(f"missing or not a {kind.__name__}", path=side_path, field=k)
    io.check_score_sidecar(side, side_path)
    if any(isinstance(c, bool) or not isinstance(c, (str, int)) for c in side["clients"]):
        raise InputError("every client id must be a string or an integer", path=side_path,
                         field="clients")
    extra = side.get("server_noise_rows", 0)
    if isinstance(extra, bool) or not isinstance(extra, int) or extra not in (0, 1):
        raise InputError(f"must be 0 or 1 (got {extra!r})", path=side_path,
                         field="server_noise_rows")
    arr = io.load_npy(f, mmap=True)
    rows = len(side["clients"]) + extra
    if arr.ndim != 2 or arr.shape != (rows, len(side["ids"])):
        raise InputError(f"array shape {arr.shape} does not match the sidecar "
                         f"({rows} rows x {len(side['ids'])} ids)", path=f)
    return side, arr


def aggregate_uploads(files: Sequence[str], spec: "AggregateSpec", *, out: str) -> dict[str, Any]:
    """Sum the per-client upload files of one round (shards) and reduce them to one score
    vector; write ``out`` (+ sidecar, + the same ledger entries next to it) unless it is '-'.

    Returns ``{"scores", "ids", "sidecar", "entries", "clients", "reduce"}``."""
    files = [str(f) for f in files]
    if out != io.STDIO and not str(out).endswith(".npy"):
        raise InputError("--out must be NAME.npy or '-'", path=out)
    check_outputs([out], files, companions="scores")
    first, seen, entries, total, count = None, set(), [], None, 0
    for f in files:
        side, arr = _read_upload(f)
        side_path = artifacts.json_sidecar(f)
        if first is None:
            first = side
        else:
            if side["ids"] != first["ids"]:
                raise InputError(f"synthetic ids differ from {files[0]}", path=side_path,
                                 field="ids")
            for k in ("mode",) + MECHANISM_KEYS:
                a, b = side.get(k, side["params"].get(k)), first.get(k, first["params"].get(k))
                if a != b:
                    raise InputError(f"{k} is {a!r} here but {b!r} in {files[0]}: not shards of "
                                     "one round", path=side_path, field=k)
        dup = seen.intersection(side["clients"])
        if dup:
            raise InputError(f"client {sorted(dup)[0]!r} appears in more than one shard",
                             path=side_path, field="clients")
        seen.update(side["clients"])
        entries += [ledger.LedgerEntry.from_dict(e, path=side_path) for e in side["ledger"]]
        part = sum_rows(arr)
        if not np.isfinite(part).all():
            raise InputError("contains NaN or infinity", path=f)
        total = part if total is None else total + part
        count += len(side["clients"])

    params = first["params"]
    mode = first["mode"]
    side0 = artifacts.json_sidecar(files[0])
    if spec.threshold is not None and mode != "nn-histogram":  # as `popri score -H` refuses
        raise InputError(f"applies to --mode nn-histogram only (these uploads are {mode}: "
                         f"max(x - H, 0) would zero their scores)", path=files[0],
                         field="threshold")
    if params.get("reduce") not in (None, "mean", "sum"):
        raise InputError(f"must be mean or sum (got {params['reduce']!r})", path=side0,
                         field="params.reduce")
    if params.get("threshold") is not None:
        finite(params["threshold"], "params.threshold", lo=0, path=side0)
    if spec.expected_clients is None and params.get("sampling") == "poisson":
        finite(params.get("sample_rate"), "params.sample_rate", lo=0, hi=1, lo_open=True,
               path=side0)
    if params.get("public_clients") is not None:
        finite(params["public_clients"], "params.public_clients", lo=0, lo_open=True, path=side0)
    reduce = spec.reduce or params.get("reduce") or ("mean" if mode == "cosine" else "sum")
    threshold = spec.threshold
    if threshold is None and mode == "nn-histogram":
        threshold = params.get("threshold") or 0.0
    if spec.expected_clients is not None:
        denom = float(spec.expected_clients)  # a count the user declares public
    else:  # only a public count may divide the sum
        denom = public_denominator(mode, params.get("sampling"), params.get("sample_rate"),
                                   count, params.get("public_clients"))[1]
        if reduce == "mean" and denom is None:
            raise InputError("a mean needs a public client count (the number of uploads is "
                             "private under add/remove-one-client neighbours): give "
                             "--expected-clients N, or --reduce sum", path=files[0])
    if reduce == "mean" and not denom > 0:
        raise InputError("no clients to average over; give --expected-clients", path=files[0])
    scores = finish(total, reduce=reduce, denominator=denom or 1.0, threshold=threshold)
    entries = ledger.dedupe(entries)
    if any(e.mode == "release" for e in entries):
        raise InputError("per-client uploads are a research-mode simulation; release-mode scores "
                         "are aggregated inside 'popri score'", path=files[0], field="ledger")
    sidecar = {"ids": first["ids"], "mode": mode, "round": first.get("round", params.get("round")),
               "privacy_mode": "research",
               "params": {**params, "participating_clients": count, "reduce": reduce,
                          "denominator": denom if reduce == "mean" else None,
                          "public_clients": params.get("public_clients"),
                          "threshold": threshold, "aggregated_from": files},
               "ledger": [e.to_dict() for e in entries]}
    result = {"scores": scores, "ids": first["ids"], "sidecar": sidecar, "entries": entries,
              "clients": count, "reduce": reduce}
    if out == io.STDIO:  # printed by the caller; the release is already recorded with the inputs
        return result

    ledger.check_writable([out])  # a broken ledger fails before anything is written
    staged = io.AtomicOutputs()
    try:
        io.save_scores(out, scores, sidecar, out=staged)
        record([out], entries, staged)  # entries first (locked), then the outputs
    finally:
        staged.discard()
    log.info(f"aggregate: {count} clients from {len(files)} file(s), {reduce} -> {out}")
    return result
