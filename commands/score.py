"""popri score: one round of DP client feedback on synthetic samples (maths: popri_cli/scoring.py).

    popri score --mode cosine --private runs/priv.npy --synthetic runs/syn.npy \\
        --noise-multiplier 1.05 --clients-per-round 1000 --seed 0 --out runs/scores.npy
    popri embed syn.jsonl --out - | popri score --synthetic - --private data/sotu \\
        --noise-multiplier 1 --seed 0 --out runs/scores.npy
"""

from __future__ import annotations

from typing import Optional

import typer

MODES = ("cosine", "nn-histogram")

HELP = """Score synthetic samples with DP feedback from private clients (one round).

cosine (POPri, ICML 2025, Algorithm 2): each participating client scores every synthetic sample by
the mean cosine similarity to its private samples, z-scores its vector (--standardize, as the
POPri reference code does), clips it to L2 norm C (--clip, default 1: POPri section 3.1) and adds
N(0, Z^2 C^2 / L); the output is the MEAN over clients (divided by q*N under Poisson sampling,
else by L).

nn-histogram (PrE-Text / Private Evolution, Algorithm 2 "Histogram"): each private sample (at most
M per client, --max-samples-per-client, default 8 as PrE-Text) votes for its nearest synthetic
sample (L2, faiss); noise N(0, Z^2 M^2) on the SUM, then max(hist - H, 0) (--threshold). Lookahead
(PrE-Text): pass the embedding set of the lookahead means as --synthetic.

Without --per-client-out the noise is drawn once on the sum, N(0, Z^2 s^2) (s = C or M), which is
distributed exactly as the sum of the L per-client draws.  With --per-client-out every client's
noised upload is written ([L, n_syn] float32; sum them with 'popri aggregate').

Outputs: SCORES.npy (float32, row-aligned with the synthetic ids) + SCORES.json (ids, mode, round,
params, ledger entry); the ledger entry is also appended to ledger.jsonl next to the output. --out
- prints JSONL {"id", "score"} on stdout; the ledger then goes next to --per-client-out or into
--ledger DIR (one of them is required).  Default delta 3e-6 (POPri B.1, PrE-Text)."""


def score(
    private: str = typer.Option(
        ..., "--private",
        help="Private data: a federated dataset directory (its --split), JSONL with 'client_id' "
             "and 'text' (or 'embedding'), or an embedding set NAME.npy whose sidecar has "
             "'client_id'."),
    synthetic: str = typer.Option(
        ..., "--synthetic",
        help="Synthetic samples: JSONL with 'text' (or 'embedding' rows, e.g. from 'popri embed "
             "--out -'), an embedding set NAME.npy, or '-' for stdin."),
    noise_multiplier: float = typer.Option(
        ..., "--noise-multiplier", "-z", min=0.0,
        help="Z: noise std on the sum / sensitivity. 0 = no privacy (warned, still recorded)."),
    mode: str = typer.Option("cosine", "--mode", help="cosine (POPri) or nn-histogram (PE)."),
    clip: Optional[float] = typer.Option(
        None, "--clip", help="cosine: L2 clip norm C, the sensitivity (default 1.0, POPri 3.1)."),
    sample_rate: Optional[float] = typer.Option(
        None, "--sample-rate",
        help="Poisson client sampling at rate q (exclusive with --clients-per-round). "
             "Default: every client."),
    clients_per_round: Optional[int] = typer.Option(
        None, "--clients-per-round", "-L",
        help="Exactly L clients, uniformly without replacement (POPri D.1: 1000)."),
    seed: int = typer.Option(
        0, "--seed", help="Seed for client sampling, the per-client cap and the noise "
                          "(separate streams)."),
    standardize: Optional[bool] = typer.Option(
        None, "--standardize/--no-standardize",
        help="cosine: z-score each client's vector before clipping (default on, as meiyuw/POPri "
             "client_feedback.py): the norm budget goes to differences, not a common offset."),
    max_samples_per_client: Optional[int] = typer.Option(
        None, "--max-samples-per-client", "-M", min=1,
        help="Cap M on samples per client (seeded choice). nn-histogram: default 8, the "
             "sensitivity (PrE-Text). cosine: default all."),
    threshold: Optional[float] = typer.Option(
        None, "--threshold", "-H",
        help="nn-histogram: H in max(hist - H, 0) after aggregation (default 0)."),
    out: Optional[str] = typer.Option(
        None, "--out", "-o", help="SCORES.npy (+ SCORES.json), or '-' for JSONL on stdout."),
    per_client_out: Optional[str] = typer.Option(
        None, "--per-client-out",
        help="CLIENTS.npy: every participating client's noised upload [L, n_syn] + CLIENTS.json "
             "(client ids in row order)."),
    ledger_dir: Optional[str] = typer.Option(
        None, "--ledger",
        help="Directory whose ledger.jsonl records this release (default: next to the outputs)."),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", envvar="POPRI_EMBED_MODEL",
        help="Embedding model for text inputs (default all-MiniLM-L6-v2: POPri B.1, "
             "PrE-Text D.2)."),
    split: str = typer.Option("train", "--split", help="Split when --private is a dataset dir."),
    delta: float = typer.Option(3e-6, "--delta", help="delta recorded in the ledger (POPri B.1)."),
    release: bool = typer.Option(
        False, "--release", envvar="POPRI_RELEASE",
        help="Secure randomness (os.urandom) for sampling, cap and noise; the seed is then ignored "
             "for them."),
    round_: int = typer.Option(0, "--round", help="Round number, recorded in sidecar and ledger."),
    block_size: Optional[int] = typer.Option(
        None, "--block-size", min=1,
        help="Clients per block for per-client rows (default: ~256 MB of float32)."),
) -> None:
    _run(**locals())


