"""One round of DP client feedback as a release: what ``popri score`` runs, callable from Python.

    popri score --mode cosine --private runs/priv.npy --synthetic runs/syn.npy \\
        --noise-multiplier 1.05 --clients-per-round 1000 --seed 0 --out runs/scores.npy

    >>> from popri.feedback.release import release_scores
    >>> r = release_scores("runs/priv.npy", "runs/syn.npy", noise_multiplier=1.05,
    ...                    out="runs/scores.npy")        # same files, same ledger entry as the CLI

The maths is :mod:`popri.feedback.scoring` (POPri, "Private Federated Learning using Preference-
Optimized Synthetic Data", arXiv:2504.16438, Algorithm 2; PrE-Text, arXiv:2406.02958,
Algorithm 2); the release protocol (streams, id, ledger under a lock, then commit) is
:mod:`popri.privacy.release`.

What a score file reveals.  Research mode records the seed (anyone with the sidecar can
regenerate the noise) and the exact client counts.  Release mode writes neither the seed nor
the exact counts N (clients) and L (participants), which are private under add/remove-one-client
neighbours.  In every mode the cosine mean divides only by a public count (see
:func:`public_denominator`); otherwise the noisy sum is written.  The ledger entry's sample rate is L/N for a
fixed L, so use Poisson sampling (--sample-rate) in release mode when N itself must stay private.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from popri.core import io, log
from popri.feedback import scoring
from popri.core.errors import InputError
from popri.privacy.release import Release

MODES = ("cosine", "nn-histogram")


def _empty(what: str, private: bool) -> str:
    return f"no {what} samples" + (": the client set is empty" if private else "")


def _records(path: str, split: str, what: str, need_client: bool):
    """JSONL / dataset-dir records (read once, so '-' works), checked non-empty."""
    from popri.models.embed import read_records

    recs, src = read_records(path, split)
    for i, r in enumerate(recs, start=1):
        if need_client and r.get("client_id") is None:
            raise InputError("missing required field (private data needs client ids)", path=src,
                             line=i, field="client_id")
    if not recs:
        raise InputError(_empty(what, need_client), path=src)
    return recs, src


def load_set(path: str, *, model, split, what: str, private: bool):
    """An embedding set from an .npy set, JSONL (texts or embedding rows), a dataset dir or '-'."""
    from popri.models.embed import as_embedding_set

    if path != io.STDIO and io.is_embedding_path(path):
        es = as_embedding_set(path, require_client=private, mmap=private)
        if len(es) == 0:
            raise InputError(_empty(what, private), path=path)
        return es
    recs, src = _records(path, split, what, private)
    return as_embedding_set(src, records=recs, model=model, require_client=private, what=what)


def fingerprint(es) -> str:
    """sha256 of an embedding set's vectors and ids (the release id depends on the data)."""
    src = es.source
    if src.endswith(".npy") and Path(src).is_file() and Path(io.sidecar_path(src)).is_file():
        return io.sha256_file(src) + io.sha256_file(io.sidecar_path(src))  # the files as they are
    h = hashlib.sha256(np.ascontiguousarray(es.embeddings, dtype=np.float32).tobytes())
    h.update(json.dumps([[r.get("id"), r.get("client_id")] for r in es.rows]).encode())
    return h.hexdigest()


