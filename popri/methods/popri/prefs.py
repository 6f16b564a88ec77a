"""Preference pairs from scored samples ("Private Federated Learning using Preference-Optimized
Synthetic Data", POPri, arXiv:2504.16438, Algorithm 1, lines 21-26).

    popri prefs build --samples runs/r0/samples.jsonl --scores runs/r0/scores.npy --out runs/r0/pairs.jsonl
    popri prefs build --samples s.jsonl --scores s.npy --true-scores exact.npy --report-out rep.json

Per prompt the J samples are ranked by their (DP, aggregated) score: rank 1 is the "chosen"
sample, rank l (``rejected_rank``, 1-based; POPri 4.2 / E.5 use l = 5 of J = 10, the reference
code's zero-based ``reject_rank: 4``) the "rejected" one.  Ties are broken by ``sample_idx``
(then input order), so the pairs are a deterministic function of the inputs.

With exact (noise-free) scores the *recovery rate* (POPri Figure 6, right; reference code
``client_feedback.py``) is the share of pairs whose exact order agrees: true(chosen) >
true(rejected), strictly.

The setting (``rejected_rank``) is :class:`~popri.specs.training.PrefsSpec`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from popri.core import io
from popri.core.errors import InputError
from popri.core.io import iter_jsonl, load_embedding_set, load_scores
from popri.specs.training import PrefsSpec

SAMPLE_FIELDS = ("id", "prompt_id", "sample_idx", "prompt", "text")


def align_scores(samples: Sequence[dict], scores: np.ndarray, ids: Sequence[str] | None, *,
                 path: str = "scores") -> np.ndarray:
    """Scores in the order of ``samples``: by id when the sidecar lists ids, else by row."""
    arr = np.asarray(scores)
    if arr.ndim != 1:
        raise InputError(f"expected a 1-D score vector, got shape {tuple(arr.shape)} (per-client "
                         "rows? sum them with 'popri aggregate' first)", path=path)
    if not np.issubdtype(arr.dtype, np.number):
        raise InputError(f"expected numeric scores, got dtype {arr.dtype}", path=path)
    arr = arr.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise InputError(f"score row {bad[0] + 1} is NaN or infinite", path=path)
    if ids is None:
        if len(arr) != len(samples):
            raise InputError(f"{len(arr)} scores but {len(samples)} samples, and the sidecar has no "
                             "'ids' to match them by", path=path)
        return arr
    ids = [str(i) for i in ids]
    if len(ids) != len(arr):
        raise InputError(f"sidecar lists {len(ids)} ids but the array has {len(arr)} scores",
                         path=path, field="ids")
    index: dict[str, int] = {}
    for k, i in enumerate(ids):
        if i in index:
            raise InputError(f"id {i!r} appears twice", path=path, field="ids")
        index[i] = k
    out = np.empty(len(samples))
    seen = set()
    for n, s in enumerate(samples):
        sid = str(s["id"])
        if sid not in index:
            raise InputError(f"sample id {sid!r} has no score in {path} (scores of another sample "
                             "file?)", path=s.get("_path"), line=s.get("_line", n + 1), field="id")
        if sid in seen:
            raise InputError(f"sample id {sid!r} appears twice", path=s.get("_path"),
                             line=s.get("_line", n + 1), field="id")
        seen.add(sid)
        out[n] = arr[index[sid]]
    if len(seen) != len(ids):
        extra = next(i for i in ids if i not in seen)
        raise InputError(f"{len(ids) - len(seen)} scored ids are not among the samples (e.g. "
                         f"{extra!r}): scores of another sample file?", path=path, field="ids")
    return out


def rank_groups(samples: Sequence[dict], scores: np.ndarray) -> list[list[int]]:
    """Sample indices per prompt (prompts in order of first appearance), best score first;
    ties by ``sample_idx`` then input order."""
    groups: dict[object, list[int]] = {}
    for n, s in enumerate(samples):
        groups.setdefault(s["prompt_id"], []).append(n)
    out = []
    for members in groups.values():
        out.append(sorted(members, key=lambda n: (-scores[n], _idx(samples[n]), n)))
    return out


def _idx(s: dict):
    v = s.get("sample_idx")
    return (0, v) if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, str(v))


def check_samples(samples: Sequence[dict], path: str = "samples") -> None:
    for n, s in enumerate(samples):
        line = s.get("_line", n + 1)
        for f in SAMPLE_FIELDS:
            if f not in s or s[f] is None:
                raise InputError("missing required field", path=s.get("_path", path), line=line, field=f)
        for f in ("prompt", "text"):
            if not isinstance(s[f], str):
                raise InputError("must be a string", path=s.get("_path", path), line=line, field=f)


def fluent_chosen(members: Sequence[int], rejected_rank: int, nll: np.ndarray) -> int | None:
    """The ``fluent`` pair rule (issue 44, a popri remedy beyond POPri): among the samples
    ranked above the rejected one (``members``: one prompt's, best score first), the
    best-ranked whose public-model NLL is no higher than the rejected sample's (NaN, an empty
    text, is never no higher); None when there is none."""
    r = nll[members[rejected_rank - 1]]
    for n in members[:rejected_rank - 1]:
        if np.isfinite(nll[n]) and (not np.isfinite(r) or nll[n] <= r):
            return n
    return None


def diverse_pair(members: Sequence[int], rejected_rank: int, unit: np.ndarray,
                 chosen_so_far: Sequence[int]) -> tuple[int, int]:
    """The ``divpo`` pair rule (issue 67, after "Diverse Preference Optimization", Lanchantin et
    al. 2025, arXiv:2501.18101, section 3: the chosen response is the most diverse of those
    above a reward threshold, the rejected the least diverse of those below it).  Here the
    threshold is the rejected rank l: among ``members`` (one prompt's samples, best score
    first) the chosen is the most diverse of ranks 1 .. l-1 and the rejected the least diverse
    of ranks l .. J, where a sample's diversity is 1 - its mean cosine (``unit``: the samples'
    unit embeddings) to the other samples of its prompt and to ``chosen_so_far`` (the chosen
    samples of the prompts before).  Ties: the better-ranked.  Every chosen sample still ranks
    above its rejected one under the released scores."""
    members = list(members)
    ref = [unit[[m for m in members if m != n] + list(chosen_so_far)] for n in members]
    div = [1.0 - float(np.mean(r @ unit[n])) if len(r) else 0.0 for n, r in zip(members, ref)]
    hi, lo = range(rejected_rank - 1), range(rejected_rank - 1, len(members))
    c = max(hi, key=lambda i: (div[i], -i))
    r = min(lo, key=lambda i: (div[i], i))
    return members[c], members[r]


def sample_embeddings(samples: Sequence[dict], emb: np.ndarray, ids: Sequence[str] | None,
                      path: str = "embeddings") -> np.ndarray:
    """The samples' unit embeddings in the order of ``samples`` (by id when the set lists
    ids, else by row), for ``pair_rule: divpo``."""
    arr = np.asarray(emb, dtype=np.float64)
    if arr.ndim != 2:
        raise InputError(f"expected a 2-D embedding set, got shape {tuple(arr.shape)}", path=path)
    if ids is None:
        if len(arr) != len(samples):
            raise InputError(f"{len(arr)} embeddings but {len(samples)} samples", path=path)
        out = arr
    else:
        at = {str(i): k for k, i in enumerate(ids)}
        rows = []
        for n, rec in enumerate(samples):
            if str(rec["id"]) not in at:
                raise InputError(f"sample id {rec['id']!r} has no embedding in {path} (the "
                                 "embeddings of another sample file?)", path=rec.get("_path"),
                                 line=rec.get("_line", n + 1), field="id")
            rows.append(at[str(rec["id"])])
        out = arr[rows]
    norm = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norm > 0, norm, 1.0)


def build_pairs(samples: list[dict], scores: np.ndarray, ids: list[str] | None,
                spec: PrefsSpec | None = None, *, true_scores: np.ndarray | None = None,
                true_ids: list[str] | None = None, scores_path: str = "scores",
                true_scores_path: str = "true-scores", fluency: dict | None = None,
                fluency_path: str = "fluency", embeddings: np.ndarray | None = None,
                **overrides) -> tuple[list[dict], dict]:
    """Pairs ``{"prompt", "chosen", "rejected", "prompt_id", "chosen_score", "rejected_score",
    "chosen_id", "rejected_id"}`` and a report (counts, skipped prompts, recovery rate).

    ``spec``: the settings (default ``PrefsSpec()``; ``overrides``: field values on top, e.g.
    ``rejected_rank=4``).  ``ids``: the score sidecar's ids (None = scores row-aligned with
    ``samples``); likewise ``true_ids`` for ``true_scores``.  ``fluency``: sample id -> the
    public model's mean NLL (None: an empty text), needed by ``pair_rule: fluent``;
    ``embeddings``: the samples' unit embeddings in their order (:func:`sample_embeddings`),
    needed by ``pair_rule: divpo``.
    """
    spec = PrefsSpec(**overrides) if spec is None else spec.replace(**overrides)
    rejected_rank = spec.rejected_rank
    if not samples:
        raise InputError("no samples", path=scores_path)
    check_samples(samples)
    s = align_scores(samples, scores, ids, path=scores_path)
    t = None if true_scores is None else align_scores(samples, true_scores, true_ids,
                                                      path=true_scores_path)
    rule = spec.pair_rule or "score"
    nll = None
    if rule == "fluent":
        if fluency is None:
            raise InputError("pair rule 'fluent' needs the samples' fluency ('popri eval "
                             "fluency SAMPLES --out FILE')", field="--fluency")
        nll = np.empty(len(samples))
        for n, rec in enumerate(samples):
            if str(rec["id"]) not in fluency:
                raise InputError(f"sample id {rec['id']!r} has no NLL in {fluency_path} "
                                 "(the fluency of another sample file?)", path=rec.get("_path"),
                                 line=rec.get("_line", n + 1), field="id")
            v = fluency[str(rec["id"])]
            nll[n] = np.nan if v is None else float(v)
    if rule == "divpo" and embeddings is None:
        raise InputError("pair rule 'divpo' needs the samples' embeddings ('popri embed "
                         "SAMPLES --out FILE.npy')", field="--embeddings")
    pairs, skipped, recovered, moved = [], [], 0, 0
    chosen_so_far: list[int] = []
    for members in rank_groups(samples, s):
        first = samples[members[0]]
        for n in members[1:]:
            if samples[n]["prompt"] != first["prompt"]:
                raise InputError(f"prompt_id {first['prompt_id']!r} has two different prompt texts",
                                 path=samples[n].get("_path"), line=samples[n].get("_line", n + 1),
                                 field="prompt")
        if len(members) < rejected_rank:
            skipped.append({"prompt_id": first["prompt_id"], "samples": len(members)})
            continue
        c, r = members[0], members[rejected_rank - 1]
        if nll is not None:
            c = fluent_chosen(members, rejected_rank, nll)
            if c is None:
                skipped.append({"prompt_id": first["prompt_id"], "samples": len(members),
                                "reason": "no sample above the rejected one is as fluent"})
                continue
            moved += c != members[0]
        elif rule == "divpo":
            c, r = diverse_pair(members, rejected_rank, embeddings, chosen_so_far)
            moved += c != members[0]
        if not samples[c]["text"].strip() or not samples[r]["text"].strip():
            # an empty text (a generation kept degenerate): `popri dpo` refuses an empty
            # completion, so the prompt gives no pair, counted like a short one
            skipped.append({"prompt_id": first["prompt_id"], "samples": len(members),
                            "reason": "the chosen or the rejected text is empty"})
            continue
        pairs.append({"prompt": first["prompt"], "chosen": samples[c]["text"],
                      "rejected": samples[r]["text"], "prompt_id": first["prompt_id"],
                      "chosen_score": float(s[c]), "rejected_score": float(s[r]),
                      "chosen_id": samples[c]["id"], "rejected_id": samples[r]["id"]})
        chosen_so_far.append(c)
        if t is not None and t[c] > t[r]:
            recovered += 1
    report = {"samples": len(samples), "prompts": len(pairs) + len(skipped), "pairs": len(pairs),
              "skipped_prompts": len(skipped), "skipped": skipped[:20],
              "rejected_rank": rejected_rank, "pair_rule": rule}
    if nll is not None or rule == "divpo":
        report["chosen_below_rank_1"] = moved
    if pairs:
        gap = np.array([p["chosen_score"] - p["rejected_score"] for p in pairs])
        report["mean_score_gap"] = float(gap.mean())
    if t is not None:
        report["recovered"] = recovered
        report["recovery_rate"] = recovered / len(pairs) if pairs else None
    return pairs, report


def top_samples(samples: list[dict], scores: np.ndarray, ids: list[str] | None, *,
                scores_path: str = "scores") -> list[dict]:
    """The top-scored sample of every prompt as ``{"prompt", "completion", "prompt_id", "score"}``
    (the PE+SFT baseline's training set)."""
    if not samples:
        raise InputError("no samples", path=scores_path)
    check_samples(samples)
    s = align_scores(samples, scores, ids, path=scores_path)
    return [{"prompt": samples[m[0]]["prompt"], "completion": samples[m[0]]["text"],
             "prompt_id": samples[m[0]]["prompt_id"], "score": float(s[m[0]])}
            for m in rank_groups(samples, s)]


def read_samples(path: str) -> list[dict]:
    """Samples JSONL with each record's file/line kept (``_path``, ``_line``) for error messages.
    An empty file is an error naming it (not the scores file read next to it)."""
    recs = list(iter_jsonl(path, locate=True))
    if not recs:
        raise InputError("no samples", path=path)
    return recs


def load_score_vector(path: str) -> tuple[np.ndarray, list[str] | None]:
    """(scores, ids or None) from SCORES.npy + SCORES.json, or JSONL rows ``{"id", "score"}``
    (what ``popri score --out -`` prints)."""
    if path.endswith(".npy"):
        arr, meta = load_scores(path)
        ids = meta.get("ids") if isinstance(meta, dict) else None
        if ids is not None and not isinstance(ids, list):
            raise InputError("'ids' must be a list", path=path[:-4] + ".json", field="ids")
        return arr, ids
    ids, vals = [], []
    for n, r in enumerate(iter_jsonl(path, required=("id", "score")), start=1):
        if not isinstance(r["score"], (int, float)) or isinstance(r["score"], bool):
            raise InputError("must be a number", path=path, line=n, field="score")
        ids.append(str(r["id"]))
        vals.append(float(r["score"]))
    return np.asarray(vals, dtype=np.float64), ids


def load_fluency(path: str) -> dict:
    """Sample id -> mean NLL from the per-text JSONL of ``popri eval fluency --out`` (fields
    ``id`` and ``nll``; ``nll`` null for an empty text)."""
    out: dict = {}
    for n, r in enumerate(iter_jsonl(path, required=("id", "nll")), start=1):
        v = r["nll"]
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)
                              or not np.isfinite(v)):
            raise InputError("must be a finite number or null", path=path, line=n, field="nll")
        if str(r["id"]) in out:
            raise InputError(f"id {r['id']!r} appears twice", path=path, line=n, field="id")
        out[str(r["id"])] = v
    if not out:
        raise InputError("no records", path=path)
    return out


