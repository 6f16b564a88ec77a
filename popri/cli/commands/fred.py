"""popri fred: FreD, a DP Frechet distance between public candidates and federated client data.

    popri fred stats --private data/sotu --epsilon 0.6 --delta 2e-6 --clip 1 --out runs/fred/stats.npz
    popri fred stats --private data/sotu --non-private --out runs/fred/exact.npz
    popri fred compare --stats runs/fred/stats.npz cand_a.jsonl cand_b.npy data/other
    popri embed cand.jsonl --out - | popri fred compare --stats runs/fred/stats.npz - --json

The maths (relations, sensitivities, calibration) is in popri/methods/fred/stats.py.
"""

from __future__ import annotations

from typing import List, Optional

import typer

fred_app = typer.Typer(
    help="FreD (fred-prefinetuning, Algorithm 1): release the clients' embedding mean and "
         "covariance once under DP ('stats'), then rank any number of public candidate datasets "
         "by their Frechet distance to them ('compare', no further privacy cost).",
    no_args_is_help=True)

STATS_HELP = """Release the clients' embedding mean and covariance under DP, once (FreD:
fred-prefinetuning, Algorithm 1 and Proposition 3.1).

Client side, pass 1: every client clips its embeddings to L2 norm c (--clip) and uploads the sum
of the clipped vectors; the server adds Gaussian noise to the sum and divides by n: the DP mean.
Pass 2: clients centre the clipped embeddings on the DP mean, clip again to c and upload the sum
of their outer products; the server adds noise to the upper triangle (diagonal included),
mirrors it, divides by n and projects to the nearest PSD matrix (eigenvalues clipped at 0).
Each release is (eps, delta)-DP; both together (2 eps, 2 delta)-DP by basic composition
(Proposition 3.1).  The ledger records both as Gaussian releases, so 'popri account ledger'
composes them (more tightly than 2 eps).

Neighbouring relation.  A record is one sample (--level sample, as the paper) or one client's
data (--level user; each client keeps at most M samples, --max-samples-per-client, default 8 as
PrE-Text, a seeded choice).  --relation replace-one (default): the neighbours have as many
records and differ in one record's content.  add-remove: one record more or less (the paper's
Definition 2.1).  With m = 1 at sample level and m = M at user level, the L2 sensitivities of
the two sums are:

Mean, replace-one: 2 m c (each of the two records' sums has norm <= m c).  At sample level n is
fixed by the relation, hence public: noise std on the mean tau1 = 2c z / n, the paper's tau1.  At
user level the number of samples is private and is released as one more coordinate g n_k of the
same sum with g = c, which keeps the sensitivity at 2 m c (in general sqrt(max(4 m^2 c^2,
(m+1)^2 c^2 + g^2 (m-1)^2))).

Mean, add-remove: n is private and rides along as the coordinate g n_k with g = c/2: sensitivity
m sqrt(c^2 + g^2) = 1.118 m c; the count's noise std is (that noise std) / g.

Covariance (the released upper triangle has L2 norm <= the Frobenius norm of the symmetric
matrix; a record's sum of y y^T is PSD with Frobenius norm <= trace <= m c^2): add-remove m c^2
(sample level: the paper's tau2 = c^2 z / n); replace-one sqrt(2) m c^2, since ||V - V'||_F^2 <=
||V||^2 + ||V'||^2 for PSD V, V', attained by orthogonal y, y'.  The paper's c^2/n is the
add/remove bound: under replace-one, which its tau1 = 2c/n assumes, popri adds sqrt(2) c^2 z / n.

Calibration (--calibration): classic z = sqrt(2 ln(1.25/delta)) / eps (the paper; Dwork & Roth
2014, Theorem A.1, proven for eps < 1 only, so larger eps is refused) or analytic (Balle & Wang
2018: the smallest z with Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z) <= delta, from
dp-accounting's exact solver; always below classic).  Noise std on each sum = z x its
sensitivity.

Covariance estimate: the nearest PSD matrix (the paper; default) keeps the positive half of the
noise, which dominates every eigenvalue below the noise edge 2 tau2 sqrt(d); candidates with
more spread then look closer.  --denoise sets those eigenvalues to 0 and debiases the ones above
the edge (spiked Wigner model), from the same release at no privacy cost.  Measured
(examples/fred_mixture.py, SOTU, n = 39277, d = 384, eps = 0.6, delta = 2e-6): 99% vs 100%
SOTU candidates are ordered rightly in 0/5 seeds with the projection and 5/5 with --denoise.

Outputs: STATS.npz (float64: mean of length d, cov d x d, n), STATS.json (kind "fred-stats", dim, n and
whether it is public, embedding model, every parameter, sensitivities, the noise stds tau1/tau2
on the mean/covariance, the ledger entries) and both entries appended to ledger.jsonl next to
STATS.  No file holds an exact count when n is private.  --non-private writes the exact mean
and (N-1) covariance of all embeddings instead (no clipping, no noise: what 'popri eval fid'
fits), "private": false and no ledger entry: a reference, with no privacy at all."""

