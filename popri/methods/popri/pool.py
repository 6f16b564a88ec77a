"""An evolving few-shot pool for POPri's rounds (a popri extension beyond the paper, issue 24).

    popri prefs pool --samples R1/samples.jsonl --scores R1/scores.npy --base data/public \
        --pool union --round 1 --out R1/pool.jsonl
    popri gen R1/pool.jsonl --prompts 48 -J 6 --round 2 ...     # round 2 draws its shots from it
    python -m pytest -q tests/test_pool.py

POPri ("Private Federated Learning using Preference-Optimized Synthetic Data", arXiv:2504.16438,
Algorithm 1) draws every round's few-shot examples from the same public Omega; only the
generator's weights move towards the clients.  Private Evolution (PrE-Text, arXiv:2406.02958,
section 3) moves the *population* instead.  The pool does both: after round t, the chosen sample
of each prompt -- the top-scored of its J samples under the round's released DP scores, the same
rank-1 sample the preference pairs use -- joins the population that round t+1's prompts (and the
final synthetic set's) draw their shots from:

- ``union``: Omega and every earlier round's chosen samples;
- ``chosen``: the chosen samples alone (round 1 still draws from Omega; while they are fewer
  than a prompt's ``--min-size`` examples, the previous population is kept whole).

Choosing by released scores is post-processing of the release, and the samples are the server
model's text: no client data and no privacy cost.  Samples ``popri gen`` kept as degenerate are
never added.
"""

from __future__ import annotations

import numpy as np

from popri.core.errors import InputError
from popri.core.io import write_jsonl
from popri.data.records import text_records
from popri.methods.popri.prefs import (
    align_scores,
    check_samples,
    load_score_vector,
    rank_groups,
    read_samples,
)


def chosen_records(samples: list[dict], scores: np.ndarray, ids: list[str] | None, *,
                   round_no: int, scores_path: str = "scores") -> list[dict]:
    """The top-scored, non-degenerate sample of every prompt as a pool record ``{"id", "text",
    "source": "round{t}", "prompt_id"}``."""
    if not samples:
        raise InputError("no samples", path=scores_path)
    check_samples(samples)
    s = align_scores(samples, scores, ids, path=scores_path)
    out = []
    for group in rank_groups(samples, s):
        best = next((i for i in group if not samples[i].get("degenerate")
                     and str(samples[i].get("text", "")).strip()), None)
        if best is not None:
            r = samples[best]
            out.append({"id": f"pool-r{round_no}-p{r['prompt_id']}-s{r.get('sample_idx', 0)}",
                        "text": r["text"], "source": f"round{round_no}",
                        "prompt_id": r["prompt_id"]})
    return out


def evolve(base: list[dict], chosen: list[dict], mode: str, *, min_size: int = 1
           ) -> list[dict]:
    """Round t's pool from round t-1's (``base``: Omega at t = 1) and round t's chosen samples.
    ``union`` keeps all of the base; ``chosen`` keeps only the base's earlier chosen samples
    (records whose ``source`` is a round: Omega is dropped) -- unless they would be fewer than
    ``min_size`` texts (a prompt needs that many distinct examples), when the base is kept whole.
    Ids stay unique (a repeated id keeps its first record)."""
    if mode not in ("union", "chosen"):
        raise ValueError(f"pool mode {mode!r}: expected union or chosen")
    keep = base
    if mode == "chosen":
        earlier = [r for r in base if str(r.get("source", "")).startswith("round")]
        if len({r["text"] for r in earlier + chosen}) >= min_size:
            keep = earlier
    out, seen = [], set()
    for r in [*keep, *chosen]:
        rid = str(r.get("id"))
        if rid not in seen:
            seen.add(rid)
            out.append({"id": rid, "text": r["text"],
                        **{k: r[k] for k in ("source", "prompt_id") if k in r}})
    return out


def pool_file(samples: str, scores: str, base: str, *, mode: str, round_no: int, out: str,
              split: str = "train", min_size: int = 3) -> dict:
    """``popri prefs pool``: read round t's samples and released scores and the previous pool
    (or Omega: a JSONL file or a dataset directory's ``split``), write round t's pool as JSONL
    (atomically) and return counts."""
    recs = read_samples(samples)
    arr, ids = load_score_vector(scores)
    chosen = chosen_records(recs, arr, ids, round_no=round_no, scores_path=scores)
    prev, _ = text_records(base, split)
    pool = evolve(prev, chosen, mode, min_size=min_size)
    if len(pool) < 1:
        raise InputError("the pool would be empty (every chosen sample degenerate)", path=samples)
    write_jsonl(pool, out)
    return {"pool": len(pool), "chosen": len(chosen), "base": len(prev), "mode": mode,
            "round": round_no}