def gate(samples: Sequence[dict], fluency: dict, drop: float, *, min_per_prompt: int = 0,
         fluency_path: str = "fluency") -> tuple[list[dict], dict]:
    """The fluency gate (issue 44, a popri remedy beyond POPri): ``samples`` without up to
    ``round(drop * n)`` of the least fluent under the public model (highest mean NLL; an empty
    text, NLL None, first; ties by input order), skipping a sample whose prompt would be left
    with fewer than ``min_per_prompt``; the rest in their input order, and a report."""
    nll = []
    for n, rec in enumerate(samples):
        if str(rec["id"]) not in fluency:
            raise InputError(f"sample id {rec['id']!r} has no NLL in {fluency_path}",
                             path=rec.get("_path"), line=rec.get("_line", n + 1), field="id")
        v = fluency[str(rec["id"])]
        nll.append(np.inf if v is None else float(v))
    k = int(round(float(drop) * len(samples)))
    left: dict = {}
    for rec in samples:
        left[rec.get("prompt_id")] = left.get(rec.get("prompt_id"), 0) + 1
    out: set[int] = set()
    for n in sorted(range(len(samples)), key=lambda n: (-nll[n], n)):
        if len(out) == k:
            break
        pid = samples[n].get("prompt_id")
        if left[pid] > min_per_prompt:
            out.add(n)
            left[pid] -= 1
    kept = [samples[n] for n in range(len(samples)) if n not in out]
    finite = [nll[n] for n in range(len(samples)) if n not in out and np.isfinite(nll[n])]
    return kept, {"samples": len(samples), "kept": len(kept), "dropped": len(out),
                  "drop": float(drop), "min_per_prompt": int(min_per_prompt),
                  "max_kept_nll": max(finite) if finite else None}