COMPARE_HELP = """Frechet distance of each candidate to the statistics of 'popri fred stats',
ranked ascending (closest first).  No privacy is spent: only the released statistics are used.

d = ||m_c - m||^2 + Tr(C_c + C - 2 (C_c C)^(1/2)), with the candidate's mean and (N-1)
covariance; the square-root trace comes from the symmetric form sqrt(C_c) C sqrt(C_c) by
eigen-decompositions with round-off eigenvalues clipped at 0 (popri/models/fid.py, the same code as
'popri eval fid' and DPO checkpoint selection): no complex parts, no negative covariance term.

Candidates: JSONL texts, JSONL rows with 'embedding', embedding sets .npy, federated dataset
directories (their --split), or '-' (stdin, once).  Texts are embedded with the model recorded
in STATS.json (override with --model; it must match).  Prints a table (rank, fred, n,
candidate) or, with --json, a JSON list of {"candidate", "fred"}."""

OPTION = {"epsilon": "--epsilon", "delta": "--delta", "clip": "--clip", "relation": "--relation",
          "level": "--level", "max_samples_per_client": "--max-samples-per-client",
          "calibration": "--calibration", "noise_multiplier": "--epsilon", "private": "--private"}


def stats(
    private: str = typer.Option(
        ..., "--private",
        help="Private client data: a federated dataset directory (its --split), JSONL texts with "
             "'client_id' (or 'embedding' rows), an embedding set NAME.npy, or '-'. client_id is "
             "required at --level user; at sample level a row without one is its own client."),
    out: str = typer.Option(..., "--out", "-o",
                            help="STATS.npz; STATS.json and ledger.jsonl are written next to it."),
    epsilon: Optional[float] = typer.Option(
        None, "--epsilon", "-e",
        help="Epsilon of EACH of the two releases; the pair costs 2 eps (Proposition 3.1). The "
             "paper's Figure 2 uses 0.6."),
    delta: Optional[float] = typer.Option(
        None, "--delta", help="Delta of each release (Figure 2: 2e-6); the pair costs 2 delta."),
    clip: Optional[float] = typer.Option(
        None, "--clip", "-c",
        help="Clip norm c of both passes (default 1.0: popri's embeddings are L2-normalised, so "
             "pass 1 clips nothing; the paper leaves c open)."),
    non_private: bool = typer.Option(
        False, "--non-private",
        help="Write the exact statistics (no clipping, no noise, NO privacy) for reference."),
    relation: Optional[str] = typer.Option(
        None, "--relation", help="replace-one (default: the relation the paper's tau1 = 2c/n "
                                 "assumes) or add-remove (the paper's Definition 2.1)."),
    level: Optional[str] = typer.Option(
        None, "--level", help="sample (default, as the paper) or user (one client's whole data)."),
    max_samples_per_client: Optional[int] = typer.Option(
        None, "--max-samples-per-client", "-M",
        help="--level user: samples kept per client, a seeded choice (default 8, PrE-Text's cap)."),
    calibration: Optional[str] = typer.Option(
        None, "--calibration",
        help="classic (default; the paper: sqrt(2 ln(1.25/delta))/eps, eps < 1) or analytic "
             "(Balle & Wang 2018, exact, less noise)."),
    denoise: Optional[bool] = typer.Option(
        None, "--denoise/--no-denoise",
        help="Covariance: eigenvalues below the noise edge 2 tau2 sqrt(d) set to 0, those above "
             "debiased (spiked Wigner model), instead of the paper's nearest-PSD projection "
             "(default). Post-processing of the same release: no privacy cost."),
    seed: int = typer.Option(0, "--seed", help="Seed of the noise and of the per-client cap."),
    release: bool = typer.Option(
        False, "--release", envvar="POPRI_RELEASE",
        help="Secure randomness (os.urandom) for noise and cap; the seed is then ignored."),
    split: str = typer.Option("train", "--split", help="Split when --private is a dataset dir."),
    model: Optional[str] = typer.Option(
        None, "--model", "--embedder", "-m", envvar="POPRI_EMBED_MODEL",
        help="Embedding model for texts (default all-MiniLM-L6-v2: POPri B.1; the paper used "
             "ALBERT)."),
) -> None:
    _stats(**locals())


def _load(path: str, *, what: str, split: str, **kw):
    """An embedding set from a .npy set, a dataset dir (its split), or JSONL (a file or '-')
    of texts or of 'embedding' rows (the pipe format of 'popri embed --out -')."""
    from popri.models.embed import as_embedding_set, read_records
    from popri.core.io import STDIO, is_embedding_path

    if path != STDIO and is_embedding_path(path):
        return as_embedding_set(path, what=what, **kw)
    recs, src = read_records(path, split)
    return as_embedding_set(src, records=recs, what=what, **kw)


