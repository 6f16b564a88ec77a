"""One round of DP client feedback as a release: what ``popri score`` runs, callable from Python.

    popri score --mode cosine --private runs/priv.npy --synthetic runs/syn.npy \\
        --noise-multiplier 1.05 --clients-per-round 1000 --seed 0 --out runs/scores.npy

    >>> from popri.feedback.release import release_scores
    >>> from popri.specs.feedback import ScoreSpec
    >>> spec = ScoreSpec(noise_multiplier=1.05, clients_per_round=1000)
    >>> r = release_scores("runs/priv.npy", "runs/syn.npy", spec,
    ...                    out="runs/scores.npy")        # same files, same ledger entry as the CLI
    >>> r = release_scores("runs/priv.npy", "runs/syn.npy", noise_multiplier=1.05,
    ...                    out="runs/s2.npy")            # or the spec's fields as keywords

The maths is the client side in :mod:`popri.feedback.cosine` (POPri, "Private Federated Learning
using Preference-Optimized Synthetic Data", arXiv:2504.16438, section 4.1, Algorithm 1) and
:mod:`popri.feedback.histogram` (PrE-Text, "PrE-Text: Training Language Models on Private
Federated Data in the Age of LLMs", arXiv:2406.02958, section 3, Algorithm 1), the participants
in :mod:`popri.federated.participation` and the noisy sum in :mod:`popri.federated.aggregation`;
the release protocol (streams, id, ledger under a lock, then commit) is
:mod:`popri.privacy.release`.

What a score file reveals. Research mode records the seed (anyone with the sidecar can regenerate
the noise) and the exact client counts. Release mode writes neither the seed nor the exact counts N
(clients) and L (participants), which are private under add/remove-one-client neighbours. In every
mode the cosine mean divides only by a public count (see
:func:`~popri.federated.aggregation.public_denominator`); otherwise the noisy sum is written. The
ledger entry's sample rate is L/N for a fixed L, so use Poisson sampling (--sample-rate) in release
mode when N itself must stay private.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from popri.core import artifacts, io, log
from popri.core.errors import InputError
from popri.core.guard import check_outputs as guard
from popri.data.records import read_records
from popri.federated import aggregation, participation
from popri.federated.aggregation import public_denominator  # noqa: F401  (re-exported)
from popri.federated.flower import engine
from popri.feedback import cosine, coverage, histogram
from popri.models.embed import as_embedding_set, check_compatible
from popri.privacy import ddg
from popri.privacy.accounting import ParameterError, compose
from popri.privacy.plan import Noise
from popri.privacy.release import Release
from popri.specs.feedback import ScoreSpec


def _empty(what: str, private: bool) -> str:
    return f"no {what} samples" + (": the client set is empty" if private else "")


def _records(path: str, split: str, what: str, need_client: bool):
    """JSONL / dataset-dir records (read once, so '-' works), checked non-empty."""
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
    if path != io.STDIO and io.is_embedding_path(path):
        es = as_embedding_set(path, require_client=private, mmap=private)
        if len(es) == 0:
            raise InputError(_empty(what, private), path=path)
        return es
    recs, src = _records(path, split, what, private)
    return as_embedding_set(src, records=recs, model=model, require_client=private, what=what)


def fingerprint(es) -> str:
    """sha256 of an embedding set's vectors and ids (the release id depends on the data): the
    files as they are for a saved ``.npy`` set with its sidecar, else the float32 vectors and
    every row's (id, client id)."""
    src = es.source
    side = artifacts.sidecar_path(src)
    if src.endswith(".npy") and Path(src).is_file() and Path(side).is_file():
        return artifacts.file_digest(src) + artifacts.file_digest(side)
    return artifacts.array_digest(
        np.asarray(es.embeddings, dtype=np.float32),
        keys=(json.dumps([r.get("id"), r.get("client_id")]) for r in es.rows))