def _options(mode, clip, standardize, max_samples_per_client, threshold, sample_rate,
             clients_per_round, out, per_client_out, ledger_dir, private, synthetic):
    """Check the option combination; return (clip, standardize, M, threshold) with defaults."""
    from pathlib import Path

    from popri_cli.errors import InputError

    if mode not in MODES:
        raise InputError(f"--mode must be one of {', '.join(MODES)} (got {mode!r})")
    if sample_rate is not None and clients_per_round is not None:
        raise InputError("--sample-rate (Poisson) and --clients-per-round (fixed L) are mutually "
                         "exclusive; give one")
    if sample_rate is not None and not 0 < sample_rate <= 1:
        raise InputError(f"--sample-rate must be in (0, 1] (got {sample_rate})")
    if clients_per_round is not None and clients_per_round < 1:
        raise InputError(f"--clients-per-round must be >= 1 (got {clients_per_round})")
    if mode == "cosine":
        if threshold is not None:
            raise InputError("--threshold applies to --mode nn-histogram only")
        clip = 1.0 if clip is None else clip
        if not clip > 0:
            raise InputError(f"--clip must be > 0 (got {clip})")
        standardize = True if standardize is None else standardize
    else:
        if clip is not None or standardize is not None:
            raise InputError("--clip/--standardize apply to --mode cosine; nn-histogram's "
                             "sensitivity is --max-samples-per-client")
        max_samples_per_client = max_samples_per_client or 8
        threshold = 0.0 if threshold is None else threshold
    if not out and not per_client_out:
        raise InputError("nothing to write: give --out and/or --per-client-out")
    if out and out != "-" and not out.endswith(".npy"):
        raise InputError("--out must be NAME.npy or '-'", path=out)
    if per_client_out and not per_client_out.endswith(".npy"):
        raise InputError("--per-client-out must be NAME.npy", path=per_client_out)
    if out == "-" and not per_client_out and not ledger_dir:
        raise InputError("--out - prints the scores; give --ledger DIR (or --per-client-out) so "
                         "the privacy spent is recorded")
    if private == "-" and synthetic == "-":
        raise InputError("only one of --private / --synthetic can be '-' (stdin)")
    files = [f for f in (out, per_client_out) if f and f != "-"]
    if len(files) == 2 and Path(files[0]).resolve() == Path(files[1]).resolve():
        raise InputError("--out and --per-client-out are the same file", path=out)
    for f in files:
        for src in (private, synthetic):
            if src != "-" and Path(src).exists() and Path(f).resolve() == Path(src).resolve():
                raise InputError("output would overwrite an input; choose another name", path=f)
    return clip, standardize, max_samples_per_client, threshold


