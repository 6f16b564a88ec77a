"""The coverage reward against POPri's cosine reward at the same noise (issue 67, point 1): how
often each reward's DP pairs keep the order its noise-free scores give (the recovery rate,
POPri Figure 6), on one round's real samples and the private clients.

    python benchmarks/bench_rewards.py --samples runs/power/sotu-generation/round1/samples.jsonl \\
        --private runs/power/sotu-generation/embeddings/private.npy --z 4.3113 --q 0.5 \\
        --out benchmarks/results/rewards.json

Both sums have L2 sensitivity 1 under add/remove one client (cosine: clip C = 1, standardised;
coverage: votes normalised to norm 1, popri/feedback/coverage.py), so at one z both rounds
have the same epsilon and the same noise std z per coordinate.  Per repetition: one Poisson
draw of the clients at rate q (shared by both rewards), the noise-free round sum of each
reward, one Gaussian draw per reward; pairs as `popri prefs build` forms them (rank 1 against
rank l of each prompt's J under the noisy scores); recovered when the noise-free score of the
chosen sample is strictly above the rejected one's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from popri.core.io import atomic_write, iter_jsonl
from popri.federated.participation import Participation, factorize
from popri.feedback import cosine, coverage
from popri.models.embed import as_embedding_set


def recovery(noisy: np.ndarray, exact: np.ndarray, groups: np.ndarray, rank: int) -> float:
    """Share of prompts whose noisy rank-1 vs rank-``rank`` pair is in exact order."""
    ok = n = 0
    for g in np.unique(groups):
        m = np.flatnonzero(groups == g)
        if len(m) < rank:
            continue
        order = m[np.argsort(-noisy[m], kind="stable")]
        c, r = order[0], order[rank - 1]
        ok += exact[c] > exact[r]
        n += 1
    return ok / max(n, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", required=True)
    ap.add_argument("--private", required=True)
    ap.add_argument("--z", type=float, required=True, help="the round's noise multiplier")
    ap.add_argument("--q", type=float, default=0.5, help="Poisson sampling rate")
    ap.add_argument("--rank", type=int, default=5, help="rejected rank l")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    recs = list(iter_jsonl(a.samples))
    syn = as_embedding_set(a.samples, model=a.model, records=recs, what="samples").embeddings
    groups = coverage.groups_of(recs, a.samples)
    priv = as_embedding_set(a.private, require_client=True)
    codes, clients = factorize(priv.client_ids())
    rng = np.random.default_rng(a.seed)
    rows = {"cosine": [], "coverage": []}
    signal = {"cosine": [], "coverage": []}
    for _ in range(a.reps):
        members = np.flatnonzero(rng.random(len(clients)) < a.q)
        part = Participation(members=members, total=len(clients), sampling="poisson",
                             sample_rate=a.q)
        exact = {
            "cosine": cosine.contributions(priv.embeddings, codes, part, syn, clip=1.0,
                                           standardize=True).exact(),
            "coverage": coverage.contributions(priv.embeddings, codes, part, syn,
                                               groups).exact()}
        for k, e in exact.items():
            noisy = e + rng.normal(0.0, a.z, size=len(e))  # sensitivity 1 for both
            rows[k].append(recovery(noisy, e, groups, a.rank))
            # the signal a pair is built from: each prompt's exact spread (max - min)
            signal[k].append(float(np.mean([np.ptp(e[groups == g]) for g in np.unique(groups)])))
    out = {"samples": a.samples, "private": a.private, "z": a.z, "q": a.q, "rank": a.rank,
           "reps": a.reps, "clients": len(clients), "prompts": int(groups.max() + 1),
           "candidates": len(recs), "sensitivity": {"cosine": 1.0, "coverage": 1.0},
           "noise_std_per_coordinate": a.z}
    for k in rows:
        r = np.asarray(rows[k])
        out[k] = {"recovery_rate": float(r.mean()), "se": float(r.std(ddof=1) / np.sqrt(len(r))),
                  "mean_prompt_spread": float(np.mean(signal[k])),
                  "spread_over_noise": float(np.mean(signal[k]) / a.z)}
        print(f"{k:9s} recovery {r.mean():.3f} +- {out[k]['se']:.3f}  prompt spread "
              f"{out[k]['mean_prompt_spread']:.4f} (noise std {a.z:g})", file=sys.stderr)
    text = json.dumps(out, indent=1) + "\n"
    if a.out:
        with atomic_write(Path(a.out)) as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