def build_pairs_file(samples: str, scores: str, spec: PrefsSpec | None = None, *,
                     out: str = "-", report_out: str | None = None,
                     true_scores: str | None = None, fluency: str | None = None,
                     embeddings: str | None = None) -> dict:
    """``popri prefs build``: read the samples and scores (and ``true_scores``), build the pairs
    and write them as JSONL to ``out`` ('-': stdout) and the report to ``report_out`` (both
    staged: a failing report leaves no pairs file either).  Returns the report."""
    import json

    spec = spec or PrefsSpec()
    recs = read_samples(samples)
    arr, ids = load_score_vector(scores)
    t_arr = t_ids = None
    if true_scores:
        t_arr, t_ids = load_score_vector(true_scores)
    flu = load_fluency(fluency) if fluency else None
    unit = None
    if embeddings:
        es = load_embedding_set(embeddings)
        unit = sample_embeddings(recs, es.embeddings, es.ids, path=embeddings)
    pairs, report = build_pairs(recs, arr, ids, spec, true_scores=t_arr, true_ids=t_ids,
                                scores_path=scores, true_scores_path=true_scores or "true-scores",
                                fluency=flu, fluency_path=fluency or "fluency", embeddings=unit)
    if not pairs:
        raise InputError(f"no prompt has {spec.rejected_rank} samples: nothing to pair "
                         f"(lower --rejected-rank or generate more samples per prompt)",
                         path=samples)
    report.update({"samples_path": samples, "scores_path": scores,
                   "true_scores_path": true_scores, "fluency_path": fluency,
                   "embeddings_path": embeddings})
    if report_out:  # staged first: a failing report leaves no pairs file either
        with io.AtomicOutputs() as staged:
            with open(staged.path(report_out), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(report, ensure_ascii=False, indent=2) + "\n")
            if out != "-":
                with open(staged.path(out), "w", encoding="utf-8") as fh:
                    for p in pairs:
                        fh.write(io.dumps(p) + "\n")
        if out == "-":
            io.write_jsonl(pairs, "-")
    else:
        io.write_jsonl(pairs, out)
    return report