def check_outputs(out: str | None, per_client_out: str | None, ledger_dir: str | None,
                  private: str, synthetic: str, spec: ScoreSpec) -> None:
    """The output options of a score release (names, combinations), before anything is read."""
    if not out and not per_client_out:
        raise InputError("nothing to write: give --out and/or --per-client-out")
    if out and out != io.STDIO and not str(out).endswith(".npy"):
        raise InputError("--out must be NAME.npy or '-'", path=out)
    if per_client_out and not str(per_client_out).endswith(".npy"):
        raise InputError("--per-client-out must be NAME.npy", path=per_client_out)
    if spec.federation is not None and private:
        raise InputError("a Flower deployment round reads no private data here: it stays on the "
                         "SuperNodes (drop --private)", field="--private")
    if spec.federation is None and not private:
        raise InputError("required: the private data", field="--private")
    if private == io.STDIO and synthetic == io.STDIO:
        raise InputError("only one of --private / --synthetic can be '-' (stdin)")
    if spec.diagnostic and ledger_dir:
        raise InputError("--diagnostic records nothing: --ledger does not apply",
                         field="--ledger")
    if spec.release and per_client_out:
        raise InputError("--per-client-out is a research-mode simulation of the clients' "
                         "uploads; in release mode the noise is drawn once on the sum "
                         "(discrete Gaussian)", field="--per-client-out")
    if spec.flower and per_client_out:
        raise InputError("--per-client-out writes every client's upload; with --engine flower "
                         "the server only ever sees the secure sum", field="--per-client-out")
    if out == io.STDIO and not per_client_out and not ledger_dir and not spec.diagnostic:
        raise InputError("--out - prints the scores; give --ledger DIR (or --per-client-out) so "
                         "the privacy spent is recorded")

    guard([out, per_client_out], [private, synthetic], companions="scores")


def _flower_release(priv, syn, codes, clients, part, keep, spec: ScoreSpec, *, mode: str,
                    noise_multiplier: float, sens: float, seed: int, round_: int, secure: bool,
                    out, ledger_dir, params: dict, layout: dict):
    """The round on Flower (``--engine flower``): its result, the release's params and noise
    params, and the realised DDG plan's ledger params when the engine's mechanism is the
    distributed discrete Gaussian (``layout`` gains the engine's shape)."""
    ddg_params = None
    flower = _flower_round(priv, syn, codes, clients, part, keep, spec, mode=mode,
                           noise_multiplier=noise_multiplier, sens=sens, seed=seed,
                           round_=round_, secure=secure, out=out, ledger_dir=ledger_dir)
    layout["engine"] = {"engine": "flower", "supernodes": flower.nodes,
                        "secagg_mechanism": spec.secagg_mechanism,
                        "max_dropout": spec.max_dropout}
    # release mode: the engine's realised shape (nodes = min(S, L), survivors, the plan
    # sized by L, its quantisation bound) follows the private participant count
    params = params | {"engine": {"engine": "flower", "supernodes_requested":
                                  spec.supernodes, "secagg_mechanism":
                                  spec.secagg_mechanism} if secure else flower.params()}
    noise_params = {"noise": spec.secagg_mechanism, "nominal_noise_multiplier":
                    noise_multiplier, "secagg": "flower SecAgg+"}
    if spec.mechanism() == "distributed_discrete_gaussian":
        ddg_params = ddg.ledger_params(ddg.DDGPlan.from_dict(flower.ddg), flower.survivors,
                                       release=secure)
    for note in ([] if secure else flower.notes):
        log.warn(f"score: {note}")
    return flower, params, noise_params, ddg_params


def _clients(spec: ScoreSpec, private: str, syn, *, model: str | None, split: str):
    """(the private set, each row's client code, the client ids); on a Flower deployment the
    private data stay on the SuperNodes, one client each: (None, None, their names)."""
    if spec.federation is not None:
        return None, None, [f"supernode-{i}" for i in range(int(spec.supernodes))]
    priv = load_set(private, model=model, split=split, what="private", private=True)
    check_compatible(priv, syn)
    codes, clients = participation.factorize(priv.client_ids())
    return priv, codes, clients


def _warn(spec: ScoreSpec, part, L: int, N: int) -> None:
    """Warnings before the round: no noise (and not a diagnostic); an empty Poisson sample
    (research mode only: release mode says nothing about the realised sample)."""
    if spec.noise_multiplier == 0 and not spec.diagnostic:
        log.warn("--noise-multiplier 0: NO PRIVACY. The exact aggregate is released "
                 "(recorded in the ledger with noise_multiplier 0).")
    if L == 0 and not spec.release:
        log.warn(f"Poisson sampling at q={part.sample_rate} drew no client from {N}: the "
                 "output is pure noise, added by the server.")


