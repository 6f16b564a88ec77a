"""The statistics of popri's utility comparisons: per-client accuracy tables, the paired bootstrap
over test clients, the gap closed, and the paired difference against a control.

    popri eval gap --method M.clients.jsonl --eps0 E0.clients.jsonl --epsinf EI.clients.jsonl
    popri eval diff --method M.clients.jsonl --control T0.clients.jsonl
    python -m pytest -q tests/test_downstream.py -k "bootstrap or gap or control"

Every comparison is paired on the same test clients: a bootstrap replicate resamples the clients
(multinomial weights), and each method's micro accuracy is recomputed on the same replicate
(POPri, "Private Federated Learning using Preference-Optimized Synthetic Data", arXiv:2504.16438,
section 5, reports accuracy over test clients; the gap closed, (acc - acc_eps0) / (acc_epsinf -
acc_eps0), and its interval are popri's).  The training and next-token evaluation that write
the per-client tables are :mod:`popri.eval.downstream`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from popri.core.errors import InputError
from popri.core.io import iter_jsonl

PER_CLIENT_FIELDS = ("client_id", "tokens", "correct", "loss_sum")
#: draws of both synthetic sets a verdict needs (``popri report``, the run's learning line): the
#: 95% t interval between draws, n - 1 >= 2 degrees of freedom, as the learning study's rule
#: (docs/results.md).  One draw's interval over test clients leaves out the randomness of
#: generation and training (issue 43: two machines' single draws gave disjoint intervals).
MIN_DRAWS = 3


def per_client_table(clients: Sequence[str], tok_n, hit_n, ce_n) -> list[dict]:
    """Sums per client, in order of first appearance."""
    acc: dict[str, list] = {}
    for c, a, b, l in zip(clients, tok_n, hit_n, ce_n):
        row = acc.setdefault(c, [0, 0, 0.0, 0])
        row[0] += int(a)
        row[1] += int(b)
        row[2] += float(l)
        row[3] += 1
    return [{"client_id": c, "tokens": v[0], "correct": v[1], "loss_sum": v[2], "sequences": v[3]}
            for c, v in acc.items()]


def macro_accuracy(per: Sequence[dict]) -> float | None:
    accs = [r["correct"] / r["tokens"] for r in per if r["tokens"] > 0]
    return float(np.mean(accs)) if accs else None


# --------------------------------------------------------------------------- bootstrap & gap
def replicate_weights(n_clients: int, n_boot: int, seed: int, chunk: int = 200):
    """Yield [b, n_clients] multiplicities of a client bootstrap (resampling with replacement)."""
    rng = np.random.default_rng(seed)
    p = np.full(n_clients, 1.0 / n_clients)
    done = 0
    while done < n_boot:
        b = min(chunk, n_boot - done)
        yield rng.multinomial(n_clients, p, size=b).astype(np.float64)
        done += b


def paired_bootstrap(tables: Sequence[Sequence[dict]], statistic: Callable[..., float], *,
                     n_boot: int = 1000, seed: int = 0) -> dict:
    """Bootstrap over clients shared by every table, the same resample for all (paired).

    ``tables``: per-client rows (client_id, tokens, correct) of each model on the same test
    clients.  ``statistic(acc_1, ..., acc_k)`` maps the micro accuracies to a number.  Returns
    {"value", "se", "ci_low", "ci_high", "clients", "n_boot"} (percentile 95% interval)."""
    keyed = []
    for t in tables:
        d = {}
        for r in t:
            d[str(r["client_id"])] = (float(r["tokens"]), float(r["correct"]))
        keyed.append(d)
    common = sorted(set.intersection(*(set(d) for d in keyed)))
    if len(common) < 2:
        raise InputError(f"need at least 2 common clients for a paired bootstrap, got {len(common)}")
    toks = [np.array([d[c][0] for c in common]) for d in keyed]
    hits = [np.array([d[c][1] for c in common]) for d in keyed]
    value = statistic(*[h.sum() / t.sum() for h, t in zip(hits, toks)])
    reps = []
    for w in replicate_weights(len(common), n_boot, seed):
        with np.errstate(divide="ignore", invalid="ignore"):
            accs = [(w @ h) / (w @ t) for h, t in zip(hits, toks)]
            reps.append(np.array([statistic(*a) for a in zip(*accs)], dtype=np.float64))
    reps = np.concatenate(reps) if reps else np.zeros(0)
    reps = reps[np.isfinite(reps)]
    if len(reps) < 2:
        return {"value": float(value), "se": None, "ci_low": None, "ci_high": None,
                "clients": len(common), "n_boot": int(n_boot)}
    return {"value": float(value), "se": float(reps.std(ddof=1)),
            "ci_low": float(np.percentile(reps, 2.5)), "ci_high": float(np.percentile(reps, 97.5)),
            "clients": len(common), "n_boot": int(n_boot)}


def bootstrap_se(per: Sequence[dict], n_boot: int = 1000, seed: int = 0) -> float | None:
    """Standard error of the micro accuracy under a bootstrap over clients."""
    per = [r for r in per]
    if len(per) < 2 or n_boot < 2:
        return None
    return paired_bootstrap([per], lambda a: a, n_boot=n_boot, seed=seed)["se"]


def gap_closed(acc: float, acc_eps0: float, acc_epsinf: float) -> float:
    """(acc - acc_eps0) / (acc_epsinf - acc_eps0): the share of the gap between the fully private
    (eps=0, no private data) and the non-private (eps=inf) model that a method closes (POPri
    abstract, section 5.2, Table 1)."""
    den = acc_epsinf - acc_eps0
    if den == 0:
        return float("nan")
    return (acc - acc_eps0) / den


def read_per_client(path: str) -> list[dict]:
    """Rows written by ``popri eval accuracy --per-client-out`` (validated, ids unique)."""
    rows, seen = [], set()
    for i, r in enumerate(iter_jsonl(path, required=PER_CLIENT_FIELDS[:3]), start=1):
        for f in ("tokens", "correct"):
            v = r[f]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise InputError("must be a non-negative number", path=path, line=i, field=f)
        if r["correct"] > r["tokens"]:
            raise InputError("exceeds 'tokens'", path=path, line=i, field="correct")
        cid = str(r["client_id"])
        if cid in seen:
            raise InputError(f"duplicate client {cid!r}", path=path, line=i, field="client_id")
        seen.add(cid)
        rows.append(r)
    if not rows:
        raise InputError("no per-client rows", path=path)
    return rows


def micro_accuracy(rows: Sequence[dict]) -> float:
    t = sum(float(r["tokens"]) for r in rows)
    return sum(float(r["correct"]) for r in rows) / t if t else float("nan")


def control_diff(method: str, control: str, *, n_boot: int = 1000, seed: int = 0) -> dict:
    """The method minus its control (e.g. POPri minus the untuned generator's T = 0 row: what
    the DP feedback and the tuning bought), paired over the same test clients."""
    tabs = [read_per_client(p) for p in (method, control)]
    if {str(r["client_id"]) for r in tabs[0]} != {str(r["client_id"]) for r in tabs[1]}:
        raise InputError("the control's per-client file covers other test clients", path=control,
                         field="client_id")
    d = paired_bootstrap(tabs, lambda a, c: a - c, n_boot=n_boot, seed=seed)
    return {"acc_control": micro_accuracy(tabs[1]), "acc_minus_control": d["value"],
            "acc_minus_control_se": d["se"],
            "acc_minus_control_ci": [d["ci_low"], d["ci_high"]]}


def gap_from_files(method: str, eps0: str, epsinf: str, *, n_boot: int = 1000, seed: int = 0,
                   allow_undefined: bool = False, control: str | None = None) -> dict:
    """Gap closed on the clients common to three per-client files, with a paired bootstrap SE.
    When eps=0 and eps=inf score the same the gap is undefined: an error, or with
    ``allow_undefined`` a result whose ``gap_closed`` is None and ``undefined`` says why.
    ``control``: a fourth per-client file (the method's control, e.g. its T = 0 row): its own
    gap closed and the method minus the control (:func:`control_diff`) are added."""
    res = gap_from_paths(method, eps0, epsinf, n_boot=n_boot, seed=seed,
                          allow_undefined=allow_undefined)
    if control is not None:
        res["control"] = gap_from_paths(control, eps0, epsinf, n_boot=n_boot, seed=seed,
                                         allow_undefined=allow_undefined)
        res.update(control_diff(method, control, n_boot=n_boot, seed=seed))
    return res


def gap_from_paths(method: str, eps0: str, epsinf: str, *, n_boot: int = 1000, seed: int = 0,
                    allow_undefined: bool = False) -> dict:
    tabs = [read_per_client(p) for p in (method, eps0, epsinf)]
    ids = [{str(r["client_id"]) for r in t} for t in tabs]
    if not (ids[0] == ids[1] == ids[2]):
        raise InputError("per-client files cover different test clients (a paired comparison needs "
                         f"the same ones): {len(ids[0])}, {len(ids[1])}, {len(ids[2])} clients",
                         path=method, field="client_id")
    accs = [micro_accuracy(t) for t in tabs]
    if accs[2] == accs[1]:
        why = "eps=inf and eps=0 accuracies are equal: the gap is undefined"
        if not allow_undefined:
            raise InputError(why, path=epsinf)
        diff = paired_bootstrap(tabs[:2], lambda a, z: a - z, n_boot=n_boot, seed=seed)
        return {"gap_closed": None, "gap_closed_se": None, "gap_closed_ci": None, "undefined": why,
                "acc": accs[0], "acc_eps0": accs[1], "acc_epsinf": accs[2],
                "acc_minus_eps0": diff["value"], "acc_minus_eps0_se": diff["se"],
                "clients": diff["clients"], "bootstrap": int(n_boot), "seed": int(seed)}
    b = paired_bootstrap(tabs, gap_closed, n_boot=n_boot, seed=seed)
    diff = paired_bootstrap(tabs[:2], lambda a, z: a - z, n_boot=n_boot, seed=seed)
    return {"gap_closed": b["value"], "gap_closed_se": b["se"], "gap_closed_ci": [b["ci_low"], b["ci_high"]],
            "acc": accs[0], "acc_eps0": accs[1], "acc_epsinf": accs[2],
            "acc_minus_eps0": diff["value"], "acc_minus_eps0_se": diff["se"],
            "clients": b["clients"], "bootstrap": int(n_boot), "seed": int(seed)}
