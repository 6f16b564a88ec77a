"""FreD, Figure 2 in kind: private FreD to SOTU clients ranks SOTU/Shakespeare mixtures.

    POPRI_THREADS=1 python examples/fred_mixture.py                 # first run embeds (~minutes)
    python examples/fred_mixture.py --seeds 5 --size 2000 --epsilon 0.6 --delta 2e-6 --json r.json

Private clients: the train split of `popri bench fetch sotu` (one client per address).
Candidates (fred-prefinetuning, section 4.2): for Y in {0, 25, 50, 75, 90, 99, 100}, SIZE texts,
Y% from SOTU's held-out val + test splits (addresses disjoint from the private ones) and the rest
from `popri bench fetch shakespeare`.  Each seed draws one SOTU sample and one Shakespeare sample
of SIZE texts; the Y% candidate takes the first Y% of the SOTU draw and fills up with the
Shakespeare draw (so 99% and 100% differ in exactly 1% of the texts), and the seed also draws
fresh DP noise for the private statistics.  Every text is embedded once (all-MiniLM-L6-v2, the
embedding cache), so more seeds cost seconds.  Prints a markdown table: FreD mean +- sd over
seeds per Y, non-private and private with both covariance estimates of the same release (the
paper's nearest-PSD projection and `--denoise`), and for 99% vs 100% how many seeds rank 100%
closer.

The same thing with commands (one seed):
    popri bench fetch sotu --out data/sotu
    popri bench fetch shakespeare --out data/shakespeare
    popri fred stats --private data/sotu --epsilon 0.6 --delta 2e-6 --clip 1 --out runs/fred/sotu.npz
    popri fred compare --stats runs/fred/sotu.npz mix_000.jsonl mix_025.jsonl ... mix_100.jsonl
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

from popri.methods.fred import stats as F
from popri.privacy.calibration import CALIBRATIONS, gaussian_multiplier
from popri.core import log, runtime
from popri.models.embed import embed_texts
from popri.models.fid import frechet_distance, gaussian_stats
from popri.core.io import read_jsonl, write_json

YS = (0, 25, 50, 75, 90, 99, 100)


def fetch(name: str, root: Path) -> Path:
    out = root / name
    if not (out / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "popri.cli.app", "bench", "fetch", name, "--out",
                        str(out)], check=True)
    return out


def texts(d: Path, *splits: str) -> list[dict]:
    return [r for s in splits for r in read_jsonl(d / f"{s}.jsonl", required=("text",))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data", help="where the datasets are (fetched if missing)")
    ap.add_argument("--other", default="shakespeare", help="corpus B (shakespeare or debian)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--size", type=int, default=2000, help="texts per candidate")
    ap.add_argument("--epsilon", type=float, default=0.6, help="per release (Figure 2: 0.6)")
    ap.add_argument("--delta", type=float, default=2e-6, help="per release (Figure 2: 2e-6)")
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--relation", default="replace-one", choices=F.RELATIONS)
    ap.add_argument("--calibration", default="classic", choices=CALIBRATIONS)
    ap.add_argument("--json", help="also write every seed's numbers here")
    a = ap.parse_args()
    runtime.set_threads(runtime.threads())  # POPRI_THREADS for torch and BLAS

    root = Path(a.data)
    sotu, other = fetch("sotu", root), fetch(a.other, root)
    priv = texts(sotu, "train")
    held = texts(sotu, "val", "test")
    pool = texts(other, "train", "val", "test")
    if len(held) < a.size or len(pool) < a.size:
        sys.exit(f"need {a.size} texts per corpus: SOTU held-out has {len(held)}, "
                 f"{a.other} has {len(pool)}")
    # embed B only as far as the seeds can reach: a fixed seeded pool of 2 x SIZE texts
    pool = [pool[i] for i in np.sort(np.random.default_rng(12345).choice(len(pool), min(
        len(pool), 2 * a.size), replace=False))]
    log.info(f"fred_mixture: {len(priv)} private SOTU texts, {len(held)} held-out, "
             f"{len(pool)} {a.other} texts")
    e_priv = embed_texts([r["text"] for r in priv], desc="embed private")
    e_held = embed_texts([r["text"] for r in held], desc="embed held-out")
    e_pool = embed_texts([r["text"] for r in pool], desc=f"embed {a.other}")

    design = F.Design(a.relation, "sample", a.clip)
    z = gaussian_multiplier(a.epsilon, a.delta, a.calibration)
    keys = [r["client_id"] for r in priv]
    exact = F.exact_stats(e_priv)
    kinds = ("exact", "psd", "denoised")
    res = {y: {k: [] for k in kinds} for y in YS}
    fixed = {y: {k: [] for k in kinds} for y in (99, 100)}  # seed 0's candidates, noise varies

    def draw(seed):
        rng = np.random.default_rng(seed)
        return (rng.choice(len(e_held), a.size, replace=False),
                rng.choice(len(e_pool), a.size, replace=False))

    def fred_all(out, y, ai, bi, st, covs):
        k = round(a.size * y / 100)
        mu, cov = gaussian_stats(np.concatenate([e_held[ai[:k]], e_pool[bi[:a.size - k]]]))
        out[y]["exact"].append(frechet_distance(mu, cov, exact.mean, exact.cov))
        for name, c in covs.items():
            out[y][name].append(frechet_distance(mu, cov, st.mean, c))

    for seed in range(a.seeds):
        st = F.release(e_priv, keys, design, z, seed=seed)
        covs = {"psd": st.cov, "denoised": F.denoise_spectrum(st.sum2 / st.n, st.params["tau2"])}
        ai, bi = draw(seed)
        for y in YS:
            fred_all(res, y, ai, bi, st, covs)
        for y in (99, 100):
            fred_all(fixed, y, *draw(0), st, covs)
    print(f"FreD to {len(priv)} SOTU train texts ({len(set(keys))} clients); candidates of "
          f"{a.size} texts, Y% SOTU held-out + (100-Y)% {a.other}; {a.seeds} seeds; private: "
          f"({a.epsilon:g}, {a.delta:g})-DP per release, {design.neighbouring}, clip {a.clip:g}, "
          f"{a.calibration} z = {z:.4f}, tau1 = {z * design.mean_sensitivity / len(priv):.3g}, "
          f"tau2 = {z * design.cov_sensitivity / len(priv):.3g}\n")
    def cell(v):
        v = np.array(v)
        return f"{v.mean():.4f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.4f}"

    print("| Y% | non-private FreD | private FreD, nearest PSD (paper) | private FreD, --denoise |")
    print("|---:|---:|---:|---:|")
    for y in YS:
        print(f"| {y} | " + " | ".join(cell(res[y][k]) for k in kinds) + " |")
    print("| 99 vs 100: seeds with FreD(100%) < FreD(99%) | " + " | ".join(
        f"{int(np.sum(np.array(res[100][k]) < np.array(res[99][k])))}/{a.seeds}"
        for k in kinds) + " |")
    print("| FreD decreases with Y (means) | " + " | ".join(
        str(bool(np.all(np.diff([np.mean(res[y][k]) for y in YS]) < 0))) for k in kinds) + " |")
    print("| max FreD(100%) < min FreD(99%) over seeds | " + " | ".join(
        str(bool(max(res[100][k]) < min(res[99][k]))) for k in kinds) + " |")
    print("| the same, candidates fixed (seed 0), DP noise redrawn | " + " | ".join(
        str(bool(max(fixed[100][k]) < min(fixed[99][k]))) for k in kinds) + " |")
    if a.json:
        write_json({"args": vars(a), "z": z, "results": {str(y): v for y, v in res.items()},
                    "fixed_candidates": {str(y): v for y, v in fixed.items()}}, a.json)


if __name__ == "__main__":
    main()