def _empty(what: str, private: bool) -> str:
    return f"no {what} samples" + (": the client set is empty" if private else "")


def _records(path: str, split: str, what: str, need_client: bool):
    """JSONL / dataset-dir records (read once, so '-' works), checked non-empty."""
    from popri_cli.embed import read_records
    from popri_cli.errors import InputError

    recs, src = read_records(path, split)
    for i, r in enumerate(recs, start=1):
        if need_client and r.get("client_id") is None:
            raise InputError("missing required field (private data needs client ids)", path=src,
                             line=i, field="client_id")
    if not recs:
        raise InputError(_empty(what, need_client), path=src)
    return recs, src


def _load(path: str, *, model, split, what: str, private: bool):
    from popri_cli.embed import as_embedding_set
    from popri_cli.errors import InputError
    from popri_cli.io import STDIO, is_embedding_path

    if path != STDIO and is_embedding_path(path):
        es = as_embedding_set(path, require_client=private, mmap=private)
        if len(es) == 0:
            raise InputError(_empty(what, private), path=path)
        return es
    recs, src = _records(path, split, what, private)
    return as_embedding_set(src, records=recs, model=model, require_client=private, what=what)


def _fingerprint(es) -> str:
    """sha256 of an embedding set's vectors and ids (the release id depends on the data)."""
    import hashlib
    import json
    from pathlib import Path

    import numpy as np

    from popri_cli.io import sha256_file, sidecar_path

    src = es.source
    if src.endswith(".npy") and Path(src).is_file() and Path(sidecar_path(src)).is_file():
        return sha256_file(src) + sha256_file(sidecar_path(src))  # the files as they are
    h = hashlib.sha256(np.ascontiguousarray(es.embeddings, dtype=np.float32).tobytes())
    h.update(json.dumps([[r.get("id"), r.get("client_id")] for r in es.rows]).encode())
    return h.hexdigest()


