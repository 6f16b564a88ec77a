"""FreD's two steps: release the clients' statistics once (``fred stats``), rank candidates
against them (``fred compare``).  What the commands run, callable from Python.

    popri fred stats --private data/sotu --epsilon 0.6 --delta 2e-6 --clip 1 --out runs/fred/stats.npz
    popri fred compare --stats runs/fred/stats.npz cand_a.jsonl cand_b.npy data/other --json
    python -m pytest -q tests/test_fred.py

    >>> from popri.methods.fred.steps import release_stats, rank_candidates
    >>> from popri.specs.privacy import FredStatsSpec
    >>> r = release_stats("runs/priv.npy", "runs/fred/stats.npz",     # the CLI's files and ledger
    ...                   FredStatsSpec(epsilon=0.6, delta=2e-6))
    >>> rank_candidates(["a.jsonl", "b.npy"], "runs/fred/stats.npz")  # [{"candidate", "fred", "n"}]

FreD = "Privately Customizing Prefinetuning to Better Match User Data in Federated Learning"
(arXiv:2302.09042): Algorithm 1 (the two releases) and Proposition 3.1 (their cost); the maths
is :mod:`popri.methods.fred.stats`, the release protocol (streams, id, ledger under a lock, then
the outputs) :mod:`popri.privacy.release`, the noise calibration
:func:`popri.privacy.calibration.gaussian_multiplier`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from popri.core import log, validate
from popri.core.artifacts import array_digest
from popri.core.errors import InputError
from popri.core.guard import check_outputs
from popri.core.io import STDIO, is_embedding_path
from popri.data.records import read_records
from popri.methods.fred import stats as F
from popri.methods.fred.stats import design_of, load_stats
from popri.models.embed import as_embedding_set, resolve_model
from popri.models.fid import frechet_distance, gaussian_stats
from popri.privacy.accounting import compose
from popri.privacy.calibration import gaussian_multiplier
from popri.privacy.release import Release
from popri.specs.privacy import FredStatsSpec

#: library parameter -> the ``popri fred stats`` option (for ParameterError messages)
OPTION = {"epsilon": "--epsilon", "delta": "--delta", "clip": "--clip", "relation": "--relation",
          "level": "--level", "max_samples_per_client": "--max-samples-per-client",
          "calibration": "--calibration", "noise_multiplier": "--epsilon", "private": "--private"}


def load_embeddings(path: str, *, what: str, split: str, **kw):
    """An embedding set from a .npy set, a dataset dir (its split), or JSONL (a file or '-')
    of texts or of 'embedding' rows (the pipe format of 'popri embed --out -')."""
    if path != STDIO and is_embedding_path(path):
        return as_embedding_set(path, what=what, **kw)
    recs, src = read_records(path, split)
    return as_embedding_set(src, records=recs, what=what, **kw)


def stats_noise_multiplier(spec: FredStatsSpec) -> float:
    """z of each of the two releases (``spec.calibration`` at ``spec.epsilon``, ``spec.delta``):
    a ParameterError when the calibration does not apply (classic at eps >= 1), an InputError
    when the noise would be so large that the statistics are pure noise."""
    z = gaussian_multiplier(spec.epsilon, spec.delta, spec.calibration)
    if not z <= validate.Z_MAX:
        raise InputError(f"too small: it needs noise multiplier {z:.3g} > {validate.Z_MAX:g}, "
                         "statistics that are pure noise", field="--epsilon")
    return z


def release_stats(private: str, out: str, spec: FredStatsSpec | None = None, *, seed: int = 0,
                  split: str = "train", model: str | None = None,
                  **settings: Any) -> dict[str, Any]:
    """``popri fred stats``: release the mean and covariance of ``private``'s embeddings (FreD
    Algorithm 1; the mean alone with ``spec.statistics == "mean"``) to ``out`` (STATS.npz +
    STATS.json), recording each release in the ledger.jsonl next to it before the files appear; or, with ``spec.non_private``, the exact
    statistics (no ledger entry).

    ``spec``: the settings (:class:`~popri.specs.privacy.FredStatsSpec`); its fields may also be
    given as keywords.  ``seed`` seeds the noise and the per-client cap in research mode;
    ``model`` embeds text inputs; ``split`` picks a dataset dir's split.

    Returns ``{"stats" (FredStats), "entries" (LedgerEntry list), "sidecar", "noise_multiplier"
    (None when non-private)}``.  Bad settings: a :class:`~popri.core.errors.InputError`, or a
    :class:`~popri.privacy.accounting.ParameterError` whose ``param`` :data:`OPTION` maps to
    the command's option; both before anything is read or written."""
    if spec is None:
        spec = FredStatsSpec(**settings)
    elif settings:
        spec = spec.replace(**settings)
    if not str(out).endswith(".npz"):
        raise InputError("--out must be NAME.npz", path=out)
    non_private = spec.non_private
    z = design = None
    if not non_private:
        design = design_of(spec)
        z = stats_noise_multiplier(spec)
    check_outputs([out], [private])
    secure = bool(spec.release)
    rel = Release("fred", seed=None if secure else seed, secure=secure, ledgers=[out],
                  diagnostic=non_private)
    rel.check_ledgers()  # a broken ledger fails now, before anything is computed

    user = not non_private and design.level == "user"
    es = load_embeddings(private, what="private", split=split, model=model, require_client=user)
    if len(es) < 2:
        raise InputError(f"need at least 2 private embeddings, got {len(es)}", path=es.source)
    emb = np.asarray(es.embeddings, dtype=np.float32)
    keys = [str(r["client_id"]) if r.get("client_id") is not None else f"\0row{i}"
            for i, r in enumerate(es.rows)]
    meta = {"embedding_model": es.meta.get("model") or model, "normalize": es.meta.get("normalize"),
            "source": private, "split": split if Path(private).is_dir() else None}
    entries: list = []
    if non_private:
        st = F.exact_stats(emb)
        params: dict = {"non_private": True}
        log.warn("--non-private: the EXACT mean and covariance are written; no privacy, no "
                 "ledger entry. Keep them out of anything released.")
    else:
        eps, delta, cal = spec.epsilon, spec.delta, spec.calibration
        both = spec.statistics != "mean"
        st = F.release(emb, keys, design, z, seed=seed, secure=secure, denoise=bool(spec.denoise),
                       covariance=both)
        params = {"epsilon": eps, "delta": delta, "clip": design.clip,
                  "relation": design.relation, "level": design.level,
                  "max_samples_per_client": design.m if design.level == "user" else None,
                  "calibration": cal, "seed": None if secure else seed, "release": secure,
                  **st.params}
        rid_parts = (array_digest(emb, keys=keys),
                     {k: v for k, v in params.items() if k not in st.params}, meta)
        claim = (f"({eps:g}, {delta:g})-DP each; mean and covariance together "
                 f"({2 * eps:g}, {2 * delta:g})-DP by basic composition (Proposition 3.1)"
                 if both else f"({eps:g}, {delta:g})-DP: the mean alone (no covariance)")
        std = {"mean": st.params["noise_std_sum1"], "covariance": st.params.get("noise_std_sum2")}
        entries = F.release_entries(spec, z, mode=rel.mode, more=lambda what: (
            rel.release_id(what, *rid_parts),
            {"release": what, "epsilon": eps, "delta": delta, "calibration": cal,
             "noise_std_on_sum": std[what], "claim": claim, "noise": st.params["noise"]}))
    sidecar = {"kind": "fred-stats", "private": not non_private, "dim": int(emb.shape[1]),
               "privacy_mode": None if non_private else rel.mode,
               "n": st.n, "n_public": bool(non_private or design.count_public),
               "statistics": "both" if non_private else spec.statistics, **meta,
               "neighbouring": None if non_private else design.neighbouring,
               "params": params, "ledger": [e.to_dict() for e in entries]}
    with rel:  # the entries are recorded (locked) before the statistics appear
        F.save_stats(out, st, sidecar, rel.outputs)
        rel.commit(entries)
    if non_private:
        log.info(f"fred stats: exact statistics of {len(emb)} x {emb.shape[1]} -> {out}")
    else:
        tau2 = st.params.get("tau2")
        log.info(f"fred stats: {design.neighbouring}, z={z:.4g} ({cal}), "
                 f"tau1={st.params['tau1']:.3g}"
                 + (f", tau2={tau2:.3g}" if tau2 is not None else ", mean only") + f" -> {out}")
        if both:
            tight = compose(entries, delta, "pld").epsilon
            log.info(f"fred stats: each release ({eps:g}, {delta:g})-DP, together "
                     f"({2 * eps:g}, {2 * delta:g})-DP; PLD composition: ({tight:.4g}, "
                     f"{delta:g})")
        else:
            log.info(f"fred stats: one release (the mean), ({eps:g}, {delta:g})-DP")
    return {"stats": st, "entries": entries, "sidecar": sidecar, "noise_multiplier": z}


def rank_candidates(candidates: Sequence[str], stats_path: str, *, model: str | None = None,
                    split: str = "train") -> list[dict[str, Any]]:
    """``popri fred compare``: the Frechet distance of each candidate to the statistics of
    :func:`release_stats`, closest first: ``[{"candidate", "fred", "n"}, ...]`` (ties keep the
    given order).  Spends no privacy: only the released statistics are read."""
    if sum(c == "-" for c in candidates) > 1:
        raise InputError("only one candidate can be '-' (stdin)")
    mean, cov, side = load_stats(stats_path)
    if cov is None:
        raise InputError("holds the mean only ('popri fred stats --statistics mean'): the "
                         "Frechet distance needs the covariance too", path=stats_path,
                         field="statistics")
    if not side.get("private"):
        log.warn(f"{stats_path} holds the exact (--non-private) statistics: no privacy")
    smodel = side.get("embedding_model")
    normalize = side.get("normalize")
    rows = []
    for i, c in enumerate(candidates):
        es = load_embeddings(c, what="candidate", split=split, model=model or smodel,
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
    return [{"candidate": c, "fred": d, "n": n} for d, _, c, n in rows]