def _bad(e):
    from popri.core.errors import InputError

    return InputError(e.message, field=OPTION.get(e.param, e.param))


def _stats(private, out, epsilon, delta, clip, non_private, relation, level,
           max_samples_per_client, calibration, denoise, seed, release, split, model) -> None:
    from pathlib import Path

    import numpy as np

    from popri.methods.fred import stats as F
    from popri.privacy import ledger
    from popri.core import log
    from popri.core.errors import InputError
    from popri.privacy.accounting import ParameterError

    if not out.endswith(".npz"):
        raise InputError("--out must be NAME.npz", path=out)
    for f in (out, F.sidecar_path(out)):
        if private != "-" and Path(private).exists() and Path(f).resolve() == Path(private).resolve():
            raise InputError("output would overwrite the input; choose another name", path=f)
    if non_private:
        given = [o for o, v in (("--epsilon", epsilon), ("--delta", delta), ("--clip", clip),
                                ("--relation", relation), ("--level", level),
                                ("--max-samples-per-client", max_samples_per_client),
                                ("--calibration", calibration), ("--denoise", denoise))
                 if v is not None]
        if given:
            raise InputError(f"--non-private writes the exact statistics; {given[0]} applies to "
                             "the private release only", field=given[0])
    else:
        if epsilon is None or delta is None:
            raise InputError("required for a private release (or give --non-private)",
                             field="--epsilon" if epsilon is None else "--delta")
        from popri.core import validate

        # bounds (popri/core/validate.py): e^eps must be finite for the analytic calibration,
        # c^2 z finite and precise for the covariance release
        validate.finite(epsilon, "--epsilon", lo=0, lo_open=True, hi=validate.EPSILON_MAX)
        validate.delta(delta)
        if clip is not None:
            validate.clip(clip)
        try:
            design = F.Design(relation or "replace-one", level or "sample",
                              1.0 if clip is None else clip, max_samples_per_client)
            cal = calibration or "classic"
            z = F.noise_multiplier(epsilon, delta, cal)
        except ParameterError as e:
            raise _bad(e) from None
        if not z <= validate.Z_MAX:
            raise InputError(f"too small: it needs noise multiplier {z:.3g} > {validate.Z_MAX:g}, "
                             "statistics that are pure noise", field="--epsilon")
    from popri.core.guard import check_outputs
    from popri.privacy.release import Release

    check_outputs([out], [private])
    if non_private and release:
        raise InputError("--non-private writes the exact statistics; --release does not apply",
                         field="--release")
    rel = Release("fred", seed=None if release else seed, secure=bool(release), ledgers=[out],
                  diagnostic=bool(non_private))
    rel.check_ledgers()  # a broken ledger fails now, before anything is computed

    user = not non_private and design.level == "user"
    es = _load(private, what="private", split=split, model=model, require_client=user)
    if len(es) < 2:
        raise InputError(f"need at least 2 private embeddings, got {len(es)}", path=es.source)
    emb = np.asarray(es.embeddings, dtype=np.float32)
    keys = [str(r["client_id"]) if r.get("client_id") is not None else f"\0row{i}"
            for i, r in enumerate(es.rows)]
    secure = bool(release)
    meta = {"embedding_model": es.meta.get("model") or model, "normalize": es.meta.get("normalize"),
            "source": private, "split": split if Path(private).is_dir() else None}
    entries: list = []
    if non_private:
        st = F.exact_stats(emb)
        params = {"non_private": True}
        log.warn("--non-private: the EXACT mean and covariance are written; no privacy, no "
                 "ledger entry. Keep them out of anything released.")
    else:
        st = F.release(emb, keys, design, z, seed=seed, secure=secure, denoise=bool(denoise))
        params = {"epsilon": epsilon, "delta": delta, "clip": design.clip,
                  "relation": design.relation, "level": design.level,
                  "max_samples_per_client": design.m if design.level == "user" else None,
                  "calibration": cal, "seed": None if secure else seed, "release": secure,
                  **st.params}
        rid_parts = (F.fingerprint(emb, keys), {k: v for k, v in params.items()
                                                 if k not in st.params}, meta)
        claim = (f"({epsilon:g}, {delta:g})-DP each; mean and covariance together "
                 f"({2 * epsilon:g}, {2 * delta:g})-DP by basic composition (Proposition 3.1)")
        for what, sens, std in (("mean", design.mean_sensitivity, st.params["noise_std_sum1"]),
                                ("covariance", design.cov_sensitivity,
                                 st.params["noise_std_sum2"])):
            entries.append(ledger.LedgerEntry(
                stage="fred", mechanism="gaussian",
                noise_multiplier=st.params["effective_noise_multiplier"][what], sample_rate=1.0,
                steps=1, delta=delta, sensitivity=sens, sampling="none",
                neighbouring=design.neighbouring, mode=rel.mode,
                release_id=rel.release_id(what, *rid_parts),
                params={"release": what, "epsilon": epsilon, "delta": delta, "calibration": cal,
                        "noise_std_on_sum": std, "claim": claim, "noise": st.params["noise"],
                        "nominal_noise_multiplier": z}))
    sidecar = {"kind": "fred-stats", "private": not non_private, "dim": int(emb.shape[1]),
               "privacy_mode": None if non_private else rel.mode,
               "n": st.n, "n_public": bool(non_private or design.count_public), **meta,
               "neighbouring": None if non_private else design.neighbouring,
               "params": params, "ledger": [e.to_dict() for e in entries]}
    with rel:  # the entries are recorded (locked) before the statistics appear
        F.save_stats(out, st, sidecar, rel.outputs)
        rel.commit(entries)
    if non_private:
        log.info(f"fred stats: exact statistics of {len(emb)} x {emb.shape[1]} -> {out}")
        return
    log.info(f"fred stats: {design.neighbouring}, z={z:.4g} ({cal}), tau1={st.params['tau1']:.3g}, "
             f"tau2={st.params['tau2']:.3g} -> {out}")
    from popri.privacy import accounting as A

    tight = A.compose(entries, delta, "pld").epsilon
    log.info(f"fred stats: each release ({epsilon:g}, {delta:g})-DP, together "
             f"({2 * epsilon:g}, {2 * delta:g})-DP; PLD composition: ({tight:.4g}, {delta:g})")