def _per_client_sidecar(path, side: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(side, ensure_ascii=False, indent=2, allow_nan=False) + "\n")


def _params(spec: ScoreSpec, part, noise: Noise, *, round_: int, L: int, N: int, seed: int,
            reduce: str, denom, model: str | None) -> dict:
    """The release's parameters, as its sidecar and ledger entry record them (release mode
    shows only the public ones: :func:`_public`)."""
    cosine_mode = spec.mode == "cosine"
    return {
        "mode": spec.mode, "round": round_, "noise_multiplier": spec.noise_multiplier,
        "clip": spec.clip if cosine_mode else None,
        "standardize": spec.standardize if cosine_mode else None,
        "sample_rate": part.sample_rate, "clients_per_round": spec.clients_per_round,
        "sampling": part.sampling, "neighbouring": noise.relation,
        "sensitivity": noise.sensitivity,
        **({"convention": spec.convention} if spec.convention else {}),
        "participating_clients": L, "total_clients": N,
        "max_samples_per_client": spec.max_samples_per_client, "threshold": spec.threshold,
        "seed": seed, "release": spec.release, "delta": spec.delta, "reduce": reduce,
        "denominator": denom, "public_clients": spec.public_clients, "embedding_model": model,
    }


def _log_release(spec: ScoreSpec, rel: Release, flower, part, entry, *, reduce: str, L: int,
                 N: int, n: int, out: str | None, z_eff: float) -> None:
    """The release's log lines (stderr): how a cosine sum is read, the Flower round, who took
    part (in release mode neither N nor the realised L: private under add/remove), and the
    release's own epsilon."""
    mode, noise_multiplier, delta = spec.mode, spec.noise_multiplier, spec.delta
    diagnostic, secure, q = spec.diagnostic, spec.release, part.sample_rate
    if mode == "cosine" and reduce == "sum":
        log.info("score: cosine scores are the noisy SUM over clients: a mean would divide by "
                 "the client count, which is private under add/remove-one-client neighbours. "
                 "Give --clients-per-round L, or --public-clients N if the enrolled count is "
                 "public, for a mean; rankings are the same either way")
    if flower is not None and not secure:
        log.info(f"score: Flower SecAgg+ ({spec.secagg_mechanism}): {flower.survivors} of "
                 f"{flower.nodes} SuperNodes, {flower.seconds:.1f} s (round "
                 f"{flower.round_seconds:.1f} s), quantisation bound "
                 f"{flower.quantisation_bound:.3g} per score")
    # release mode: neither N nor the realised L (private under add/remove-one-client)
    who = f"{L} of {N} clients" if not secure else (
        f"{spec.clients_per_round} clients per round" if part.sampling == "fixed" else
        f"Poisson sample at q={q:g}" if part.sampling == "poisson" else "every client")
    log.info(f"score: {mode}, {who}, {n} synthetic samples, z={noise_multiplier}, "
             f"q={q:g}, {rel.mode} mode" + (f" -> {out}" if out and out != io.STDIO else "")
             + (" (DIAGNOSTIC: not private, no ledger entry)" if diagnostic else ""))
    if entry is not None and z_eff > 0:
        try:
            c = compose([entry], delta, "rdp", convention=spec.convention)
        except ParameterError as e:  # e.g. an unproven pair: the total will say so too
            log.warn(f"score: this release cannot be accounted: {e.message}")
        else:
            log.info(f"score: this release alone is ({c.epsilon:.4g}, {delta:g}) (rdp; "
                     f"{c.label}); 'popri account ledger' totals every round")


def _unique_ids(syn) -> None:
    """Refuse synthetic samples whose ids repeat (hostile case P06, issue 66): their scores
    could not be told apart downstream, so no release is spent on them."""
    seen: dict = {}
    for i, sid in enumerate(syn.ids, start=1):
        if sid in seen:
            raise InputError(f"id {sid!r} appears twice (rows {seen[sid]} and {i}): the "
                             "scores of one id could not be told apart downstream",
                             path=artifacts.sidecar_path(syn.source)
                             if syn.source.endswith(".npy") else syn.source, line=i, field="id")
        seen[sid] = i