def release_scores(private: str, synthetic: str, *, noise_multiplier: float,
                   mode: str = "cosine", clip: float | None = None,
                   sample_rate: float | None = None, clients_per_round: int | None = None,
                   seed: int = 0, standardize: bool | None = None,
                   max_samples_per_client: int | None = None, threshold: float | None = None,
                   out: str | None = None, per_client_out: str | None = None,
                   ledger_dir: str | None = None, model: str | None = None, split: str = "train",
                   delta: float = 3e-6, release: bool = False, round_: int = 0,
                   block_size: int | None = None, diagnostic: bool = False,
                   public_clients: int | None = None) -> dict[str, Any]:
    """Score ``synthetic`` with DP feedback from ``private``; write the outputs and the ledger.

    Returns ``{"scores", "ids", "entry" (a LedgerEntry or None), "participating", "clients"}``.
    Option defaults and checks are those of ``popri score`` (see its --help)."""
    from popri.core import validate
    from popri.models.embed import check_compatible

    validate.noise_multiplier(noise_multiplier)
    validate.delta(delta)
    if clip is not None:
        validate.clip(clip)
    if sample_rate is not None:
        validate.sample_rate(sample_rate)
    if threshold is not None:
        validate.finite(threshold, "--threshold", lo=0)
    if mode not in MODES:
        raise InputError(f"--mode must be one of {', '.join(MODES)} (got {mode!r})")
    if mode == "cosine":
        clip = 1.0 if clip is None else clip
        standardize = True if standardize is None else standardize
    else:
        max_samples_per_client = max_samples_per_client or 8
        threshold = 0.0 if threshold is None else threshold
    M = max_samples_per_client
    if not 0 < delta < 1:
        raise InputError(f"--delta must be in (0, 1) (got {delta})")
    secure = bool(release)
    if diagnostic:
        if secure:
            raise InputError("--diagnostic writes noise-free scores; it cannot be combined with "
                             "--release", field="--diagnostic")
        if noise_multiplier != 0:
            raise InputError("--diagnostic is for noise-free (z = 0) scores; a noisy output is a "
                             "release and must be recorded in a ledger", field="--diagnostic")
        if ledger_dir:
            raise InputError("--diagnostic records nothing: --ledger does not apply",
                             field="--ledger")
    if secure:
        if noise_multiplier == 0:
            raise InputError("--release with --noise-multiplier 0 would publish the exact "
                             "aggregate", field="--noise-multiplier")
        if per_client_out:
            raise InputError("--per-client-out is a research-mode simulation of the clients' "
                             "uploads; in release mode the noise is drawn once on the sum "
                             "(discrete Gaussian)", field="--per-client-out")
    if out == io.STDIO and not per_client_out and not ledger_dir and not diagnostic:
        raise InputError("--out - prints the scores; give --ledger DIR (or --per-client-out) so "
                         "the privacy spent is recorded")
    from popri.core.guard import check_outputs

    check_outputs([out, per_client_out], [private, synthetic], companions="scores")
    targets = [] if diagnostic else (
        [Path(ledger_dir) / "ledger.jsonl"] if ledger_dir
        else [f for f in (out, per_client_out) if f and f != io.STDIO])
    rel = Release("score", seed=None if secure else seed, secure=secure, ledgers=targets,
                  diagnostic=diagnostic)
    rel.check_ledgers()  # a broken ledger fails now, before anything is computed

    syn = load_set(synthetic, model=model, split=split, what="synthetic", private=False)
    priv = load_set(private, model=model, split=split, what="private", private=True)
    check_compatible(priv, syn)
    codes, clients = scoring.factorize(priv.client_ids())
    N = len(clients)
    if clients_per_round is not None and clients_per_round > N:
        raise InputError(f"--clients-per-round {clients_per_round} exceeds the {N} clients",
                         path=priv.source)
    sample = scoring.sample_clients(N, rel.rng("sampling"), sample_rate=sample_rate,
                                    clients_per_round=clients_per_round)
    keep = scoring.cap_per_client(codes, M, rel.rng("cap"))
    L, n = len(sample.members), len(syn)
    sens = float(clip) if mode == "cosine" else float(M)
    if noise_multiplier == 0 and not diagnostic:
        log.warn("--noise-multiplier 0: NO PRIVACY. The exact aggregate is released "
                 "(recorded in the ledger with noise_multiplier 0).")
    if L == 0:
        log.warn(f"Poisson sampling at q={sample.sample_rate} drew no client from {N}: the "
                 "output is pure noise, added by the server.")

    q = sample.sample_rate
    reduce, denom = public_denominator(mode, sample.sampling, q, L, public_clients)
    z_eff = noise_multiplier
    if secure:
        from popri.privacy.noise import effective_multiplier

        z_eff = effective_multiplier(noise_multiplier, sens, n)
    params = {
        "mode": mode, "round": round_, "noise_multiplier": noise_multiplier,
        "clip": clip if mode == "cosine" else None,
        "standardize": standardize if mode == "cosine" else None,
        "sample_rate": q, "clients_per_round": clients_per_round, "sampling": sample.sampling,
        "participating_clients": L, "total_clients": N, "max_samples_per_client": M,
        "threshold": threshold, "seed": seed, "release": secure, "delta": delta,
        "reduce": reduce, "denominator": denom, "public_clients": public_clients,
        "embedding_model": syn.meta.get("model") or priv.meta.get("model") or model,
    }
    layout = {"per_client_rows": bool(per_client_out), "block_size": block_size}
    entry = None
    if not diagnostic:
        entry = rel.entry(
            mechanism="subsampled_gaussian" if q < 1 else "gaussian",
            noise_multiplier=z_eff, sample_rate=q, steps=1, delta=delta, sensitivity=sens,
            sampling=sample.sampling,
            release_id=rel.release_id(fingerprint(priv), fingerprint(syn), params, layout),
            params=_public(params, secure) | (
                {"noise": "discrete-gaussian", "nominal_noise_multiplier": noise_multiplier}
                if secure else {"noise": "gaussian"}))
    shown = _public(params, secure)
    head = {"ids": syn.ids, "mode": mode, "round": round_, "privacy_mode": rel.mode,
            "params": shown}
    if diagnostic:
        head.update({"diagnostic": True, "private": False,
                     "note": "NOT PRIVATE: noise-free scores for diagnostics; never release"})

    noise_rng = rel.rng("noise")
    with rel:
        staged = rel.outputs
        rows_out = None
        if per_client_out:
            rows_out = io.open_memmap(staged.path(per_client_out, suffix=".npy"),
                                      dtype=np.float32, shape=(max(L, 1), n))
        common = dict(noise_rng=noise_rng, keep=keep, rows_out=rows_out, block=block_size,
                      source=priv.source)
        if mode == "cosine":
            total = scoring.cosine_round(priv.embeddings, codes, sample, syn.embeddings,
                                         noise_multiplier=noise_multiplier, clip=clip,
                                         standardize=standardize, **common)
        else:
            total = scoring.histogram_round(priv.embeddings, codes, sample, syn.embeddings,
                                            noise_multiplier=noise_multiplier, max_per_client=M,
                                            **common)
        scores = scoring.finish(total, reduce=reduce, denominator=denom or 1.0,
                                threshold=threshold)
        led = [entry.to_dict()] if entry else []
        if rows_out is not None:
            rows_out.flush()
            side = {**head, "kind": "per-client",
                    "clients": [clients[i] for i in sample.members],
                    "server_noise_rows": int(L == 0),
                    "noise_std_per_row": noise_multiplier * sens / np.sqrt(max(L, 1)),
                    "ledger": led}
            side_path = staged.path(io.score_sidecar_path(per_client_out))
            with open(side_path, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(side, ensure_ascii=False, indent=2, allow_nan=False) + "\n")
        if out and out != io.STDIO:
            io.save_scores(out, scores, {**head, "ledger": led}, out=staged)
        rel.commit([entry] if entry else [])
    if mode == "cosine" and reduce == "sum":
        log.info("score: cosine scores are the noisy SUM over clients: a mean would divide by "
                 "the client count, which is private under add/remove-one-client neighbours. "
                 "Give --clients-per-round L, or --public-clients N if the enrolled count is "
                 "public, for a mean; rankings are the same either way")
    if out == io.STDIO:
        io.write_jsonl(({"id": i, "score": float(s)} for i, s in zip(syn.ids, scores)), "-")
    log.info(f"score: {mode}, {L} of {N} clients, {n} synthetic samples, z={noise_multiplier}, "
             f"q={q:g}, {rel.mode} mode" + (f" -> {out}" if out and out != io.STDIO else "")
             + (" (DIAGNOSTIC: not private, no ledger entry)" if diagnostic else ""))
    if entry is not None and z_eff > 0:
        try:  # the accountant is optional here: the ledger entry is what counts
            from popri.privacy.accounting import epsilon
        except ImportError:
            pass
        else:
            log.info(f"score: this release alone is ({epsilon(z_eff, q, 1, delta):.4g}, "
                     f"{delta:g})-DP (rdp); 'popri account ledger' totals every round")
    return {"scores": scores, "ids": syn.ids, "entry": entry, "participating": L, "clients": N}


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
    if sampling == "fixed":
        return "mean", float(L)
    if public_clients:
        return "mean", float(q * public_clients if sampling == "poisson" else public_clients)
    return "sum", None


#: what release mode leaves out of every written file (private under add/remove-one-client)
PRIVATE_COUNTS = ("participating_clients", "total_clients", "denominator", "seed")


def _public(params: dict, secure: bool) -> dict:
    return {k: v for k, v in params.items() if not (secure and k in PRIVATE_COUNTS)}