def _run(private, synthetic, noise_multiplier, mode, clip, sample_rate, clients_per_round, seed,
         standardize, max_samples_per_client, threshold, out, per_client_out, ledger_dir, model,
         split, delta, release, round_, block_size) -> None:
    import json
    from pathlib import Path

    import numpy as np

    from popri_cli import io, ledger, log, scoring
    from popri_cli.embed import check_compatible
    from popri_cli.errors import InputError
    from popri_cli.privacy.noise import make_rng

    clip, standardize, M, threshold = _options(
        mode, clip, standardize, max_samples_per_client, threshold, sample_rate, clients_per_round,
        out, per_client_out, ledger_dir, private, synthetic)
    if not 0 < delta < 1:
        raise InputError(f"--delta must be in (0, 1) (got {delta})")
    targets = ([Path(ledger_dir) / ledger.LEDGER_NAME] if ledger_dir
               else [f for f in (out, per_client_out) if f and f != "-"])
    for t in targets:  # a broken ledger fails now, before anything is written
        if ledger.ledger_path_for(t).exists():
            ledger.read_ledger(ledger.ledger_path_for(t))

    syn = _load(synthetic, model=model, split=split, what="synthetic", private=False)
    priv = _load(private, model=model, split=split, what="private", private=True)
    check_compatible(priv, syn)
    codes, clients = scoring.factorize(priv.client_ids())
    N = len(clients)
    if clients_per_round is not None and clients_per_round > N:
        raise InputError(f"--clients-per-round {clients_per_round} exceeds the {N} clients",
                         path=priv.source)
    secure = bool(release)
    sample = scoring.sample_clients(N, make_rng(seed, secure=secure, stream="sampling"),
                                    sample_rate=sample_rate, clients_per_round=clients_per_round)
    keep = scoring.cap_per_client(codes, M, make_rng(seed, secure=secure, stream="cap"))
    L, n = len(sample.members), len(syn)
    sens = clip if mode == "cosine" else float(M)
    if noise_multiplier == 0:
        log.warn("--noise-multiplier 0: NO PRIVACY. The exact aggregate is released "
                 "(recorded in the ledger with noise_multiplier 0).")
    if L == 0:
        log.warn(f"Poisson sampling at q={sample.sample_rate} drew no client from {N}: the "
                 "output is pure noise, added by the server.")

    q = sample.sample_rate
    reduce = "mean" if mode == "cosine" else "sum"
    params = {
        "mode": mode, "round": round_, "noise_multiplier": noise_multiplier,
        "clip": clip if mode == "cosine" else None,
        "standardize": standardize if mode == "cosine" else None,
        "sample_rate": q, "clients_per_round": clients_per_round, "sampling": sample.sampling,
        "participating_clients": L, "total_clients": N, "max_samples_per_client": M,
        "threshold": threshold, "seed": seed, "release": secure, "delta": delta,
        "reduce": reduce, "denominator": sample.denominator if reduce == "mean" else None,
        "embedding_model": syn.meta.get("model") or priv.meta.get("model") or model,
    }
    rid = ledger.make_release_id("score", _fingerprint(priv), _fingerprint(syn), params,
                                 secure=secure)
    entry = ledger.LedgerEntry(
        stage="score", mechanism="subsampled_gaussian" if q < 1 else "gaussian",
        noise_multiplier=noise_multiplier, sample_rate=q, steps=1, delta=delta,
        sensitivity=sens, sampling=sample.sampling, release_id=rid, params=params)
    head = {"ids": syn.ids, "mode": mode, "round": round_, "params": params}

    noise_rng = make_rng(seed, secure=secure, stream="noise")
    with io.AtomicOutputs() as staged:
        rows_out = None
        if per_client_out:
            rows_out = np.lib.format.open_memmap(staged.path(per_client_out, suffix=".npy"),
                                                 mode="w+", dtype=np.float32, shape=(max(L, 1), n))
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
        scores = scoring.finish(total, reduce=reduce, denominator=sample.denominator,
                                threshold=threshold)
        if rows_out is not None:
            rows_out.flush()
            side = {**head, "kind": "per-client",
                    "clients": [clients[i] for i in sample.members],
                    "server_noise_rows": int(L == 0),
                    "noise_std_per_row": noise_multiplier * sens / np.sqrt(max(L, 1)),
                    "ledger": [entry.to_dict()]}
            side_path = staged.path(io.score_sidecar_path(per_client_out))
            with open(side_path, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(side, ensure_ascii=False, indent=2, allow_nan=False) + "\n")
        if out and out != "-":
            io.save_scores(out, scores, {**head, "ledger": [entry.to_dict()]}, out=staged)
    for t in targets:
        ledger.append(t, [entry])
    if out == "-":
        io.write_jsonl(({"id": i, "score": float(s)} for i, s in zip(syn.ids, scores)), "-")
    log.info(f"score: {mode}, {L} of {N} clients, {n} synthetic samples, z={noise_multiplier}, "
             f"q={q:g}" + (f" -> {out}" if out and out != "-" else ""))
    try:  # the accountant is optional here: the ledger entry is what counts
        from popri_cli.privacy.accounting import epsilon
    except ImportError:
        return
    if noise_multiplier > 0:
        log.info(f"score: this release alone is ({epsilon(noise_multiplier, q, 1, delta):.4g}, "
                 f"{delta:g})-DP (rdp); 'popri account ledger' totals every round")


def _unwrap(text: str) -> str:
    """One line per paragraph, so the terminal (rich) does the wrapping."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def register(app: typer.Typer) -> None:
    app.command("score", help=_unwrap(HELP))(score)
