"""popri aggregate: the server's sum of per-client uploads (maths: popri/feedback/scoring.py).

    popri score ... --per-client-out runs/clients.npy
    popri aggregate runs/clients.npy --out runs/scores.npy
    popri aggregate shard0.npy shard1.npy --out runs/scores.npy --reduce sum --threshold 20
"""

from __future__ import annotations

from typing import List, Optional

import typer

HELP = """Sum per-client uploads (from 'popri score --per-client-out') into one score vector.

Several files are shards of the same round: they must have the same synthetic ids, mode, round and
mechanism parameters, and disjoint clients.  The default --reduce is what 'popri score' chose: a
cosine mean (POPri Algorithm 1 line 20) only over a PUBLIC count -- the fixed L of
--clients-per-round, or q*N / N from --public-clients -- else the sum (the number of uploads is
private under add/remove-one-client neighbours); --expected-clients N divides by a count you
declare public.  nn-histogram sums, then max(hist - H, 0) with the H recorded by 'popri score'
(PrE-Text Algorithm 2), unless --threshold is given.

No new privacy is spent: the output sidecar and the ledger.jsonl next to it get the SAME ledger
entries (same release_id, so 'popri account ledger' counts them once).  --out - prints JSONL
{"id", "score"} and writes no ledger (the release is already recorded next to the inputs)."""

MECHANISM_KEYS = ("round", "noise_multiplier", "clip", "standardize", "max_samples_per_client",
                  "sampling", "sample_rate", "total_clients")


def aggregate(
    files: List[str] = typer.Argument(..., help="CLIENTS.npy files (+ CLIENTS.json sidecars)."),
    out: str = typer.Option(..., "--out", "-o", help="SCORES.npy (+ SCORES.json), or '-'."),
    reduce: Optional[str] = typer.Option(
        None, "--reduce", help="mean or sum (default: cosine mean, nn-histogram sum)."),
    threshold: Optional[float] = typer.Option(
        None, "--threshold", "-H",
        help="Apply max(x - H, 0) after reducing (default: nn-histogram's recorded H; none for "
             "cosine)."),
    expected_clients: Optional[float] = typer.Option(
        None, "--expected-clients", min=0.0, help="Divide the mean by this count instead."),
) -> None:
    from pathlib import Path

    import numpy as np

    from popri.core import io, log
    from popri.privacy import ledger
    from popri.feedback import scoring
    from popri.core.errors import InputError

    if reduce not in (None, "mean", "sum"):
        raise InputError(f"--reduce must be mean or sum (got {reduce!r})")
    if out != "-" and not out.endswith(".npy"):
        raise InputError("--out must be NAME.npy or '-'", path=out)
    if expected_clients is not None and not expected_clients > 0:
        raise InputError("--expected-clients must be > 0")
    from popri.core.validate import finite, optional

    optional(threshold, "--threshold", lo=0)
    optional(expected_clients, "--expected-clients", lo=0, lo_open=True)
    from popri.core.guard import check_outputs

    check_outputs([out], files, companions="scores")
    first, seen, entries, total, count = None, set(), [], None, 0
    for f in files:
        side_path = io.score_sidecar_path(f)
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
        part = scoring.sum_rows(arr)
        if not np.isfinite(part).all():
            raise InputError("contains NaN or infinity", path=f)
        total = part if total is None else total + part
        count += len(side["clients"])

    params = first["params"]
    mode = first["mode"]
    side0 = io.score_sidecar_path(files[0])
    if params.get("reduce") not in (None, "mean", "sum"):
        raise InputError(f"must be mean or sum (got {params['reduce']!r})", path=side0,
                         field="params.reduce")
    if params.get("threshold") is not None:
        finite(params["threshold"], "params.threshold", lo=0, path=side0)
    if expected_clients is None and params.get("sampling") == "poisson":
        finite(params.get("sample_rate"), "params.sample_rate", lo=0, hi=1, lo_open=True,
               path=side0)
    if params.get("public_clients") is not None:
        finite(params["public_clients"], "params.public_clients", lo=0, lo_open=True, path=side0)
    reduce = reduce or params.get("reduce") or ("mean" if mode == "cosine" else "sum")
    if threshold is None and mode == "nn-histogram":
        threshold = params.get("threshold") or 0.0
    if expected_clients is not None:
        denom = float(expected_clients)  # a count the user declares public
    else:  # only a public count may divide the sum (popri.feedback.release.public_denominator)
        from popri.feedback.release import public_denominator

        denom = public_denominator(mode, params.get("sampling"), params.get("sample_rate"),
                                   count, params.get("public_clients"))[1]
        if reduce == "mean" and denom is None:
            raise InputError("a mean needs a public client count (the number of uploads is "
                             "private under add/remove-one-client neighbours): give "
                             "--expected-clients N, or --reduce sum", path=files[0])
    if reduce == "mean" and not denom > 0:
        raise InputError("no clients to average over; give --expected-clients", path=files[0])
    scores = scoring.finish(total, reduce=reduce, denominator=denom or 1.0,
                            threshold=threshold)
    entries = ledger.dedupe(entries)
    if any(e.mode == "release" for e in entries):
        raise InputError("per-client uploads are a research-mode simulation; release-mode scores "
                         "are aggregated inside 'popri score'", path=files[0], field="ledger")
    sidecar = {"ids": first["ids"], "mode": mode, "round": first.get("round", params.get("round")),
               "privacy_mode": "research",
               "params": {**params, "participating_clients": count, "reduce": reduce,
                          "denominator": denom if reduce == "mean" else None,
                          "public_clients": params.get("public_clients"),
                          "threshold": threshold, "aggregated_from": [str(f) for f in files]},
               "ledger": [e.to_dict() for e in entries]}
    if out == "-":
        io.write_jsonl(({"id": i, "score": float(s)} for i, s in zip(first["ids"], scores)), "-")
        return
    from popri.privacy.release import record

    ledger.check_writable([out])  # a broken ledger fails before anything is written
    staged = io.AtomicOutputs()
    try:
        io.save_scores(out, scores, sidecar, out=staged)
        record([out], entries, staged)  # entries first (locked), then the outputs
    finally:
        staged.discard()
    log.info(f"aggregate: {count} clients from {len(files)} file(s), {reduce} -> {out}")


def _unwrap(text: str) -> str:
    """One line per paragraph, so the terminal (rich) does the wrapping."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def register(app: typer.Typer) -> None:
    app.command("aggregate", help=_unwrap(HELP))(aggregate)