def release_scores(private: str, synthetic: str, spec: ScoreSpec | None = None, *,
                   out: str | None = None, per_client_out: str | None = None,
                   ledger_dir: str | None = None, seed: int = 0, round_: int = 0,
                   model: str | None = None, split: str = "train",
                   **settings: Any) -> dict[str, Any]:
    """Score ``synthetic`` with DP feedback from ``private``; write the outputs and the ledger.

    ``spec``: the settings (:class:`~popri.specs.feedback.ScoreSpec`); the spec's fields may
    also be given as keywords (``noise_multiplier=1.0, sample_rate=0.5``), on their own or
    replacing the spec's.  ``seed`` seeds the sampling, cap and noise streams in research mode;
    ``round_`` is recorded; ``model`` embeds text inputs; ``split`` picks a dataset dir's split.

    Returns ``{"scores", "ids", "entry" (a LedgerEntry or None), "participating", "clients"}``.
    Printing ``--out -`` is the caller's (``popri score``)."""
    spec = ScoreSpec(**settings) if spec is None else spec.replace(**settings) if settings else spec
    if spec.noise_multiplier is None:
        raise InputError("required: the noise multiplier Z", field="--noise-multiplier")
    mode, noise_multiplier, delta = spec.mode, spec.noise_multiplier, spec.delta
    threshold = spec.threshold
    M, diagnostic, secure = spec.max_samples_per_client, spec.diagnostic, spec.release
    check_outputs(out, per_client_out, ledger_dir, private, synthetic, spec)
    targets = [] if diagnostic else (
        [Path(ledger_dir) / "ledger.jsonl"] if ledger_dir
        else [f for f in (out, per_client_out) if f and f != io.STDIO])
    rel = Release("score", seed=None if secure else seed, secure=secure, ledgers=targets,
                  diagnostic=diagnostic)
    rel.check_ledgers()  # a broken ledger fails now, before anything is computed

    syn = load_set(synthetic, model=model, split=split, what="synthetic", private=False)
    _unique_ids(syn)  # before any budget is spent (hostile case P06)
    # coverage ranks the candidates of each prompt: their groups, checked before any budget
    groups = coverage.groups_of(syn.rows, syn.source) if mode == "coverage" else None
    deployed = spec.federation is not None
    priv, codes, clients = _clients(spec, private, syn, model=model, split=split)
    N = len(clients)
    if spec.clients_per_round is not None and spec.clients_per_round > N:
        raise InputError(f"--clients-per-round {spec.clients_per_round} exceeds the {N} clients",
                         path=priv.source)
    part = participation.sample_clients(N, rel.rng("sampling"), sample_rate=spec.sample_rate,
                                        clients_per_round=spec.clients_per_round)
    keep = None if deployed else participation.cap_per_client(codes, M, rel.rng("cap"))
    L, n = len(part.members), len(syn)
    # the relation this sampling is accounted under, and the sum's sensitivity under it: the
    # noise std is z times it (fixed L of N: replace one client, 2C; popri.privacy.relations)
    # -- the round's Noise, as the budget of popri run plans it (popri.privacy.plan)
    noise = Noise.of_round(noise_multiplier, sample_rate=part.sample_rate,
                           sampling=part.sampling, spec=spec, mode=rel.mode)
    sens = noise.sensitivity
    _warn(spec, part, L, N)

    q = part.sample_rate
    reduce, denom = public_denominator(mode, part.sampling, q, L, spec.public_clients)
    z_eff = noise_multiplier  # release mode's discrete Gaussian keeps z (popri.privacy.noise)
    params = _params(spec, part, noise, round_=round_, L=L, N=N, seed=seed, reduce=reduce,
                     denom=denom, model=syn.meta.get("model")
                     or (priv.meta.get("model") if priv else None) or model)
    layout = {"per_client_rows": bool(per_client_out), "block_size": spec.block_size}
    noise_params = {"noise": "discrete-gaussian" if secure else "gaussian"}
    flower = ddg_params = None
    if spec.flower:
        flower, params, noise_params, ddg_params = _flower_release(
            priv, syn, codes, clients, part, keep, spec, mode=mode,
            noise_multiplier=noise_multiplier, sens=sens, seed=seed, round_=round_,
            secure=secure, out=out, ledger_dir=ledger_dir, params=params, layout=layout)
        z_eff = flower.noise_multiplier
    entry = None
    if not diagnostic:
        # the engine's mechanism, by the one entry function the budget plans with, at the
        # noise multiplier this release guarantees
        entry = noise.replace(z=z_eff).entry(
            spec, "score", delta=delta, ddg=ddg_params,
            release_id=rel.release_id(
                fingerprint(priv) if priv is not None else f"flower:{spec.federation}",
                fingerprint(syn), params, layout),
            params=_public(params, secure) | noise_params)
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
        if flower is not None:
            total = flower.total
        else:
            # the clients' bounded vectors, then the noise at the z this stage was given, for
            # the sum's sensitivity under the round's relation (noise.sensitivity)
            total = aggregation.noisy_sum(_terms(spec, priv, codes, part, syn, keep, groups), noise_multiplier=noise_multiplier,
                                          sensitivity=sens, noise_rng=noise_rng,
                                          rows_out=rows_out, block=spec.block_size)
        scores = aggregation.finish(total, reduce=reduce, denominator=denom or 1.0,
                                    threshold=threshold)
        led = [entry.to_dict()] if entry else []
        if rows_out is not None:
            rows_out.flush()
            _per_client_sidecar(staged.path(artifacts.json_sidecar(per_client_out)), {
                **head, "kind": "per-client", "clients": [clients[i] for i in part.members],
                "server_noise_rows": int(L == 0),
                "noise_std_per_row": noise_multiplier * sens / np.sqrt(max(L, 1)),
                "ledger": led})
        if out and out != io.STDIO:
            io.save_scores(out, scores, {**head, "ledger": led}, out=staged)
        rel.commit([entry] if entry else [])
    _log_release(spec, rel, flower, part, entry, reduce=reduce, L=L, N=N, n=n, out=out,
                 z_eff=z_eff)
    return {"scores": scores, "ids": syn.ids, "entry": entry, "participating": L, "clients": N}