def compare(
    candidates: List[str] = typer.Argument(
        ..., metavar="CANDIDATE...",
        help="JSONL texts or 'embedding' rows, embedding sets .npy, dataset dirs, or '-' (once)."),
    stats_path: str = typer.Option(..., "--stats", "-s", help="STATS.npz from 'popri fred stats'."),
    json_out: bool = typer.Option(False, "--json",
                                  help="Print a JSON list of {\"candidate\", \"fred\"}."),
    model: Optional[str] = typer.Option(
        None, "--model", "--embedder", "-m",
        help="Embedding model for texts (default: the one recorded in STATS.json)."),
    split: str = typer.Option("train", "--split", help="Split used for dataset dirs."),
) -> None:
    from popri.methods.fred import stats as F
    from popri.core import log
    from popri.models.embed import resolve_model
    from popri.core.errors import InputError
    from popri.models.fid import frechet_distance, gaussian_stats
    from popri.core.io import dumps

    if sum(c == "-" for c in candidates) > 1:
        raise InputError("only one candidate can be '-' (stdin)")
    mean, cov, side = F.load_stats(stats_path)
    if not side.get("private"):
        log.warn(f"{stats_path} holds the exact (--non-private) statistics: no privacy")
    smodel = side.get("embedding_model")
    normalize = side.get("normalize")
    rows = []
    for i, c in enumerate(candidates):
        es = _load(c, what="candidate", split=split, model=model or smodel,
                   normalize=True if normalize is None else bool(normalize))
        if len(es) < 2:
            raise InputError(f"need at least 2 rows for a covariance, got {len(es)}", path=c)
        if es.dim != len(mean):
            raise InputError(f"embedding dimension {es.dim} does not match {len(mean)} of "
                             f"{stats_path}", path=c, field="embedding")
        cm = es.meta.get("model")
        if cm and smodel and resolve_model(cm) != resolve_model(smodel):
            raise InputError(f"embedded with {cm!r} but {stats_path} was computed with "
                             f"{smodel!r}", path=c, field="model")
        rows.append((frechet_distance(*gaussian_stats(es.embeddings), mean, cov), i, c, len(es)))
    rows.sort()
    if json_out:
        typer.echo(dumps([{"candidate": c, "fred": d} for d, _, c, _ in rows]))
        return
    table = [("rank", "fred", "n", "candidate")] + [
        (str(r), f"{d:.6f}", str(n), c) for r, (d, _, c, n) in enumerate(rows, start=1)]
    width = [max(len(t[j]) for t in table) for j in range(3)]
    for t in table:
        typer.echo("  ".join(x.ljust(w) for x, w in zip(t[:3], width)) + "  " + t[3])


def _unwrap(text: str) -> str:
    """One line per paragraph, so the terminal (rich) does the wrapping."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def register(app: typer.Typer) -> None:
    fred_app.command("stats", help=_unwrap(STATS_HELP))(stats)
    fred_app.command("compare", help=_unwrap(COMPARE_HELP))(compare)
    app.add_typer(fred_app, name="fred")