def _terms(spec: ScoreSpec, priv, codes, part, syn, keep, groups):
    """The participants' bounded vectors of the spec's mode, before the noise."""
    src = priv.source if priv else ""
    if spec.mode == "cosine":
        return cosine.contributions(priv.embeddings, codes, part, syn.embeddings,
                                    clip=spec.clip, standardize=spec.standardize, keep=keep,
                                    source=src)
    if spec.mode == "coverage":
        return coverage.contributions(priv.embeddings, codes, part, syn.embeddings, groups,
                                      keep=keep, source=src)
    return histogram.contributions(priv.embeddings, codes, part, syn.embeddings, keep=keep,
                                   source=src)


def _flower_round(priv, syn, codes, clients, part, keep, spec, *, mode, noise_multiplier, sens,
                  seed, round_, secure, out, ledger_dir):
    """The round's secure sum on Flower (:mod:`popri.federated.flower.engine`), its private job
    directory next to the output (removed on every exit path)."""
    engine.require_flower()
    where = (Path(out).parent if out and out != io.STDIO else
             Path(ledger_dir) if ledger_dir else Path("."))
    with engine.job_dir(where) as job:
        return engine.run_round(
            mode=mode, emb=priv.embeddings if priv else None, codes=codes, clients=clients,
            part=part, keep=keep,
            syn=np.asarray(syn.embeddings), spec=spec, noise_multiplier=noise_multiplier,
            sensitivity=sens, seed=seed, round_=round_, job=job,
            meta=priv.meta if priv else dict(syn.meta),
            release=secure)


#: what release mode leaves out of every written file (private under add/remove-one-client)
PRIVATE_COUNTS = ("participating_clients", "total_clients", "denominator", "seed")


def _public(params: dict, secure: bool) -> dict:
    return {k: v for k, v in params.items() if not (secure and k in PRIVATE_COUNTS)}
